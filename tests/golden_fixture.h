// A golden fixture of tests/data/golden (made by tools/golden with Hugging Face transformers): the model's
// config and checkpoint, its prompts, transformers' greedy continuations and (logits.safetensors) the logits
// of every position. Shared by the CPU parity tests and the GPU executor tests.
#pragma once

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/checkpoint_source.h"

namespace ms::test {

struct Fixture {
  io::ModelConfig cfg;
  std::vector<std::vector<int32_t>> prompts, greedy;
  std::unique_ptr<model::CheckpointSource> src;
};

// nullopt when the fixture is absent. The checkpoint sits beside expected.json, or in the directory its
// "checkpoint_dir" names relative to the source tree (the trained built-in model's is models/builtin).
inline std::optional<Fixture> load_fixture(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(MS_TEST_DATA) / "golden" / name;
  if (!std::filesystem::exists(dir / "expected.json")) return std::nullopt;
  Fixture f;
  std::ifstream in(dir / "expected.json");
  auto j = nlohmann::json::parse(in);
  std::filesystem::path ckpt = dir;
  if (j.contains("checkpoint_dir"))
    ckpt = std::filesystem::path(MS_TEST_DATA).parent_path().parent_path() /
           j["checkpoint_dir"].get<std::string>();
  if (!std::filesystem::exists(ckpt / "config.json")) return std::nullopt;
  f.cfg = io::load_model_config(ckpt);
  f.prompts = j["prompts"].get<std::vector<std::vector<int32_t>>>();
  f.greedy = j["greedy"].get<std::vector<std::vector<int32_t>>>();
  f.src = std::make_unique<model::CheckpointSource>(ckpt);
  return f;
}

// transformers' logits of prompt i followed by its greedy tokens: f32 [tokens, vocab].
inline Tensor expected_logits(const std::string& name, size_t i) {
  auto file =
      io::SafetensorsFile::open(std::filesystem::path(MS_TEST_DATA) / "golden" / name / "logits.safetensors");
  return file->tensor("logits." + std::to_string(i));
}

}  // namespace ms::test
