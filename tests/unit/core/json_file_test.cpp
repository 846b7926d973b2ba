// Whole JSON files: a round trip, and errors that name the file and what it was meant to hold.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "core/error.h"
#include "core/json_file.h"

using namespace ms;
namespace fs = std::filesystem;

namespace {

fs::path scratch_dir() {
  const fs::path d = fs::temp_directory_path() / ("ms_json_file_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

}  // namespace

TEST(JsonFile, RoundTripKeepsValuesAndIndent) {
  const fs::path d = scratch_dir();
  const nlohmann::json j = {{"n_experts", 256}, {"ranks", {{0, 1}, {2, 3}}}, {"name", "glm5"}};
  write_json_file(d / "a.json", j, 2, "the test file");
  EXPECT_EQ(read_json_file(d / "a.json", "the test file"), j);
  std::ifstream f(d / "a.json");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, j.dump(2) + "\n");
  fs::remove_all(d);
}

TEST(JsonFile, ErrorsNameTheFileAndWhatItHolds) {
  const fs::path d = scratch_dir();
  const std::string missing = error_of([&] { read_json_file(d / "none.json", "expert placement"); });
  EXPECT_NE(missing.find("cannot read expert placement"), std::string::npos) << missing;
  EXPECT_NE(missing.find("none.json"), std::string::npos) << missing;

  std::ofstream(d / "bad.json") << "{\"n_experts\": 256,";
  const std::string bad = error_of([&] { read_json_file(d / "bad.json", "expert placement"); });
  EXPECT_NE(bad.find("bad.json: not valid JSON"), std::string::npos) << bad;

  // A directory where the file should be: the write cannot open it.
  fs::create_directories(d / "dir.json");
  const std::string unwritable = error_of(
      [&] { write_json_file(d / "dir.json", nlohmann::json::object(), -1, "the expert distribution"); });
  EXPECT_NE(unwritable.find("cannot write the expert distribution"), std::string::npos) << unwritable;
  EXPECT_NE(unwritable.find("dir.json"), std::string::npos) << unwritable;
  fs::remove_all(d);
}
