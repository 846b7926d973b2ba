#include "ops/ops.h"

#include <cstring>

#include "core/error.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/linear.h"
#include "ops/cuda/cuda_ops.h"

namespace ms::ops {

namespace {

void check_rows_f32(const Tensor& t, int64_t cols, std::string_view what) {
  MS_CHECK(t.dtype() == DType::F32 && t.dim() == 2, "{} must be f32 [rows, {}], got {}", what, cols,
           t.desc());
  MS_CHECK(t.size(1) == cols && t.stride(1) == 1, "{} must be f32 [rows, {}] with unit column stride, got {}",
           what, cols, t.desc());
}

void check_vec_f32(const Tensor& t, int64_t n, std::string_view what) {
  MS_CHECK(t.dtype() == DType::F32 && t.numel() == n && t.is_contiguous(), "{} must be f32 [{}], got {}",
           what, n, t.desc());
}

}  // namespace

void linear_rows(const Ctx& ctx, const Tensor& x, const LinearWeight& w, int64_t row0, const Tensor& y) {
  check_device(ctx, "linear", {&x, &y, &w.weight, &w.scale});
  check_rows_f32(x, w.in, "linear " + w.name + " input");
  MS_CHECK(y.dim() == 2, "linear {} output must be 2-D, got {}", w.name, y.desc());
  const int64_t n = y.size(1);
  check_rows_f32(y, n, "linear " + w.name + " output");
  MS_CHECK(x.size(0) == y.size(0), "linear {}: {} input rows vs {} output rows", w.name, x.size(0),
           y.size(0));
  MS_CHECK(row0 >= 0 && row0 + n <= w.out, "linear {}: rows [{}, {}) outside {} outputs", w.name, row0,
           row0 + n, w.out);
  MS_OPS_ON_CUDA(ctx, cuda_ops::linear_rows(ctx, x, w, row0, y));
  kernels::cpu::LinearParams p;
  p.x = x.data<float>();
  p.x_stride = x.stride(0);
  p.w = w.cpu_view();
  p.row0 = row0;
  p.n = n;
  p.y = y.data<float>();
  p.y_stride = y.stride(0);
  p.m = x.size(0);
  kernels::cpu::linear(p);
}

void linear(const Ctx& ctx, const Tensor& x, const LinearWeight& w, const Tensor& y) {
  MS_CHECK(y.dim() == 2 && y.size(1) == w.out, "linear {} output must be [rows, {}], got {}", w.name, w.out,
           y.desc());
  linear_rows(ctx, x, w, 0, y);
}

void embedding(const Ctx& ctx, const Tensor& ids, const LinearWeight& table, const Tensor& out) {
  check_device(ctx, "embedding", {&ids, &out, &table.weight, &table.scale});
  MS_CHECK(ids.dtype() == DType::I32 && ids.dim() == 1 && ids.is_contiguous(),
           "embedding ids must be contiguous i32 [m], got {}", ids.desc());
  const int64_t m = ids.size(0);
  check_rows_f32(out, table.in, "embedding output");
  MS_CHECK(out.is_contiguous() && out.size(0) == m, "embedding output must be contiguous [{}, {}], got {}", m,
           table.in, out.desc());
  // On the GPU the ids were checked on the host before they were copied (Model::check_batch); an id the
  // kernel still finds outside the table gives a NaN row, never a read out of bounds.
  MS_OPS_ON_CUDA(ctx, cuda_ops::embedding(ctx, ids, table, out));
  const int32_t* id = ids.data<int32_t>();
  for (int64_t i = 0; i < m; ++i)
    MS_CHECK(id[i] >= 0 && id[i] < table.out, "token id {} (position {}) is outside the vocabulary [0, {})",
             id[i], i, table.out);
  kernels::cpu::EmbeddingParams p;
  p.ids = id;
  p.table = table.cpu_view();
  p.out = out.data<float>();
  p.m = m;
  kernels::cpu::embedding(p);
}

static kernels::cpu::NormParams norm_params(const Tensor& x, const Tensor& weight, float eps,
                                            const Tensor& out, std::string_view what) {
  MS_CHECK(x.dim() == 2, "{} input must be 2-D, got {}", what, x.desc());
  const int64_t n = x.size(1);
  check_rows_f32(x, n, what);
  check_rows_f32(out, n, what);
  check_vec_f32(weight, n, std::string(what) + " weight");
  MS_CHECK(out.size(0) == x.size(0), "{}: {} rows in, {} rows out", what, x.size(0), out.size(0));
  kernels::cpu::NormParams p;
  p.x = x.data<float>();
  p.x_stride = x.stride(0);
  p.weight = weight.data<float>();
  p.out = out.data<float>();
  p.out_stride = out.stride(0);
  p.m = x.size(0);
  p.n = n;
  p.eps = eps;
  return p;
}

void rms_norm(const Ctx& ctx, const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  check_device(ctx, "rms_norm", {&x, &weight, &out});
  const auto p = norm_params(x, weight, eps, out, "rms_norm");
  MS_OPS_ON_CUDA(ctx, cuda_ops::rms_norm(ctx, x, weight, eps, out));
  kernels::cpu::rms_norm(p);
}

void add_rms_norm(const Ctx& ctx, const Tensor& h, const Tensor& delta, const Tensor& weight, float eps,
                  const Tensor& xn) {
  check_device(ctx, "add_rms_norm", {&h, &delta, &weight, &xn});
  MS_CHECK(h.dtype() == DType::F32 && delta.dtype() == DType::F32 && h.shape() == delta.shape() &&
               h.is_contiguous() && delta.is_contiguous(),
           "add_rms_norm: {} += {}", h.desc(), delta.desc());
  const auto p = norm_params(h, weight, eps, xn, "add_rms_norm");
  MS_OPS_ON_CUDA(ctx, cuda_ops::add_rms_norm(ctx, h, delta, weight, eps, xn));
  kernels::cpu::add_inplace(h.data<float>(), delta.data<float>(), h.numel());
  kernels::cpu::rms_norm(p);
}

void layer_norm(const Ctx& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                const Tensor& out) {
  check_device(ctx, "layer_norm", {&x, &weight, &bias, &out});
  auto p = norm_params(x, weight, eps, out, "layer_norm");
  check_vec_f32(bias, x.size(1), "layer_norm bias");
  MS_OPS_ON_CUDA(ctx, cuda_ops::layer_norm(ctx, x, weight, bias, eps, out));
  p.bias = bias.data<float>();
  kernels::cpu::layer_norm(p);
}

void rope(const Ctx& ctx, const Tensor& x, int64_t offset, const Tensor& positions, const RopeTable& table) {
  check_device(ctx, "rope", {&x, &positions, &table.inv_freq});
  MS_CHECK(positions.dtype() == DType::I32 && positions.dim() == 1 && positions.is_contiguous(),
           "rope positions must be contiguous i32 [m], got {}", positions.desc());
  MS_CHECK(x.dtype() == DType::F32 && x.dim() == 3 && x.stride(2) == 1,
           "rope input must be f32 [m, heads, d], got {}", x.desc());
  MS_CHECK(x.size(0) == positions.size(0), "rope: {} rows but {} positions", x.size(0), positions.size(0));
  MS_CHECK(offset >= 0 && offset + table.dim() <= x.size(2), "rope: channels [{}, {}) outside head of {}",
           offset, offset + table.dim(), x.size(2));
  MS_OPS_ON_CUDA(ctx, cuda_ops::rope(ctx, x, offset, positions, table));
  kernels::cpu::RopeParams p;
  p.x = x.data<float>();
  p.row_stride = x.stride(0);
  p.head_stride = x.stride(1);
  p.offset = offset;
  p.m = x.size(0);
  p.heads = x.size(1);
  p.dim = table.dim();
  p.positions = positions.data<int32_t>();
  p.inv_freq = table.inv_freq.data<float>();
  p.attention_scaling = table.attention_scaling;
  p.interleaved = table.interleaved;
  kernels::cpu::rope(p);
}

void silu_mul(const Ctx& ctx, const Tensor& x, const Tensor& out) {
  check_device(ctx, "silu_mul", {&x, &out});
  MS_CHECK(out.dim() == 2, "silu_mul output must be 2-D, got {}", out.desc());
  const int64_t n = out.size(1);
  check_rows_f32(x, 2 * n, "silu_mul input");
  check_rows_f32(out, n, "silu_mul output");
  MS_CHECK(x.size(0) == out.size(0), "silu_mul: {} rows in, {} out", x.size(0), out.size(0));
  MS_OPS_ON_CUDA(ctx, cuda_ops::silu_mul(ctx, x, out));
  kernels::cpu::SiluMulParams p;
  p.x = x.data<float>();
  p.x_stride = x.stride(0);
  p.out = out.data<float>();
  p.out_stride = out.stride(0);
  p.m = x.size(0);
  p.n = n;
  kernels::cpu::silu_mul(p);
}

void add_inplace(const Ctx& ctx, const Tensor& y, const Tensor& x) {
  check_device(ctx, "add", {&y, &x});
  MS_CHECK(y.dtype() == DType::F32 && x.dtype() == DType::F32 && y.shape() == x.shape() &&
               y.is_contiguous() && x.is_contiguous(),
           "add: {} += {}", y.desc(), x.desc());
  MS_OPS_ON_CUDA(ctx, cuda_ops::add_inplace(ctx, y, x));
  kernels::cpu::add_inplace(y.data<float>(), x.data<float>(), y.numel());
}

void scale(const Ctx& ctx, const Tensor& x, float s) {
  check_device(ctx, "scale", {&x});
  MS_CHECK(x.dtype() == DType::F32 && x.is_contiguous(), "scale: {} must be contiguous f32", x.desc());
  MS_OPS_ON_CUDA(ctx, cuda_ops::scale(ctx, x, s));
  kernels::cpu::scale_inplace(x.data<float>(), s, x.numel());
}

void fill_zero(const Ctx& ctx, const Tensor& x) {
  check_device(ctx, "fill_zero", {&x});
  MS_CHECK(x.is_contiguous(), "fill_zero: {} must be contiguous", x.desc());
  MS_OPS_ON_CUDA(ctx, cuda_ops::fill_zero(ctx, x));
  if (x.nbytes()) std::memset(x.raw(), 0, x.nbytes());
}

void remap_ids(const Ctx& ctx, const Tensor& ids, const Tensor& map, const Tensor& out) {
  check_device(ctx, "remap_ids", {&ids, &map, &out});
  MS_CHECK(ids.dtype() == DType::I32 && ids.is_contiguous() && out.dtype() == DType::I32 &&
               out.is_contiguous() && out.shape() == ids.shape(),
           "remap_ids: ids {} and out {} must be contiguous i32 of one shape", ids.desc(), out.desc());
  MS_CHECK(map.dtype() == DType::I32 && map.dim() == 1 && map.is_contiguous(),
           "remap_ids: map must be contiguous i32 [n], got {}", map.desc());
  // On the GPU an id past the map gives -1 (the kernel cannot throw; the router never makes one).
  MS_OPS_ON_CUDA(ctx, cuda_ops::remap_ids(ctx, ids, map, out));
  const int32_t* in = ids.data<int32_t>();
  const int32_t* mp = map.data<int32_t>();
  int32_t* o = out.data<int32_t>();
  const int64_t n = ids.numel(), nm = map.size(0);
  for (int64_t i = 0; i < n; ++i) {
    MS_CHECK(in[i] < nm, "remap_ids: id {} outside the map of {}", in[i], nm);
    o[i] = in[i] < 0 ? -1 : mp[in[i]];
  }
}

void append_expert_slot(const Ctx& ctx, const Tensor& ids, const Tensor& wts, int32_t id, float weight,
                        const Tensor& ids_out, const Tensor& wts_out) {
  check_device(ctx, "append_expert_slot", {&ids, &wts, &ids_out, &wts_out});
  MS_CHECK(ids.dtype() == DType::I32 && ids.dim() == 2 && ids.is_contiguous() && wts.dtype() == DType::F32 &&
               wts.is_contiguous() && wts.shape() == ids.shape(),
           "append_expert_slot: ids {} and wts {} must be contiguous i32 / f32 [m, k] of one shape",
           ids.desc(), wts.desc());
  const int64_t m = ids.size(0), k = ids.size(1);
  const std::vector<int64_t> wide{m, k + 1};
  MS_CHECK(ids_out.dtype() == DType::I32 && ids_out.is_contiguous() && ids_out.shape() == wide &&
               wts_out.dtype() == DType::F32 && wts_out.is_contiguous() && wts_out.shape() == wide,
           "append_expert_slot: ids_out {} and wts_out {} must be contiguous i32 / f32 [{}, {}]",
           ids_out.desc(), wts_out.desc(), m, k + 1);
  MS_OPS_ON_CUDA(ctx, cuda_ops::append_expert_slot(ctx, ids, wts, id, weight, ids_out, wts_out));
  const int32_t* in = ids.data<int32_t>();
  const float* w = wts.data<float>();
  int32_t* io = ids_out.data<int32_t>();
  float* wo = wts_out.data<float>();
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      io[t * (k + 1) + j] = in[t * k + j];
      wo[t * (k + 1) + j] = w[t * k + j];
    }
    io[t * (k + 1) + k] = id;
    wo[t * (k + 1) + k] = weight;
  }
}

void remap_ids_replicated(const Ctx& ctx, const Tensor& ids, const Tensor& copies, const Tensor& slots,
                          const Tensor& out) {
  check_device(ctx, "remap_ids_replicated", {&ids, &copies, &slots, &out});
  MS_CHECK(ids.dtype() == DType::I32 && ids.dim() == 2 && ids.is_contiguous() && out.dtype() == DType::I32 &&
               out.is_contiguous() && out.shape() == ids.shape(),
           "remap_ids_replicated: ids {} and out {} must be contiguous i32 [m, k] of one shape", ids.desc(),
           out.desc());
  MS_CHECK(copies.dtype() == DType::I32 && copies.dim() == 1 && copies.is_contiguous(),
           "remap_ids_replicated: copies must be contiguous i32 [E], got {}", copies.desc());
  MS_CHECK(slots.dtype() == DType::I32 && slots.dim() == 2 && slots.is_contiguous() &&
               slots.size(0) == copies.size(0) && slots.size(1) >= 1,
           "remap_ids_replicated: slots must be contiguous i32 [{}, R >= 1], got {}", copies.size(0),
           slots.desc());
  // On the GPU an id past the table or a copy count outside [1, R] gives -1 (the kernel cannot throw).
  MS_OPS_ON_CUDA(ctx, cuda_ops::remap_ids_replicated(ctx, ids, copies, slots, out));
  const int32_t* in = ids.data<int32_t>();
  const int32_t* cp = copies.data<int32_t>();
  const int32_t* sl = slots.data<int32_t>();
  int32_t* o = out.data<int32_t>();
  const int64_t m = ids.size(0), k = ids.size(1), E = copies.size(0), R = slots.size(1);
  for (int64_t t = 0; t < m; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = in[t * k + j];
      MS_CHECK(e < E, "remap_ids_replicated: id {} outside the table of {}", e, E);
      if (e < 0) {
        o[t * k + j] = -1;
        continue;
      }
      MS_CHECK(cp[e] >= 1 && cp[e] <= R, "remap_ids_replicated: expert {} has {} copies, the table holds {}",
               e, cp[e], R);
      o[t * k + j] = sl[e * R + (t + j) % cp[e]];
    }
}

void gather_rows(const Ctx& ctx, const Tensor& x, const Tensor& rows, const Tensor& out) {
  check_device(ctx, "gather_rows", {&x, &rows, &out});
  MS_CHECK(x.dtype() == DType::F32 && x.dim() == 2 && x.is_contiguous(),
           "gather_rows input must be contiguous f32 [m, cols], got {}", x.desc());
  MS_CHECK(rows.dtype() == DType::I32 && rows.dim() == 1 && rows.is_contiguous(),
           "gather_rows rows must be contiguous i32 [n], got {}", rows.desc());
  const int64_t n = rows.size(0), cols = x.size(1);
  MS_CHECK(out.dtype() == DType::F32 && out.dim() == 2 && out.is_contiguous() && out.size(0) == n &&
               out.size(1) == cols,
           "gather_rows output must be contiguous f32 [{}, {}], got {}", n, cols, out.desc());
  MS_OPS_ON_CUDA(ctx, cuda_ops::gather_rows(ctx, x, rows, out));
  const int32_t* r = rows.data<int32_t>();
  for (int64_t i = 0; i < n; ++i)
    MS_CHECK(r[i] >= 0 && r[i] < x.size(0), "gather_rows: row {} outside {} rows", r[i], x.size(0));
  kernels::cpu::GatherRowsParams p;
  p.x = x.data<float>();
  p.rows = r;
  p.out = out.data<float>();
  p.n = n;
  p.cols = cols;
  kernels::cpu::gather_rows(p);
}

}  // namespace ms::ops
