// What the text commands (generate, chat) share: the model with its tokenizer and chat template, and one
// request streamed through the Engine with its prefill and decode times.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/load_model.h"
#include "runtime/engine.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace ms::cli {

// The checkpoint the text commands (generate, chat, serve, perplexity) run when no --model is given: the
// trained built-in model, models/builtin of the source tree, when it holds a config.json; else "" (the random
// built-in model generated in code). $MOESERVE_BUILTIN_MODEL overrides: a directory, or "random" for the
// generated model. A given `model_dir` is returned as it is.
std::string resolve_model_dir(const std::string& model_dir);

// The tokenizer of `model_dir` (its tokenizer.json), or the built-in tokenizer when model_dir is empty
// (the built-in model); nullptr for a checkpoint without tokenizer.json.
std::unique_ptr<tokenizer::Tokenizer> load_text_tokenizer(const std::string& model_dir);

// `template_file` when given; else the model dir's template; else the built-in template for the built-in
// model. Throws naming where it looked.
std::unique_ptr<tokenizer::ChatTemplate> load_chat_template(const std::string& model_dir,
                                                            const std::string& template_file);

// "auto" resolves to what the checkpoint asks for.
runtime::EngineConfig engine_config_for(const model::LoadedModel& lm, const std::string& kv_dtype,
                                        int64_t max_tokens_in_flight, int page_size);

struct StreamResult {
  std::vector<int32_t> ids;  // generated
  runtime::FinishReason finish = runtime::FinishReason::None;
  int prompt_tokens = 0;
  double prefill_s = 0;  // submit to the first token
  double decode_s = 0;   // first token to the last
};

// Submits `r`, runs the engine until it ends, calls on_token for each token as it comes. Throws on an
// engine error.
StreamResult stream_request(runtime::Engine& engine, const runtime::Request& r,
                            const std::function<void(int32_t)>& on_token);

// "prefill: N tokens in S s (T tokens/s)" and the decode line, on stderr.
void print_speeds(const StreamResult& s);

}  // namespace ms::cli
