// What one engine step runs: the scheduler's output and the engine's input. The scheduler owns page ids; the
// engine owns the KV memory behind them and only reads the ids here.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/forward_batch.h"

namespace ms::scheduler {

// One sequence's share of a step. Its token list is prompt followed by generated tokens; position i of that
// list lives in page page_ids[i / page_size] at offset i % page_size.
struct PlannedSequence {
  uint64_t seq_id = 0;
  int32_t token_begin = 0;           // first position to compute this step (== KV already present before it)
  int32_t token_end = 0;             // one past the last; also the sequence length attention sees
  std::vector<int32_t> token_ids;    // [token_end - token_begin] the tokens at those positions
  std::vector<int32_t> page_ids;     // [ceil(token_end / page_size)] the block table, covers [0, token_end)
  bool sample = false;               // sample the next token from the logits of position token_end - 1
  bool prefill = false;              // more than one position, or the first chunk of a prompt
  int32_t cached_prefix_tokens = 0;  // of [0, token_begin): served by the prefix cache at admission
};

struct BatchPlan {
  std::vector<PlannedSequence> seqs;  // decodes first, then prefill chunks; each sequence at most once
  std::vector<uint64_t> preempted;    // went back to waiting this step: the engine drops their state
  int32_t num_decode = 0;
  int32_t num_prefill_tokens = 0;
  int32_t num_tokens = 0;  // sum over seqs of token_end - token_begin
  bool empty() const { return seqs.empty(); }
};

// The plan flattened into the step's kv::ForwardBatch, in plan order (sequence b of the batch is
// plan.seqs[b], its tokens by position): token ids, positions, each token's batch sequence and cache slot,
// sequence lengths, block tables ([B, max_blocks] padded with -1) and the rows whose logits are sampled.
kv::ForwardBatch flatten(const BatchPlan& plan, int32_t page_size);

}  // namespace ms::scheduler
