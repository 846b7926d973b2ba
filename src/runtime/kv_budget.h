// How many tokens the KV pool gets when the user gives a memory fraction instead of a token count
// (--mem-fraction-static on the CPU): that fraction of the memory still available once the weights are
// loaded, divided by the pool's bytes per token, in whole pages, and no more than `cap_tokens` (the most the
// running requests can ever hold: max running requests x context), since memory past that is never used.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"
#include "kv/kv_pool.h"
#include "model/model.h"

namespace ms::runtime {

struct KvBudget {
  int64_t tokens = 0;          // pool capacity, a multiple of the page size
  size_t bytes_per_token = 0;  // over all layers (latent + rope, and the indexer keys of DSA models)
  size_t available_bytes = 0;  // what the fraction was taken of
  bool capped = false;         // cap_tokens, not memory, set the size
};

// Throws ms::Error naming --mem-fraction-static when the fraction is outside (0, 1] or the memory it gives
// holds less than one page.
KvBudget kv_budget_from_memory(size_t available_bytes, double fraction, size_t bytes_per_token,
                               int32_t page_size, int64_t cap_tokens);

// Bytes per token of `model`'s KV pool at this dtype (Auto must be resolved) and page size.
size_t kv_bytes_per_token(const model::Model& model, kv::KvCacheDType dtype, int32_t page_size);

// Memory still available on `device` for the KV pages, in bytes: on the CPU MemAvailable of /proc/meminfo
// (throws when it cannot be read); a CUDA build asks the device (free memory after weights and workspace).
size_t available_memory_bytes(Device device = Device::CPU);

}  // namespace ms::runtime
