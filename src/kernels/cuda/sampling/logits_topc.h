// Logits rows to candidate summaries on the device (kernels/cpu/logits_topc.h has the layout and the
// reference): one block per row, deterministic (no inter-block merge; every sum in a fixed tree order),
// no allocation, capturable in a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cpu/logits_topc.h"

namespace ms::cuda {

using LogitsTopC = kernels::cpu::LogitsTopC;
using LogitsTopCParams = kernels::cpu::LogitsTopCParams;

// Throws ms::Error naming the field when a pointer, the stride or the sizes cannot work (vocab < 2^31,
// rows < 2^31, rows of 4-byte aligned floats).
void logits_topc(const LogitsTopCParams& p, cudaStream_t stream);

}  // namespace ms::cuda
