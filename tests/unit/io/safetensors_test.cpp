#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "io/safetensors.h"

using namespace ms;
using namespace ms::io;
namespace fs = std::filesystem;

namespace {

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("ms_st_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
};

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

// A file from a raw header and `data_bytes` bytes of data (0, 1, 2, ...).
void write_raw(const fs::path& p, const std::string& header, size_t data_bytes) {
  std::string data(data_bytes, '\0');
  for (size_t i = 0; i < data_bytes; ++i) data[i] = static_cast<char>(i);
  write_bytes(p, le64(header.size()) + header + data);
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs fn, expects an ms::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const ms::Error& e) {
    for (const auto& p : parts)
      EXPECT_NE(e.message().find(p), std::string::npos) << "'" << p << "' not in: " << e.message();
    return;
  }
  ADD_FAILURE() << "no ms::Error thrown";
}

// Opening a file made of `header` and data; the error must name the file and each of `parts`.
void expect_bad_file(const fs::path& p, const std::string& header, size_t data_bytes,
                     std::initializer_list<std::string> parts) {
  write_raw(p, header, data_bytes);
  std::vector<std::string> all(parts);
  all.push_back(p.string());
  try {
    SafetensorsFile::open(p);
  } catch (const ms::Error& e) {
    for (const auto& s : all)
      EXPECT_NE(e.message().find(s), std::string::npos) << "'" << s << "' not in: " << e.message();
    return;
  }
  ADD_FAILURE() << "no ms::Error for header " << header;
}

Tensor patterned(Shape shape, DType dt, int seed) {
  Tensor t = Tensor::empty(std::move(shape), dt);
  auto* b = static_cast<unsigned char*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) b[i] = static_cast<unsigned char>(i * 31 + seed * 7 + 1);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

}  // namespace

TEST_F(Safetensors, RoundTripEveryDtype) {
  const DType all[] = {DType::F32,   DType::F16, DType::BF16, DType::F8_E4M3, DType::F8_E5M2,
                       DType::NVFP4, DType::U8,  DType::I32,  DType::I64};
  std::vector<std::pair<std::string, Tensor>> ts;
  int seed = 0;
  // Odd-sized byte tensors first in the input: the writer must still align the wider ones.
  ts.emplace_back("odd.u8", patterned({3}, DType::U8, 99));
  for (DType dt : all) ts.emplace_back(fmt::format("w.{}", dtype_name(dt)), patterned({3, 4}, dt, seed++));
  ts.emplace_back("scalar", patterned({}, DType::F32, 5));
  ts.emplace_back("empty", patterned({0, 7}, DType::BF16, 6));
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"note", "round trip"}};
  const fs::path p = dir_ / "all.safetensors";
  write_safetensors(p, ts, meta);

  // Layout as the reference writer makes it: header length a multiple of 8, space padded, no gaps.
  const std::string raw = read_bytes(p);
  ASSERT_GE(raw.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(raw[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw[8], '{');
  size_t total = 0;
  for (const auto& [name, t] : ts) total += t.nbytes();
  EXPECT_EQ(raw.size(), 8 + n + total);

  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f->metadata(), meta);
  EXPECT_EQ(f->tensors().size(), ts.size());
  for (const auto& [name, t] : ts) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(f->contains(name));
    Tensor r = f->tensor(name);
    EXPECT_TRUE(f->zero_copy(name));
    if (t.dtype() == DType::NVFP4) {
      // Stored as bytes: two codes per byte along the last dimension.
      EXPECT_EQ(r.dtype(), DType::U8);
      EXPECT_EQ(r.shape(), (Shape{3, 2}));
    } else {
      EXPECT_EQ(r.dtype(), t.dtype());
      EXPECT_EQ(r.shape(), t.shape());
    }
    EXPECT_TRUE(same_bytes(r, t));
    const auto es = static_cast<uintptr_t>(dtype_bits(r.dtype()) / 8);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r.raw()) % es, 0u);
  }
  EXPECT_EQ(f->info("w.bf16").end - f->info("w.bf16").begin, 24u);
}

TEST_F(Safetensors, BorrowedTensorKeepsMappingAlive) {
  const fs::path p = dir_ / "model.safetensors";
  Tensor src = patterned({64, 33}, DType::F32, 1);
  write_safetensors(p, {{"x", src}});
  Tensor a, b;
  {
    auto f = SafetensorsFile::open(p);
    a = f->tensor("x");
    b = f->tensor("x");
    EXPECT_EQ(a.raw(), b.raw());  // zero copy: both point into the one mapping
  }
  // The file object is gone; the tensors still hold the mapping.
  fs::remove(p);
  EXPECT_TRUE(same_bytes(a, src));
  float sum = 0;
  for (int64_t i = 0; i < a.numel(); ++i) sum += a.data<const float>()[i];
  (void)sum;
}

TEST_F(Safetensors, MisalignedDataIsCopiedNotAssumedAligned) {
  // The data section starts 4-byte aligned, so F32 "b" at data offset 1 is not.
  std::string h =
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  while ((8 + h.size()) % 4 != 0) h += ' ';
  const fs::path p = dir_ / "odd.safetensors";
  write_raw(p, h, 9);
  auto f = SafetensorsFile::open(p);
  EXPECT_TRUE(f->zero_copy("a"));
  EXPECT_FALSE(f->zero_copy("b"));
  Tensor b = f->tensor("b");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.raw()) % 4, 0u);
  const unsigned char want[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(std::memcmp(b.raw(), want, 8), 0);
}

TEST_F(Safetensors, HeaderParserDirect) {
  std::map<std::string, std::string> meta;
  std::string h =
      R"({"__metadata__":{"k":"v"},"z":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]},)"
      R"("a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},"e":{"dtype":"F32","shape":[0],"data_offsets":[16,16]}})"
      "    ";
  auto ts = parse_safetensors_header(h.data(), h.size(), 16, "mem", &meta);
  ASSERT_EQ(ts.size(), 3u);
  // Sorted by offset.
  EXPECT_EQ(ts[0].name, "a");
  EXPECT_EQ(ts[1].name, "z");
  EXPECT_EQ(ts[1].dtype, DType::BF16);
  EXPECT_EQ(ts[1].shape, (Shape{2, 2}));
  EXPECT_EQ(ts[2].name, "e");
  EXPECT_EQ(meta.at("k"), "v");
  // An empty header object is a valid file with no tensors.
  EXPECT_TRUE(parse_safetensors_header("{}", 2, 0, "mem").empty());
}

// ---- bad files: every message names the file and the tensor ----------------------------------------

TEST_F(Safetensors, TruncatedFile) {
  const fs::path p = dir_ / "trunc.safetensors";
  write_safetensors(p, {{"layer.0.weight", patterned({16, 16}, DType::BF16, 1)}});
  std::string raw = read_bytes(p);
  write_bytes(p, raw.substr(0, raw.size() - 10));
  expect_error([&] { SafetensorsFile::open(p); }, {p.string(), "layer.0.weight", "out of range"});
  // Shorter than the length field itself.
  write_bytes(p, raw.substr(0, 5));
  expect_error([&] { SafetensorsFile::open(p); }, {p.string(), "truncated"});
  write_bytes(p, "");
  expect_error([&] { SafetensorsFile::open(p); }, {p.string(), "truncated"});
}

TEST_F(Safetensors, HeaderLengthPastEnd) {
  const fs::path p = dir_ / "len.safetensors";
  std::string h = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  write_bytes(p, le64(h.size() + 100) + h + "abcd");
  expect_error([&] { SafetensorsFile::open(p); }, {p.string(), "header length", "past the end"});
  // Huge lengths must not wrap around.
  write_bytes(p, le64(~0ull) + h + "abcd");
  expect_error([&] { SafetensorsFile::open(p); }, {p.string(), "past the end"});
  write_bytes(p, le64(~0ull - 7) + h + "abcd");
  expect_error([&] { SafetensorsFile::open(p); }, {p.string(), "past the end"});
}

TEST_F(Safetensors, BadJson) {
  const fs::path p = dir_ / "json.safetensors";
  expect_bad_file(p, R"({"w.bad":{"dtype":"F32","shape":[1],"data_offsets":[0,4])", 4,
                  {"not valid JSON", "w.bad"});
  expect_bad_file(p, "not json at all", 0, {"not valid JSON"});
  expect_bad_file(p, R"(["w"])", 0, {"must be a JSON object"});
  expect_bad_file(p, R"({"w": 5})", 0, {"'w'", "must be an object"});
  // Nesting is bounded (the parser must not recurse without limit).
  expect_bad_file(p, R"({"w":{"shape":)" + std::string(5000, '[') + std::string(5000, ']') + "}}", 0,
                  {"nests deeper", "'w'"});
}

TEST_F(Safetensors, UnknownDtype) {
  const fs::path p = dir_ / "dtype.safetensors";
  expect_bad_file(p, R"({"w.f64":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8,
                  {"'w.f64'", "unknown dtype", "F64"});
  // Our own spellings are not safetensors dtypes.
  expect_bad_file(p, R"({"w.lower":{"dtype":"bf16","shape":[1],"data_offsets":[0,2]}})", 2,
                  {"'w.lower'", "unknown dtype"});
  expect_bad_file(p, R"({"w.num":{"dtype":7,"shape":[1],"data_offsets":[0,2]}})", 2, {"'w.num'", "dtype"});
  expect_bad_file(p, R"({"w.none":{"shape":[1],"data_offsets":[0,2]}})", 2, {"'w.none'", "missing dtype"});
}

TEST_F(Safetensors, OffsetsOutOfRangeOrWrongType) {
  const fs::path p = dir_ / "off.safetensors";
  expect_bad_file(p, R"({"w.far":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 8,
                  {"'w.far'", "out of range"});
  expect_bad_file(p, R"({"w.rev":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})", 8,
                  {"'w.rev'", "end before begin"});
  expect_bad_file(p, R"({"w.neg":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 8,
                  {"'w.neg'", "data_offsets"});
  expect_bad_file(p, R"({"w.str":{"dtype":"U8","shape":[1],"data_offsets":"0,1"}})", 8,
                  {"'w.str'", "data_offsets"});
  expect_bad_file(p, R"({"w.three":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 8,
                  {"'w.three'", "data_offsets"});
  expect_bad_file(p, R"({"w.float":{"dtype":"U8","shape":[1],"data_offsets":[0,1.0]}})", 8,
                  {"'w.float'", "data_offsets"});
  expect_bad_file(p, R"({"w.huge":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,0]}})", 8,
                  {"'w.huge'"});
  expect_bad_file(p, R"({"w.big":{"dtype":"U8","shape":[1],"data_offsets":[0,99999999999999999999999]}})", 8,
                  {"'w.big'", "data_offsets"});
  expect_bad_file(p, R"({"w.miss":{"dtype":"U8","shape":[1]}})", 8, {"'w.miss'", "missing data_offsets"});
}

TEST_F(Safetensors, OverlappingOffsets) {
  const fs::path p = dir_ / "overlap.safetensors";
  expect_bad_file(p,
                  R"({"first":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("second":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  12, {"'first'", "'second'", "overlap"});
  // Contained entirely in a larger one, listed before it.
  expect_bad_file(p,
                  R"({"inner":{"dtype":"U8","shape":[2],"data_offsets":[10,12]},)"
                  R"("outer":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})",
                  16, {"'inner'", "'outer'", "overlap"});
  // Touching ranges and gaps are fine.
  write_raw(
      p,
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},)"
      R"("c":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})",
      10);
  EXPECT_EQ(SafetensorsFile::open(p)->tensors().size(), 3u);
}

TEST_F(Safetensors, ShapeByteSizeMismatchAndBadShapes) {
  const fs::path p = dir_ / "shape.safetensors";
  expect_bad_file(p, R"({"w.mis":{"dtype":"BF16","shape":[3,4],"data_offsets":[0,12]}})", 24,
                  {"'w.mis'", "needs 24 bytes", "span 12"});
  expect_bad_file(p, R"({"w.neg":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 8,
                  {"'w.neg'", "shape"});
  expect_bad_file(p, R"({"w.flt":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 8,
                  {"'w.flt'", "shape"});
  expect_bad_file(p, R"({"w.str":{"dtype":"U8","shape":"1","data_offsets":[0,1]}})", 8, {"'w.str'", "shape"});
  expect_bad_file(p, R"({"w.nest":{"dtype":"U8","shape":[[1]],"data_offsets":[0,1]}})", 8,
                  {"'w.nest'", "shape"});
  expect_bad_file(p, R"({"w.bool":{"dtype":"U8","shape":[true],"data_offsets":[0,1]}})", 8,
                  {"'w.bool'", "shape"});
  // Products that overflow 64 bits must be caught, not wrap to a small size that matches the offsets.
  expect_bad_file(p, R"({"w.ovf":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 8,
                  {"'w.ovf'", "64 bits"});
  expect_bad_file(p, R"({"w.ovf2":{"dtype":"I64","shape":[4611686018427387904],"data_offsets":[0,0]}})", 8,
                  {"'w.ovf2'", "64 bits"});
  expect_bad_file(p, R"({"w.dim":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]}})", 8,
                  {"'w.dim'", "too large"});
  // A zero dimension makes the tensor empty whatever the others are.
  write_raw(p, R"({"w.zero":{"dtype":"U8","shape":[0,9223372036854775807],"data_offsets":[0,0]}})", 0);
  EXPECT_EQ(SafetensorsFile::open(p)->tensor("w.zero").numel(), 0);
}

TEST_F(Safetensors, DuplicatesUnknownKeysAndMetadata) {
  const fs::path p = dir_ / "dup.safetensors";
  expect_bad_file(p,
                  R"({"twice":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                  R"("twice":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                  2, {"'twice'", "twice in the header"});
  expect_bad_file(p, R"({"w.k":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1,
                  {"'w.k'", "'dtype'", "twice"});
  expect_bad_file(p, R"({"w.x":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":1}})", 1,
                  {"'w.x'", "unknown key", "'extra'"});
  expect_bad_file(p, R"({"__metadata__":{"k":1}})", 0, {"__metadata__", "'k'", "string"});
  expect_bad_file(p, R"({"__metadata__":["k"]})", 0, {"__metadata__"});
  expect_bad_file(p, R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1, {"empty name"});
}

TEST_F(Safetensors, NotARegularFileOrMissing) {
  expect_error([&] { SafetensorsFile::open(dir_ / "nope.safetensors"); },
               {"nope.safetensors", "cannot open"});
  expect_error([&] { SafetensorsFile::open(dir_); }, {dir_.string(), "not a regular file"});
  auto f = [&] {
    write_safetensors(dir_ / "ok.safetensors", {{"a", patterned({2}, DType::U8, 0)}});
    return SafetensorsFile::open(dir_ / "ok.safetensors");
  }();
  expect_error([&] { f->tensor("b"); }, {"ok.safetensors", "'b'"});
}

// ---- checkpoints ---------------------------------------------------------------------------------------

namespace {
void write_index(const fs::path& dir, const std::string& weight_map) {
  write_bytes(dir / "model.safetensors.index.json",
              R"({"metadata":{"total_size":0},"weight_map":)" + weight_map + "}");
}
}  // namespace

TEST_F(Safetensors, ShardedCheckpointWithIndex) {
  Tensor a = patterned({4, 4}, DType::BF16, 1), b = patterned({8}, DType::F32, 2),
         c = patterned({2, 3}, DType::F8_E4M3, 3), extra = patterned({1}, DType::U8, 4);
  write_safetensors(dir_ / "model-00001-of-00002.safetensors", {{"layers.0.a", a}, {"layers.0.b", b}});
  write_safetensors(dir_ / "model-00002-of-00002.safetensors", {{"layers.1.c", c}, {"not.indexed", extra}});
  write_index(
      dir_,
      R"({"layers.0.a":"model-00001-of-00002.safetensors","layers.0.b":"model-00001-of-00002.safetensors",
                        "layers.1.c":"model-00002-of-00002.safetensors"})");
  // A stray file the index does not mention is not read.
  write_bytes(dir_ / "junk.safetensors", "garbage");
  Checkpoint ck = Checkpoint::open(dir_);
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"layers.0.a", "layers.0.b", "layers.1.c"}));
  EXPECT_TRUE(same_bytes(ck.tensor("layers.0.a"), a));
  EXPECT_TRUE(same_bytes(ck.tensor("layers.0.b"), b));
  EXPECT_TRUE(same_bytes(ck.tensor("layers.1.c"), c));
  EXPECT_EQ(ck.info("layers.1.c").dtype, DType::F8_E4M3);
  EXPECT_EQ(ck.info("layers.1.c").shape, (Shape{2, 3}));
  // Tensors a shard holds but the index does not name are ignored.
  EXPECT_FALSE(ck.contains("not.indexed"));
  EXPECT_EQ(ck.files().size(), 2u);
  expect_error([&] { ck.tensor("layers.9.a"); }, {dir_.string(), "'layers.9.a'"});
  expect_error([&] { (void)ck.info("layers.9.a"); }, {"'layers.9.a'"});
}

TEST_F(Safetensors, IndexNamesTensorMissingFromShard) {
  write_safetensors(dir_ / "s1.safetensors", {{"present", patterned({2}, DType::U8, 0)}});
  write_index(dir_, R"({"present":"s1.safetensors","absent.weight":"s1.safetensors"})");
  expect_error([&] { Checkpoint::open(dir_); }, {"'absent.weight'", (dir_ / "s1.safetensors").string(),
                                                 "model.safetensors.index.json", "missing"});
}

TEST_F(Safetensors, IndexNamesMissingShardFile) {
  write_safetensors(dir_ / "s1.safetensors", {{"present", patterned({2}, DType::U8, 0)}});
  write_index(dir_, R"({"present":"s1.safetensors","lost.weight":"s2.safetensors"})");
  expect_error([&] { Checkpoint::open(dir_); },
               {"'lost.weight'", (dir_ / "s2.safetensors").string(), "does not exist"});
}

TEST_F(Safetensors, BadShardInsideCheckpointNamesFileAndTensor) {
  write_raw(dir_ / "s1.safetensors", R"({"w.bad":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  write_index(dir_, R"({"w.bad":"s1.safetensors"})");
  expect_error([&] { Checkpoint::open(dir_); },
               {(dir_ / "s1.safetensors").string(), "'w.bad'", "out of range"});
}

TEST_F(Safetensors, BadIndex) {
  const std::string idx = (dir_ / "model.safetensors.index.json").string();
  write_bytes(dir_ / "model.safetensors.index.json", "{\"weight_map\": {");
  expect_error([&] { Checkpoint::open(dir_); }, {idx, "not valid JSON"});
  write_bytes(dir_ / "model.safetensors.index.json", "{\"metadata\": {}}");
  expect_error([&] { Checkpoint::open(dir_); }, {idx, "missing weight_map"});
  write_index(dir_, R"({"w": 3})");
  expect_error([&] { Checkpoint::open(dir_); }, {idx, "'w'", "file name"});
  write_index(dir_, R"({"w": "../elsewhere.safetensors"})");
  expect_error([&] { Checkpoint::open(dir_); }, {idx, "'w'", "../elsewhere.safetensors"});
}

TEST_F(Safetensors, SingleFileAndUnindexedDirectory) {
  Tensor a = patterned({5}, DType::I32, 1), b = patterned({3}, DType::I64, 2);
  {
    fs::create_directories(dir_ / "single");
    write_safetensors(dir_ / "single" / "model.safetensors", {{"a", a}, {"b", b}});
    Checkpoint ck = Checkpoint::open(dir_ / "single");
    EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b"}));
    EXPECT_TRUE(same_bytes(ck.tensor("b"), b));
  }
  {
    fs::create_directories(dir_ / "multi");
    write_safetensors(dir_ / "multi" / "part-a.safetensors", {{"a", a}});
    write_safetensors(dir_ / "multi" / "part-b.safetensors", {{"b", b}});
    Checkpoint ck = Checkpoint::open(dir_ / "multi");
    EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b"}));
    EXPECT_TRUE(same_bytes(ck.tensor("a"), a));
    EXPECT_EQ(ck.files().size(), 2u);
    // The same name in two unindexed files is ambiguous.
    write_safetensors(dir_ / "multi" / "part-c.safetensors", {{"a", b}});
    expect_error([&] { Checkpoint::open(dir_ / "multi"); },
                 {"'a'", "part-a.safetensors", "part-c.safetensors"});
  }
  fs::create_directories(dir_ / "empty");
  expect_error([&] { Checkpoint::open(dir_ / "empty"); },
               {(dir_ / "empty").string(), "no model.safetensors"});
  expect_error([&] { Checkpoint::open(dir_ / "absent"); }, {(dir_ / "absent").string(), "not a directory"});
}

TEST_F(Safetensors, WriterRefusesBadInput) {
  const fs::path p = dir_ / "w.safetensors";
  Tensor t = patterned({2}, DType::U8, 0);
  expect_error([&] { write_safetensors(p, {{"x", t}, {"x", t}}); }, {p.string(), "'x'", "twice"});
  expect_error([&] { write_safetensors(p, {{"__metadata__", t}}); }, {p.string(), "reserved"});
  expect_error([&] { write_safetensors(p, {{"q", patterned({2, 3}, DType::NVFP4, 0)}}); }, {"'q'", "even"});
  expect_error(
      [&] {
        write_safetensors(dir_ / "no" / "such" / "dir.safetensors", {{"x", t}});
      },
      {"cannot create"});
  EXPECT_FALSE(fs::exists(p));
}

TEST_F(Safetensors, WriterCopiesNonContiguousTensors) {
  Tensor t = patterned({4, 6}, DType::F32, 3);
  Tensor cols = t.slice(1, 2, 5);
  ASSERT_FALSE(cols.is_contiguous());
  write_safetensors(dir_ / "s.safetensors", {{"cols", cols}});
  auto f = SafetensorsFile::open(dir_ / "s.safetensors");
  EXPECT_TRUE(same_bytes(f->tensor("cols"), cols.clone()));
}

// The reference implementation (Python safetensors) reads what we write and we read what it writes.
TEST_F(Safetensors, InteroperatesWithReferenceImplementation) {
  if (std::system("python3 -c 'import safetensors.numpy, numpy' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 safetensors/numpy not installed";
  Tensor a = patterned({3, 5}, DType::F32, 1), b = patterned({7}, DType::U8, 2),
         c = patterned({2, 2}, DType::I64, 3);
  const fs::path ours = dir_ / "ours.safetensors", theirs = dir_ / "theirs.safetensors";
  write_safetensors(ours, {{"b", b}, {"a", a}, {"c", c}}, {{"format", "np"}});
  const std::string script = fmt::format(
      "import numpy as np, safetensors.numpy as st\n"
      "from safetensors import safe_open\n"
      "d = st.load_file('{0}')\n"
      "assert d['a'].dtype == np.float32 and d['a'].shape == (3, 5)\n"
      "assert d['b'].dtype == np.uint8 and d['b'].shape == (7,)\n"
      "assert d['c'].dtype == np.int64 and d['c'].shape == (2, 2)\n"
      "with safe_open('{0}', 'np') as f: assert f.metadata() == {{'format': 'np'}}\n"
      "out = {{'a': d['a'] * 2, 'h': np.arange(6, dtype=np.float16).reshape(2, 3), 'b': d['b']}}\n"
      "st.save_file(out, '{1}', metadata={{'k': 'v'}})\n",
      ours.string(), theirs.string());
  write_bytes(dir_ / "check.py", script);
  ASSERT_EQ(std::system(fmt::format("python3 '{}'", (dir_ / "check.py").string()).c_str()), 0);
  auto f = SafetensorsFile::open(theirs);
  EXPECT_EQ(f->metadata().at("k"), "v");
  Tensor a2 = f->tensor("a");
  ASSERT_EQ(a2.shape(), (Shape{3, 5}));
  for (int i = 0; i < 15; ++i) EXPECT_EQ(a2.data<const float>()[i], a.data<const float>()[i] * 2) << i;
  Tensor h = f->tensor("h");
  EXPECT_EQ(h.dtype(), DType::F16);
  EXPECT_EQ(h.data<const uint16_t>()[1], 0x3c00);  // 1.0 in binary16
  EXPECT_TRUE(same_bytes(f->tensor("b"), b));
}
