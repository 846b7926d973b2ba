// Deterministic prompts for the commands that time the engine (profile, bench-one-batch).
#pragma once

#include <cstdint>
#include <vector>

namespace ms::cli {

// `len` token ids spread over [0, vocab) by a Weyl sequence, different for each `seq`.
inline std::vector<int32_t> synthetic_prompt(int seq, int len, int64_t vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(len));
  uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(seq + 1);
  for (auto& id : ids) {
    x += 0x9e3779b97f4a7c15ull;
    id = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
  }
  return ids;
}

}  // namespace ms::cli
