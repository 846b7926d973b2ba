#include "ops/ctx.h"

#include <cstring>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace ms::ops {

TensorAlloc cpu_alloc() {
  return [](const Shape& shape, DType dtype) { return Tensor::empty(shape, dtype); };
}

void check_device(const Ctx& ctx, std::string_view op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    if (t && t->raw() != nullptr)
      MS_CHECK(t->device() == ctx.device, "op {}: tensor {} is on {}, the op runs on {}", op, t->desc(),
               t->device() == Device::CPU ? "cpu" : "cuda", ctx.device == Device::CPU ? "cpu" : "cuda");
#if !MOESERVE_HAVE_CUDA
  MS_CHECK(ctx.device == Device::CPU, "op {}: no CUDA backend built", op);
#endif
}

void copy_from_host(const Ctx& ctx, const void* src, const Tensor& dst, size_t bytes) {
  check_device(ctx, "copy_from_host", {&dst});
  MS_CHECK(dst.is_contiguous() && bytes <= dst.nbytes(), "copy_from_host: {} bytes into {}", bytes,
           dst.desc());
  MS_OPS_ON_CUDA(ctx, cuda_ops::copy_from_host(ctx, src, dst, bytes));
  if (bytes) std::memcpy(dst.raw(), src, bytes);
}

void copy_rows_from_host(const Ctx& ctx, const void* src, size_t row_bytes, int64_t rows, const Tensor& dst) {
  check_device(ctx, "copy_rows_from_host", {&dst});
  MS_CHECK(dst.dim() == 2 && dst.is_contiguous() && rows >= 0 && rows <= dst.size(0) &&
               row_bytes <= dtype_bytes(dst.dtype(), static_cast<size_t>(dst.size(1))),
           "copy_rows_from_host: {} rows of {} bytes into {}", rows, row_bytes, dst.desc());
  const size_t pitch = dtype_bytes(dst.dtype(), static_cast<size_t>(dst.size(1)));
  MS_OPS_ON_CUDA(ctx, cuda_ops::copy_rows_from_host(ctx, src, row_bytes, rows, dst, pitch));
  for (int64_t r = 0; r < rows; ++r)
    if (row_bytes)
      std::memcpy(static_cast<char*>(dst.raw()) + static_cast<size_t>(r) * pitch,
                  static_cast<const char*>(src) + static_cast<size_t>(r) * row_bytes, row_bytes);
}

void copy_to_host(const Ctx& ctx, const Tensor& src, void* dst, size_t bytes) {
  check_device(ctx, "copy_to_host", {&src});
  MS_CHECK(src.is_contiguous() && bytes <= src.nbytes(), "copy_to_host: {} bytes out of {}", bytes,
           src.desc());
  MS_OPS_ON_CUDA(ctx, cuda_ops::copy_to_host(ctx, src, dst, bytes));
  if (bytes) std::memcpy(dst, src.raw(), bytes);
}

}  // namespace ms::ops
