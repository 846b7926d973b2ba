// KV pool sizing from a memory fraction: whole pages of the fraction of what is available, capped at what
// the running requests can use, and errors naming the flag.
#include "runtime/kv_budget.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "model/builtin_model.h"

namespace ms::runtime {
namespace {

TEST(KvBudget, FractionOfAvailableInWholePages) {
  // 1 GiB available, half of it, 1000 bytes a token, pages of 64: 536870912 / 64000 = 8388 pages.
  const KvBudget b = kv_budget_from_memory(size_t{1} << 30, 0.5, 1000, 64, 0);
  EXPECT_EQ(b.tokens, 8388 * 64);
  EXPECT_FALSE(b.capped);
  EXPECT_LE(static_cast<double>(b.tokens) * 1000, 0.5 * (1 << 30));
}

TEST(KvBudget, CappedAtWhatRequestsCanHold) {
  const KvBudget b = kv_budget_from_memory(size_t{1} << 30, 0.5, 1000, 64, 1000);
  EXPECT_EQ(b.tokens, 16 * 64);  // 1000 tokens round up to 16 pages
  EXPECT_TRUE(b.capped);
}

TEST(KvBudget, ErrorsNameTheFlag) {
  for (double f : {0.0, -0.1, 1.5}) {
    try {
      kv_budget_from_memory(size_t{1} << 30, f, 1000, 64, 0);
      FAIL() << f;
    } catch (const ms::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--mem-fraction-static"), std::string::npos);
    }
  }
  EXPECT_THROW(kv_budget_from_memory(1000, 0.5, 1000, 64, 0), ms::Error);  // not one page
}

TEST(KvBudget, BytesPerTokenOfTheBuiltinModel) {
  auto m = model::make_builtin_model();
  const auto& c = m->config();
  // Per layer: the latent + rope row in bf16 and the indexer key row (bf16 outside an f32 pool).
  const size_t expect = static_cast<size_t>(c.num_hidden_layers) *
                        static_cast<size_t>(c.kv_cache_width() * 2 + c.index_head_dim * 2);
  EXPECT_EQ(kv_bytes_per_token(*m, kv::KvCacheDType::BF16, 16), expect);
  EXPECT_LT(kv_bytes_per_token(*m, kv::KvCacheDType::FP8E4M3, 16), expect);
  EXPECT_GT(available_memory_bytes(), size_t{0});
}

}  // namespace
}  // namespace ms::runtime
