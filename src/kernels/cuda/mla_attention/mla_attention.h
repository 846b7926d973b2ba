// MLA attention (absorbed form) over one layer's paged cache, for any batch: prefill chunks and decode tokens
// mixed, f32 / bf16 / fp8 e4m3 pages read in place, any latent and rope widths and page size, dense causal or
// over a DSA selection. Semantics of kernels/cpu/mla.h (mla_attention):
//   lat[i, h] = sum_j p_j kv_j[:r],  p = softmax_j(softmax_scale * q_cat[i, h] . kv_j)
// over j = positions 0..positions[i] of sequence token_seq[i], or over the entries j of topk[i] with
// 0 <= j <= positions[i] (-1 = none); a token with no visible key gets zeros.
//
// Choice is kept apart from launch: mla_attention_choose picks a kernel and its configuration from shapes the
// host knows and the device's limits (a pure function, testable without a GPU); mla_attention_plan runs the
// per-step planning of the chosen kernel (once per step, reused by every layer); mla_attention launches.
//   General:   one block per (token, group of heads); the group's q rows and a chunk of keys (converted to
//   f32)
//              in shared memory; scores, an online softmax and the latent accumulation in f32.
//   Sm90Decode: the tensor-core kernel of kernels/cuda/mla_decode/mla_decode_sm90.h (bf16 q and P, f32
//              accumulation, split plan on the device) when r = 512, rope = 64, the pages are fp8 or bf16 of
//              any size, and the batch is decode only (one token per sequence, token i of sequence i) or
//              attends over a DSA selection (any batch: one unit per token). The default where it fits,
//              except dense fp8 pages of 64 with 32+ heads, where Fp8Decode measured faster.
//   WgmmaDecode: the sm_90a warpgroup-MMA kernel of kernels/cuda/mla_decode/mla_decode_wgmma.h (f16 q, keys
//              and P, f32 accumulation, split plan on the device) for a decode-only batch over fp8 pages of
//              width 512 + 64 (any page size) on sm_90: the default there for 64 and 128 heads (the head
//              counts it is built for: 64 rows per block), and chosen for any head count when asked for.
//   Fp8Decode: the older tensor-core kernel of kernels/cuda/mla_decode (decode only, fp8 pages of 64, no
//              selection; q_cat cast to bf16 into the workspace first): the default for 32+ heads there,
//              and chosen when asked for (prefer = Fp8Decode).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/mla_decode/mla_decode_sm90_config.h"
#include "kernels/cuda/mla_decode/mla_decode_wgmma.h"
#include "kernels/cuda/paged_kv/paged_kv.h"

namespace ms::cuda {

enum class MlaAttentionKernel : uint8_t { General, Fp8Decode, Sm90Decode, WgmmaDecode };
// What the caller asks for (--attention-backend): Auto takes the fastest kernel that fits. With Auto, the
// environment variable MOESERVE_MLA_DECODE_KERNEL = split | sm90 | wgmma asks for Fp8Decode, Sm90Decode or
// WgmmaDecode (for comparing them on one build); a kernel that does not apply falls back as Auto would.
// A preference for a kernel that cannot take the batch falls back to Auto; Fp8DecodeElseGeneral (exact-parity
// runs) is the split-KV fp8 kernel where it applies and the f32 general kernel everywhere else.
enum class MlaAttentionPrefer : uint8_t {
  Auto,
  General,
  Fp8Decode,
  Sm90Decode,
  WgmmaDecode,
  Fp8DecodeElseGeneral
};
// The preference named by a MOESERVE_MLA_DECODE_KERNEL value (null or empty: Auto); throws on another value.
MlaAttentionPrefer mla_decode_kernel_from_env(const char* value);
const char* mla_attention_kernel_name(MlaAttentionKernel k);

// What the host knows of a step's attention call.
struct MlaAttentionShape {
  int m = 0;  // tokens
  int heads = 0;
  int kv_lora_rank = 0, rope = 0;  // cache width = kv_lora_rank + rope
  int page_size = 0;
  KvFormat format = KvFormat::BF16;
  bool has_topk = false;     // attention over a DSA selection
  bool decode_only = false;  // every sequence has exactly one token this step and token i is sequence i
  int n_seqs = 0;
  MlaAttentionPrefer prefer = MlaAttentionPrefer::Auto;
};

struct MlaAttentionConfig {
  MlaAttentionKernel kernel = MlaAttentionKernel::General;
  int heads_per_block = 0, keys_per_chunk = 0;  // General
  size_t smem_bytes = 0;                        // per block, checked against the device
  int split_target = 0;                         // Fp8Decode: blocks the split plan fills (multiprocessors)
  size_t workspace_bytes = 0;                   // device workspace mla_attention_plan / mla_attention need
  mla_sm90::Config sm90;                        // Sm90Decode: its tile, ring and split configuration
  mla_wgmma::Config wgmma;                      // WgmmaDecode: its head groups and splits
  std::string why;                              // why this kernel (and not the other)
};

struct MlaAttentionParams {
  const float* __restrict__ q_cat = nullptr;   // [m, heads, kv_lora_rank + rope] contiguous
  PagedKvLayer kv;                             // [num_pages, page_size, kv_lora_rank + rope]
  AttentionMetaDevice meta;                    // token_seq, positions, block_table (+ seq_lens for Fp8Decode)
  const int32_t* __restrict__ topk = nullptr;  // [m, topk_width] selected positions, -1 = none; or null
  int topk_width = 0;
  bool topk_compact = false;          // see MlaDecodeSm90Params::topk_compact
  float* __restrict__ lat = nullptr;  // [m, heads, kv_lora_rank] contiguous, 16-byte aligned
  int m = 0, heads = 0, kv_lora_rank = 0;
  float softmax_scale = 1.0f;
  void* __restrict__ workspace = nullptr;  // config.workspace_bytes, 256-byte aligned (null when 0)
};

// Picks the kernel and its tile configuration; throws ms::Error when no configuration fits `caps`.
MlaAttentionConfig mla_attention_choose(const MlaAttentionShape& s, const DeviceCaps& caps);

// Per-step planning (Fp8Decode: the split plan from meta.seq_lens; General: nothing). Graph-capturable.
void mla_attention_plan(const MlaAttentionConfig& c, const MlaAttentionParams& p, cudaStream_t stream);

// Checks shapes, dtypes, alignment and the device's shared memory, then launches. Graph-capturable.
void mla_attention(const MlaAttentionConfig& c, const MlaAttentionParams& p, cudaStream_t stream);

}  // namespace ms::cuda
