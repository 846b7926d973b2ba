#include "ops/ops.h"

#include "core/error.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/linear.h"

namespace ms::ops {

namespace {

void check_rows_f32(const Tensor& t, int64_t cols, std::string_view what) {
  MS_CHECK(t.dtype() == DType::F32 && t.dim() == 2, "{} must be f32 [rows, {}], got {}", what, cols,
           t.desc());
  MS_CHECK(t.size(1) == cols && t.stride(1) == 1, "{} must be f32 [rows, {}] with unit column stride, got {}",
           what, cols, t.desc());
  MS_CHECK(t.device() == Device::CPU, "{}: only the CPU backend is built", what);
}

void check_vec_f32(const Tensor& t, int64_t n, std::string_view what) {
  MS_CHECK(t.dtype() == DType::F32 && t.numel() == n && t.is_contiguous(), "{} must be f32 [{}], got {}",
           what, n, t.desc());
}

}  // namespace

void linear_rows(const Tensor& x, const LinearWeight& w, int64_t row0, const Tensor& y) {
  check_rows_f32(x, w.in, "linear " + w.name + " input");
  MS_CHECK(y.dim() == 2, "linear {} output must be 2-D, got {}", w.name, y.desc());
  const int64_t n = y.size(1);
  check_rows_f32(y, n, "linear " + w.name + " output");
  MS_CHECK(x.size(0) == y.size(0), "linear {}: {} input rows vs {} output rows", w.name, x.size(0),
           y.size(0));
  MS_CHECK(row0 >= 0 && row0 + n <= w.out, "linear {}: rows [{}, {}) outside {} outputs", w.name, row0,
           row0 + n, w.out);
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

void linear(const Tensor& x, const LinearWeight& w, const Tensor& y) {
  MS_CHECK(y.dim() == 2 && y.size(1) == w.out, "linear {} output must be [rows, {}], got {}", w.name, w.out,
           y.desc());
  linear_rows(x, w, 0, y);
}

void embedding(std::span<const int32_t> ids, const LinearWeight& table, const Tensor& out) {
  check_rows_f32(out, table.in, "embedding output");
  MS_CHECK(out.is_contiguous() && out.size(0) == static_cast<int64_t>(ids.size()),
           "embedding output must be contiguous [{}, {}], got {}", ids.size(), table.in, out.desc());
  for (size_t i = 0; i < ids.size(); ++i)
    MS_CHECK(ids[i] >= 0 && ids[i] < table.out, "token id {} (position {}) is outside the vocabulary [0, {})",
             ids[i], i, table.out);
  kernels::cpu::EmbeddingParams p;
  p.ids = ids.data();
  p.table = table.cpu_view();
  p.out = out.data<float>();
  p.m = static_cast<int64_t>(ids.size());
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

void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  kernels::cpu::rms_norm(norm_params(x, weight, eps, out, "rms_norm"));
}

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, const Tensor& out) {
  auto p = norm_params(x, weight, eps, out, "layer_norm");
  check_vec_f32(bias, x.size(1), "layer_norm bias");
  p.bias = bias.data<float>();
  kernels::cpu::layer_norm(p);
}

void rope(const Tensor& x, int64_t offset, std::span<const int32_t> positions, const RopeTable& table) {
  MS_CHECK(x.dtype() == DType::F32 && x.dim() == 3 && x.stride(2) == 1,
           "rope input must be f32 [m, heads, d], got {}", x.desc());
  MS_CHECK(x.size(0) == static_cast<int64_t>(positions.size()), "rope: {} rows but {} positions", x.size(0),
           positions.size());
  MS_CHECK(offset >= 0 && offset + table.dim() <= x.size(2), "rope: channels [{}, {}) outside head of {}",
           offset, offset + table.dim(), x.size(2));
  kernels::cpu::RopeParams p;
  p.x = x.data<float>();
  p.row_stride = x.stride(0);
  p.head_stride = x.stride(1);
  p.offset = offset;
  p.m = x.size(0);
  p.heads = x.size(1);
  p.dim = table.dim();
  p.positions = positions.data();
  p.inv_freq = table.inv_freq.data<float>();
  p.attention_scaling = table.attention_scaling;
  p.interleaved = table.interleaved;
  kernels::cpu::rope(p);
}

void silu_mul(const Tensor& x, const Tensor& out) {
  MS_CHECK(out.dim() == 2, "silu_mul output must be 2-D, got {}", out.desc());
  const int64_t n = out.size(1);
  check_rows_f32(x, 2 * n, "silu_mul input");
  check_rows_f32(out, n, "silu_mul output");
  MS_CHECK(x.size(0) == out.size(0), "silu_mul: {} rows in, {} out", x.size(0), out.size(0));
  kernels::cpu::SiluMulParams p;
  p.x = x.data<float>();
  p.x_stride = x.stride(0);
  p.out = out.data<float>();
  p.out_stride = out.stride(0);
  p.m = x.size(0);
  p.n = n;
  kernels::cpu::silu_mul(p);
}

void add_inplace(const Tensor& y, const Tensor& x) {
  MS_CHECK(y.dtype() == DType::F32 && x.dtype() == DType::F32 && y.shape() == x.shape() &&
               y.is_contiguous() && x.is_contiguous(),
           "add: {} += {}", y.desc(), x.desc());
  kernels::cpu::add_inplace(y.data<float>(), x.data<float>(), y.numel());
}

}  // namespace ms::ops
