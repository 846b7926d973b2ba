#if MOESERVE_HAVE_CUDA
#include "runtime/cuda/device_arena.h"

#include <cuda_runtime.h>

#include "kernels/cuda/common/cuda_check.h"

namespace ms::runtime::cuda {

namespace {
constexpr size_t kAlign = 256;
size_t round_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}
}  // namespace

void device_memory(size_t& free_bytes, size_t& total_bytes) {
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
}

DeviceArena::DeviceArena(std::string label, int device) : label_(std::move(label)), device_(device) {}

DeviceArena::~DeviceArena() {
  for (Block& b : blocks_) cudaFree(b.base);
}

void DeviceArena::reserve(size_t bytes) {
  bytes = round_up(bytes);
  void* p = nullptr;
  CUDA_CHECK(cudaSetDevice(device_));
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    MS_THROW(
        "device memory for {}: cannot allocate {:.2f} GiB on GPU {} ({:.2f} GiB free of {:.2f}); lower "
        "--mem-fraction-static, the context or the batch, or use more GPUs",
        label_, bytes / 1073741824.0, device_, free_b / 1073741824.0, total_b / 1073741824.0);
  }
  blocks_.push_back({static_cast<char*>(p), bytes, 0});
  reserved_ += bytes;
}

void* DeviceArena::alloc(size_t bytes) {
  bytes = round_up(bytes == 0 ? kAlign : bytes);
  if (blocks_.empty() || blocks_.back().top + bytes > blocks_.back().size) reserve(bytes);
  Block& b = blocks_.back();
  void* p = b.base + b.top;
  b.top += bytes;
  used_ += bytes;
  return p;
}

Tensor DeviceArena::tensor(Shape shape, DType dtype) {
  const size_t n = dtype_bytes(dtype, static_cast<size_t>(shape_numel(shape)));
  return Tensor::borrow(alloc(n), std::move(shape), dtype, nullptr, Device::CUDA);
}

}  // namespace ms::runtime::cuda
#endif
