#include "runtime/token_choice.h"

#include <cmath>

namespace ms::runtime {

GeneratedToken choose_token(const float* logits, int64_t vocab, const SamplingParams& params) {
  int64_t best = 0;
  for (int64_t v = 1; v < vocab; ++v)
    if (logits[v] > logits[best]) best = v;
  GeneratedToken g;
  g.token = static_cast<int32_t>(best);
  if (params.top_logprobs >= 0) {
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(logits[v] - logits[best]));
    g.logprob = static_cast<float>(-std::log(sum));
  }
  return g;
}

}  // namespace ms::runtime
