// One request inside the engine: what the scheduler does not keep. The scheduler owns the token list, the
// computed count and the page references (scheduler::Sequence); the engine keeps the request, its sampling
// state and what it has already reported.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/engine_types.h"
#include "runtime/sampler.h"

namespace ms::runtime {

struct Sequence {
  uint64_t id = 0;
  Request request;
  int32_t prompt_len = 0;
  int32_t generated = 0;             // tokens already reported; a preempted sequence keeps them
  int32_t cached_prompt_tokens = 0;  // prompt tokens served by the prefix cache at its first admission
  int32_t prompt_done = 0;           // prompt positions computed or served at least once (for the stats)
  bool admitted = false;             // has been in a plan at least once
  bool cancelled = false;
  SamplerState sampler;  // its random stream and, with penalties, the tokens it has seen
};

}  // namespace ms::runtime
