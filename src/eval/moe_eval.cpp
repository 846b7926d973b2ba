#include "eval/moe_eval.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kv/forward_batch.h"
#include "kv/page_allocator.h"
#include "moe/expert_stats.h"

namespace ms::eval {

namespace {

// One run (baseline or OEA): its executor (and KV pool), each stream's pages, and its distinct-expert counts.
struct Run {
  std::unique_ptr<runtime::Executor> exec;
  kv::PageAllocator alloc;
  std::vector<std::vector<int32_t>> pages;
  moe::ExpertStats stats;
  model::StepRouting routing;
  Run(const model::Model& m, const runtime::ExecutorConfig& ec, const MakeExecutor& make)
      : exec(make_executor(make, m, ec)),
        alloc(ec.num_pages),
        stats(m.config().num_hidden_layers, std::max(m.config().n_routed_experts, 1)) {}
};

// log-softmax of one row, in double.
void log_softmax(const float* x, int64_t n, std::vector<double>& out) {
  out.resize(static_cast<size_t>(n));
  double mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  const double lse = mx + std::log(sum);
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<double>(x[i]) - lse;
}

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

// Streams: prompts[i], then the tokens fed at decode steps. `forced` (text) gives them; otherwise each is the
// baseline's greedy choice. Every stream is decoded `steps` times.
MoeEvalResult evaluate(model::Model& m, const std::vector<std::vector<int32_t>>& prompts,
                       const std::vector<std::vector<int32_t>>* forced, int steps, const MoeEvalOptions& o) {
  const io::ModelConfig& c = m.config();
  const moe::RouterConfig& rc = m.router_config();
  MS_CHECK(c.n_routed_experts > 0, "moe-eval: the model has no routed experts");
  MS_CHECK(!prompts.empty(), "moe-eval: --batch must be at least 1");
  MS_CHECK(o.k0 >= 1 && o.k0 <= rc.top_k, "moe-eval: --k0 {} must be in [1, {}] (the model's top-k)", o.k0,
           rc.top_k);
  MS_CHECK(o.kmax == 0 || (o.kmax >= o.k0 && o.kmax <= rc.top_k), "moe-eval: --kmax {} must be in [{}, {}]",
           o.kmax, o.k0, rc.top_k);
  MS_CHECK(steps >= 1, "moe-eval: --steps must be at least 1, got {}", steps);
  const int B = static_cast<int>(prompts.size());
  const int64_t V = c.vocab_size;
  int64_t longest = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    MS_CHECK(!prompts[i].empty(), "moe-eval: prompt {} is empty", i);
    for (int32_t t : prompts[i])
      MS_CHECK(t >= 0 && t < V, "moe-eval: prompt {} holds token id {} outside the vocabulary [0, {})", i, t,
               V);
    longest = std::max<int64_t>(longest, static_cast<int64_t>(prompts[i].size()));
  }
  MS_CHECK(longest + steps <= c.max_position_embeddings,
           "moe-eval: a prompt of {} tokens plus {} steps is past the context limit of {}", longest, steps,
           c.max_position_embeddings);

  const int32_t page = 16;
  int32_t pages_total = 0;
  for (const auto& p : prompts)
    pages_total += static_cast<int32_t>((static_cast<int64_t>(p.size()) + steps + page - 1) / page);
  runtime::ExecutorConfig ec;
  ec.num_pages = pages_total;
  ec.page_size = page;
  ec.kv_cache_dtype = o.kv_dtype;
  ec.max_seqs = B;
  for (const auto& p : prompts) ec.max_tokens += static_cast<int64_t>(p.size());  // the prefill step
  ec.max_tokens = std::max<int64_t>(ec.max_tokens, B);
  ec.max_logit_rows = B;
  ec.max_context = longest + steps;
  Run base(m, ec, o.make_executor), oea(m, ec, o.make_executor);
  for (Run* r : {&base, &oea}) {
    r->pages.resize(static_cast<size_t>(B));
    for (int i = 0; i < B; ++i) {
      const int64_t tokens = static_cast<int64_t>(prompts[static_cast<size_t>(i)].size()) + steps;
      MS_CHECK(r->alloc.allocate(static_cast<int32_t>((tokens + page - 1) / page),
                                 r->pages[static_cast<size_t>(i)]),
               "moe-eval: KV pool too small");
    }
    r->routing.expert_stats = &r->stats;
  }
  oea.routing.oea = moe::OeaConfig{true, o.k0, o.kmax};

  MoeEvalResult res;
  res.batch = B;
  res.k0 = o.k0;
  res.kmax = o.kmax ? o.kmax : rc.top_k;
  res.top_k = rc.top_k;
  res.n_experts = rc.n_experts;
  res.steps = steps;
  double nll_base = 0, nll_oea = 0, kl_sum = 0;
  int64_t agree = 0;
  std::vector<double> lp_base, lp_oea;

  // Prefill routes plainly in both runs, so its logits are the same; they predict each stream's first fed
  // token (counted in the perplexity, not in the comparison).
  std::vector<int32_t> next(static_cast<size_t>(B));
  {
    kv::ForwardBatchBuilder bb(page);
    for (int i = 0; i < B; ++i) {
      const auto& p = prompts[static_cast<size_t>(i)];
      bb.add_sequence(base.pages[static_cast<size_t>(i)], 0, p.data(), static_cast<int32_t>(p.size()), true);
    }
    Tensor lb = base.exec->run(bb.finish());
    kv::ForwardBatchBuilder bo(page);
    for (int i = 0; i < B; ++i) {
      const auto& p = prompts[static_cast<size_t>(i)];
      bo.add_sequence(oea.pages[static_cast<size_t>(i)], 0, p.data(), static_cast<int32_t>(p.size()), true);
    }
    Tensor lo = oea.exec->run(bo.finish());
    for (int i = 0; i < B; ++i) {
      const float* rb = lb.data<float>() + static_cast<int64_t>(i) * V;
      next[static_cast<size_t>(i)] = forced ? (*forced)[static_cast<size_t>(i)][0] : argmax(rb, V);
      if (forced) {
        log_softmax(rb, V, lp_base);
        log_softmax(lo.data<float>() + static_cast<int64_t>(i) * V, V, lp_oea);
        nll_base -= lp_base[static_cast<size_t>(next[static_cast<size_t>(i)])];
        nll_oea -= lp_oea[static_cast<size_t>(next[static_cast<size_t>(i)])];
        ++res.predicted_tokens;
      }
    }
  }

  for (int s = 0; s < steps; ++s) {
    Tensor logits[2];
    Run* runs[2] = {&base, &oea};
    for (int r = 0; r < 2; ++r) {
      kv::ForwardBatchBuilder bb(page);
      for (int i = 0; i < B; ++i) {
        const int32_t pos = static_cast<int32_t>(prompts[static_cast<size_t>(i)].size()) + s;
        bb.add_sequence(runs[r]->pages[static_cast<size_t>(i)], pos, &next[static_cast<size_t>(i)], 1, true);
      }
      runs[r]->routing.decode_tokens.assign(static_cast<size_t>(B), 1);
      logits[r] = runs[r]->exec->run(bb.finish(), runs[r]->routing);
    }
    for (int i = 0; i < B; ++i) {
      const float* rb = logits[0].data<float>() + static_cast<int64_t>(i) * V;
      const float* ro = logits[1].data<float>() + static_cast<int64_t>(i) * V;
      log_softmax(rb, V, lp_base);
      log_softmax(ro, V, lp_oea);
      double kl = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double pb = std::exp(lp_base[static_cast<size_t>(v)]);
        if (pb > 0) kl += pb * (lp_base[static_cast<size_t>(v)] - lp_oea[static_cast<size_t>(v)]);
      }
      kl = std::max(kl, 0.0);  // rounding can leave a tiny negative for equal distributions
      kl_sum += kl;
      res.kl_max = std::max(res.kl_max, kl);
      const int32_t top_b = argmax(rb, V);
      agree += top_b == argmax(ro, V);
      ++res.compared;
      if (forced) {
        const auto& f = (*forced)[static_cast<size_t>(i)];
        if (static_cast<size_t>(s) + 1 < f.size()) {
          const int32_t t = f[static_cast<size_t>(s) + 1];
          nll_base -= lp_base[static_cast<size_t>(t)];
          nll_oea -= lp_oea[static_cast<size_t>(t)];
          ++res.predicted_tokens;
          next[static_cast<size_t>(i)] = t;
        }
      } else {
        next[static_cast<size_t>(i)] = top_b;
      }
    }
  }

  res.top1_agreement = static_cast<double>(agree) / static_cast<double>(res.compared);
  res.kl_mean = kl_sum / static_cast<double>(res.compared);
  if (forced && res.predicted_tokens > 0) {
    res.ppl_baseline = std::exp(nll_base / static_cast<double>(res.predicted_tokens));
    res.ppl_oea = std::exp(nll_oea / static_cast<double>(res.predicted_tokens));
  }
  res.distinct_experts_baseline = base.stats.mean(moe::RoutingKind::Baseline);
  res.distinct_experts_oea = oea.stats.mean(moe::RoutingKind::Oea);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const moe::DistinctExpertsHistogram hb = base.stats.histogram(l, moe::RoutingKind::Baseline);
    if (hb.count == 0) continue;
    res.moe_layers.push_back(l);
    res.distinct_experts_baseline_per_layer.push_back(hb.mean());
    res.distinct_experts_oea_per_layer.push_back(oea.stats.mean(l, moe::RoutingKind::Oea));
  }
  return res;
}

}  // namespace

nlohmann::json MoeEvalResult::to_json() const {
  nlohmann::json j;
  j["source"] = source;
  j["batch"] = batch;
  j["k0"] = k0;
  j["kmax"] = kmax;
  j["top_k"] = top_k;
  j["n_experts"] = n_experts;
  j["steps"] = steps;
  j["distinct_experts_baseline"] = distinct_experts_baseline;
  j["distinct_experts_oea"] = distinct_experts_oea;
  j["distinct_experts_reduction"] = distinct_experts_reduction();
  j["moe_layers"] = moe_layers;
  j["distinct_experts_baseline_per_layer"] = distinct_experts_baseline_per_layer;
  j["distinct_experts_oea_per_layer"] = distinct_experts_oea_per_layer;
  j["compared"] = compared;
  j["top1_agreement"] = top1_agreement;
  j["kl_mean"] = kl_mean;
  j["kl_max"] = kl_max;
  if (ppl_baseline) {
    j["ppl_baseline"] = *ppl_baseline;
    j["ppl_oea"] = *ppl_oea;
    j["predicted_tokens"] = predicted_tokens;
  }
  return j;
}

MoeEvalResult moe_eval_prompts(model::Model& m, const std::vector<std::vector<int32_t>>& prompts,
                               const MoeEvalOptions& o) {
  return evaluate(m, prompts, nullptr, o.steps, o);
}

MoeEvalResult moe_eval_text(model::Model& m, const std::vector<int32_t>& text_ids, int batch,
                            const MoeEvalOptions& o) {
  MS_CHECK(batch >= 1, "moe-eval: --batch must be at least 1, got {}", batch);
  MS_CHECK(o.steps >= 1, "moe-eval: --steps must be at least 1, got {}", o.steps);
  const int64_t per = std::min<int64_t>(static_cast<int64_t>(text_ids.size()) / batch, o.steps + 2);
  MS_CHECK(per >= 3,
           "moe-eval: the text has {} tokens, too few for {} streams of at least 3 tokens (a prompt token, a "
           "decode step and its target)",
           text_ids.size(), batch);
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch)), fed(static_cast<size_t>(batch));
  for (int i = 0; i < batch; ++i) {
    const auto first = text_ids.begin() + static_cast<int64_t>(i) * per;
    prompts[static_cast<size_t>(i)].assign(first, first + 1);
    fed[static_cast<size_t>(i)].assign(first + 1, first + per);  // fed[0] is fed first; fed[s+1] is target
  }
  // per - 2 decode steps: the last fed token's prediction would have no target.
  MoeEvalResult r = evaluate(m, prompts, &fed, static_cast<int>(per - 2), o);
  r.source = "text";
  return r;
}

std::vector<std::vector<int32_t>> fixed_token_prompts(int batch, int64_t vocab) {
  MS_CHECK(vocab > 0, "moe-eval: vocabulary of {} tokens", vocab);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(std::max(batch, 0)));
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < batch; ++i) {
    const int len = 4 + (i * 5) % 9;
    for (int j = 0; j < len; ++j) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;  // LCG; high bits are the good ones
      out[static_cast<size_t>(i)].push_back(static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab)));
    }
  }
  return out;
}

std::vector<std::string> fixed_text_prompts(int batch) {
  static const char* const kSentences[16] = {
      "The quick brown fox jumps over the lazy dog.",
      "In the beginning the universe was created.",
      "To make bread, mix flour, water, salt and yeast,",
      "The capital of France is",
      "def fibonacci(n):\n    if n < 2:\n        return n\n",
      "Once upon a time, in a small village by the sea,",
      "The mitochondria is the powerhouse of the cell because",
      "Dear customer, thank you for your order. Your package",
      "SELECT name, price FROM products WHERE",
      "The theory of relativity says that",
      "1, 1, 2, 3, 5, 8, 13,",
      "She opened the door and saw",
      "Rain fell softly on the roof while",
      "Q: What is the boiling point of water?\nA:",
      "int main(void) { printf(\"hello, world\\n\");",
      "The stock market fell sharply today after",
  };
  std::vector<std::string> out;
  for (int i = 0; i < batch; ++i) {
    std::string s = kSentences[i % 16];
    // Past 16, a second sentence keeps every prompt distinct up to batch 256: (i % 16, (i / 16 + i) % 16)
    // never repeats there.
    if (i >= 16) s += std::string(" ") + kSentences[(i / 16 + i) % 16];
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace ms::eval
