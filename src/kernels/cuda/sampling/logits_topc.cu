// Top-C of a row by radix selection on an order-preserving 32-bit key: a first pass finds the row max and a
// lower bound on the C-th best key (block_lower_bound); three histogram passes (11, 11 and 10 bits, most
// significant first) over the entries at or above that bound find the key K of the C-th best entry and how
// many entries equal to K it takes; a fifth pass gathers the entries above K and the lowest-id entries equal
// to K; a rank sort of the C in shared memory orders them. Both exp-sums ride along the first histogram pass.
// Every pass reads the row once (about 620 KB for GLM-5, mostly from L2 after the first), whatever C is.
//
// Each warp walks one contiguous segment of the row, 32 consecutive ids at a time, so "lowest ids first"
// among equal keys needs one scan over the warps' tie counts instead of one per chunk.
//
// Few rows (a decode batch) would leave most of the GPU idle with a block per row, so with a workspace a row
// is cut into up to kMaxSegments id ranges, each summarised by its own block (its top C, max and sums
// relative to its own max), and a second kernel merges a row's segments: a candidate's rank in the row is
// the number of candidates of every segment that beat it (a binary search in each sorted list), and the sums
// are rescaled to the row max and added in segment order. The merged top C is exact (every entry of the
// row's top C is in its segment's top C); the sums differ from the one-block ones in the last bits.
#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/sampling/logits_topc.h"

namespace ms::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kC = kernels::cpu::kLogitsTopC;
constexpr int kMaxBins = 2048;     // the widest digit: 11 bits
constexpr int kUnroll = 16;        // loads of a lane in flight at once in the passes over the row
constexpr int kMaxSegments = 16;   // id ranges a row may be cut into (logits_topc_workspace_bytes)
constexpr int kMinSegment = 4096;  // ids a segment keeps at least
static_assert(kC <= kThreads, "the rank sort gives one candidate to each thread");
static_assert(kMaxBins % kThreads == 0 && 1024 % kThreads == 0, "bins split evenly over the threads");

struct Shared {
  uint32_t hist[kMaxBins];  // [bins] of the current digit, among the entries that match the prefix so far
  int32_t cand_token[kC];   // [count] gathered candidates, unordered until the rank sort
  float cand_logit[kC];
  uint32_t scan[kWarps];  // per-warp totals of a block scan
  double red_d[2][kWarps];
  float red_f[kWarps];
  int32_t red_i[kWarps];
  uint32_t digit;  // the digit the C-th best entry has in this pass
  uint32_t above;  // matching entries in higher bins than `digit`
  int32_t n_gt;    // gathered entries whose key is above K
};

// Same order as kernels::cpu::logits_topc_key.
__device__ __forceinline__ uint32_t key_of(float x) {
  if (isnan(x)) return 0u;
  if (x == 0.0f) x = 0.0f;
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ bool better(uint32_t ka, int32_t ia, uint32_t kb, int32_t ib) {
  return ka > kb || (ka == kb && ia < ib);
}

// A lane's kUnroll entries of a warp chunk, ids base0 + 32 u + lane (0 past end), all loads issued before any
// is used.
__device__ __forceinline__ void load_chunk(const float* __restrict__ x, int base0, int end, int lane,
                                           float (&vals)[kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int i = base0 + 32 * u + lane;
    vals[u] = i < end ? __ldg(x + i) : 0.0f;
  }
}

// Block-wide results, returned to every thread; each starts with a barrier so its scratch is free.
__device__ float block_max(float v, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red_f[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = sh.red_f[0];
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, sh.red_f[w]);
  return m;
}

__device__ int32_t block_sum(int32_t v, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red_i[threadIdx.x >> 5] = v;
  __syncthreads();
  int32_t s = 0;
  for (int w = 0; w < kWarps; ++w) s += sh.red_i[w];
  return s;
}

__device__ void block_sum2(double& a, double& b, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    sh.red_d[0][threadIdx.x >> 5] = a;
    sh.red_d[1][threadIdx.x >> 5] = b;
  }
  __syncthreads();
  a = 0.0;
  b = 0.0;
  for (int w = 0; w < kWarps; ++w) {
    a += sh.red_d[0][w];
    b += sh.red_d[1][w];
  }
}

// Inclusive prefix sum over threads in index order.
__device__ uint32_t block_inclusive_scan(uint32_t v, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  __syncthreads();
  if (lane == 31) sh.scan[warp] = v;
  __syncthreads();
  for (int w = 0; w < warp; ++w) v += sh.scan[w];
  return v;
}

// The least over the warps of each warp's (C / warps)-th largest `v` (ties by lane): a key that at least C
// lanes' values reach. Starts with a barrier so its scratch is free.
static_assert(kC % kWarps == 0 && kC / kWarps <= 32, "each warp names C / warps of its lanes");
__device__ uint32_t block_lower_bound(uint32_t v, Shared& sh) {
  const int lane = threadIdx.x & 31;
  int above = 0;  // lanes whose value beats this lane's
  for (int l = 0; l < 32; ++l) {
    const uint32_t u = __shfl_sync(0xffffffffu, v, l);
    above += (u > v || (u == v && l < lane)) ? 1 : 0;
  }
  const uint32_t pick = __ballot_sync(0xffffffffu, above == kC / kWarps - 1);
  const uint32_t w_bound = __shfl_sync(0xffffffffu, v, __ffs(pick) - 1);
  __syncthreads();
  if (lane == 0) sh.scan[threadIdx.x >> 5] = w_bound;
  __syncthreads();
  uint32_t b = sh.scan[0];
  for (int w = 1; w < kWarps; ++w) b = min(b, sh.scan[w]);
  return b;
}

// The bin holding the k-th largest matching entry (k >= 1, at most the histogram's total): sh.digit, and in
// sh.above how many matching entries lie in higher bins. Thread t sums the bins t * per .. from the top.
__device__ void select_digit(Shared& sh, int bins, uint32_t k) {
  const int per = bins / kThreads;
  const int hi = bins - static_cast<int>(threadIdx.x) * per;
  uint32_t local = 0;
  for (int j = 1; j <= per; ++j) local += sh.hist[hi - j];
  const uint32_t incl = block_inclusive_scan(local, sh);
  const uint32_t excl = incl - local;
  if (excl < k && k <= incl) {
    uint32_t cum = excl;
    for (int j = 1; j <= per; ++j) {
      const uint32_t h = sh.hist[hi - j];
      if (cum + h >= k) {
        sh.digit = static_cast<uint32_t>(hi - j);
        sh.above = cum;
        break;
      }
      cum += h;
    }
  }
  __syncthreads();
}

// Block b: row b / segs, ids [s * seg_len, + seg_len) of it (s = b % segs); its summary to out[b] (the row's
// final one when segs == 1, else a segment's for logits_topc_merge_kernel).
__global__ void __launch_bounds__(kThreads)
    logits_topc_kernel(LogitsTopCParams p, int segs, int seg_len, LogitsTopC* __restrict__ out) {
  dev::grid_dep_enter();
  __shared__ Shared sh;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r = blockIdx.x / segs;
  const int id0 = static_cast<int>(blockIdx.x % segs) * seg_len;
  const float* __restrict__ x = p.logits + r * p.stride + id0;
  const int n = min(static_cast<int>(p.vocab) - id0, seg_len);
  const int count = n < kC ? n : kC;
  // This warp's ids: [beg, end), walked 32 at a time (the loop bounds are warp-uniform).
  const int seg = ((n + kWarps - 1) / kWarps + 31) & ~31;
  const int beg = warp * seg < n ? warp * seg : n;
  const int end = beg + seg < n ? beg + seg : n;

  const float t = p.temperature[r];
  const bool greedy = t < kernels::cpu::kLogitsTopCGreedyTemperature;
  const float inv_t = greedy ? 0.0f : 1.0f / t;

  // Pass A: the row max and NaN count, and a lower bound lb on the key of the C-th best entry: every warp's
  // (C / warps)-th largest lane maximum, the least of them over the warps. C distinct entries (one per such
  // lane) have keys >= lb, so the C-th best does too, and the histograms may skip every entry below lb: the
  // digits they select and the counts above them stay exact, and after the first few chunks almost every
  // warp of a pass finds no entry to count.
  float m = -INFINITY;
  int32_t nans = 0;
  uint32_t lane_max = 0;  // key 0 (NaN, or no entry): no bound
  for (int base0 = beg; base0 < end; base0 += 32 * kUnroll) {
    float vals[kUnroll];
    load_chunk(x, base0, end, lane, vals);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base0 + 32 * u + lane < end) {
        const float v = vals[u];
        lane_max = max(lane_max, key_of(v));
        if (isnan(v)) {
          ++nans;
        } else {
          m = fmaxf(m, v);
        }
      }
    }
  }
  m = block_max(m, sh);
  nans = block_sum(nans, sh);
  const uint32_t lb = block_lower_bound(lane_max, sh);

  uint32_t prefix = 0, prefix_mask = 0;
  uint32_t k = static_cast<uint32_t>(count);  // rank among the entries matching the prefix
  double s1 = 0.0, st = 0.0;
  for (int pass = 0; pass < 3; ++pass) {
    const int bits = pass < 2 ? 11 : 10;
    const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    const uint32_t mask = (1u << bits) - 1u;
    for (int b = threadIdx.x; b < kMaxBins; b += kThreads) sh.hist[b] = 0;
    __syncthreads();
    for (int base0 = beg; base0 < end; base0 += 32 * kUnroll) {
      // All kUnroll loads of the lane issued before any is used: the loop body's warp collectives would
      // otherwise keep one load in flight per warp (a row then took ~100 us per pass).
      float vals[kUnroll];
      load_chunk(x, base0, end, lane, vals);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int base = base0 + 32 * u;
        if (base >= end) break;  // warp-uniform
        const int i = base + lane;
        const bool valid = i < end;
        const float v = vals[u];
        const uint32_t key = key_of(v);
        const bool take = valid && key >= lb && (key & prefix_mask) == prefix;
        // Few entries pass lb and the prefix: a warp with none skips the (slow) match and the atomics.
        if (__any_sync(0xffffffffu, take)) {
          const uint32_t bin = take ? (key >> shift) & mask : 0xffffffffu;
          const uint32_t peers = __match_any_sync(0xffffffffu, bin);
          if (take && lane == __ffs(peers) - 1)
            atomicAdd(&sh.hist[bin], static_cast<uint32_t>(__popc(peers)));
        }
        if (pass == 0 && valid) {
          s1 += static_cast<double>(expf(v - m));
          if (!greedy) st += static_cast<double>(expf((v - m) * inv_t));
        }
      }
    }
    __syncthreads();
    select_digit(sh, 1 << bits, k);
    prefix |= sh.digit << shift;
    prefix_mask |= mask << shift;
    k -= sh.above;
  }
  block_sum2(s1, st, sh);
  if (greedy) st = 1.0;

  // Gather: every entry above K (any slot), then the `need` lowest ids equal to K (slots in id order after
  // them).
  const uint32_t kk = prefix;
  const int need = static_cast<int>(k);
  const int n_gt = count - need;
  if (threadIdx.x == 0) sh.n_gt = 0;
  __syncthreads();
  uint32_t my_ties = 0;  // warp-uniform
  for (int base0 = beg; base0 < end; base0 += 32 * kUnroll) {
    float vals[kUnroll];
    load_chunk(x, base0, end, lane, vals);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base0 + 32 * u + lane;
      const bool valid = i < end;
      const float v = vals[u];
      const uint32_t key = key_of(v);
      if (valid && key > kk) {
        const int slot = atomicAdd(&sh.n_gt, 1);
        sh.cand_token[slot] = i;
        sh.cand_logit[slot] = v;
      }
      my_ties += static_cast<uint32_t>(__popc(__ballot_sync(0xffffffffu, valid && key == kk)));
    }
  }
  if (lane == 0) sh.scan[warp] = my_ties;
  __syncthreads();
  uint32_t before = 0;
  for (int w = 0; w < warp; ++w) before += sh.scan[w];
  if (before < static_cast<uint32_t>(need) && my_ties > 0) {
    for (int base = beg; base < end && before < static_cast<uint32_t>(need); base += 32) {
      const int i = base + lane;
      const bool valid = i < end;
      const float v = valid ? x[i] : 0.0f;
      const bool tie = valid && key_of(v) == kk;
      const uint32_t ballot = __ballot_sync(0xffffffffu, tie);
      const uint32_t rank = before + static_cast<uint32_t>(__popc(ballot & ((1u << lane) - 1u)));
      if (tie && rank < static_cast<uint32_t>(need)) {
        sh.cand_token[n_gt + static_cast<int>(rank)] = i;
        sh.cand_logit[n_gt + static_cast<int>(rank)] = v;
      }
      before += static_cast<uint32_t>(__popc(ballot));
    }
  }
  __syncthreads();

  // Rank sort: candidate j goes to the slot of how many candidates beat it (a total order, so a permutation).
  kernels::cpu::LogitsTopC* __restrict__ o = out + blockIdx.x;
  if (static_cast<int>(threadIdx.x) < kC) {
    const int j = threadIdx.x;
    if (j < count) {
      const uint32_t kj = key_of(sh.cand_logit[j]);
      const int32_t ij = sh.cand_token[j];
      int rank = 0;
      for (int q = 0; q < count; ++q)
        rank += better(key_of(sh.cand_logit[q]), sh.cand_token[q], kj, ij) ? 1 : 0;
      o->token[rank] = ij + id0;
      o->logit[rank] = sh.cand_logit[j];
    } else {
      o->token[j] = -1;
      o->logit[j] = -INFINITY;
    }
  }
  if (threadIdx.x == 0) {
    o->sum_exp = s1;
    o->sum_exp_t = st;
    o->max = m;
    o->nan_count = nans;
    o->count = count;
    o->reserved = 0;
  }
}

// Block per row, kThreads threads: the row's segs summaries (ws[r * segs ..]) into out[r]. The segments'
// candidates (at most kMaxSegments x C) are staged in shared memory with their scalars, and the row's top C
// is selected among them as in logits_topc_kernel: three histogram passes for the key K of the C-th best,
// then the candidates above K and the first ties equal to K in (segment, position) order, which is id order
// (segments cover ascending id ranges, and a segment lists equal keys by ascending id), and a rank sort.
constexpr int kMergeMax = kMaxSegments * kC;
static_assert(kMergeMax % kThreads == 0, "the candidates split evenly over the threads");
__global__ void __launch_bounds__(kThreads)
    logits_topc_merge_kernel(LogitsTopCParams p, int segs, const LogitsTopC* __restrict__ ws) {
  dev::grid_dep_enter();
  __shared__ Shared sh;
  __shared__ uint32_t s_key[kMergeMax];
  __shared__ int32_t s_tok[kMergeMax];
  __shared__ float s_logit[kMergeMax];
  __shared__ double s_sum[2][kMaxSegments];
  __shared__ float s_max[kMaxSegments];
  __shared__ int s_cnt[kMaxSegments], s_nan[kMaxSegments];
  __shared__ uint32_t s_ties;
  const int64_t r = blockIdx.x;
  const LogitsTopC* __restrict__ seg = ws + r * segs;
  LogitsTopC* __restrict__ o = p.out + r;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < segs) {
    s_cnt[tid] = seg[tid].count;
    s_nan[tid] = seg[tid].nan_count;
    s_max[tid] = seg[tid].max;
    s_sum[0][tid] = seg[tid].sum_exp;
    s_sum[1][tid] = seg[tid].sum_exp_t;
  }
  const int n = segs * kC;
  for (int idx = tid; idx < n; idx += kThreads) {
    const float v = seg[idx / kC].logit[idx % kC];
    s_logit[idx] = v;
    s_key[idx] = key_of(v);
    s_tok[idx] = seg[idx / kC].token[idx % kC];
  }
  __syncthreads();
  int total = 0;
  for (int q = 0; q < segs; ++q) total += s_cnt[q];
  const int count = min(total, kC);
  auto held = [&](int idx) { return idx < n && idx % kC < s_cnt[idx / kC]; };

  uint32_t prefix = 0, prefix_mask = 0;
  uint32_t k = static_cast<uint32_t>(count);
  for (int pass = 0; pass < 3; ++pass) {
    const int bits = pass < 2 ? 11 : 10;
    const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    const uint32_t mask = (1u << bits) - 1u;
    for (int b = tid; b < kMaxBins; b += kThreads) sh.hist[b] = 0;
    __syncthreads();
    for (int idx = tid; idx < n; idx += kThreads)
      if (held(idx) && (s_key[idx] & prefix_mask) == prefix)
        atomicAdd(&sh.hist[(s_key[idx] >> shift) & mask], 1u);
    __syncthreads();
    select_digit(sh, 1 << bits, k);
    prefix |= sh.digit << shift;
    prefix_mask |= mask << shift;
    k -= sh.above;
  }
  const uint32_t kk = prefix;
  const int need = static_cast<int>(k);
  const int n_gt = count - need;
  if (tid == 0) sh.n_gt = 0;
  __syncthreads();
  for (int idx = tid; idx < n; idx += kThreads) {
    if (held(idx) && s_key[idx] > kk) {
      const int slot = atomicAdd(&sh.n_gt, 1);
      sh.cand_token[slot] = s_tok[idx];
      sh.cand_logit[slot] = s_logit[idx];
    }
  }
  // Ties in index order, kThreads at a time.
  uint32_t before = 0;
  for (int base = 0; base < n && before < static_cast<uint32_t>(need); base += kThreads) {
    const int idx = base + tid;
    const uint32_t tie = held(idx) && s_key[idx] == kk ? 1u : 0u;
    const uint32_t incl = block_inclusive_scan(tie, sh);
    const uint32_t rank = before + incl - tie;
    if (tie && rank < static_cast<uint32_t>(need)) {
      sh.cand_token[n_gt + static_cast<int>(rank)] = s_tok[idx];
      sh.cand_logit[n_gt + static_cast<int>(rank)] = s_logit[idx];
    }
    if (tid == kThreads - 1) s_ties = incl;
    __syncthreads();
    before += s_ties;
  }
  __syncthreads();
  if (tid < kC) {
    const int j = tid;
    if (j < count) {
      const uint32_t kj = key_of(sh.cand_logit[j]);
      const int32_t ij = sh.cand_token[j];
      int rank = 0;
      for (int q = 0; q < count; ++q)
        rank += better(key_of(sh.cand_logit[q]), sh.cand_token[q], kj, ij) ? 1 : 0;
      o->token[rank] = ij;
      o->logit[rank] = sh.cand_logit[j];
    } else {
      o->token[j] = -1;
      o->logit[j] = -INFINITY;
    }
  }
  if (tid == 0) {
    const float t = p.temperature[r];
    const bool greedy = t < kernels::cpu::kLogitsTopCGreedyTemperature;
    const double inv_t = greedy ? 0.0 : 1.0 / static_cast<double>(t);
    float m = -INFINITY;
    int32_t nans = 0;
    for (int q = 0; q < segs; ++q) {
      m = fmaxf(m, s_max[q]);
      nans += s_nan[q];
    }
    double s1 = 0.0, st = 0.0;
    for (int q = 0; q < segs; ++q) {
      if (!(s_max[q] > -INFINITY)) continue;  // no finite entry: it adds nothing
      const double d = static_cast<double>(s_max[q]) - static_cast<double>(m);
      s1 += s_sum[0][q] * exp(d);
      if (!greedy) st += s_sum[1][q] * exp(d * inv_t);
    }
    o->sum_exp = s1;
    o->sum_exp_t = greedy ? 1.0 : st;
    o->max = m;
    o->nan_count = nans;
    o->count = count;
    o->reserved = 0;
  }
}

}  // namespace

size_t logits_topc_workspace_bytes(int64_t rows) {
  return static_cast<size_t>(rows > 0 ? rows : 0) * kMaxSegments * sizeof(LogitsTopC);
}

void logits_topc(const LogitsTopCParams& p, cudaStream_t stream, LogitsTopC* workspace,
                 int64_t workspace_rows) {
  MS_CHECK(p.rows >= 0 && p.rows <= 0x7fffffff, "logits_topc: rows = {} out of range", p.rows);
  MS_CHECK(p.vocab >= 1 && p.vocab <= 0x7fffff00, "logits_topc: vocab = {} out of range", p.vocab);
  if (p.rows == 0) return;
  MS_CHECK(p.logits != nullptr, "logits_topc: logits is null");
  MS_CHECK(p.temperature != nullptr, "logits_topc: temperature is null");
  MS_CHECK(p.out != nullptr, "logits_topc: out is null");
  MS_CHECK(p.stride >= p.vocab, "logits_topc: logits row stride {} is smaller than the vocabulary {}",
           p.stride, p.vocab);
  MS_CHECK(reinterpret_cast<uintptr_t>(p.out) % alignof(kernels::cpu::LogitsTopC) == 0,
           "logits_topc: out is not {}-byte aligned", alignof(kernels::cpu::LogitsTopC));
  const DeviceCaps caps = current_device_caps();
  check_smem(caps, "logits_topc", sizeof(Shared));
  // Segments: as many blocks as the GPU holds at once (one wave: a second, partial wave costs as long as the
  // first; at 64 rows on an H200 five segments a row took 153 us in two waves), each at least kMinSegment
  // ids.
  int segs = 1;
  if (workspace != nullptr && p.rows <= workspace_rows) {
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, logits_topc_kernel, kThreads, 0));
    const int64_t slots = static_cast<int64_t>(std::max(per_sm, 1)) * std::max(caps.multiprocessors, 1);
    const int64_t want = std::max<int64_t>(slots / p.rows, 1);
    const int64_t fit = std::max<int64_t>(p.vocab / kMinSegment, 1);
    segs = static_cast<int>(std::clamp<int64_t>(std::min(want, fit), 1, kMaxSegments));
  }
  const int seg_len = static_cast<int>((p.vocab + segs - 1) / segs);
  MS_CHECK(p.rows * segs <= 0x7fffffff, "logits_topc: {} rows x {} segments is too many blocks", p.rows,
           segs);
  if (segs == 1) {
    launch_kernel("logits_topc", logits_topc_kernel, static_cast<unsigned>(p.rows), kThreads, 0, stream, p, 1,
                  seg_len, p.out);
    return;
  }
  MS_CHECK(reinterpret_cast<uintptr_t>(workspace) % alignof(LogitsTopC) == 0,
           "logits_topc: workspace is not {}-byte aligned", alignof(LogitsTopC));
  launch_kernel("logits_topc", logits_topc_kernel, static_cast<unsigned>(p.rows * segs), kThreads, 0, stream,
                p, segs, seg_len, workspace);
  launch_kernel("logits_topc_merge", logits_topc_merge_kernel, static_cast<unsigned>(p.rows), kThreads, 0,
                stream, p, segs, static_cast<const LogitsTopC*>(workspace));
}

}  // namespace ms::cuda
