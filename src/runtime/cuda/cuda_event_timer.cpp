#include "runtime/cuda/cuda_event_timer.h"

#include "core/error.h"

#if MOESERVE_HAVE_CUDA
#include <cuda_runtime.h>

#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#endif

namespace ms::runtime::cuda {

#if MOESERVE_HAVE_CUDA

namespace {

class CudaEventTimer final : public profiler::TimerBackend {
 public:
  explicit CudaEventTimer(cudaStream_t stream) : stream_(stream) {
    CUDA_CHECK(cudaEventCreate(&epoch_));
    CUDA_CHECK(cudaEventRecord(epoch_, stream_));
  }
  ~CudaEventTimer() override {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
    cudaEventDestroy(epoch_);
  }
  std::string_view name() const override { return "cuda_events"; }
  void begin_step() override { used_ = 0; }
  int32_t mark() override {
    if (used_ == pool_.size()) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreate(&e));
      pool_.push_back(e);
    }
    CUDA_CHECK(cudaEventRecord(pool_[used_], stream_));
    return static_cast<int32_t>(used_++);
  }
  void resolve(std::vector<double>& times_us) override {
    times_us.resize(used_);
    if (used_ == 0) return;
    CUDA_CHECK(cudaEventSynchronize(pool_[used_ - 1]));
    for (size_t i = 0; i < used_; ++i) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, epoch_, pool_[i]));
      times_us[i] = 1000.0 * ms;
    }
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t epoch_{};
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
};

}  // namespace

std::unique_ptr<profiler::TimerBackend> make_cuda_event_timer(void* stream) {
  return std::make_unique<CudaEventTimer>(static_cast<cudaStream_t>(stream));
}

#else

std::unique_ptr<profiler::TimerBackend> make_cuda_event_timer(void*) {
  MS_THROW("the CUDA event timer needs a build with the CUDA backend");
}

#endif

}  // namespace ms::runtime::cuda
