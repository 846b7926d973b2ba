// Internal to the CUDA branch of the ops (included by src/ops/cuda/*.cpp and src/moe/cuda_route.cpp only).
#pragma once

#if MOESERVE_HAVE_CUDA
#include <cuda_runtime.h>

#include <map>
#include <vector>

#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/gemm/blaslt.h"
#include "ops/cuda_backend.h"

namespace ms::ops {

// A device buffer that grows on demand, never during graph capture (a step's buffers are sized by the eager
// warm-up run that precedes every capture).
class GrowBuffer {
 public:
  explicit GrowBuffer(const char* name) : name_(name) {}
  ~GrowBuffer();
  GrowBuffer(const GrowBuffer&) = delete;
  GrowBuffer& operator=(const GrowBuffer&) = delete;
  void* get(size_t bytes, cudaStream_t stream);
  // The same, zero-filled on the stream whenever it (re)allocates: for state its users leave zero again.
  void* get_zeroed(size_t bytes, cudaStream_t stream);
  size_t size() const { return size_; }

 private:
  const char* name_;
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

struct CudaBackend::Impl {
  cuda::DeviceCaps caps;
  cuda::BlasLtHandle lt;
  GrowBuffer linear_x{"linear x scratch"}, linear_w{"linear weight scratch"};
  GrowBuffer gemv_ws{"gemv partial sums"}, gemv_counters{"gemv split counters"};
  GrowBuffer attn_ws{"mla attention workspace"};
  GrowBuffer moe_act{"moe activations"}, moe_slot{"moe slot outputs"}, moe_plan{"moe plan"};
  GrowBuffer moe_mma{"moe bf16 activations (tensor-core experts)"};
  GrowBuffer route_aux{"routing scratch"};
  // Device tables of expert weight pointers, one per MoE layer, keyed by the layer's experts array.
  std::map<const void*, void*> expert_tables;
  std::string attention_kernel = "auto";
  bool exact_linear = false;
  ~Impl();
};

CudaBackend::Impl& cuda_impl(const Ctx& ctx);
inline cudaStream_t cuda_stream(const Ctx& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

}  // namespace ms::ops
#endif
