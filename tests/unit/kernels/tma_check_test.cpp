// The host-side tensor-map checks (kernels/cuda/common/tma_check.h): every rule of cuTensorMapEncodeTiled and
// of a tensor copy's box that the wgmma prefill kernel relies on is refused with the tensor's name, and the
// maps that kernel builds on GLM-5 shapes pass.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "kernels/cuda/common/tma_check.h"

namespace {

using ms::cuda::check_tma_box;
using ms::cuda::check_tma_map_2d;
using ms::cuda::TmaMap2d;

// A bf16 [12288, 2048] activation map with {64, 128} boxes in the 128-byte swizzle (the kernel's A map).
TmaMap2d a_map() {
  return {"xg", 0x10000, 2, 2048, 12288, 4096, 64, 128, 128};
}

// The message of the ms::Error that f throws ("" when none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ms::Error& e) {
    return e.what();
  }
  return {};
}

void expect_refused(const TmaMap2d& m, const std::string& rule) {
  const std::string msg = error_of([&] { check_tma_map_2d(m); });
  EXPECT_NE(msg.find(m.what), std::string::npos) << "names the tensor: " << msg;
  EXPECT_NE(msg.find(rule), std::string::npos) << "names the rule '" << rule << "': " << msg;
}

TEST(TmaCheck, KernelMapsPass) {
  EXPECT_NO_THROW(check_tma_map_2d(a_map()));
  // NVFP4 GLM-5 gate [2048, 6144]: codes {32 bytes, 128 rows}, scales {16 bytes, 128 rows}, unswizzled.
  EXPECT_NO_THROW(check_tma_map_2d({"gate", 0x20000, 1, 3072, 2048, 3072, 32, 128, 0}));
  EXPECT_NO_THROW(check_tma_map_2d({"gate_scale", 0x30000, 1, 384, 2048, 384, 16, 128, 0}));
  // BF16 down [6144, 2048], box {64, 128} swizzled.
  EXPECT_NO_THROW(check_tma_map_2d({"down", 0x40000, 2, 2048, 6144, 4096, 64, 128, 128}));
}

TEST(TmaCheck, MapRulesAreRefusedByName) {
  TmaMap2d m = a_map();
  m.base = 0x10008;  // 8-byte aligned only
  expect_refused(m, "16-byte aligned");
  m = a_map();
  m.base = 0;
  expect_refused(m, "non-null");
  m = a_map();
  m.row_bytes = 4104;  // not a multiple of 16
  expect_refused(m, "multiple of 16 and below 2^40");
  m = a_map();
  m.row_bytes = uint64_t{1} << 40;
  expect_refused(m, "below 2^40");
  m = a_map();
  m.row_bytes = 2048;  // less than the row's 4096 bytes
  expect_refused(m, "less than a row");
  m = a_map();
  m.rows = 0;
  expect_refused(m, "1 .. 2^32");
  m = a_map();
  m.box_rows = 257;
  expect_refused(m, "1 .. 256");
  m = a_map();
  m.box_cols = 0;
  expect_refused(m, "1 .. 256");
  // One k step's 4 NVFP4 scale bytes as a box row: below a box row's 16 bytes.
  TmaMap2d s{"down_scale", 0x30000, 1, 24, 512, 32, 4, 64, 0};
  expect_refused(s, "multiple of 16");
  // 128 bf16 (256 bytes) in a 128-byte swizzle.
  m = a_map();
  m.box_cols = 128;
  expect_refused(m, "exceeds its 128-byte swizzle");
  m = a_map();
  m.swizzle_bytes = 96;
  expect_refused(m, "not none, 32, 64 or 128");
  m = a_map();
  m.elem_bytes = 3;
  expect_refused(m, "element size");
}

TEST(TmaCheck, BoxRulesAndBytes) {
  const TmaMap2d a = a_map();
  EXPECT_EQ(check_tma_box(a, 0, 0), 16384u);
  EXPECT_EQ(check_tma_box(a, 3 * 16384, 64 * 5), 16384u);
  // A 128-byte-swizzled box lands 1024-aligned, an unswizzled one 128-aligned.
  EXPECT_NE(error_of([&] { check_tma_box(a, 512, 0); }).find("1024-byte aligned"), std::string::npos);
  const TmaMap2d sc{"up_scale", 0x30000, 1, 384, 2048, 384, 16, 128, 0};
  EXPECT_EQ(check_tma_box(sc, 128, 16), 2048u);
  EXPECT_NE(error_of([&] { check_tma_box(sc, 64, 0); }).find("128-byte aligned"), std::string::npos);
  // The scale box that started at byte 4 kc (the first failure on the hardware): refused from k step 1 on.
  EXPECT_NO_THROW(check_tma_box(sc, 0, 0));
  const std::string msg = error_of([&] { check_tma_box(sc, 0, 4); });
  EXPECT_NE(msg.find("up_scale"), std::string::npos) << msg;
  EXPECT_NE(msg.find("multiple of 16"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { check_tma_box(a, 0, -64); }).find("non-negative"), std::string::npos);
  // bf16 columns: 8 elements = 16 bytes pass, 4 do not.
  EXPECT_NO_THROW(check_tma_box(a, 0, 8));
  EXPECT_FALSE(error_of([&] { check_tma_box(a, 0, 4); }).empty());
}

}  // namespace
