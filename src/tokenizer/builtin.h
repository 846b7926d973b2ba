// The built-in model's tokenizer: a 512-token byte-level BPE with GLM's special tokens, built
// deterministically in code so the engine and server can run without any file.
#pragma once

#include <string>

namespace ms::tokenizer {

// tokenizer.json text (same format, same loader as a published checkpoint's).
const std::string& builtin_tokenizer_json();
// A GLM-style chat template for the built-in tokenizer.
const std::string& builtin_chat_template();

constexpr int kBuiltinVocabSize = 512;

}  // namespace ms::tokenizer
