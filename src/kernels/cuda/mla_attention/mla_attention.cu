// Dispatch between the general paged MLA kernel and the fast fp8 decode kernel (see mla_attention.h).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/mla_attention/mla_attention.h"
#include "kernels/cuda/mla_attention/mla_attention_general.h"
#include "kernels/cuda/mla_decode/mla_decode.h"
#include "kernels/cuda/mla_decode/mla_decode_sm90.h"
#include "kernels/cuda/paged_kv/current_caps.h"

namespace ms::cuda {
namespace {

// Shared memory of one mla_decode block, from the kernel's own configuration.
constexpr size_t kFp8DecodeSmem = mla_decode_config::kSmemBytes;

size_t align256(size_t x) {
  return (x + 255) / 256 * 256;
}

size_t q_bf16_bytes(int m, int heads) {
  return align256(sizeof(__nv_bfloat16) * static_cast<size_t>(m) * heads * kMlaHeadDim);
}

__global__ void cast_q_kernel(const float* __restrict__ q, __nv_bfloat16* __restrict__ out, int64_t n) {
  dev::grid_dep_enter();
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[idx] = __float2bfloat16_rn(q[idx]);
}

MlaDecodeParams decode_params(const MlaAttentionConfig& c, const MlaAttentionParams& p) {
  MlaDecodeParams d;
  d.q = reinterpret_cast<const __nv_bfloat16*>(p.workspace);
  d.q_batch_stride = static_cast<int64_t>(p.heads) * kMlaHeadDim;
  d.kv = static_cast<const uint8_t*>(p.kv.data);
  d.kv_scale = p.kv.scale;
  d.block_table = p.meta.block_table;
  d.block_table_stride = p.meta.max_blocks;
  d.seq_lens = p.meta.seq_lens;
  d.out = p.lat;
  d.out_batch_stride = static_cast<int64_t>(p.heads) * kMlaLatentDim;
  d.out_bf16 = false;
  d.batch = p.m;
  d.heads = p.heads;
  d.num_pages = p.kv.num_pages;
  d.softmax_scale = p.softmax_scale;
  d.split_target = c.split_target;
  d.workspace = static_cast<char*>(p.workspace) + q_bf16_bytes(p.m, p.heads);
  return d;
}

MlaDecodeSm90Params sm90_params(const MlaAttentionParams& p) {
  MlaDecodeSm90Params d;
  d.q = p.q_cat;
  d.q_bf16 = false;
  d.q_token_stride = static_cast<int64_t>(p.heads) * kMlaHeadDim;
  d.kv = p.kv.data;
  d.kv_fp8 = p.kv.format == KvFormat::FP8E4M3;
  d.kv_scale = d.kv_fp8 ? p.kv.scale : 1.0f;
  d.num_pages = p.kv.num_pages;
  d.page_size = p.kv.page_size;
  d.block_table = p.meta.block_table;
  d.block_table_stride = p.meta.max_blocks;
  d.seq_lens = p.meta.seq_lens;
  d.positions = p.meta.positions;
  d.topk = p.topk;
  d.topk_width = p.topk_width;
  d.topk_compact = p.topk_compact;
  d.token_seq = p.topk ? p.meta.token_seq : nullptr;
  d.out = p.lat;
  d.out_bf16 = false;
  d.out_token_stride = static_cast<int64_t>(p.heads) * kMlaLatentDim;
  d.n_seqs = p.topk ? p.m : p.meta.n_seqs;  // DSA: one unit per token, its sequence from token_seq
  d.q_per_seq = 1;
  d.heads = p.heads;
  d.softmax_scale = p.softmax_scale;
  d.workspace = p.workspace;
  return d;
}

void check_params(const MlaAttentionConfig& c, const MlaAttentionParams& p) {
  MS_CHECK(p.m >= 0 && p.heads > 0 && p.kv_lora_rank > 0, "mla_attention: m {} heads {} kv_lora_rank {}", p.m,
           p.heads, p.kv_lora_rank);
  MS_CHECK(p.kv.data && p.kv.num_pages > 0 && p.kv.page_size > 0 && p.kv.width > p.kv_lora_rank,
           "mla_attention: cache [{}, {}, {}] cannot hold kv_lora_rank {} + rope", p.kv.num_pages,
           p.kv.page_size, p.kv.width, p.kv_lora_rank);
  MS_CHECK(p.kv.format != KvFormat::FP8E4M3 || p.kv.scale > 0.0f,
           "mla_attention: fp8 cache scale {} must be positive", p.kv.scale);
  MS_CHECK(p.m == 0 || (p.q_cat && p.lat && p.meta.token_seq && p.meta.positions && p.meta.block_table),
           "mla_attention: q_cat, lat, token_seq, positions and block_table must be set");
  MS_CHECK(p.meta.max_blocks > 0, "mla_attention: max_blocks {} must be positive", p.meta.max_blocks);
  MS_CHECK((p.topk == nullptr) == (p.topk_width == 0) && p.topk_width >= 0,
           "mla_attention: topk pointer and topk_width {} disagree", p.topk_width);
  MS_CHECK(c.workspace_bytes == 0 || (p.workspace && reinterpret_cast<uintptr_t>(p.workspace) % 256 == 0),
           "mla_attention: workspace of {} bytes must be set and 256-byte aligned", c.workspace_bytes);
  if (c.kernel == MlaAttentionKernel::Fp8Decode) {
    MS_CHECK(p.topk == nullptr, "mla_attention: the fp8 decode kernel takes no DSA selection");
    MS_CHECK(p.kv.format == KvFormat::FP8E4M3 && p.kv.page_size == kMlaPageSize &&
                 p.kv.width == kMlaHeadDim && p.kv_lora_rank == kMlaLatentDim,
             "mla_attention: the fp8 decode kernel needs fp8 pages of {} x {} with kv_lora_rank {}, got {} "
             "[{}, {}] "
             "rank {}",
             kMlaPageSize, kMlaHeadDim, kMlaLatentDim, kv_format_name(p.kv.format), p.kv.page_size,
             p.kv.width, p.kv_lora_rank);
    MS_CHECK(
        p.meta.seq_lens != nullptr && p.meta.n_seqs == p.m,
        "mla_attention: the fp8 decode kernel needs seq_lens of one sequence per token (n_seqs {} vs m {})",
        p.meta.n_seqs, p.m);
  }
  if (c.kernel == MlaAttentionKernel::WgmmaDecode) {
    MS_CHECK(p.topk == nullptr && p.kv.format == KvFormat::FP8E4M3 && p.kv.width == kMlaHeadDim &&
                 p.kv_lora_rank == kMlaLatentDim,
             "mla_attention: the wgmma decode kernel needs fp8 pages of width {} with kv_lora_rank {} and no "
             "selection, got {} width {} rank {}",
             kMlaHeadDim, kMlaLatentDim, kv_format_name(p.kv.format), p.kv.width, p.kv_lora_rank);
    MS_CHECK(
        p.meta.seq_lens != nullptr && p.meta.n_seqs == p.m,
        "mla_attention: the wgmma decode kernel needs seq_lens of one sequence per token (n_seqs {} vs m {})",
        p.meta.n_seqs, p.m);
  }
  if (c.kernel == MlaAttentionKernel::Sm90Decode) {
    MS_CHECK(
        p.kv.format != KvFormat::F32 && p.kv.width == kMlaHeadDim && p.kv_lora_rank == kMlaLatentDim,
        "mla_attention: the sm90 decode kernel needs fp8 or bf16 pages of width {} with kv_lora_rank {}, got "
        "{} width {} rank {}",
        kMlaHeadDim, kMlaLatentDim, kv_format_name(p.kv.format), p.kv.width, p.kv_lora_rank);
    MS_CHECK(
        p.topk != nullptr || (p.meta.seq_lens != nullptr && p.meta.n_seqs == p.m),
        "mla_attention: the sm90 decode kernel without a selection needs seq_lens of one sequence per token "
        "(n_seqs {} vs m {})",
        p.meta.n_seqs, p.m);
    MS_CHECK(p.topk == nullptr || p.meta.token_seq != nullptr,
             "mla_attention: the sm90 decode kernel over a selection needs token_seq");
  }
}

}  // namespace

const char* mla_attention_kernel_name(MlaAttentionKernel k) {
  return k == MlaAttentionKernel::Fp8Decode     ? "mla_decode_fp8"
         : k == MlaAttentionKernel::Sm90Decode  ? "mla_decode_sm90"
         : k == MlaAttentionKernel::WgmmaDecode ? "mla_decode_wgmma"
                                                : "mla_attention_general";
}

MlaAttentionPrefer mla_decode_kernel_from_env(const char* value) {
  const std::string_view v = value ? value : "";
  if (v.empty()) return MlaAttentionPrefer::Auto;
  if (v == "split") return MlaAttentionPrefer::Fp8Decode;
  if (v == "sm90") return MlaAttentionPrefer::Sm90Decode;
  if (v == "wgmma") return MlaAttentionPrefer::WgmmaDecode;
  MS_THROW("MOESERVE_MLA_DECODE_KERNEL = '{}' is not one of split, sm90, wgmma", v);
}

MlaAttentionConfig mla_attention_choose(const MlaAttentionShape& shape, const DeviceCaps& caps) {
  MS_CHECK(
      shape.heads > 0 && shape.kv_lora_rank > 0 && shape.rope >= 0 && shape.page_size > 0 && shape.m >= 0,
      "mla_attention_choose: heads {} kv_lora_rank {} rope {} page_size {} m {}", shape.heads,
      shape.kv_lora_rank, shape.rope, shape.page_size, shape.m);
  MlaAttentionShape s = shape;
  if (s.prefer == MlaAttentionPrefer::Auto)
    s.prefer = mla_decode_kernel_from_env(std::getenv("MOESERVE_MLA_DECODE_KERNEL"));
  MlaAttentionConfig c;
  // Dense decode over fp8 pages on sm_90: the warpgroup-MMA kernel, built for 64 rows a block (64 and 128
  // heads by default, measured 1.13-1.48x faster than the split-KV kernel on an H200; any head count when
  // asked for). With 8-32 heads the sm90 kernel's narrow configuration is faster than it at batch 32-64
  // (docs/PERFORMANCE.md, 2026-12-02).
  const bool wgmma_heads = s.heads == 64 || s.heads == 128 || s.prefer == MlaAttentionPrefer::WgmmaDecode;
  if ((s.prefer == MlaAttentionPrefer::Auto || s.prefer == MlaAttentionPrefer::WgmmaDecode) && wgmma_heads &&
      s.kv_lora_rank == kMlaLatentDim && s.rope == kMlaRopeDim && s.format == KvFormat::FP8E4M3 &&
      !s.has_topk && s.decode_only && s.n_seqs == s.m && s.m > 0 && caps.arch() == 90 &&
      caps.multiprocessors > 0) {
    const mla_wgmma::Config k = mla_wgmma::choose(s.n_seqs, 1, s.heads, limits_of(caps));
    if (k.heads_per_block > 0 && k.units <= 65535) {
      c.kernel = MlaAttentionKernel::WgmmaDecode;
      c.wgmma = k;
      c.smem_bytes = k.smem;
      c.workspace_bytes = k.workspace;
      c.why = "decode-only batch over fp8 pages of width 512 + 64 on sm_90 (warpgroup MMA)";
      return c;
    }
  }
  if (s.prefer == MlaAttentionPrefer::WgmmaDecode) s.prefer = MlaAttentionPrefer::Auto;  // did not apply
  const bool sm90_shape = s.kv_lora_rank == kMlaLatentDim && s.rope == kMlaRopeDim &&
                          (s.format == KvFormat::FP8E4M3 || s.format == KvFormat::BF16);
  const bool sm90_batch = s.m > 0 && ((s.decode_only && s.n_seqs == s.m) || s.has_topk);
  const bool fast_shape = s.kv_lora_rank == kMlaLatentDim && s.rope == kMlaRopeDim &&
                          s.page_size == kMlaPageSize && s.format == KvFormat::FP8E4M3;
  // Measured on an H200 (docs/PERFORMANCE.md, 2026-12-01): over dense fp8 pages of 64 with 64-row blocks the
  // older split-KV kernel is faster than the sm90 kernel (64 heads, batch 32 x 4k: 104 us against 139 us;
  // batch 1 x 32k: 53 us against 60 us); with few heads and over a DSA selection the sm90 kernel is (8 heads:
  // 119 us against 185 us then, 54 us with the narrow configuration, 2026-12-02).
  // A preference for a kernel that cannot take this batch falls back to the automatic choice (a DSA
  // selection under MOESERVE_MLA_DECODE_KERNEL=split went to the general kernel: a 5x slower step, measured).
  const bool fp8_applies = fast_shape && s.decode_only && !s.has_topk && s.n_seqs == s.m && s.m > 0 &&
                           caps.arch() >= 80 && caps.multiprocessors > 0 &&
                           kFp8DecodeSmem <= caps.smem_per_block_optin;
  if (s.prefer == MlaAttentionPrefer::Fp8Decode && !fp8_applies) s.prefer = MlaAttentionPrefer::Auto;
  if (s.prefer == MlaAttentionPrefer::Fp8DecodeElseGeneral)
    s.prefer = fp8_applies ? MlaAttentionPrefer::Fp8Decode : MlaAttentionPrefer::General;
  if (s.prefer == MlaAttentionPrefer::Sm90Decode && !(sm90_shape && sm90_batch && caps.arch() >= 80))
    s.prefer = MlaAttentionPrefer::Auto;
  // (With 32 heads on sm_89+ the sm90 kernel's narrow configuration is 1.1-2.2x faster than the older one:
  // H200, 2026-12-02.)
  const bool older_fp8_faster = s.prefer == MlaAttentionPrefer::Auto && fast_shape && !s.has_topk &&
                                (s.heads > 32 || (s.heads == 32 && caps.arch() < 89)) &&
                                kFp8DecodeSmem <= caps.smem_per_block_optin;
  if ((s.prefer == MlaAttentionPrefer::Auto || s.prefer == MlaAttentionPrefer::Sm90Decode) && sm90_shape &&
      sm90_batch && !older_fp8_faster && caps.arch() >= 80 && caps.multiprocessors > 0) {
    const int units = s.has_topk ? s.m : s.n_seqs;
    const mla_sm90::Config k =
        mla_sm90::choose(units, 1, s.heads, s.format == KvFormat::FP8E4M3, limits_of(caps),
                         mla_sm90::auto_heads_cap(s.has_topk, units, s.heads, caps.multiprocessors));
    if (k.heads_per_block > 0 && k.units <= 65535 && k.smem <= caps.smem_per_block_optin) {
      c.kernel = MlaAttentionKernel::Sm90Decode;
      c.sm90 = k;
      c.smem_bytes = k.smem;
      c.workspace_bytes = k.workspace;
      c.why = s.has_topk ? "attention over a DSA selection, 512 + 64 wide fp8 or bf16 pages"
                         : "decode-only batch over 512 + 64 wide fp8 or bf16 pages";
      return c;
    }
  }
  if (s.prefer != MlaAttentionPrefer::General && s.prefer != MlaAttentionPrefer::Sm90Decode && fast_shape &&
      s.decode_only && !s.has_topk && s.n_seqs == s.m && s.m > 0 && caps.arch() >= 80 &&
      caps.multiprocessors > 0 && kFp8DecodeSmem <= caps.smem_per_block_optin) {
    c.kernel = MlaAttentionKernel::Fp8Decode;
    c.smem_bytes = kFp8DecodeSmem;
    c.split_target = caps.multiprocessors;
    c.workspace_bytes = q_bf16_bytes(s.m, s.heads) + mla_decode_workspace_bytes(s.m, s.heads, c.split_target);
    c.why = older_fp8_faster
                ? "decode-only batch over fp8 pages of 64 x (512 + 64) without a selection, more "
                  "than 32 heads (faster there than the sm90 kernel)"
                : "decode-only batch over fp8 pages of 64 x (512 + 64) without a selection";
    return c;
  }
  if (s.prefer == MlaAttentionPrefer::General)
    c.why = "the general kernel was asked for";
  else if (!fast_shape)
    c.why = "cache shape or dtype other than fp8 pages of 64 x (512 + 64)";
  else if (!s.decode_only || s.n_seqs != s.m)
    c.why = "prefill tokens in the batch";
  else if (s.has_topk)
    c.why = "attention over a DSA selection";
  else
    c.why = "the device cannot run the fp8 decode kernel (sm_80+ and " + std::to_string(kFp8DecodeSmem) +
            " bytes of shared memory per block)";

  // General: the largest tile that lets two blocks share a multiprocessor, else the largest that fits at all.
  static constexpr int kTiles[][2] = {{16, 32}, {16, 16}, {8, 32}, {8, 16},
                                      {4, 16},  {2, 16},  {1, 16}, {1, 8}};
  const int width = s.kv_lora_rank + s.rope;
  for (const size_t limit : {caps.smem_per_block_optin / 2, caps.smem_per_block_optin}) {
    for (const auto& t : kTiles) {
      const int hg = std::min(t[0], s.heads);
      const size_t smem = mla_general_smem_bytes(hg, t[1], width, s.kv_lora_rank);
      if (smem <= limit) {
        c.kernel = MlaAttentionKernel::General;
        c.heads_per_block = hg;
        c.keys_per_chunk = t[1];
        c.smem_bytes = smem;
        c.workspace_bytes = 0;
        return c;
      }
    }
  }
  MS_THROW(
      "mla_attention_general needs {} bytes of shared memory per block for width {} (the smallest tile) but "
      "the "
      "device (sm_{}) allows {}",
      mla_general_smem_bytes(1, 8, width, s.kv_lora_rank), width, caps.arch(), caps.smem_per_block_optin);
}

void mla_attention_plan(const MlaAttentionConfig& c, const MlaAttentionParams& p, cudaStream_t stream) {
  check_params(c, p);
  if (c.kernel == MlaAttentionKernel::Fp8Decode && p.m > 0) mla_decode_plan(decode_params(c, p), stream);
}

void mla_attention(const MlaAttentionConfig& c, const MlaAttentionParams& p, cudaStream_t stream) {
  check_params(c, p);
  if (p.m == 0) return;
  const DeviceCaps caps = current_device_caps();
  check_smem(caps, mla_attention_kernel_name(c.kernel), c.smem_bytes);
  if (c.kernel == MlaAttentionKernel::Sm90Decode) {
    mla_decode_sm90(c.sm90, sm90_params(p), stream);
    return;
  }
  if (c.kernel == MlaAttentionKernel::WgmmaDecode) {
    mla_decode_wgmma(c.wgmma, sm90_params(p), stream);
    return;
  }
  if (c.kernel == MlaAttentionKernel::General) {
    mla_general_launch(p, c.heads_per_block, c.keys_per_chunk, caps, stream);
    return;
  }
  const int64_t n = static_cast<int64_t>(p.m) * p.heads * kMlaHeadDim;
  const int blocks =
      static_cast<int>(std::min<int64_t>((n + 255) / 256, 8L * std::max(caps.multiprocessors, 1)));
  launch_kernel("cast_q", cast_q_kernel, blocks, 256, 0, stream, p.q_cat,
                static_cast<__nv_bfloat16*>(p.workspace), n);
  mla_decode(decode_params(c, p), stream);
}

}  // namespace ms::cuda
