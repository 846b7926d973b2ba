// Row-wise grid-stride kernels: blockIdx.y walks rows, x-threads walk columns (coalesced).
#include <algorithm>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/float_codecs.cuh"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/elementwise/pointwise.h"

namespace ms::cuda {
namespace {

#define MS_FOR_ROWS(m) for (int64_t r = blockIdx.y; r < (m); r += gridDim.y)
#define MS_FOR_COLS(n)                                                                   \
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < (n); \
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void silu_mul_kernel(SiluMulParams p) {
  dev::grid_dep_enter();
  MS_FOR_ROWS(p.m) {
    const float* g = p.x + r * p.x_stride;
    const float* u = g + p.n;
    float* o = p.out + r * p.out_stride;
    MS_FOR_COLS(p.n) {
      o[c] = g[c] / (1.0f + expf(-g[c])) * u[c];
    }
  }
}

__global__ void add_inplace_kernel(AddInplaceParams p) {
  dev::grid_dep_enter();
  MS_FOR_ROWS(p.m) {
    float* y = p.y + r * p.y_stride;
    const float* x = p.x + r * p.x_stride;
    MS_FOR_COLS(p.n) {
      y[c] += x[c];
    }
  }
}

__global__ void scale_inplace_kernel(ScaleInplaceParams p) {
  dev::grid_dep_enter();
  MS_FOR_ROWS(p.m) {
    float* y = p.y + r * p.y_stride;
    MS_FOR_COLS(p.n) {
      y[c] *= p.scale;
    }
  }
}

__global__ void gather_rows_kernel(GatherRowsParams p) {
  dev::grid_dep_enter();
  MS_FOR_ROWS(p.k) {
    const int64_t s = p.index[r];
    float* d = p.dst + r * p.dst_stride;
    if (s < 0 || s >= p.src_rows) {
      MS_FOR_COLS(p.n) {
        d[c] = __uint_as_float(0x7fc00000u);
      }
    } else {
      const float* src = p.src + s * p.src_stride;
      MS_FOR_COLS(p.n) {
        d[c] = src[c];
      }
    }
  }
}

__global__ void remap_ids_kernel(RemapIdsParams p) {
  dev::grid_dep_enter();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t id = p.ids[i];
    p.out[i] = id < 0 || id >= p.n_map ? -1 : p.map[id];
  }
}

__global__ void append_expert_slot_kernel(AppendExpertSlotParams p) {
  dev::grid_dep_enter();
  const int64_t k1 = p.k + 1, n = p.m * k1;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / k1, j = i - t * k1;
    const bool extra = j == p.k;
    p.ids_out[i] = extra ? p.id : p.ids[t * p.k + j];
    p.wts_out[i] = extra ? p.weight : p.wts[t * p.k + j];
  }
}

__global__ void remap_ids_replicated_kernel(RemapIdsReplicatedParams p) {
  dev::grid_dep_enter();
  const int64_t n = p.m * p.k;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t e = p.ids[i];
    int32_t slot = -1;
    if (e >= 0 && e < p.n_experts) {
      const int32_t c = p.copies[e];
      if (c >= 1 && c <= p.max_copies) {
        const int64_t t = i / p.k, j = i - t * p.k;
        slot = p.slots[e * p.max_copies + (t + j) % c];
      }
    }
    p.out[i] = slot;
  }
}

__global__ void cast_bf16_kernel(CastBf16Params p) {
  dev::grid_dep_enter();
  MS_FOR_ROWS(p.m) {
    const float* x = p.x + r * p.x_stride;
    uint16_t* o = reinterpret_cast<uint16_t*>(p.out) + r * p.out_stride;
    MS_FOR_COLS(p.n) {
      o[c] = dev::f32_to_bf16_bits(x[c]);
    }
  }
}

// cast_bf16 four columns a thread (16-byte loads, 8-byte stores) where the rows allow it: the casts ahead of
// every cuBLASLt product are 19 launches of a batch-64 glm5-slice step, 5.8 us apiece with 4-byte loads.
__global__ void cast_bf16_x4_kernel(CastBf16Params p) {
  dev::grid_dep_enter();
  const int64_t n4 = p.n / 4;
  MS_FOR_ROWS(p.m) {
    const float4* x = reinterpret_cast<const float4*>(p.x + r * p.x_stride);
    uint2* o = reinterpret_cast<uint2*>(reinterpret_cast<uint16_t*>(p.out) + r * p.out_stride);
    MS_FOR_COLS(n4) {
      const float4 v = x[c];
      o[c] = make_uint2(
          static_cast<uint32_t>(dev::f32_to_bf16_bits(v.x)) | (uint32_t{dev::f32_to_bf16_bits(v.y)} << 16),
          static_cast<uint32_t>(dev::f32_to_bf16_bits(v.z)) | (uint32_t{dev::f32_to_bf16_bits(v.w)} << 16));
    }
  }
}

#undef MS_FOR_ROWS
#undef MS_FOR_COLS

}  // namespace

void silu_mul(const SiluMulParams& p, cudaStream_t stream) {
  check_matrix(p.x, p.m, 2 * p.n, p.x_stride, "silu_mul", "x");
  check_matrix(p.out, p.m, p.n, p.out_stride, "silu_mul", "out");
  if (p.m == 0 || p.n == 0) return;
  launch_kernel("silu_mul", silu_mul_kernel, rows_grid(p.m, p.n), kElementwiseThreads, 0, stream, p);
}

void add_inplace(const AddInplaceParams& p, cudaStream_t stream) {
  check_matrix(p.y, p.m, p.n, p.y_stride, "add_inplace", "y");
  check_matrix(p.x, p.m, p.n, p.x_stride, "add_inplace", "x");
  if (p.m == 0 || p.n == 0) return;
  launch_kernel("add_inplace", add_inplace_kernel, rows_grid(p.m, p.n), kElementwiseThreads, 0, stream, p);
}

void scale_inplace(const ScaleInplaceParams& p, cudaStream_t stream) {
  check_matrix(p.y, p.m, p.n, p.y_stride, "scale_inplace", "y");
  if (p.m == 0 || p.n == 0) return;
  launch_kernel("scale_inplace", scale_inplace_kernel, rows_grid(p.m, p.n), kElementwiseThreads, 0, stream,
                p);
}

void gather_rows(const GatherRowsParams& p, cudaStream_t stream) {
  check_matrix(p.dst, p.k, p.n, p.dst_stride, "gather_rows", "dst");
  check_matrix(p.src, p.src_rows, p.n, p.src_stride, "gather_rows", "src");
  if (p.k == 0 || p.n == 0) return;
  MS_CHECK(p.index != nullptr, "gather_rows: index is null");
  launch_kernel("gather_rows", gather_rows_kernel, rows_grid(p.k, p.n), kElementwiseThreads, 0, stream, p);
}

void remap_ids(const RemapIdsParams& p, cudaStream_t stream) {
  MS_CHECK(p.n >= 0 && p.n_map >= 0, "remap_ids: n {} and n_map {} must not be negative", p.n, p.n_map);
  if (p.n == 0) return;
  MS_CHECK(p.ids != nullptr && p.out != nullptr, "remap_ids: ids or out is null");
  MS_CHECK(p.n_map == 0 || p.map != nullptr, "remap_ids: map is null");
  const int64_t blocks = std::min<int64_t>((p.n + kElementwiseThreads - 1) / kElementwiseThreads, 4096);
  launch_kernel("remap_ids", remap_ids_kernel, static_cast<unsigned>(blocks), kElementwiseThreads, 0, stream,
                p);
}

void append_expert_slot(const AppendExpertSlotParams& p, cudaStream_t stream) {
  MS_CHECK(p.m >= 0 && p.k >= 0, "append_expert_slot: m {} and k {} must not be negative", p.m, p.k);
  if (p.m == 0) return;
  MS_CHECK(
      p.ids_out != nullptr && p.wts_out != nullptr && (p.k == 0 || (p.ids != nullptr && p.wts != nullptr)),
      "append_expert_slot: a pointer is null");
  const int64_t n = p.m * (p.k + 1);
  const int64_t blocks = std::min<int64_t>((n + kElementwiseThreads - 1) / kElementwiseThreads, 4096);
  launch_kernel("append_expert_slot", append_expert_slot_kernel, static_cast<unsigned>(blocks),
                kElementwiseThreads, 0, stream, p);
}

void remap_ids_replicated(const RemapIdsReplicatedParams& p, cudaStream_t stream) {
  MS_CHECK(p.m >= 0 && p.k >= 0 && p.n_experts >= 0,
           "remap_ids_replicated: m {}, k {}, n_experts {} must not be negative", p.m, p.k, p.n_experts);
  if (p.m == 0 || p.k == 0) return;
  MS_CHECK(p.ids != nullptr && p.out != nullptr, "remap_ids_replicated: ids or out is null");
  MS_CHECK(p.max_copies >= 1, "remap_ids_replicated: max_copies {} must be at least 1", p.max_copies);
  MS_CHECK(p.n_experts == 0 || (p.copies != nullptr && p.slots != nullptr),
           "remap_ids_replicated: copies or slots is null");
  const int64_t n = p.m * p.k;
  const int64_t blocks = std::min<int64_t>((n + kElementwiseThreads - 1) / kElementwiseThreads, 4096);
  launch_kernel("remap_ids_replicated", remap_ids_replicated_kernel, static_cast<unsigned>(blocks),
                kElementwiseThreads, 0, stream, p);
}

void cast_f32_to_bf16(const CastBf16Params& p, cudaStream_t stream) {
  check_matrix(p.x, p.m, p.n, p.x_stride, "cast_f32_to_bf16", "x");
  check_matrix(p.out, p.m, p.n, p.out_stride, "cast_f32_to_bf16", "out");
  if (p.m == 0 || p.n == 0) return;
  if (p.n % 4 == 0 && p.x_stride % 4 == 0 && p.out_stride % 4 == 0 && is_aligned(p.x, 16) &&
      is_aligned(p.out, 8)) {
    launch_kernel("cast_bf16", cast_bf16_x4_kernel, rows_grid(p.m, p.n / 4), kElementwiseThreads, 0, stream,
                  p);
    return;
  }
  launch_kernel("cast_bf16", cast_bf16_kernel, rows_grid(p.m, p.n), kElementwiseThreads, 0, stream, p);
}

}  // namespace ms::cuda
