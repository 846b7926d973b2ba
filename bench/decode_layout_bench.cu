// Can NVFP4 decode reach 75% of the copy rate? A study on one GEMV shape, outside the engine's kernels. The
// decode experts (moe_experts_decode.cu) stop near half the copy rate, and taking their math or their loads
// away showed that both halves are too slow (docs/PERFORMANCE.md, "Where the NVFP4 decode time goes"). This
// benchmark times, on the same weights (8 GLM-5 experts' gate/up rows: 32768 rows x 6144, NVFP4 with e4m3
// scales a 16, one token of f32 x; 4 rotated copies so the bytes come from HBM):
//   load       the fragment layout's bytes read and xor-folded, no math: what its loads can reach
//   f16-nat    the decode kernels' math (e2m1 -> e4m3 -> f16, scale product in f16, mma m16n8k16) on the
//              checkpoint's own layout: lane (g, t) reads 16 bytes of rows g and g + 8 (a quad 64 contiguous
//              bytes a row) and each row's 2 scale bytes
//   f16-frag   the same math on the fragment layout: each 16-row x 128-k tile is 1152 contiguous bytes, lane
//              l's 16 bytes of row g, then of row g + 8, then its 4 scale bytes, so a warp's three loads read
//              512, 512 and 128 contiguous bytes
//   noconv     diagnostic: f16-frag with the codes fed to the mmas unconverted (wrong output, not checked)
//   e4m3-frag  the fragment layout with the codes multiplied as e4m3 (mma m16n8k32, no f16 conversion and no
//              f16 scale product): x carried as two e4m3 terms (x s = hi + lo / 16, s = 448 / max |x|), each
//              of the quad's four lanes' 8 codes summed into a column of its own (columns 2 t and 2 t + 1:
//              the two terms of lane t's 16-k group), so the block scale multiplies the f32 sums after the
//              mma. On sm_90 the compiler runs mma.sync on e4m3 as conversions to f16 and two f16 mmas
//              (Hopper's e4m3 tensor-core path is warpgroup MMA only), so there its time is not the
//              design's; its error is (it says whether two e4m3 terms of x are precise enough)
//   f16-fragx  f16-frag with its first tiles' loads issued before x is staged (by 16-byte pieces); f16-natx
//              and noconv-x likewise; noload-x the same with the weights made from the tile index
//   ring2x4    f16 math on the fragment layout, the weights brought by bulk copies into a per-warp ring
//              (4 stages of 2 tiles; ring4x3: 3 of 4)
//   e4m3-wg    the codes as e4m3 by warpgroup MMA (wgmma m64n8k32, A from registers, x's two e4m3 terms as B
//              in shared memory, one column a lane's scale group and term); e4m3-wgP: two sets of fragments
//              and sums
// Every kernel gives one warp a whole 16-row tile (all of k: no partial sums across warps, no barrier after
// the x staging), 4 warps a block, kDepth tiles of loads in flight a lane (f16-frag2 and f16-frag6: 2 and 6).
// Each kernel's output is compared with a double-precision reference of the same NVFP4 weights and x (largest
// error over largest |y|).
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "gpu_bench.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/ldg.cuh"
#include "kernels/cuda/common/mma_sm80.cuh"
#include "kernels/cuda/common/wgmma_sm90.cuh"
#include "kernels/cuda/moe/moe_decode_math.cuh"

namespace {

namespace tc = ms::cuda::tc;
using ms::cuda::dev::ld_stream16;
using ms::cuda::dev::ld_stream2;
using ms::cuda::dev::word_of;
namespace mdd = ms::cuda::moe_decode_dev;

constexpr int kR = 32768, kK = 6144;  // rows (8 experts x 2048 gate + 2048 up), k
constexpr int kRowBytes = kK / 2, kScaleRow = kK / 16;
constexpr int kKt = kK / 128;     // 128-k tiles a row tile
constexpr int kTileBytes = 1152;  // 16 rows x 64 code bytes + 16 rows x 8 scale bytes
constexpr int64_t kCodeBytes = int64_t{kR} * kRowBytes, kScaleBytes = int64_t{kR} * kScaleRow;
constexpr int64_t kCopyBytes = kCodeBytes + kScaleBytes;  // one copy of the weights, either layout
constexpr int kCopies = 4;
constexpr int kWarps = 4, kDepth = 4;
static_assert(kKt % kDepth == 0, "the register slots cycle over whole groups of tiles");

// Natural layout -> fragment layout, one thread per (row tile, k tile, lane).
__global__ void repack_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                              uint8_t* __restrict__ tiles) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t{kR / 16} * kKt * 32) return;
  const int lane = static_cast<int>(i % 32), kt = static_cast<int>((i / 32) % kKt);
  const int rt = static_cast<int>(i / (32 * kKt));
  const int g = lane >> 2, t = lane & 3;
  uint8_t* tile = tiles + (static_cast<int64_t>(rt) * kKt + kt) * kTileBytes;
  for (int h = 0; h < 2; ++h) {
    const int64_t row = int64_t{rt} * 16 + g + 8 * h;
    const uint4 v = *reinterpret_cast<const uint4*>(codes + row * kRowBytes + kt * 64 + 16 * t);
    *reinterpret_cast<uint4*>(tile + 512 * h + 16 * lane) = v;
    const uint8_t* s = scales + row * kScaleRow + kt * 8 + 2 * t;
    tile[1024 + 4 * lane + 2 * h] = s[0];
    tile[1024 + 4 * lane + 2 * h + 1] = s[1];
  }
}

// x (f32) staged into shared memory as the f16 B pieces of tile_step: for k tile kt, lane quad t and word j2,
// the 8 values of k = 128 kt + 32 t + 8 j2 .. + 7 in b_order, 16 bytes.
__device__ void stage_x_f16(const float* __restrict__ x, __half* xs) {
  for (int i = threadIdx.x; i < kK; i += blockDim.x) {
    const int kt = i / 128, r = i % 128, t = r / 32, j2 = (r % 32) / 8, e = r % 8;
    xs[((kt * 4 + t) * 4 + j2) * 8 + mdd::b_order(e)] = __float2half_rn(x[i]);
  }
}

// kLoadsFirst: the first kD tiles' loads go in flight before x is staged (the engine's order), by 16-byte
// pieces (stage_x_f16_vec); kNoLoad
// (diagnostic): the weights are made from the tile index instead of read (one real load a lane at the start),
// so the time is the math and the structure alone.
// The same image by 16-byte pieces: thread i takes k = 8 i .. 8 i + 7 (two float4 loads, one 16-byte store).
__device__ void stage_x_f16_vec(const float* __restrict__ x, __half* xs) {
  for (int i = threadIdx.x; i < kK / 8; i += blockDim.x) {
    const float4 v0 = __ldg(reinterpret_cast<const float4*>(x) + 2 * i);
    const float4 v1 = __ldg(reinterpret_cast<const float4*>(x) + 2 * i + 1);
    // b_order within each 4: x0 x2 x1 x3
    const uint4 pc = make_uint4(tc::pack_f16_sat(v0.x, v0.z), tc::pack_f16_sat(v0.y, v0.w),
                                tc::pack_f16_sat(v1.x, v1.z), tc::pack_f16_sat(v1.y, v1.w));
    const int k = 8 * i, kt = k / 128, r = k % 128, t = r / 32, j2 = (r % 32) / 8;
    *reinterpret_cast<uint4*>(xs + ((kt * 4 + t) * 4 + j2) * 8) = pc;
  }
}

template <bool kFrag, int kD = kDepth, bool kNoConv = false, bool kLoadsFirst = false, bool kNoLoad = false>
__global__ void __launch_bounds__(32 * kWarps)
    f16_kernel(const uint8_t* __restrict__ w, const float* __restrict__ x, float* __restrict__ y) {
  static_assert(kKt % kD == 0, "the register slots cycle over whole groups of tiles");
  __shared__ __align__(16) __half xs[kK];
  if constexpr (!kLoadsFirst) {
    stage_x_f16(x, xs);
    __syncthreads();
  }
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int rt = blockIdx.x * kWarps + (threadIdx.x >> 5);
  // Natural layout: rows g and g + 8 of the tile, 16 bytes at 64 kt + 16 t, scale bytes at 8 kt + 2 t.
  const uint8_t* c0 = w + (int64_t{rt} * 16 + g) * kRowBytes + 16 * t;
  const uint8_t* s0 = w + kCodeBytes + (int64_t{rt} * 16 + g) * kScaleRow + 2 * t;
  const uint8_t* tl = w + int64_t{rt} * kKt * kTileBytes;
  uint4 a[kD], b[kD];
  uint32_t sc[kD];
  uint4 seed = make_uint4(0u, 0u, 0u, 0u);
  if constexpr (kNoLoad) seed = ld_stream16(tl + 16 * lane);
  auto load = [&](int kt, int u) {
    if (kt >= kKt) return;
    if constexpr (kNoLoad) {
      const uint32_t m = 0x9e3779b9u * static_cast<uint32_t>(kt + 1);
      a[u] = make_uint4(seed.x ^ m, seed.y ^ m, seed.z ^ m, seed.w ^ m);
      b[u] = make_uint4(seed.w + m, seed.z + m, seed.y + m, seed.x + m);
      sc[u] = (seed.x ^ m) & 0x37373737u;  // finite e4m3 scales
    } else if constexpr (kFrag) {
      const uint8_t* p = tl + int64_t{kt} * kTileBytes;
      a[u] = ld_stream16(p + 16 * lane);
      b[u] = ld_stream16(p + 512 + 16 * lane);
      sc[u] = *reinterpret_cast<const uint32_t*>(p + 1024 + 4 * lane);
    } else {
      a[u] = ld_stream16(c0 + 64 * kt);
      b[u] = ld_stream16(c0 + 8 * kRowBytes + 64 * kt);
      sc[u] = ld_stream2(s0 + 8 * kt) | (ld_stream2(s0 + 8 * kScaleRow + 8 * kt) << 16);
    }
  };
#pragma unroll
  for (int u = 0; u < kD; ++u) load(u, u);
  if constexpr (kLoadsFirst) {
    stage_x_f16_vec(x, xs);
    __syncthreads();
  }
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int kt0 = 0; kt0 < kKt; kt0 += kD) {
#pragma unroll
    for (int u = 0; u < kD; ++u) {
      const int kt = kt0 + u;
      const uint4* xp = reinterpret_cast<const uint4*>(xs + (kt * 4 + t) * 32);
      const uint4 bx[4] = {xp[0], xp[1], xp[2], xp[3]};
      if constexpr (kNoConv) {  // diagnostic: the words go to the mmas unconverted (the output is wrong)
#pragma unroll
        for (int j2 = 0; j2 < 4; ++j2) {
          const uint32_t a0 = word_of(a[u], j2) ^ sc[u], a1 = word_of(b[u], j2);
          const uint32_t f0[4] = {a0, a1, word_of(a[u], j2 ^ 1), word_of(b[u], j2 ^ 1)};
          const uint32_t f1[4] = {word_of(a[u], j2 ^ 2), word_of(b[u], j2 ^ 2), word_of(a[u], j2 ^ 3),
                                  word_of(b[u], j2 ^ 3)};
          tc::mma_f16(acc, f0, bx[j2].x, bx[j2].y);
          tc::mma_f16(acc, f1, bx[j2].z, bx[j2].w);
        }
      } else {
        mdd::tile_step(acc, a[u], b[u], sc[u] & 0xffffu, sc[u] >> 16, bx);
      }
      load(kt + kD, u);
    }
  }
  // Every column holds the same token: column 2 t of rows g and g + 8.
  if (t == 0) {
    y[int64_t{rt} * 16 + g] = acc[0] * mdd::kCodeScale;
    y[int64_t{rt} * 16 + g + 8] = acc[2] * mdd::kCodeScale;
  }
}

// The engine's item shape on the checkpoint layout (the f16-natx math and load order): each warp kTl
// tiles of 16 rows over all of k (kTl = 2: tiles i and i + kR / 32, as the engine's gate and up rows of one
// index), kW warps a block, kD 128-k steps in flight a lane; `pad` bytes of dynamic shared memory limit the
// blocks a multiprocessor (the engine's whole variant: kTl 2, kW 8, kD 6, one block a multiprocessor).
template <int kTl, int kW, int kD>
__global__ void __launch_bounds__(32 * kW)
    shape_kernel(const uint8_t* __restrict__ w, const float* __restrict__ x, float* __restrict__ y) {
  static_assert(kKt % kD == 0, "the register slots cycle over whole groups of tiles");
  __shared__ __align__(16) __half xs[kK];
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int item = blockIdx.x * kW + (threadIdx.x >> 5);
  const uint8_t* c0[kTl];
  const uint8_t* s0[kTl];
#pragma unroll
  for (int j = 0; j < kTl; ++j) {
    const int64_t row = int64_t{item + j * (kR / 32)} * 16 + g;
    c0[j] = w + row * kRowBytes + 16 * t;
    s0[j] = w + kCodeBytes + row * kScaleRow + 2 * t;
  }
  uint4 a[kD][kTl], b[kD][kTl];
  uint32_t sc[kD][kTl];
  auto load = [&](int kt, int u) {
    if (kt >= kKt) return;
#pragma unroll
    for (int j = 0; j < kTl; ++j) {
      a[u][j] = ld_stream16(c0[j] + 64 * kt);
      b[u][j] = ld_stream16(c0[j] + 8 * kRowBytes + 64 * kt);
      sc[u][j] = ld_stream2(s0[j] + 8 * kt) | (ld_stream2(s0[j] + 8 * kScaleRow + 8 * kt) << 16);
    }
  };
#pragma unroll
  for (int u = 0; u < kD; ++u) load(u, u);
  stage_x_f16_vec(x, xs);
  __syncthreads();
  float acc[kTl][4] = {};
  for (int kt0 = 0; kt0 < kKt; kt0 += kD) {
#pragma unroll
    for (int u = 0; u < kD; ++u) {
      const int kt = kt0 + u;
      const uint4* xp = reinterpret_cast<const uint4*>(xs + (kt * 4 + t) * 32);
      const uint4 bx[4] = {xp[0], xp[1], xp[2], xp[3]};
#pragma unroll
      for (int j = 0; j < kTl; ++j)
        mdd::tile_step(acc[j], a[u][j], b[u][j], sc[u][j] & 0xffffu, sc[u][j] >> 16, bx);
      load(kt + kD, u);
    }
  }
  if (t == 0) {
#pragma unroll
    for (int j = 0; j < kTl; ++j) {
      const int64_t row = int64_t{item + j * (kR / 32)} * 16 + g;
      y[row] = acc[j][0] * mdd::kCodeScale;
      y[row + 8] = acc[j][2] * mdd::kCodeScale;
    }
  }
}

// f16 math on the fragment layout, the weights brought by bulk copies into a per-warp ring in shared memory
// (kS stages of kT tiles, one mbarrier a stage): lane 0 of each warp issues its warp's copies, so bytes in
// flight cost no registers and the loads never wait behind the math. A stage is refilled once the warp has
// read it (__syncwarp after the math: every read of the stage fed an mma before it).
template <int kT, int kS>
constexpr int ring_smem_bytes() {
  return kK * 2 + kWarps * kS * kT * kTileBytes + kWarps * kS * 8;
}

template <int kT, int kS>
__global__ void __launch_bounds__(32 * kWarps)
    ring_kernel(const uint8_t* __restrict__ w, const float* __restrict__ x, float* __restrict__ y) {
  static_assert(kKt % kT == 0, "a stage holds whole tiles");
  constexpr int kStages = kKt / kT;
  constexpr uint32_t kStageBytes = kT * kTileBytes;
  extern __shared__ __align__(128) uint8_t smem[];
  __half* xs = reinterpret_cast<__half*>(smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  uint8_t* ring = smem + kK * 2 + warp * kS * kStageBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kK * 2 + kWarps * kS * kStageBytes) + warp * kS;
  const int rt = blockIdx.x * kWarps + warp;
  const uint8_t* tl = w + int64_t{rt} * kKt * kTileBytes;
  if (lane == 0) {
    for (int st = 0; st < kS; ++st) ms::cuda::wg::mbar_init(&bars[st], 1);
    ms::cuda::wg::mbar_init_fence();
  }
  __syncwarp();
  if (lane == 0) {
    for (int st = 0; st < kS && st < kStages; ++st) {
      ms::cuda::wg::mbar_arrive_expect_tx(&bars[st], kStageBytes);
      ms::cuda::wg::bulk_copy_g2s(ring + st * kStageBytes, tl + int64_t{st} * kStageBytes, kStageBytes,
                                  &bars[st]);
    }
  }
  stage_x_f16_vec(x, xs);
  __syncthreads();
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int i = 0; i < kStages; ++i) {
    const int st = i % kS;
    ms::cuda::wg::mbar_wait(&bars[st], static_cast<uint32_t>((i / kS) & 1));
    const uint8_t* sp = ring + st * kStageBytes;
#pragma unroll
    for (int u = 0; u < kT; ++u) {
      const int kt = i * kT + u;
      const uint8_t* p = sp + u * kTileBytes;
      const uint4 a = *reinterpret_cast<const uint4*>(p + 16 * lane);
      const uint4 b = *reinterpret_cast<const uint4*>(p + 512 + 16 * lane);
      const uint32_t sc = *reinterpret_cast<const uint32_t*>(p + 1024 + 4 * lane);
      const uint4* xp = reinterpret_cast<const uint4*>(xs + (kt * 4 + t) * 32);
      const uint4 bx[4] = {xp[0], xp[1], xp[2], xp[3]};
      mdd::tile_step(acc, a, b, sc & 0xffffu, sc >> 16, bx);
    }
    __syncwarp();
    if (lane == 0 && i + kS < kStages) {
      ms::cuda::wg::mbar_arrive_expect_tx(&bars[st], kStageBytes);
      ms::cuda::wg::bulk_copy_g2s(ring + st * kStageBytes, tl + int64_t{i + kS} * kStageBytes, kStageBytes,
                                  &bars[st]);
    }
  }
  if (t == 0) {
    y[int64_t{rt} * 16 + g] = acc[0] * mdd::kCodeScale;
    y[int64_t{rt} * 16 + g + 8] = acc[2] * mdd::kCodeScale;
  }
}

// ---- e4m3 codes by warpgroup MMA (wgmma m64n8k32, A = the codes from registers, B = x's two e4m3 terms) --
// A warpgroup (the block) owns 64 rows: warp w its 16-row tile rt = 4 blockIdx.x + w, over all of k. Its own
// fragment layout ("wg layout", 1152 bytes a 16-row x 128-k tile as the f16 one): lane l = 4 g + t holds 16
// bytes of row g, then 16 of row g + 8, then 4 scale bytes; word kk (0..3) of a row is the 8 codes of k =
// 16 grp + 8 (kk & 1) .. + 7 of the tile, grp = t for kk < 2 and 4 + t after, so the lane's scale bytes are
// (row g, grp t), (row g + 8, grp t), (row g, grp 4 + t), (row g + 8, grp 4 + t). wgmma step kk takes word kk
// of both rows: e2m1x8_to_e4m3 gives lo (codes 0 2 4 6) as A k = 4 t .. 4 t + 3 and hi (codes 1 3 5 7) as
// k = 16 + 4 t .. + 3 (the k32 A fragment: a0 row g, a1 row g + 8 at k 4 t ..; a2, a3 at 16 + 4 t ..).
// B (8 x 32 a step, K-major, 128-byte swizzle, one 1024-byte atom a 128-k tile): column 2 t + e holds term
// e of x at lane t's eight k and zeros elsewhere, so D column 2 t + e is lane t's group sum alone and the
// block scale multiplies the f32 result: steps 0 and 1 accumulate group t in one D, steps 2 and 3 group 4 + t
// in another.

__device__ __forceinline__ void wgmma_e4m3_n8(float (&d)[4], const uint32_t (&a)[4], uint64_t desc_b,
                                              int scale_d) {
#if MS_WGMMA_SM90A
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
#else
  (void)d;
  (void)a;
  (void)desc_b;
  (void)scale_d;
  ms::cuda::wg::trap_not_sm90a();
#endif
}

// Natural layout -> wg layout.
__global__ void repack_wg_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                                 uint8_t* __restrict__ tiles) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t{kR / 16} * kKt * 32) return;
  const int lane = static_cast<int>(i % 32), kt = static_cast<int>((i / 32) % kKt);
  const int rt = static_cast<int>(i / (32 * kKt));
  const int g = lane >> 2, t = lane & 3;
  uint8_t* tile = tiles + (static_cast<int64_t>(rt) * kKt + kt) * kTileBytes;
  for (int h = 0; h < 2; ++h) {
    const int64_t row = int64_t{rt} * 16 + g + 8 * h;
    for (int kk = 0; kk < 4; ++kk) {
      const int grp = kk < 2 ? t : 4 + t;
      const uint32_t v =
          *reinterpret_cast<const uint32_t*>(codes + row * kRowBytes + kt * 64 + 8 * grp + 4 * (kk & 1));
      *reinterpret_cast<uint32_t*>(tile + 512 * h + 16 * lane + 4 * kk) = v;
    }
    const uint8_t* s = scales + row * kScaleRow + kt * 8;
    tile[1024 + 4 * lane + h] = s[t];
    tile[1024 + 4 * lane + 2 + h] = s[4 + t];
  }
}

// A fragments of wgmma step kk from word kk of rows g (wg) and g + 8 (wh): a0 / a1 the rows' lo codes (A k
// 4 t ..), a2 / a3 their hi codes (A k 16 + 4 t ..).
__device__ __forceinline__ void wg_fragment(uint32_t (&af)[4], uint32_t wg, uint32_t wh) {
  uint32_t lo0, hi0, lo1, hi1;
  mdd::e2m1x8_to_e4m3(wg, lo0, hi0);
  mdd::e2m1x8_to_e4m3(wh, lo1, hi1);
  af[0] = lo0, af[1] = lo1, af[2] = hi0, af[3] = hi1;
}

constexpr int kWgSmem = kKt * 1024 + 1024;  // x's B image: one 1024-byte atom a 128-k tile (+ alignment)

// A tile's block scales applied to its two group sums d0 (grp t), d1 (grp 4 + t).
__device__ __forceinline__ void wg_scale_add(float (&acc)[4], const float (&d0)[4], const float (&d1)[4],
                                             uint32_t scu) {
  // Scales: (row g, grp t), (row g + 8, grp t) | (row g, grp 4 + t), (row g + 8, grp 4 + t).
  const uint32_t s01 = tc::fp8x2_to_f16x2(scu), s23 = tc::fp8x2_hi_to_f16x2(scu);
  const float2 sa = __half22float2(*reinterpret_cast<const __half2*>(&s01));
  const float2 sb = __half22float2(*reinterpret_cast<const __half2*>(&s23));
  acc[0] = fmaf(sa.x, d0[0], acc[0]);
  acc[1] = fmaf(sa.x, d0[1], acc[1]);
  acc[2] = fmaf(sa.y, d0[2], acc[2]);
  acc[3] = fmaf(sa.y, d0[3], acc[3]);
  acc[0] = fmaf(sb.x, d1[0], acc[0]);
  acc[1] = fmaf(sb.x, d1[1], acc[1]);
  acc[2] = fmaf(sb.y, d1[2], acc[2]);
  acc[3] = fmaf(sb.y, d1[3], acc[3]);
}

// kPipe: two sets of fragments and sums, so tile kt's products run while tile kt + 1
// is decoded (wait for all but the newest group) instead of waiting for each tile's own.
template <bool kPipe>
__global__ void __launch_bounds__(128)
    e4m3_wg_kernel(const uint8_t* __restrict__ w, const uint8_t* __restrict__ ximg, float inv_sx,
                   float* __restrict__ y) {
  extern __shared__ __align__(1024) uint8_t xb_raw[];
  uint8_t* xb = xb_raw + ((1024u - (ms::cuda::wg::smem_u32(xb_raw) & 1023u)) & 1023u);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int rt = blockIdx.x * 4 + warp;
  const uint8_t* tl = w + int64_t{rt} * kKt * kTileBytes;
  uint4 a[kDepth], b[kDepth];
  uint32_t sc[kDepth];
  auto load = [&](int kt, int u) {
    if (kt >= kKt) return;
    const uint8_t* p = tl + int64_t{kt} * kTileBytes;
    a[u] = ld_stream16(p + 16 * lane);
    b[u] = ld_stream16(p + 512 + 16 * lane);
    sc[u] = *reinterpret_cast<const uint32_t*>(p + 1024 + 4 * lane);
  };
#pragma unroll
  for (int u = 0; u < kDepth; ++u) load(u, u);
  // x's image (host-built, unswizzled [tile][column][128 bytes]) into the swizzled atoms.
  for (int i = threadIdx.x; i < kKt * 64; i += blockDim.x) {
    const int kt = i / 64, n = (i / 8) % 8, c = i % 8;
    *reinterpret_cast<uint4*>(xb + kt * 1024 + ms::cuda::wg::sw128_offset(n, c)) =
        __ldg(reinterpret_cast<const uint4*>(ximg) + i);
  }
  ms::cuda::wg::fence_proxy_async();
  __syncthreads();
  const uint64_t desc0 = ms::cuda::wg::smem_desc_sw128(ms::cuda::wg::smem_u32(xb));
  float acc[4] = {0.f, 0.f, 0.f, 0.f};  // rows g, g + 8 x terms 0, 1 (columns 2 t, 2 t + 1)
  constexpr int kSets = kPipe ? 2 : 1;
  float d[kSets][2][4] = {};
  uint32_t af[kSets][4][4];
  uint32_t sc_prev = 0;
  static_assert(kDepth % 2 == 0, "the pipelined sets alternate within an unrolled group");
  for (int kt0 = 0; kt0 < kKt; kt0 += kDepth) {
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      const int kt = kt0 + u, set = kPipe ? (u & 1) : 0;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wg_fragment(af[set][kk], word_of(a[u], kk), word_of(b[u], kk));
      const uint64_t dk = desc0 + static_cast<uint64_t>(kt * 1024 >> 4);
      ms::cuda::wg::wgmma_fence();
      wgmma_e4m3_n8(d[set][0], af[set][0], ms::cuda::wg::desc_advance(dk, 0), 0);
      wgmma_e4m3_n8(d[set][0], af[set][1], ms::cuda::wg::desc_advance(dk, 1), 1);
      wgmma_e4m3_n8(d[set][1], af[set][2], ms::cuda::wg::desc_advance(dk, 2), 0);
      wgmma_e4m3_n8(d[set][1], af[set][3], ms::cuda::wg::desc_advance(dk, 3), 1);
      ms::cuda::wg::wgmma_commit();
      const uint32_t scu = sc[u];
      load(kt + kDepth, u);
      if constexpr (kPipe) {
        if (kt > 0) {  // the previous tile's group is done once at most this one is pending
          ms::cuda::wg::wgmma_wait<1>();
          ms::cuda::wg::fence_operands(d[set ^ 1][0]);
          ms::cuda::wg::fence_operands(d[set ^ 1][1]);
          wg_scale_add(acc, d[set ^ 1][0], d[set ^ 1][1], sc_prev);
        }
        sc_prev = scu;
      } else {
        ms::cuda::wg::wgmma_wait<0>();
        ms::cuda::wg::fence_operands(d[0][0]);
        ms::cuda::wg::fence_operands(d[0][1]);
        wg_scale_add(acc, d[0][0], d[0][1], scu);
      }
    }
  }
  if constexpr (kPipe) {
    ms::cuda::wg::wgmma_wait<0>();
    constexpr int last = (kKt - 1) & 1;
    ms::cuda::wg::fence_operands(d[last][0]);
    ms::cuda::wg::fence_operands(d[last][1]);
    wg_scale_add(acc, d[last][0], d[last][1], sc_prev);
  }
  float yg = acc[0] + acc[1] * (1.f / 16.f), yh = acc[2] + acc[3] * (1.f / 16.f);
  yg += __shfl_xor_sync(0xffffffffu, yg, 1);
  yg += __shfl_xor_sync(0xffffffffu, yg, 2);
  yh += __shfl_xor_sync(0xffffffffu, yh, 1);
  yh += __shfl_xor_sync(0xffffffffu, yh, 2);
  if (t == 0) {
    y[int64_t{rt} * 16 + g] = yg * mdd::kCodeScale * inv_sx;
    y[int64_t{rt} * 16 + g + 8] = yh * mdd::kCodeScale * inv_sx;
  }
}

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f), "f"(0.f), "f"(0.f), "f"(0.f));
}

// x terms in shared memory: for k tile kt, lane quad t, term e and word j2, 8 e4m3 bytes: b0 = the term at
// k = 128 kt + 32 t + 8 j2 + 2 i (i = 0..3), b1 at + 2 i + 1 (the codes e2m1x8_to_e4m3 puts in lo / hi).
__global__ void __launch_bounds__(32 * kWarps)
    e4m3_kernel(const uint8_t* __restrict__ w, const uint8_t* __restrict__ xterms, float inv_sx,
                float* __restrict__ y) {
  __shared__ __align__(16) uint8_t xs[2 * kK];
  for (int i = threadIdx.x; i < 2 * kK / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(xs)[i] = reinterpret_cast<const uint4*>(xterms)[i];
  __syncthreads();
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int rt = blockIdx.x * kWarps + (threadIdx.x >> 5);
  // Lane (g, t) feeds column g of B: term g - 2 t of its quad t's codes, where g is 2 t or 2 t + 1.
  const int term = g - 2 * t;
  const bool feeds = term == 0 || term == 1;
  const uint8_t* tl = w + int64_t{rt} * kKt * kTileBytes;
  uint4 a[kDepth], b[kDepth];
  uint32_t sc[kDepth];
  auto load = [&](int kt, int u) {
    if (kt >= kKt) return;
    const uint8_t* p = tl + int64_t{kt} * kTileBytes;
    a[u] = ld_stream16(p + 16 * lane);
    b[u] = ld_stream16(p + 512 + 16 * lane);
    sc[u] = *reinterpret_cast<const uint32_t*>(p + 1024 + 4 * lane);
  };
#pragma unroll
  for (int u = 0; u < kDepth; ++u) load(u, u);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};  // rows g, g + 8 x terms 0, 1 (columns 2 t, 2 t + 1)
  for (int kt0 = 0; kt0 < kKt; kt0 += kDepth) {
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      const int kt = kt0 + u;
      const uint4* xp = reinterpret_cast<const uint4*>(xs + ((kt * 4 + t) * 2 + (feeds ? term : 0)) * 32);
      uint4 xv[2] = {xp[0], xp[1]};
      if (!feeds) xv[0] = xv[1] = make_uint4(0u, 0u, 0u, 0u);
      // The rows' scales of groups 2 t (words 0, 1) and 2 t + 1 (words 2, 3), as f32.
      const uint32_t s01 = tc::fp8x2_to_f16x2(sc[u]), s23 = tc::fp8x2_hi_to_f16x2(sc[u]);
      const float2 srow_g = __half22float2(*reinterpret_cast<const __half2*>(&s01));   // row g, h = 0, 1
      const float2 srow_g8 = __half22float2(*reinterpret_cast<const __half2*>(&s23));  // row g + 8
#pragma unroll
      for (int j2 = 0; j2 < 4; ++j2) {
        uint32_t lo0, hi0, lo1, hi1;
        mdd::e2m1x8_to_e4m3(word_of(a[u], j2), lo0, hi0);
        mdd::e2m1x8_to_e4m3(word_of(b[u], j2), lo1, hi1);
        const uint32_t af[4] = {lo0, lo1, hi0, hi1};
        const uint2 bj = j2 == 0   ? make_uint2(xv[0].x, xv[0].y)
                         : j2 == 1 ? make_uint2(xv[0].z, xv[0].w)
                         : j2 == 2 ? make_uint2(xv[1].x, xv[1].y)
                                   : make_uint2(xv[1].z, xv[1].w);
        float d[4];
        mma_e4m3(d, af, bj.x, bj.y);
        const float s0 = j2 < 2 ? srow_g.x : srow_g.y, s1 = j2 < 2 ? srow_g8.x : srow_g8.y;
        acc[0] = fmaf(s0, d[0], acc[0]);
        acc[1] = fmaf(s0, d[1], acc[1]);
        acc[2] = fmaf(s1, d[2], acc[2]);
        acc[3] = fmaf(s1, d[3], acc[3]);
      }
      load(kt + kDepth, u);
    }
  }
  float yg = acc[0] + acc[1] * (1.f / 16.f), yh = acc[2] + acc[3] * (1.f / 16.f);
  yg += __shfl_xor_sync(0xffffffffu, yg, 1);
  yg += __shfl_xor_sync(0xffffffffu, yg, 2);
  yh += __shfl_xor_sync(0xffffffffu, yh, 1);
  yh += __shfl_xor_sync(0xffffffffu, yh, 2);
  if (t == 0) {
    y[int64_t{rt} * 16 + g] = yg * mdd::kCodeScale * inv_sx;
    y[int64_t{rt} * 16 + g + 8] = yh * mdd::kCodeScale * inv_sx;
  }
}

// The fragment layout's loads alone, xor-folded; a store only where the fold hits a value it never does in
// practice (so no load is dead).
__global__ void __launch_bounds__(32 * kWarps)
    load_kernel(const uint8_t* __restrict__ w, float* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const int rt = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const uint8_t* tl = w + int64_t{rt} * kKt * kTileBytes;
  uint32_t f = 0;
#pragma unroll kDepth
  for (int kt = 0; kt < kKt; ++kt) {
    const uint8_t* p = tl + int64_t{kt} * kTileBytes;
    const uint4 a = ld_stream16(p + 16 * lane), b = ld_stream16(p + 512 + 16 * lane);
    f ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^
         *reinterpret_cast<const uint32_t*>(p + 1024 + 4 * lane);
  }
  if (f == 0x9e3779b9u) y[int64_t{rt} * 16] = 1.f;
}

// e4m3 (OCP E4M3FN) byte -> value, and value -> nearest byte (ties to the even code), saturating at 448.
double e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (b & 0x80u) ? -mag : mag;
}

uint8_t e4m3_nearest(double v) {
  const double a = std::min(std::fabs(v), 448.0);
  int best = 0;
  for (int c = 1; c < 0x7f; ++c) {
    const double d = std::fabs(e4m3_value(static_cast<uint8_t>(c)) - a),
                 db = std::fabs(e4m3_value(static_cast<uint8_t>(best)) - a);
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  return static_cast<uint8_t>(best | (v < 0 ? 0x80 : 0));
}

double e2m1(uint32_t c) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (c & 8u) ? -mag[c & 7u] : mag[c & 7u];
}

}  // namespace

int main() {
  if (ms::cuda::device_count() == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  const double bw = ms::bench::measure_copy_gbs();
  const ms::cuda::DeviceCaps caps = ms::cuda::query_device(0);
  std::printf("ceiling: device-to-device copy %.0f GB/s (read + write)\n", bw);
  // Weights: random codes, scales e4m3 in [2^-6, 2^2) (random mantissas), one copy in each layout, x ~ N(0,
  // 1).
  std::mt19937 rng(7);
  std::vector<uint8_t> codes(kCodeBytes), scales(kScaleBytes);
  for (auto& c : codes) c = static_cast<uint8_t>(rng());
  for (auto& s : scales) s = static_cast<uint8_t>(((rng() % 8u) + 1u) << 3 | (rng() % 8u));  // exp 1..8
  std::normal_distribution<float> nd;
  std::vector<float> x(kK);
  for (auto& v : x) v = nd(rng);
  std::vector<double> ref(kR, 0.0);
  for (int r = 0; r < kR; ++r) {
    double acc = 0;
    for (int gi = 0; gi < kScaleRow; ++gi) {
      double part = 0;
      for (int k = 16 * gi; k < 16 * gi + 16; ++k) {
        const uint8_t byte = codes[int64_t{r} * kRowBytes + k / 2];
        part += e2m1((k & 1) ? byte >> 4 : byte & 15u) * x[k];
      }
      acc += part * e4m3_value(scales[int64_t{r} * kScaleRow + gi]);
    }
    ref[r] = acc;
  }
  // x as two e4m3 terms: x s = hi + lo / 16.
  float amax = 0.f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float sx = 448.f / amax;
  std::vector<uint8_t> xterms(2 * kK);
  for (int k = 0; k < kK; ++k) {
    const uint8_t hi = e4m3_nearest(x[k] * sx);
    const uint8_t lo = e4m3_nearest((x[k] * sx - e4m3_value(hi)) * 16.f);
    const int kt = k / 128, r = k % 128, t = r / 32, j2 = (r % 32) / 8, e = r % 8;
    // byte i of b0 holds k = .. + 2 i, byte i of b1 holds .. + 2 i + 1
    const int off = e % 2 == 0 ? e / 2 : 4 + e / 2;
    for (int term = 0; term < 2; ++term)
      xterms[((kt * 4 + t) * 2 + term) * 32 + j2 * 8 + off] = term == 0 ? hi : lo;
  }

  // x's B image for e4m3_wg_kernel: [tile][column 2 t + e][128 bytes], step kk's 32 bytes at 32 kk, lane t's
  // lo codes (code 2 i of its word) at byte 4 t + i and hi codes (2 i + 1) at 16 + 4 t + i.
  std::vector<uint8_t> ximg(static_cast<size_t>(kKt) * 1024, 0);
  for (int kt = 0; kt < kKt; ++kt)
    for (int t = 0; t < 4; ++t)
      for (int kk = 0; kk < 4; ++kk)
        for (int code = 0; code < 8; ++code) {
          const int grp = kk < 2 ? t : 4 + t;
          const int k = 128 * kt + 16 * grp + 8 * (kk & 1) + code;
          const int j = (code % 2 == 0 ? 4 * t : 16 + 4 * t) + code / 2;
          const uint8_t hi = e4m3_nearest(x[k] * sx);
          const uint8_t lo = e4m3_nearest((x[k] * sx - e4m3_value(hi)) * 16.f);
          for (int e = 0; e < 2; ++e) ximg[kt * 1024 + (2 * t + e) * 128 + 32 * kk + j] = e == 0 ? hi : lo;
        }

  uint8_t *nat, *frag, *wgl, *d_codes, *d_scales, *d_xt, *d_ximg;
  float *d_x, *d_y;
  CUDA_CHECK(cudaMalloc(&nat, kCopies * kCopyBytes));
  CUDA_CHECK(cudaMalloc(&frag, kCopies * kCopyBytes));
  CUDA_CHECK(cudaMalloc(&d_xt, xterms.size()));
  CUDA_CHECK(cudaMalloc(&wgl, kCopies * kCopyBytes));
  CUDA_CHECK(cudaMalloc(&d_ximg, ximg.size()));
  CUDA_CHECK(cudaMemcpy(d_ximg, ximg.data(), ximg.size(), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMalloc(&d_x, kK * 4));
  CUDA_CHECK(cudaMalloc(&d_y, kR * 4));
  CUDA_CHECK(cudaMemcpy(d_x, x.data(), kK * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_xt, xterms.data(), xterms.size(), cudaMemcpyHostToDevice));
  for (int c = 0; c < kCopies; ++c) {
    d_codes = nat + c * kCopyBytes;
    d_scales = d_codes + kCodeBytes;
    CUDA_CHECK(cudaMemcpy(d_codes, codes.data(), kCodeBytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_scales, scales.data(), kScaleBytes, cudaMemcpyHostToDevice));
    const int64_t n = int64_t{kR / 16} * kKt * 32;
    repack_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(d_codes, d_scales, frag + c * kCopyBytes);
    CUDA_CHECK(cudaGetLastError());
    repack_wg_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(d_codes, d_scales,
                                                                      wgl + c * kCopyBytes);
    CUDA_CHECK(cudaGetLastError());
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  double rmax = 0;
  for (double v : ref) rmax = std::max(rmax, std::fabs(v));
  const double floor_us = static_cast<double>(kCopyBytes) / (bw * 1e9) * 1e6;
  std::printf("%d rows x %d k NVFP4 (%.1f MB with scales), one token; floor %.2f us\n", kR, kK,
              kCopyBytes / 1e6, floor_us);
  std::printf("%-10s %10s %8s %12s\n", "kernel", "time us", "% copy", "max err/max");
  const dim3 grid(kR / 16 / kWarps), block(32 * kWarps);
  auto report = [&](const char* name, auto&& launch, bool check) {
    int which = 0;
    const float ms = ms::bench::time_ms(
        [&] {
          launch(which);
          which = (which + 1) % kCopies;
        },
        40);
    double err = 0;
    if (check) {
      CUDA_CHECK(cudaMemset(d_y, 0, kR * 4));
      launch(0);
      CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<float> y(kR);
      CUDA_CHECK(cudaMemcpy(y.data(), d_y, kR * 4, cudaMemcpyDeviceToHost));
      for (int r = 0; r < kR; ++r) err = std::max(err, std::fabs(y[r] - ref[r]));
    }
    char errs[32] = "-";  // not checked: the loads alone, the diagnostic
    if (check) std::snprintf(errs, sizeof errs, "%.3g", err / rmax);
    std::printf("%-10s %10.2f %7.1f%% %12s\n", name, ms * 1e3, 100.0 * floor_us / (ms * 1e3), errs);
  };
  CUDA_CHECK(cudaFuncSetAttribute(ring_kernel<2, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  ring_smem_bytes<2, 4>()));
  CUDA_CHECK(cudaFuncSetAttribute(ring_kernel<4, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  ring_smem_bytes<4, 3>()));
  CUDA_CHECK(
      cudaFuncSetAttribute(e4m3_wg_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kWgSmem));
  CUDA_CHECK(
      cudaFuncSetAttribute(e4m3_wg_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kWgSmem));
  const dim3 wg_grid(kR / 64);
  for (int pass = 0; pass < 2; ++pass) {
    report(
        "load", [&](int c) { load_kernel<<<grid, block>>>(frag + c * kCopyBytes, d_y); }, false);
    report(
        "f16-nat", [&](int c) { f16_kernel<false><<<grid, block>>>(nat + c * kCopyBytes, d_x, d_y); }, true);
    report(
        "f16-frag", [&](int c) { f16_kernel<true><<<grid, block>>>(frag + c * kCopyBytes, d_x, d_y); }, true);
    report(
        "f16-frag2", [&](int c) { f16_kernel<true, 2><<<grid, block>>>(frag + c * kCopyBytes, d_x, d_y); },
        true);
    report(
        "f16-frag6", [&](int c) { f16_kernel<true, 6><<<grid, block>>>(frag + c * kCopyBytes, d_x, d_y); },
        true);
    report(
        "noconv",
        [&](int c) { f16_kernel<true, kDepth, true><<<grid, block>>>(frag + c * kCopyBytes, d_x, d_y); },
        false);
    report(
        "f16-fragx",
        [&](int c) {
          f16_kernel<true, kDepth, false, true><<<grid, block>>>(frag + c * kCopyBytes, d_x, d_y);
        },
        true);
    report(
        "f16-natx",
        [&](int c) {
          f16_kernel<false, kDepth, false, true><<<grid, block>>>(nat + c * kCopyBytes, d_x, d_y);
        },
        true);
    report(
        "noconv-x",
        [&](int c) {
          f16_kernel<true, kDepth, true, true><<<grid, block>>>(frag + c * kCopyBytes, d_x, d_y);
        },
        false);
    report(
        "noload-x",
        [&](int c) {
          f16_kernel<true, kDepth, false, true, true><<<grid, block>>>(frag + c * kCopyBytes, d_x, d_y);
        },
        false);
    report(
        "ring2x4",
        [&](int c) {
          ring_kernel<2, 4><<<grid, block, ring_smem_bytes<2, 4>()>>>(frag + c * kCopyBytes, d_x, d_y);
        },
        true);
    report(
        "ring4x3",
        [&](int c) {
          ring_kernel<4, 3><<<grid, block, ring_smem_bytes<4, 3>()>>>(frag + c * kCopyBytes, d_x, d_y);
        },
        true);
    report(
        "e4m3-wg",
        [&](int c) {
          e4m3_wg_kernel<false><<<wg_grid, 128, kWgSmem>>>(wgl + c * kCopyBytes, d_ximg, 1.f / sx, d_y);
        },
        true);
    report(
        "e4m3-wgP",
        [&](int c) {
          e4m3_wg_kernel<true><<<wg_grid, 128, kWgSmem>>>(wgl + c * kCopyBytes, d_ximg, 1.f / sx, d_y);
        },
        true);
    // The engine's item shape (shape_kernel): tiles a warp, warps a block, steps in flight; "b1" pads
    // shared memory so that one block fits a multiprocessor.
    auto shape = [&](const char* name, auto kernel, int tl, int wpb, bool one_block) {
      const size_t pad = one_block ? caps.smem_per_block_optin - kK * 2 - 1024 : 0;
      CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(pad)));
      const dim3 sgrid(kR / 16 / tl / wpb), sblock(32 * wpb);
      report(
          name, [&](int c) { kernel<<<sgrid, sblock, pad>>>(nat + c * kCopyBytes, d_x, d_y); }, true);
    };
    shape("s1w4d4", shape_kernel<1, 4, 4>, 1, 4, false);
    shape("s2w4d4", shape_kernel<2, 4, 4>, 2, 4, false);
    shape("s2w4d6", shape_kernel<2, 4, 6>, 2, 4, false);
    shape("s2w8d6", shape_kernel<2, 8, 6>, 2, 8, false);
    shape("s2w8d6b1", shape_kernel<2, 8, 6>, 2, 8, true);
    shape("s2w8d3b1", shape_kernel<2, 8, 3>, 2, 8, true);
    shape("s1w8d6b1", shape_kernel<1, 8, 6>, 1, 8, true);
    shape("s2w16d3b1", shape_kernel<2, 16, 3>, 2, 16, true);
    report(
        "e4m3-frag", [&](int c) { e4m3_kernel<<<grid, block>>>(frag + c * kCopyBytes, d_xt, 1.f / sx, d_y); },
        true);
  }
  CUDA_CHECK(cudaGetLastError());
  return 0;
}
