// The decode regime of the routed NVFP4 experts (1 to 128 tokens a step), weights streamed from global memory
// straight into registers (or, in the opt-in ring variant, per lane through a cp.async ring in shared memory:
// the same math, bit-identical outputs), in two launches over the grouping plan (moe_plan.h):
//   gate_up: act[pos] = f16(w[slot(pos)] * SiLU(x[token] @ gate_e^T) * (x[token] @ up_e^T))  (act as f16
//            [m * top_k, inter] in the first half of p.act, saturated, each 4 values in the kernels' B order)
//   down:    out[t] += sum over the touched experts e of token t of (act @ down_e^T): one block owns 16
//            output rows for every token and writes them once (no slot_out, no combine launch, no atomics)
// Both kernels read the plan's per-expert counts and offsets from device memory (graph-safe: fixed grids);
// untouched experts are neither visited nor read. Deterministic: fixed summation orders, bit-identical
// reruns.
//
// Precision: weights are exact (e2m1 code x e4m3 scale is exact in f16); activations (x, and act
// between the two kernels) are rounded to f16 once (saturated at 65504), one mma per product, f32
// accumulation: finer than the cuBLASLt bf16 path the rest of the GPU engine uses (2^-11 against 2^-8
// relative per activation). Callers
// that need f32-exact activations set p.disable_decode (the executor's exact_linear mode does): they get the
// streamed hi/lo kernels (moe_experts_stream.h) or the f32 kernels.
//
// Preconditions beyond moe_experts_check: format NVFP4, moe_decode_config::choose_variant(shape, device,
// moe_decode_split(variant)).use, every data and scale pointer of the touched experts 16-byte
// aligned (p.experts_aligned16), x 16-byte aligned with ldx % 4 == 0, act 16-byte aligned.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/common/kernel_fit.h"
#include "kernels/cuda/moe/moe_decode_config.h"
#include "kernels/cuda/moe/moe_experts.h"

namespace ms::cuda {

moe_decode_config::Shape moe_decode_shape(const MoeExpertsParams& p);

// Whether moe_experts() runs the decode path for p on the current device (flags, shape, limits, alignment).
bool moe_experts_decode_applies(const MoeExpertsParams& p);

// Whether moe_experts_decode(p) runs the cp.async ring variant (p.decode_ring, else the environment's
// MOESERVE_MOE_DECODE_KERNEL, asks for it and moe_decode_config::choose(...).ring says it fits); where it is
// asked for but does not fit, the register kernels run.
bool moe_experts_decode_uses_ring(const MoeExpertsParams& p);

// MOESERVE_MOE_DECODE_KERNEL's value: unset or empty -1 (the default: the register kernels), "registers" 0,
// "ring" 1; anything
// else throws ms::Error naming the variable.
int moe_decode_kernel_from_env(const char* value);

// Variants of the register kernels, timed against each other by bench_moe_experts (bit flags):
//   acc2: two accumulator sets per tile (mma 2 j2 into one, 2 j2 + 1 into the other), set 0 + set 1 at the
//         end of a gate_up item and where a down warp hands on an expert chunk's sum: dependent mma chains
//         half as long; f32 sums in another (fixed) order, so the last bits differ from base (deterministic
//         all the same).
//   sc8:  a lane's scale bytes of 4 steps come from one 8-byte load per row (the quad's bytes of one step
//         each) redistributed by two shuffles inside the quad, instead of one 2-byte load per step and row;
//         bit-identical to base.
//   half: gate_up only (down runs base, or sc8's with halfsc8): the block's 8 warps form two groups of 4
//         that take two different work items at a time, each splitting its item's k over its 4 warps (twice
//         the steps a warp per item) and meeting only at a named barrier of its own 128 threads for the
//         partial sums and the epilogue (block-wide barriers only where the staged x rows change); hidden a
//         multiple of 512 instead of 1024. f32 partial sums over 4 warps instead of 8, so the last bits
//         differ from base (deterministic all the same).
//   halfsc8: half with sc8's scale loads; bit-identical to half.
//   whole: gate_up only (down runs sc8's): each warp takes whole work items, all of k of its 16 gate and 16
//   up
//         rows, and writes their act from its own sums (no partial sums across warps, no barrier per item;
//         block-wide barriers only where the staged x rows change); hidden a multiple of 128. f32 sums in
//         one chain over all of k, so the last bits differ from base (deterministic all the same).
//   tile: both kernels of their own shape, so that many warps a multiprocessor each stream one 16-row
//         tile over all of k (as the one-token GEMV that reaches 72% of the copy rate does): gate_up blocks
//         of 4 warps on (work-list entry, 32 intermediate indices), warps 0 / 2 a gate tile and 1 / 3 its
//         up tile, 4 steps in flight a lane, act from the block's four tiles after one barrier, a fixed grid
//         of the step's most entries (blocks past the entries return); down blocks of 8 warps on 16 output
//         rows, each warp streaming its pieces with one piece in flight. hidden a multiple of 128. f32 sums
//         in one chain over k, so the last bits differ from base (deterministic all the same).
// Values are bit flags (acc2 1, sc8 2, half 4, whole 8, tile 16); acc2 with half, and whole or tile with any
// other, are not variants.
enum MoeDecodeVariant : int {
  kMoeDecodeBase = 0,
  kMoeDecodeAcc2 = 1,
  kMoeDecodeSc8 = 2,
  kMoeDecodeAcc2Sc8 = 3,
  kMoeDecodeHalf = 4,
  kMoeDecodeHalfSc8 = 6,
  kMoeDecodeWhole = 8,
  kMoeDecodeTile = 16
};
// How many variants there are; their values are not 0..kMoeDecodeVariants - 1 (kMoeDecodeVariantList).
constexpr int kMoeDecodeVariants = 8;
constexpr int kMoeDecodeVariantList[kMoeDecodeVariants] = {
    kMoeDecodeBase, kMoeDecodeAcc2,    kMoeDecodeSc8,   kMoeDecodeAcc2Sc8,
    kMoeDecodeHalf, kMoeDecodeHalfSc8, kMoeDecodeWhole, kMoeDecodeTile};
constexpr bool moe_decode_variant_valid(int variant) {
  for (int v : kMoeDecodeVariantList)
    if (v == variant) return true;
  return false;
}
// How a variant's gate_up splits an item's k (moe_decode_config::choose_variant).
constexpr moe_decode_config::KSplit moe_decode_split(int variant) {
  if (variant == kMoeDecodeWhole) return moe_decode_config::KSplit::kWarp;
  if (variant == kMoeDecodeTile) return moe_decode_config::KSplit::kTile;
  return (variant & kMoeDecodeHalf) != 0 ? moe_decode_config::KSplit::kGroup
                                         : moe_decode_config::KSplit::kBlock;
}
// "base", "acc2", "sc8", "acc2sc8", "half", "halfsc8", "whole", "tile"; throws ms::Error for any other value.
const char* moe_decode_variant_name(int variant);

// MOESERVE_MOE_DECODE_VARIANT's value: unset or empty -1 (base), else the variant of that name; anything else
// throws ms::Error naming the variable.
int moe_decode_variant_from_env(const char* value);

// The variant moe_experts_decode(p) runs with the register kernels: p.decode_variant, else the environment's
// (read once), else tile up to 8 tokens, whole from 9.
int moe_decode_variant(const MoeExpertsParams& p);

// Both launches; throws ms::Error naming the reason when the path does not apply.
void moe_experts_decode(const MoeExpertsParams& p, cudaStream_t stream);

}  // namespace ms::cuda
