// The fixed shape and tile of the FP8 MLA decode kernel, free of CUDA types so that its fit on a device can
// be decided and tested without a GPU (tests/unit/kernels/kernel_fit_test.cpp).
#pragma once

#include <cstddef>

#include "kernels/cuda/common/kernel_fit.h"

namespace ms::cuda {

constexpr int kMlaLatentDim = 512;  // kv_lora_rank: the value part and the output width
constexpr int kMlaRopeDim = 64;
constexpr int kMlaHeadDim = kMlaLatentDim + kMlaRopeDim;  // 576: what a KV token holds and q is dotted with
constexpr int kMlaPageSize = 64;                          // tokens per KV page

namespace mla_decode_config {

constexpr int kHeadsPerBlock = 64;
constexpr int kThreads = 256;
constexpr int kRowStride =
    kMlaHeadDim + 8;  // bf16 elements per shared row: 1168 bytes, ldmatrix conflict-free
constexpr int kPageBytes = kMlaPageSize * kMlaHeadDim;
constexpr int kSStride = kMlaPageSize + 4;  // floats per row of the shared score tile
constexpr size_t kQBytes = size_t{kHeadsPerBlock} * kRowStride * 2;
constexpr size_t kKvBytes = size_t{kMlaPageSize} * kRowStride * 2;
constexpr size_t kSmemBytes = kQBytes + kKvBytes + kPageBytes + size_t{kHeadsPerBlock} * kSStride * 4;

// The split kernel's need: ldmatrix and cp.async (sm_80+) and about 200 KB of shared memory.
inline KernelNeed need() {
  return {"mla_decode (fp8, 576-wide, page 64)", kSmemBytes, 80, false};
}

}  // namespace mla_decode_config
}  // namespace ms::cuda
