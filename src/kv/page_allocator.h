// Page ids of the paged KV cache with reference counts. A page is free when its count is 0; pages shared by a
// prefix cache hold one reference per user. The allocator only hands out ids; the KV pool owns the memory.
#pragma once

#include <cstdint>
#include <vector>

namespace ms::kv {

class PageAllocator {
 public:
  explicit PageAllocator(int32_t num_pages);

  int32_t num_pages() const { return static_cast<int32_t>(ref_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_used() const { return num_pages() - num_free(); }

  // All or nothing: appends n fresh pages (ref count 1) to `out` and returns true, or changes nothing and
  // returns false when fewer than n pages are free.
  bool allocate(int32_t n, std::vector<int32_t>& out);
  void retain(int32_t page);   // one more user of an allocated page
  void release(int32_t page);  // one user fewer; the page is free again at 0
  void release_all(const std::vector<int32_t>& pages);
  int32_t ref_count(int32_t page) const;

 private:
  void check_page(int32_t page) const;
  std::vector<int32_t> ref_;
  std::vector<int32_t> free_;  // stack of free ids; lowest ids handed out first
};

}  // namespace ms::kv
