// Quality and expert-count effect of Opportunistic Expert Activation: the same B sequences are decoded twice
// in lockstep, once with plain routing (baseline) and once with OEA on every decode token, teacher-forced so
// both runs see the same tokens (the baseline's greedy choice, or the next token of a text). At every decode
// step the two next-token distributions are compared; distinct experts are counted per MoE layer per step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "eval/executor_factory.h"
#include "kv/kv_pool.h"
#include "model/model.h"

namespace ms::eval {

struct MoeEvalOptions {
  int k0 = 0;      // OEA: experts each token keeps, 1..top_k
  int kmax = 0;    // OEA: slots a token may fill, k0..top_k; 0: top_k
  int steps = 32;  // decode steps per sequence (text: each stream is cut to steps + 2 tokens)
  kv::KvCacheDType kv_dtype = kv::KvCacheDType::F32;  // F32: nothing but routing differs between runs
  MakeExecutor make_executor;                         // empty: on the CPU
};

struct MoeEvalResult {
  std::string source;  // "token-id prompts", "text prompts" or "text"
  int batch = 0, k0 = 0, kmax = 0, top_k = 0, n_experts = 0, steps = 0;
  // Means per MoE layer per decode step, and per MoE layer (model layer index in moe_layers).
  double distinct_experts_baseline = 0, distinct_experts_oea = 0;
  std::vector<int> moe_layers;
  std::vector<double> distinct_experts_baseline_per_layer, distinct_experts_oea_per_layer;
  int64_t compared = 0;            // next-token distributions compared (batch x decode steps)
  double top1_agreement = 0;       // fraction of compared rows whose argmax agrees
  double kl_mean = 0, kl_max = 0;  // KL(baseline || OEA) of the next-token distributions, nats
  // Text only: perplexity of the streams' tokens (predicted from the prefill and every decode step).
  std::optional<double> ppl_baseline, ppl_oea;
  int64_t predicted_tokens = 0;

  double distinct_experts_reduction() const {  // 1 - oea / baseline
    return distinct_experts_baseline > 0 ? 1.0 - distinct_experts_oea / distinct_experts_baseline : 0.0;
  }
  nlohmann::json to_json() const;
};

// Greedy continuation of each prompt (batch = prompts.size()), steps decode steps.
MoeEvalResult moe_eval_prompts(model::Model& m, const std::vector<std::vector<int32_t>>& prompts,
                               const MoeEvalOptions& o);
// A text's token ids cut into `batch` consecutive streams of up to steps + 2 tokens; each stream's first
// token is its prompt and the rest are fed one decode step at a time.
MoeEvalResult moe_eval_text(model::Model& m, const std::vector<int32_t>& text_ids, int batch,
                            const MoeEvalOptions& o);

// The fixed prompts: `batch` distinct token-id prompts of 4..12 ids in [0, vocab), or `batch` distinct
// English prompts (a sentence, or two for batch > 16).
std::vector<std::vector<int32_t>> fixed_token_prompts(int batch, int64_t vocab);
std::vector<std::string> fixed_text_prompts(int batch);

}  // namespace ms::eval
