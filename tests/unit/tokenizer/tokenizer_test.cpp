// Unit tests of the pipeline pieces that the golden fixtures do not reach: load errors, byte fallback,
// the built-in tokenizer, streaming detokenization and template errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

using namespace std::string_literals;
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/builtin.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using ms::tokenizer::Tokenizer;

std::unique_ptr<Tokenizer> builtin() {
  return Tokenizer::from_json_text(ms::tokenizer::builtin_tokenizer_json(), "built-in");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ms::Error& e) {
    return e.message();
  }
  return "no error";
}

TEST(Builtin, VocabAndSpecialTokens) {
  auto tok = builtin();
  EXPECT_EQ(tok->vocab_size(), ms::tokenizer::kBuiltinVocabSize);
  for (const char* s : {"[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<think>", "</think>",
                        "<|endoftext|>"}) {
    int32_t id = tok->token_to_id(s);
    ASSERT_GE(id, 256) << s;
    EXPECT_TRUE(tok->is_special(id));
    EXPECT_EQ(tok->encode(s, false), std::vector<int32_t>{id});
  }
  // Deterministic: built twice, same text.
  EXPECT_EQ(ms::tokenizer::builtin_tokenizer_json(), ms::tokenizer::builtin_tokenizer_json());
}

TEST(Builtin, RoundTripAndMerges) {
  auto tok = builtin();
  for (std::string s :
       {"Hello world, the model will think.", "中文 😀 \r\n\t x", "<|user|>\nhi<|assistant|>"}) {
    auto ids = tok->encode(s, false);
    EXPECT_EQ(tok->decode(ids), s);
  }
  // " the" is one merged token.
  auto ids = tok->encode(" the", false);
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_GE(ids[0], 256);
  EXPECT_EQ(tok->decode(tok->encode("<|user|>hi", false), true), "hi");
}

TEST(Builtin, ChatTemplateRenders) {
  ms::tokenizer::ChatTemplate t(ms::tokenizer::builtin_chat_template(), "built-in");
  ms::tokenizer::ChatInputs in;
  in.messages =
      nlohmann::ordered_json::parse(R"([{"role":"system","content":"S"},{"role":"user","content":"Hi"},
      {"role":"assistant","content":" A ","reasoning_content":"R"},{"role":"user","content":"Q"}])");
  in.add_generation_prompt = true;
  EXPECT_EQ(
      t.render(in),
      "[gMASK]<sop><|system|>\nS<|user|>\nHi<|assistant|>\n<think>R</think>\nA<|user|>\nQ<|assistant|>");
  in.extra["enable_thinking"] = false;
  const std::string r = t.render(in);
  EXPECT_EQ(r.substr(r.size() - 30), "Q<|assistant|>\n<think></think>");
}

TEST(Incremental, NeverEmitsHalfACharacter) {
  auto tok = builtin();
  const std::string text = "a😀b中文 é\xCC\x81 👩‍👩‍👧 end";
  auto ids = tok->encode(text, false);
  // Byte-level: 😀 is four byte tokens, so some pushes must hold text back.
  ms::tokenizer::IncrementalDetokenizer det(*tok);
  std::string out;
  size_t held = 0;
  for (int32_t id : ids) {
    std::string piece = det.push(id);
    if (piece.empty()) ++held;
    EXPECT_EQ(ms::tokenizer::utf8_lossy(piece), piece) << "chunk is not whole UTF-8";
    EXPECT_EQ(ms::tokenizer::utf8_incomplete_tail(piece), 0u);
    out += piece;
  }
  out += det.flush();
  EXPECT_EQ(out, text);
  EXPECT_GT(held, 0u);
}

TEST(Incremental, FlushGivesTruncatedTail) {
  auto tok = builtin();
  auto ids = tok->encode("x😀", false);
  ids.pop_back();  // stop in the middle of the emoji
  ms::tokenizer::IncrementalDetokenizer det(*tok);
  std::string out;
  for (int32_t id : ids) out += det.push(id);
  EXPECT_EQ(out, "x");
  EXPECT_EQ(det.flush(), "\xEF\xBF\xBD");
}

nlohmann::json tiny_json() {
  return nlohmann::json::parse(R"({
    "added_tokens": [{"id": 5, "content": "<s>", "special": true, "normalized": false}],
    "normalizer": null, "pre_tokenizer": null, "post_processor": null,
    "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "<0xC3>": 3, "<0xA9>": 4, "<unk>": 6},
              "merges": [["a", "b"]], "byte_fallback": true, "unk_token": "<unk>"}})");
}

TEST(Tokenizer, ByteFallbackAndUnk) {
  auto tok = Tokenizer::from_json_text(tiny_json().dump(), "tiny");
  EXPECT_EQ(tok->encode("abé", false), (std::vector<int32_t>{2, 3, 4}));
  EXPECT_EQ(tok->decode({2, 3, 4}), "abé");
  EXPECT_EQ(tok->encode("z", false), (std::vector<int32_t>{6}));  // no byte tokens for 'z': unk
  EXPECT_EQ(tok->decode({3}), "\xEF\xBF\xBD");
  EXPECT_EQ(tok->encode("a<s>b", false), (std::vector<int32_t>{0, 5, 1}));
}

TEST(Tokenizer, RefusesUnsupportedComponentsByName) {
  auto j = tiny_json();
  j["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_NE(error_of([&] { Tokenizer::from_json_text(j.dump(), "t.json"); }).find("BertNormalizer"),
            std::string::npos);
  j = tiny_json();
  j["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
  EXPECT_NE(error_of([&] { Tokenizer::from_json_text(j.dump(), "t.json"); }).find("UnicodeScripts"),
            std::string::npos);
  j = tiny_json();
  j["decoder"] = {{"type", "CTC"}};
  EXPECT_NE(error_of([&] { Tokenizer::from_json_text(j.dump(), "t.json"); }).find("CTC"), std::string::npos);
  j = tiny_json();
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(error_of([&] { Tokenizer::from_json_text(j.dump(), "t.json"); }).find("WordPiece"),
            std::string::npos);
  j = tiny_json();
  j["model"]["merges"] = nlohmann::json::array({nlohmann::json::array({"a", "zz"})});
  EXPECT_NE(error_of([&] { Tokenizer::from_json_text(j.dump(), "t.json"); }).find("merges[0]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Tokenizer::from_json_text("{not json", "bad.json"); }).find("bad.json"),
            std::string::npos);
}

TEST(Tokenizer, InvalidUtf8IsRepaired) {
  auto tok = builtin();
  auto ids = tok->encode(std::string("a\xFF"
                                     "b"),
                         false);
  EXPECT_EQ(tok->decode(ids),
            "a\xEF\xBF\xBD"
            "b");
}

TEST(Tokenizer, VeryLongWordIsExact) {
  auto tok = builtin();
  std::string w(20000, 'a');
  auto ids = tok->encode(w, false);
  EXPECT_EQ(tok->decode(ids), w);
}

TEST(ChatTemplate, UnsupportedSyntaxNamesTheConstruct) {
  using ms::tokenizer::ChatTemplate;
  EXPECT_NE(error_of([] { ChatTemplate("{% include 'x' %}", "t"); }).find("include"), std::string::npos);
  EXPECT_NE(error_of([] { ChatTemplate("{{ x | frobnicate }}", "t"); }).find("frobnicate"),
            std::string::npos);
  EXPECT_NE(error_of([] { ChatTemplate("{% if x %}", "t"); }).find("endif"), std::string::npos);
  EXPECT_NE(error_of([] { ChatTemplate("{{ x is weird }}", "t"); }).find("weird"), std::string::npos);
}

TEST(ChatTemplate, RaiseExceptionAndExpressions) {
  using ms::tokenizer::ChatTemplate;
  ms::tokenizer::ChatInputs in;
  EXPECT_NE(
      error_of([&] { ChatTemplate("{{ raise_exception('bad role') }}", "t").render(in); }).find("bad role"),
      std::string::npos);
  ChatTemplate t(
      "{% set ns = namespace(n=0) %}{% for k, v in {'a': 1, 'b': 2}.items() %}{% set ns.n = ns.n + v %}"
      "{{ loop.index }}{{ k }}{% if loop.last %}!{% endif %}{% endfor %}|{{ ns.n }}|{{ 'abc'[::-1] }}|"
      "{{ ' x '.strip() ~ 'y' }}|{{ 'a,b'.split(',') | join('-') }}|{{ [1, 2, 3][1:] | length }}|"
      "{{ {'k': [1, 'é']} | tojson }}|{{ none is none }}|{{ 'b' in 'abc' and 3 // 2 == 1 }}|{{ 7 % 3 }}",
      "t");
  EXPECT_EQ(t.render(in), "1a2b!|3|cba|xy|a-b|2|{\"k\": [1, \"é\"]}|True|True|1");
}

}  // namespace
