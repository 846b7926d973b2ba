// The decode regime of the routed experts (1 to 256 tokens a step) for NVFP4 experts, in two launches over
// the grouping plan (moe_plan.h):
//   gate_up: act[pos] = w[slot(pos)] * SiLU(x[token] @ gate_e^T) * (x[token] @ up_e^T), written as bf16 hi/lo
//            pairs (act_hi + act_lo = the f32 value to ~2^-16) into p.act
//   down:    out[t] += sum over the touched experts e of token t of (act @ down_e^T): one block owns 16
//            output rows for every token, walks every touched expert in ascending id order and writes its
//            rows of `out` once (no slot_out, no combine launch, no atomics: deterministic)
// Both kernels read the per-expert counts and offsets the plan left in device memory (graph-safe: fixed
// grids); untouched experts are neither visited nor read. Weights stream through a 3-stage cp.async ring in
// shared memory; each 16-element NVFP4 block is decoded to bf16 (exact: e2m1 x e4m3 fits bf16) and multiplied
// on the tensor cores (mma.sync m16n8k16, f32 accumulation) with the activations split into bf16 hi + lo, so
// the result follows the f32 reference to ~1e-5 relative.
//
// Preconditions beyond moe_experts_check: format NVFP4, moe_stream_config::choose(...).use, every data and
// scale pointer of the touched experts 16-byte aligned (p.experts_aligned16 says the caller checked), x and
// act 16-byte aligned with ldx % 4 == 0. moe_experts() takes this path by itself when all hold.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/common/kernel_fit.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_stream_config.h"

namespace ms::cuda {

moe_stream_config::Shape moe_stream_shape(const MoeExpertsParams& p);

// Whether moe_experts() runs the streamed path for p on the current device (shape, limits, alignment).
bool moe_experts_stream_applies(const MoeExpertsParams& p);

// Both launches; throws ms::Error naming the reason when the path does not apply.
void moe_experts_stream(const MoeExpertsParams& p, cudaStream_t stream);

}  // namespace ms::cuda
