#include "io/generation_config.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>

#include "core/error.h"

namespace ms::io {

namespace {

double number(const nlohmann::json& j, const char* name, double lo, double hi, double fallback,
              const std::string& what) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) MS_THROW("{}: field '{}' must be a number, got {}", what, name, it->dump());
  const double x = it->get<double>();
  if (!(std::isfinite(x) && x >= lo && x <= hi))
    MS_THROW("{}: field '{}' must be in [{}, {}], got {}", what, name, lo, hi, x);
  return x;
}

}  // namespace

std::string GenerationDefaults::describe() const {
  return fmt::format("temperature {:g}, top_p {:g}, top_k {}, min_p {:g}, repetition_penalty {:g}",
                     temperature, top_p, top_k, min_p, repetition_penalty);
}

GenerationDefaults parse_generation_config(const nlohmann::json& j, const std::string& what) {
  if (!j.is_object()) MS_THROW("{}: expected a JSON object, got {}", what, j.type_name());
  GenerationDefaults d;
  d.temperature = static_cast<float>(number(j, "temperature", 0.0, 2.0, d.temperature, what));
  d.top_p = static_cast<float>(number(j, "top_p", 0.0, 1.0, d.top_p, what));
  if (d.top_p <= 0.0f) MS_THROW("{}: field 'top_p' must be in (0, 1], got 0", what);
  const double k = number(j, "top_k", -1.0, 1e9, 0.0, what);
  if (std::floor(k) != k) MS_THROW("{}: field 'top_k' must be an integer, got {}", what, k);
  d.top_k = k < 0 ? 0 : static_cast<int>(k);
  d.min_p = static_cast<float>(number(j, "min_p", 0.0, 1.0, d.min_p, what));
  d.repetition_penalty =
      static_cast<float>(number(j, "repetition_penalty", 0.0, 2.0, d.repetition_penalty, what));
  if (d.repetition_penalty <= 0.0f) MS_THROW("{}: field 'repetition_penalty' must be in (0, 2], got 0", what);
  if (auto it = j.find("do_sample"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) MS_THROW("{}: field 'do_sample' must be true or false, got {}", what, it->dump());
    if (!it->get<bool>()) d.temperature = 0.0f;  // transformers: greedy decoding
  }
  return d;
}

std::optional<GenerationDefaults> load_generation_config(const std::filesystem::path& dir) {
  const auto path = dir / "generation_config.json";
  if (!std::filesystem::exists(path)) return std::nullopt;
  std::ifstream in(path);
  if (!in.good()) MS_THROW("cannot read {}", path.string());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    MS_THROW("{} is not valid JSON: {}", path.string(), e.what());
  }
  return parse_generation_config(j, path.string());
}

}  // namespace ms::io
