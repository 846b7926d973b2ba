#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kv/forward_batch.h"
#include "kv/page_allocator.h"

namespace ms::eval {

namespace {

constexpr int32_t kPage = 64;

void log_softmax(const float* x, int64_t n, std::vector<double>& out) {
  out.resize(static_cast<size_t>(n));
  double mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  const double lse = mx + std::log(sum);
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<double>(x[i]) - lse;
}

size_t argmax(const std::vector<double>& x) {
  return static_cast<size_t>(std::max_element(x.begin(), x.end()) - x.begin());
}

// The logits of one group of windows under one setting: rows[w][t] predicts token t + 1 of window w.
class Runner {
 public:
  Runner(const PplSetting& s, int n_windows, int context, const MakeExecutor& make) : s_(s) {
    const int32_t per = (context + kPage - 1) / kPage;
    runtime::ExecutorConfig c;
    c.num_pages = per * n_windows;
    c.page_size = kPage;
    c.kv_cache_dtype = s.kv_dtype;
    c.max_tokens = static_cast<int64_t>(n_windows) * context;
    c.max_seqs = n_windows;
    c.max_logit_rows = c.max_tokens;
    c.max_context = context;
    exec_ = make_executor(make, *s.model, c);
    alloc_ = std::make_unique<kv::PageAllocator>(c.num_pages);
    pages_.resize(static_cast<size_t>(n_windows));
    for (auto& p : pages_) MS_CHECK(alloc_->allocate(per, p), "perplexity: KV pool too small");
  }

  // Feeds tokens [t0, t0 + n) of each active window; returns logits [sum n, vocab] for all fed tokens.
  Tensor feed(const std::vector<const std::vector<int32_t>*>& windows, const std::vector<int>& active,
              int32_t t0, int32_t n, bool decode_step) {
    kv::ForwardBatchBuilder bb(kPage);
    for (int w : active) {
      const auto& win = *windows[static_cast<size_t>(w)];
      const int32_t len = std::min<int32_t>(n, static_cast<int32_t>(win.size()) - t0);
      bb.add_sequence(pages_[static_cast<size_t>(w)], t0, win.data() + t0, len, false);
    }
    kv::ForwardBatch b = bb.finish();
    for (int32_t i = 0; i < b.n_tokens(); ++i) b.logit_rows.push_back(i);
    model::StepRouting routing;
    if (decode_step && s_.oea.enabled) {
      routing.decode_tokens.assign(static_cast<size_t>(b.n_tokens()), 1);
      routing.oea = s_.oea;
    }
    return exec_->run(b, routing, nullptr).clone();
  }

 private:
  const PplSetting& s_;
  std::unique_ptr<runtime::Executor> exec_;
  std::unique_ptr<kv::PageAllocator> alloc_;
  std::vector<std::vector<int32_t>> pages_;
};

void check_setting(const PplSetting& s, const char* which) {
  MS_CHECK(s.model != nullptr, "perplexity: the {} setting has no model", which);
}

}  // namespace

PplResult perplexity(const std::vector<int32_t>& ids, const PplSetting& test, const PplOptions& o,
                     const PplSetting* ref) {
  check_setting(test, "test");
  if (ref) check_setting(*ref, "reference");
  MS_CHECK(o.context >= 2, "perplexity: --context must be at least 2 (got {})", o.context);
  MS_CHECK(o.batch >= 1, "perplexity: --batch must be at least 1 (got {})", o.batch);
  const io::ModelConfig& c = test.model->config();
  const int64_t V = c.vocab_size;
  MS_CHECK(o.context <= c.max_position_embeddings, "perplexity: --context {} is past the model's limit of {}",
           o.context, c.max_position_embeddings);
  if (ref)
    MS_CHECK(ref->model->config().vocab_size == V,
             "perplexity: the reference model's vocabulary ({}) differs from the model's ({})",
             ref->model->config().vocab_size, V);
  if ((test.oea.enabled || (ref && ref->oea.enabled)) && !o.decode)
    MS_THROW("perplexity: OEA acts on decode tokens only; it needs decode mode (drop --prefill)");
  for (size_t i = 0; i < ids.size(); ++i)
    MS_CHECK(ids[i] >= 0 && ids[i] < V, "perplexity: token id {} at {} is outside the vocabulary [0, {})",
             ids[i], i, V);

  std::vector<std::vector<int32_t>> windows;
  for (size_t s = 0; s + 1 < ids.size(); s += static_cast<size_t>(o.context)) {
    const size_t e = std::min(ids.size(), s + static_cast<size_t>(o.context));
    windows.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(s),
                         ids.begin() + static_cast<std::ptrdiff_t>(e));
    if (o.max_windows > 0 && static_cast<int64_t>(windows.size()) >= o.max_windows) break;
  }
  MS_CHECK(!windows.empty(), "perplexity: the text has {} tokens; at least 2 are needed", ids.size());

  PplResult r;
  r.context = o.context;
  r.windows = static_cast<int>(windows.size());
  r.decode = o.decode;
  r.test_label = test.label;
  if (ref) r.reference_label = ref->label;
  double nll_test = 0, nll_ref = 0, kl_sum = 0;
  int64_t agree = 0;
  std::vector<double> kls, lp_t, lp_r;

  // Scores the rows of one forward: row i of `lt` (and `lr`) predicts next[i].
  auto score = [&](const Tensor& lt, const Tensor* lr, const std::vector<int32_t>& next,
                   const std::vector<uint8_t>& counted) {
    for (size_t i = 0; i < next.size(); ++i) {
      if (!counted[i]) continue;
      log_softmax(lt.data<float>() + static_cast<int64_t>(i) * V, V, lp_t);
      nll_test -= lp_t[static_cast<size_t>(next[i])];
      ++r.predicted_tokens;
      if (!lr) continue;
      log_softmax(lr->data<float>() + static_cast<int64_t>(i) * V, V, lp_r);
      nll_ref -= lp_r[static_cast<size_t>(next[i])];
      double kl = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double p = std::exp(lp_r[static_cast<size_t>(v)]);
        if (p > 0) kl += p * (lp_r[static_cast<size_t>(v)] - lp_t[static_cast<size_t>(v)]);
      }
      kl = std::max(kl, 0.0);
      kl_sum += kl;
      kls.push_back(kl);
      if (argmax(lp_t) == argmax(lp_r)) ++agree;
    }
  };

  // One executor per setting for every group (on a GPU each holds the weights): a group's windows take the
  // first pages and write every position they read, so what an earlier group left there is never seen.
  const int per_group = static_cast<int>(std::min(windows.size(), static_cast<size_t>(o.batch)));
  Runner rt(test, per_group, o.context, o.make_executor);
  std::optional<Runner> rr;
  if (ref) rr.emplace(*ref, per_group, o.context, o.make_executor);
  for (size_t g0 = 0; g0 < windows.size(); g0 += static_cast<size_t>(o.batch)) {
    const size_t g1 = std::min(windows.size(), g0 + static_cast<size_t>(o.batch));
    std::vector<const std::vector<int32_t>*> group;
    for (size_t w = g0; w < g1; ++w) group.push_back(&windows[w]);
    const int n = static_cast<int>(group.size());
    if (!o.decode) {
      std::vector<int> active(static_cast<size_t>(n));
      for (int w = 0; w < n; ++w) active[static_cast<size_t>(w)] = w;
      std::vector<int32_t> next;
      std::vector<uint8_t> counted;
      for (const auto* win : group)
        for (size_t t = 0; t < win->size(); ++t) {
          next.push_back(t + 1 < win->size() ? (*win)[t + 1] : 0);
          counted.push_back(t + 1 < win->size());
        }
      Tensor lt = rt.feed(group, active, 0, o.context, false);
      std::optional<Tensor> lr;
      if (rr) lr = rr->feed(group, active, 0, o.context, false);
      score(lt, lr ? &*lr : nullptr, next, counted);
      continue;
    }
    int32_t longest = 0;
    for (const auto* win : group) longest = std::max<int32_t>(longest, static_cast<int32_t>(win->size()));
    // Step t feeds token t of every window that has a token t + 1 to predict.
    for (int32_t t = 0; t + 1 < longest; ++t) {
      std::vector<int> active;
      std::vector<int32_t> next;
      for (int w = 0; w < n; ++w)
        if (t + 1 < static_cast<int32_t>(group[static_cast<size_t>(w)]->size())) {
          active.push_back(w);
          next.push_back((*group[static_cast<size_t>(w)])[static_cast<size_t>(t + 1)]);
        }
      const std::vector<uint8_t> counted(next.size(), 1);
      Tensor lt = rt.feed(group, active, t, 1, t > 0);
      std::optional<Tensor> lr;
      if (rr) lr = rr->feed(group, active, t, 1, t > 0);
      score(lt, lr ? &*lr : nullptr, next, counted);
    }
  }

  const double n = static_cast<double>(std::max<int64_t>(r.predicted_tokens, 1));
  r.test.nll_mean = nll_test / n;
  r.test.ppl = std::exp(r.test.nll_mean);
  if (ref) {
    PplStats s;
    s.nll_mean = nll_ref / n;
    s.ppl = std::exp(s.nll_mean);
    r.reference = s;
    r.kl_mean = kl_sum / n;
    r.top1_agreement = static_cast<double>(agree) / n;
    if (!kls.empty()) {
      std::sort(kls.begin(), kls.end());
      r.kl_max = kls.back();
      r.kl_p99 = kls[std::min(kls.size() - 1, static_cast<size_t>(0.99 * static_cast<double>(kls.size())))];
    }
  }
  return r;
}

nlohmann::json PplResult::to_json() const {
  nlohmann::json j = {{"context", context},
                      {"windows", windows},
                      {"predicted_tokens", predicted_tokens},
                      {"mode", decode ? "decode" : "prefill"},
                      {"setting", test_label},
                      {"ppl", test.ppl},
                      {"nll_mean", test.nll_mean}};
  if (reference) {
    j["reference"] = {
        {"setting", reference_label}, {"ppl", reference->ppl}, {"nll_mean", reference->nll_mean}};
    j["ppl_ratio"] = ppl_ratio();
    j["kl_mean"] = kl_mean;
    j["kl_p99"] = kl_p99;
    j["kl_max"] = kl_max;
    j["top1_agreement"] = top1_agreement;
  }
  return j;
}

}  // namespace ms::eval
