#include "kv/page_allocator.h"

#include "core/error.h"

namespace ms::kv {

PageAllocator::PageAllocator(int32_t num_pages) {
  MS_CHECK(num_pages >= 0, "number of KV pages must be >= 0, got {}", num_pages);
  ref_.assign(static_cast<size_t>(num_pages), 0);
  free_.reserve(static_cast<size_t>(num_pages));
  for (int32_t p = num_pages; p-- > 0;) free_.push_back(p);
}

bool PageAllocator::allocate(int32_t n, std::vector<int32_t>& out) {
  MS_CHECK(n >= 0, "cannot allocate {} pages", n);
  if (n > num_free()) return false;
  for (int32_t i = 0; i < n; ++i) {
    int32_t p = free_.back();
    free_.pop_back();
    ref_[static_cast<size_t>(p)] = 1;
    out.push_back(p);
  }
  return true;
}

void PageAllocator::check_page(int32_t page) const {
  MS_CHECK(page >= 0 && page < num_pages(), "KV page {} out of range [0, {})", page, num_pages());
}

void PageAllocator::retain(int32_t page) {
  check_page(page);
  MS_CHECK(ref_[static_cast<size_t>(page)] > 0, "retain of free KV page {}", page);
  ++ref_[static_cast<size_t>(page)];
}

void PageAllocator::release(int32_t page) {
  check_page(page);
  auto& r = ref_[static_cast<size_t>(page)];
  MS_CHECK(r > 0, "double free of KV page {}", page);
  if (--r == 0) free_.push_back(page);
}

void PageAllocator::release_all(const std::vector<int32_t>& pages) {
  for (int32_t p : pages) release(p);
}

int32_t PageAllocator::ref_count(int32_t page) const {
  check_page(page);
  return ref_[static_cast<size_t>(page)];
}

}  // namespace ms::kv
