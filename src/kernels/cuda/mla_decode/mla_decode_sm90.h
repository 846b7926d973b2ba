// MLA decode attention (absorbed form) on the tensor cores over the paged latent cache (fp8 e4m3 with the
// layer's scale, or bf16), read in place, dense causal or over a DSA selection.
//
// For query token i of a unit and head h: s_j = softmax_scale * <q[i,h,:576], kv_j[:576]> over the keys j the
// token sees, out[i,h,:512] = sum_j softmax(s)_j kv_j[:512] (the latent output; W_UV is applied by the
// caller). Dense: a unit is a sequence with q_per_seq consecutive tokens (token u * q_per_seq + j), keys are
// positions 0..seq_lens[u]-1 and token i sees those <= positions[i]. DSA: a unit is one token, keys are the
// entries of topk[i] with 0 <= entry <= positions[i] (-1 = none). Rows of keys a token may not see (page
// tails, which may hold NaN bytes) are never loaded: their shared rows are zero-filled by the copy.
//
// Split-KV: the grid is fixed by host-known shapes (max_splits x head groups x units); every block derives
// the same split plan from the device's seq_lens (keys per split = the longest sequence's keys / max_splits,
// at least 64) and blocks past their unit's splits exit, so it is safe under CUDA graph capture. A unit with
// one split writes its output directly; others go through a log-sum-exp combine pass.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/mla_decode/mla_decode_sm90_config.h"

namespace ms::cuda {

struct MlaDecodeSm90Params {
  const void* __restrict__ q = nullptr;  // [tokens, heads, 576] f32 or bf16 (q_bf16); head stride 576
  bool q_bf16 = false;
  int64_t q_token_stride = 0;  // elements between tokens of q (>= heads * 576, a multiple of 8)
  const void* __restrict__ kv =
      nullptr;  // [num_pages, page_size, 576] fp8 e4m3 or bf16 (kv_fp8), 16-byte aligned
  bool kv_fp8 = true;
  float kv_scale = 1.f;  // fp8: value = e4m3 * kv_scale (ignored for bf16)
  int num_pages = 0, page_size = 0;
  const int32_t* __restrict__ block_table = nullptr;  // [n_seqs, block_table_stride] page ids in token order
  int block_table_stride = 0;
  const int32_t* __restrict__ seq_lens = nullptr;   // [n_seqs] keys of each sequence (dense only)
  const int32_t* __restrict__ positions = nullptr;  // [tokens] position of each query token
  const int32_t* __restrict__ topk = nullptr;  // [tokens, topk_width] selected positions, or null (dense)
  int topk_width = 0;
  // The selection is compact: token i's entries past its first positions[i] + 1 are all -1 (what the DSA
  // indexer writes: ascending positions, -1 padded), so a token's tiles stop there. Without it every entry
  // of the row is visited.
  bool topk_compact = false;
  // Caps the heads of one block (16, 32 or 64; 0: the chooser decides: DSA launches of a handful of tokens
  // take 16 heads per block, so that head groups rather than long key ranges fill the multiprocessors).
  int max_heads_per_block = 0;
  // Keeps fp8 launches of at most 32 rows off the narrow configuration, on the kernel that widens whole tiles
  // in shared memory (for comparison and timing; mla_decode_sm90_choose reads it).
  bool no_narrow = false;
  const int32_t* __restrict__ token_seq =
      nullptr;                       // DSA: [tokens] sequence of each token (null: i / q_per_seq)
  void* __restrict__ out = nullptr;  // [tokens, heads, 512] f32 or bf16 (out_bf16), 16-byte aligned
  bool out_bf16 = false;
  int64_t out_token_stride = 0;  // elements between tokens of out (>= heads * 512, a multiple of 4)
  int n_seqs = 0;                // sequences; tokens = n_seqs * q_per_seq
  int q_per_seq = 1;             // 1..4 query tokens per sequence (token u * q_per_seq + j of sequence u)
  int heads = 0;
  float softmax_scale = 1.f;
  void* __restrict__ workspace = nullptr;  // config.workspace bytes, 256-byte aligned (null when 0)
};

// The configuration for these params' shapes on `dev` (mla_sm90::choose with units = n_seqs, or tokens for
// DSA). heads_per_block == 0 when nothing fits.
mla_sm90::Config mla_decode_sm90_choose(const MlaDecodeSm90Params& p, const DeviceLimits& dev);

// Checks shapes, alignment and the device's shared memory, then launches the split pass and, when the
// config has more than one split, the combine pass. Graph-capturable.
void mla_decode_sm90(const mla_sm90::Config& c, const MlaDecodeSm90Params& p, cudaStream_t stream);

}  // namespace ms::cuda
