// Routed experts on the GPU over the grouping plan (moe_plan.h), in three launches:
//   gate_up: act[pos]   = SiLU(x[token] @ gate_e^T) * (x[token] @ up_e^T)    for every grouped position pos
//   down:    slot_out[slot] = act[pos] @ down_e^T                            (slot = sorted_slots[pos])
//   combine: out[t] += sum over k in slot order of topk_weights[t, k] * slot_out[t * top_k + k]   (ids >= 0)
// A block owns (a column tile, one expert, every z-th token tile of that expert); a block whose expert has no
// token exits before reading any weight byte, so untouched experts cost nothing. A touched expert's weight
// tile is read once per tile of up to kMoeTokenTile tokens and dequantised on the fly (F32, BF16, FP8 128x128
// block, NVFP4) into shared memory as f32; all math is f32. Deterministic: no atomics, fixed summation
// orders.
//
// Weights: one device array of MoeExpertWeights [n_experts], built once by the executor. Entries of experts
// that no token uses are never read (they may hold null pointers). A fused gate_up [2 * inter, hidden] matrix
// is expressed by pointing `up` (and `up_scale`) at its second half (for FP8 blocks only when inter % block
// == 0).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ms::cuda {

enum class MoeWeightFormat : int32_t { F32, BF16, FP8Block, NVFP4 };

// The grouped GEMM kernel of the tensor-core prefill path (moe_experts_mma.h). Auto: the environment's
// MOESERVE_MOE_PREFILL_KERNEL (mma | wgmma | auto) if set, else the warpgroup-MMA kernel on sm_90 where it
// applies and the mma.sync kernel elsewhere. Mma / Wgmma force one (Wgmma throws where it cannot run).
enum class MoePrefillKernel : int32_t { Auto, Mma, Wgmma };

// One expert's three matrices as stored: gate, up [inter, hidden]; down [hidden, inter] (rows = out
// features).
//   F32:      data f32 [rows, cols];  scale unused
//   BF16:     data bf16 [rows, cols]; scale unused
//   FP8Block: data e4m3 [rows, cols]; scale f32 [ceil(rows/block), ceil(cols/block)] (weight_scale_inv)
//   NVFP4:    data u8 [rows, cols/2] (element 2i in the low nibble); scale e4m3 [rows, cols/16]; scale2 f32
// Data pointers naturally aligned (f32: 4 bytes, bf16: 2); FP8 scales 4-byte aligned. The tiled path reads
// 16-byte pieces and cannot see this table on the host: when moe_experts_path(format, hidden, inter) is
// Tiled, data pointers must be 16-byte aligned (an allocation's start, or a fused gate_up's second half, is).
struct MoeExpertWeights {
  const void* gate;
  const void* gate_scale;
  const void* up;
  const void* up_scale;
  const void* down;
  const void* down_scale;
  float gate_scale2, up_scale2, down_scale2;  // NVFP4 weight_scale_2; 1 otherwise
  float pad_;
};

constexpr int kMoeTokenTile = 32;  // tokens whose rows share one read of a weight tile
constexpr int kMoeKTile = 64;      // k per step; the tiled path needs hidden and inter multiples of this

// Every pointer defaults to null: a caller that leaves one unset gets the launchers' "null" errors, not a
// read of whatever the stack held.
struct MoeExpertsParams {
  const float* __restrict__ x = nullptr;                   // [m, hidden] activations, row stride ldx
  int64_t ldx = 0;                                         // elements, >= hidden
  const int32_t* __restrict__ topk_ids = nullptr;          // [m, top_k] (ids < 0 or >= n_experts: empty slot)
  const float* __restrict__ topk_weights = nullptr;        // [m, top_k]
  const int32_t* __restrict__ expert_counts = nullptr;     // [n_experts]      from moe_plan
  const int32_t* __restrict__ expert_offsets = nullptr;    // [n_experts + 1]  from moe_plan
  const int32_t* __restrict__ sorted_slots = nullptr;      // [m * top_k]      from moe_plan
  const MoeExpertWeights* __restrict__ experts = nullptr;  // [n_experts] device array
  MoeWeightFormat format = MoeWeightFormat::BF16;
  int fp8_block = 128;                     // FP8Block block edge, a multiple of 16
  float* __restrict__ act = nullptr;       // [m * top_k, inter] workspace, row = grouped position
  float* __restrict__ slot_out = nullptr;  // [m * top_k, hidden] workspace, row = slot
  float* __restrict__ out = nullptr;       // [m, hidden] accumulated into, row stride ldo
  int64_t ldo = 0;                         // elements, >= hidden
  int m = 0, top_k = 0, n_experts = 0;
  int hidden = 0, inter = 0;  // >= 1; NVFP4: multiples of 16 (both are the k of one of the GEMMs)
  // The caller checked that every data and scale pointer in `experts` is 16-byte aligned: allows the streamed
  // NVFP4 decode path (moe_experts_stream.h), which moe_experts() then takes where it fits.
  bool experts_aligned16 = false;
  // Force the old three-launch kernels even where the streamed or decode path applies (benchmarks, tests).
  bool disable_stream = false;
  // Skip the decode path (moe_experts_decode.h: f16 activations) even where it applies; the streamed path
  // (f32-exact to ~1e-5) or the old kernels run instead. Exact-mode callers and benchmarks set it.
  bool disable_decode = false;
  // The decode path's weight streaming (moe_experts_decode.h): -1 the environment's
  // MOESERVE_MOE_DECODE_KERNEL (registers | ring), else registers; 0 registers; 1 the cp.async ring where
  // it fits (bit-identical).
  int decode_ring = -1;
  // The register kernels' variant (moe_experts_decode.h: MoeDecodeVariant; the ring kernels ignore it): -1
  // the environment's MOESERVE_MOE_DECODE_VARIANT (base | acc2 | sc8 | acc2sc8 | half | halfsc8 | whole |
  // tile), else moe_decode_variant's default by token count (moe_experts_decode.h); else that
  // MoeDecodeVariant value.
  int decode_variant = -1;
  // Prefill path's GEMM kernel (benchmarks compare both; tests pin one).
  MoePrefillKernel prefill_kernel = MoePrefillKernel::Auto;
  // Per-expert tensor maps for the wgmma kernel's tensor-copy loads (moe_experts_wgmma.h
  // moe_experts_wgmma_maps: device memory built from this layer's table for this format, hidden and inter);
  // null: that kernel copies with cp.async.
  const void* wgmma_maps = nullptr;
  // The wgmma kernel's loads: -1 the environment's MOESERVE_MOE_WGMMA_LOAD (cpasync | tma), else tensor
  // copies where wgmma_maps is set; 0 cp.async; 1 tensor copies (wgmma_maps required). FP8Block always
  // copies with cp.async, whatever is asked.
  int wgmma_load = -1;
  // Who expands the wgmma kernel's NVFP4 tiles (moe_experts_wgmma_config.h MoeWgExpand): -1 the environment's
  // MOESERVE_MOE_WGMMA_EXPAND (consumer | producer | registers), else the default; else that MoeWgExpand
  // value (0 Consumer, 1 Producer, 2 Registers). Where the layout cannot apply the chooser falls back.
  int wgmma_expand = -1;
};

// Which kernels run. Tiled: vector loads of whole 16-element weight pieces and 8-element activation pieces,
// no bounds checks inside a k step. General: the same block tile and f32 summation order, with element-wise,
// bounds-checked loads (any hidden / inter the format allows, f32-aligned activations and workspaces);
// meant for small models and odd sizes, not tuned.
enum class MoeExpertsPath : int32_t { Tiled, General };

// The shape rule, pure: Tiled when hidden and inter are multiples of kMoeKTile (every format), else General.
// Says nothing about whether the shape is allowed at all (moe_experts_check does).
MoeExpertsPath moe_experts_path(MoeWeightFormat format, int hidden, int inter);

// What the launchers run for p: the shape rule, downgraded to General when x, out, act or slot_out is not
// 16-byte aligned or ldx / ldo is not a multiple of 4. Each launch decides on its own; the two paths share
// the layouts of act and slot_out, so mixing them between launches is fine.
MoeExpertsPath moe_experts_path(const MoeExpertsParams& p);

// Workspace the executor preallocates for the largest m it will run.
size_t moe_experts_act_bytes(int m, int top_k, int inter);        // m * top_k * inter * 4
size_t moe_experts_slot_out_bytes(int m, int top_k, int hidden);  // m * top_k * hidden * 4

// Throws ms::Error naming the field when shapes, alignment or pointers are unusable: x / out / act /
// slot_out must be non-null and 4-byte aligned, ldx / ldo >= hidden.
void moe_experts_check(const MoeExpertsParams& p);

// The three launches, in this order on one stream after moe_plan; moe_experts runs all three.
void moe_experts_gate_up(const MoeExpertsParams& p, cudaStream_t stream);
void moe_experts_down(const MoeExpertsParams& p, cudaStream_t stream);
void moe_experts_combine(const MoeExpertsParams& p, cudaStream_t stream);
void moe_experts(const MoeExpertsParams& p, cudaStream_t stream);

// Shared memory one gate_up / down block of the path uses (static), for configuration checks.
size_t moe_experts_smem_bytes(MoeExpertsPath path);

}  // namespace ms::cuda
