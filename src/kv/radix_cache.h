// Prefix cache: a radix tree over token ids whose edges are whole KV pages. Each node's edge holds
// `page_size * pages.size()` tokens and the KV page ids that store them; a path from the root spells a prefix
// whose KV can be reused by any request starting with it.
//
// References: the tree holds one reference (PageAllocator::retain) on every page it stores. A request that
// reuses matched pages retains them itself and locks the node it matched, so the path cannot be evicted while
// it runs. Unlocked leaves are evicted least recently used first when pages are needed; evicting releases the
// tree's reference, so a page becomes free once no request holds it either.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "kv/page_allocator.h"

namespace ms::kv {

class RadixCache {
 public:
  struct Node;  // opaque to users; handles stay valid while the node is locked

  struct Match {
    std::vector<int32_t> pages;  // [matched_tokens / page_size]
    int32_t matched_tokens = 0;  // a multiple of page_size
    Node* node = nullptr;        // last node of the match (the root when nothing matched); lock it to keep it
  };

  struct Insert {
    std::vector<int32_t> pages;   // the tree's pages for the inserted prefix [tokens / page_size]
    int32_t existing_tokens = 0;  // tokens that were already in the tree before this insert
    Node* node = nullptr;         // last node of the inserted prefix
  };

  struct Stats {
    int64_t query_tokens = 0, hit_tokens = 0;  // over counted match_prefix calls
    int64_t evicted_pages = 0;
  };

  RadixCache(PageAllocator& allocator, int32_t page_size);
  ~RadixCache();  // releases every page the tree holds
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  int32_t page_size() const { return page_size_; }

  // The longest cached prefix of `tokens` in whole pages. Splits an edge when the match ends inside it, so
  // the returned node covers exactly the match. count_stats=false for a probe that should not count as a
  // query.
  Match match_prefix(const std::vector<int32_t>& tokens, bool count_stats = true);

  // Adds the first floor(tokens.size() / page_size) pages of `tokens` with their KV pages
  // (pages.size() >= that count). Where the tree already has the prefix it keeps its own pages; the new part
  // is retained from `pages`. The caller keeps its own references either way.
  Insert insert(const std::vector<int32_t>& tokens, const std::vector<int32_t>& pages);

  // A locked node and its ancestors are never evicted. Locks nest (counted).
  void lock(Node* node);
  void unlock(Node* node);

  // Evicts unlocked leaves, least recently used first, until `num_pages` pages became free in the allocator
  // or nothing evictable is left. Returns the number of pages freed.
  int32_t evict(int32_t num_pages);

  int32_t cached_pages() const { return cached_pages_; }        // pages held by the tree
  int32_t evictable_pages() const { return evictable_pages_; }  // of those, in unlocked nodes
  const Stats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

  // Drops every unlocked node (all of them when nothing is locked).
  void clear();

 private:
  using PageKey = std::vector<int32_t>;  // the page_size tokens of an edge's first page
  Node* split(Node* node, int32_t keep_pages);
  void remove_leaf(Node* node);
  PageKey first_page(const int32_t* tokens) const;
  int32_t matching_pages(const Node* node, const int32_t* tokens, int32_t max_pages) const;

  PageAllocator& allocator_;
  int32_t page_size_;
  std::unique_ptr<Node> root_;
  int32_t cached_pages_ = 0, evictable_pages_ = 0;
  uint64_t clock_ = 0;  // logical time for LRU
  Stats stats_;
};

struct RadixCache::Node {
  std::vector<int32_t> tokens;  // [pages.size() * page_size] the edge from the parent
  std::vector<int32_t> pages;
  Node* parent = nullptr;
  std::map<PageKey, std::unique_ptr<Node>> children;
  int32_t lock_count = 0;
  uint64_t last_access = 0;
};

}  // namespace ms::kv
