// One step's inputs on the executor's device: the ForwardBatch's arrays copied into buffers allocated once
// (on CUDA at fixed addresses, so a captured graph replays with new contents), plus the host scalars shapes
// need and a pointer to the host batch for cost models and probes (which never read device tensors).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kv/forward_batch.h"
#include "ops/attention.h"
#include "ops/ctx.h"

namespace ms::model {

struct StepInputs {
  Tensor token_ids;         // i32 [m]
  Tensor logit_rows;        // i32 [n_logit_rows] token rows whose logits are wanted
  Tensor decode_mask;       // u8 [m], 1 marks a decode token (OEA applies); empty (numel 0) when none is
  ops::AttentionMeta meta;  // token_seq, positions, slots, block_table, seq_lens and m, n_seqs, max_blocks
  int64_t n_logit_rows = 0;
  int64_t n_decode = 0;                    // decode tokens, counted on the host
  const kv::ForwardBatch* host = nullptr;  // the batch these were filled from (host data)

  int64_t m() const { return meta.m; }
};

struct StepLimits {
  int64_t max_tokens = 0, max_seqs = 0, max_logit_rows = 0;
  int64_t max_blocks = 0;  // pages per sequence (block table width)
  int64_t max_keys = 0;    // context capacity (AttentionMeta::max_keys); 0: each step's max position + 1
};

// The preallocated buffers behind StepInputs.
class StepBuffers {
 public:
  StepBuffers() = default;
  StepBuffers(const StepLimits& limits, const TensorAlloc& alloc);

  const StepLimits& limits() const { return limits_; }
  // Copies b (and the decode-token flags, empty or one per token) to the buffers through ctx; throws naming
  // the limit a batch exceeds. The returned views live until the next fill; `b` must outlive them.
  // table_stride > b.max_blocks: the device block table keeps rows of table_stride pages (a captured graph's
  // fixed width) of which only b's first max_blocks columns are written; the kernels read a sequence's pages
  // below its length only, so the columns past them (left from earlier steps) are never read. The copy is
  // then b's table, not a table of the graph's width (at 64 sequences and a 200k context, 4 KB against 800
  // KB).
  StepInputs fill(const ops::Ctx& ctx, const kv::ForwardBatch& b, const std::vector<uint8_t>& decode_tokens,
                  int64_t table_stride = 0);

 private:
  StepLimits limits_;
  Tensor token_ids_, positions_, token_seq_, slots_, block_table_, seq_lens_, logit_rows_, decode_mask_;
};

}  // namespace ms::model
