// Routed experts on tensor cores for the prefill regime (hundreds to thousands of tokens a step): the same
// plan (moe_plan.h), weights table and result as moe_experts (moe_experts.h), in four launches:
//   convert: xb[t]          = bf16(x[t])                                            (once per token)
//   gate_up: act[pos]       = bf16(SiLU(xb[token] @ gate_e^T) * (xb[token] @ up_e^T)) for every grouped pos
//   down:    slot_out[slot] = act[pos] @ down_e^T                                   (f32, slot =
//   sorted_slots[pos]) combine: moe_experts_combine (unchanged: out[t] += weighted slot rows in slot order;
//   deterministic)
// One launch per projection covers every expert: a fixed grid walks the (expert, N tile, M tile) work items
// that each block derives from the device-resident counts, so the chain is graph-capturable; experts with no
// token have no work item and their weights are never read. Weights (NVFP4, FP8Block or BF16) are copied as
// stored into shared memory by cp.async (a multi-stage pipeline), NVFP4 and FP8Block are expanded there to
// BF16 (FP8Block: bf16(e4m3 x its 128x128 block's f32 scale)), and the math is mma.sync m16n8k16 bf16 -> f32.
// Accuracy against the f32 CPU reference: activations, act and the NVFP4 / FP8Block weights (value times
// scale) are rounded to bf16, so results agree to ~1e-2 relative, not bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_experts_mma_config.h"

namespace ms::cuda {

// Whether the tensor-core kernels take p: format NVFP4, FP8Block (fp8_block a multiple of 64) or BF16,
// hidden a multiple of 128, inter of 64, n_experts <= 1024. Says nothing about the regime
// (moe_experts_prefill_regime) or the device.
bool moe_experts_mma_supported(const MoeExpertsParams& p);

// Workspace of moe_experts_mma for up to m tokens: xb [m, hidden] bf16, act [m * top_k, inter] bf16 and xg
// [m * top_k, hidden] bf16 (the grouped rows of the wgmma kernel's tensor-copy loads), each 256-byte aligned.
// (p.act is not used by this path; p.slot_out is, as f32 [m * top_k, hidden].)
size_t moe_experts_mma_workspace_bytes(int m, int top_k, int hidden, int inter);

// The configuration the launchers use for p on the current device; throws ms::Error naming the kernel, the
// shared memory it needs and the device's limit when nothing fits.
MoeMmaConfig moe_experts_mma_config(const MoeExpertsParams& p);

// Which grouped GEMM kernel moe_experts_mma runs for p on the current device (never Auto): p.prefill_kernel
// if not Auto, else MOESERVE_MOE_PREFILL_KERNEL (mma | wgmma; anything else: auto), else Wgmma where the
// warpgroup-MMA kernels can run (moe_experts_wgmma.h: sm_90, shape, shared memory) and the grouped rows
// average at least 64 per expert (moe_wgmma_preferred), Mma otherwise. A forced Wgmma is returned even where
// it cannot run (moe_experts_mma then throws with the reason).
MoePrefillKernel moe_experts_prefill_kernel(const MoeExpertsParams& p);

// gate_up, down and combine after moe_plan on one stream. workspace: moe_experts_mma_workspace_bytes(p.m,
// ...) bytes, 256-byte aligned. Throws (before any launch) when moe_experts_mma_supported(p) is false.
void moe_experts_mma(const MoeExpertsParams& p, void* workspace, cudaStream_t stream);

}  // namespace ms::cuda
