// MoE routing on the GPU: router logits -> top_k (expert id, weight) slots per token, with the same
// semantics, tie rule and output order as the reference CPU router (moe/router.h, route_cpu /
// oea_base_set_cpu / route_oea_fill_cpu). This room sits below moe/, so the config is restated here field for
// field; the caller copies moe::RouterConfig and moe::OeaConfig into it.
//
// Rows are decode-masked: rows with decode_mask 0 (or all rows when decode_mask is null) are routed plainly;
// rows with decode_mask 1 use Opportunistic Expert Activation when cfg.oea_enabled, with the base set built
// from the mask-1 rows only. Everything runs in stream order with no host read of device data
// (graph-capturable).
//
// Differences from the CPU router a caller must know: NaN / infinite logits are not rejected (a device kernel
// cannot throw); a NaN expert is never selected and a row left without candidates gets id -1, weight 0.
// Scores use the device's expf (within 2 ulp of the host's exp), so weights agree to a few ulp and ids agree
// except where two experts' scores differ by about an ulp.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ms::cuda {

enum class MoeScoring : int32_t { Sigmoid, Softmax };
enum class MoeGroupScore : int32_t { Top2Sum, Max };
enum class MoeMaskedFill : int32_t { NegInf, Zero };

constexpr int kMoeRouteMaxExperts = 512;
constexpr int kMoeRouteMaxTopK = 16;
constexpr int kMoeRouteMaxGroups = 32;

struct MoeRouteConfig {
  int n_experts = 0;                // <= kMoeRouteMaxExperts
  int top_k = 0;                    // <= kMoeRouteMaxTopK
  int n_group = 1, topk_group = 1;  // n_group <= kMoeRouteMaxGroups, divides n_experts
  MoeScoring scoring = MoeScoring::Sigmoid;
  bool use_correction_bias = true;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
  MoeGroupScore group_score = MoeGroupScore::Top2Sum;
  MoeMaskedFill masked_fill = MoeMaskedFill::NegInf;
  // Opportunistic Expert Activation for rows with decode_mask 1 (moe/router.h, OeaConfig).
  bool oea_enabled = false;
  int oea_k0 = 0;
  int oea_kmax = 0;  // 0: top_k
};

struct MoeRouteParams {
  const float* __restrict__ logits;           // [m, n_experts] fp32 router gate output, row stride ld_logits
  int64_t ld_logits = 0;                      // elements, >= n_experts
  const float* __restrict__ correction_bias;  // [n_experts] or null; required when cfg.use_correction_bias
  const uint8_t* __restrict__ decode_mask;    // [m] 0 / 1, or null (every row plain)
  uint8_t* base_set;                          // [n_experts] OEA base set (0 / 1); required when oea_enabled
  int32_t* __restrict__ topk_ids;             // [m, top_k] out; -1 for an unused slot
  float* __restrict__ topk_weights;           // [m, top_k] out; routed_scaling_factor applied; 0 when unused
  int m = 0;
};

// Throws ms::Error naming the field when the config or the pointers cannot be routed by these kernels.
void moe_route_check(const MoeRouteConfig& cfg, const MoeRouteParams& p);

// The whole routing step: with cfg.oea_enabled, a memset of base_set, the base-set kernel over the mask-1
// rows, then the select kernel; otherwise the select kernel alone.
void moe_route(const MoeRouteConfig& cfg, const MoeRouteParams& p, cudaStream_t stream);

// The two OEA steps apart, so that expert parallelism can all-reduce(max) base_set between them.
// moe_route_base_set: memset(base_set, 0) and OR each mask-1 row's top-k0 into it (needs cfg.oea_enabled).
void moe_route_base_set(const MoeRouteConfig& cfg, const MoeRouteParams& p, cudaStream_t stream);
// moe_route_select: mask-0 rows plain, mask-1 rows OEA fill from base_set (when cfg.oea_enabled).
void moe_route_select(const MoeRouteConfig& cfg, const MoeRouteParams& p, cudaStream_t stream);

// Dynamic shared memory one routing block uses (for configuration checks).
size_t moe_route_smem_bytes(int n_experts);

}  // namespace ms::cuda
