// Picks the next token from one row of logits. Greedy (argmax, lowest id on ties) until the full sampler
// (temperature, top-k/p, min-p, penalties, seeds, logprobs) is plugged in here.
#pragma once

#include <cstdint>

#include "runtime/engine_types.h"

namespace ms::runtime {

GeneratedToken choose_token(const float* logits, int64_t vocab, const SamplingParams& params);

}  // namespace ms::runtime
