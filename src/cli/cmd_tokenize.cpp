// `moeserve tokenize` and `moeserve detokenize`: ids as Hugging Face gives them, from a model directory,
// a tokenizer.json, or the built-in tokenizer.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli/command.h"
#include "core/error.h"
#include "tokenizer/builtin.h"
#include "tokenizer/tokenizer.h"

namespace ms::cli {
namespace {

struct TokenizerSource {
  std::string model_dir, tokenizer_file;
  void add(CLI::App& sub) {
    auto* m = sub.add_option("--model", model_dir, "model directory holding tokenizer.json");
    auto* t = sub.add_option("--tokenizer", tokenizer_file, "a tokenizer.json file");
    m->excludes(t);
  }
  std::unique_ptr<tokenizer::Tokenizer> load() const {
    if (!tokenizer_file.empty()) return tokenizer::Tokenizer::from_file(tokenizer_file);
    if (!model_dir.empty()) return tokenizer::Tokenizer::from_file(model_dir + "/tokenizer.json");
    return tokenizer::Tokenizer::from_json_text(tokenizer::builtin_tokenizer_json(), "built-in tokenizer");
  }
};

std::string ids_json(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t k = 0; k < ids.size(); ++k) {
    if (k) out += ',';
    out += std::to_string(ids[k]);
  }
  return out + "]";
}

Registration tokenize_cmd("tokenize",
                          "Print the token ids of a text as a JSON array (one array per line with --jsonl)",
                          [](CLI::App& sub) {
                            auto src = std::make_shared<TokenizerSource>();
                            auto text = std::make_shared<std::string>();
                            auto text_file = std::make_shared<std::string>();
                            auto jsonl = std::make_shared<std::string>();
                            auto no_special = std::make_shared<bool>(false);
                            src->add(sub);
                            auto* a = sub.add_option("--text", *text, "the text");
                            auto* b = sub.add_option("--text-file", *text_file,
                                                     "a file whose whole content is the text");
                            auto* c =
                                sub.add_option("--jsonl", *jsonl, "a file of JSON strings, one per line");
                            a->excludes(b)->excludes(c);
                            b->excludes(c);
                            sub.add_flag("--no-special-tokens", *no_special,
                                         "do not add the post-processor's special tokens (BOS etc.)");
                            return std::function<int()>([=] {
                              auto tok = src->load();
                              bool add_special = !*no_special;
                              if (!jsonl->empty()) {
                                std::ifstream f(*jsonl, std::ios::binary);
                                MS_CHECK(f.good(), "cannot open --jsonl file {}", *jsonl);
                                std::string line, out;
                                size_t lineno = 0;
                                while (std::getline(f, line)) {
                                  ++lineno;
                                  if (line.empty()) continue;
                                  nlohmann::json j;
                                  try {
                                    j = nlohmann::json::parse(line);
                                  } catch (const nlohmann::json::exception& e) {
                                    MS_THROW("{}:{}: not valid JSON: {}", *jsonl, lineno, e.what());
                                  }
                                  MS_CHECK(j.is_string(), "{}:{}: expected a JSON string", *jsonl, lineno);
                                  out += ids_json(tok->encode(j.get_ref<const std::string&>(), add_special));
                                  out += '\n';
                                  if (out.size() > (1 << 16)) {
                                    std::fwrite(out.data(), 1, out.size(), stdout);
                                    out.clear();
                                  }
                                }
                                std::fwrite(out.data(), 1, out.size(), stdout);
                                return 0;
                              }
                              std::string input = *text;
                              if (!text_file->empty()) {
                                std::ifstream f(*text_file, std::ios::binary);
                                MS_CHECK(f.good(), "cannot open --text-file {}", *text_file);
                                std::stringstream ss;
                                ss << f.rdbuf();
                                input = ss.str();
                              } else {
                                MS_CHECK(a->count() > 0, "give one of --text, --text-file or --jsonl");
                              }
                              std::printf("%s\n", ids_json(tok->encode(input, add_special)).c_str());
                              return 0;
                            });
                          });

Registration detokenize_cmd("detokenize", "Print the text of comma-separated token ids", [](CLI::App& sub) {
  auto src = std::make_shared<TokenizerSource>();
  auto ids_arg = std::make_shared<std::string>();
  auto skip = std::make_shared<bool>(false);
  src->add(sub);
  sub.add_option("--ids", *ids_arg, "token ids, e.g. 1,2,3")->required();
  sub.add_flag("--skip-special-tokens", *skip, "leave special tokens out of the text");
  return std::function<int()>([=] {
    auto tok = src->load();
    std::vector<int32_t> ids;
    std::stringstream ss(*ids_arg);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item.find_first_not_of(" \t") == std::string::npos) continue;
      size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(item, &used);
      } catch (const std::exception&) {
        MS_THROW("--ids: '{}' is not an integer", item);
      }
      MS_CHECK(item.find_first_not_of(" \t", used) == std::string::npos, "--ids: '{}' is not an integer",
               item);
      MS_CHECK(v >= 0 && v < tok->vocab_size(), "--ids: id {} is outside the vocabulary (size {})", v,
               tok->vocab_size());
      ids.push_back(static_cast<int32_t>(v));
    }
    std::string text = tok->decode(ids, *skip);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  });
});

}  // namespace
}  // namespace ms::cli
