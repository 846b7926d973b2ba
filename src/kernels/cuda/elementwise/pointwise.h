// Row-wise pointwise kernels on the device: SiLU-and-mul, add, scale, row gather and the f32 -> bf16 cast
// of GEMM inputs. All operate on [m, n] f32 views with explicit row strides.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ms::cuda {

// out[r, i] = silu(x[r, i]) * x[r, n + i] (gate then up, 2n wide).
struct SiluMulParams {
  const float* __restrict__ x = nullptr;  // [m, 2n] rows x_stride apart
  int64_t x_stride = 0;
  float* __restrict__ out = nullptr;  // [m, n] rows out_stride apart
  int64_t out_stride = 0;
  int64_t m = 0, n = 0;
};
void silu_mul(const SiluMulParams& p, cudaStream_t stream);

// y += x.
struct AddInplaceParams {
  float* __restrict__ y = nullptr;  // [m, n] rows y_stride apart
  int64_t y_stride = 0;
  const float* __restrict__ x = nullptr;  // [m, n] rows x_stride apart
  int64_t x_stride = 0;
  int64_t m = 0, n = 0;
};
void add_inplace(const AddInplaceParams& p, cudaStream_t stream);

// y *= scale.
struct ScaleInplaceParams {
  float* __restrict__ y = nullptr;  // [m, n] rows y_stride apart
  int64_t y_stride = 0;
  int64_t m = 0, n = 0;
  float scale = 1.0f;
};
void scale_inplace(const ScaleInplaceParams& p, cudaStream_t stream);

// dst[i, :] = src[index[i], :]. An index outside [0, src_rows) reads nothing and fills its row with NaN.
struct GatherRowsParams {
  const float* __restrict__ src = nullptr;  // [src_rows, n] rows src_stride apart
  int64_t src_stride = 0, src_rows = 0;
  const int32_t* __restrict__ index = nullptr;  // [k] on the device
  float* __restrict__ dst = nullptr;            // [k, n] rows dst_stride apart
  int64_t dst_stride = 0;
  int64_t k = 0, n = 0;
};
void gather_rows(const GatherRowsParams& p, cudaStream_t stream);

// out[i] = map[ids[i]]: an expert-parallel rank's router ids (logical experts) to its local slots (-1: held
// by another rank). A negative id stays -1; an id at or past n_map (never made by the router) also gives -1,
// since a kernel cannot throw: the token then skips that expert instead of reading past the map.
struct RemapIdsParams {
  const int32_t* __restrict__ ids = nullptr;  // [n] on the device
  const int32_t* __restrict__ map = nullptr;  // [n_map] on the device
  int32_t* __restrict__ out = nullptr;        // [n] on the device
  int64_t n = 0, n_map = 0;
};
void remap_ids(const RemapIdsParams& p, cudaStream_t stream);

// Router output widened by one slot per token (ops::append_expert_slot): ids_out[t] = (ids[t, 0..k), id),
// wts_out[t] = (wts[t, 0..k), weight). The shared expert then runs as one more routed expert.
struct AppendExpertSlotParams {
  const int32_t* __restrict__ ids = nullptr;  // [m, k] on the device, contiguous
  const float* __restrict__ wts = nullptr;    // [m, k]
  int32_t* __restrict__ ids_out = nullptr;    // [m, k + 1]
  float* __restrict__ wts_out = nullptr;      // [m, k + 1]
  int64_t m = 0;
  int k = 0;
  int32_t id = 0;
  float weight = 1.0f;
};
void append_expert_slot(const AppendExpertSlotParams& p, cudaStream_t stream);

// Router ids to local slots when experts have several copies over the EP ranks (ops::remap_ids_replicated):
// assignment (t, j) of expert e = ids[t, j] takes copy c = (t + j) mod copies[e] and
// out[t, j] = slots[e, c] (-1: that copy is on another rank). A negative id, an id at or past n_experts or a
// copy count outside [1, max_copies] gives -1 (a kernel cannot throw; the host tables never hold one).
struct RemapIdsReplicatedParams {
  const int32_t* __restrict__ ids = nullptr;     // [m, k] contiguous, on the device
  const int32_t* __restrict__ copies = nullptr;  // [n_experts]
  const int32_t* __restrict__ slots = nullptr;   // [n_experts, max_copies] contiguous
  int32_t* __restrict__ out = nullptr;           // [m, k] contiguous
  int64_t m = 0, k = 0, n_experts = 0, max_copies = 0;
};
void remap_ids_replicated(const RemapIdsReplicatedParams& p, cudaStream_t stream);

// out = bf16(x), round to nearest even, NaN stays NaN: bit-exact with quant::f32_to_bf16.
struct CastBf16Params {
  const float* __restrict__ x = nullptr;  // [m, n] rows x_stride apart
  int64_t x_stride = 0;
  __nv_bfloat16* __restrict__ out = nullptr;  // [m, n] rows out_stride apart
  int64_t out_stride = 0;
  int64_t m = 0, n = 0;
};
void cast_f32_to_bf16(const CastBf16Params& p, cudaStream_t stream);

}  // namespace ms::cuda
