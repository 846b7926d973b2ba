// Element types of tensors. NVFP4 is packed: two E2M1 codes per byte, element 2i in the low nibble.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ms {

enum class DType : uint8_t { F32, F16, BF16, F8_E4M3, F8_E5M2, NVFP4, U8, I32, I64 };

// Bits per element (4 for NVFP4).
int dtype_bits(DType t);
// Bytes for n elements; NVFP4 needs n even.
size_t dtype_bytes(DType t, size_t n);
// Our name: "f32", "bf16", "fp8_e4m3", "nvfp4", ...
std::string_view dtype_name(DType t);
// Parses our names and the safetensors names ("F32", "BF16", "F8_E4M3", "U8", ...).
std::optional<DType> dtype_from_name(std::string_view name);
// The safetensors dtype string; NVFP4 is stored as "U8".
std::string_view dtype_safetensors_name(DType t);
bool dtype_is_float(DType t);

}  // namespace ms
