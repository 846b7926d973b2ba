#include <gtest/gtest.h>

#include "core/error.h"
#include "kv/page_allocator.h"

using ms::kv::PageAllocator;

TEST(PageAllocator, AllOrNothing) {
  PageAllocator a(4);
  std::vector<int32_t> pages;
  EXPECT_TRUE(a.allocate(3, pages));
  EXPECT_EQ(pages, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FALSE(a.allocate(2, pages));
  EXPECT_EQ(pages.size(), 3u);
  EXPECT_EQ(a.num_free(), 1);
}

TEST(PageAllocator, RefCountsShareAndFree) {
  PageAllocator a(2);
  std::vector<int32_t> pages;
  ASSERT_TRUE(a.allocate(1, pages));
  a.retain(pages[0]);
  EXPECT_EQ(a.ref_count(pages[0]), 2);
  a.release(pages[0]);
  EXPECT_EQ(a.num_free(), 1);
  a.release(pages[0]);
  EXPECT_EQ(a.num_free(), 2);
  EXPECT_THROW(a.release(pages[0]), ms::Error);
  EXPECT_THROW(a.retain(7), ms::Error);
}
