#include "kernels/cuda/common/weight.h"

#include "core/error.h"

namespace ms::cuda {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32:
      return "f32";
    case WeightFormat::BF16:
      return "bf16";
    case WeightFormat::FP8Block:
      return "fp8-block";
    case WeightFormat::NVFP4:
      return "nvfp4";
  }
  return "unknown";
}

void check_weight(const DeviceWeight& w, const char* kernel) {
  MS_CHECK(w.rows > 0 && w.cols > 0, "{}: weight rows = {}, cols = {} must be positive", kernel, w.rows,
           w.cols);
  MS_CHECK(w.data != nullptr, "{}: weight data is null", kernel);
  switch (w.format) {
    case WeightFormat::F32:
    case WeightFormat::BF16:
      return;
    case WeightFormat::FP8Block:
      MS_CHECK(w.block > 0, "{}: fp8-block weight block = {} must be positive", kernel, w.block);
      MS_CHECK(w.scale != nullptr, "{}: fp8-block weight scale (weight_scale_inv) is null", kernel);
      return;
    case WeightFormat::NVFP4:
      MS_CHECK(w.cols % 16 == 0, "{}: nvfp4 weight cols = {} must be a multiple of 16", kernel, w.cols);
      MS_CHECK(w.scale != nullptr, "{}: nvfp4 weight scale (weight_scale) is null", kernel);
      return;
  }
  MS_THROW("{}: unknown weight format {}", kernel, static_cast<int>(w.format));
}

}  // namespace ms::cuda
