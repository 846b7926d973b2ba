// The decode regime of the routed FP8-block experts (DeepSeek-V3's format: e4m3 weights, one f32 scale per
// 128x128 block; 1 to 128 tokens a step), weights streamed from global memory straight into registers, in two
// launches over the grouping plan (moe_plan.h), like the NVFP4 decode path (moe_experts_decode.h):
//   gate_up: act[pos] = f16(w[slot(pos)] * SiLU(x[token] @ gate_e^T) * (x[token] @ up_e^T))  (act as f16
//            [m * top_k, inter] in the first half of p.act)
//   down:    out[t] += sum over the touched experts e of token t of (act @ down_e^T): one block owns 16
//            output rows for every token and writes them once (no slot_out, no combine launch, no atomics)
// Both kernels read the plan's per-expert counts and offsets from device memory (graph-safe: fixed grids);
// untouched experts are neither visited nor read. Deterministic: fixed summation orders, bit-identical
// reruns.
//
// Precision: weights are exact (e4m3 -> f16 by the hardware conversion; the block scale is applied in f32 to
// each 128-k block's partial sum); activations (x, and act between the two kernels) are rounded to f16 once
// (2^-11 relative: finer than the bf16 the NVFP4 path uses), one mma per product, f32 accumulation. f16's
// range is the price: |x| and |act| are saturated at 65504 (a model's normed hidden states and SiLU products
// lie far inside it; f16 subnormals, below 6.1e-5, keep 2^-24 absolute). Callers that need f32-exact
// activations set p.disable_decode: they get the f32 kernels.
//
// Preconditions beyond moe_experts_check: format FP8Block with fp8_block 128,
// moe_decode_fp8_config::choose(...).use (hidden and inter multiples of 128), every data pointer of the
// touched experts 16-byte aligned and scale pointers 4-byte aligned (p.experts_aligned16), x 16-byte aligned
// with ldx % 4 == 0, act 16-byte aligned.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/moe/moe_decode_fp8_config.h"
#include "kernels/cuda/moe/moe_experts.h"

namespace ms::cuda {

moe_decode_fp8_config::Shape moe_decode_fp8_shape(const MoeExpertsParams& p);

// Whether moe_experts() runs the FP8 decode path for p on the current device (flags, shape, limits,
// alignment).
bool moe_experts_decode_fp8_applies(const MoeExpertsParams& p);

// Both launches; throws ms::Error naming the reason when the path does not apply.
void moe_experts_decode_fp8(const MoeExpertsParams& p, cudaStream_t stream);

}  // namespace ms::cuda
