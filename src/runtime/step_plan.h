// One Executor::run call as int32 words, so that rank 0 (the only rank with an Engine) can broadcast each
// step to the other ranks of a sharded model and they run exactly the same forward
// (runtime/leader_executor.h).
//
// Layout (every field an int32 word; int64 values as two words, low first):
//   [0] magic 'MSSP'  [1] version  [2] total words, checksum included  [3] op  [4..5] step (for shutdown and
//   keepalive: the step that would come next)
//   then, for a run: max_blocks, oea {enabled, k0, kmax}, and the arrays, each as its element count followed
//   by its elements: token_ids, positions, token_seq, seq_lens, block_table, slot_mapping (two words per
//   element), logit_rows, decode_tokens (four flags per word, first in the low byte);
//   [last] checksum (FNV-1a over every earlier word).
// The profiler's sink, StepRouting::expert_stats and expert_distribution are rank 0's alone and do not
// travel.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/forward_batch.h"
#include "model/model.h"

namespace ms::runtime {

// Keepalive: no forward; rank 0 sends it while idle so that the followers' wait for the next plan (bounded
// by the communicator's timeout) does not expire, and a rank that died while idle is found.
enum class StepOp : int32_t { Run = 1, Shutdown = 2, Keepalive = 3 };

struct StepPlan {
  StepOp op = StepOp::Run;
  int64_t step = 0;            // counts from 0 at the leader's first run; followers check the order
  kv::ForwardBatch batch;      // Run only
  model::StepRouting routing;  // Run only; expert_stats and expert_distribution are null after decoding
};

inline constexpr int32_t kStepPlanMagic = 0x5053534D;  // "MSSP" in little-endian bytes
inline constexpr int32_t kStepPlanVersion = 1;

// Appends the plan's words to `out` (cleared first; its capacity is reused across steps).
void encode_step_plan(StepOp op, int64_t step, const kv::ForwardBatch* batch,
                      const model::StepRouting* routing, std::vector<int32_t>& out);
inline std::vector<int32_t> encode_step_plan(const StepPlan& p) {
  std::vector<int32_t> w;
  encode_step_plan(p.op, p.step, &p.batch, &p.routing, w);
  return w;
}

// Throws ms::Error naming what is wrong: a wrong magic or version, a size that differs from the buffer's, a
// truncated array, a bad op, a checksum mismatch, words left over.
StepPlan decode_step_plan(std::span<const int32_t> words);

}  // namespace ms::runtime
