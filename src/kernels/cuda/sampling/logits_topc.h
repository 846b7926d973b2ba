// Logits rows to candidate summaries on the device (kernels/cpu/logits_topc.h has the layout and the
// reference): one block per row, deterministic (no inter-block merge; every sum in a fixed tree order),
// no allocation, capturable in a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/logits_topc.h"

namespace ms::cuda {

using LogitsTopC = kernels::cpu::LogitsTopC;
using LogitsTopCParams = kernels::cpu::LogitsTopCParams;

// Device bytes of the workspace that lets logits_topc cut each of up to `rows` rows over several blocks.
size_t logits_topc_workspace_bytes(int64_t rows);

// Throws ms::Error naming the field when a pointer, the stride or the sizes cannot work (vocab < 2^31,
// rows < 2^31, rows of 4-byte aligned floats). With a workspace of logits_topc_workspace_bytes(n) bytes and
// p.rows <= n, few rows are each cut over several blocks and merged (the same candidates; sums in the last
// bits apart); without one, one block per row.
void logits_topc(const LogitsTopCParams& p, cudaStream_t stream, LogitsTopC* workspace = nullptr,
                 int64_t workspace_rows = 0);

}  // namespace ms::cuda
