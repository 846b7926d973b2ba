// `moeserve perplexity`: perplexity over a text in windows of --context tokens, and with --reference the KL
// divergence and top-1 agreement against another setting (see eval/perplexity.h).
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/text_model.h"
#include "core/error.h"
#include "eval/perplexity.h"
#include "model/load_model.h"

namespace ms::cli {

namespace {

struct PerplexityCliOptions {
  EngineFlags eng;
  std::string text_file, reference;
  bool prefill = false, json = false;
  eval::PplOptions ppl;
};

struct SettingSpec {
  std::string model_dir, kv_dtype;
  int oea_k0 = 0, oea_kmax = 0;
};

// "model=DIR,kv-cache-dtype=f32,oea-k0=2": fields of the reference that differ from the test setting.
SettingSpec parse_reference(const std::string& text, SettingSpec base) {
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      MS_THROW("--reference: '{}' is not KEY=VALUE (keys: model, kv-cache-dtype, oea-k0, oea-kmax)", item);
    const std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    auto to_int = [&](const std::string& s) {
      try {
        return std::stoi(s);
      } catch (const std::exception&) {
        MS_THROW("--reference: {}={} is not an integer", k, s);
      }
    };
    if (k == "model")
      base.model_dir = v;
    else if (k == "kv-cache-dtype" || k == "kv")
      base.kv_dtype = v;
    else if (k == "oea-k0")
      base.oea_k0 = to_int(v);
    else if (k == "oea-kmax")
      base.oea_kmax = to_int(v);
    else
      MS_THROW("--reference: unknown key '{}' (keys: model, kv-cache-dtype, oea-k0, oea-kmax)", k);
  }
  return base;
}

std::string describe(const SettingSpec& s, kv::KvCacheDType dt) {
  std::string d = fmt::format("{} kv", kv::kv_cache_dtype_name(dt));
  if (s.oea_k0 > 0)
    d += fmt::format(", oea k0={}{}", s.oea_k0, s.oea_kmax ? fmt::format(" kmax={}", s.oea_kmax) : "");
  return d;
}

int run_perplexity(PerplexityCliOptions o) {
  o.eng.model_dir = resolve_model_dir(o.eng.model_dir);
  o.ppl.make_executor = [dev = o.eng.dev](const model::Model& m, const runtime::ExecutorConfig& ec) {
    return make_executor(m, ec, dev);
  };
  const SettingSpec test_spec{o.eng.model_dir, o.eng.kv_dtype, o.eng.oea_k0, o.eng.oea_kmax};
  std::optional<SettingSpec> ref_spec;
  if (!o.reference.empty()) ref_spec = parse_reference(o.reference, test_spec);

  std::map<std::string, model::LoadedModel> models;  // one load per directory
  auto get = [&](const std::string& dir) -> model::LoadedModel& {
    auto it = models.find(dir);
    if (it == models.end()) it = models.emplace(dir, model::load_model(dir)).first;
    return it->second;
  };
  auto make = [&](const SettingSpec& s) {
    model::LoadedModel& lm = get(s.model_dir);
    eval::PplSetting st;
    st.model = lm.model.get();
    st.kv_dtype = kv::parse_kv_cache_dtype(s.kv_dtype);
    if (st.kv_dtype == kv::KvCacheDType::Auto) st.kv_dtype = lm.kv_auto;
    if (s.oea_k0 > 0) st.oea = moe::OeaConfig{true, s.oea_k0, s.oea_kmax};
    st.label =
        (s.model_dir.empty() ? std::string("built-in model") : s.model_dir) + ", " + describe(s, st.kv_dtype);
    return st;
  };
  const eval::PplSetting test = make(test_spec);
  std::optional<eval::PplSetting> ref;
  if (ref_spec) ref = make(*ref_spec);

  auto tok = load_text_tokenizer(o.eng.model_dir);
  if (!tok) MS_THROW("perplexity: {} has no tokenizer.json", o.eng.model_dir);
  std::ifstream f(o.text_file, std::ios::binary);
  if (!f) MS_THROW("perplexity: cannot read --text file {}", o.text_file);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::vector<int32_t> ids = tok->encode(ss.str(), false);
  o.ppl.decode = !o.prefill;
  const eval::PplResult r = eval::perplexity(ids, test, o.ppl, ref ? &*ref : nullptr);

  if (o.json) {
    std::printf("%s\n", r.to_json().dump(1).c_str());
    return 0;
  }
  std::printf("text: %s, %zu tokens; %d windows of up to %d tokens (%s mode), %lld tokens predicted\n",
              o.text_file.c_str(), ids.size(), r.windows, r.context, r.decode ? "decode" : "prefill",
              static_cast<long long>(r.predicted_tokens));
  std::printf("%-40s perplexity %.4f (%.4f nats/token)\n", r.test_label.c_str(), r.test.ppl, r.test.nll_mean);
  if (r.reference) {
    std::printf("%-40s perplexity %.4f (%.4f nats/token)  [reference]\n", r.reference_label.c_str(),
                r.reference->ppl, r.reference->nll_mean);
    std::printf("perplexity ratio %.5f (%+.3f%%)\n", r.ppl_ratio(), 100.0 * (r.ppl_ratio() - 1.0));
    std::printf("KL(reference || test): mean %.6f, 99%% %.6f, max %.6f nats; top-1 agreement %.4f%%\n",
                r.kl_mean, r.kl_p99, r.kl_max, 100.0 * r.top1_agreement);
  }
  return 0;
}

Registration reg(
    "perplexity",
    "Perplexity over a text in windows; with --reference, KL and top-1 agreement against another setting",
    [](CLI::App& app) {
      auto o = std::make_shared<PerplexityCliOptions>();
      add_engine_flags(
          app, o->eng,
          engine_flag::kModel | engine_flag::kDevice | engine_flag::kKvCacheDtype | engine_flag::kOea);
      app.add_option("--text", o->text_file, "A UTF-8 text file")->required();
      app.add_option("--context", o->ppl.context, "Tokens per window")->capture_default_str();
      app.add_option("--batch", o->ppl.batch, "Windows evaluated together (OEA's base set spans them)")
          ->capture_default_str();
      app.add_option("--max-windows", o->ppl.max_windows, "Evaluate at most this many windows (0: all)")
          ->capture_default_str();
      app.add_flag("--prefill", o->prefill,
                   "Run each window as one prompt forward instead of token by token (no OEA)");
      app.add_option(
          "--reference", o->reference,
          "Compare against another setting: KEY=VALUE,... with keys model, kv-cache-dtype, oea-k0, "
          "oea-kmax (the rest as the test setting), e.g. kv-cache-dtype=f32");
      app.add_flag("--json", o->json, "Print the result as JSON");
      return [o] { return run_perplexity(*o); };
    });

}  // namespace

}  // namespace ms::cli
