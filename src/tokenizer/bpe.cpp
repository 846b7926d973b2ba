#include "tokenizer/bpe.h"

#include <fmt/format.h>

#include <queue>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace ms::tokenizer {

Bpe::Bpe(const nlohmann::json& m, const std::string& where) {
  const std::string type = m.value("type", std::string("BPE"));
  MS_CHECK(type == "BPE", "{}: unsupported model type \"{}\" (only BPE is implemented)", where, type);
  MS_CHECK(m.contains("vocab") && m.at("vocab").is_object(), "{}.vocab: missing or not an object", where);
  MS_CHECK(m.value("dropout", nlohmann::json()).is_null() || m.at("dropout").get<double>() == 0.0,
           "{}.dropout: BPE dropout is not supported", where);
  int32_t max_id = -1;
  for (auto it = m.at("vocab").begin(); it != m.at("vocab").end(); ++it) {
    int32_t id = it.value().get<int32_t>();
    MS_CHECK(id >= 0, "{}.vocab[\"{}\"]: negative id {}", where, it.key(), id);
    vocab_.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(max_id + 1, std::string());
  for (const auto& [tok, id] : vocab_) id_to_token_[id] = tok;

  auto str_or_empty = [&](const char* key) {
    return m.contains(key) && m.at(key).is_string() ? m.at(key).get<std::string>() : std::string();
  };
  prefix_ = str_or_empty("continuing_subword_prefix");
  suffix_ = str_or_empty("end_of_word_suffix");
  fuse_unk_ = m.value("fuse_unk", false);
  byte_fallback_ = m.value("byte_fallback", false);
  ignore_merges_ = m.value("ignore_merges", false);
  std::string unk = str_or_empty("unk_token");
  if (!unk.empty()) {
    auto it = vocab_.find(unk);
    MS_CHECK(it != vocab_.end(), "{}.unk_token: \"{}\" is not in the vocab", where, unk);
    unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }

  const auto& merges = m.contains("merges") ? m.at("merges") : nlohmann::json::array();
  MS_CHECK(merges.is_array(), "{}.merges: not a list", where);
  merges_.reserve(merges.size() * 2);
  for (size_t r = 0; r < merges.size(); ++r) {
    std::string a, b;
    const auto& e = merges[r];
    if (e.is_string()) {
      const auto& s = e.get_ref<const std::string&>();
      auto sp = s.find(' ');
      MS_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
               "{}.merges[{}]: \"{}\" is not two tokens separated by one space", where, r, s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      MS_CHECK(e.is_array() && e.size() == 2, "{}.merges[{}]: expected \"a b\" or [a, b]", where, r);
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b);
    MS_CHECK(ia != vocab_.end(), "{}.merges[{}]: token \"{}\" is not in the vocab", where, r, a);
    MS_CHECK(ib != vocab_.end(), "{}.merges[{}]: token \"{}\" is not in the vocab", where, r, b);
    std::string merged =
        a + (prefix_.empty() || b.compare(0, prefix_.size(), prefix_) != 0 ? b : b.substr(prefix_.size()));
    auto im = vocab_.find(merged);
    MS_CHECK(im != vocab_.end(), "{}.merges[{}]: merged token \"{}\" is not in the vocab", where, r, merged);
    uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    merges_.emplace(key, MergeTarget{static_cast<int32_t>(r), im->second});
  }
}

int32_t Bpe::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* Bpe::id_to_token(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(id_to_token_.size()) || id_to_token_[id].empty()) return nullptr;
  return &id_to_token_[id];
}

void Bpe::tokenize(const std::string& word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = fresh_.find(word);
    if (it != fresh_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
    it = old_.find(word);
    if (it != old_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      auto ids = it->second;
      if (fresh_.size() >= kCacheWords) old_.swap(fresh_), fresh_.clear();
      fresh_.emplace(word, std::move(ids));
      return;
    }
  }
  size_t first = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::vector<int32_t> ids(out.begin() + first, out.end());
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (fresh_.size() >= kCacheWords) old_.swap(fresh_), fresh_.clear();
    fresh_.emplace(word, std::move(ids));
  }
}

void Bpe::merge_word(const std::string& word, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  thread_local std::vector<Sym> syms;
  syms.clear();
  std::string piece;
  size_t i = 0;
  bool last_unk = false;
  while (i < word.size()) {
    size_t start = i;
    utf8_next(word, i);
    piece.clear();
    if (start > 0) piece += prefix_;
    piece.append(word, start, i - start);
    if (i == word.size()) piece += suffix_;
    auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      syms.push_back({it->second, 0, 0, true});
      last_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (size_t k = start; k < i; ++k) all = all && byte_ids_[static_cast<unsigned char>(word[k])] >= 0;
      if (all) {
        for (size_t k = start; k < i; ++k)
          syms.push_back({byte_ids_[static_cast<unsigned char>(word[k])], 0, 0, true});
        last_unk = false;
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (!(fuse_unk_ && last_unk)) syms.push_back({unk_id_, 0, 0, true});
      last_unk = true;
    }
  }
  const int32_t n = static_cast<int32_t>(syms.size());
  for (int32_t k = 0; k < n; ++k) {
    syms[k].prev = k - 1;
    syms[k].next = k + 1 < n ? k + 1 : -1;
  }
  struct Cand {
    int32_t rank, pos, new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  auto lookup = [&](int32_t a, int32_t b) -> const MergeTarget* {
    auto it = merges_.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  thread_local std::vector<Cand> heap_storage;
  heap_storage.clear();
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap(std::greater<>{},
                                                                    std::move(heap_storage));
  for (int32_t k = 0; k + 1 < n; ++k)
    if (auto* m = lookup(syms[k].id, syms[k + 1].id)) heap.push({m->rank, k, m->id});
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    Sym& left = syms[c.pos];
    if (!left.alive || left.next < 0) continue;
    Sym& right = syms[left.next];
    const MergeTarget* m = lookup(left.id, right.id);
    if (!m || m->id != c.new_id) continue;
    left.id = c.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) syms[right.next].prev = c.pos;
    if (left.prev >= 0)
      if (auto* pm = lookup(syms[left.prev].id, left.id)) heap.push({pm->rank, left.prev, pm->id});
    if (left.next >= 0)
      if (auto* nm = lookup(left.id, syms[left.next].id)) heap.push({nm->rank, c.pos, nm->id});
  }
  for (int32_t k = 0; k >= 0 && k < n; k = syms[k].next) out.push_back(syms[k].id);
}

}  // namespace ms::tokenizer
