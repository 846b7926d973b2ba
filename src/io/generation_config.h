// A checkpoint's generation_config.json: the sampling settings its authors recommend. The server takes them
// as the defaults of requests that leave a setting out (--generation-config auto), as users of Hugging Face
// checkpoints expect.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace ms::io {

// The fields read; a field the file does not set keeps the OpenAI API's default.
struct GenerationDefaults {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;  // 0: off
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  std::string describe() const;  // "temperature 0.7, top_p 0.9, ..."
};

// `j` as read from `what` (a file name for messages). `do_sample: false` means greedy: temperature 0.
// Throws ms::Error naming the file and the field for a wrong type or a value out of range.
GenerationDefaults parse_generation_config(const nlohmann::json& j, const std::string& what);

// nullopt when DIR has no generation_config.json.
std::optional<GenerationDefaults> load_generation_config(const std::filesystem::path& dir);

}  // namespace ms::io
