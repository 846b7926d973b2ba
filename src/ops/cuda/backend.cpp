#include "ops/cuda_backend.h"

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/backend_impl.h"

#if MOESERVE_HAVE_CUDA
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/mla_decode/mla_decode_config.h"
#include "kernels/cuda/mla_decode/mla_decode_sm90_config.h"
#include "kernels/cuda/mla_decode/mla_decode_wgmma_config.h"
#endif

namespace ms::ops {

#if MOESERVE_HAVE_CUDA

GrowBuffer::~GrowBuffer() {
  if (ptr_) cudaFree(ptr_);
  for (void* p : retired_) cudaFree(p);
}

void* GrowBuffer::get(size_t bytes, cudaStream_t stream) {
  if (bytes <= size_) return ptr_;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &st));
  MS_CHECK(st == cudaStreamCaptureStatusNone,
           "{}: {} bytes needed while a CUDA graph is being captured (have {}); the warm-up run before "
           "capture must size it",
           name_, bytes, size_);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const size_t old = size_;
  if (ptr_ && keep_replaced_ && *keep_replaced_) {
    retired_.push_back(ptr_);
    retired_bytes_ += size_;
  } else if (ptr_) {
    CUDA_CHECK(cudaFree(ptr_));
  }
  ptr_ = nullptr;
  size_ = 0;
  // At least 1.5x the old size: a run of ever larger prefills reallocates a few times, not once per size,
  // and the allocations kept alive under captured graphs add up to less than twice the largest.
  const size_t exact = (bytes + 255) / 256 * 256;
  size_t want = std::max(exact, (old + old / 2 + 255) / 256 * 256);
  if (cudaMalloc(&ptr_, want) != cudaSuccess) {
    cudaGetLastError();
    ptr_ = nullptr;
    want = exact;  // the headroom did not fit: the exact size may
    if (cudaMalloc(&ptr_, want) != cudaSuccess) {
      cudaGetLastError();
      size_ = 0;
      ptr_ = nullptr;
      MS_THROW("{}: cannot allocate {:.1f} MiB on the GPU", name_, want / 1048576.0);
    }
  }
  size_ = want;
  return ptr_;
}

void* GrowBuffer::get_zeroed(size_t bytes, cudaStream_t stream) {
  const size_t before = size_;
  void* p = get(bytes, stream);
  if (size_ != before) CUDA_CHECK(cudaMemsetAsync(p, 0, size_, stream));
  return p;
}

CudaBackend::Impl::~Impl() {
  for (auto& [k, p] : expert_tables) cudaFree(p);
  for (auto& [k, p] : expert_maps)
    if (p) cudaFree(p);
}

CudaBackend::CudaBackend() {
  const int n = cuda::device_count();
  MS_CHECK(n > 0, "--device cuda: no CUDA device is visible (no driver, or CUDA_VISIBLE_DEVICES hides them)");
  impl_ = std::make_unique<Impl>();
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  impl_->caps = cuda::query_device(dev);
}

CudaBackend::~CudaBackend() = default;

Ctx CudaBackend::ctx(void* stream) {
  Ctx c;
  c.device = Device::CUDA;
  c.stream = stream;
  c.backend = this;
  return c;
}

size_t CudaBackend::scratch_bytes() const {
  const Impl& i = *impl_;
  return i.linear_x.size() + i.linear_w.size() + i.gemv_ws.size() + i.gemv_counters.size() +
         i.attn_ws.size() + i.moe_act.size() + i.moe_slot.size() + i.moe_plan.size() + i.moe_mma.size() +
         i.route_aux.size();
}

int CudaBackend::moe_tensor_copy_layers() const {
  int n = 0;
  for (const auto& [k, p] : impl_->expert_maps) n += p != nullptr;
  return n;
}

std::string CudaBackend::device_name() const {
  return impl_->caps.name;
}

void CudaBackend::set_attention_kernel(const std::string& k) {
  MS_CHECK(k == "auto" || k == "mla_general" || k == "mla_fp8_decode" || k == "mla_decode_sm90" ||
               k == "mla_decode_wgmma",
           "attention backend '{}' is not one of auto, mla_general, mla_fp8_decode, mla_decode_sm90, "
           "mla_decode_wgmma",
           k);
  if (k == "mla_fp8_decode") cuda::check_fit(impl_->caps, cuda::mla_decode_config::need());
  if (k == "mla_decode_sm90") cuda::check_fit(impl_->caps, cuda::mla_sm90::need());
  if (k == "mla_decode_wgmma") cuda::check_fit(impl_->caps, cuda::mla_wgmma::need());
  impl_->attention_kernel = k;
}

void CudaBackend::set_exact_linear(bool on) {
  impl_->exact_linear = on;
}

void CudaBackend::keep_replaced_buffers() {
  impl_->keep_replaced = true;
}

CudaBackend::Impl& cuda_impl(const Ctx& ctx) {
  MS_CHECK(ctx.device == Device::CUDA && ctx.backend != nullptr,
           "a CUDA op ran without its backend (Ctx::backend is null)");
  return static_cast<CudaBackend*>(ctx.backend)->impl();
}

bool cuda_backend_built() {
  return true;
}
int cuda_device_count() {
  return cuda::device_count();
}

#else

struct CudaBackend::Impl {};
CudaBackend::CudaBackend() {
  MS_THROW("--device cuda: this build of moeserve has no CUDA backend (configure with -DMOESERVE_CUDA=ON)");
}
CudaBackend::~CudaBackend() = default;
Ctx CudaBackend::ctx(void*) {
  return Ctx{};
}
size_t CudaBackend::scratch_bytes() const {
  return 0;
}
int CudaBackend::moe_tensor_copy_layers() const {
  return 0;
}
std::string CudaBackend::device_name() const {
  return {};
}
void CudaBackend::set_attention_kernel(const std::string&) {}
void CudaBackend::set_exact_linear(bool) {}
void CudaBackend::keep_replaced_buffers() {}
bool cuda_backend_built() {
  return false;
}
int cuda_device_count() {
  return 0;
}

#endif

}  // namespace ms::ops
