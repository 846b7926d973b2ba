// The DSA lightning indexer's selection on the GPU, with the semantics of kernels/cpu/dsa_indexer.h: for
// token i and each visible position j = 0..positions[i] of its sequence,
//   index[j] = sum_h w[i, h] * relu(softmax_scale * q[i, h] . k_j)    (heads summed in ascending order)
// and topk[i] = the `topk` positions of highest index (ties to the lower position), in ascending order; a
// token that sees at most `topk` keys keeps them all (0..positions[i]) and is padded with -1.
//
// Two kernels per group of tokens: scores (block = 64 keys x one token; q and the key rows in shared memory)
// into the workspace [tokens, max_keys], then a block-wide select per token: radix select on the order-
// preserving bits of the scores (4 passes of 8 bits) finds the topk-th score T, then one ascending scan keeps
// every key above T and the lowest-positioned keys equal to T. Graph-capturable: nothing is read back.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/paged_kv/paged_kv.h"

namespace ms::cuda {

struct DsaIndexerParams {
  const float* __restrict__ q = nullptr;  // [m, heads, dim] rotated indexer queries, contiguous
  const float* __restrict__ w = nullptr;  // [m, heads] head weights, contiguous
  PagedKvLayer keys;                      // [num_pages, page_size, dim] f32, bf16 or fp8 e4m3
  AttentionMetaDevice meta;               // token_seq, positions, block_table
  int m = 0, heads = 0, dim = 0;
  float softmax_scale = 1.0f;
  int topk = 0;
  int32_t* __restrict__ out = nullptr;  // [m, topk] ascending positions, -1 padded
  // Scores of up to dsa_indexer_rows_per_pass tokens at once: f32 [rows, max_keys], 256-byte aligned.
  int max_keys = 0;  // > every positions[i]: the context capacity (positions beyond it are clamped)
  void* __restrict__ workspace = nullptr;
  size_t workspace_bytes = 0;  // at least dsa_indexer_workspace_bytes(1, max_keys)
};

// Bytes of workspace for scoring `rows` tokens per pass (rows = m: one pass per call).
size_t dsa_indexer_workspace_bytes(int rows, int max_keys);

// Checks shapes and the device's shared memory, then launches on `stream`, in passes of as many tokens as the
// workspace holds.
void dsa_indexer(const DsaIndexerParams& p, cudaStream_t stream);

}  // namespace ms::cuda
