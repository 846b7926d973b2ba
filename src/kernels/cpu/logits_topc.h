// A logits row reduced to what the sampler needs when the most likely tokens decide the draw: the row's max,
// its softmax normalisers at T = 1 (logprobs) and at the row's temperature (top-p), and its top C tokens.
// The CUDA kernel (kernels/cuda/sampling/logits_topc.cu) writes the same layout; the host copies C * 8 + 32
// bytes per row instead of 4 * vocab (1056 bytes instead of 620 KB for GLM-5's 154880 tokens).
#pragma once

#include <cstdint>

namespace ms::kernels::cpu {

// Candidates per row. 128 covers every top_logprobs (at most 20), every top_k up to 128 (the common 20, 40,
// 50, 100) and, for top-p / min-p, the head of the distribution in all but flat rows; the selection costs the
// same for any C (radix passes over the row), and a larger C only lengthens the copy and the host's walk.
constexpr int kLogitsTopC = 128;

// Temperatures below this are greedy (the sampler's threshold): the row's sum_exp_t is then 1.
constexpr float kLogitsTopCGreedyTemperature = 1e-5f;

// One row's summary. Candidates are sorted best first: the larger logit, ties to the lower id (-0 and +0
// tie; NaN ranks below -inf). Both sums add f32 weights in f64; the CPU reference adds them in id order, so
// they equal the sampler's own sums bit for bit; the CUDA kernel adds them in a fixed tree order with the
// device's expf (within 2 ulp), so they differ in the last bits.
struct LogitsTopC {
  double sum_exp = 0.0;    // sum over the row of exp(x - max): log(sum_exp) is the log-softmax normaliser
  double sum_exp_t = 0.0;  // sum over the row of exp((x - max) * (1 / T)) at the row's T; 1 for greedy rows
  float max = 0.0f;        // row max over the non-NaN entries (-inf when there are none)
  int32_t nan_count =
      0;              // NaN entries of the row (the sampler refuses such rows; the rest is then unspecified)
  int32_t count = 0;  // candidates held: min(C, vocab); the slots past it hold token -1, logit -inf
  int32_t reserved = 0;
  int32_t token[kLogitsTopC];  // token ids, best first
  float logit[kLogitsTopC];    // their raw logits
};
static_assert(sizeof(LogitsTopC) == 32 + 8 * kLogitsTopC, "LogitsTopC is a packed device/host layout");

// The order of candidates as a 32-bit key: a larger float gives a larger key; -0 maps to +0's key, NaN to 0
// (below -inf's key).
inline uint32_t logits_topc_key(float x) {
  if (x != x) return 0u;
  if (x == 0.0f) x = 0.0f;
  uint32_t u;
  __builtin_memcpy(&u, &x, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct LogitsTopCParams {
  const float* __restrict__ logits = nullptr;  // [rows, vocab] rows `stride` floats apart
  int64_t stride = 0;
  const float* __restrict__ temperature =
      nullptr;                             // [rows] each row's T (< kLogitsTopCGreedyTemperature: greedy)
  LogitsTopC* __restrict__ out = nullptr;  // [rows]
  int64_t rows = 0, vocab = 0;
};

// The reference: every row in full, sequential sums in id order (rows in parallel).
void logits_topc(const LogitsTopCParams& p);

}  // namespace ms::kernels::cpu
