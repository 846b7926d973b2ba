#include "cli/text_model.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "tokenizer/builtin.h"

namespace ms::cli {

namespace fs = std::filesystem;

std::string resolve_model_dir(const std::string& model_dir) {
  if (!model_dir.empty()) return model_dir;
  if (const char* env = std::getenv("MOESERVE_BUILTIN_MODEL"); env && *env)
    return std::string(env) == "random" ? std::string() : std::string(env);
#ifdef MOESERVE_SOURCE_DIR
  const fs::path trained = fs::path(MOESERVE_SOURCE_DIR) / "models" / "builtin";
  if (fs::exists(trained / "config.json")) return trained.string();
#endif
  return {};
}

std::unique_ptr<tokenizer::Tokenizer> load_text_tokenizer(const std::string& model_dir) {
  if (model_dir.empty())
    return tokenizer::Tokenizer::from_json_text(tokenizer::builtin_tokenizer_json(), "built-in tokenizer");
  const fs::path p = fs::path(model_dir) / "tokenizer.json";
  if (!fs::exists(p)) return nullptr;
  return tokenizer::Tokenizer::from_file(p.string());
}

std::unique_ptr<tokenizer::ChatTemplate> load_chat_template(const std::string& model_dir,
                                                            const std::string& template_file) {
  if (!template_file.empty()) return tokenizer::ChatTemplate::from_file(template_file);
  if (model_dir.empty())
    return std::make_unique<tokenizer::ChatTemplate>(tokenizer::builtin_chat_template(),
                                                     "built-in chat template");
  const fs::path d(model_dir);
  if (!fs::exists(d / "tokenizer_config.json") && !fs::exists(d / "chat_template.jinja"))
    MS_THROW(
        "{} has no chat template (tokenizer_config.json or chat_template.jinja): give one with "
        "--chat-template FILE",
        model_dir);
  return tokenizer::ChatTemplate::from_model_dir(model_dir);
}

runtime::EngineConfig engine_config_for(const model::LoadedModel& lm, const std::string& kv_dtype,
                                        int64_t max_tokens_in_flight, int page_size) {
  runtime::EngineConfig ec;
  ec.page_size = page_size;
  ec.kv_cache_dtype = kv::parse_kv_cache_dtype(kv_dtype);
  if (ec.kv_cache_dtype == kv::KvCacheDType::Auto) ec.kv_cache_dtype = lm.kv_auto;
  ec.kv_cache_tokens = std::max<int64_t>(max_tokens_in_flight + page_size, 4 * int64_t{page_size});
  ec.max_running = 1;
  return ec;
}

StreamResult stream_request(runtime::Engine& engine, const runtime::Request& r,
                            const std::function<void(int32_t)>& on_token) {
  using clock = std::chrono::steady_clock;
  StreamResult res;
  res.prompt_tokens = static_cast<int>(r.prompt_ids.size());
  const auto t0 = clock::now();
  const uint64_t id = engine.submit(r);
  auto t_first = t0, t_last = t0;
  while (engine.has_work()) {
    for (const auto& out : engine.step()) {
      if (out.request_id != id) continue;
      for (const auto& g : out.tokens) {
        t_last = clock::now();
        if (res.ids.empty()) t_first = t_last;
        res.ids.push_back(g.token);
        on_token(g.token);
      }
      if (out.finish == runtime::FinishReason::Error) MS_THROW("generation failed: {}", out.error);
      if (out.finish != runtime::FinishReason::None) res.finish = out.finish;
    }
  }
  res.prefill_s = std::chrono::duration<double>(t_first - t0).count();
  res.decode_s = std::chrono::duration<double>(t_last - t_first).count();
  return res;
}

void print_speeds(const StreamResult& s) {
  std::fprintf(stderr, "finish: %s\n", runtime::finish_reason_name(s.finish));
  std::fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tokens/s)\n", s.prompt_tokens, s.prefill_s,
               s.prefill_s > 0 ? s.prompt_tokens / s.prefill_s : 0.0);
  const int n = static_cast<int>(s.ids.size()) - 1;  // the first token comes out of the prefill
  if (n > 0)
    std::fprintf(stderr, "decode: %d tokens in %.3f s (%.1f tokens/s)\n", n, s.decode_s,
                 s.decode_s > 0 ? n / s.decode_s : 0.0);
}

}  // namespace ms::cli
