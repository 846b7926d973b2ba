// One element of a DeviceWeight as f32, computed with the same operations in the same order as the CPU
// reference (kernels/cpu/weight_view.cpp dequantize_row), so both give the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/float_codecs.cuh"
#include "kernels/cuda/common/weight.h"

namespace ms::cuda::dev {

template <WeightFormat F>
__device__ __forceinline__ float weight_at(const DeviceWeight& w, int64_t row, int64_t col) {
  if constexpr (F == WeightFormat::F32) {
    return static_cast<const float*>(w.data)[row * w.cols + col];
  } else if constexpr (F == WeightFormat::BF16) {
    return bf16_bits_to_f32(static_cast<const uint16_t*>(w.data)[row * w.cols + col]);
  } else if constexpr (F == WeightFormat::FP8Block) {
    const int64_t scale_cols = (w.cols + w.block - 1) / w.block;
    const float s = static_cast<const float*>(w.scale)[(row / w.block) * scale_cols + col / w.block];
    return fp8_e4m3_to_f32(static_cast<const uint8_t*>(w.data)[row * w.cols + col]) * s;
  } else {
    const uint32_t byte = static_cast<const uint8_t*>(w.data)[row * (w.cols / 2) + col / 2];
    const uint32_t code = (col & 1) ? (byte >> 4) : (byte & 15u);
    const float s =
        fp8_e4m3_to_f32(static_cast<const uint8_t*>(w.scale)[row * (w.cols / 16) + col / 16]) * w.scale2;
    return e2m1_to_f32(code) * s;
  }
}

}  // namespace ms::cuda::dev
