#include "ops/attention.h"

#include <omp.h>

#include "core/error.h"
#include "kernels/cpu/dsa_indexer.h"
#include "kernels/cpu/mla.h"
#include "kernels/cpu/paged_cache.h"
#include "ops/cuda/cuda_ops.h"

namespace ms::ops {

namespace {

kernels::cpu::PagedCacheView cache_view(const PagedCacheLayer& c, std::string_view what) {
  MS_CHECK(c.data.dim() == 3 && c.data.is_contiguous(), "{} cache must be [pages, page_size, width], got {}",
           what, c.data.desc());
  kernels::cpu::PagedCacheView v;
  switch (c.data.dtype()) {
    case DType::F32:
      v.format = kernels::cpu::CacheFormat::F32;
      break;
    case DType::BF16:
      v.format = kernels::cpu::CacheFormat::BF16;
      break;
    case DType::F8_E4M3:
      v.format = kernels::cpu::CacheFormat::FP8E4M3;
      break;
    default:
      MS_THROW("{} cache dtype {} is not supported (f32, bf16, fp8_e4m3)", what, dtype_name(c.data.dtype()));
  }
  MS_CHECK(c.scale > 0, "{} cache scale must be positive, got {}", what, c.scale);
  v.data = c.data.raw();
  v.scale = c.scale;
  MS_CHECK(c.fp8_tile_sim_rope < 0 || c.data.dtype() == DType::F32,
           "{} cache: the simulated tiled fp8 format needs f32 pages, got {}", what,
           dtype_name(c.data.dtype()));
  v.fp8_tile_sim_rope = c.fp8_tile_sim_rope;
  v.num_pages = c.data.size(0);
  v.page_size = c.data.size(1);
  v.width = c.data.size(2);
  return v;
}

void check_i32(const Tensor& t, std::string_view what) {
  MS_CHECK(t.dtype() == DType::I32 && t.is_contiguous(),
           "attention metadata {} must be contiguous i32, got {}", what, t.desc());
}

void check_meta(const AttentionMeta& meta, int64_t m, const kernels::cpu::PagedCacheView& v) {
  check_i32(meta.token_seq, "token_seq");
  check_i32(meta.positions, "positions");
  check_i32(meta.block_table, "block_table");
  MS_CHECK(meta.m == m && meta.token_seq.numel() == m && meta.positions.numel() == m,
           "attention metadata covers {} tokens, expected {}", meta.positions.numel(), m);
  MS_CHECK(meta.max_blocks > 0 && meta.block_table.numel() == meta.n_seqs * meta.max_blocks,
           "block table {} is not [{} seqs, {}]", meta.block_table.desc(), meta.n_seqs, meta.max_blocks);
  MS_CHECK(meta.max_blocks * v.page_size > meta.max_position,
           "block table of {} pages of {} cannot hold position {}", meta.max_blocks, v.page_size,
           meta.max_position);
}

void check_f32(const Tensor& t, int dims, std::string_view what) {
  MS_CHECK(t.dtype() == DType::F32 && t.dim() == dims && t.is_contiguous(),
           "{} must be contiguous f32 {}-D, got {}", what, dims, t.desc());
}

}  // namespace

void cache_write(const Ctx& ctx, const Tensor& x, const PagedCacheLayer& cache, const AttentionMeta& meta) {
  check_device(ctx, "cache_write", {&x, &cache.data, &meta.slots});
  auto v = cache_view(cache, "cache_write");
  MS_CHECK(x.dtype() == DType::F32 && x.dim() == 2 && x.size(1) == v.width && x.stride(1) == 1,
           "cache_write input must be f32 [m, {}], got {}", v.width, x.desc());
  MS_CHECK(meta.slots.dtype() == DType::I64 && meta.slots.is_contiguous() && meta.slots.numel() == x.size(0),
           "cache_write: {} rows, slots {}", x.size(0), meta.slots.desc());
  // On the GPU the slots were checked on the host before they were copied (Model::check_batch); the kernel
  // skips a slot outside the pool (padding rows of a captured batch carry -1).
  MS_OPS_ON_CUDA(ctx, cuda_ops::cache_write(ctx, x, cache, meta));
  const int64_t* slots = meta.slots.data<int64_t>();
  for (int64_t i = 0; i < x.size(0); ++i)
    MS_CHECK(slots[i] >= 0 && slots[i] < v.num_pages * v.page_size,
             "cache slot {} outside the pool of {} slots", slots[i], v.num_pages * v.page_size);
  kernels::cpu::CacheWriteParams p;
  p.cache = v;
  p.x = x.data<float>();
  p.x_stride = x.stride(0);
  p.slots = slots;
  p.m = x.size(0);
  kernels::cpu::cache_write(p);
}

void mla_absorb_q(const Ctx& ctx, const Tensor& q, const LinearWeight& kv_b, int64_t nope, int64_t v,
                  const Tensor& q_cat) {
  check_device(ctx, "mla_absorb_q", {&q, &q_cat, &kv_b.weight, &kv_b.scale});
  check_f32(q, 3, "mla q");
  check_f32(q_cat, 3, "mla q_cat");
  const int64_t m = q.size(0), heads = q.size(1), rope = q.size(2) - nope, r = kv_b.in;
  MS_CHECK(kv_b.out == heads * (nope + v), "{}: {} rows, expected heads {} x (nope {} + v {})", kv_b.name,
           kv_b.out, heads, nope, v);
  MS_CHECK(q_cat.size(0) == m && q_cat.size(1) == heads && q_cat.size(2) == r + rope,
           "mla q_cat must be [{}, {}, {}], got {}", m, heads, r + rope, q_cat.desc());
  MS_OPS_ON_CUDA(ctx, cuda_ops::mla_absorb_q(ctx, q, kv_b, nope, v, q_cat));
  kernels::cpu::MlaAbsorbQParams p;
  p.q = q.data<float>();
  p.kv_b = kv_b.cpu_view();
  p.q_cat = q_cat.data<float>();
  p.m = m;
  p.heads = heads;
  p.nope = nope;
  p.rope = rope;
  p.v = v;
  p.kv_lora_rank = r;
  kernels::cpu::mla_absorb_q(p);
}

int64_t mla_attention_scratch_floats(Device device, int64_t heads, int64_t max_keys, int64_t width) {
  // The CUDA kernels keep their scores in shared memory (the fast decode kernel's workspace lives in the
  // backend).
  if (device == Device::CUDA) return 1;
  return kernels::cpu::mla_attention_scratch_floats(heads, max_keys, width, omp_get_max_threads());
}

int64_t dsa_indexer_scratch_floats(Device device, int64_t max_keys, int64_t dim) {
#if MOESERVE_HAVE_CUDA
  if (device == Device::CUDA) return cuda_ops::dsa_indexer_scratch_floats(max_keys);
#endif
  MS_CHECK(device == Device::CPU, "op dsa_indexer: no CUDA backend built");
  return kernels::cpu::dsa_indexer_scratch_floats(max_keys, dim, omp_get_max_threads());
}

void mla_attention(const Ctx& ctx, const Tensor& q_cat, const PagedCacheLayer& cache,
                   const AttentionMeta& meta, const Tensor& topk, float softmax_scale, const Tensor& lat,
                   const Tensor& scratch, bool topk_compact) {
  check_device(
      ctx, "mla_attention",
      {&q_cat, &cache.data, &meta.token_seq, &meta.positions, &meta.block_table, &topk, &lat, &scratch});
  auto v = cache_view(cache, "mla");
  check_f32(q_cat, 3, "mla q_cat");
  check_f32(lat, 3, "mla output");
  const int64_t m = q_cat.size(0), heads = q_cat.size(1);
  MS_CHECK(q_cat.size(2) == v.width, "mla: q width {} vs cache width {}", q_cat.size(2), v.width);
  MS_CHECK(lat.size(0) == m && lat.size(1) == heads && lat.size(2) < v.width,
           "mla output {} does not fit q {}", lat.desc(), q_cat.desc());
  check_meta(meta, m, v);
  MS_OPS_ON_CUDA(ctx,
                 cuda_ops::mla_attention(ctx, q_cat, cache, meta, topk, softmax_scale, lat, topk_compact));
  kernels::cpu::MlaAttentionParams p;
  p.q_cat = q_cat.data<float>();
  p.kv = v;
  p.lat = lat.data<float>();
  p.m = m;
  p.heads = heads;
  p.kv_lora_rank = lat.size(2);
  p.token_seq = meta.token_seq.data<int32_t>();
  p.positions = meta.positions.data<int32_t>();
  p.block_table = meta.block_table.data<int32_t>();
  p.max_blocks = meta.max_blocks;
  p.softmax_scale = softmax_scale;
  p.max_keys = meta.max_position + 1;
  if (topk.defined() && topk.numel() > 0) {
    MS_CHECK(topk.dtype() == DType::I32 && topk.dim() == 2 && topk.size(0) == m && topk.is_contiguous(),
             "mla: DSA selection must be i32 [{}, topk], got {}", m, topk.desc());
    p.topk = topk.data<int32_t>();
    p.topk_width = topk.size(1);
    p.max_keys = topk.size(1);
  }
  const int64_t need = mla_attention_scratch_floats(ctx.device, heads, p.max_keys, v.width);
  MS_CHECK(scratch.dtype() == DType::F32 && scratch.is_contiguous() && scratch.numel() >= need,
           "mla: scratch {} holds less than the {} floats {} keys need (workspace sized for fewer keys or "
           "threads)",
           scratch.desc(), need, p.max_keys);
  p.scratch = scratch.data<float>();
  kernels::cpu::mla_attention(p);
}

void mla_out_v(const Ctx& ctx, const Tensor& lat, const LinearWeight& kv_b, int64_t nope, int64_t v,
               const Tensor& out) {
  check_device(ctx, "mla_out_v", {&lat, &out, &kv_b.weight, &kv_b.scale});
  check_f32(lat, 3, "mla latent");
  const int64_t m = lat.size(0), heads = lat.size(1);
  MS_CHECK(kv_b.out == heads * (nope + v) && kv_b.in == lat.size(2), "{}: [{}, {}] does not match latent {}",
           kv_b.name, kv_b.out, kv_b.in, lat.desc());
  MS_CHECK(out.dtype() == DType::F32 && out.is_contiguous() && out.numel() == m * heads * v,
           "mla_out_v output must be f32 [{}, {}], got {}", m, heads * v, out.desc());
  MS_OPS_ON_CUDA(ctx, cuda_ops::mla_out_v(ctx, lat, kv_b, nope, v, out));
  kernels::cpu::MlaOutVParams p;
  p.lat = lat.data<float>();
  p.kv_b = kv_b.cpu_view();
  p.out = out.data<float>();
  p.m = m;
  p.heads = heads;
  p.nope = nope;
  p.v = v;
  p.kv_lora_rank = lat.size(2);
  kernels::cpu::mla_out_v(p);
}

void dsa_indexer(const Ctx& ctx, const Tensor& q, const Tensor& w, const PagedCacheLayer& keys,
                 const AttentionMeta& meta, float softmax_scale, const Tensor& topk, const Tensor& scratch) {
  check_device(ctx, "dsa_indexer",
               {&q, &w, &keys.data, &meta.token_seq, &meta.positions, &meta.block_table, &topk, &scratch});
  auto v = cache_view(keys, "indexer");
  check_f32(q, 3, "indexer q");
  check_f32(w, 2, "indexer weights");
  const int64_t m = q.size(0), heads = q.size(1), dim = q.size(2);
  MS_CHECK(dim == v.width, "indexer: q dim {} vs key cache width {}", dim, v.width);
  MS_CHECK(w.size(0) == m && w.size(1) == heads, "indexer weights must be [{}, {}], got {}", m, heads,
           w.desc());
  MS_CHECK(topk.dtype() == DType::I32 && topk.dim() == 2 && topk.size(0) == m && topk.is_contiguous(),
           "indexer output must be i32 [{}, topk], got {}", m, topk.desc());
  check_meta(meta, m, v);
  MS_OPS_ON_CUDA(ctx, cuda_ops::dsa_indexer(ctx, q, w, keys, meta, softmax_scale, topk, scratch));
  kernels::cpu::DsaIndexerParams p;
  p.q = q.data<float>();
  p.w = w.data<float>();
  p.keys = v;
  p.m = m;
  p.heads = heads;
  p.dim = dim;
  p.softmax_scale = softmax_scale;
  p.token_seq = meta.token_seq.data<int32_t>();
  p.positions = meta.positions.data<int32_t>();
  p.block_table = meta.block_table.data<int32_t>();
  p.max_blocks = meta.max_blocks;
  p.topk = topk.size(1);
  p.out = topk.data<int32_t>();
  p.max_keys = meta.max_position + 1;
  const int64_t need = dsa_indexer_scratch_floats(ctx.device, p.max_keys, dim);
  MS_CHECK(
      scratch.dtype() == DType::F32 && scratch.is_contiguous() && scratch.numel() >= need,
      "indexer: scratch {} holds less than the {} floats {} keys need (workspace sized for fewer keys or "
      "threads)",
      scratch.desc(), need, p.max_keys);
  p.scratch = scratch.data<float>();
  kernels::cpu::dsa_indexer(p);
}

void debug_pool_cast(const Ctx& ctx, const PagedCacheLayer& cache, const Tensor& out) {
  check_device(ctx, "debug_pool_cast", {&cache.data, &out});
  MS_CHECK(ctx.device == Device::CPU, "debug_pool_cast is a CPU test switch (the planted whole-pool cast)");
  const kernels::cpu::PagedCacheView v = cache_view(cache, "debug_pool_cast");
  const int64_t slots = v.num_pages * v.page_size, width = v.width;
  MS_CHECK(out.dtype() == DType::F32 && out.is_contiguous() && out.numel() >= slots * width,
           "debug_pool_cast: {} cannot hold {} x {} floats", out.desc(), slots, width);
  float* o = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < slots; ++s) kernels::cpu::cache_read_row(v, s, o + s * width);
}

}  // namespace ms::ops
