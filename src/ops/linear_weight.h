// A linear layer's weight as loaded: the stored tensors (borrowed from the checkpoint mapping or owned) and
// its format. Nothing is expanded: kernels dequantise blocks as they go.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "kernels/cpu/weight_view.h"

namespace ms::ops {

enum class WeightFormat : uint8_t { F32, BF16, FP8Block, NVFP4 };
const char* weight_format_name(WeightFormat f);

struct LinearWeight {
  std::string name;  // checkpoint prefix, "model.layers.3.mlp.experts.7.down_proj"
  WeightFormat format = WeightFormat::BF16;
  int64_t out = 0, in = 0;
  Tensor weight;        // F32/BF16: [out, in]; FP8Block: fp8_e4m3 [out, in]; NVFP4: u8 [out, in/2]
  Tensor scale;         // FP8Block: f32 [ceil(out/128), ceil(in/128)]; NVFP4: fp8_e4m3 [out, in/16]
  float scale2 = 1.0f;  // NVFP4 weight_scale_2
  int block = 128;      // FP8Block block edge

  bool defined() const { return out > 0; }
  kernels::cpu::WeightView cpu_view() const;
  double bytes() const;  // stored bytes, for cost models
};

}  // namespace ms::ops
