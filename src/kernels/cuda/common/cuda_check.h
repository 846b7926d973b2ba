#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

// CUDA_CHECK(call): throws ms::Error naming the failing call and the CUDA error.
#define CUDA_CHECK(call)                                                         \
  do {                                                                           \
    cudaError_t err_ = (call);                                                   \
    if (err_ != cudaSuccess) {                                                   \
      cudaGetLastError(); /* a non-sticky error must not reach the next check */ \
      MS_THROW("{} failed: {}", #call, cudaGetErrorString(err_));                \
    }                                                                            \
  } while (0)
