// The pipeline stages of tokenizer.json, each built from its JSON object. A type this code does not
// implement is refused at load with its name and the JSON path.
#pragma once

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ms::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

// Pieces of one pre-tokenized span; each becomes one BPE word.
using Pieces = std::vector<std::string>;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // first_span: this span starts the text (Metaspace prepend_scheme "first").
  virtual void pre_tokenize(Pieces& pieces, bool first_span) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Adds special tokens around one sequence of ids (no pair encoding).
  virtual void process(std::vector<int32_t>& ids) const = 0;
};

// token_id resolves a token string to its id (for post-processors that name tokens); -1 when unknown.
using TokenIdFn = std::function<int32_t(const std::string&)>;

// The stages of a "Sequence" component: j[key] lists components, each built by make(json, where); a stage
// that builds to nothing (a no-op) is left out.
template <typename Stage, typename Make>
std::vector<std::unique_ptr<Stage>> make_sequence_stages(const nlohmann::json& j, const char* key,
                                                         const std::string& where, Make&& make) {
  std::vector<std::unique_ptr<Stage>> stages;
  const auto& arr = j.at(key);
  for (size_t i = 0; i < arr.size(); ++i)
    if (auto p = make(arr[i], fmt::format("{}.{}[{}]", where, key, i))) stages.push_back(std::move(p));
  return stages;
}

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& where);
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& where);
std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j, const std::string& where,
                                                   const TokenIdFn& token_id);

}  // namespace ms::tokenizer
