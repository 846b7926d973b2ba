// Tensor: a shape, element strides, a dtype, a device and storage that is either owned (shared, ref-counted)
// or borrowed (a pointer into memory someone else keeps alive, e.g. an mmap'ed checkpoint).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace ms {

enum class Device : uint8_t { CPU, CUDA };

using Shape = std::vector<int64_t>;

std::string shape_str(std::span<const int64_t> shape);
int64_t shape_numel(std::span<const int64_t> shape);

class Tensor {
 public:
  Tensor() = default;

  // A new owned, 64-byte aligned, contiguous CPU tensor. empty() leaves the bytes uninitialised.
  static Tensor empty(Shape shape, DType dtype);
  static Tensor zeros(Shape shape, DType dtype);
  // A contiguous view of memory kept alive by `keep_alive` (may be null when the caller guarantees it).
  static Tensor borrow(void* data, Shape shape, DType dtype, std::shared_ptr<const void> keep_alive = nullptr,
                       Device device = Device::CPU);

  bool defined() const { return data_ != nullptr || numel() == 0; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const;
  int64_t stride(int d) const;
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return dtype_bytes(dtype_, static_cast<size_t>(numel())); }
  bool is_contiguous() const;

  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }

  // Views sharing storage. NVFP4 tensors support only views that keep whole bytes.
  Tensor view(Shape shape) const;                         // contiguous only; one -1 allowed
  Tensor slice(int d, int64_t start, int64_t end) const;  // [start, end) along d
  Tensor select(int d, int64_t index) const;              // drops dimension d
  // A deep, contiguous copy.
  Tensor clone() const;

  std::string desc() const;  // "bf16[4, 8]"

 private:
  std::shared_ptr<const void> owner_;
  void* data_ = nullptr;
  Shape shape_, strides_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

// Makes a tensor of the given shape and dtype in one device's memory: Tensor::empty on the CPU, device memory
// on CUDA. Workspaces, step buffers and KV pages are allocated through it once, never per step.
using TensorAlloc = std::function<Tensor(const Shape& shape, DType dtype)>;

// Contiguous row-major strides for a shape.
Shape contiguous_strides(std::span<const int64_t> shape);

}  // namespace ms
