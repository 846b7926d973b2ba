#include "runtime/sampler.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <limits>
#include <random>
#include <string>

#include "core/error.h"

namespace ms::runtime {

namespace sampler_detail {

// Below this temperature a request is greedy (vLLM's threshold): x / T would overflow the exponent anyway.
constexpr float kGreedyTemperature = 1e-5f;
// Histogram of scaled logits s = (x - max) / T for the top-p cut-off: bin b holds s in (-(b+1)/4, -b/4], the
// last bin everything below -63.75 (a relative probability under 2e-28).
constexpr int kBins = 256;
constexpr float kBinsPerUnit = 4.0f;
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr float kInf = std::numeric_limits<float>::infinity();

// splitmix64's output function: a bijection that spreads every input bit over the output.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Draw number `step` of the stream keyed by `key`, uniform in [0, 1) with 53 random bits.
inline double uniform01(uint64_t key, int64_t step) {
  uint64_t z = mix64(key + (static_cast<uint64_t>(step) + 1) * kGolden);
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

struct Candidate {
  float logit;
  int32_t token;
  float weight;  // exp((logit - max) / T), when computed
};

// Most likely first, ties to the lowest id: a total order, so every selection below is deterministic.
inline bool better(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
}

inline int bin_of(float s) {
  float b = -s * kBinsPerUnit;
  return b >= static_cast<float>(kBins - 1) ? kBins - 1 : static_cast<int>(b);
}

inline bool penalties_active(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
}

struct RowMax {
  float max;
  int32_t argmax;  // lowest id among equal maxima
  bool has_nan;
};

RowMax row_max(const float* x, int n) {
  RowMax r{-kInf, 0, false};
  for (int i = 0; i < n; ++i) {
    float v = x[i];
    if (v > r.max) {
      r.max = v;
      r.argmax = i;
    }
    r.has_nan |= std::isnan(v);
  }
  return r;
}

// The min(k, n) best of x[0, n) into `out`, sorted best first. Keeps a buffer of at most 2k candidates: when
// it fills, the best k survive and the k-th becomes the bar a later token must beat (a later token with an
// equal logit has a larger id, so it loses the tie).
void select_top(const float* x, int n, int k, std::vector<Candidate>& out) {
  out.clear();
  const size_t keep = static_cast<size_t>(k);
  const size_t cap = 2 * keep;
  if (out.capacity() < std::min(cap, static_cast<size_t>(n)))
    out.reserve(std::min(cap, static_cast<size_t>(n)));
  bool full = false;
  float bar = -kInf;
  for (int i = 0; i < n; ++i) {
    float v = x[i];
    if (full && !(v > bar)) continue;
    out.push_back({v, i, 0.0f});
    if (out.size() == cap) {
      std::nth_element(out.begin(), out.begin() + (keep - 1), out.end(), better);
      out.resize(keep);
      bar = out[keep - 1].logit;
      full = true;
    }
  }
  if (out.size() > keep) {
    std::nth_element(out.begin(), out.begin() + (keep - 1), out.end(), better);
    out.resize(keep);
  }
  std::sort(out.begin(), out.end(), better);
}

}  // namespace sampler_detail

using namespace sampler_detail;

struct Sampler::Workspace {
  std::vector<float> logits;    // [vocab] the penalised copy of a row
  std::vector<float> weights;   // [vocab] exp((x - max) / T) for the dense draw and the top-p histogram
  std::vector<Candidate> cand;  // [<= vocab] the kept tokens with their weights
  std::vector<Candidate> top;   // [<= 2 * top_logprobs] for top_logprobs
  std::array<double, kBins> bins{};

  // What a random draw picks from: cand[0, n) in order, or (dense) weights[0, vocab) in id order.
  int n = 0;
  bool dense = false;
  double total = 0.0;
};

namespace {

// Fills ws (cand / weights, n, dense, total) with the tokens that survive top-k, top-p and min-p, with their
// unnormalised weights. x: f32 [vocab] (penalised); m: its maximum.
void select_kept(const float* x, int vocab, float m, const SamplingParams& p, Sampler::Workspace& ws) {
  const float inv_t = 1.0f / p.temperature;
  const bool use_k = p.top_k > 0 && p.top_k < vocab;
  const bool use_p = p.top_p < 1.0f;
  const bool use_min_p = p.min_p > 0.0f;
  // min-p keeps p_i >= min_p * p_max, i.e. s_i = (x_i - m) / T >= log(min_p); the argmax (s = 0) always
  // stays.
  const float min_s = use_min_p ? std::log(p.min_p) : -kInf;
  auto& c = ws.cand;
  ws.dense = false;

  if (use_k) {
    select_top(x, vocab, p.top_k, c);
    double total = 0.0;
    for (auto& e : c) {
      e.weight = std::exp((e.logit - m) * inv_t);
      total += e.weight;
    }
    int n = static_cast<int>(c.size());
    if (use_p) {
      // Keep token i while the mass before it is under top_p of the top-k mass.
      const double target = static_cast<double>(p.top_p) * total;
      double cum = 0.0;
      int i = 0;
      while (i < n && cum < target) cum += c[i++].weight;
      n = std::max(i, 1);
    }
    if (use_min_p) {
      while (n > 1 && (c[n - 1].logit - m) * inv_t < min_s) --n;
    }
    ws.n = n;
    ws.total = 0.0;
    for (int i = 0; i < n; ++i) ws.total += c[i].weight;
    return;
  }

  if (use_p) {
    // One pass: every weight, their sum and a histogram by scaled logit. The bin where the most-likely-first
    // mass reaches top_p bounds the nucleus, so only tokens up to that bin are gathered and sorted.
    ws.weights.resize(vocab);
    ws.bins.fill(0.0);
    double all = 0.0;
    for (int i = 0; i < vocab; ++i) {
      float s = (x[i] - m) * inv_t;
      float w = std::exp(s);
      ws.weights[i] = w;
      all += w;
      ws.bins[bin_of(s)] += w;
    }
    const double target = static_cast<double>(p.top_p) * all;
    int cut = kBins - 1;
    double cum = 0.0;
    for (int b = 0; b < kBins; ++b) {
      cum += ws.bins[b];
      if (cum >= target) {
        cut = b;
        break;
      }
    }
    c.clear();
    for (int i = 0; i < vocab; ++i) {
      float s = (x[i] - m) * inv_t;
      if (bin_of(s) <= cut && s >= min_s) c.push_back({x[i], i, ws.weights[i]});
    }
    std::sort(c.begin(), c.end(), better);
    // Tokens dropped by min-p are all less likely than those kept, so the prefix sums below are unchanged.
    const int n = static_cast<int>(c.size());
    cum = 0.0;
    int i = 0;
    while (i < n && cum < target) cum += c[i++].weight;
    ws.n = std::max(i, 1);  // the whole gathered set when rounding leaves the sum a hair short of the target
    ws.total = 0.0;
    for (int j = 0; j < ws.n; ++j) ws.total += c[j].weight;
    return;
  }

  if (use_min_p) {
    c.clear();
    double total = 0.0;
    for (int i = 0; i < vocab; ++i) {
      float s = (x[i] - m) * inv_t;
      if (s >= min_s) {
        float w = std::exp(s);
        c.push_back({x[i], i, w});
        total += w;
      }
    }
    ws.n = static_cast<int>(c.size());
    ws.total = total;
    return;
  }

  ws.weights.resize(vocab);
  double total = 0.0;
  for (int i = 0; i < vocab; ++i) {
    float w = std::exp((x[i] - m) * inv_t);
    ws.weights[i] = w;
    total += w;
  }
  ws.dense = true;
  ws.n = vocab;
  ws.total = total;
}

// Inverse-CDF draw over c[0, n) in that order: the first token whose running mass exceeds u * total.
int32_t draw_list(const Candidate* c, int n, double total, double u) {
  const double target = u * total;
  double cum = 0.0;
  int32_t last = -1;
  for (int i = 0; i < n; ++i) {
    const auto& e = c[i];
    if (e.weight <= 0.0f) continue;
    cum += e.weight;
    last = e.token;
    if (target < cum) return e.token;
  }
  return last;  // u * total rounded up to the full sum
}

// The same over the kept set of select_kept.
int32_t draw(const Sampler::Workspace& ws, double u) {
  if (!ws.dense) return draw_list(ws.cand.data(), ws.n, ws.total, u);
  const double target = u * ws.total;
  double cum = 0.0;
  int32_t last = -1;
  for (int i = 0; i < ws.n; ++i) {
    float w = ws.weights[i];
    if (w <= 0.0f) continue;
    cum += w;
    last = i;
    if (target < cum) return i;
  }
  return last;  // u * total rounded up to the full sum
}

}  // namespace

int32_t SamplerState::output_count(int32_t token) const {
  auto it = slot_of_.find(token);
  return it == slot_of_.end() ? 0 : output_counts_[it->second];
}

void SamplerState::record(int32_t token, bool output) {
  auto [it, inserted] = slot_of_.try_emplace(token, static_cast<int32_t>(seen_tokens_.size()));
  if (inserted) {
    seen_tokens_.push_back(token);
    output_counts_.push_back(0);
  }
  if (output) ++output_counts_[it->second];
}

Sampler::Sampler(int vocab_size, SamplerOptions options) : vocab_size_(vocab_size), options_(options) {
  MS_CHECK(vocab_size > 0, "sampler vocab_size must be positive, got {}", vocab_size);
  MS_CHECK(options.max_top_logprobs >= 0, "max_top_logprobs must be >= 0, got {}", options.max_top_logprobs);
  if (options.global_seed) {
    global_seed_ = *options.global_seed;
  } else {
    std::random_device rd;
    global_seed_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  const int threads = std::max(1, omp_get_max_threads());
  for (int i = 0; i < threads; ++i) workspaces_.push_back(std::make_unique<Workspace>());
}

Sampler::~Sampler() = default;

void Sampler::validate(const SamplingParams& p) const {
  if (!(std::isfinite(p.temperature) && p.temperature >= 0.0f))
    MS_THROW("temperature must be a finite number >= 0, got {}", p.temperature);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) MS_THROW("top_p must be in (0, 1], got {}", p.top_p);
  if (p.top_k < -1) MS_THROW("top_k must be >= 0 (0 or -1: off), got {}", p.top_k);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) MS_THROW("min_p must be in [0, 1], got {}", p.min_p);
  if (!(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f))
    MS_THROW("repetition_penalty must be a finite number > 0, got {}", p.repetition_penalty);
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
    MS_THROW("frequency_penalty must be in [-2, 2], got {}", p.frequency_penalty);
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
    MS_THROW("presence_penalty must be in [-2, 2], got {}", p.presence_penalty);
  for (const auto& [token, bias] : p.logit_bias) {
    if (token < 0 || token >= vocab_size_)
      MS_THROW("logit_bias: token id {} is outside the vocabulary [0, {})", token, vocab_size_);
    if (!(bias >= -100.0f && bias <= 100.0f))
      MS_THROW("logit_bias: the bias of token {} must be in [-100, 100], got {}", token, bias);
  }
  if (p.top_logprobs < -1 || p.top_logprobs > options_.max_top_logprobs)
    MS_THROW("top_logprobs must be in [0, {}] (or -1: none), got {}", options_.max_top_logprobs,
             p.top_logprobs);
}

SamplerState Sampler::new_state(const SamplingParams& params, std::span<const int32_t> prompt_ids,
                                std::span<const int32_t> output_ids) {
  validate(params);
  auto check_ids = [&](std::span<const int32_t> ids, const char* name) {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= vocab_size_)
        MS_THROW("{}[{}] = {} is outside the vocabulary [0, {})", name, i, ids[i], vocab_size_);
    }
  };
  check_ids(prompt_ids, "prompt_ids");
  check_ids(output_ids, "output_ids");

  SamplerState s;
  if (params.seed) {
    s.seed_ = *params.seed;
  } else {
    uint64_t n = unseeded_count_.fetch_add(1, std::memory_order_relaxed);
    s.seed_ = mix64(global_seed_ + (n + 1) * kGolden);
  }
  // Hash the seed so that nearby seeds (0, 1, 2...) key unrelated streams.
  s.key_ = mix64(s.seed_ ^ 0x6A09E667F3BCC909ull);
  s.step_ = static_cast<int64_t>(output_ids.size());
  s.track_ = penalties_active(params);
  if (s.track_) {
    for (int32_t t : prompt_ids) s.record(t, false);
    for (int32_t t : output_ids) s.record(t, true);
  }
  return s;
}

void Sampler::apply_bias(std::span<float> logits, const SamplingParams& p) const {
  for (const auto& [token, bias] : p.logit_bias) logits[static_cast<size_t>(token)] += bias;
}

void Sampler::apply_penalties(std::span<float> logits, const SamplingParams& p,
                              const SamplerState& state) const {
  MS_CHECK(static_cast<int64_t>(logits.size()) == vocab_size_, "logits row has {} values, the vocabulary {}",
           logits.size(), vocab_size_);
  const float r = p.repetition_penalty;
  const float f = p.frequency_penalty;
  const float pres = p.presence_penalty;
  for (size_t j = 0; j < state.seen_tokens_.size(); ++j) {
    float& v = logits[state.seen_tokens_[j]];
    if (r != 1.0f) v = v > 0.0f ? v / r : v * r;
    const int32_t count = state.output_counts_[j];
    if (count > 0) v = v - f * static_cast<float>(count) - pres;
  }
}

void Sampler::sample_row(const float* raw, const SamplingParams& p, SamplerState& state, Workspace& ws,
                         GeneratedToken& out) const {
  const int vocab = vocab_size_;
  const bool penalised = penalties_active(p);
  MS_CHECK(!penalised || state.track_,
           "the request's sampler state was made without penalties; make it with the params it samples with");
  const float* x = raw;
  if (penalised || !p.logit_bias.empty()) {
    ws.logits.assign(raw, raw + vocab);
    apply_bias(std::span<float>(ws.logits), p);
    if (penalised) apply_penalties(std::span<float>(ws.logits), p, state);
    x = ws.logits.data();
  }
  const RowMax mx = row_max(x, vocab);
  if (mx.has_nan) MS_THROW("logits contain NaN");
  if (!std::isfinite(mx.max)) MS_THROW("logits have no finite maximum (max {})", mx.max);

  if (p.temperature < kGreedyTemperature) {
    out.token = mx.argmax;
  } else {
    select_kept(x, vocab, mx.max, p, ws);
    out.token = draw(ws, uniform01(state.key_, state.step_));
  }

  out.logprob = 0.0f;
  out.top_logprobs.clear();
  if (p.top_logprobs >= 0) {
    const RowMax rm = penalised ? row_max(raw, vocab) : mx;
    double sum = 0.0;
    for (int i = 0; i < vocab; ++i) sum += std::exp(raw[i] - rm.max);
    const double log_z = std::log(sum);
    auto logprob = [&](float v) { return static_cast<float>(static_cast<double>(v - rm.max) - log_z); };
    out.logprob = logprob(raw[out.token]);
    if (p.top_logprobs > 0) {
      select_top(raw, vocab, p.top_logprobs, ws.top);
      for (const auto& e : ws.top) out.top_logprobs.push_back({e.token, logprob(e.logit)});
    }
  }

  ++state.step_;
  if (state.track_) state.record(out.token, true);
}

GeneratedToken Sampler::sample(std::span<const float> logits, const SamplingParams& params,
                               SamplerState& state) {
  MS_CHECK(static_cast<int64_t>(logits.size()) == vocab_size_, "logits row has {} values, the vocabulary {}",
           logits.size(), vocab_size_);
  validate(params);
  GeneratedToken out;
  sample_row(logits.data(), params, state, *workspaces_[0], out);
  return out;
}

void Sampler::sample_batch(std::span<const float> logits, std::span<const SamplingParams* const> params,
                           std::span<SamplerState* const> states, std::span<GeneratedToken> out) {
  const size_t rows = params.size();
  MS_CHECK(states.size() == rows && out.size() == rows, "sample_batch: {} params, {} states, {} outputs",
           rows, states.size(), out.size());
  MS_CHECK(logits.size() == rows * static_cast<size_t>(vocab_size_),
           "sample_batch: logits hold {} values, expected {} rows x vocabulary {}", logits.size(), rows,
           vocab_size_);
  batch_states_.assign(states.begin(), states.end());
  std::sort(batch_states_.begin(), batch_states_.end());
  for (size_t i = 0; i < rows; ++i) {
    MS_CHECK(batch_states_[i] != nullptr && params[i] != nullptr,
             "sample_batch: row {} has no params or state", i);
    MS_CHECK(i == 0 || batch_states_[i] != batch_states_[i - 1], "sample_batch: a state appears in two rows");
    validate(*params[i]);
  }

  const int threads = static_cast<int>(std::min<size_t>(workspaces_.size(), std::max<size_t>(rows, 1)));
  int64_t failed_row = -1;
  std::string failure;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (rows > 1)
  for (int64_t i = 0; i < static_cast<int64_t>(rows); ++i) {
    Workspace& ws = *workspaces_[omp_get_thread_num()];
    try {
      sample_row(logits.data() + i * vocab_size_, *params[i], *states[i], ws, out[i]);
    } catch (const std::exception& e) {
      const ms::Error* err = dynamic_cast<const ms::Error*>(&e);
#pragma omp critical(ms_sampler_failure)
      if (failed_row < 0 || i < failed_row) {
        failed_row = i;
        failure = err ? err->message() : e.what();
      }
    }
  }
  if (failed_row >= 0) MS_THROW("sampling row {}: {}", failed_row, failure);
}

bool Sampler::summary_may_decide(const SamplingParams& p) const {
  if (!p.logit_bias.empty() || penalties_active(p)) return false;
  if (p.top_logprobs > kernels::cpu::kLogitsTopC) return false;
  if (p.temperature < kGreedyTemperature) return true;
  if (p.top_k > 0 && p.top_k < vocab_size_) return p.top_k <= kernels::cpu::kLogitsTopC;
  return p.top_p < 1.0f || p.min_p > 0.0f;
}

// Mirrors sample_row step by step on the candidates (no bias, no penalties: x is the raw row). Where
// sample_row works on a set of tokens the candidates hold in full, the same floats are summed in the same
// order, so the token and the logprobs are those of sample_row bit for bit. Two numbers come from the whole
// row instead: sum_exp (log-softmax) and sum_exp_t (top-p's target). With a summary from
// kernels::cpu::logits_topc they are sample_row's own sums; from the device they differ in the last bits, so
// logprobs may differ by about 1e-6 and the top-p cut is decided only when the running mass is clear of the
// target by kSummaryTopPMargin (relative): then the nucleus is the same set as sample_row's, else the row
// needs its full logits.
bool Sampler::sample_summary(const kernels::cpu::LogitsTopC& s, const SamplingParams& p, SamplerState& state,
                             GeneratedToken& out) const {
  if (!summary_may_decide(p)) return false;
  validate(p);
  MS_CHECK(s.count == std::min(kernels::cpu::kLogitsTopC, vocab_size_),
           "logits summary holds {} candidates, expected {} for a vocabulary of {}", s.count,
           std::min(kernels::cpu::kLogitsTopC, vocab_size_), vocab_size_);
  if (s.nan_count > 0) MS_THROW("logits contain NaN");
  const float m = s.logit[0];  // sample_row's max: the first (lowest-id) of the largest
  if (!std::isfinite(m)) MS_THROW("logits have no finite maximum (max {})", m);
  const int count = s.count;
  const bool whole_row = count == vocab_size_;

  std::array<Candidate, kernels::cpu::kLogitsTopC> c;
  int chosen = 0;  // index of the token in the candidates
  if (p.temperature >= kGreedyTemperature) {
    const float inv_t = 1.0f / p.temperature;
    const bool use_k = p.top_k > 0 && p.top_k < vocab_size_;
    const bool use_p = p.top_p < 1.0f;
    const bool use_min_p = p.min_p > 0.0f;
    const float min_s = use_min_p ? std::log(p.min_p) : -kInf;
    for (int i = 0; i < count; ++i) c[i] = {s.logit[i], s.token[i], 0.0f};
    int n = 0;
    double total = 0.0;
    bool by_id = false;
    if (use_k) {
      // select_kept's top-k branch on the same k tokens (k <= C, k < vocab, so k <= count).
      n = p.top_k;
      for (int i = 0; i < n; ++i) {
        c[i].weight = std::exp((c[i].logit - m) * inv_t);
        total += c[i].weight;
      }
      if (use_p) {
        const double target = static_cast<double>(p.top_p) * total;
        double cum = 0.0;
        int i = 0;
        while (i < n && cum < target) cum += c[i++].weight;
        n = std::max(i, 1);
      }
      if (use_min_p) {
        while (n > 1 && (c[n - 1].logit - m) * inv_t < min_s) --n;
      }
      total = 0.0;
      for (int i = 0; i < n; ++i) total += c[i].weight;
    } else {
      // mp: the tokens min-p keeps are a prefix of the candidates; its length is known when a candidate fails
      // the bar or the candidates are the whole row.
      int mp = count;
      for (int i = 0; i < count; ++i) {
        const float sc = (c[i].logit - m) * inv_t;
        c[i].weight = std::exp(sc);
        if (sc < min_s) {
          mp = i;
          break;
        }
      }
      const bool mp_known = mp < count || whole_row;
      if (use_p) {
        // select_kept's top-p walk: while (i < kept && cum < target) cum += w[i++]. Each comparison of cum
        // with the target is taken only when it is clear of the margin.
        const double target = static_cast<double>(p.top_p) * s.sum_exp_t;
        const double lo = target * (1.0 - kSummaryTopPMargin), hi = target * (1.0 + kSummaryTopPMargin);
        double cum = 0.0;
        int i = 0;
        for (;;) {
          if (mp_known && i == mp) break;
          if (cum >= hi) break;
          if (cum >= lo) return false;   // too close to the target to know which side the full sum is on
          if (i == count) return false;  // the nucleus reaches past the candidates
          cum += c[i++].weight;
        }
        n = std::max(i, 1);
      } else {
        // min-p alone: the kept tokens in id order, as select_kept gathers them.
        if (!mp_known) return false;
        n = mp;
        std::sort(c.begin(), c.begin() + n,
                  [](const Candidate& a, const Candidate& b) { return a.token < b.token; });
        by_id = true;
      }
      for (int i = 0; i < n; ++i) total += c[i].weight;
    }
    out.token = draw_list(c.data(), n, total, uniform01(state.key_, state.step_));
    chosen = -1;
    if (by_id) {
      for (int i = 0; i < count && chosen < 0; ++i)
        if (s.token[i] == out.token) chosen = i;
    } else {
      for (int i = 0; i < n && chosen < 0; ++i)
        if (c[i].token == out.token) chosen = i;
    }
    MS_CHECK(chosen >= 0, "logits summary: the drawn token {} is not a candidate", out.token);
  } else {
    out.token = s.token[0];
  }

  out.logprob = 0.0f;
  out.top_logprobs.clear();
  if (p.top_logprobs >= 0) {
    const double log_z = std::log(s.sum_exp);
    auto logprob = [&](float v) { return static_cast<float>(static_cast<double>(v - m) - log_z); };
    out.logprob = logprob(s.logit[chosen]);
    const int n = std::min(p.top_logprobs, count);
    for (int i = 0; i < n; ++i) out.top_logprobs.push_back({s.token[i], logprob(s.logit[i])});
  }
  ++state.step_;
  if (state.track_) state.record(out.token, true);
  return true;
}

std::vector<TokenProbability> Sampler::kept_distribution(std::span<const float> logits,
                                                         const SamplingParams& p, const SamplerState& state) {
  MS_CHECK(static_cast<int64_t>(logits.size()) == vocab_size_, "logits row has {} values, the vocabulary {}",
           logits.size(), vocab_size_);
  validate(p);
  MS_CHECK(!penalties_active(p) || state.track_,
           "the request's sampler state was made without penalties; make it with the params it samples with");
  Workspace& ws = *workspaces_[0];
  const float* x = logits.data();
  if (penalties_active(p) || !p.logit_bias.empty()) {
    ws.logits.assign(logits.begin(), logits.end());
    apply_bias(std::span<float>(ws.logits), p);
    if (penalties_active(p)) apply_penalties(std::span<float>(ws.logits), p, state);
    x = ws.logits.data();
  }
  const RowMax mx = row_max(x, vocab_size_);
  if (mx.has_nan) MS_THROW("logits contain NaN");
  if (!std::isfinite(mx.max)) MS_THROW("logits have no finite maximum (max {})", mx.max);
  if (p.temperature < kGreedyTemperature) return {{mx.argmax, 1.0f}};

  select_kept(x, vocab_size_, mx.max, p, ws);
  std::vector<Candidate> kept;
  if (ws.dense) {
    for (int i = 0; i < vocab_size_; ++i) kept.push_back({x[i], i, ws.weights[i]});
  } else {
    kept.assign(ws.cand.begin(), ws.cand.begin() + ws.n);
  }
  std::sort(kept.begin(), kept.end(), better);
  std::vector<TokenProbability> result;
  for (const auto& e : kept) {
    if (e.weight > 0.0f) result.push_back({e.token, static_cast<float>(e.weight / ws.total)});
  }
  return result;
}

}  // namespace ms::runtime
