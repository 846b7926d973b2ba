// `moeserve generate`: runs one prompt through the Engine, streaming tokens as they come, then prints the
// prefill and decode speeds.
#include <chrono>
#include <cstdio>
#include <sstream>

#include "cli/command.h"
#include "core/error.h"
#include "model/load_model.h"
#include "runtime/engine.h"

namespace ms::cli {

namespace {

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size() || v < INT32_MIN || v > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      MS_THROW("--prompt-ids: '{}' is not a token id", item);
    }
  }
  return ids;
}

struct GenerateOptions {
  std::string model_dir, prompt, prompt_ids, kv_dtype = "auto";
  int max_tokens = 32, top_k = 0, page_size = 64, oea_k0 = 0, oea_kmax = 0;
  float temperature = 0.0f, top_p = 1.0f;
  uint64_t seed = 0;
  bool print_ids = false;
};

int run_generate(const GenerateOptions& o) {
  if (o.prompt.empty() == o.prompt_ids.empty()) MS_THROW("give exactly one of --prompt and --prompt-ids");
  model::LoadedModel lm = model::load_model(o.model_dir);
  std::fprintf(stderr, "model: %s\n", lm.description.c_str());
  std::vector<int32_t> ids;
  if (!o.prompt.empty())
    MS_THROW("--prompt needs the tokenizer, which this build does not have yet; use --prompt-ids");
  ids = parse_ids(o.prompt_ids);
  runtime::EngineConfig ec;
  ec.page_size = o.page_size;
  ec.kv_cache_dtype = kv::parse_kv_cache_dtype(o.kv_dtype);
  if (ec.kv_cache_dtype == kv::KvCacheDType::Auto) ec.kv_cache_dtype = lm.kv_auto;
  ec.kv_cache_tokens =
      std::max<int64_t>(static_cast<int64_t>(ids.size()) + o.max_tokens + o.page_size, 4 * 64);
  ec.max_running = 1;
  if (o.oea_kmax > 0 && o.oea_k0 <= 0) MS_THROW("--oea-kmax needs --oea-k0");
  if (o.oea_k0 > 0) ec.oea = moe::OeaConfig{true, o.oea_k0, o.oea_kmax};
  runtime::Engine engine(lm.model, ec);
  runtime::Request r;
  r.prompt_ids = ids;
  r.max_tokens = o.max_tokens;
  r.sampling.temperature = o.temperature;
  r.sampling.top_p = o.top_p;
  r.sampling.top_k = o.top_k;
  if (o.seed) r.sampling.seed = o.seed;
  engine.submit(r);

  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto t_first = t0;
  int generated = 0;
  runtime::FinishReason why = runtime::FinishReason::None;
  std::printf("[");
  while (engine.has_work()) {
    for (const auto& out : engine.step()) {
      for (const auto& g : out.tokens) {
        if (generated == 0) t_first = clock::now();
        std::printf(generated ? ", %d" : "%d", g.token);
        std::fflush(stdout);
        ++generated;
      }
      if (out.finish == runtime::FinishReason::Error) MS_THROW("generation failed: {}", out.error);
      if (out.finish != runtime::FinishReason::None) why = out.finish;
    }
  }
  std::printf("]\n");
  const auto t_end = clock::now();
  const double prefill_s = std::chrono::duration<double>(t_first - t0).count();
  const double decode_s = std::chrono::duration<double>(t_end - t_first).count();
  std::fprintf(stderr, "finish: %s\n", runtime::finish_reason_name(why));
  std::fprintf(stderr, "prefill: %zu tokens in %.3f s (%.1f tokens/s)\n", ids.size(), prefill_s,
               prefill_s > 0 ? static_cast<double>(ids.size()) / prefill_s : 0.0);
  if (generated > 1)
    std::fprintf(stderr, "decode: %d tokens in %.3f s (%.1f tokens/s)\n", generated - 1, decode_s,
                 decode_s > 0 ? (generated - 1) / decode_s : 0.0);
  return 0;
}

Registration reg(
    "generate", "Generate a continuation of one prompt (built-in model without --model)", [](CLI::App& app) {
      auto o = std::make_shared<GenerateOptions>();
      app.add_option("--model", o->model_dir,
                     "Checkpoint directory (Hugging Face layout); default: the built-in model");
      app.add_option("--prompt", o->prompt, "Prompt text");
      app.add_option("--prompt-ids", o->prompt_ids, "Prompt token ids, comma-separated: 1,2,3");
      app.add_option("--max-tokens", o->max_tokens, "Tokens to generate")->capture_default_str();
      app.add_option("--temperature", o->temperature, "Sampling temperature (0: greedy)")
          ->capture_default_str();
      app.add_option("--top-p", o->top_p, "Nucleus sampling mass")->capture_default_str();
      app.add_option("--top-k", o->top_k, "Keep the k most likely tokens (0: off)")->capture_default_str();
      app.add_option("--seed", o->seed, "Random seed (0: none)");
      app.add_option("--kv-cache-dtype", o->kv_dtype, "auto, bf16 or fp8_e4m3")->capture_default_str();
      app.add_option("--page-size", o->page_size, "KV cache page size in tokens")->capture_default_str();
      app.add_option("--oea-k0", o->oea_k0,
                     "Opportunistic Expert Activation on decode steps: experts each token keeps (0: off)");
      app.add_option("--oea-kmax", o->oea_kmax, "OEA: slots a token may fill (0: the model's top-k)");
      app.add_flag("--print-ids", o->print_ids,
                   "Print generated token ids as a JSON array (the default until text "
                   "decoding is available)");
      return [o] { return run_generate(*o); };
    });

}  // namespace

}  // namespace ms::cli
