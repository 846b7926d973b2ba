// The CUDA backend of the ops: what an op on the GPU needs besides its stream (the cuBLASLt handle, the
// device's limits read once, scratch buffers shared by the ops of one stream, the per-layer expert weight
// tables). The CUDA executor owns one per device and points Ctx::backend at it. Free of CUDA types, so that
// code above ops can hold one without including CUDA headers; every function throws a clear error in a build
// without CUDA.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "ops/ctx.h"

namespace ms::ops {

class CudaBackend {
 public:
  // On the current CUDA device. Throws when the build has no CUDA backend or no device is visible.
  CudaBackend();
  ~CudaBackend();
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  // A context whose ops run on this backend and `stream` (cudaStream_t; null: the default stream).
  Ctx ctx(void* stream);
  // Bytes of scratch the ops have asked for so far (they grow only outside graph capture).
  size_t scratch_bytes() const;
  std::string device_name() const;
  // MoE layers whose prefill kernel loads its weights by tensor copies (their maps are built; see moe_ops).
  int moe_tensor_copy_layers() const;
  // --attention-backend: "auto" (the chooser decides), "mla_general" (never a decode kernel),
  // "mla_fp8_decode" (that kernel for every decode step; refused at launch where it cannot run) or
  // "mla_decode_sm90" (that kernel for decode steps and DSA selections).
  void set_attention_kernel(const std::string& k);
  // f32 math in every linear layer (no bf16 activations in the cuBLASLt paths): for parity tests, slower.
  void set_exact_linear(bool on);
  // Captured graphs now hold the scratch buffers' addresses: from here on a buffer that must grow (a larger
  // prefill than any before) keeps its old allocation alive instead of freeing it under the graphs.
  void keep_replaced_buffers();

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Whether this build has the CUDA backend, and how many CUDA devices are visible (0 without a driver).
bool cuda_backend_built();
int cuda_device_count();

}  // namespace ms::ops
