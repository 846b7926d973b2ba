// The context every op entry point takes first: which device runs it and that device's handles. One dispatch
// point per op reads ctx.device; the CPU backend ignores the stream and the BLAS handle.
#pragma once

#include <initializer_list>
#include <string_view>

#include "core/tensor.h"

namespace ms::ops {

struct Ctx {
  Device device = Device::CPU;
  void* stream = nullptr;  // cudaStream_t on CUDA (every launch of a step goes to it); unused on the CPU
  void* backend =
      nullptr;  // ops::CudaBackend on CUDA (cuBLASLt handle, device limits, scratch); unused on the CPU

  static Ctx cpu() { return Ctx{}; }
};

using ms::TensorAlloc;
// Tensor::empty (CPU memory).
TensorAlloc cpu_alloc();

// Every defined tensor of an op must live on ctx.device; in a build without the CUDA backend a CUDA context
// throws "op <op>: no CUDA backend built". Called by each entry point before it dispatches.
void check_device(const Ctx& ctx, std::string_view op, std::initializer_list<const Tensor*> tensors);

// Host <-> device copies of `bytes` bytes (plain memcpy on the CPU). dst/src must be contiguous.
void copy_from_host(const Ctx& ctx, const void* src, const Tensor& dst, size_t bytes);
// `rows` rows of `row_bytes` bytes, packed at src, into the first row_bytes of dst's first rows (a 2-D
// tensor whose rows may be wider): one strided copy on CUDA. The rest of each dst row is left as it was.
void copy_rows_from_host(const Ctx& ctx, const void* src, size_t row_bytes, int64_t rows, const Tensor& dst);
// Waits for the copy (a sync on CUDA): the caller reads dst at once.
void copy_to_host(const Ctx& ctx, const Tensor& src, void* dst, size_t bytes);

// The dispatch point of an entry point: on a CUDA context, runs `call` (the op's CUDA branch, ops/cuda/) and
// returns; on the CPU, falls through to the CPU kernel.
#if MOESERVE_HAVE_CUDA
#define MS_OPS_ON_CUDA(ctx, call)                                                                         \
  if ((ctx).device == ::ms::Device::CUDA) {                                                               \
    MS_CHECK((ctx).backend != nullptr, "an op ran on a CUDA context without its backend (Ctx::backend)"); \
    call;                                                                                                 \
    return;                                                                                               \
  }
#else
#define MS_OPS_ON_CUDA(ctx, call) \
  do {                            \
  } while (0)
#endif

}  // namespace ms::ops
