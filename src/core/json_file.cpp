#include "core/json_file.h"

#include <fstream>

#include "core/error.h"

namespace ms {

nlohmann::json read_json_file(const std::filesystem::path& path, std::string_view what) {
  std::ifstream f(path);
  MS_CHECK(f.good(), "cannot read {} {}", what, path.string());
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    MS_THROW("{}: not valid JSON: {}", path.string(), e.what());
  }
}

void write_json_file(const std::filesystem::path& path, const nlohmann::json& j, int indent,
                     std::string_view what) {
  std::ofstream f(path);
  MS_CHECK(f.good(), "cannot write {} {}", what, path.string());
  f << j.dump(indent) << "\n";
  f.flush();
  MS_CHECK(f.good(), "cannot write {} {}", what, path.string());
}

}  // namespace ms
