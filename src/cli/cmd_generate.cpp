// `moeserve generate`: runs one prompt through the Engine, streaming text (or ids) as tokens come, then
// prints the prefill and decode speeds.
#include <cstdio>
#include <optional>
#include <sstream>

#include "cli/command.h"
#include "cli/device_options.h"
#include "cli/engine_flags.h"
#include "cli/text_model.h"
#include "core/error.h"
#include "tokenizer/incremental_detokenizer.h"

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
  EngineFlags eng;
  std::string prompt, prompt_ids;
  int max_tokens = 32, top_k = 0;
  float temperature = 0.0f, top_p = 1.0f;
  uint64_t seed = 0;
  bool print_ids = false;
};

int run_generate(GenerateOptions o) {
  o.eng.model_dir = resolve_model_dir(o.eng.model_dir);
  if (o.prompt.empty() == o.prompt_ids.empty()) MS_THROW("give exactly one of --prompt and --prompt-ids");
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::vector<int32_t> ids;
  if (!o.prompt.empty()) {
    tok = load_text_tokenizer(o.eng.model_dir);
    if (!tok)
      MS_THROW(
          "{} has no tokenizer.json, so --prompt cannot be tokenized: give the prompt as token ids with "
          "--prompt-ids 1,2,3 (and --print-ids)",
          o.eng.model_dir);
    ids = tok->encode(o.prompt);
  } else {
    ids = parse_ids(o.prompt_ids);
    if (!o.print_ids) tok = load_text_tokenizer(o.eng.model_dir);
  }
  model::LoadedModel lm = load_engine_model(o.eng);
  std::fprintf(stderr, "model: %s\n", lm.description.c_str());
  if (tok && tok->vocab_size() > lm.model->config().vocab_size)
    MS_THROW("the tokenizer has {} tokens, more than the model's vocab_size {}", tok->vocab_size(),
             lm.model->config().vocab_size);
  runtime::EngineConfig ec =
      engine_config_for(lm, o.eng.kv_dtype, static_cast<int64_t>(ids.size()) + o.max_tokens, o.eng.page_size);
  if (const auto oea = oea_config(o.eng)) ec.oea = *oea;
  apply_expert_recording(o.eng.eplb, ec);
  auto engine_ptr = make_engine(lm, ec, o.eng.dev);
  runtime::Engine& engine = *engine_ptr;
  runtime::Request r;
  r.prompt_ids = ids;
  r.max_tokens = o.max_tokens;
  r.sampling.temperature = o.temperature;
  r.sampling.top_p = o.top_p;
  r.sampling.top_k = o.top_k;
  if (o.seed) r.sampling.seed = o.seed;

  const bool text = tok && !o.print_ids;
  std::optional<tokenizer::IncrementalDetokenizer> detok;
  if (text) detok.emplace(*tok);
  if (!text) std::printf("[");
  size_t n = 0;
  StreamResult res = stream_request(engine, r, [&](int32_t id) {
    if (text) {
      std::fputs(detok->push(id).c_str(), stdout);
    } else {
      std::printf(n ? ", %d" : "%d", id);
    }
    ++n;
    std::fflush(stdout);
  });
  if (text)
    std::printf("%s\n", detok->flush().c_str());
  else
    std::printf("]\n");
  std::fflush(stdout);
  print_speeds(res);
  save_expert_distribution(o.eng.eplb, engine);
  return 0;
}

Registration reg(
    "generate", "Generate a continuation of one prompt (built-in model without --model)", [](CLI::App& app) {
      auto o = std::make_shared<GenerateOptions>();
      add_engine_flags(app, o->eng, engine_flag::kCommon | engine_flag::kOea | engine_flag::kLoadFormat);
      app.add_option("--prompt", o->prompt, "Prompt text (needs the model's tokenizer.json)");
      app.add_option("--prompt-ids", o->prompt_ids, "Prompt token ids, comma-separated: 1,2,3");
      app.add_option("--max-tokens", o->max_tokens, "Tokens to generate")->capture_default_str();
      app.add_option("--temperature", o->temperature, "Sampling temperature (0: greedy)")
          ->capture_default_str();
      app.add_option("--top-p", o->top_p, "Nucleus sampling mass")->capture_default_str();
      app.add_option("--top-k", o->top_k, "Keep the k most likely tokens (0: off)")->capture_default_str();
      app.add_option("--seed", o->seed, "Random seed (0: none)");
      app.add_flag("--print-ids", o->print_ids,
                   "Print the generated token ids as a JSON array instead of text (also what a "
                   "checkpoint without a tokenizer prints)");
      return [o] { return run_generate(*o); };
    });

}  // namespace

}  // namespace ms::cli
