#include "kv/radix_cache.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "core/error.h"

using ms::kv::PageAllocator;
using ms::kv::RadixCache;

namespace {

std::vector<int32_t> seq(int32_t start, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A request's life with the cache: allocate pages for `tokens`, insert them, drop the request's references.
std::vector<int32_t> cache_tokens(PageAllocator& a, RadixCache& c, const std::vector<int32_t>& tokens) {
  std::vector<int32_t> pages;
  const int32_t n = static_cast<int32_t>((tokens.size() + c.page_size() - 1) / c.page_size());
  EXPECT_TRUE(a.allocate(n, pages));
  auto ins = c.insert(tokens, pages);
  a.release_all(pages);
  return ins.pages;
}

}  // namespace

TEST(RadixCache, SharesWholePagesOfACommonPrefix) {
  PageAllocator a(16);
  RadixCache c(a, 4);
  auto sys = seq(100, 8);                             // two full pages
  auto p1 = cache_tokens(a, c, cat(sys, seq(1, 6)));  // 14 tokens: 3 full pages cached, the partial 4th not
  EXPECT_EQ(p1.size(), 3u);
  EXPECT_EQ(c.cached_pages(), 3);
  EXPECT_EQ(a.num_used(), 3);  // the request's own partial page went back

  auto m = c.match_prefix(cat(sys, seq(50, 6)));
  EXPECT_EQ(m.matched_tokens, 8);
  EXPECT_EQ(m.pages, std::vector<int32_t>(p1.begin(), p1.begin() + 2));

  // Inserting the second request shares the first two pages and adds only its own third one.
  std::vector<int32_t> mine;
  ASSERT_TRUE(a.allocate(1, mine));
  auto ins = c.insert(cat(sys, seq(50, 4)), cat(m.pages, mine));
  EXPECT_EQ(ins.existing_tokens, 8);
  EXPECT_EQ(ins.pages[0], p1[0]);
  EXPECT_EQ(ins.pages[1], p1[1]);
  EXPECT_EQ(ins.pages[2], mine[0]);
  EXPECT_EQ(a.ref_count(mine[0]), 2);  // request + tree
  a.release(mine[0]);
  EXPECT_EQ(c.cached_pages(), 4);
  EXPECT_EQ(a.num_used(), 4);
}

TEST(RadixCache, PartialMatchesStopAtPageBoundaries) {
  PageAllocator a(16);
  RadixCache c(a, 4);
  auto t = seq(0, 12);
  auto pages = cache_tokens(a, c, t);
  // Differ at token 6 (inside page 1): only page 0 matches.
  auto q = t;
  q[6] = 999;
  auto m = c.match_prefix(q);
  EXPECT_EQ(m.matched_tokens, 4);
  EXPECT_EQ(m.pages, std::vector<int32_t>{pages[0]});
  // Shorter than a page: nothing.
  EXPECT_EQ(c.match_prefix(seq(0, 3)).matched_tokens, 0);
  // Exactly two pages of a three-page edge: the edge is split and the match ends at the split.
  auto m2 = c.match_prefix(seq(0, 9));
  EXPECT_EQ(m2.matched_tokens, 8);
  EXPECT_EQ(m2.pages, (std::vector<int32_t>{pages[0], pages[1]}));
  // The full prefix still matches after the split.
  EXPECT_EQ(c.match_prefix(t).matched_tokens, 12);
  EXPECT_EQ(c.cached_pages(), 3);
  // First page differs: nothing.
  auto r = t;
  r[0] = -5;
  EXPECT_EQ(c.match_prefix(r).matched_tokens, 0);
}

TEST(RadixCache, EvictsLeastRecentlyUsedUnlockedLeavesFirst) {
  PageAllocator a(8);
  RadixCache c(a, 2);
  auto pa = cache_tokens(a, c, seq(0, 4));    // A: 2 pages
  auto pb = cache_tokens(a, c, seq(100, 4));  // B: 2 pages
  auto pc = cache_tokens(a, c, seq(200, 4));  // C: 2 pages
  EXPECT_EQ(a.num_free(), 2);
  c.match_prefix(seq(0, 4));  // A is now the most recent; B the oldest
  EXPECT_EQ(c.evict(1), 2);   // a whole leaf goes: B
  EXPECT_EQ(c.match_prefix(seq(100, 4)).matched_tokens, 0);
  EXPECT_EQ(c.match_prefix(seq(200, 4)).matched_tokens, 4);  // C touched: A is oldest now
  auto ma = c.match_prefix(seq(0, 4), false);
  c.lock(ma.node);  // a locked A survives even though it is the oldest
  EXPECT_EQ(c.evictable_pages(), 2);
  EXPECT_EQ(c.evict(2), 2);
  EXPECT_EQ(c.match_prefix(seq(200, 4)).matched_tokens, 0);
  EXPECT_EQ(c.evict(10), 0);
  EXPECT_EQ(c.match_prefix(seq(0, 4)).matched_tokens, 4);
  c.unlock(ma.node);
  EXPECT_EQ(c.evict(10), 2);
  EXPECT_EQ(a.num_free(), 8);
  (void)pb;
  (void)pc;
  (void)pa;
}

TEST(RadixCache, LockProtectsAncestorsAndEvictionWalksUpTheTree) {
  PageAllocator a(16);
  RadixCache c(a, 2);
  auto base = seq(0, 4);
  cache_tokens(a, c, cat(base, seq(10, 2)));
  cache_tokens(a, c, cat(base, seq(20, 2)));
  EXPECT_EQ(c.cached_pages(), 4);  // base (2) + two leaves
  auto m = c.match_prefix(cat(base, seq(10, 2)));
  c.lock(m.node);
  EXPECT_EQ(c.evictable_pages(), 1);  // only the other leaf
  EXPECT_EQ(c.evict(100), 1);
  EXPECT_EQ(c.cached_pages(), 3);
  c.unlock(m.node);
  EXPECT_THROW(c.unlock(m.node), ms::Error);
  EXPECT_EQ(c.evict(100), 3);  // the leaf, then its parent once it became a leaf
  EXPECT_EQ(a.num_free(), 16);
}

TEST(RadixCache, EvictionDoesNotFreePagesARequestStillHolds) {
  PageAllocator a(4);
  RadixCache c(a, 2);
  std::vector<int32_t> pages;
  ASSERT_TRUE(a.allocate(2, pages));
  c.insert(seq(0, 4), pages);  // request still holds its references
  EXPECT_EQ(c.evict(2), 0);    // released the tree's references, nothing freed
  EXPECT_EQ(c.cached_pages(), 0);
  a.release_all(pages);
  EXPECT_EQ(a.num_free(), 4);
}

TEST(RadixCache, HitStatistics) {
  PageAllocator a(8);
  RadixCache c(a, 2);
  cache_tokens(a, c, seq(0, 4));
  c.match_prefix(seq(0, 6));
  c.match_prefix(seq(50, 6));
  c.match_prefix(seq(0, 6), false);
  EXPECT_EQ(c.stats().query_tokens, 12);
  EXPECT_EQ(c.stats().hit_tokens, 4);
}

TEST(RadixCache, RejectsTooFewPages) {
  PageAllocator a(8);
  RadixCache c(a, 2);
  std::vector<int32_t> pages;
  ASSERT_TRUE(a.allocate(1, pages));
  EXPECT_THROW(c.insert(seq(0, 4), pages), ms::Error);
  EXPECT_THROW(RadixCache(a, 0), ms::Error);
  a.release_all(pages);
}

// Random requests over a small vocabulary (many shared prefixes): lock/insert/unlock like a scheduler, evict
// under pressure; at the end every page must be free again.
TEST(RadixCache, RandomWorkloadsLeakNoPages) {
  for (uint32_t seed = 0; seed < 50; ++seed) {
    std::mt19937 rng(seed);
    PageAllocator a(64);
    {
      RadixCache c(a, 4);
      struct Live {
        std::vector<int32_t> pages;
        RadixCache::Node* node;
      };
      std::vector<Live> live;
      for (int step = 0; step < 300; ++step) {
        if (!live.empty() && (rng() % 3 == 0 || a.num_free() + c.evictable_pages() < 10)) {
          size_t i = rng() % live.size();
          c.unlock(live[i].node);
          a.release_all(live[i].pages);
          live.erase(live.begin() + static_cast<ptrdiff_t>(i));
          continue;
        }
        std::vector<int32_t> toks(static_cast<size_t>(1 + rng() % 30));
        for (auto& t : toks) t = static_cast<int32_t>(rng() % 3);
        auto m = c.match_prefix(toks);
        c.lock(m.node);
        std::vector<int32_t> pages = m.pages;
        for (int32_t p : pages) a.retain(p);
        const int32_t need = static_cast<int32_t>((toks.size() + 3) / 4) - static_cast<int32_t>(pages.size());
        if (a.num_free() < need) c.evict(need - a.num_free());
        if (!a.allocate(need, pages)) {
          c.unlock(m.node);
          a.release_all(pages);
          continue;
        }
        auto ins = c.insert(toks, pages);
        c.lock(ins.node);
        c.unlock(m.node);
        live.push_back({pages, ins.node});
        ASSERT_LE(c.evictable_pages(), c.cached_pages());
      }
      for (auto& l : live) {
        c.unlock(l.node);
        a.release_all(l.pages);
      }
      EXPECT_EQ(c.evictable_pages(), c.cached_pages());
      EXPECT_EQ(a.num_used(), c.cached_pages()) << "seed " << seed;
      c.clear();
      EXPECT_EQ(a.num_free(), a.num_pages()) << "seed " << seed;
    }
    EXPECT_EQ(a.num_free(), a.num_pages());
  }
}
