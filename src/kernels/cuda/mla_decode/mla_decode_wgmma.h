// MLA decode attention (absorbed form) on Hopper warpgroup MMA (sm_90a) over the paged fp8 e4m3 latent cache,
// read in place, dense causal: the semantics and the params of mla_decode_sm90.h (MlaDecodeSm90Params, with
// topk = null and kv_fp8 = true), built for 64 query rows per block (64 heads, or 64 / q_per_seq heads of
// 1-4 query tokens; 128 heads take two head groups).
//
// One block = one sequence x one head group x one split of the sequence's keys; the split plan is derived on
// the device from seq_lens by every block (as in mla_decode_sm90), so the launch is graph-safe; units with
// more than one split are merged by a log-sum-exp combine pass. The kernel and its pipeline are described
// in mla_decode_wgmma.cu.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/kernel_fit.h"
#include "kernels/cuda/mla_decode/mla_decode_sm90.h"
#include "kernels/cuda/mla_decode/mla_decode_wgmma_config.h"

namespace ms::cuda {

// The configuration for these params on `dev` (heads_per_block == 0: use another kernel).
mla_wgmma::Config mla_decode_wgmma_choose(const MlaDecodeSm90Params& p, const DeviceLimits& dev);

// Checks shapes (dense, fp8 pages), alignment, the architecture and the device's shared memory, then launches
// the split pass and, when the config has more than one split, the combine pass. Graph-capturable.
void mla_decode_wgmma(const mla_wgmma::Config& c, const MlaDecodeSm90Params& p, cudaStream_t stream);

// Empty, or the line naming the block, thread, mbarrier and parity of a split-pass wait that timed out (the
// kernel traps after about 4 s instead of hanging; its launch then fails with an unspecified launch failure).
// Also printed to stderr at exit.
std::string mla_decode_wgmma_hang_report();

}  // namespace ms::cuda
