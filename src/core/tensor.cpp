#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ms {

std::string shape_str(std::span<const int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

int64_t shape_numel(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Shape contiguous_strides(std::span<const int64_t> shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}

Tensor Tensor::empty(Shape shape, DType dtype) {
  for (int64_t s : shape) MS_CHECK(s >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  size_t bytes = dtype_bytes(dtype, static_cast<size_t>(shape_numel(shape)));
  size_t alloc = (bytes + 63) / 64 * 64;
  void* p = alloc ? std::aligned_alloc(64, alloc) : nullptr;
  MS_CHECK(alloc == 0 || p != nullptr, "out of host memory allocating {} bytes for {}{}", bytes,
           dtype_name(dtype), shape_str(shape));
  t.owner_ = std::shared_ptr<const void>(p, [](const void* q) { std::free(const_cast<void*>(q)); });
  t.data_ = p;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  if (t.nbytes()) std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::borrow(void* data, Shape shape, DType dtype, std::shared_ptr<const void> keep_alive,
                      Device device) {
  Tensor t;
  t.owner_ = std::move(keep_alive);
  t.data_ = data;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

int64_t Tensor::size(int d) const {
  if (d < 0) d += dim();
  MS_CHECK(d >= 0 && d < dim(), "dimension {} out of range for {}", d, desc());
  return shape_[d];
}

int64_t Tensor::stride(int d) const {
  if (d < 0) d += dim();
  MS_CHECK(d >= 0 && d < dim(), "dimension {} out of range for {}", d, desc());
  return strides_[d];
}

bool Tensor::is_contiguous() const {
  return strides_ == contiguous_strides(shape_);
}

Tensor Tensor::view(Shape shape) const {
  MS_CHECK(is_contiguous(), "view() of a non-contiguous tensor {}", desc());
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MS_CHECK(infer < 0, "view(): more than one -1 in {}", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    MS_CHECK(known > 0 && numel() % known == 0, "view(): cannot infer {} from {}", shape_str(shape), desc());
    shape[infer] = numel() / known;
  }
  MS_CHECK(shape_numel(shape) == numel(), "view(): {} elements cannot be viewed as {}", numel(),
           shape_str(shape));
  Tensor t = *this;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice(int d, int64_t start, int64_t end) const {
  if (d < 0) d += dim();
  MS_CHECK(d >= 0 && d < dim(), "slice(): dimension {} out of range for {}", d, desc());
  MS_CHECK(0 <= start && start <= end && end <= shape_[d], "slice(): [{}, {}) out of range for dim {} of {}",
           start, end, d, desc());
  int64_t offset = start * strides_[d];
  if (dtype_ == DType::NVFP4) MS_CHECK(offset % 2 == 0, "slice(): nvfp4 slice must start on a byte");
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + dtype_bytes(dtype_, static_cast<size_t>(offset));
  t.shape_[d] = end - start;
  return t;
}

Tensor Tensor::select(int d, int64_t index) const {
  if (d < 0) d += dim();
  Tensor t = slice(d, index, index + 1);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::clone() const {
  MS_CHECK(device_ == Device::CPU, "clone() of a device tensor {}", desc());
  Tensor out = empty(shape_, dtype_);
  if (is_contiguous()) {
    if (nbytes()) std::memcpy(out.data_, data_, nbytes());
    return out;
  }
  MS_CHECK(dtype_ != DType::NVFP4, "clone() of a strided nvfp4 tensor");
  const size_t es = static_cast<size_t>(dtype_bits(dtype_) / 8);
  const int64_t n = numel();
  std::vector<int64_t> idx(shape_.size(), 0);
  char* dst = static_cast<char*>(out.data_);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (size_t k = 0; k < idx.size(); ++k) off += idx[k] * strides_[k];
    std::memcpy(dst + i * es, static_cast<const char*>(data_) + off * es, es);
    for (size_t k = idx.size(); k-- > 0;) {
      if (++idx[k] < shape_[k]) break;
      idx[k] = 0;
    }
  }
  return out;
}

std::string Tensor::desc() const {
  return fmt::format("{}{}", dtype_name(dtype_), shape_str(shape_));
}

}  // namespace ms
