#include "ops/linear_weight.h"

namespace ms::ops {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32:
      return "f32";
    case WeightFormat::BF16:
      return "bf16";
    case WeightFormat::FP8Block:
      return "fp8_block";
    case WeightFormat::NVFP4:
      return "nvfp4";
  }
  return "?";
}

kernels::cpu::WeightView LinearWeight::cpu_view() const {
  kernels::cpu::WeightView v;
  v.format = static_cast<kernels::cpu::WeightFormat>(format);
  v.rows = out;
  v.cols = in;
  v.data = weight.raw();
  v.scale = scale.raw();
  v.scale2 = scale2;
  v.block = block;
  return v;
}

double LinearWeight::bytes() const {
  return kernels::cpu::weight_bytes(cpu_view());
}

}  // namespace ms::ops
