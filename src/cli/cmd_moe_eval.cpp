// `moeserve moe-eval`: what Opportunistic Expert Activation does to a model's decode, baseline routing and
// OEA side by side on the same tokens (see eval/moe_eval.h).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/engine_flags.h"
#include "core/error.h"
#include "eval/moe_eval.h"
#include "model/load_model.h"
#include "tokenizer/builtin.h"
#include "tokenizer/tokenizer.h"

namespace ms::cli {

namespace {

struct MoeEvalCliOptions {
  EngineFlags eng;
  std::string text_file;
  int batch = 0;
  bool json = false;
  eval::MoeEvalOptions eval;
};

// The checkpoint's tokenizer.json, the built-in tokenizer for the built-in model, or none.
std::unique_ptr<tokenizer::Tokenizer> find_tokenizer(const std::string& model_dir) {
  if (model_dir.empty())
    return tokenizer::Tokenizer::from_json_text(tokenizer::builtin_tokenizer_json(), "built-in tokenizer");
  const std::filesystem::path p = std::filesystem::path(model_dir) / "tokenizer.json";
  if (!std::filesystem::exists(p)) return nullptr;
  return tokenizer::Tokenizer::from_file(p.string());
}

std::vector<int32_t> encode_checked(const tokenizer::Tokenizer& tok, const std::string& text, int64_t vocab,
                                    const std::string& what) {
  std::vector<int32_t> ids = tok.encode(text);
  for (int32_t t : ids)
    if (t < 0 || t >= vocab)
      MS_THROW("moe-eval: the tokenizer gives id {} for {}, outside the model's vocabulary [0, {})", t, what,
               vocab);
  return ids;
}

std::string fmt_layers(const std::vector<double>& v) {
  std::string s;
  for (double x : v) s += (s.empty() ? "" : " ") + fmt::format("{:.2f}", x);
  return s;
}

int run_moe_eval(MoeEvalCliOptions o) {
  kv::parse_kv_cache_dtype(o.eng.kv_dtype);  // a bad value fails before the model loads
  model::LoadedModel lm = load_engine_model(o.eng);
  o.eval.kv_dtype = resolve_kv_dtype(o.eng, lm);
  o.eval.make_executor = [dev = o.eng.dev](const model::Model& m, const runtime::ExecutorConfig& ec) {
    return make_executor(m, ec, dev);
  };
  model::Model& m = *lm.model;
  const int64_t V = m.config().vocab_size;
  std::unique_ptr<tokenizer::Tokenizer> tok = find_tokenizer(o.eng.model_dir);
  eval::MoeEvalResult r;
  if (!o.text_file.empty()) {
    if (!tok) MS_THROW("moe-eval: --text needs a tokenizer, and {} has no tokenizer.json", o.eng.model_dir);
    std::ifstream f(o.text_file, std::ios::binary);
    if (!f) MS_THROW("moe-eval: cannot read --text file {}", o.text_file);
    std::stringstream ss;
    ss << f.rdbuf();
    r = eval::moe_eval_text(m, encode_checked(*tok, ss.str(), V, "--text " + o.text_file), o.batch, o.eval);
  } else if (tok) {
    std::vector<std::vector<int32_t>> prompts;
    for (const std::string& p : eval::fixed_text_prompts(o.batch))
      prompts.push_back(encode_checked(*tok, p, V, "a fixed prompt"));
    r = eval::moe_eval_prompts(m, prompts, o.eval);
    r.source = "text prompts";
  } else {
    r = eval::moe_eval_prompts(m, eval::fixed_token_prompts(o.batch, V), o.eval);
    r.source = "token-id prompts";
  }
  if (o.json) {
    nlohmann::json j = r.to_json();
    j["model"] = lm.description;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model: %s\n", lm.description.c_str());
  std::printf("%s, batch %d, %d decode steps, top-%d of %d experts, OEA k0 %d kmax %d\n", r.source.c_str(),
              r.batch, r.steps, r.top_k, r.n_experts, r.k0, r.kmax);
  std::printf("distinct experts per MoE layer per step: baseline %.2f, OEA %.2f (%.1f%% fewer)\n",
              r.distinct_experts_baseline, r.distinct_experts_oea, 100.0 * r.distinct_experts_reduction());
  std::printf("  per layer: baseline [%s], OEA [%s]\n",
              fmt_layers(r.distinct_experts_baseline_per_layer).c_str(),
              fmt_layers(r.distinct_experts_oea_per_layer).c_str());
  std::printf(
      "top-1 agreement %.4f over %lld next-token distributions; KL(baseline || OEA) mean %.3g, max %.3g\n",
      r.top1_agreement, static_cast<long long>(r.compared), r.kl_mean, r.kl_max);
  if (r.ppl_baseline)
    std::printf("perplexity over %lld text tokens: baseline %.4f, OEA %.4f\n",
                static_cast<long long>(r.predicted_tokens), *r.ppl_baseline, *r.ppl_oea);
  return 0;
}

Registration reg(
    "moe-eval", "Compare decode with and without Opportunistic Expert Activation", [](CLI::App& app) {
      auto o = std::make_shared<MoeEvalCliOptions>();
      o->eng.kv_dtype = "f32";
      add_engine_flags(app, o->eng, engine_flag::kModel | engine_flag::kDevice | engine_flag::kKvCacheDtype);
      app.add_option("--batch", o->batch, "Sequences decoded together")
          ->required()
          ->check(CLI::PositiveNumber);
      app.add_option("--k0", o->eval.k0, "OEA: experts each token keeps")->required();
      app.add_option("--kmax", o->eval.kmax, "OEA: slots a token may fill (default: top-k)");
      app.add_option("--steps", o->eval.steps, "Decode steps per sequence")->capture_default_str();
      app.add_option("--text", o->text_file,
                     "Text file: decode it teacher-forced in --batch streams and report perplexity");
      app.add_flag("--json", o->json, "Print one JSON object");
      return [o] { return run_moe_eval(*o); };
    });

}  // namespace

}  // namespace ms::cli
