// One request inside the engine: its tokens so far, how many have keys in the KV cache, its pages, its
// sampling state.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/engine_types.h"
#include "runtime/sampler.h"

namespace ms::runtime {

struct Sequence {
  uint64_t id = 0;
  Request request;
  std::vector<int32_t> tokens;  // prompt then generated
  int32_t prompt_len = 0;
  int32_t computed = 0;        // tokens whose keys are in the cache
  std::vector<int32_t> pages;  // KV pages, in order
  int32_t generated = 0;
  bool cancelled = false;
  SamplerState sampler;  // its random stream and, with penalties, the tokens it has seen

  int32_t pending() const { return static_cast<int32_t>(tokens.size()) - computed; }
};

}  // namespace ms::runtime
