#include "kv/radix_cache.h"

#include <algorithm>
#include <climits>
#include <functional>
#include <queue>

#include "core/error.h"

namespace ms::kv {

RadixCache::RadixCache(PageAllocator& allocator, int32_t page_size)
    : allocator_(allocator), page_size_(page_size), root_(std::make_unique<Node>()) {
  MS_CHECK(page_size > 0, "page_size must be > 0, got {}", page_size);
}

RadixCache::~RadixCache() {
  // Release every page the tree holds, locked or not: the allocator may outlive the cache.
  std::function<void(Node*)> drop = [&](Node* n) {
    for (auto& [k, c] : n->children) drop(c.get());
    for (int32_t p : n->pages) allocator_.release(p);
  };
  drop(root_.get());
}

RadixCache::PageKey RadixCache::first_page(const int32_t* tokens) const {
  return PageKey(tokens, tokens + page_size_);
}

int32_t RadixCache::matching_pages(const Node* node, const int32_t* tokens, int32_t max_pages) const {
  const int32_t n = std::min<int32_t>(static_cast<int32_t>(node->pages.size()), max_pages);
  for (int32_t p = 0; p < n; ++p) {
    const int32_t* a = node->tokens.data() + static_cast<size_t>(p) * page_size_;
    const int32_t* b = tokens + static_cast<size_t>(p) * page_size_;
    if (!std::equal(a, a + page_size_, b)) return p;
  }
  return n;
}

RadixCache::Node* RadixCache::split(Node* node, int32_t keep_pages) {
  // node becomes the lower part (so handles to it keep meaning "the end of this prefix"); `top` takes its
  // place under the parent with the first keep_pages pages.
  MS_CHECK(keep_pages > 0 && keep_pages < static_cast<int32_t>(node->pages.size()), "bad split {} of {}",
           keep_pages, node->pages.size());
  const size_t keep_tokens = static_cast<size_t>(keep_pages) * page_size_;
  auto top = std::make_unique<Node>();
  top->tokens.assign(node->tokens.begin(), node->tokens.begin() + static_cast<ptrdiff_t>(keep_tokens));
  top->pages.assign(node->pages.begin(), node->pages.begin() + keep_pages);
  top->parent = node->parent;
  top->lock_count = node->lock_count;  // every lock below node is below top too
  top->last_access = node->last_access;
  node->tokens.erase(node->tokens.begin(), node->tokens.begin() + static_cast<ptrdiff_t>(keep_tokens));
  node->pages.erase(node->pages.begin(), node->pages.begin() + keep_pages);

  Node* parent = node->parent;
  PageKey top_key = first_page(top->tokens.data());
  auto it = parent->children.find(top_key);
  MS_CHECK(it != parent->children.end() && it->second.get() == node, "radix tree corrupted at split");
  std::unique_ptr<Node> lower = std::move(it->second);
  lower->parent = top.get();
  Node* top_raw = top.get();
  top->children.emplace(first_page(lower->tokens.data()), std::move(lower));
  it->second = std::move(top);
  return top_raw;
}

RadixCache::Match RadixCache::match_prefix(const std::vector<int32_t>& tokens, bool count_stats) {
  Match m;
  const uint64_t now = ++clock_;
  const int32_t max_pages = static_cast<int32_t>(tokens.size()) / page_size_;
  Node* node = root_.get();
  int32_t pages = 0;
  while (pages < max_pages) {
    auto it = node->children.find(first_page(tokens.data() + static_cast<size_t>(pages) * page_size_));
    if (it == node->children.end()) break;
    Node* child = it->second.get();
    const int32_t same =
        matching_pages(child, tokens.data() + static_cast<size_t>(pages) * page_size_, max_pages - pages);
    const bool partial = same < static_cast<int32_t>(child->pages.size());
    if (partial) child = split(child, same);
    m.pages.insert(m.pages.end(), child->pages.begin(), child->pages.end());
    pages += same;
    child->last_access = now;
    node = child;
    if (partial) break;
  }
  m.matched_tokens = pages * page_size_;
  m.node = node;
  if (count_stats) {
    stats_.query_tokens += static_cast<int64_t>(tokens.size());
    stats_.hit_tokens += m.matched_tokens;
  }
  return m;
}

RadixCache::Insert RadixCache::insert(const std::vector<int32_t>& tokens, const std::vector<int32_t>& pages) {
  const int32_t num_pages = static_cast<int32_t>(tokens.size()) / page_size_;
  MS_CHECK(static_cast<int32_t>(pages.size()) >= num_pages,
           "radix insert: {} pages for {} full pages of tokens", pages.size(), num_pages);
  Insert r;
  const uint64_t now = ++clock_;
  Node* node = root_.get();
  int32_t done = 0;
  while (done < num_pages) {
    const int32_t* at = tokens.data() + static_cast<size_t>(done) * page_size_;
    auto it = node->children.find(first_page(at));
    if (it == node->children.end()) {
      auto leaf = std::make_unique<Node>();
      leaf->tokens.assign(at, tokens.data() + static_cast<size_t>(num_pages) * page_size_);
      leaf->pages.assign(pages.begin() + done, pages.begin() + num_pages);
      for (int32_t p : leaf->pages) allocator_.retain(p);
      leaf->parent = node;
      leaf->last_access = now;
      const int32_t added = num_pages - done;
      cached_pages_ += added;
      evictable_pages_ += added;
      r.existing_tokens = done * page_size_;
      r.pages.insert(r.pages.end(), leaf->pages.begin(), leaf->pages.end());
      Node* raw = leaf.get();
      node->children.emplace(first_page(at), std::move(leaf));
      r.node = raw;
      return r;
    }
    Node* child = it->second.get();
    const int32_t same = matching_pages(child, at, num_pages - done);
    if (same < static_cast<int32_t>(child->pages.size())) child = split(child, same);
    r.pages.insert(r.pages.end(), child->pages.begin(), child->pages.end());
    child->last_access = now;
    done += same;
    node = child;
  }
  r.existing_tokens = done * page_size_;
  r.node = node;
  return r;
}

void RadixCache::lock(Node* node) {
  MS_CHECK(node != nullptr, "radix lock of a null node");
  for (Node* n = node; n != root_.get(); n = n->parent) {
    if (n->lock_count++ == 0) evictable_pages_ -= static_cast<int32_t>(n->pages.size());
  }
}

void RadixCache::unlock(Node* node) {
  MS_CHECK(node != nullptr, "radix unlock of a null node");
  for (Node* n = node; n != root_.get(); n = n->parent) {
    MS_CHECK(n->lock_count > 0, "radix unlock of an unlocked node");
    if (--n->lock_count == 0) evictable_pages_ += static_cast<int32_t>(n->pages.size());
  }
}

void RadixCache::remove_leaf(Node* node) {
  MS_CHECK(node != root_.get() && node->children.empty() && node->lock_count == 0,
           "radix: not an evictable leaf");
  const int32_t n = static_cast<int32_t>(node->pages.size());
  cached_pages_ -= n;
  evictable_pages_ -= n;
  node->parent->children.erase(first_page(node->tokens.data()));  // destroys node
}

int32_t RadixCache::evict(int32_t num_pages) {
  using Item = std::pair<uint64_t, Node*>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> leaves;  // oldest first
  std::function<void(Node*)> collect = [&](Node* n) {
    for (auto& [k, c] : n->children) collect(c.get());
    if (n != root_.get() && n->children.empty() && n->lock_count == 0) leaves.emplace(n->last_access, n);
  };
  collect(root_.get());
  int32_t freed = 0;
  while (freed < num_pages && !leaves.empty()) {
    Node* leaf = leaves.top().second;
    leaves.pop();
    const int32_t before = allocator_.num_free();
    for (int32_t p : leaf->pages) allocator_.release(p);
    freed += allocator_.num_free() - before;
    stats_.evicted_pages += static_cast<int64_t>(leaf->pages.size());
    Node* parent = leaf->parent;
    remove_leaf(leaf);
    if (parent != root_.get() && parent->children.empty() && parent->lock_count == 0)
      leaves.emplace(parent->last_access, parent);
  }
  return freed;
}

void RadixCache::clear() {
  evict(INT32_MAX);
}

}  // namespace ms::kv
