// Perplexity of a model over a text, and how far one setting (KV cache dtype, OEA, quantised weights) moves
// the next-token distributions from a reference setting, as llama.cpp's perplexity tool reports it.
//
// The text's token ids are cut into non-overlapping windows of `context` tokens; in each window every token
// after the first is predicted from the tokens before it in that window. Windows run `batch` at a time in
// lockstep. Decode mode (the default) feeds each window's first token as a one-token prefill and every
// further token as a decode step, so each prediction reads its keys back from the KV cache as serving does
// and OEA (which acts on decode tokens only, with its base set over the step's decode tokens) applies.
// Prefill mode runs each window as one prompt forward: faster, and what a prompt's logits see.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "eval/executor_factory.h"
#include "kv/kv_pool.h"
#include "model/model.h"
#include "moe/router.h"

namespace ms::eval {

// One way of running a model.
struct PplSetting {
  model::Model* model = nullptr;
  kv::KvCacheDType kv_dtype = kv::KvCacheDType::F32;
  moe::OeaConfig oea;  // decode mode only
  std::string label;   // "bf16 kv" etc., for reports
};

struct PplOptions {
  int context = 512;  // tokens per window, >= 2
  int batch = 8;      // windows in lockstep
  bool decode = true;
  int64_t max_windows = 0;     // 0: all
  MakeExecutor make_executor;  // empty: on the CPU
};

struct PplStats {
  double ppl = 0, nll_mean = 0;  // nats per predicted token
};

struct PplResult {
  int context = 0, windows = 0;
  int64_t predicted_tokens = 0;
  bool decode = true;
  PplStats test;
  // With a reference: its perplexity, KL(reference || test) per predicted token (mean, max, 99th percentile),
  // the fraction of tokens whose argmax agrees, and the test's perplexity change against the reference.
  std::optional<PplStats> reference;
  double kl_mean = 0, kl_max = 0, kl_p99 = 0, top1_agreement = 0;
  std::string test_label, reference_label;

  double ppl_ratio() const { return reference ? test.ppl / reference->ppl : 1.0; }
  nlohmann::json to_json() const;
};

// `ref` optional: compared token by token (both settings run the same windows in lockstep).
PplResult perplexity(const std::vector<int32_t>& ids, const PplSetting& test, const PplOptions& o,
                     const PplSetting* ref = nullptr);

}  // namespace ms::eval
