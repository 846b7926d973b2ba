#include "tokenizer/builtin.h"

#include <nlohmann/json.hpp>

#include <set>
#include <vector>

#include "tokenizer/utf8.h"

namespace ms::tokenizer {

namespace {

// GPT-4's split regex, as GLM and DeepSeek tokenizers use (with their own small variations).
constexpr const char* kSplitRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const char* const kSpecials[] = {"<|endoftext|>", "[MASK]",          "[gMASK]",         "[sMASK]",
                                 "<sop>",         "<eop>",           "<|system|>",      "<|user|>",
                                 "<|assistant|>", "<|observation|>", "<think>",         "</think>",
                                 "<tool_call>",   "</tool_call>",    "<arg_key>",       "</arg_key>",
                                 "<arg_value>",   "</arg_value>",    "<tool_response>", "</tool_response>"};

// Words whose left-to-right merge chains make up the merges; a leading space is written as ' '.
const char* const kWords[] = {
    " the",     " and",   " to",    " of",    " a",     " in",    " is",    " that",  " for",    " it",
    " you",     " with",  " on",    " as",    " are",   " this",  " be",    " at",    " or",     " have",
    " from",    " not",   " by",    " we",    " can",   " an",    " will",  " if",    " what",   " all",
    " was",     " do",    " one",   " they",  " he",    " she",   " there", " which", " their",  " more",
    "ing",      "ed",     "er",     "re",     "on",     "es",     "en",     "al",     "or",      "an",
    "at",       "ion",    "tion",   "ly",     "ent",    "st",     "ll",     " I",     " The",    " A",
    " It",      " Hello", " hello", " world", " model", " token", " think", " user",  " system", " return",
    " int",     " def",   " class", " if",    " else",  " for",   " while", " const", " std",    " self",
    "()",       "):",     "();",    " =",     " ==",    " {",     " }",     "\n\n",   "  ",      "    ",
    "        ", "\n    ", ".\n",    ",",      ".",      " (",     ")",      " \"",    "\",",     "://",
    "http",     "the",    "in",     "is",     "it",     "th",     "he",     "ou",     "ar",      "as",
    "le",       "ve",     "me",     "de",     "co",     "ro",     "ur",     "ch",     "ce",      "se",
    "ri",       "ti",     "li",     "ne",     "ma",     "ra",     "ha",     "di",     "lo",      "si",
    "te"};

nlohmann::json build() {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  std::set<std::string> have;
  for (int b = 0; b < 256; ++b) {
    std::string t;
    utf8_append(t, byte_to_char(static_cast<uint8_t>(b)));
    vocab[t] = b;
    have.insert(t);
  }
  const int n_special = static_cast<int>(sizeof(kSpecials) / sizeof(kSpecials[0]));
  const int n_merges = kBuiltinVocabSize - 256 - n_special;
  std::vector<nlohmann::json> merges;
  int next_id = 256;
  for (const char* w : kWords) {
    std::string bl = bytes_to_byte_level(w);
    // Split the byte-level word into its characters, then merge left to right.
    std::vector<std::string> chars;
    for (size_t i = 0; i < bl.size();) {
      size_t s = i;
      utf8_next(bl, i);
      chars.push_back(bl.substr(s, i - s));
    }
    std::string left = chars[0];
    for (size_t k = 1; k < chars.size() && next_id < 256 + n_merges; ++k) {
      std::string merged = left + chars[k];
      if (!have.count(merged)) {
        merges.push_back(nlohmann::json::array({left, chars[k]}));
        vocab[merged] = next_id++;
        have.insert(merged);
      }
      left = merged;
    }
  }
  // Pad with merges of byte pairs so the vocab is exactly kBuiltinVocabSize.
  for (int a = 'a'; a <= 'z' && next_id < 256 + n_merges; ++a)
    for (int b = 'a'; b <= 'z' && next_id < 256 + n_merges; ++b) {
      std::string l(1, static_cast<char>(a)), r(1, static_cast<char>(b));
      if (have.count(l + r)) continue;
      merges.push_back(nlohmann::json::array({l, r}));
      vocab[l + r] = next_id++;
      have.insert(l + r);
    }
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (int k = 0; k < n_special; ++k) {
    added.push_back({{"id", next_id + k},
                     {"content", kSpecials[k]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  nlohmann::ordered_json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", kSplitRegex}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", true},
           {"use_regex", false}}}}}},
      {"post_processor",
       {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}}},
      {"decoder",
       {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}}};
  return j;
}

}  // namespace

const std::string& builtin_tokenizer_json() {
  static const std::string text = build().dump();
  return text;
}

const std::string& builtin_chat_template() {
  // Newlines are written as '\n' literals because "-%}" eats the whitespace that follows it.
  static const std::string text =
      "[gMASK]<sop>"
      "{%- for m in messages -%}"
      "{%- if m.role == 'system' -%}<|system|>{{ '\n' + m.content }}"
      "{%- elif m.role == 'user' -%}<|user|>{{ '\n' + m.content }}"
      "{%- elif m.role == 'assistant' -%}<|assistant|>{{ '\n' }}"
      "{%- if m.reasoning_content -%}<think>{{ m.reasoning_content | trim }}</think>"
      "{%- else -%}<think></think>{%- endif -%}{{ '\n' + (m.content | trim) }}"
      "{%- elif m.role == 'tool' -%}<|observation|>{{ '\n<tool_response>\n' + m.content + "
      "'\n</tool_response>' }}"
      "{%- endif -%}"
      "{%- endfor -%}"
      "{%- if add_generation_prompt -%}<|assistant|>"
      "{%- if enable_thinking is defined and not enable_thinking -%}{{ '\n<think></think>' }}{%- endif -%}"
      "{%- endif -%}";
  return text;
}

}  // namespace ms::tokenizer
