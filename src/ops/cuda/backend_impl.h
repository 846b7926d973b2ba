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
// warm-up run that precedes every capture). Once graphs hold its address (*keep_replaced set by the
// executor after capture), a growth keeps the old allocation alive until the buffer goes: a captured graph
// replays into the allocation it was captured with.
class GrowBuffer {
 public:
  GrowBuffer(const char* name, const bool* keep_replaced) : name_(name), keep_replaced_(keep_replaced) {}
  ~GrowBuffer();
  GrowBuffer(const GrowBuffer&) = delete;
  GrowBuffer& operator=(const GrowBuffer&) = delete;
  void* get(size_t bytes, cudaStream_t stream);
  // The same, zero-filled on the stream whenever it (re)allocates: for state its users leave zero again.
  void* get_zeroed(size_t bytes, cudaStream_t stream);
  size_t size() const { return size_ + retired_bytes_; }  // device bytes held, replaced allocations included

 private:
  const char* name_;
  const bool* keep_replaced_;
  void* ptr_ = nullptr;
  size_t size_ = 0;
  std::vector<void*> retired_;
  size_t retired_bytes_ = 0;
};

struct CudaBackend::Impl {
  cuda::DeviceCaps caps;
  cuda::BlasLtHandle lt;
  bool keep_replaced = false;  // graphs were captured: growing buffers keep their old allocations
  GrowBuffer linear_x{"linear x scratch", &keep_replaced}, linear_w{"linear weight scratch", &keep_replaced};
  GrowBuffer gemv_ws{"gemv partial sums", &keep_replaced},
      gemv_counters{"gemv split counters", &keep_replaced};
  GrowBuffer attn_ws{"mla attention workspace", &keep_replaced};
  GrowBuffer moe_act{"moe activations", &keep_replaced}, moe_slot{"moe slot outputs", &keep_replaced},
      moe_plan{"moe plan", &keep_replaced};
  GrowBuffer moe_mma{"moe bf16 activations (tensor-core experts)", &keep_replaced};
  GrowBuffer route_aux{"routing scratch", &keep_replaced};
  // Device tables of expert weight pointers, one per MoE layer, keyed by the layer's experts array.
  std::map<const void*, void*> expert_tables;
  // Per MoE layer (same key): the tensor maps of the prefill kernel's tensor-copy loads, built at the layer's
  // first prefill-regime pass; null where the layer's format or shape cannot take them (cp.async loads then).
  std::map<const void*, void*> expert_maps;
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
