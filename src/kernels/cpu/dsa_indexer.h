// The DSA lightning indexer's selection: for each query token, score every visible key position j of its
// sequence, index[j] = sum_h w[h] * relu(scale * q[h] . k_j), and keep the top `topk` positions (ties go to
// the lower position). When a token sees at most `topk` keys it keeps them all, so attention is then dense.
#pragma once

#include <cstdint>

#include "kernels/cpu/paged_cache.h"

namespace ms::kernels::cpu {

struct DsaIndexerParams {
  const float* __restrict__ q = nullptr;  // [m, heads, dim] rotated indexer queries
  const float* __restrict__ w = nullptr;  // [m, heads] head weights (weights_proj(x) * heads^-0.5)
  PagedCacheView keys;                    // [pages, page_size, dim] indexer keys
  int64_t m = 0, heads = 0, dim = 0;
  float softmax_scale = 1.0f;                         // dim^-0.5
  const int32_t* __restrict__ token_seq = nullptr;    // [m]
  const int32_t* __restrict__ positions = nullptr;    // [m]
  const int32_t* __restrict__ block_table = nullptr;  // [n_seqs, max_blocks]
  int64_t max_blocks = 0;
  int64_t topk = 0;
  int32_t* __restrict__ out = nullptr;  // [m, topk] selected positions in ascending order, -1 padded
  // Caller-owned scratch of dsa_indexer_scratch_floats(...) floats.
  float* __restrict__ scratch = nullptr;
  int64_t max_keys = 0;  // upper bound on max position + 1
};
int64_t dsa_indexer_scratch_floats(int64_t max_keys, int64_t dim, int threads);
void dsa_indexer(const DsaIndexerParams& p);

}  // namespace ms::kernels::cpu
