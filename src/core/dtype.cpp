#include "core/dtype.h"

#include "core/error.h"

namespace ms {

int dtype_bits(DType t) {
  switch (t) {
    case DType::F32:
      return 32;
    case DType::F16:
      return 16;
    case DType::BF16:
      return 16;
    case DType::F8_E4M3:
      return 8;
    case DType::F8_E5M2:
      return 8;
    case DType::NVFP4:
      return 4;
    case DType::U8:
      return 8;
    case DType::I32:
      return 32;
    case DType::I64:
      return 64;
  }
  MS_THROW("unknown dtype {}", static_cast<int>(t));
}

size_t dtype_bytes(DType t, size_t n) {
  if (t == DType::NVFP4) {
    MS_CHECK(n % 2 == 0, "nvfp4 tensors hold an even number of elements, got {}", n);
    return n / 2;
  }
  return n * static_cast<size_t>(dtype_bits(t) / 8);
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::F16:
      return "f16";
    case DType::BF16:
      return "bf16";
    case DType::F8_E4M3:
      return "fp8_e4m3";
    case DType::F8_E5M2:
      return "fp8_e5m2";
    case DType::NVFP4:
      return "nvfp4";
    case DType::U8:
      return "u8";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
  }
  return "?";
}

std::string_view dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
    case DType::F8_E4M3:
      return "F8_E4M3";
    case DType::F8_E5M2:
      return "F8_E5M2";
    case DType::NVFP4:
      return "U8";
    case DType::U8:
      return "U8";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view n) {
  struct Entry {
    std::string_view a, b;
    DType t;
  };
  static constexpr Entry table[] = {
      {"f32", "F32", DType::F32},
      {"f16", "F16", DType::F16},
      {"bf16", "BF16", DType::BF16},
      {"fp8_e4m3", "F8_E4M3", DType::F8_E4M3},
      {"fp8_e5m2", "F8_E5M2", DType::F8_E5M2},
      {"nvfp4", "NVFP4", DType::NVFP4},
      {"u8", "U8", DType::U8},
      {"i32", "I32", DType::I32},
      {"i64", "I64", DType::I64},
  };
  for (const auto& e : table)
    if (n == e.a || n == e.b) return e.t;
  return std::nullopt;
}

bool dtype_is_float(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F8_E4M3 ||
         t == DType::F8_E5M2 || t == DType::NVFP4;
}

}  // namespace ms
