// `moeserve logits`: the full-prompt forward as one F32 tensor `logits` [len, vocab] in a safetensors file.
#include <cstdio>
#include <sstream>

#include "cli/command.h"
#include "cli/engine_flags.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/load_model.h"

namespace ms::cli {

namespace {

struct LogitsOptions {
  EngineFlags eng;
  std::string prompt_ids, out;
};

int run_logits(const LogitsOptions& o) {
  std::vector<int32_t> ids;
  std::stringstream ss(o.prompt_ids);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) {
      try {
        ids.push_back(static_cast<int32_t>(std::stol(item)));
      } catch (const std::exception&) {
        MS_THROW("--prompt-ids: '{}' is not a token id", item);
      }
    }
  if (ids.empty()) MS_THROW("--prompt-ids: the prompt is empty");
  model::LoadedModel lm = load_engine_model(o.eng);
  const auto& cfg = lm.model->config();
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= cfg.vocab_size)
      MS_THROW("prompt token id {} at position {} is outside the vocabulary [0, {})", ids[i], i,
               cfg.vocab_size);
  if (static_cast<int64_t>(ids.size()) > cfg.max_position_embeddings)
    MS_THROW("the prompt ({} tokens) is past the context limit of {}", ids.size(),
             cfg.max_position_embeddings);
  const int32_t page = 64;
  const kv::KvCacheDType dt = resolve_kv_dtype(o.eng, lm);
  runtime::ExecutorConfig ec;
  ec.page_size = page;
  ec.num_pages = static_cast<int32_t>((ids.size() + page - 1) / page);
  ec.kv_cache_dtype = dt;
  ec.max_tokens = static_cast<int64_t>(ids.size());
  ec.max_seqs = 1;
  ec.max_logit_rows = ec.max_tokens;
  ec.max_context = ec.max_tokens;
  const std::unique_ptr<runtime::Executor> exec = make_executor(*lm.model, ec, o.eng.dev);
  std::vector<int32_t> pages(static_cast<size_t>(ec.num_pages));
  for (int32_t i = 0; i < ec.num_pages; ++i) pages[static_cast<size_t>(i)] = i;
  kv::ForwardBatchBuilder bb(page);
  bb.add_sequence(pages, 0, ids.data(), static_cast<int32_t>(ids.size()), false);
  kv::ForwardBatch b = bb.finish();
  for (int32_t i = 0; i < b.n_tokens(); ++i) b.logit_rows.push_back(i);
  Tensor logits = exec->run(b);
  io::write_safetensors(o.out, {{"logits", logits}});
  std::fprintf(stderr, "wrote logits f32[%zu, %lld] to %s\n", ids.size(),
               static_cast<long long>(cfg.vocab_size), o.out.c_str());
  return 0;
}

Registration reg(
    "logits", "Write the full-prompt logits of a model to a safetensors file", [](CLI::App& app) {
      auto o = std::make_shared<LogitsOptions>();
      o->eng.kv_dtype = "f32";
      add_engine_flags(app, o->eng, engine_flag::kModel | engine_flag::kDevice | engine_flag::kKvCacheDtype);
      app.add_option("--prompt-ids", o->prompt_ids, "Prompt token ids, comma-separated")->required();
      app.add_option("--out", o->out, "Output .safetensors file")->required();
      return [o] { return run_logits(*o); };
    });

}  // namespace

}  // namespace ms::cli
