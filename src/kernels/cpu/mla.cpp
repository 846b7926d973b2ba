#include "kernels/cpu/mla.h"

#include "kernels/cpu/linear.h"

#include <omp.h>

// GCC 12 reports the intrinsics' own placeholders as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_features.h"

namespace ms::kernels::cpu {

namespace {
// scores[h * ld] = scale * (q[h] . row) for hn <= 8 heads (q rows w apart) over w columns, AVX-512: one
// pass over the row for all heads, each head its own accumulator (lane j takes columns j, j + 16, ..., then
// one horizontal sum). The per-head `omp simd` reduction it replaces summed its 16 lanes one by one.
// HN heads at once (a compile-time count, so the accumulators stay in registers).
template <int HN>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))) void scores_avx512(
    const float* __restrict__ q, int64_t w, const float* __restrict__ row, float scale,
    float* __restrict__ scores, int64_t ld) {
  __m512 acc[HN];
  for (int h = 0; h < HN; ++h) acc[h] = _mm512_setzero_ps();
  for (int64_t c = 0; c < w; c += 16) {
    const __mmask16 mask =
        w - c >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (w - c)) - 1u);
    const __m512 rv = _mm512_maskz_loadu_ps(mask, row + c);
    for (int h = 0; h < HN; ++h)
      acc[h] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, q + h * w + c), rv, acc[h]);
  }
  for (int h = 0; h < HN; ++h) scores[h * ld] = _mm512_reduce_add_ps(acc[h]) * scale;
}

// dst[0, r) = sum over d < nope of a[d] * w[d * r + c] (bf16 rows), AVX-512: 128 columns (8 accumulators) at
// a time held in registers over all d, in ascending d as the row-by-row loop adds them, instead of a load and
// a store of dst per row.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))) void absorb_bf16_avx512(
    const float* __restrict__ a, int64_t nope, const uint16_t* __restrict__ w, int64_t r,
    float* __restrict__ dst) {
  for (int64_t c0 = 0; c0 < r; c0 += 128) {
    const bool full = c0 + 128 <= r;
    __m512 acc[8];
    __mmask16 mask[8];
    for (int v = 0; v < 8; ++v) {
      acc[v] = _mm512_setzero_ps();
      const int64_t left = r - c0 - 16 * v;
      mask[v] = left >= 16  ? static_cast<__mmask16>(0xffff)
                : left <= 0 ? static_cast<__mmask16>(0)
                            : static_cast<__mmask16>((1u << left) - 1u);
    }
    for (int64_t d = 0; d < nope; ++d) {
      const __m512 av = _mm512_set1_ps(a[d]);
      const uint16_t* row = w + d * r + c0;
      for (int v = 0; v < 8; ++v) {
        // Unmasked where the vector is whole: masked loads in the main loop are several times slower here.
        const __m256i h = full ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16 * v))
                               : _mm256_maskz_loadu_epi16(mask[v], row + 16 * v);
        acc[v] =
            _mm512_fmadd_ps(av, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)), acc[v]);
      }
    }
    for (int v = 0; v < 8; ++v) _mm512_mask_storeu_ps(dst + c0 + 16 * v, mask[v], acc[v]);
  }
}

// lat[h][0, r) = sum over the visible keys kk (ascending) of probs[h * ld + kk] * row_kk[0, r), for HN heads,
// reading the bf16 cache rows in place (widened in registers): 32 columns x HN heads of accumulators stay in
// registers over all keys, where the row-by-row loop loaded and stored every head's lat row per key.
// slots[kk] < 0 marks a key that is not visible.
template <int HN>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))) void weighted_rows_bf16_avx512(
    const float* __restrict__ probs, int64_t ld, const int64_t* __restrict__ slots, int64_t n_keys,
    const uint16_t* __restrict__ cache, int64_t width, int64_t r, float* __restrict__ lat, int64_t lat_ld) {
  for (int64_t c0 = 0; c0 < r; c0 += 32) {
    const int64_t left = r - c0;
    const __mmask16 m0 =
        left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
    const __mmask16 m1 = left >= 32   ? static_cast<__mmask16>(0xffff)
                         : left <= 16 ? static_cast<__mmask16>(0)
                                      : static_cast<__mmask16>((1u << (left - 16)) - 1u);
    const bool full = left >= 32;
    __m512 acc[HN][2];
    for (int h = 0; h < HN; ++h) acc[h][0] = acc[h][1] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < n_keys; ++kk) {
      if (slots[kk] < 0) continue;
      const uint16_t* src = cache + slots[kk] * width + c0;
      const __m256i b0 = full ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))
                              : _mm256_maskz_loadu_epi16(m0, src);
      const __m256i b1 = full ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 16))
                              : _mm256_maskz_loadu_epi16(m1, src + 16);
      const __m512 r0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b0), 16));
      const __m512 r1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b1), 16));
      for (int h = 0; h < HN; ++h) {
        const __m512 pv = _mm512_set1_ps(probs[h * ld + kk]);
        acc[h][0] = _mm512_fmadd_ps(pv, r0, acc[h][0]);
        acc[h][1] = _mm512_fmadd_ps(pv, r1, acc[h][1]);
      }
    }
    for (int h = 0; h < HN; ++h) {
      _mm512_mask_storeu_ps(lat + h * lat_ld + c0, m0, acc[h][0]);
      _mm512_mask_storeu_ps(lat + h * lat_ld + c0 + 16, m1, acc[h][1]);
    }
  }
}

float* row_buffer(int64_t floats) {
  static thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(static_cast<size_t>(floats));
  return buf.data();
}
}  // namespace

void mla_absorb_q(const MlaAbsorbQParams& p) {
  const int64_t r = p.kv_lora_rank, qd = p.nope + p.rope, w = r + p.rope;
  if (p.kv_b.format == WeightFormat::BF16 && linear_isa() == LinearIsa::Avx512) {
#pragma omp parallel for schedule(static)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.m; ++i) {
        float* dst = p.q_cat + (i * p.heads + h) * w;
        const float* src = p.q + (i * p.heads + h) * qd;
        absorb_bf16_avx512(src, p.nope, static_cast<const uint16_t*>(p.kv_b.data) + h * (p.nope + p.v) * r, r,
                           dst);
        for (int64_t c = 0; c < p.rope; ++c) dst[r + c] = src[p.nope + c];
      }
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t h = 0; h < p.heads; ++h) {
    float* wrow = row_buffer(r);
    for (int64_t i = 0; i < p.m; ++i) {
      float* dst = p.q_cat + (i * p.heads + h) * w;
      for (int64_t c = 0; c < r; ++c) dst[c] = 0.0f;
      const float* src = p.q + (i * p.heads + h) * qd;
      for (int64_t c = 0; c < p.rope; ++c) dst[r + c] = src[p.nope + c];
    }
    for (int64_t d = 0; d < p.nope; ++d) {
      const int64_t wr = h * (p.nope + p.v) + d;
      if (p.kv_b.format == WeightFormat::BF16) {
        // bf16 rows widen inside the loop (a shift), not through a dequantised copy.
        const uint16_t* wb = static_cast<const uint16_t*>(p.kv_b.data) + wr * r;
        for (int64_t i = 0; i < p.m; ++i) {
          const float a = p.q[(i * p.heads + h) * qd + d];
          float* dst = p.q_cat + (i * p.heads + h) * w;
#pragma omp simd
          for (int64_t c = 0; c < r; ++c)
            dst[c] += a * std::bit_cast<float>(static_cast<uint32_t>(wb[c]) << 16);
        }
        continue;
      }
      dequantize_row(p.kv_b, wr, wrow);
      for (int64_t i = 0; i < p.m; ++i) {
        const float a = p.q[(i * p.heads + h) * qd + d];
        float* dst = p.q_cat + (i * p.heads + h) * w;
#pragma omp simd
        for (int64_t c = 0; c < r; ++c) dst[c] += a * wrow[c];
      }
    }
  }
}

int64_t mla_attention_scratch_floats(int64_t heads, int64_t max_keys, int64_t width, int threads) {
  // Per thread: scores [heads, max_keys], one decoded row [width], the keys' slots (int64: 2 floats each,
  // plus 2 to align them).
  const int64_t keys = std::max<int64_t>(max_keys, 1);
  return static_cast<int64_t>(threads) * (heads * keys + width + 2 * keys + 2);
}

void mla_attention(const MlaAttentionParams& p) {
  const int64_t r = p.kv_lora_rank, w = p.kv.width;
  const int threads = omp_get_max_threads();
  // Split heads into groups so that even one decode token keeps every thread busy; each group decodes the
  // token's cache rows once for all its heads.
  // One thread: one group (each group decodes the token's cache rows again).
  const int64_t groups =
      threads == 1 ? 1 : std::min<int64_t>(p.heads, std::max<int64_t>(1, (2 * threads + p.m - 1) / p.m));
  const bool avx512 = linear_isa() == LinearIsa::Avx512;
  const int64_t per_group = (p.heads + groups - 1) / groups;
  const int64_t tasks = p.m * groups;
  const int64_t per_thread =
      p.heads * std::max<int64_t>(p.max_keys, 1) + w + 2 * std::max<int64_t>(p.max_keys, 1) + 2;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tasks; ++t) {
    float* scores = p.scratch + static_cast<int64_t>(omp_get_thread_num()) * per_thread;
    float* row = scores + p.heads * std::max<int64_t>(p.max_keys, 1);
    const int64_t i = t / groups, g = t % groups;
    const int64_t h0 = g * per_group, h1 = std::min(p.heads, h0 + per_group);
    if (h0 >= h1) continue;
    const int64_t seq = p.token_seq[i], pos = p.positions[i];
    const int64_t n_keys = p.topk ? p.topk_width : pos + 1;
    const int32_t* sel = p.topk ? p.topk + i * p.topk_width : nullptr;
    const int64_t hn = h1 - h0;
    // Pass 1: scores [hn, n_keys].
    for (int64_t kk = 0; kk < n_keys; ++kk) {
      const int64_t j = sel ? sel[kk] : kk;
      if (j < 0 || j > pos) {
        for (int64_t h = 0; h < hn; ++h) scores[h * n_keys + kk] = -INFINITY;
        continue;
      }
      cache_read_row(p.kv, cache_slot(p.block_table, p.max_blocks, seq, j, p.kv.page_size), row);
      if (avx512) {
        int64_t h = 0;
        for (; h + 8 <= hn; h += 8)
          scores_avx512<8>(p.q_cat + (i * p.heads + h0 + h) * w, w, row, p.softmax_scale,
                           scores + h * n_keys + kk, n_keys);
        for (; h < hn; ++h)
          scores_avx512<1>(p.q_cat + (i * p.heads + h0 + h) * w, w, row, p.softmax_scale,
                           scores + h * n_keys + kk, n_keys);
        continue;
      }
      for (int64_t h = 0; h < hn; ++h) {
        const float* q = p.q_cat + (i * p.heads + h0 + h) * w;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < w; ++c) s += q[c] * row[c];
        scores[h * n_keys + kk] = s * p.softmax_scale;
      }
    }
    for (int64_t h = 0; h < hn; ++h) {
      float* s = scores + h * n_keys;
      float mx = -INFINITY;
      for (int64_t kk = 0; kk < n_keys; ++kk) mx = std::max(mx, s[kk]);
      float sum = 0.0f;
      for (int64_t kk = 0; kk < n_keys; ++kk) {
        s[kk] = s[kk] == -INFINITY ? 0.0f : std::exp(s[kk] - mx);
        sum += s[kk];
      }
      const float inv = sum > 0 ? 1.0f / sum : 0.0f;
      for (int64_t kk = 0; kk < n_keys; ++kk) s[kk] *= inv;
      float* o = p.lat + (i * p.heads + h0 + h) * r;
      for (int64_t c = 0; c < r; ++c) o[c] = 0.0f;
    }
    // Pass 2: lat = sum_j p_j * latent_j.
    if (avx512 && p.kv.format == CacheFormat::BF16) {
      // The keys' slots (-1: not visible), after the decoded row in this thread's scratch.
      auto* slots = reinterpret_cast<int64_t*>((reinterpret_cast<uintptr_t>(row + w) + 7) & ~uintptr_t{7});
      for (int64_t kk = 0; kk < n_keys; ++kk) {
        const int64_t j = sel ? sel[kk] : kk;
        slots[kk] = j < 0 || j > pos ? -1 : cache_slot(p.block_table, p.max_blocks, seq, j, p.kv.page_size);
      }
      const auto* cache = static_cast<const uint16_t*>(p.kv.data);
      int64_t h = 0;
      for (; h + 8 <= hn; h += 8)
        weighted_rows_bf16_avx512<8>(scores + h * n_keys, n_keys, slots, n_keys, cache, w, r,
                                     p.lat + (i * p.heads + h0 + h) * r, r);
      for (; h < hn; ++h)
        weighted_rows_bf16_avx512<1>(scores + h * n_keys, n_keys, slots, n_keys, cache, w, r,
                                     p.lat + (i * p.heads + h0 + h) * r, r);
      continue;
    }
    for (int64_t kk = 0; kk < n_keys; ++kk) {
      const int64_t j = sel ? sel[kk] : kk;
      if (j < 0 || j > pos) continue;
      cache_read_row(p.kv, cache_slot(p.block_table, p.max_blocks, seq, j, p.kv.page_size), row);
      for (int64_t h = 0; h < hn; ++h) {
        const float pj = scores[h * n_keys + kk];
        float* o = p.lat + (i * p.heads + h0 + h) * r;
#pragma omp simd
        for (int64_t c = 0; c < r; ++c) o[c] += pj * row[c];
      }
    }
  }
}

void mla_out_v(const MlaOutVParams& p) {
  // Per head a linear: o[:, h, :] = lat[:, h, :] W_UV_h^T, W_UV_h = kv_b rows [h (nope + v) + nope, + v).
  // The register-blocked linear kernels read each weight row once for all m tokens, in the stored format.
  const int64_t r = p.kv_lora_rank;
  const int64_t rows = p.heads * p.v;
#pragma omp parallel for schedule(static)
  for (int64_t h = 0; h < p.heads; ++h) {
    LinearParams lp;
    lp.x = p.lat + h * r;
    lp.x_stride = p.heads * r;
    lp.w = p.kv_b;
    lp.row0 = h * (p.nope + p.v) + p.nope;
    lp.n = p.v;
    lp.y = p.out + h * p.v;
    lp.y_stride = rows;
    lp.m = p.m;
    linear(lp);
  }
}

}  // namespace ms::kernels::cpu
