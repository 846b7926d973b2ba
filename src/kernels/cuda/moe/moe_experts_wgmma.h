// The grouped expert GEMMs of the prefill path on Hopper warpgroup MMA (sm_90a): the gate_up and down
// launches of moe_experts_mma (moe_experts_mma.h) with the same inputs and outputs, chosen by moe_experts_mma
// where they apply. Warp-specialised: one producer warpgroup fills a shared-memory ring (activation rows
// gathered through the plan's permutation by cp.async, BF16 weight tiles copied, NVFP4 tiles copied raw and
// expanded to bf16 by the consumers while the previous stage's MMAs run; FP8Block tiles likewise, times their
// block scale), two consumer warpgroups of 64 rows
// run wgmma m64nNk16 from the ring; mbarriers full / empty hand stages over. Output semantics as
// moe_experts_mma: act[pos] = bf16(SiLU(g) * u) and slot_out[slot] = f32 rows, NVFP4 weight_scale_2 applied
// to the f32 accumulators.
#pragma once

#include <cuda_runtime.h>

#include <optional>
#include <string>

#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_experts_wgmma_config.h"

namespace ms::cuda {

// Why the wgmma kernels cannot run p on the current device (format, shape, architecture, shared memory);
// nullopt when they can.
std::optional<std::string> moe_experts_wgmma_unavailable(const MoeExpertsParams& p);

// The configuration the launcher uses for p on the current device; throws ms::Error with the reason when
// nothing fits.
MoeWgmmaConfig moe_experts_wgmma_config(const MoeExpertsParams& p);

// gate_up then down on one stream, after moe_plan and the bf16 conversion of x:
//   xb  bf16 [p.m, p.hidden] packed (16-byte aligned), act bf16 [p.m * p.top_k, p.inter] packed (written),
//   p.slot_out f32 [p.m * p.top_k, p.hidden] (written for every valid slot).
// Throws (before any launch) where moe_experts_wgmma_unavailable(p) says why.
void moe_experts_wgmma_gemms(const MoeExpertsParams& p, const void* xb, void* act, cudaStream_t stream);

}  // namespace ms::cuda
