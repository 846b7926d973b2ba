// Every kernel configuration chooser against the limits of the parts moeserve targets, without the hardware:
// nothing chosen may exceed its device, and a kernel that cannot fit is refused with a message naming the
// kernel, what it needs and the limit (the crash class of a MoE tile config that needed more shared memory
// than an sm_120 part has).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <initializer_list>
#include <string>
#include <utility>

#include "kernels/cuda/common/kernel_fit.h"
#include "kernels/cuda/gemm/bf16_gemv_config.h"
#include "kernels/cuda/mla_decode/mla_decode_config.h"
#include "kernels/cuda/moe/moe_decode_config.h"
#include "kernels/cuda/moe/moe_decode_fp8_config.h"
#include "kernels/cuda/moe/moe_experts_mma_config.h"
#include "kernels/cuda/moe/moe_experts_wgmma_config.h"
#include "kernels/cuda/moe/moe_stream_config.h"
#include "kernels/cuda/nvfp4_gemv/nvfp4_gemv_config.h"

namespace {

using namespace ms::cuda;

TEST(KernelFit, PresetsAreTheTargetParts) {
  const auto presets = target_device_presets();
  ASSERT_EQ(presets.size(), 3u);
  EXPECT_EQ(presets[0].arch, 90);
  EXPECT_EQ(presets[1].arch, 100);
  EXPECT_EQ(presets[2].arch, 120);
  EXPECT_EQ(presets[0].smem_per_block_optin, 227u * 1024);
  EXPECT_EQ(presets[2].smem_per_block_optin, 99u * 1024);
}

TEST(KernelFit, RefusalNamesKernelNeedAndLimit) {
  const KernelNeed need{"big_tile", 150000, 80, false};
  EXPECT_FALSE(why_cannot_run(need, limits_h200()).has_value());
  const auto why = why_cannot_run(need, limits_rtx_pro_6000());
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("big_tile"), std::string::npos) << *why;
  EXPECT_NE(why->find("150000"), std::string::npos) << *why;
  EXPECT_NE(why->find("101376"), std::string::npos) << *why;
  const KernelNeed wgmma{"sm90a_kernel", 1000, 90, true};
  EXPECT_FALSE(why_cannot_run(wgmma, limits_h200()).has_value());
  ASSERT_TRUE(why_cannot_run(wgmma, limits_b200()).has_value());
  EXPECT_NE(why_cannot_run(wgmma, limits_b200())->find("sm_90a"), std::string::npos);
  EXPECT_TRUE(why_cannot_run(KernelNeed{"new_only", 0, 100, false}, limits_h200()).has_value());
}

TEST(KernelFit, Nvfp4GemvChoosesWhatFitsEveryPreset) {
  // GLM-5 and DeepSeek-V3 expert and dense shapes (n = outputs, k = inputs), plus a large square one.
  const int shapes[][2] = {{4096, 6144},   {6144, 2048}, {4096, 7168},  {7168, 2048},
                           {16384, 16384}, {256, 6144},  {24576, 6144}, {32, 32}};
  int checked = 0;
  for (const DeviceLimits& dev : target_device_presets())
    for (const auto& s : shapes)
      for (int m = 1; m <= nvfp4_gemv_config::kMaxM; ++m) {
        const auto c = nvfp4_gemv_config::choose(m, s[0], s[1], dev);
        const auto why = why_cannot_run(nvfp4_gemv_config::need(m, c), dev);
        EXPECT_FALSE(why.has_value())
            << dev.name << " m" << m << " n" << s[0] << " k" << s[1] << ": " << *why;
        EXPECT_GE(c.splits, 1);
        ++checked;
      }
  EXPECT_EQ(checked, 3 * 8 * 8);
}

TEST(KernelFit, Nvfp4GemvAvoidsTilesTooLargeForASmallDevice) {
  // A device with little shared memory: the chooser must drop to tiles that fit, not pick the largest.
  DeviceLimits tiny{"tiny", 90, nvfp4_gemv_config::smem_bytes(8, 32), 132};
  const auto c = nvfp4_gemv_config::choose(8, 16384, 16384, tiny);
  EXPECT_LE(c.rows_per_block, 32);
  EXPECT_FALSE(why_cannot_run(nvfp4_gemv_config::need(8, c), tiny).has_value());
}

TEST(KernelFit, Bf16GemvChoosesValidConfigsThatFillEveryPreset) {
  // GLM-5 BF16 linears (n = outputs, k = inputs): q_a, kv_a, kv_a with the indexer's wk, indexer wk and
  // weights_proj, q_b, indexer wq_b, o_proj, dense gate/up and down, shared expert gate/up and down, lm_head;
  // then odd and tiny shapes.
  const int shapes[][2] = {{2048, 6144},  {576, 6144},  {704, 6144},    {128, 6144},   {32, 6144},
                           {16384, 2048}, {4096, 2048}, {6144, 16384},  {12288, 6144}, {6144, 12288},
                           {2048, 6144},  {6144, 2048}, {154880, 6144}, {129, 136},    {7, 8},
                           {33, 1000},    {300, 16384}, {1, 520}};
  namespace bc = bf16_gemv_config;
  int checked = 0;
  for (const DeviceLimits& dev : target_device_presets())
    for (const auto& s : shapes)
      for (int m = 1; m <= bc::kMaxM; ++m) {
        const int n = s[0], k = s[1];
        const auto c = bc::choose(m, n, k, dev);
        const std::string where =
            dev.name + " m" + std::to_string(m) + " n" + std::to_string(n) + " k" + std::to_string(k);
        EXPECT_EQ(bc::why_invalid(c, n, k), "") << where;
        const auto why = why_cannot_run(bc::need(m, c), dev);
        EXPECT_FALSE(why.has_value()) << where << ": " << *why;
        // The device-independent scratch bound holds what this device's choice uses.
        if (c.splits > 1) {
          EXPECT_LE(static_cast<size_t>(c.splits) * m * n * 4, bc::partial_bytes_bound(m, n, k)) << where;
          EXPECT_LE(static_cast<size_t>(c.row_blocks) * 4, bc::counter_bytes_bound(n, k)) << where;
        }
        // Weights of 16 MB and more stream from (nearly) every multiprocessor; fewer 16-row tiles than half
        // the multiprocessors split k to find more blocks.
        const long blocks = static_cast<long>(c.row_blocks) * c.splits;
        const int tiles = bc::ceil_div(n, bc::kTileRows);
        if (2.0 * n * k >= 16e6) {
          EXPECT_GE(blocks, 0.85 * dev.multiprocessors) << where;
        }
        if (2 * tiles < dev.multiprocessors && c.slices > 1) {
          EXPECT_GT(c.splits, 1) << where;
        }
        // The estimate is the least of every configuration the chooser walks past.
        const double best = bc::estimate_us(m, n, k, c, dev);
        for (int tpb = 1; tpb <= std::min(bc::kMaxTilesPerBlock, tiles); ++tpb) {
          bc::Config o = c;
          o.tiles_per_block = tpb;
          o.row_blocks = bc::ceil_div(tiles, tpb);
          EXPECT_LE(best, bc::estimate_us(m, n, k, o, dev) * (1 + 1e-6)) << where << " tpb " << tpb;
        }
        ++checked;
      }
  EXPECT_EQ(checked, 3 * 18 * 8);
}

TEST(KernelFit, Fp8BlockGemvChoosesValidConfigsOnEveryPreset) {
  namespace bc = bf16_gemv_config;
  const auto fp8 = bc::Weights::FP8Block;
  const int shapes[][2] = {{2048, 6144}, {576, 6144}, {16384, 2048}, {6144, 16384},
                           {129, 144},   {7, 16},     {33, 4112},    {154880, 6144}};
  for (const DeviceLimits& dev : target_device_presets())
    for (const auto& s : shapes)
      for (int m : {1, 3, 8}) {
        const int n = s[0], k = s[1];
        const auto c = bc::choose(m, n, k, dev, fp8);
        const std::string where =
            dev.name + " m" + std::to_string(m) + " n" + std::to_string(n) + " k" + std::to_string(k);
        EXPECT_EQ(bc::why_invalid(c, n, k, fp8), "") << where;
        EXPECT_FALSE(why_cannot_run(bc::need(m, c, fp8), dev).has_value()) << where;
        // Each warp owns 256 of k: half the slices of the bf16 kernel's 128.
        EXPECT_EQ(c.slices, bc::ceil_div(bc::ceil_div(k, 256), c.warps)) << where;
        if (c.splits > 1) {
          EXPECT_LE(static_cast<size_t>(c.splits) * m * n * 4, bc::partial_bytes_bound(m, n, k, fp8))
              << where;
          EXPECT_LE(static_cast<size_t>(c.row_blocks) * 4, bc::counter_bytes_bound(n, k, fp8)) << where;
        }
      }
  EXPECT_NE(bc::need(1, bc::choose(1, 2048, 6144, limits_h200(), fp8), fp8).kernel.find("fp8_block_gemv"),
            std::string::npos);
}

TEST(KernelFit, Bf16GemvSplitsKOnlyWhenRowsAreFew) {
  namespace bc = bf16_gemv_config;
  const DeviceLimits h200 = limits_h200();
  // kv_a (576 rows): 36 tiles cannot fill 132 multiprocessors without splitting k.
  EXPECT_GT(bc::choose(1, 576, 6144, h200).splits, 1);
  // One slice of k: nothing to split, no scratch.
  const auto one = bc::choose(1, 4096, 1024, h200);
  EXPECT_EQ(one.slices, 1);
  EXPECT_EQ(one.splits, 1);
  EXPECT_EQ(bc::partial_bytes_bound(8, 4096, 1024), 0u);
  EXPECT_EQ(bc::counter_bytes_bound(4096, 1024), 0u);
  // lm_head, dense MLP: enough rows to fill the device; k is not split (no partial sums, no last-block tail).
  const auto lm = bc::choose(1, 154880, 6144, h200);
  EXPECT_EQ(lm.splits, 1);
  EXPECT_EQ(lm.tiles_per_block, bc::kMaxTilesPerBlock);
  EXPECT_EQ(bc::choose(1, 12288, 6144, h200).splits, 1);
  // Short k uses fewer warps (each owns 128 of it) instead of idle ones.
  EXPECT_EQ(bc::choose(2, 512, 512, h200).warps, 4);
  EXPECT_EQ(bc::choose(2, 512, 8, h200).warps, 1);
  // A configuration that does not cover the shape is named.
  bc::Config bad = bc::choose(1, 2048, 6144, h200);
  bad.splits += 1;
  EXPECT_NE(bc::why_invalid(bad, 2048, 6144).find("splits"), std::string::npos);
  bad = bc::choose(1, 2048, 6144, h200);
  bad.row_blocks -= 1;
  EXPECT_NE(bc::why_invalid(bad, 2048, 6144).find("row_blocks"), std::string::npos);
}

// For every target part, m of ms and (hidden, inter) of shapes (top 8 of 256 NVFP4 experts): choose(shape,
// device); a refusal must say why, a config the path takes goes to check(dev, m, {hidden, inter}, cfg).
// Returns how many were taken.
template <class Choose, class Check>
int for_each_taken(std::initializer_list<int> ms, std::initializer_list<std::array<int, 2>> shapes,
                   Choose choose, Check check) {
  int used = 0;
  for (const DeviceLimits& dev : target_device_presets())
    for (int m : ms)
      for (const std::array<int, 2>& hi : shapes) {
        const auto cfg = choose(moe_decode_common::Shape{true, hi[0], hi[1], m, 8, 256}, dev);
        if (!cfg.use) {
          EXPECT_FALSE(cfg.why.empty());
          continue;
        }
        ++used;
        check(dev, m, hi, cfg);
      }
  return used;
}

TEST(KernelFit, MoeStreamChoosesOnlyWhatFits) {
  namespace c = moe_stream_config;
  const int used = for_each_taken(
      {1, 2, 8, 9, 16, 17, 32, 128, 256}, {{6144, 2048}, {7168, 2048}, {1024, 512}, {512, 4096}}, c::choose,
      [](const DeviceLimits& dev, int m, const std::array<int, 2>& hi, const c::Config& cfg) {
        EXPECT_FALSE(why_cannot_run(c::need_gate_up(), dev).has_value()) << dev.name;
        EXPECT_FALSE(why_cannot_run(c::need_down(hi[1], m), dev).has_value()) << dev.name << " m" << m;
        EXPECT_LE(cfg.smem_gate_up, dev.smem_per_block_optin);
        EXPECT_LE(cfg.smem_down, dev.smem_per_block_optin);
        EXPECT_EQ(cfg.nt, m <= 8 ? 1 : m <= 16 ? 2 : 4);
        EXPECT_EQ(cfg.grid_down, hi[0] / c::kDownRows);
        EXPECT_GE(cfg.grid_gate_up, dev.multiprocessors);
      });
  EXPECT_GT(used, 0);
  // The H200 runs it for GLM-5 decode; sm_120 (99 KB per block) must not.
  EXPECT_TRUE(c::choose({true, 6144, 2048, 8, 8, 256}, limits_h200()).use);
  EXPECT_TRUE(c::choose({true, 6144, 2048, 256, 8, 256}, limits_b200()).use);
  const auto rtx = c::choose({true, 6144, 2048, 8, 8, 256}, limits_rtx_pro_6000());
  EXPECT_FALSE(rtx.use);
  EXPECT_NE(rtx.why.find("moe_stream"), std::string::npos) << rtx.why;
  // Outside its regime: other formats, prefill, shapes that are not multiples of 512.
  EXPECT_FALSE(c::choose({false, 6144, 2048, 8, 8, 256}, limits_h200()).use);
  EXPECT_FALSE(c::choose({true, 6144, 2048, 257, 8, 256}, limits_h200()).use);
  EXPECT_FALSE(c::choose({true, 6144, 1408, 8, 8, 256}, limits_h200()).use);
  EXPECT_FALSE(c::choose({true, 6100, 2048, 8, 8, 256}, limits_h200()).use);
  EXPECT_FALSE(c::choose({true, 6144, 2048, 8, 8, 2048}, limits_h200()).use);
}

TEST(KernelFit, MoeDecodeChoosesOnlyWhatFits) {
  namespace c = moe_decode_config;
  const int used = for_each_taken(
      {1, 2, 3, 5, 8, 9, 32, 64, 65, 100, 127, 128}, {{6144, 2048}, {7168, 2048}, {1024, 512}, {2048, 1024}},
      c::choose, [](const DeviceLimits& dev, int m, const std::array<int, 2>& hi, const c::Config& cfg) {
        EXPECT_GE(cfg.x_rows, 1);
        EXPECT_LE(cfg.x_rows, std::min(m, c::kChunk));
        EXPECT_FALSE(why_cannot_run(c::need_gate_up(hi[0], cfg.x_rows), dev).has_value()) << dev.name;
        EXPECT_FALSE(why_cannot_run(c::need_down(m), dev).has_value()) << dev.name << " m" << m;
        EXPECT_LE(cfg.smem_gate_up + c::kStaticSmem, dev.smem_per_block_optin);
        EXPECT_LE(cfg.smem_down + c::kStaticSmem, dev.smem_per_block_optin);
        EXPECT_EQ(cfg.grid_down, hi[0] / c::kDownRows);
        EXPECT_GE(cfg.grid_gate_up, dev.multiprocessors);
      });
  EXPECT_GT(used, 0);
  // GLM-5 and DeepSeek-V3 widths, 1 to 128 tokens of top-8, on every target part (the kernels need no
  // architecture-specific instruction); two gate_up blocks per multiprocessor on the H200, and the down
  // kernel's 128-token tiles still let three blocks share one (its launch bounds ask for three).
  for (const DeviceLimits& dev : target_device_presets())
    for (int m : {1, 8, 64, 65, 100, 128})
      for (int hidden : {6144, 7168}) {
        const c::Config cfg = c::choose({true, hidden, 2048, m, 8, 256}, dev);
        EXPECT_TRUE(cfg.use) << dev.name << " m" << m << " hidden " << hidden << ": " << cfg.why;
        EXPECT_EQ(cfg.smem_down, c::down_smem(m));
      }
  const c::Config h200 = c::choose({true, 6144, 2048, 1, 8, 256}, limits_h200());
  EXPECT_EQ(h200.x_rows, 1);
  EXPECT_EQ(h200.grid_gate_up, 2 * 132);
  EXPECT_EQ(c::choose({true, 6144, 2048, 64, 8, 256}, limits_h200()).grid_gate_up, 2 * 132);
  const c::Config h200_128 = c::choose({true, 6144, 2048, 128, 8, 256}, limits_h200());
  EXPECT_EQ(h200_128.grid_gate_up, 2 * 132);
  EXPECT_EQ(h200_128.x_rows, c::kChunk);
  EXPECT_GE(c::blocks_per_sm(h200_128.smem_down + c::kStaticSmem, limits_h200()), c::kDownMinBlocks);
  // The work list at the largest step: one position per (expert, chunk) pair at most.
  EXPECT_GE(c::kMaxEc, c::kMaxM * 8);
  // Outside its regime: other formats, m > 128, m * top_k > 1152 (128 tokens of top-8 plus the fused shared
  // expert fit), shapes that are not multiples of the warp split.
  EXPECT_FALSE(c::choose({false, 6144, 2048, 8, 8, 256}, limits_h200()).use);
  const c::Config m129 = c::choose({true, 6144, 2048, 129, 8, 256}, limits_h200());
  EXPECT_FALSE(m129.use);
  EXPECT_NE(m129.why.find("m = 129"), std::string::npos) << m129.why;
  EXPECT_TRUE(c::choose({true, 6144, 2048, 128, 9, 257}, limits_h200()).use);
  const c::Config slots = c::choose({true, 6144, 2048, 128, 10, 256}, limits_h200());
  EXPECT_FALSE(slots.use);
  EXPECT_NE(slots.why.find("m * top_k = 1280"), std::string::npos) << slots.why;
  EXPECT_FALSE(c::choose({true, 6144, 1408, 8, 8, 256}, limits_h200()).use);
  EXPECT_FALSE(c::choose({true, 5120 + 512, 2048, 8, 8, 256}, limits_h200()).use);
  EXPECT_FALSE(c::choose({true, 6144, 2048, 8, 8, 2048}, limits_h200()).use);
  // A device with little shared memory refuses with the kernel's name (gate_up: one staged x row of 6144 in
  // f16 beside its reduction tiles and work list needs ~26 KB).
  const DeviceLimits tiny{"tiny", 90, 20 * 1024, 16};
  const c::Config t = c::choose({true, 6144, 2048, 8, 8, 256}, tiny);
  EXPECT_FALSE(t.use);
  EXPECT_NE(t.why.find("moe_decode"), std::string::npos) << t.why;
}

// The register kernels' half variants (choose_variant(..., true)): hidden a multiple of 512 instead of 1024,
// the same shared-memory layout (red [2 groups][4 warps] takes the bytes of [8 warps]), so wherever both
// run they get the same x_rows, shared memory and grid; the ring (8 warps on one item) only where hidden is a
// multiple of 1024.
TEST(KernelFit, MoeDecodeHalfChoosesOnlyWhatFits) {
  namespace c = moe_decode_config;
  static_assert(c::gate_up_red_bytes() ==
                static_cast<size_t>(c::kHalfGroups) * c::kHalfWarps * 2 * c::kChunk * 16 * sizeof(float));
  int used = 0;
  for (const DeviceLimits& dev : target_device_presets())
    for (int m : {1, 2, 3, 5, 8, 9, 32, 64, 65, 100, 127, 128})
      for (int hidden : {512, 1024, 1536, 2048, 5632, 6144, 7168}) {
        const moe_decode_common::Shape s{true, hidden, 2048, m, 8, 256};
        const c::Config half = c::choose_variant(s, dev, true);
        const c::Config base = c::choose(s, dev);
        EXPECT_EQ(c::choose_variant(s, dev, false).x_rows, base.x_rows);
        if (hidden % 1024 != 0) {
          EXPECT_FALSE(base.use) << dev.name << " hidden " << hidden;
          EXPECT_NE(base.why.find("multiple of 1024"), std::string::npos) << base.why;
        }
        if (!half.use) {
          EXPECT_FALSE(half.why.empty());
          EXPECT_FALSE(base.use) << dev.name << " m" << m << " hidden " << hidden;
          continue;
        }
        ++used;
        EXPECT_FALSE(why_cannot_run(c::need_gate_up(hidden, half.x_rows), dev).has_value()) << dev.name;
        EXPECT_FALSE(why_cannot_run(c::need_down(m), dev).has_value()) << dev.name;
        EXPECT_EQ(half.smem_gate_up, c::gate_up_smem(hidden, half.x_rows));
        EXPECT_LE(half.smem_gate_up + c::kStaticSmem, dev.smem_per_block_optin);
        EXPECT_GE(c::blocks_per_sm(half.smem_gate_up + c::kStaticSmem, dev),
                  half.grid_gate_up / dev.multiprocessors);
        if (base.use) {
          EXPECT_EQ(half.x_rows, base.x_rows);
          EXPECT_EQ(half.smem_gate_up, base.smem_gate_up);
          EXPECT_EQ(half.grid_gate_up, base.grid_gate_up);
          EXPECT_EQ(half.ring, base.ring);
        } else {
          EXPECT_EQ(hidden % 1024, 512);
          EXPECT_FALSE(half.ring);
          EXPECT_NE(half.ring_why.find("multiple of 1024"), std::string::npos) << half.ring_why;
        }
      }
  EXPECT_GT(used, 0);
  const c::Config h200 = c::choose_variant({true, 5632, 2048, 8, 8, 256}, limits_h200(), true);
  EXPECT_TRUE(h200.use) << h200.why;
  EXPECT_EQ(h200.grid_gate_up, 2 * 132);
  const c::Config odd = c::choose_variant({true, 6144 + 256, 2048, 8, 8, 256}, limits_h200(), true);
  EXPECT_FALSE(odd.use);
  EXPECT_NE(odd.why.find("multiple of 512"), std::string::npos) << odd.why;
}

// The whole variant (one warp an item, all of k): hidden any multiple of 128, the 8-warp kernels' layout and
// x rows wherever those run too, kWholeMinBlocks blocks a multiprocessor.
TEST(KernelFit, MoeDecodeWholeTakesHiddenMultiplesOf128) {
  namespace c = moe_decode_config;
  int used = 0;
  for (const DeviceLimits& dev : target_device_presets())
    for (int m : {1, 3, 8, 64, 128})
      for (int hidden : {128, 640, 1536, 6144, 7168, 6144 + 64}) {
        const moe_decode_common::Shape s{true, hidden, 2048, m, 8, 256};
        const c::Config whole = c::choose_variant(s, dev, c::KSplit::kWarp);
        const c::Config base = c::choose(s, dev);
        if (hidden % 128 != 0) {
          EXPECT_FALSE(whole.use);
          EXPECT_NE(whole.why.find("multiple of 128"), std::string::npos) << whole.why;
          continue;
        }
        if (!whole.use) {
          EXPECT_FALSE(whole.why.empty());
          EXPECT_FALSE(base.use) << dev.name << " m" << m << " hidden " << hidden;
          continue;
        }
        ++used;
        EXPECT_FALSE(why_cannot_run(c::need_gate_up(hidden, whole.x_rows), dev).has_value()) << dev.name;
        EXPECT_EQ(whole.smem_gate_up, c::gate_up_smem(hidden, whole.x_rows));
        EXPECT_EQ(whole.grid_gate_up, c::kWholeMinBlocks * dev.multiprocessors);
        if (base.use) {
          EXPECT_EQ(whole.x_rows, base.x_rows);
        }
      }
  EXPECT_GT(used, 0);
  const c::Config h200 = c::choose_variant({true, 640, 2048, 1, 8, 256}, limits_h200(), c::KSplit::kWarp);
  EXPECT_TRUE(h200.use) << h200.why;
  EXPECT_EQ(h200.grid_gate_up, c::kWholeMinBlocks * 132);
}

// The tile variant: hidden any multiple of 128; its own layouts fit every preset where it runs, with the most
// x rows (up to min(m, 8)) that leave kTileMinBlocks blocks a multiprocessor; a gate_up grid of one block per
// (possible work-list entry, 32 intermediate indices), the entries bounded by m * top_k, by the experts
// times their most chunks, and by the work list's size.
TEST(KernelFit, MoeDecodeTileShapes) {
  namespace c = moe_decode_config;
  int used = 0;
  for (const DeviceLimits& dev : target_device_presets())
    for (int m : {1, 2, 3, 8, 32, 64, 128})
      for (int hidden : {128, 640, 6144, 7168, 6144 + 64}) {
        const moe_decode_common::Shape s{true, hidden, 2048, m, 8, 256};
        const c::Config tile = c::choose_variant(s, dev, c::KSplit::kTile);
        if (hidden % 128 != 0) {
          EXPECT_FALSE(tile.use);
          EXPECT_NE(tile.why.find("multiple of 128"), std::string::npos) << tile.why;
          continue;
        }
        if (!tile.use) {
          EXPECT_FALSE(tile.why.empty());
          continue;
        }
        ++used;
        EXPECT_FALSE(why_cannot_run(c::need_gate_up_tile(hidden, tile.x_rows), dev).has_value()) << dev.name;
        EXPECT_FALSE(why_cannot_run(c::need_down_tile(m), dev).has_value()) << dev.name;
        EXPECT_EQ(tile.smem_gate_up, c::gate_up_tile_smem(hidden, tile.x_rows));
        EXPECT_EQ(tile.smem_down, c::down_tile_smem(m));
        EXPECT_GE(tile.x_rows, 1);
        EXPECT_LE(tile.x_rows, std::min(m, moe_decode_common::kChunk));
        if (tile.x_rows > 1) {
          EXPECT_GE(moe_decode_common::blocks_per_sm(tile.smem_gate_up, dev), c::kTileMinBlocks);
        }
        if (tile.x_rows < std::min(m, moe_decode_common::kChunk)) {
          EXPECT_LT(moe_decode_common::blocks_per_sm(c::gate_up_tile_smem(hidden, tile.x_rows + 1), dev),
                    c::kTileMinBlocks);
        }
        EXPECT_EQ(tile.grid_gate_up, c::tile_max_entries(s, tile.x_rows) * (2048 / 32));
        EXPECT_EQ(tile.grid_down, hidden / 16);
        EXPECT_FALSE(tile.ring);
      }
  EXPECT_GT(used, 0);
  // One token of GLM-5 on an H200: 8 entries of one position, 64 blocks each.
  const c::Config one = c::choose_variant({true, 6144, 2048, 1, 8, 256}, limits_h200(), c::KSplit::kTile);
  ASSERT_TRUE(one.use) << one.why;
  EXPECT_EQ(one.x_rows, 1);
  EXPECT_EQ(one.grid_gate_up, 8 * 64);
  // 128 tokens of top-9 in chunks of 2: the 1152 positions bound the entries (576 chunks + 256 experts
  // would allow 832); 4 experts in chunks of 8: 1024 / 8 + 4.
  EXPECT_EQ(c::tile_max_entries({true, 6144, 2048, 128, 9, 256}, 1), 1152);
  EXPECT_EQ(c::tile_max_entries({true, 6144, 2048, 128, 9, 256}, 2), 832);
  EXPECT_EQ(c::tile_max_entries({true, 6144, 2048, 128, 8, 4}, 8), 132);
}

// The cp.async ring variant: where it is offered, its layout (ring after the register kernels' layout, the
// same x_rows) fits the device with a depth in range; where it is not, the register kernels still run and
// ring_why names the ring.
TEST(KernelFit, MoeDecodeRingChoosesOnlyWhatFits) {
  namespace c = moe_decode_config;
  int rings = 0;
  for_each_taken(
      {1, 2, 3, 5, 8, 9, 32, 64, 65, 100, 127, 128}, {{6144, 2048}, {7168, 2048}, {1024, 512}, {2048, 1024}},
      c::choose, [&](const DeviceLimits& dev, int m, const std::array<int, 2>& hi, const c::Config& cfg) {
        if (!cfg.ring) {
          EXPECT_NE(cfg.ring_why.find("ring"), std::string::npos) << cfg.ring_why;
          return;
        }
        ++rings;
        EXPECT_GE(cfg.ring_depth_gate_up, c::kRingMinDepth);
        EXPECT_LE(cfg.ring_depth_gate_up, c::kRingMaxDepth);
        EXPECT_GE(cfg.ring_depth_down, c::kRingMinDepth);
        EXPECT_LE(cfg.ring_depth_down, c::kRingMaxDepth);
        EXPECT_EQ(cfg.smem_gate_up_ring, c::gate_up_ring_smem(hi[0], cfg.x_rows, cfg.ring_depth_gate_up));
        EXPECT_EQ(cfg.smem_down_ring, c::down_ring_smem(m, cfg.ring_depth_down));
        EXPECT_FALSE(why_cannot_run(c::need_gate_up_ring(hi[0], cfg.x_rows, cfg.ring_depth_gate_up), dev))
            << dev.name << " m" << m;
        EXPECT_FALSE(why_cannot_run(c::need_down_ring(m, cfg.ring_depth_down), dev)) << dev.name << " m" << m;
        // The persistent grid's blocks per multiprocessor really fit beside each other.
        const int bps = cfg.grid_gate_up_ring / dev.multiprocessors;
        EXPECT_GE(bps, 1);
        EXPECT_LE(bps, 2);
        EXPECT_EQ(cfg.grid_gate_up_ring, bps * dev.multiprocessors);
        EXPECT_GE(c::blocks_per_sm(cfg.smem_gate_up_ring + c::kStaticSmem, dev), bps) << dev.name;
      });
  EXPECT_GT(rings, 0);
  // GLM-5 decode, 1 to 128 tokens, on the H200 and B200: the ring fits with at least three steps in flight.
  for (const DeviceLimits& dev : {limits_h200(), limits_b200()})
    for (int m : {1, 8, 32, 64, 100, 128}) {
      const c::Config cfg = c::choose({true, 6144, 2048, m, 8, 256}, dev);
      ASSERT_TRUE(cfg.use) << dev.name;
      EXPECT_TRUE(cfg.ring) << dev.name << " m" << m << ": " << cfg.ring_why;
      EXPECT_GE(cfg.ring_depth_gate_up, 3) << dev.name << " m" << m;
      EXPECT_GE(cfg.ring_depth_down, 3) << dev.name << " m" << m;
    }
  // sm_120 (99 KB per block): the gate_up ring fits only as one block a multiprocessor (three steps of 20 KB
  // beside two staged x rows of 6144); a hidden so wide that no ring fits beside one staged row is refused
  // with the kernel named, and the register kernels run.
  const c::Config rtx = c::choose({true, 6144, 2048, 8, 8, 256}, limits_rtx_pro_6000());
  EXPECT_TRUE(rtx.use);
  EXPECT_TRUE(rtx.ring) << rtx.ring_why;
  EXPECT_EQ(rtx.grid_gate_up_ring, limits_rtx_pro_6000().multiprocessors);
  EXPECT_LE(rtx.smem_gate_up_ring + c::kStaticSmem, limits_rtx_pro_6000().smem_per_block_optin);
  const c::Config wide = c::choose({true, 20480, 2048, 8, 8, 256}, limits_rtx_pro_6000());
  EXPECT_TRUE(wide.use) << wide.why;
  EXPECT_FALSE(wide.ring);
  EXPECT_NE(wide.ring_why.find("moe_decode_gate_up_ring"), std::string::npos) << wide.ring_why;
  // The depth choice itself: the most steps in flight per multiprocessor, two blocks on a tie, nothing when
  // kRingMinDepth steps do not fit.
  const DeviceLimits dev{"d", 90, 100 * 1024, 10};
  const size_t step = 10 * 1024;
  const c::RingFit two = c::ring_fit(10 * 1024, step, dev, 2);  // 2 blocks: ~38 KB each -> 3; 1 block: 8
  EXPECT_EQ(two.blocks, 1);
  EXPECT_EQ(two.depth, c::kRingMaxDepth);
  const c::RingFit none = c::ring_fit(90 * 1024, step, dev, 2);
  EXPECT_EQ(none.depth, 0);
}

// The FP8-block decode experts (DeepSeek-V3: hidden 7168, inter 2048; GLM-5 widths 6144 / 2048; small and odd
// multiples of 128): whatever is chosen fits its device, the gate_up grid is persistent with as many blocks
// per multiprocessor as really fit, and what cannot run is refused with the field or kernel named.
TEST(KernelFit, MoeDecodeFp8ChoosesOnlyWhatFits) {
  namespace c = moe_decode_fp8_config;
  int used = 0;
  for (const DeviceLimits& dev : target_device_presets())
    for (int m : {1, 2, 3, 5, 8, 9, 32, 64, 65, 100, 127, 128})
      for (const std::array<int, 2>& hi : {std::array<int, 2>{7168, 2048},
                                           {6144, 2048},
                                           {1024, 512},
                                           {2048, 1408},
                                           {128, 128},
                                           {384, 256}}) {
        const c::Config cfg = c::choose({true, 128, hi[0], hi[1], m, 8, 256}, dev);
        ASSERT_TRUE(cfg.use) << dev.name << " m" << m << " " << hi[0] << "x" << hi[1] << ": " << cfg.why;
        ++used;
        EXPECT_GE(cfg.x_rows, 1);
        EXPECT_LE(cfg.x_rows, std::min(m, c::kChunk));
        EXPECT_FALSE(why_cannot_run(c::need_gate_up(hi[0], cfg.x_rows), dev).has_value()) << dev.name;
        EXPECT_FALSE(why_cannot_run(c::need_down(m), dev).has_value()) << dev.name << " m" << m;
        EXPECT_EQ(cfg.smem_gate_up, c::gate_up_smem(hi[0], cfg.x_rows));
        EXPECT_EQ(cfg.smem_down, c::down_smem(m));
        EXPECT_LE(cfg.smem_gate_up + c::kStaticSmem, dev.smem_per_block_optin);
        EXPECT_LE(cfg.smem_down + c::kStaticSmem, dev.smem_per_block_optin);
        EXPECT_EQ(cfg.grid_down, hi[0] / c::kDownRows);
        const int bps = cfg.grid_gate_up / dev.multiprocessors;
        EXPECT_EQ(cfg.grid_gate_up, bps * dev.multiprocessors);
        EXPECT_GE(bps, 1);
        EXPECT_LE(bps, 2);
        EXPECT_GE(c::blocks_per_sm(cfg.smem_gate_up + c::kStaticSmem, dev), bps) << dev.name;
      }
  EXPECT_GT(used, 0);
  // DeepSeek-V3 on the H200: two gate_up blocks per multiprocessor, 7 staged x rows of 7168 at 8 tokens (8
  // would leave one block); sm_120's 99 KB per block leaves 2 rows for two blocks.
  const c::Config ds8 = c::choose({true, 128, 7168, 2048, 8, 8, 256}, limits_h200());
  EXPECT_EQ(ds8.x_rows, 7);
  EXPECT_EQ(ds8.grid_gate_up, 2 * 132);
  EXPECT_EQ(ds8.grid_down, 7168 / 16);
  EXPECT_EQ(c::choose({true, 128, 7168, 2048, 1, 8, 256}, limits_h200()).x_rows, 1);
  EXPECT_EQ(c::choose({true, 128, 6144, 2048, 8, 8, 256}, limits_h200()).x_rows, 8);
  const c::Config rtx = c::choose({true, 128, 7168, 2048, 8, 8, 256}, limits_rtx_pro_6000());
  EXPECT_EQ(rtx.x_rows, 2);
  EXPECT_EQ(rtx.grid_gate_up, 2 * 188);
  // Outside its regime, each refusal naming why.
  auto refused = [](const c::Shape& s, const char* word) {
    const c::Config cfg = c::choose(s, limits_h200());
    EXPECT_FALSE(cfg.use);
    EXPECT_NE(cfg.why.find(word), std::string::npos) << cfg.why;
  };
  refused({false, 128, 7168, 2048, 8, 8, 256}, "FP8Block");
  refused({true, 64, 7168, 2048, 8, 8, 256}, "fp8_block");
  refused({true, 128, 7168, 2048, 129, 8, 256}, "m = 129");
  EXPECT_TRUE(c::choose({true, 128, 7168, 2048, 128, 9, 257}, limits_h200()).use);  // + the shared expert
  refused({true, 128, 7168, 2048, 128, 10, 256}, "m * top_k = 1280");
  refused({true, 128, 7168, 2048, 0, 8, 256}, "m = 0");
  refused({true, 128, 7168, 2048, 128, 17, 256}, "top_k");
  refused({true, 128, 7168, 2048, 8, 8, 2048}, "n_experts");
  refused({true, 128, 7168 + 64, 2048, 8, 8, 256}, "hidden");
  refused({true, 128, 7168, 2048 + 64, 8, 8, 256}, "inter");
  // A device with little shared memory refuses with the kernel's name.
  const DeviceLimits tiny{"tiny", 90, 12 * 1024, 16};
  const c::Config t = c::choose({true, 128, 7168, 2048, 8, 8, 256}, tiny);
  EXPECT_FALSE(t.use);
  EXPECT_NE(t.why.find("moe_decode_fp8"), std::string::npos) << t.why;
}

TEST(KernelFit, MlaDecodeFitsHopperAndB200NotSm120) {
  EXPECT_FALSE(why_cannot_run(mla_decode_config::need(), limits_h200()).has_value());
  EXPECT_FALSE(why_cannot_run(mla_decode_config::need(), limits_b200()).has_value());
  const auto why = why_cannot_run(mla_decode_config::need(), limits_rtx_pro_6000());
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("mla_decode"), std::string::npos) << *why;
  EXPECT_NE(why->find(std::to_string(mla_decode_config::kSmemBytes)), std::string::npos) << *why;
}

}  // namespace

#if MOESERVE_HAVE_CUDA
#include "core/error.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/mla_attention/mla_attention.h"

namespace {

using namespace ms::cuda;

DeviceCaps caps_of(const DeviceLimits& l) {
  DeviceCaps c;
  c.name = l.name;
  c.sm_major = l.arch / 10;
  c.sm_minor = l.arch % 10;
  c.multiprocessors = l.multiprocessors;
  c.smem_per_block_optin = l.smem_per_block_optin;
  return c;
}

// Every attention configuration the chooser picks, over the head counts and cache formats the issue lists,
// fits the device it was chosen for; the fast fp8 decode kernel is never picked where it cannot run.
TEST(KernelFit, MlaAttentionChooserFitsEveryPreset) {
  int checked = 0;
  for (const DeviceLimits& dev : target_device_presets()) {
    const DeviceCaps caps = caps_of(dev);
    for (int heads : {8, 16, 32, 64, 128})
      for (KvFormat f : {KvFormat::FP8E4M3, KvFormat::BF16, KvFormat::F32})
        for (int page : {32, 64})
          for (bool decode : {true, false})
            for (bool topk : {false, true}) {
              MlaAttentionShape s{decode ? 32 : 300, heads, 512, 64, page, f, topk, decode, 32};
              const MlaAttentionConfig c = mla_attention_choose(s, caps);
              EXPECT_LE(c.smem_bytes, dev.smem_per_block_optin) << dev.name << " " << c.why;
              if (c.kernel == MlaAttentionKernel::Fp8Decode) {
                EXPECT_FALSE(why_cannot_run(mla_decode_config::need(), dev).has_value()) << dev.name;
              }
              if (c.kernel == MlaAttentionKernel::WgmmaDecode) {
                EXPECT_TRUE(f == KvFormat::FP8E4M3 && decode && !topk && dev.arch == 90) << dev.name;
                EXPECT_FALSE(why_cannot_run(mla_wgmma::need(), dev).has_value()) << dev.name;
                EXPECT_EQ(c.wgmma.head_groups * c.wgmma.heads_per_block >= heads, true);
                EXPECT_GE(c.wgmma.max_splits, 1);
              }
              if (c.kernel == MlaAttentionKernel::Sm90Decode) {
                EXPECT_TRUE(f != KvFormat::F32 && (decode || topk)) << dev.name;
                EXPECT_GE(c.sm90.stages, 2);
                EXPECT_GE(c.sm90.max_splits, 1);
                EXPECT_EQ(c.sm90.head_groups * c.sm90.heads_per_block >= heads, true);
              }
              ++checked;
            }
  }
  EXPECT_EQ(checked, 3 * 5 * 3 * 2 * 2 * 2);
  // A dense decode batch over fp8 pages of 64 with 64 heads: the warpgroup-MMA kernel on sm_90, elsewhere
  // the older split-KV kernel (measured faster there than the sm90 one); with 8 heads, or over a DSA
  // selection, the sm90 kernel. On sm_120 neither tensor-core decode kernel fits, so the general kernel.
  const MlaAttentionShape glm{8, 64, 512, 64, 64, KvFormat::FP8E4M3, false, true, 8};
  EXPECT_EQ(mla_attention_choose(glm, caps_of(limits_h200())).kernel, MlaAttentionKernel::WgmmaDecode);
  MlaAttentionShape glm_wgmma = glm;
  glm_wgmma.prefer = MlaAttentionPrefer::WgmmaDecode;
  EXPECT_EQ(mla_attention_choose(glm_wgmma, caps_of(limits_h200())).kernel, MlaAttentionKernel::WgmmaDecode);
  MlaAttentionShape glm_split = glm;
  glm_split.prefer = MlaAttentionPrefer::Fp8Decode;
  EXPECT_EQ(mla_attention_choose(glm_split, caps_of(limits_h200())).kernel, MlaAttentionKernel::Fp8Decode);
  MlaAttentionShape glm_bf16 = glm;
  glm_bf16.format = KvFormat::BF16;
  glm_bf16.prefer = MlaAttentionPrefer::WgmmaDecode;  // does not apply to bf16 pages: falls back
  EXPECT_NE(mla_attention_choose(glm_bf16, caps_of(limits_h200())).kernel, MlaAttentionKernel::WgmmaDecode);
  EXPECT_EQ(mla_attention_choose(glm, caps_of(limits_b200())).kernel, MlaAttentionKernel::Fp8Decode);
  EXPECT_EQ(mla_attention_choose(glm, caps_of(limits_rtx_pro_6000())).kernel, MlaAttentionKernel::General);
  MlaAttentionShape few = glm;
  few.heads = 8;
  EXPECT_EQ(mla_attention_choose(few, caps_of(limits_h200())).kernel, MlaAttentionKernel::Sm90Decode);
  MlaAttentionShape sel = glm;
  sel.has_topk = true;
  EXPECT_EQ(mla_attention_choose(sel, caps_of(limits_h200())).kernel, MlaAttentionKernel::Sm90Decode);
  // A preference that cannot take the batch falls back to the automatic choice, not to the general kernel:
  // the split-KV kernel asked for over a DSA selection, the sm90 one for a prefill batch.
  MlaAttentionShape sel_split = sel;
  sel_split.prefer = MlaAttentionPrefer::Fp8Decode;
  EXPECT_EQ(mla_attention_choose(sel_split, caps_of(limits_h200())).kernel, MlaAttentionKernel::Sm90Decode);
  MlaAttentionShape glm_sm90 = glm;
  glm_sm90.prefer = MlaAttentionPrefer::Sm90Decode;
  EXPECT_EQ(mla_attention_choose(glm_sm90, caps_of(limits_h200())).kernel, MlaAttentionKernel::Sm90Decode);
  const MlaAttentionShape prefill{300, 64, 512, 64, 64, KvFormat::FP8E4M3, false, false, 32};
  MlaAttentionShape prefill_sm90 = prefill;
  prefill_sm90.prefer = MlaAttentionPrefer::Sm90Decode;
  EXPECT_EQ(mla_attention_choose(prefill_sm90, caps_of(limits_h200())).kernel,
            mla_attention_choose(prefill, caps_of(limits_h200())).kernel);
  // Exact-parity runs: the split-KV kernel where it applies, else the f32 general kernel (never a bf16-math
  // tensor-core kernel).
  MlaAttentionShape exact_dense = glm, exact_sel = sel, exact_bf16 = glm;
  exact_dense.prefer = exact_sel.prefer = exact_bf16.prefer = MlaAttentionPrefer::Fp8DecodeElseGeneral;
  exact_bf16.format = KvFormat::BF16;
  EXPECT_EQ(mla_attention_choose(exact_dense, caps_of(limits_h200())).kernel, MlaAttentionKernel::Fp8Decode);
  EXPECT_EQ(mla_attention_choose(exact_sel, caps_of(limits_h200())).kernel, MlaAttentionKernel::General);
  EXPECT_EQ(mla_attention_choose(exact_bf16, caps_of(limits_h200())).kernel, MlaAttentionKernel::General);
  EXPECT_EQ(mla_decode_kernel_from_env(nullptr), MlaAttentionPrefer::Auto);
  EXPECT_EQ(mla_decode_kernel_from_env("wgmma"), MlaAttentionPrefer::WgmmaDecode);
  EXPECT_EQ(mla_decode_kernel_from_env("split"), MlaAttentionPrefer::Fp8Decode);
  EXPECT_THROW(mla_decode_kernel_from_env("fast"), ms::Error);
  EXPECT_EQ(mla_attention_choose(sel, caps_of(limits_b200())).kernel, MlaAttentionKernel::Sm90Decode);
  // Asked for, the older fp8 kernel is still chosen; the general kernel too.
  MlaAttentionShape old = glm;
  old.prefer = MlaAttentionPrefer::Fp8Decode;
  EXPECT_EQ(mla_attention_choose(old, caps_of(limits_h200())).kernel, MlaAttentionKernel::Fp8Decode);
  old.prefer = MlaAttentionPrefer::General;
  EXPECT_EQ(mla_attention_choose(old, caps_of(limits_h200())).kernel, MlaAttentionKernel::General);
  // A DSA decode batch over bf16 pages of 32: the sm90 kernel, with splits for a batch of one.
  const MlaAttentionShape dsa{1, 16, 512, 64, 32, KvFormat::BF16, true, true, 1};
  const MlaAttentionConfig d = mla_attention_choose(dsa, caps_of(limits_h200()));
  EXPECT_EQ(d.kernel, MlaAttentionKernel::Sm90Decode);
  EXPECT_GT(d.sm90.max_splits, 1);
  EXPECT_GT(d.workspace_bytes, 0u);
  // Shared memory per configuration: every head count, query tokens 1-4, fp8 and bf16 fit sm_90.
  for (int heads : {8, 16, 32, 64, 128})
    for (int q = 1; q <= 4; ++q)
      for (bool fp8 : {true, false}) {
        const mla_sm90::Config k = mla_sm90::choose(32, q, heads, fp8, limits_h200());
        ASSERT_GT(k.heads_per_block, 0) << heads << " " << q;
        EXPECT_LE(k.smem, limits_h200().smem_per_block_optin);
        EXPECT_LE(k.heads_per_block * q, mla_sm90::kMaxRows);
        EXPECT_GE(k.head_groups * k.heads_per_block, heads);
        if (k.blocks_per_sm == 2) {
          EXPECT_LE(2 * (k.smem + 1024), limits_h200().smem_per_block_optin);
        }
      }
  // The narrow configuration: fp8 pages, at most 32 rows a block, sm_89+; two blocks a multiprocessor up to
  // 16 rows, one with the deepest ring that fits at 32; splits fill the blocks the multiprocessors hold.
  const DeviceLimits h = limits_h200();
  const mla_sm90::Config n8 = mla_sm90::choose(64, 1, 8, true, h);
  EXPECT_EQ(n8.narrow_nt, 1);
  EXPECT_EQ(n8.blocks_per_sm, 2);
  EXPECT_EQ(n8.stages, 2);
  EXPECT_EQ(n8.smem, mla_sm90::narrow_smem_bytes(1, 2));
  EXPECT_LE(2 * (n8.smem + 1024), h.smem_per_block_optin);
  EXPECT_EQ(n8.max_splits, 264 / 64);
  EXPECT_EQ(n8.min_tiles_per_split, 2);
  const mla_sm90::Config n16 = mla_sm90::choose(64, 1, 16, true, h);
  EXPECT_EQ(n16.narrow_nt, 2);
  EXPECT_EQ(n16.blocks_per_sm, 2);
  const mla_sm90::Config n32 = mla_sm90::choose(1, 1, 32, true, h);  // one block: warp-specialised
  EXPECT_EQ(n32.narrow_nt, 4);
  EXPECT_TRUE(n32.narrow_ws);
  EXPECT_EQ(n32.blocks_per_sm, 1);
  EXPECT_EQ(n32.stages, 3);
  EXPECT_EQ(n32.smem, mla_sm90::narrow_smem_bytes(4, 3, true));
  EXPECT_LE(n32.smem, h.smem_per_block_optin);
  EXPECT_GT(mla_sm90::narrow_smem_bytes(4, 4, true), h.smem_per_block_optin);
  EXPECT_GT(mla_sm90::narrow_smem_bytes(4, 5), h.smem_per_block_optin);
  EXPECT_EQ(n32.max_splits, mla_sm90::kMaxSplits);
  EXPECT_EQ(n32.min_tiles_per_split, 4);
  EXPECT_EQ(mla_sm90::choose(8, 4, 8, true, h).narrow_nt, 4);   // 8 heads x 4 query tokens
  EXPECT_EQ(mla_sm90::choose(8, 3, 16, true, h).narrow_nt, 0);  // 48 rows
  EXPECT_EQ(mla_sm90::choose(8, 1, 64, true, h).narrow_nt, 0);
  EXPECT_EQ(mla_sm90::choose(8, 1, 8, false, h).narrow_nt, 0);  // bf16 pages
  EXPECT_EQ(mla_sm90::choose(8, 1, 8, true, h, 64, false).narrow_nt, 0);
  EXPECT_EQ(mla_sm90::choose(8, 1, 8, true, DeviceLimits{"sm_80 part", 80, 166912, 108}).narrow_nt, 0);
  // Its warp-specialised schedule: one block a multiprocessor, the deepest ring of 3+ steps that fits.
  const mla_sm90::Config w8 = mla_sm90::narrow_ws_of(n8, 8, h);
  EXPECT_TRUE(w8.narrow_ws);
  EXPECT_FALSE(n8.narrow_ws);
  EXPECT_EQ(w8.blocks_per_sm, 1);
  EXPECT_EQ(w8.stages, 5);
  EXPECT_EQ(w8.smem, mla_sm90::narrow_smem_bytes(1, 5, true));
  EXPECT_LE(w8.smem, h.smem_per_block_optin);
  EXPECT_EQ(w8.max_splits, 132 / 64);
  EXPECT_EQ(mla_sm90::narrow_ws_of(n16, 16, h).stages, 4);
  EXPECT_EQ(mla_sm90::narrow_ws_of(mla_sm90::choose(8, 1, 64, true, h), 64, h).narrow_nt, 0);  // not narrow
  // DSA launches of a handful of tokens take 16 heads a block: narrow blocks of 16 rows, 4 head groups.
  const mla_sm90::Config dsa1 =
      mla_sm90::choose(1, 1, 64, true, h, mla_sm90::auto_heads_cap(true, 1, 64, 132));
  EXPECT_EQ(dsa1.narrow_nt, 2);
  EXPECT_EQ(dsa1.head_groups, 4);
}

}  // namespace
#endif

#include "ops/backends.h"

namespace {

const ms::ops::BackendInfo& find(const std::vector<ms::ops::BackendInfo>& l, const std::string& name) {
  for (const auto& b : l)
    if (b.name == name) return b;
  throw std::runtime_error("no backend " + name);
}

// `moeserve backends --target ...`: the fp8 decode kernel is usable on Hopper and B200 and refused on the
// RTX PRO 6000 with the kernel, its need and the limit named; the CPU backends are always there.
TEST(Backends, JudgedAgainstEachTargetPart) {
  const auto h200 = ms::cuda::limits_h200(), rtx = ms::cuda::limits_rtx_pro_6000();
  const auto on_h200 = ms::ops::list_backends(&h200), on_rtx = ms::ops::list_backends(&rtx);
  EXPECT_TRUE(find(on_h200, "mla_fp8_decode").usable);
  const auto& refused = find(on_rtx, "mla_fp8_decode");
  EXPECT_FALSE(refused.usable);
  EXPECT_NE(refused.why.find("mla_decode"), std::string::npos) << refused.why;
  EXPECT_NE(refused.why.find("101376"), std::string::npos) << refused.why;
  EXPECT_TRUE(find(on_h200, "mla_decode_sm90").usable);
  EXPECT_FALSE(find(on_rtx, "mla_decode_sm90").usable);  // its smallest tile needs ~104 KiB
  EXPECT_TRUE(find(on_h200, "mla_decode_wgmma").usable) << find(on_h200, "mla_decode_wgmma").why;
  const auto b200 = ms::cuda::limits_b200();
  const auto on_b200 = ms::ops::list_backends(&b200);
  const auto& not_hopper = find(on_b200, "mla_decode_wgmma");  // sm_90a instructions
  EXPECT_FALSE(not_hopper.usable);
  EXPECT_NE(not_hopper.why.find("mla_decode_wgmma"), std::string::npos) << not_hopper.why;
  EXPECT_FALSE(find(on_rtx, "mla_decode_wgmma").usable);
  EXPECT_TRUE(find(on_rtx, "cpu").usable);
  for (const char* moe : {"grouped_stream", "grouped_decode", "grouped_decode_fp8",
                          "grouped_mma"})  // every MoE kernel is listed
    EXPECT_TRUE(find(on_h200, moe).usable) << moe << ": " << find(on_h200, moe).why;
  for (const auto& b : on_rtx)
    if (b.usable && b.device == "cuda") {
      EXPECT_LE(b.smem_bytes, rtx.smem_per_block_optin) << b.name;
    }
#if MOESERVE_HAVE_CUDA
  EXPECT_TRUE(find(on_rtx, "mla_general").usable) << find(on_rtx, "mla_general").why;
  EXPECT_TRUE(find(on_rtx, "grouped").usable) << find(on_rtx, "grouped").why;
#endif
  // This machine: a CUDA backend that cannot run here says why.
  for (const auto& b : ms::ops::list_backends())
    if (!b.usable) {
      EXPECT_FALSE(b.why.empty()) << b.name;
    }
}

}  // namespace

namespace {

using namespace ms::cuda;

// The tensor-core MoE experts: every preset gets a configuration for GLM-5 shapes, within its shared memory;
// the sm_120 part (99 KiB) gets a shallower pipeline than the 227 KiB parts when the deep one does not fit.
TEST(KernelFit, MoeMmaConfigFitsEveryTarget) {
  for (MoeMmaFormat f : {MoeMmaFormat::NVFP4, MoeMmaFormat::BF16, MoeMmaFormat::FP8Block}) {
    for (int hidden : {6144, 7168}) {  // GLM-5, DeepSeek-V3
      for (int m : {256, 512, 2048, 8192}) {
        const MoeMmaShape s{f, m, 8, 256, hidden, 2048};
        for (const DeviceLimits& dev : target_device_presets()) {
          std::string why;
          const auto cfg = choose_moe_mma_config(s, dev, &why);
          ASSERT_TRUE(cfg.has_value()) << dev.name << ": " << why;
          EXPECT_LE(cfg->smem, dev.smem_per_block_optin) << dev.name;
          EXPECT_EQ(cfg->smem, moe_mma_smem_bytes(f, cfg->bm, cfg->stages, 256));
          EXPECT_FALSE(why_cannot_run({"moe_experts_mma", cfg->smem, 80, false}, dev).has_value());
          EXPECT_EQ(cfg->bm, m * 8 / 256 >= 96 ? 128 : 64);
        }
      }
    }
  }
  // FP8Block stage: [128][64] e4m3 + 16 bytes of group scales; plus the decoded bf16 tile.
  EXPECT_EQ(moe_mma_smem_bytes(MoeMmaFormat::FP8Block, 128, 4, 256),
            size_t{4 * 128 * 128 + 4 * (128 * 64 + 16) + 128 * 128 + 1152});
  const MoeMmaShape big{MoeMmaFormat::BF16, 8192, 8, 256, 6144, 2048};
  EXPECT_EQ(choose_moe_mma_config(big, limits_h200())->stages, 4);
  EXPECT_LT(choose_moe_mma_config(big, limits_rtx_pro_6000())->stages, 4);
}

// The warpgroup-MMA MoE GEMMs: sm_90a code, so only the H200 preset gets a configuration (GLM-5: 256-row
// weight tiles for both projections, the deepest ring that fits 227 KiB); the others are refused with the
// kernel's name and the architecture, and a shape the tiles do not divide is refused with the field.
// NVFP4 expanded by the consumers (the default): A + raw ring, 3 bf16 W buffers; the producer layout (bf16
// ring + raw ring of stages - 1) stays selectable; BF16 weights ignore the choice.
// The tensor-copy loads: NVFP4 raw rows carry 16 scale bytes (a tensor copy's row), so the consumer layout
// holds 4 stages on an H200 where the cp.async one holds 5; BF16 keeps its 4-stage ring; shapes whose NVFP4
// scale rows are not multiples of 16 bytes fall back to the cp.async loads; nothing fits off sm_90.
TEST(KernelFit, MoeWgmmaTmaLayouts) {
  const MoeMmaShape s{MoeMmaFormat::NVFP4, 8192, 8, 256, 6144, 2048};
  const auto t = choose_moe_wgmma_config(s, limits_h200(), nullptr, MoeWgExpand::Producer, MoeWgLoad::Tma);
  ASSERT_TRUE(t.has_value());
  for (const MoeWgmmaGemmConfig& g : {t->gate_up, t->down}) {
    EXPECT_EQ(g.load, MoeWgLoad::Tma);
    EXPECT_EQ(g.expand, MoeWgExpand::Consumer);  // Tma implies it
    EXPECT_EQ(g.bn, 256);
    EXPECT_EQ(g.stages, 4);
    // 1024 slack + A ring + 3 W buffers + raw ring (256 x (32 + 16)) + barriers + table.
    EXPECT_EQ(g.smem, size_t{1024 + 4 * 16384 + 3 * 32768 + 4 * 12288 + 128 + 1152});
    EXPECT_LE(g.smem, limits_h200().smem_per_block_optin);
    EXPECT_GT(moe_wgmma_smem_bytes(MoeMmaFormat::NVFP4, 256, 5, 256, MoeWgExpand::Consumer, MoeWgLoad::Tma),
              limits_h200().smem_per_block_optin);
  }
  MoeMmaShape b = s;
  b.format = MoeMmaFormat::BF16;
  const auto tb = choose_moe_wgmma_config(b, limits_h200(), nullptr, MoeWgExpand::Consumer, MoeWgLoad::Tma);
  ASSERT_TRUE(tb.has_value());
  EXPECT_EQ(tb->gate_up.load, MoeWgLoad::Tma);
  EXPECT_EQ(tb->gate_up.stages, 4);
  EXPECT_EQ(tb->gate_up.smem, moe_wgmma_smem_bytes(MoeMmaFormat::BF16, 256, 4, 256));
  const MoeMmaShape narrow{MoeMmaFormat::NVFP4, 1000, 4, 16, 384, 192};
  EXPECT_TRUE(moe_wgmma_tma_shape_unsupported(narrow).has_value());
  const auto n =
      choose_moe_wgmma_config(narrow, limits_h200(), nullptr, MoeWgExpand::Consumer, MoeWgLoad::Tma);
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->gate_up.load, MoeWgLoad::CpAsync);
  for (const DeviceLimits& dev : {limits_b200(), limits_rtx_pro_6000()})
    EXPECT_FALSE(choose_moe_wgmma_config(s, dev, nullptr, MoeWgExpand::Consumer, MoeWgLoad::Tma).has_value())
        << dev.name;
  // FP8Block has no tensor-copy loads: refused with the reason, the cp.async configuration instead (the same
  // one as asked for with CpAsync), also from the one-projection chooser.
  const MoeMmaShape f8{MoeMmaFormat::FP8Block, 8192, 8, 256, 7168, 2048, 128};
  const auto why = moe_wgmma_tma_shape_unsupported(f8);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("FP8Block"), std::string::npos) << *why;
  EXPECT_FALSE(moe_wgmma_tma_unsupported(MoeMmaFormat::BF16).has_value());
  EXPECT_FALSE(moe_wgmma_tma_unsupported(MoeMmaFormat::NVFP4).has_value());
  const auto t8 = choose_moe_wgmma_config(f8, limits_h200(), nullptr, MoeWgExpand::Consumer, MoeWgLoad::Tma);
  const auto c8 = choose_moe_wgmma_config(f8, limits_h200());
  ASSERT_TRUE(t8.has_value() && c8.has_value());
  for (const auto& [g, c] : {std::pair{t8->gate_up, c8->gate_up}, std::pair{t8->down, c8->down}}) {
    EXPECT_EQ(g.load, MoeWgLoad::CpAsync);
    EXPECT_EQ(g.stages, c.stages);
    EXPECT_EQ(g.smem, c.smem);
  }
  const auto g8 = choose_moe_wgmma_gemm(MoeMmaFormat::FP8Block, 256, 256, limits_h200(), nullptr,
                                        MoeWgExpand::Consumer, MoeWgLoad::Tma);
  ASSERT_TRUE(g8.has_value());
  EXPECT_EQ(g8->load, MoeWgLoad::CpAsync);
}

// The Registers layout (NVFP4 expanded into wgmma A fragments): 128 weight rows x 256 grouped rows, no bf16
// W buffers, 5 stages on an H200 at GLM-5's shape (A 32 KiB + raw 6 KiB a stage); both projections; BF16,
// FP8Block and cp.async loads fall back to their own layouts; nothing fits off sm_90.
TEST(KernelFit, MoeWgmmaRegistersLayout) {
  const MoeMmaShape s{MoeMmaFormat::NVFP4, 8192, 8, 256, 6144, 2048};
  const auto r = choose_moe_wgmma_config(s, limits_h200(), nullptr, MoeWgExpand::Registers, MoeWgLoad::Tma);
  ASSERT_TRUE(r.has_value());
  for (const MoeWgmmaGemmConfig& g : {r->gate_up, r->down}) {
    EXPECT_EQ(g.expand, MoeWgExpand::Registers);
    EXPECT_EQ(g.load, MoeWgLoad::Tma);
    EXPECT_EQ(g.bn, kMoeWgRsBN);
    EXPECT_EQ(g.stages, 5);
    // 1024 slack + A ring ([256][64] bf16) + raw ring (128 x (32 + 16)) + barriers + table; no W buffers.
    EXPECT_EQ(g.smem, size_t{1024 + 5 * 32768 + 5 * 6144 + 128 + 1152});
    EXPECT_GT(
        moe_wgmma_smem_bytes(MoeMmaFormat::NVFP4, kMoeWgRsBN, 6, 256, MoeWgExpand::Registers, MoeWgLoad::Tma),
        limits_h200().smem_per_block_optin);
    EXPECT_LE(g.smem, limits_h200().smem_per_block_optin);
  }
  // cp.async loads, other formats: their own layouts.
  const auto c = choose_moe_wgmma_config(s, limits_h200(), nullptr, MoeWgExpand::Registers);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->gate_up.expand, MoeWgExpand::Consumer);
  EXPECT_EQ(c->down.expand, MoeWgExpand::Consumer);
  for (MoeMmaFormat f : {MoeMmaFormat::BF16, MoeMmaFormat::FP8Block}) {
    MoeMmaShape o = s;
    o.format = f;
    o.fp8_block = 128;
    const auto x = choose_moe_wgmma_config(o, limits_h200(), nullptr, MoeWgExpand::Registers, MoeWgLoad::Tma);
    ASSERT_TRUE(x.has_value());
    EXPECT_NE(x->gate_up.expand, MoeWgExpand::Registers);
    EXPECT_NE(x->down.expand, MoeWgExpand::Registers);
  }
  // A small shape whose tiles are 256 rows in both projections takes it too.
  const MoeMmaShape ok{MoeMmaFormat::NVFP4, 1000, 4, 16, 512, 512};
  const auto rok =
      choose_moe_wgmma_config(ok, limits_h200(), nullptr, MoeWgExpand::Registers, MoeWgLoad::Tma);
  ASSERT_TRUE(rok.has_value());
  EXPECT_EQ(rok->gate_up.expand, MoeWgExpand::Registers);
  EXPECT_EQ(rok->down.expand, MoeWgExpand::Registers);
  // The projection chooser sets the layout's own tile height whatever it was given.
  const auto g256 = choose_moe_wgmma_gemm(MoeMmaFormat::NVFP4, 256, 16, limits_h200(), nullptr,
                                          MoeWgExpand::Registers, MoeWgLoad::Tma);
  ASSERT_TRUE(g256.has_value());
  EXPECT_EQ(g256->expand, MoeWgExpand::Registers);
  EXPECT_EQ(g256->bn, kMoeWgRsBN);
  for (const DeviceLimits& dev : {limits_b200(), limits_rtx_pro_6000()})
    EXPECT_FALSE(choose_moe_wgmma_config(s, dev, nullptr, MoeWgExpand::Registers, MoeWgLoad::Tma).has_value())
        << dev.name;
}

// The default layout by the step's size: Registers from 128 grouped rows an expert on average (GLM-5: 4096
// tokens x top-8 over 256 experts), the consumer layout below; no experts, the consumer layout.
TEST(KernelFit, MoeWgmmaDefaultExpandBySize) {
  MoeMmaShape s{MoeMmaFormat::NVFP4, 8192, 8, 256, 6144, 2048};
  EXPECT_EQ(moe_wgmma_default_expand(s), MoeWgExpand::Registers);
  s.m = 4096;
  EXPECT_EQ(moe_wgmma_default_expand(s), MoeWgExpand::Registers);
  s.m = 4095;
  EXPECT_EQ(moe_wgmma_default_expand(s), MoeWgExpand::Consumer);
  s.m = 512;
  EXPECT_EQ(moe_wgmma_default_expand(s), MoeWgExpand::Consumer);
  s.n_experts = 0;
  EXPECT_EQ(moe_wgmma_default_expand(s), MoeWgExpand::Consumer);
}

TEST(KernelFit, MoeWgmmaExpandLayouts) {
  const MoeMmaShape s{MoeMmaFormat::NVFP4, 8192, 8, 256, 6144, 2048};
  const auto cx = choose_moe_wgmma_config(s, limits_h200());
  const auto px = choose_moe_wgmma_config(s, limits_h200(), nullptr, MoeWgExpand::Producer);
  ASSERT_TRUE(cx.has_value());
  ASSERT_TRUE(px.has_value());
  for (const MoeWgmmaGemmConfig& g : {cx->gate_up, cx->down}) {
    EXPECT_EQ(g.expand, MoeWgExpand::Consumer);
    EXPECT_EQ(g.bn, 256);
    EXPECT_EQ(g.stages, 5);  // one deeper than the bf16 ring of the producer layout
    // 1024 slack + A ring + 3 W buffers + raw ring + barriers (128) + table ((256 + 1 + 12) x 4 -> 1152).
    EXPECT_EQ(g.smem, size_t{1024 + 5 * 16384 + 3 * 32768 + 5 * 9216 + 128 + 1152});
    EXPECT_LE(g.smem, limits_h200().smem_per_block_optin);
    EXPECT_GT(moe_wgmma_smem_bytes(MoeMmaFormat::NVFP4, 256, 6, 256, MoeWgExpand::Consumer),
              limits_h200().smem_per_block_optin);
  }
  for (const MoeWgmmaGemmConfig& g : {px->gate_up, px->down}) {
    EXPECT_EQ(g.expand, MoeWgExpand::Producer);
    EXPECT_EQ(g.stages, 4);
    EXPECT_EQ(g.smem, size_t{1024 + 4 * (16384 + 32768) + 3 * 9216 + 128 + 1152});
    EXPECT_LE(g.smem, limits_h200().smem_per_block_optin);
  }
  MoeMmaShape b = s;
  b.format = MoeMmaFormat::BF16;
  const auto bc = choose_moe_wgmma_config(b, limits_h200());
  const auto bp = choose_moe_wgmma_config(b, limits_h200(), nullptr, MoeWgExpand::Producer);
  ASSERT_TRUE(bc.has_value() && bp.has_value());
  EXPECT_EQ(bc->gate_up.stages, bp->gate_up.stages);
  EXPECT_EQ(bc->gate_up.smem, bp->gate_up.smem);
  EXPECT_EQ(bc->gate_up.smem, moe_wgmma_smem_bytes(MoeMmaFormat::BF16, 256, bc->gate_up.stages, 256));
  // 128-row tiles: the consumer layout's 3 W buffers still leave the deepest ring.
  const MoeMmaShape narrow{MoeMmaFormat::NVFP4, 1000, 4, 16, 384, 192};
  const auto n = choose_moe_wgmma_config(narrow, limits_h200());
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->gate_up.stages, kMoeWgMaxStages);
  EXPECT_EQ(n->gate_up.expand, MoeWgExpand::Consumer);
  for (const DeviceLimits& dev : {limits_b200(), limits_rtx_pro_6000()}) {
    EXPECT_FALSE(choose_moe_wgmma_config(s, dev).has_value()) << dev.name;
    EXPECT_FALSE(choose_moe_wgmma_config(s, dev, nullptr, MoeWgExpand::Producer).has_value()) << dev.name;
  }
}

TEST(KernelFit, MoeWgmmaConfigFitsSm90Only) {
  for (MoeMmaFormat f : {MoeMmaFormat::NVFP4, MoeMmaFormat::BF16, MoeMmaFormat::FP8Block}) {
    const MoeMmaShape s{f, 8192, 8, 256, 6144, 2048};
    std::string why;
    const auto cfg = choose_moe_wgmma_config(s, limits_h200(), &why);
    ASSERT_TRUE(cfg.has_value()) << why;
    for (const MoeWgmmaGemmConfig& g : {cfg->gate_up, cfg->down}) {
      EXPECT_EQ(g.bn, 256);
      EXPECT_GE(g.stages, kMoeWgMinStages);
      EXPECT_LE(g.smem, limits_h200().smem_per_block_optin);
      EXPECT_EQ(g.smem, moe_wgmma_smem_bytes(f, g.bn, g.stages, 256));
      // One more stage would not fit (the deepest that does was taken), unless the cap was reached.
      if (g.stages < 4) {
        EXPECT_GT(moe_wgmma_smem_bytes(f, g.bn, g.stages + 1, 256), limits_h200().smem_per_block_optin);
      }
    }
    for (const DeviceLimits& dev : {limits_b200(), limits_rtx_pro_6000()}) {
      EXPECT_FALSE(choose_moe_wgmma_config(s, dev, &why).has_value()) << dev.name;
      EXPECT_NE(why.find("moe_experts_wgmma"), std::string::npos) << why;
      EXPECT_NE(why.find("sm_90a"), std::string::npos) << why;
    }
  }
  // Narrow widths take 128-row weight tiles and deeper rings.
  const MoeMmaShape narrow{MoeMmaFormat::NVFP4, 1000, 4, 16, 384, 192};
  const auto n = choose_moe_wgmma_config(narrow, limits_h200());
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->gate_up.bn, 128);
  EXPECT_EQ(n->down.bn, 128);
  EXPECT_EQ(n->down.stages, kMoeWgMaxStages);
  MoeMmaShape odd{MoeMmaFormat::BF16, 8192, 8, 256, 6144, 2048};
  odd.inter = 2000;
  std::string why;
  EXPECT_FALSE(choose_moe_wgmma_config(odd, limits_h200(), &why).has_value());
  EXPECT_NE(why.find("inter 2000"), std::string::npos) << why;
  DeviceLimits tiny{"tiny part (sm_90)", 90, 100000, 10};
  EXPECT_FALSE(
      choose_moe_wgmma_config(MoeMmaShape{MoeMmaFormat::NVFP4, 8192, 8, 256, 6144, 2048}, tiny, &why));
  EXPECT_NE(why.find("100000"), std::string::npos) << why;
  EXPECT_TRUE(moe_wgmma_preferred({MoeMmaFormat::NVFP4, 2048, 8, 256, 6144, 2048}));
  EXPECT_FALSE(moe_wgmma_preferred({MoeMmaFormat::NVFP4, 1024, 8, 256, 6144, 2048}));
}

// FP8Block (DeepSeek's e4m3 with f32 128x128 block scales) on the wgmma kernel: always expanded by the
// consumers (a Producer request is overridden), raw stage bn x 64 e4m3 + a 128-byte scale slot. GLM-5 and
// DeepSeek-V3 widths take 256-row tiles and a ring of 4 on the H200 preset (as deep as the bf16 ring; 5 does
// not fit), 128-row tiles the deepest ring; other parts are refused (sm_90a), and a block edge that is not a
// multiple of 64 is refused by both tensor-core choosers naming the field.
TEST(KernelFit, MoeWgmmaFp8BlockLayout) {
  for (int hidden : {6144, 7168}) {
    const MoeMmaShape s{MoeMmaFormat::FP8Block, 8192, 8, 256, hidden, 2048};
    for (MoeWgExpand x : {MoeWgExpand::Consumer, MoeWgExpand::Producer}) {
      std::string why;
      const auto cfg = choose_moe_wgmma_config(s, limits_h200(), &why, x);
      ASSERT_TRUE(cfg.has_value()) << why;
      for (const MoeWgmmaGemmConfig& g : {cfg->gate_up, cfg->down}) {
        EXPECT_EQ(g.expand, MoeWgExpand::Consumer);
        EXPECT_EQ(g.bn, 256);
        EXPECT_EQ(g.stages, 4);
        // 1024 slack + A ring + 3 W buffers + raw ring + barriers (128) + table ((256 + 1 + 12) x 4 -> 1152).
        EXPECT_EQ(g.smem, size_t{1024 + 4 * 16384 + 3 * 32768 + 4 * (256 * 64 + 128) + 128 + 1152});
        EXPECT_EQ(g.smem, moe_wgmma_smem_bytes(MoeMmaFormat::FP8Block, 256, 4, 256, MoeWgExpand::Producer));
        EXPECT_LE(g.smem, limits_h200().smem_per_block_optin);
        EXPECT_GT(moe_wgmma_smem_bytes(MoeMmaFormat::FP8Block, 256, 5, 256),
                  limits_h200().smem_per_block_optin);
      }
    }
    for (const DeviceLimits& dev : {limits_b200(), limits_rtx_pro_6000()}) {
      std::string why;
      EXPECT_FALSE(choose_moe_wgmma_config(s, dev, &why).has_value()) << dev.name;
      EXPECT_NE(why.find("sm_90a"), std::string::npos) << why;
    }
  }
  const MoeMmaShape narrow{MoeMmaFormat::FP8Block, 1000, 4, 16, 384, 192};
  const auto n = choose_moe_wgmma_config(narrow, limits_h200());
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->gate_up.bn, 128);
  EXPECT_EQ(n->down.bn, 128);
  EXPECT_EQ(n->down.stages, kMoeWgMaxStages);
  EXPECT_EQ(n->down.smem, moe_wgmma_smem_bytes(MoeMmaFormat::FP8Block, 128, kMoeWgMaxStages, 16));
  MoeMmaShape odd{MoeMmaFormat::FP8Block, 8192, 8, 256, 7168, 2048};
  odd.fp8_block = 96;
  std::string why;
  EXPECT_FALSE(choose_moe_wgmma_config(odd, limits_h200(), &why).has_value());
  EXPECT_NE(why.find("fp8_block 96"), std::string::npos) << why;
  EXPECT_FALSE(choose_moe_mma_config(odd, limits_h200(), &why).has_value());
  EXPECT_NE(why.find("fp8_block 96"), std::string::npos) << why;
  odd.fp8_block = 64;
  EXPECT_TRUE(choose_moe_wgmma_config(odd, limits_h200()).has_value());
  EXPECT_TRUE(choose_moe_mma_config(odd, limits_h200()).has_value());
  // The block edge matters only to FP8Block.
  odd.format = MoeMmaFormat::BF16;
  odd.fp8_block = 96;
  EXPECT_TRUE(choose_moe_wgmma_config(odd, limits_h200()).has_value());
}

TEST(KernelFit, MoeMmaConfigRefusesWithKernelNeedAndLimit) {
  const MoeMmaShape s{MoeMmaFormat::NVFP4, 8192, 8, 256, 6144, 2048};
  DeviceLimits tiny{"tiny part (sm_90)", 90, 20000, 10};
  std::string why;
  EXPECT_FALSE(choose_moe_mma_config(s, tiny, &why).has_value());
  EXPECT_NE(why.find("moe_experts_mma"), std::string::npos) << why;
  EXPECT_NE(why.find("20000"), std::string::npos) << why;
  DeviceLimits old{"old part (sm_75)", 75, 65536, 40};
  EXPECT_FALSE(choose_moe_mma_config(s, old, &why).has_value());
  EXPECT_NE(why.find("sm_80"), std::string::npos) << why;
  MoeMmaShape odd = s;
  odd.hidden = 7000;
  EXPECT_FALSE(choose_moe_mma_config(odd, limits_h200(), &why).has_value());
  EXPECT_NE(why.find("hidden 7000"), std::string::npos) << why;
  EXPECT_TRUE(moe_experts_prefill_regime(256, 8, 256));
  EXPECT_FALSE(moe_experts_prefill_regime(255, 8, 256));
}

}  // namespace
