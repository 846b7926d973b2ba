#if MOESERVE_HAVE_CUDA
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/dsa_indexer/dsa_indexer.h"
#include "kernels/cuda/elementwise/pointwise.h"
#include "kernels/cuda/gemm/blaslt.h"
#include "kernels/cuda/kv_store/kv_store.h"
#include "kernels/cuda/mla_attention/mla_absorb.h"
#include "kernels/cuda/mla_attention/mla_attention.h"
#include "ops/cuda/backend_impl.h"
#include "ops/cuda/cuda_ops.h"

namespace ms::ops::cuda_ops {

namespace {

cuda::KvFormat kv_format(const Tensor& t) {
  switch (t.dtype()) {
    case DType::F32:
      return cuda::KvFormat::F32;
    case DType::BF16:
      return cuda::KvFormat::BF16;
    case DType::F8_E4M3:
      return cuda::KvFormat::FP8E4M3;
    default:
      MS_THROW("paged cache of dtype {}: the GPU reads f32, bf16 or fp8_e4m3 pages", dtype_name(t.dtype()));
  }
}

cuda::PagedKvLayer kv_layer(const PagedCacheLayer& c) {
  cuda::PagedKvLayer l;
  l.data = c.data.raw();
  l.format = kv_format(c.data);
  l.scale = c.scale;
  l.num_pages = static_cast<int>(c.data.size(0));
  l.page_size = static_cast<int>(c.data.size(1));
  l.width = static_cast<int>(c.data.size(2));
  return l;
}

cuda::AttentionMetaDevice meta_device(const AttentionMeta& m) {
  cuda::AttentionMetaDevice d;
  d.token_seq = m.token_seq.data<int32_t>();
  d.positions = m.positions.data<int32_t>();
  d.block_table = m.block_table.data<int32_t>();
  d.max_blocks = static_cast<int>(m.max_blocks);
  d.seq_lens = (m.seq_lens.defined() && m.seq_lens.numel() > 0) ? m.seq_lens.data<int32_t>() : nullptr;
  d.n_seqs = static_cast<int>(m.n_seqs);
  return d;
}

cuda::DenseWeightView dense_view(const LinearWeight& w) {
  cuda::DenseWeightView d;
  switch (w.format) {
    case WeightFormat::F32:
      d.format = cuda::DenseWeightFormat::F32;
      break;
    case WeightFormat::BF16:
      d.format = cuda::DenseWeightFormat::BF16;
      break;
    case WeightFormat::FP8Block:
      d.format = cuda::DenseWeightFormat::FP8Block;
      break;
    default:
      MS_THROW("{}: the GPU's MLA absorption reads f32, bf16 or fp8-block kv_b_proj, not {}", w.name,
               weight_format_name(w.format));
  }
  MS_CHECK(w.weight.device() == Device::CUDA, "{}: the weight is not on the GPU", w.name);
  d.rows = w.out;
  d.cols = w.in;
  d.data = w.weight.raw();
  d.scale = (w.scale.defined() && w.scale.numel() > 0) ? w.scale.data<float>() : nullptr;
  d.block = w.block;
  return d;
}

}  // namespace

void cache_write(const Ctx& ctx, const Tensor& x, const PagedCacheLayer& cache, const AttentionMeta& meta) {
  cuda::KvStoreParams p;
  p.x = x.data<float>();
  p.x_stride = x.stride(0);
  p.slots = meta.slots.data<int64_t>();
  p.m = x.size(0);
  p.cache = cache.data.raw();
  const cuda::KvFormat f = kv_format(cache.data);
  p.format = f == cuda::KvFormat::F32    ? cuda::KvCacheFormat::F32
             : f == cuda::KvFormat::BF16 ? cuda::KvCacheFormat::BF16
                                         : cuda::KvCacheFormat::FP8E4M3;
  p.scale = cache.scale;
  p.num_pages = cache.data.size(0);
  p.page_size = cache.data.size(1);
  p.width = cache.data.size(2);
  cuda::kv_store(p, cuda_stream(ctx));
}

// From this many tokens on, BF16 kv_b products go to one batched cuBLASLt GEMM over the heads (tensor cores)
// instead of the absorption kernels (f32 on CUDA cores: at 64 tokens 13-27x their floor on an H200).
constexpr int64_t kAbsorbBlasMinTokens = 16;

bool absorb_by_blaslt(const CudaBackend::Impl& be, const LinearWeight& kv_b, int64_t m) {
  return !be.exact_linear && kv_b.format == WeightFormat::BF16 && m >= kAbsorbBlasMinTokens &&
         cuda::is_aligned(kv_b.weight.raw(), 16) && kv_b.in % 8 == 0;
}

void mla_absorb_q(const Ctx& ctx, const Tensor& q, const LinearWeight& kv_b, int64_t nope, int64_t v,
                  const Tensor& q_cat) {
  CudaBackend::Impl& be = cuda_impl(ctx);
  const int64_t m = q.size(0), heads = q.size(1), rope = q.size(2) - nope, r = kv_b.in;
  if (absorb_by_blaslt(be, kv_b, m) && nope % 8 == 0) {
    const cudaStream_t stream = cuda_stream(ctx);
    // q_nope as bf16 [m, heads, nope]; per head h: q_cat[:, h, :r] = q_nope[:, h, :] W_UK_h, W_UK_h the rows
    // [h (nope + v), + nope) of kv_b ([nope, r] row-major: the weight is k x n); the rope part is copied.
    auto* xb =
        static_cast<__nv_bfloat16*>(be.linear_x.get(static_cast<size_t>(m * heads * nope) * 2, stream));
    cuda::CastBf16Params c;
    c.x = q.data<float>();
    c.x_stride = nope + rope;
    c.out = xb;
    c.out_stride = nope;
    c.m = m * heads;
    c.n = nope;
    cuda::cast_f32_to_bf16(c, stream);
    cuda::GemmBf16BatchedParams g;
    g.x = xb;
    g.x_stride = heads * nope;
    g.x_batch_stride = nope;
    g.w = static_cast<const __nv_bfloat16*>(kv_b.weight.raw());
    g.w_stride = r;
    g.w_batch_stride = (nope + v) * r;
    g.w_kn = true;
    g.y = q_cat.data<float>();
    g.y_stride = heads * (r + rope);
    g.y_batch_stride = r + rope;
    g.m = m;
    g.n = r;
    g.k = nope;
    g.batch = heads;
    cuda::gemm_bf16_batched(g, be.lt, stream);
    if (rope > 0)
      CUDA_CHECK(cudaMemcpy2DAsync(q_cat.data<float>() + r, static_cast<size_t>(r + rope) * 4,
                                   q.data<float>() + nope, static_cast<size_t>(nope + rope) * 4,
                                   static_cast<size_t>(rope) * 4, static_cast<size_t>(m * heads),
                                   cudaMemcpyDeviceToDevice, stream));
    return;
  }
  cuda::MlaAbsorbQParams p;
  p.q = q.data<float>();
  p.kv_b = dense_view(kv_b);
  p.q_cat = q_cat.data<float>();
  p.m = static_cast<int>(q.size(0));
  p.heads = static_cast<int>(q.size(1));
  p.nope = static_cast<int>(nope);
  p.rope = static_cast<int>(q.size(2) - nope);
  p.v = static_cast<int>(v);
  p.kv_lora_rank = static_cast<int>(kv_b.in);
  cuda::mla_absorb_q(p, cuda_stream(ctx));
}

void mla_out_v(const Ctx& ctx, const Tensor& lat, const LinearWeight& kv_b, int64_t nope, int64_t v,
               const Tensor& out) {
  CudaBackend::Impl& be = cuda_impl(ctx);
  const int64_t m = lat.size(0), heads = lat.size(1), r = kv_b.in;
  if (absorb_by_blaslt(be, kv_b, m)) {
    const cudaStream_t stream = cuda_stream(ctx);
    // lat as bf16 [m, heads, r]; per head h: out[:, h v .. h v + v] = lat[:, h, :] W_UV_h^T, W_UV_h the rows
    // [h (nope + v) + nope, + v) of kv_b ([v, r] row-major: the checkpoint layout of a linear).
    auto* xb = static_cast<__nv_bfloat16*>(be.linear_x.get(static_cast<size_t>(m * heads * r) * 2, stream));
    cuda::CastBf16Params c;
    c.x = lat.data<float>();
    c.x_stride = r;
    c.out = xb;
    c.out_stride = r;
    c.m = m * heads;
    c.n = r;
    cuda::cast_f32_to_bf16(c, stream);
    cuda::GemmBf16BatchedParams g;
    g.x = xb;
    g.x_stride = heads * r;
    g.x_batch_stride = r;
    g.w = static_cast<const __nv_bfloat16*>(kv_b.weight.raw()) + nope * r;
    g.w_stride = r;
    g.w_batch_stride = (nope + v) * r;
    g.w_kn = false;
    g.y = out.data<float>();
    g.y_stride = heads * v;
    g.y_batch_stride = v;
    g.m = m;
    g.n = v;
    g.k = r;
    g.batch = heads;
    cuda::gemm_bf16_batched(g, be.lt, stream);
    return;
  }
  cuda::MlaOutVParams p;
  p.lat = lat.data<float>();
  p.kv_b = dense_view(kv_b);
  p.out = out.data<float>();
  p.m = static_cast<int>(lat.size(0));
  p.heads = static_cast<int>(lat.size(1));
  p.nope = static_cast<int>(nope);
  p.v = static_cast<int>(v);
  p.kv_lora_rank = static_cast<int>(kv_b.in);
  cuda::mla_out_v(p, cuda_stream(ctx));
}

void mla_attention(const Ctx& ctx, const Tensor& q_cat, const PagedCacheLayer& cache,
                   const AttentionMeta& meta, const Tensor& topk, float softmax_scale, const Tensor& lat,
                   bool topk_compact) {
  CudaBackend::Impl& be = cuda_impl(ctx);
  const cudaStream_t stream = cuda_stream(ctx);
  const int m = static_cast<int>(q_cat.size(0)), heads = static_cast<int>(q_cat.size(1));
  const int r = static_cast<int>(lat.size(2));
  cuda::MlaAttentionShape s;
  s.m = m;
  s.heads = heads;
  s.kv_lora_rank = r;
  s.rope = static_cast<int>(q_cat.size(2)) - r;
  s.page_size = static_cast<int>(cache.data.size(1));
  s.format = kv_format(cache.data);
  s.has_topk = (topk.defined() && topk.numel() > 0);
  // The batch builder puts one token per sequence in sequence order when every sequence decodes.
  s.decode_only = meta.m == meta.n_seqs && be.attention_kernel != "mla_general";
  s.n_seqs = static_cast<int>(meta.n_seqs);
  s.prefer = be.attention_kernel == "mla_general"        ? cuda::MlaAttentionPrefer::General
             : be.attention_kernel == "mla_fp8_decode"   ? cuda::MlaAttentionPrefer::Fp8Decode
             : be.attention_kernel == "mla_decode_sm90"  ? cuda::MlaAttentionPrefer::Sm90Decode
             : be.attention_kernel == "mla_decode_wgmma" ? cuda::MlaAttentionPrefer::WgmmaDecode
                                                         : cuda::MlaAttentionPrefer::Auto;
  // Parity runs (exact linear math) keep the f32 general kernel wherever it was used before the sm90 decode
  // kernel (bf16 pages, DSA selections), and the split-KV fp8 kernel where that applies.
  if (be.exact_linear && s.prefer == cuda::MlaAttentionPrefer::Auto)
    s.prefer = cuda::MlaAttentionPrefer::Fp8DecodeElseGeneral;
  const cuda::MlaAttentionConfig c = cuda::mla_attention_choose(s, be.caps);
  cuda::MlaAttentionParams p;
  p.q_cat = q_cat.data<float>();
  p.kv = kv_layer(cache);
  p.meta = meta_device(meta);
  p.topk = s.has_topk ? topk.data<int32_t>() : nullptr;
  p.topk_width = s.has_topk ? static_cast<int>(topk.size(1)) : 0;
  p.topk_compact = s.has_topk && topk_compact;
  p.lat = lat.data<float>();
  p.m = m;
  p.heads = heads;
  p.kv_lora_rank = r;
  p.softmax_scale = softmax_scale;
  p.workspace = c.workspace_bytes ? be.attn_ws.get(c.workspace_bytes, stream) : nullptr;
  cuda::mla_attention_plan(c, p, stream);
  cuda::mla_attention(c, p, stream);
}

int64_t dsa_indexer_scratch_floats(int64_t max_keys) {
  // Scores of up to 64 tokens per pass (a decode batch in one pass; prefill in passes of 64).
  return static_cast<int64_t>(cuda::dsa_indexer_workspace_bytes(64, static_cast<int>(max_keys)) / 4);
}

void dsa_indexer(const Ctx& ctx, const Tensor& q, const Tensor& w, const PagedCacheLayer& keys,
                 const AttentionMeta& meta, float softmax_scale, const Tensor& topk, const Tensor& scratch) {
  cuda::DsaIndexerParams p;
  p.q = q.data<float>();
  p.w = w.data<float>();
  p.keys = kv_layer(keys);
  p.meta = meta_device(meta);
  p.m = static_cast<int>(q.size(0));
  p.heads = static_cast<int>(q.size(1));
  p.dim = static_cast<int>(q.size(2));
  p.softmax_scale = softmax_scale;
  p.topk = static_cast<int>(topk.size(1));
  p.out = topk.data<int32_t>();
  // Fixed for the executor's context capacity (the same value in every captured graph); positions are
  // below it by the engine's admission checks.
  MS_CHECK(meta.max_keys > meta.max_position, "dsa_indexer: key capacity {} not above position {}",
           meta.max_keys, meta.max_position);
  p.max_keys = static_cast<int>(meta.max_keys);
  p.workspace = scratch.raw();
  p.workspace_bytes = scratch.nbytes();
  cuda::dsa_indexer(p, cuda_stream(ctx));
}

}  // namespace ms::ops::cuda_ops
#endif
