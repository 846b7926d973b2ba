// `moeserve chat`: a terminal conversation through the model's chat template. Each line of stdin is a user
// turn; the reply streams to stdout as it is generated and joins the history, so the next turn's prompt
// holds the whole conversation. Works piped as well as on a terminal (the "> " prompt only on a terminal).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "cli/device_options.h"
#include "cli/engine_flags.h"
#include "cli/text_model.h"
#include "core/error.h"
#include "tokenizer/incremental_detokenizer.h"

namespace ms::cli {

namespace {

struct ChatOptions {
  EngineFlags eng;
  std::string chat_template, system;
  int max_tokens = 64, top_k = 0;
  float temperature = 0.0f, top_p = 1.0f;
  uint64_t seed = 0;
  bool speeds = false;
};

// Role markers that end an assistant turn in GLM- and DeepSeek-style templates, when the tokenizer has
// them as single tokens (a model that starts the next turn itself has finished its reply).
std::vector<int32_t> turn_end_ids(const tokenizer::Tokenizer& tok) {
  std::vector<int32_t> ids;
  for (const char* t : {"<|endoftext|>", "<|user|>", "<|observation|>", "<|end▁of▁sentence|>", "<|User|>"}) {
    const int32_t id = tok.token_to_id(t);
    if (id >= 0) ids.push_back(id);
  }
  return ids;
}

int run_chat(ChatOptions o) {
  o.eng.model_dir = resolve_model_dir(o.eng.model_dir);
  std::unique_ptr<tokenizer::Tokenizer> tok = load_text_tokenizer(o.eng.model_dir);
  if (!tok) MS_THROW("{} has no tokenizer.json: chat needs one", o.eng.model_dir);
  std::unique_ptr<tokenizer::ChatTemplate> tmpl = load_chat_template(o.eng.model_dir, o.chat_template);
  model::LoadedModel lm = load_engine_model(o.eng);
  std::fprintf(stderr, "model: %s\n", lm.description.c_str());
  const int64_t ctx = lm.model->config().max_position_embeddings;
  auto engine_ptr = make_engine(lm, engine_config_for(lm, o.eng.kv_dtype, ctx, o.eng.page_size), o.eng.dev);
  runtime::Engine& engine = *engine_ptr;

  const bool tty = isatty(STDIN_FILENO) != 0;
  if (tty) std::fprintf(stderr, "(one message per line; Ctrl-D ends the chat)\n");
  tokenizer::ChatInputs in;
  if (!o.system.empty()) in.messages.push_back({{"role", "system"}, {"content", o.system}});
  const std::vector<int32_t> stops = turn_end_ids(*tok);
  std::string line;
  while (true) {
    if (tty) std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    in.messages.push_back({{"role", "user"}, {"content", line}});
    const std::string prompt = tmpl->render(in);
    runtime::Request r;
    r.prompt_ids = tok->encode(prompt, /*add_special_tokens=*/false);
    if (static_cast<int64_t>(r.prompt_ids.size()) + o.max_tokens > ctx)
      MS_THROW("the conversation ({} tokens) plus --max-tokens {} no longer fits the context of {} tokens",
               r.prompt_ids.size(), o.max_tokens, ctx);
    r.max_tokens = o.max_tokens;
    r.stop_token_ids = stops;
    r.sampling.temperature = o.temperature;
    r.sampling.top_p = o.top_p;
    r.sampling.top_k = o.top_k;
    if (o.seed) r.sampling.seed = o.seed;
    tokenizer::IncrementalDetokenizer detok(*tok);
    std::string reply;
    std::fputs("assistant: ", stdout);
    StreamResult res = stream_request(engine, r, [&](int32_t id) {
      const std::string piece = detok.push(id);
      reply += piece;
      std::fputs(piece.c_str(), stdout);
      std::fflush(stdout);
    });
    const std::string tail = detok.flush();
    reply += tail;
    std::printf("%s\n", tail.c_str());
    std::fflush(stdout);
    if (o.speeds) print_speeds(res);
    in.messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  return 0;
}

Registration reg(
    "chat", "Chat in the terminal through the model's chat template (one message per line)",
    [](CLI::App& app) {
      auto o = std::make_shared<ChatOptions>();
      add_engine_flags(app, o->eng, engine_flag::kCommon);
      app.add_option("--chat-template", o->chat_template,
                     "Jinja chat template file (default: the model's, or the built-in one)");
      app.add_option("--system", o->system, "System message that opens the conversation");
      app.add_option("--max-tokens", o->max_tokens, "Most tokens per reply")->capture_default_str();
      app.add_option("--temperature", o->temperature, "Sampling temperature (0: greedy)")
          ->capture_default_str();
      app.add_option("--top-p", o->top_p, "Nucleus sampling mass")->capture_default_str();
      app.add_option("--top-k", o->top_k, "Keep the k most likely tokens (0: off)")->capture_default_str();
      app.add_option("--seed", o->seed, "Random seed (0: none)");
      app.add_flag("--speeds", o->speeds, "Print prefill and decode speeds after each reply (stderr)");
      return [o] { return run_chat(*o); };
    });

}  // namespace

}  // namespace ms::cli
