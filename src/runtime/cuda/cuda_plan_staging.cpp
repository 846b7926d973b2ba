#include "runtime/cuda/cuda_plan_staging.h"

#include "core/error.h"

#if MOESERVE_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/common/cuda_check.h"
#endif

namespace ms::runtime::cuda {

#if MOESERVE_HAVE_CUDA

namespace {

// Uploads copy from pageable host memory (cudaMemcpyAsync returns once the words are staged, so the caller
// may reuse them), downloads wait for the stream: the broadcast before them has finished, or the NcclComm's
// watchdog has aborted it (then the words are garbage, the plan's checksum refuses them and the next
// collective throws the communicator's error).
class CudaPlanStaging final : public PlanStaging {
 public:
  explicit CudaPlanStaging(cudaStream_t stream) : stream_(stream) { CUDA_CHECK(cudaGetDevice(&device_)); }
  ~CudaPlanStaging() override {
    if (buf_) cudaFree(buf_);
  }
  int32_t* reserve(size_t words) override {
    if (words <= cap_) return buf_;
    size_t cap = 1024;
    while (cap < words) cap *= 2;
    if (buf_) CUDA_CHECK(cudaFree(buf_));  // waits for the device: no broadcast still reads the old one
    buf_ = nullptr;
    cap_ = 0;
    CUDA_CHECK(cudaMalloc(&buf_, cap * sizeof(int32_t)));
    cap_ = cap;
    return buf_;
  }
  void upload(int32_t* buffer, std::span<const int32_t> words) override {
    if (!words.empty())
      CUDA_CHECK(cudaMemcpyAsync(buffer, words.data(), words.size_bytes(), cudaMemcpyHostToDevice, stream_));
  }
  void download(std::span<int32_t> words, const int32_t* buffer) override {
    if (words.empty()) return;
    CUDA_CHECK(cudaMemcpyAsync(words.data(), buffer, words.size_bytes(), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void* stream() const override { return stream_; }
  void bind_thread() override { CUDA_CHECK(cudaSetDevice(device_)); }

 private:
  cudaStream_t stream_;
  int device_ = 0;  // current when the staging was made: the executor's
  int32_t* buf_ = nullptr;
  size_t cap_ = 0;
};

}  // namespace

std::unique_ptr<PlanStaging> make_cuda_plan_staging(void* stream) {
  return std::make_unique<CudaPlanStaging>(static_cast<cudaStream_t>(stream));
}

#else

std::unique_ptr<PlanStaging> make_cuda_plan_staging(void*) {
  MS_THROW("device plan staging: this moeserve was built without CUDA");
}

#endif

}  // namespace ms::runtime::cuda
