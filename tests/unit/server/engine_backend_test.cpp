// EngineBackend over the built-in model: server ids in and out whatever ids the Engine hands out, a cancelled
// request frees its pages and reports nothing more, chats render through the template, the tokenizer's
// end-of-text token ends requests of a model whose config names no eos id.
#include "server/engine_backend.h"

#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "model/builtin_model.h"
#include "tokenizer/builtin.h"

namespace ms::server {
namespace {

std::unique_ptr<EngineBackend> make_backend(int64_t kv_tokens = 4096, int64_t max_context = 0) {
  static std::shared_ptr<model::Model> model = model::make_builtin_model();
  runtime::EngineConfig ec;
  ec.page_size = 16;
  ec.kv_cache_tokens = kv_tokens;
  ec.max_running = 8;
  ec.max_context = max_context;
  EngineBackendParts p;
  p.engine = std::make_unique<runtime::Engine>(model, ec);
  p.tokenizer = tokenizer::Tokenizer::from_json_text(tokenizer::builtin_tokenizer_json(), "built-in");
  p.chat_template = std::make_unique<tokenizer::ChatTemplate>(tokenizer::builtin_chat_template(), "built-in");
  p.model_name = "builtin";
  return std::make_unique<EngineBackend>(std::move(p));
}

runtime::Request greedy(std::vector<int32_t> prompt, int max_tokens) {
  runtime::Request r;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  return r;
}

TEST(EngineBackend, MapsServerIdsBothWays) {
  auto b = make_backend();
  b->submit(1000, greedy({1, 2, 3}, 4));
  b->submit(7, greedy({4, 5}, 2));
  std::map<uint64_t, int> tokens;
  std::set<uint64_t> finished;
  while (b->has_work())
    for (const auto& o : b->step()) {
      ASSERT_TRUE(o.request_id == 1000 || o.request_id == 7) << o.request_id;
      tokens[o.request_id] += static_cast<int>(o.tokens.size());
      if (o.finish != runtime::FinishReason::None) {
        EXPECT_EQ(o.finish, runtime::FinishReason::Length);
        finished.insert(o.request_id);
      }
    }
  EXPECT_EQ(tokens[1000], 4);
  EXPECT_EQ(tokens[7], 2);
  EXPECT_EQ(finished, (std::set<uint64_t>{7, 1000}));
  EXPECT_EQ(b->stats().kv_pages_used, b->stats().kv_pages_cached);
  EXPECT_EQ(b->stats().generation_tokens_total, 6);
}

TEST(EngineBackend, CancelFreesPagesAndSilencesTheRequest) {
  auto b = make_backend();
  b->submit(5, greedy(std::vector<int32_t>(40, 9), 100));
  b->submit(6, greedy({1, 2}, 3));
  b->step();
  EXPECT_GT(b->stats().kv_pages_used, 0);
  b->cancel(5);
  b->cancel(12345);  // unknown: ignored
  while (b->has_work())
    for (const auto& o : b->step()) EXPECT_EQ(o.request_id, 6u) << "output after cancel";
  // Only the prefix cache still holds pages (the cancelled prompt's full ones).
  EXPECT_EQ(b->stats().kv_pages_used, b->stats().kv_pages_cached);
  EXPECT_EQ(b->stats().running, 0);
}

TEST(EngineBackend, RefusesWhatCanNeverRun) {
  auto b = make_backend(/*kv_tokens=*/256);
  EXPECT_EQ(b->max_context(), 256);  // the pool, not the model's 4096, bounds one request
  EXPECT_THROW(b->submit(1, greedy({}, 4)), ms::Error);
  EXPECT_THROW(b->submit(2, greedy({600}, 4)), ms::Error);  // outside the 512-token vocabulary
  EXPECT_THROW(b->submit(3, greedy(std::vector<int32_t>(250, 1), 100)), ms::Error);
  auto r = greedy({1}, 4);
  r.sampling.temperature = -1;
  EXPECT_THROW(b->submit(4, r), ms::Error);
  EXPECT_FALSE(b->has_work());
  b->submit(5, greedy({1}, 1));
  EXPECT_THROW(b->submit(5, greedy({1}, 1)), ms::Error);  // the id is running
}

TEST(EngineBackend, EosFromTheTokenizerWhenTheConfigHasNone) {
  auto b = make_backend();
  ASSERT_TRUE(model::builtin_model_config().eos_token_ids.empty());
  auto tok = tokenizer::Tokenizer::from_json_text(tokenizer::builtin_tokenizer_json(), "built-in");
  EXPECT_EQ(b->eos_token_ids(), std::vector<int32_t>{tok->token_to_id("<|endoftext|>")});
  // The model's greedy first token, then made the end-of-text: the request stops after one token.
  b->submit(1, greedy({1, 2, 3}, 5));
  int32_t first = -1;
  while (b->has_work())
    for (const auto& o : b->step())
      if (first < 0 && !o.tokens.empty()) first = o.tokens[0].token;
  auto r = greedy({1, 2, 3}, 5);
  r.ignore_eos = false;
  r.stop_token_ids = {first};
  b->submit(2, r);
  int n = 0;
  runtime::FinishReason why = runtime::FinishReason::None;
  while (b->has_work())
    for (const auto& o : b->step()) {
      n += static_cast<int>(o.tokens.size());
      if (o.finish != runtime::FinishReason::None) why = o.finish;
    }
  EXPECT_EQ(n, 1);
  EXPECT_EQ(why, runtime::FinishReason::Stop);
}

TEST(EngineBackend, RendersChatsThroughTheTemplate) {
  auto b = make_backend();
  nlohmann::json msgs = {{{"role", "user"}, {"content", "hi"}}};
  const std::string plain = b->render_chat(msgs, nullptr, nullptr);
  EXPECT_NE(plain.find("<|user|>"), std::string::npos) << plain;
  EXPECT_NE(plain.find("hi"), std::string::npos);
  // Content as parts reads as its text parts.
  nlohmann::json parts = {
      {{"role", "user"},
       {"content", {{{"type", "text"}, {"text", "h"}}, {{"type", "text"}, {"text", "i"}}}}}};
  EXPECT_EQ(b->render_chat(parts, nullptr, nullptr), plain);
  EXPECT_THROW(b->render_chat(nlohmann::json::object(), nullptr, nullptr), ms::Error);
  // A rendered chat is encoded without added specials; the text round-trips.
  EXPECT_EQ(b->decode(b->encode("Hello there", true)), "Hello there");
}

}  // namespace
}  // namespace ms::server
