#include "kernels/cpu/linear.h"

// GCC 12 reports the intrinsics' own _mm512_undefined_* placeholders as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kernels/cpu/cpu_features.h"

namespace ms::kernels::cpu {

namespace {

// ---- Reference path: any format, weight rows dequantised a tile at a time --------------------------------

constexpr int kTile = 4;  // weight rows dequantised together; each x row is then read once per tile

// Per-thread f32 rows; grows only, so steady-state steps allocate nothing.
float* tile_buffer(int64_t floats) {
  static thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(static_cast<size_t>(floats));
  return buf.data();
}

void linear_tile_ref(const LinearParams& p, int64_t t) {
  const int64_t k = p.w.cols;
  float* wbuf = tile_buffer(kTile * k);
  const int64_t j0 = t * kTile;
  const int rows = static_cast<int>(p.n - j0 < kTile ? p.n - j0 : kTile);
  for (int r = 0; r < rows; ++r) dequantize_row(p.w, p.row0 + j0 + r, wbuf + r * k);
  for (int r = rows; r < kTile; ++r)
    for (int64_t c = 0; c < k; ++c) wbuf[r * k + c] = 0.0f;
  const float* w0 = wbuf;
  const float* w1 = wbuf + k;
  const float* w2 = wbuf + 2 * k;
  const float* w3 = wbuf + 3 * k;
  for (int64_t i = 0; i < p.m; ++i) {
    const float* x = p.x + i * p.x_stride;
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int64_t c = 0; c < k; ++c) {
      const float xv = x[c];
      s0 += w0[c] * xv;
      s1 += w1[c] * xv;
      s2 += w2[c] * xv;
      s3 += w3[c] * xv;
    }
    float* y = p.y + i * p.y_stride + j0;
    const float s[kTile] = {s0, s1, s2, s3};
    for (int r = 0; r < rows; ++r) y[r] = s[r];
  }
}

// ---- BF16 weights, f32 activations: register-blocked micro-kernels ---------------------------------------
//
// A micro-kernel computes an R x T block of y (R weight rows, T token rows) over the whole k: per 16 (8 for
// AVX2) columns it widens R weight vectors from bf16 to f32 once (a zero-extend and a shift, exact) and
// feeds them to R x T FMAs, so each weight byte is loaded once per T tokens and each x vector once per R
// rows. Accumulation stays f32 with f32 activations, as in the reference; only the summation order differs.
// Weight rows of one R-tile stay in L1 (R x k x 2 bytes) while the token blocks of a batch walk over them.
// Every kernel sums a row in the same order (lane j takes columns j, j + 16, ..., then one horizontal sum),
// so a token's result does not depend on how many tokens share the call (an expert's token count changes with
// other sequences' routing; tests compare such rows bit for bit).

#define MS_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define MS_AVX2_TARGET __attribute__((target("avx2,fma")))

// Sixteen horizontal sums at once, each bit-identical to _mm512_reduce_add_ps of its vector: that reduction
// halves the vector four times (lane i + lane i + 8, then i + 4, i + 2, i + 1), and so does this transposed
// version, only on two vectors per shuffle. Output lane 4j + i holds the sum of v[j + 4i] (each level pairs
// vectors, so the lanes come out in that interleaved order); callers pass their accumulators permuted so
// that lane l ends up holding accumulator l. One vector of sums costs ~45 shuffles and adds instead of ~130.
MS_AVX512_TARGET inline __m512 reduce16_avx512(const __m512* v) {
  __m512 l1[8];
  for (int p = 0; p < 8; ++p) {
    const __m512 a = v[2 * p], b = v[2 * p + 1];
    l1[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)),
                          _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)));
  }
  __m512 l2[4];
  for (int q = 0; q < 4; ++q) {
    const __m512 a = l1[2 * q], b = l1[2 * q + 1];
    l2[q] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)),
                          _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
  }
  __m512 l3[2];
  for (int r = 0; r < 2; ++r) {
    const __m512 a = l2[2 * r], b = l2[2 * r + 1];
    l3[r] = _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)),
                          _mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)));
  }
  return _mm512_add_ps(_mm512_shuffle_ps(l3[0], l3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(l3[0], l3[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// acc[R][T] (R x T == 16) summed into y[t * ldy + r] for r < rows, through reduce16_avx512.
template <int R, int T>
MS_AVX512_TARGET inline void store_sums16(const __m512 (&acc)[R][T], float* __restrict__ y, int64_t ldy,
                                          int rows) {
  static_assert(R * T == 16);
  __m512 v[16];
  for (int s = 0; s < 16; ++s) {
    const int idx = (s % 4) * 4 + s / 4;  // lane idx of the result
    v[s] = acc[idx / T][idx % T];
  }
  alignas(64) float sums[16];
  _mm512_store_ps(sums, reduce16_avx512(v));
  for (int idx = 0; idx < 16; ++idx)
    if (idx / T < rows) y[(idx % T) * ldy + idx / T] = sums[idx];
}

// `next`, when set, is the block of the tile after this one (R rows, contiguous): each 16-column step
// requests R x 32 bytes of it, as gemv_bf16_avx512 does (small batches stream their weights from memory too).
template <int R, int T>
MS_AVX512_TARGET inline void mk_bf16_avx512(const uint16_t* __restrict__ w, int64_t ldw,
                                            const float* __restrict__ x, int64_t ldx, int64_t k,
                                            float* __restrict__ y, int64_t ldy, int rows,
                                            const char* next = nullptr) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  constexpr int kStepBytes = R * 32;
  int64_t c = 0;
  for (; c + 16 <= k; c += 16) {
    if (next != nullptr)
      for (int l = 0; l < kStepBytes; l += 64) _mm_prefetch(next + (c / 16) * kStepBytes + l, _MM_HINT_T0);
    __m512 wv[R];
    for (int r = 0; r < R; ++r) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * ldw + c));
      wv[r] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_loadu_ps(x + t * ldx + c);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  if (c < k) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (k - c)) - 1u);
    __m512 wv[R];
    for (int r = 0; r < R; ++r) {
      const __m256i h = _mm256_maskz_loadu_epi16(mask, w + r * ldw + c);
      wv[r] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + t * ldx + c);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  if constexpr (R * T == 16) {
    store_sums16<R, T>(acc, y, ldy, rows);
  } else {
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < rows; ++r) y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
  }
}

// Batch of one on AVX-512: the R x 1 kernel above, plus a prefetch of the next tile. A tile's R rows are one
// contiguous block (R x k x 2 bytes) read as R short streams; each 16-column step also prefetches
// R x 32 bytes of the next tile, so the whole next block is requested exactly one tile ahead, sequentially,
// instead of the hardware prefetcher relearning R new streams per tile. Same sums in the same order as
// mk_bf16_avx512<R, 1>.
template <int R>
MS_AVX512_TARGET inline void gemv_bf16_avx512(const uint16_t* __restrict__ w, int64_t ldw,
                                              const float* __restrict__ x, int64_t k, float* __restrict__ y,
                                              int rows, const char* next) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  constexpr int kStepBytes = R * 32;  // the next tile's bytes per 16-column step
  int64_t c = 0;
  for (; c + 16 <= k; c += 16) {
    if (next != nullptr)
      for (int l = 0; l < kStepBytes; l += 64) _mm_prefetch(next + (c / 16) * kStepBytes + l, _MM_HINT_T0);
    const __m512 xv = _mm512_loadu_ps(x + c);
    for (int r = 0; r < R; ++r) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * ldw + c));
      acc[r] =
          _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)), xv, acc[r]);
    }
  }
  if (c < k) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (k - c)) - 1u);
    const __m512 xv = _mm512_maskz_loadu_ps(mask, x + c);
    for (int r = 0; r < R; ++r) {
      const __m256i h = _mm256_maskz_loadu_epi16(mask, w + r * ldw + c);
      acc[r] =
          _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)), xv, acc[r]);
    }
  }
  if constexpr (R == 16) {
    __m512 v[16];
    for (int s = 0; s < 16; ++s) v[s] = acc[(s % 4) * 4 + s / 4];
    _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << rows) - 1u), reduce16_avx512(v));
  } else {
    for (int r = 0; r < rows; ++r) y[r] = _mm512_reduce_add_ps(acc[r]);
  }
}

MS_AVX2_TARGET inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int R, int T>
MS_AVX2_TARGET inline void mk_bf16_avx2(const uint16_t* __restrict__ w, int64_t ldw,
                                        const float* __restrict__ x, int64_t ldx, int64_t k,
                                        float* __restrict__ y, int64_t ldy, int rows) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= k; c += 8) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + r * ldw + c));
      wv[r] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + t * ldx + c);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  float s[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) s[r][t] = hsum256(acc[r][t]);
  for (; c < k; ++c)
    for (int r = 0; r < R; ++r) {
      const float wf = __builtin_bit_cast(float, static_cast<uint32_t>(w[r * ldw + c]) << 16);
      for (int t = 0; t < T; ++t) s[r][t] += wf * x[t * ldx + c];
    }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < rows; ++r) y[t * ldy + r] = s[r][t];
}

using MicroKernel = void (*)(const uint16_t*, int64_t, const float*, int64_t, int64_t, float*, int64_t, int);

// Tables indexed by T - 1. A batch of one uses 8 rows per pass (8 independent FMA chains and 8 weight
// streams in flight); batches use 4 rows x up to 4 tokens (16 accumulators, within the 32 / 16 registers).
constexpr int kRowsM1 = 8;
// A batch of one with short bf16 rows (k <= kShortK, e.g. an expert's down projection, k = 128) takes 16 rows
// per tile on AVX-512: the per-tile cost (a call chain, a pad check, the horizontal sums) is paid once per 16
// rows, and the 16 sums come out of one transposed reduction, bit-identical to 16 single ones.
constexpr int kRowsM1Short = 16;
constexpr int64_t kShortK = 256;
constexpr int kRowsMT = 4;
constexpr int kTokens = 4;
constexpr int kRowsWide = 2;    // batches of 8+ tokens: 2 rows x 8 tokens, each widened weight vector feeds 8
constexpr int kTokensWide = 8;  // FMAs (the widening, a shuffle and a shift, is what bounds the 4 x 4 kernel)
// Batches of 8+ tokens take tiles of this many weight rows (32 x k x 2 bytes: 64 KB at k = 1024, in L2) and
// walk them once per block of 8 tokens (8 x k x 4 bytes of x, in L1): x is then read from L1 by the 2 x 8
// kernel instead of from L2 (each 2-row tile used to walk the whole batch's x), and each weight row is read
// once from memory per call. The same micro-kernels in the same summation order, so the sums are unchanged.
constexpr int kRowsChunk = 32;

struct Bf16Kernels {
  MicroKernel m1;           // R = kRowsM1, T = 1
  MicroKernel mt[kTokens];  // R = kRowsMT, T = 1..kTokens
  MicroKernel wide;         // R = kRowsWide, T = kTokensWide
};

const Bf16Kernels kAvx512 = {
    [](const uint16_t* w, int64_t ldw, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy,
       int rows) { mk_bf16_avx512<kRowsM1, 1>(w, ldw, x, ldx, k, y, ldy, rows); },
    {[](const uint16_t* w, int64_t ldw, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy,
        int rows) { mk_bf16_avx512<kRowsMT, 1>(w, ldw, x, ldx, k, y, ldy, rows); },
     [](const uint16_t* w, int64_t ldw, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy,
        int rows) { mk_bf16_avx512<kRowsMT, 2>(w, ldw, x, ldx, k, y, ldy, rows); },
     [](const uint16_t* w, int64_t ldw, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy,
        int rows) { mk_bf16_avx512<kRowsMT, 3>(w, ldw, x, ldx, k, y, ldy, rows); },
     [](const uint16_t* w, int64_t ldw, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy,
        int rows) { mk_bf16_avx512<kRowsMT, 4>(w, ldw, x, ldx, k, y, ldy, rows); }},
    [](const uint16_t* w, int64_t ldw, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy,
       int rows) { mk_bf16_avx512<kRowsWide, kTokensWide>(w, ldw, x, ldx, k, y, ldy, rows); }};

const Bf16Kernels kAvx2 = {
    [](const uint16_t* w, int64_t ldw, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy,
       int rows) { mk_bf16_avx2<kRowsM1, 1>(w, ldw, x, ldx, k, y, ldy, rows); },
    {[](const uint16_t* w, int64_t ldw, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy,
        int rows) { mk_bf16_avx2<kRowsMT, 1>(w, ldw, x, ldx, k, y, ldy, rows); },
     [](const uint16_t* w, int64_t ldw, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy,
        int rows) { mk_bf16_avx2<kRowsMT, 2>(w, ldw, x, ldx, k, y, ldy, rows); },
     [](const uint16_t* w, int64_t ldw, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy,
        int rows) { mk_bf16_avx2<kRowsMT, 3>(w, ldw, x, ldx, k, y, ldy, rows); },
     [](const uint16_t* w, int64_t ldw, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy,
        int rows) { mk_bf16_avx2<kRowsMT, 4>(w, ldw, x, ldx, k, y, ldy, rows); }},
    [](const uint16_t* w, int64_t ldw, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy,
       int rows) { mk_bf16_avx2<kRowsWide, kTokensWide>(w, ldw, x, ldx, k, y, ldy, rows); }};

const Bf16Kernels* bf16_kernels() {
  switch (linear_isa()) {
    case LinearIsa::Avx512:
      return &kAvx512;
    case LinearIsa::Avx2:
      return &kAvx2;
    case LinearIsa::Reference:
      break;
  }
  return nullptr;
}

// y rows [j0, j0 + rows) for all m tokens, rows = min(R, n - j0).
void bf16_tile(const Bf16Kernels& kern, const LinearParams& p, int64_t j0, int R, MicroKernel m1) {
  const int64_t k = p.w.cols;
  const int rows = static_cast<int>(p.n - j0 < R ? p.n - j0 : R);
  const uint16_t* base = static_cast<const uint16_t*>(p.w.data) + (p.row0 + j0) * k;
  // Weight rows the kernels read: R, or 4 when a 2-row wide tile also runs the 4-row kernels on the batch's
  // leftover tokens (the extra rows' sums are dropped). Past the matrix end they come from a copy padded with
  // the last valid row, so no read leaves the matrix.
  const int need = R;
  const uint16_t* w = base;
  if (p.w.rows - (p.row0 + j0) < need) {
    static thread_local std::vector<uint16_t> pad;
    pad.resize(static_cast<size_t>(need * k));
    for (int r = 0; r < need; ++r) {
      const uint16_t* src = base + (r < rows ? r : rows - 1) * k;
      std::copy(src, src + k, pad.begin() + r * k);
    }
    w = pad.data();
  }
  if (p.m == 1) {
    if (&kern == &kAvx512) {
      // The next tile's block, when it lies inside the matrix (a prefetch past it would be harmless but
      // useless).
      const bool has_next = p.row0 + j0 + 2 * R <= p.w.rows && j0 + R < p.n;
      const char* nx = has_next ? reinterpret_cast<const char*>(base + R * k) : nullptr;
      if (R == kRowsM1Short)
        gemv_bf16_avx512<kRowsM1Short>(w, k, p.x, k, p.y + j0, rows, nx);
      else
        gemv_bf16_avx512<kRowsM1>(w, k, p.x, k, p.y + j0, rows, nx);
    } else {
      m1(w, k, p.x, p.x_stride, k, p.y + j0, p.y_stride, rows);
    }
    return;
  }
  int64_t i = 0;
  // The first token block also requests the next chunk into L2, two rows per kernel call (the pair it will
  // read there), so the chunk after this one does not start on cold memory: an expert's matrix is streamed
  // from memory once per call and each chunk is worth only ~8-16 tokens of arithmetic.
  const bool prefetch_next = R == kRowsChunk && p.row0 + j0 + 2 * R <= p.w.rows && j0 + R < p.n;
  if (R == kRowsChunk)
    for (; i + kTokensWide <= p.m; i += kTokensWide)
      for (int r0 = 0; r0 < rows; r0 += kRowsWide) {
        if (i == 0 && prefetch_next) {
          const char* nx = reinterpret_cast<const char*>(base + (R + r0) * k);
          for (int64_t b = 0; b < kRowsWide * k * 2; b += 64) _mm_prefetch(nx + b, _MM_HINT_T1);
        }
        kern.wide(w + r0 * k, k, p.x + i * p.x_stride, p.x_stride, k, p.y + i * p.y_stride + j0 + r0,
                  p.y_stride, rows - r0 < kRowsWide ? rows - r0 : kRowsWide);
      }
  // Leftover tokens (fewer than 8) of a chunk tile, or a whole batch of 2..7: 4-row kernels. A batch of 2..7
  // on AVX-512 requests the next tile's block during its first token pass.
  if (R == kRowsMT && &kern == &kAvx512 && p.row0 + j0 + 2 * R <= p.w.rows && j0 + R < p.n) {
    const char* nx = reinterpret_cast<const char*>(base + R * k);
    const int tok = static_cast<int>(p.m < kTokens ? p.m : kTokens);
    const float* x = p.x;
    float* y = p.y + j0;
    switch (tok) {
      case 2:
        mk_bf16_avx512<kRowsMT, 2>(w, k, x, p.x_stride, k, y, p.y_stride, rows, nx);
        break;
      case 3:
        mk_bf16_avx512<kRowsMT, 3>(w, k, x, p.x_stride, k, y, p.y_stride, rows, nx);
        break;
      default:
        mk_bf16_avx512<kRowsMT, 4>(w, k, x, p.x_stride, k, y, p.y_stride, rows, nx);
        break;
    }
    i = tok;
  }
  for (int64_t ii = i; ii < p.m; ii += kTokens) {
    const int tok = static_cast<int>(p.m - ii < kTokens ? p.m - ii : kTokens);
    for (int r0 = 0; r0 < rows; r0 += kRowsMT)
      kern.mt[tok - 1](w + r0 * k, k, p.x + ii * p.x_stride, p.x_stride, k, p.y + ii * p.y_stride + j0 + r0,
                       p.y_stride, rows - r0 < kRowsMT ? rows - r0 : kRowsMT);
  }
}

// ---- FP8 (e4m3) weights with 128x128 block scales, f32 activations, AVX-512 ----------------------------
//
// The checkpoint's FP8 kept as is: one byte per weight, half the bytes of bf16. A byte becomes an f16 with
// two integer ops and then f32 with the hardware conversion, exactly: sign-extended to 16 bits and shifted
// left by 7, its exponent and mantissa bits land in f16's exponent and mantissa fields and its sign in bits
// 15 and 14; clearing bit 14 leaves the f16 whose value is the e4m3 value times 2^-8 (the bias difference
// 15 - 7; subnormals map to subnormals). The 2^8 is folded into the block scale. That is four vector ops
// per 16 weights before the scale, against six for the bit moves straight to f32 used before. R rows x T
// tokens per pass as for bf16; each widened weight vector is multiplied by its block's scale once and then
// feeds T FMAs.

#define MS_AVX512_F16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c,fma")))

MS_AVX512_F16_TARGET inline __m512 fp8_to_f32(__m128i raw) {
  const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(raw), 7),
                                     _mm256_set1_epi16(static_cast<short>(0xbf80)));
  return _mm512_cvtph_ps(h);
}

// Widened weights are not scaled: the activations are, y_r = sum_c w[r, c] * (x[c] * s(r, c)), with x[c] *
// s computed once per 16 columns when all R rows of the tile share the block scale (the usual case: tiles of
// 4 or 8 rows inside 128-row blocks) and per row otherwise, the same product either way, so a row's sums do
// not depend on its tile. Columns go 32 at a time (one sign-extend, shift and mask for 32 weights), each
// half into the same accumulator in turn, which is the order of 16-column steps; block tails take 16.
template <int R, int T>
MS_AVX512_F16_TARGET inline void mk_fp8_avx512(const uint8_t* __restrict__ w, int64_t ldw,
                                               const float* const* __restrict__ srow, int block,
                                               const float* __restrict__ x, int64_t ldx, int64_t k,
                                               float* __restrict__ y, int64_t ldy, int rows,
                                               const char* next) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  constexpr float kBias = 0x1p8f;
  constexpr int kStepBytes = R * 32;  // the next tile's bytes per 32-column step (see gemv_bf16_avx512)
  const __m512i f16_mask = _mm512_set1_epi16(static_cast<short>(0xbf80));
  for (int64_t c0 = 0; c0 < k; c0 += block) {
    const int64_t c1 = c0 + block < k ? c0 + block : k;
    const int64_t cb = c0 / block;
    float sc[R];
    bool shared = true;
    for (int r = 0; r < R; ++r) {
      sc[r] = srow[r][cb] * kBias;
      shared = shared && sc[r] == sc[0];
    }
    // acc[r][t] += wv * x_t[c..c+16) * sc[r]
    const auto step16 = [&](const __m512* wv, int64_t c, __mmask16 mask, bool full) MS_AVX512_F16_TARGET {
      for (int t = 0; t < T; ++t) {
        const __m512 xv =
            full ? _mm512_loadu_ps(x + t * ldx + c) : _mm512_maskz_loadu_ps(mask, x + t * ldx + c);
        if (shared) {
          const __m512 xs = _mm512_mul_ps(xv, _mm512_set1_ps(sc[0]));
          for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xs, acc[r][t]);
        } else {
          for (int r = 0; r < R; ++r)
            acc[r][t] = _mm512_fmadd_ps(wv[r], _mm512_mul_ps(xv, _mm512_set1_ps(sc[r])), acc[r][t]);
        }
      }
    };
    int64_t c = c0;
    for (; c + 32 <= c1; c += 32) {
      if (next != nullptr)
        for (int l = 0; l < kStepBytes; l += 64) _mm_prefetch(next + (c / 32) * kStepBytes + l, _MM_HINT_T0);
      __m512 lo[R], hi[R];
      for (int r = 0; r < R; ++r) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * ldw + c));
        const __m512i h = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(raw), 7), f16_mask);
        lo[r] = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
        hi[r] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
      }
      step16(lo, c, 0xffff, true);
      step16(hi, c + 16, 0xffff, true);
    }
    for (; c < c1; c += 16) {
      // Full vectors load unmasked: a masked byte load in the main loop cost 5x the time on this kernel.
      const bool full = c1 - c >= 16;
      const __mmask16 mask =
          full ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (c1 - c)) - 1u);
      __m512 wv[R];
      for (int r = 0; r < R; ++r) {
        const __m128i raw = full ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + r * ldw + c))
                                 : _mm_maskz_loadu_epi8(mask, w + r * ldw + c);
        wv[r] = fp8_to_f32(raw);
      }
      step16(wv, c, mask, full);
    }
  }
  if constexpr (R * T == 16) {
    store_sums16<R, T>(acc, y, ldy, rows);
  } else {
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < rows; ++r) y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
  }
}

using Fp8Kernel = void (*)(const uint8_t*, int64_t, const float* const*, int, const float*, int64_t, int64_t,
                           float*, int64_t, int, const char*);
#define MS_FP8_KERNEL(R, T)                                                                                  \
  [](const uint8_t* w, int64_t ldw, const float* const* sr, int blk, const float* x, int64_t ldx, int64_t k, \
     float* y, int64_t ldy, int rows,                                                                        \
     const char* next) { mk_fp8_avx512<R, T>(w, ldw, sr, blk, x, ldx, k, y, ldy, rows, next); }
const Fp8Kernel kFp8M1 = MS_FP8_KERNEL(kRowsM1, 1);
const Fp8Kernel kFp8Mt[kTokens] = {MS_FP8_KERNEL(kRowsMT, 1), MS_FP8_KERNEL(kRowsMT, 2),
                                   MS_FP8_KERNEL(kRowsMT, 3), MS_FP8_KERNEL(kRowsMT, 4)};
#undef MS_FP8_KERNEL

// y rows [j0, j0 + min(R, n - j0)) for all m tokens. Rows past the tile's end alias its last valid row (their
// sums are dropped), so no read leaves the matrix.
void fp8_tile(const LinearParams& p, int64_t j0, int R) {
  const int64_t k = p.w.cols;
  const int rows = static_cast<int>(p.n - j0 < R ? p.n - j0 : R);
  const int64_t scale_cols = (k + p.w.block - 1) / p.w.block;
  const uint8_t* wbase = static_cast<const uint8_t*>(p.w.data);
  const float* scales = static_cast<const float*>(p.w.scale);
  const uint8_t* w = wbase + (p.row0 + j0) * k;
  const float* srow[kRowsM1];
  for (int r = 0; r < R; ++r)
    srow[r] = scales + ((p.row0 + j0 + (r < rows ? r : rows - 1)) / p.w.block) * scale_cols;
  if (rows < R) {
    static thread_local std::vector<uint8_t> pad;
    pad.resize(static_cast<size_t>(R * k));
    for (int r = 0; r < R; ++r) {
      const uint8_t* src = w + (r < rows ? r : rows - 1) * k;
      std::copy(src, src + k, pad.begin() + r * k);
    }
    w = pad.data();
  }
  if (p.m == 1) {
    // The next tile's block (R x k bytes, contiguous) requested one tile ahead, as for bf16.
    const bool has_next = p.row0 + j0 + 2 * R <= p.w.rows && j0 + R < p.n;
    kFp8M1(w, k, srow, p.w.block, p.x, p.x_stride, k, p.y + j0, p.y_stride, rows,
           has_next ? reinterpret_cast<const char*>(wbase + (p.row0 + j0 + R) * k) : nullptr);
    return;
  }
  for (int64_t i = 0; i < p.m; i += kTokens) {
    const int tok = static_cast<int>(p.m - i < kTokens ? p.m - i : kTokens);
    kFp8Mt[tok - 1](w, k, srow, p.w.block, p.x + i * p.x_stride, p.x_stride, k, p.y + i * p.y_stride + j0,
                    p.y_stride, rows, nullptr);
  }
}

// Below this many weight bytes the op runs on the calling thread: a fork/join costs more than it saves.
constexpr double kParallelBytes = 96.0 * 1024;

}  // namespace

namespace {

enum class Path : uint8_t { Fp8, Bf16, Reference };

struct Plan {
  Path path;
  int rows;                 // output rows per tile
  const Bf16Kernels* kern;  // Bf16 only
};

Plan plan(const LinearParams& p) {
  static const bool f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
  if (p.w.format == WeightFormat::FP8Block && linear_isa() == LinearIsa::Avx512 && f16c &&
      p.w.block % 16 == 0)
    return {Path::Fp8, p.m == 1 ? kRowsM1 : kRowsMT, nullptr};
  if (const Bf16Kernels* kern = p.w.format == WeightFormat::BF16 ? bf16_kernels() : nullptr)
    return {Path::Bf16,
            p.m == 1             ? (kern == &kAvx512 && p.w.cols <= kShortK ? kRowsM1Short : kRowsM1)
            : p.m >= kTokensWide ? kRowsChunk
                                 : kRowsMT,
            kern};
  return {Path::Reference, kTile, nullptr};
}

void run_tile(const Plan& pl, const LinearParams& p, int64_t t) {
  switch (pl.path) {
    case Path::Fp8:
      fp8_tile(p, t * pl.rows, pl.rows);
      return;
    case Path::Bf16:
      bf16_tile(*pl.kern, p, t * pl.rows, pl.rows, pl.kern->m1);
      return;
    case Path::Reference:
      linear_tile_ref(p, t);
      return;
  }
}

}  // namespace

int64_t linear_tiles(const LinearParams& p) {
  const int rows = plan(p).rows;
  return (p.n + rows - 1) / rows;
}

int linear_tile_rows(const LinearParams& p) {
  return plan(p).rows;
}

void linear_tile(const LinearParams& p, int64_t t) {
  run_tile(plan(p), p, t);
}

void linear_prefetch_tile(const LinearParams& p, int64_t t) {
  const int rows = plan(p).rows;
  const int64_t r0 = p.row0 + t * rows;
  const int64_t r1 = std::min(r0 + rows, p.row0 + p.n);
  if (r0 >= r1 || p.w.data == nullptr) return;
  double bytes_per_weight = 4.0;
  switch (p.w.format) {
    case WeightFormat::BF16:
      bytes_per_weight = 2.0;
      break;
    case WeightFormat::FP8Block:
      bytes_per_weight = 1.0;
      break;
    case WeightFormat::NVFP4:
      bytes_per_weight = 0.5;
      break;
    case WeightFormat::F32:
      break;
  }
  const auto row_bytes = static_cast<int64_t>(static_cast<double>(p.w.cols) * bytes_per_weight);
  const char* b = static_cast<const char*>(p.w.data) + r0 * row_bytes;
  const int64_t len = (r1 - r0) * row_bytes;
  for (int64_t off = 0; off < len; off += 64) _mm_prefetch(b + off, _MM_HINT_T1);
}

void linear(const LinearParams& p) {
  const bool parallel = 2.0 * static_cast<double>(p.n) * static_cast<double>(p.w.cols) *
                            static_cast<double>(p.m < kTokens ? 1 : (p.m + kTokens - 1) / kTokens) >=
                        kParallelBytes;
  const Plan pl = plan(p);
  const int64_t tiles = (p.n + pl.rows - 1) / pl.rows;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < tiles; ++t) run_tile(pl, p, t);
}

}  // namespace ms::kernels::cpu
