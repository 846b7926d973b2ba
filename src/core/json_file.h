// Whole JSON files read and written with errors that name the file and what it holds (the expert
// placement, the routing distribution, a checkpoint's quantization config, a generated model's configs).
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>

namespace ms {

// The file's JSON; throws "cannot read <what> <path>" when it cannot be opened and "<path>: not valid JSON:
// ..." when it does not parse.
nlohmann::json read_json_file(const std::filesystem::path& path, std::string_view what);

// Writes j.dump(indent) and a newline; throws "cannot write <what> <path>" when the file cannot be opened or
// the write fails.
void write_json_file(const std::filesystem::path& path, const nlohmann::json& j, int indent,
                     std::string_view what);

}  // namespace ms
