// fuzz-sources: src/io/safetensors_header.cpp src/core/dtype.cpp
// libFuzzer target for the safetensors header parser. Each input is tried two ways: as the header JSON
// alone (against a 1 MiB data section, so seeds with small offsets parse), and as a whole file image with
// the 8-byte length in front. Anything but a clean result or an ms::Error is a bug, and so is a clean
// result that breaks the promises of the parser (offsets in range, sizes matching shapes, no overlap).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

void check(const std::vector<ms::io::TensorInfo>& ts, uint64_t data_size) {
  uint64_t furthest = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto& t = ts[i];
    require(!t.name.empty() && t.name != "__metadata__");
    require(t.begin <= t.end && t.end <= data_size);
    uint64_t n = 1;
    for (int64_t d : t.shape) {
      require(d >= 0);
      require(!__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n) || n == 0);
    }
    for (int64_t d : t.shape)
      if (d == 0) n = 0;
    require(n * static_cast<uint64_t>(ms::dtype_bits(t.dtype) / 8) == t.end - t.begin);
    if (i > 0) require(ts[i - 1].begin <= t.begin);  // sorted by offset
    require(t.begin >= furthest);
    if (t.end > furthest) furthest = t.end;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* p = reinterpret_cast<const char*>(data);
  try {
    std::map<std::string, std::string> meta;
    check(ms::io::parse_safetensors_header(p, size, 1 << 20, "fuzz.safetensors", &meta), 1 << 20);
  } catch (const ms::Error&) {
  }
  try {
    uint64_t start = 0;
    auto ts = ms::io::parse_safetensors_image(p, size, "fuzz.safetensors", &start);
    require(start >= 8 && start <= size);
    check(ts, size - start);
  } catch (const ms::Error&) {
  }
  return 0;
}
