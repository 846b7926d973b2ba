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

#include <cstddef>
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
//   p.slot_out f32 [p.m * p.top_k, p.hidden] (written for every valid slot);
//   xg  bf16 [p.m * p.top_k, p.hidden] packed, 128-byte aligned: with tensor-copy loads
//       (moe_experts_wgmma_groups_rows(p)) xb's rows are first copied here in grouped order; else unused;
//   counters: 2 i32 in device memory (the Registers layout's item counters, cleared by the launch itself).
// Throws (before any launch) where moe_experts_wgmma_unavailable(p) says why.
void moe_experts_wgmma_gemms(const MoeExpertsParams& p, const void* xb, void* xg, void* act, int* counters,
                             cudaStream_t stream);

// Whether the launch for p loads by tensor copies (MoeWgLoad::Tma: p.wgmma_load, MOESERVE_MOE_WGMMA_LOAD,
// else where p.wgmma_maps is set, and the shape allows it), i.e. uses xg. Throws where nothing fits.
bool moe_experts_wgmma_groups_rows(const MoeExpertsParams& p);

// Bytes of the per-expert tensor maps (12 CUtensorMap of 128 bytes per expert: two box heights).
size_t moe_experts_wgmma_maps_bytes(int n_experts);

// The per-expert tensor maps of the tensor-copy loads, built on the host from a layer's expert table as the
// device sees it (host_table [n_experts]: the same pointers as the device array p.experts; experts with a
// null gate, up or down pointer get no maps and must get no rows) for one format (NVFP4 or BF16) and shape;
// returned in new device memory (moe_experts_wgmma_maps_bytes, 64-byte aligned) that the caller frees with
// cudaFree and passes as MoeExpertsParams::wgmma_maps. Throws where the shape cannot take the tensor copies
// (NVFP4: hidden and inter multiples of 256), for FP8Block (no tensor-copy loads: it always copies with
// cp.async), where a map breaks a tensor-map rule (tma_check.h: the message names the expert, the tensor and
// the rule) or the driver lacks tensor maps.
void* moe_experts_wgmma_maps(const MoeExpertWeights* host_table, int n_experts, MoeWeightFormat format,
                             int hidden, int inter);

}  // namespace ms::cuda
