#include "runtime/kv_budget.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"

namespace ms::runtime {

KvBudget kv_budget_from_memory(size_t available_bytes, double fraction, size_t bytes_per_token,
                               int32_t page_size, int64_t cap_tokens) {
  MS_CHECK(fraction > 0 && fraction <= 1, "--mem-fraction-static must be in (0, 1], got {}", fraction);
  MS_CHECK(page_size > 0, "--page-size must be positive, got {}", page_size);
  MS_CHECK(bytes_per_token > 0, "KV bytes per token must be positive");
  KvBudget b;
  b.bytes_per_token = bytes_per_token;
  b.available_bytes = available_bytes;
  const double budget = static_cast<double>(available_bytes) * fraction;
  const auto pages_by_memory =
      static_cast<int64_t>(budget / (static_cast<double>(bytes_per_token) * static_cast<double>(page_size)));
  MS_CHECK(pages_by_memory >= 1,
           "--mem-fraction-static {} of the {} MiB available holds no KV page ({} bytes); raise it or give "
           "--kv-cache-tokens",
           fraction, available_bytes >> 20, bytes_per_token * static_cast<size_t>(page_size));
  int64_t pages = pages_by_memory;
  if (cap_tokens > 0) {
    const int64_t cap_pages = std::max<int64_t>(1, (cap_tokens + page_size - 1) / page_size);
    if (cap_pages < pages) {
      pages = cap_pages;
      b.capped = true;
    }
  }
  b.tokens = pages * page_size;
  return b;
}

size_t kv_bytes_per_token(const model::Model& model, kv::KvCacheDType dtype, int32_t page_size) {
  const kv::KvPool one_page(model.kv_pool_config(1, page_size, dtype));
  return std::max<size_t>(1, one_page.bytes() / static_cast<size_t>(page_size));
}

size_t available_memory_bytes(Device device) {
  MS_CHECK(device == Device::CPU, "KV budget on cuda: no CUDA backend built (give --kv-cache-tokens)");
  std::ifstream f("/proc/meminfo");
  MS_CHECK(f.good(), "cannot read /proc/meminfo to size the KV cache: give --kv-cache-tokens");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    size_t kib = 0;
    in >> kib;
    return kib * 1024;
  }
  MS_THROW("/proc/meminfo has no MemAvailable line: give --kv-cache-tokens");
}

}  // namespace ms::runtime
