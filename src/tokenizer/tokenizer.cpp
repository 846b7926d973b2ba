#include "tokenizer/tokenizer.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace ms::tokenizer {

namespace {

bool is_word_char(char32_t c) {
  if (c == '_') return true;
  auto cat = u_charType(static_cast<UChar32>(c));
  return u_isalnum(static_cast<UChar32>(c)) || cat == U_NON_SPACING_MARK || cat == U_COMBINING_SPACING_MARK ||
         cat == U_ENCLOSING_MARK || cat == U_CONNECTOR_PUNCTUATION || c == 0x200C || c == 0x200D;
}

char32_t last_char(std::string_view s) {
  if (s.empty()) return 0;
  size_t b = s.size() - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  return utf8_next(s, b);
}

char32_t first_char(std::string_view s) {
  size_t i = 0;
  return s.empty() ? 0 : utf8_next(s, i);
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t j = i;
    if (utf8_next(s, j) == 0xFFFD && !(j - i == 3 && s.substr(i, 3) == "\xEF\xBF\xBD")) return false;
    i = j;
  }
  return true;
}

}  // namespace

Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MS_CHECK(f.good(), "cannot open tokenizer file {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return from_json_text(ss.str(), path);
}

std::unique_ptr<Tokenizer> Tokenizer::from_json_text(const std::string& json_text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    MS_THROW("{}: not valid JSON: {}", where, e.what());
  }
  MS_CHECK(j.is_object(), "{}: top level is not an object", where);
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  MS_CHECK(j.contains("model"), "{}: no \"model\"", where);
  try {
    t->model_ = std::make_unique<Bpe>(j.at("model"), where + ": model");
  } catch (const nlohmann::json::exception& e) {
    MS_THROW("{}: model: {}", where, e.what());
  }
  if (j.contains("truncation"))
    MS_CHECK(j.at("truncation").is_null(), "{}: truncation is not supported", where);
  if (j.contains("padding")) MS_CHECK(j.at("padding").is_null(), "{}: padding is not supported", where);
  t->normalizer_ = make_normalizer(j.value("normalizer", nlohmann::json()), where + ": normalizer");
  t->pre_tokenizer_ =
      make_pre_tokenizer(j.value("pre_tokenizer", nlohmann::json()), where + ": pre_tokenizer");
  t->decoder_ = make_decoder(j.value("decoder", nlohmann::json()), where + ": decoder");

  const auto& added = j.contains("added_tokens") ? j.at("added_tokens") : nlohmann::json::array();
  for (size_t i = 0; i < added.size(); ++i) {
    const auto& a = added[i];
    try {
      AddedToken tok;
      tok.id = a.at("id").get<int32_t>();
      tok.content = a.at("content").get<std::string>();
      tok.single_word = a.value("single_word", false);
      tok.lstrip = a.value("lstrip", false);
      tok.rstrip = a.value("rstrip", false);
      tok.normalized = a.value("normalized", !a.value("special", false));
      tok.special = a.value("special", false);
      MS_CHECK(!tok.content.empty(), "{}: added_tokens[{}] has empty content", where, i);
      MS_CHECK(tok.id >= 0, "{}: added_tokens[{}] has negative id", where, i);
      t->added_by_content_[tok.content] = static_cast<int32_t>(t->added_.size());
      t->added_.push_back(std::move(tok));
    } catch (const nlohmann::json::exception& e) {
      MS_THROW("{}: added_tokens[{}]: {}", where, i, e.what());
    }
  }
  int32_t n = t->vocab_size();
  t->added_by_id_.assign(n, -1);
  for (size_t k = 0; k < t->added_.size(); ++k) {
    const auto& tok = t->added_[k];
    t->added_by_id_[tok.id] = static_cast<int32_t>(k);
    // A normalized token is matched after normalization, so its own text is normalized too.
    t->starts_[tok.normalized ? 1 : 0][static_cast<unsigned char>(tok.content[0])].push_back(
        static_cast<int32_t>(k));
  }
  for (auto& pass : t->starts_)
    for (auto& v : pass)
      std::stable_sort(v.begin(), v.end(), [&](int32_t a, int32_t b) {
        return t->added_[a].content.size() > t->added_[b].content.size();
      });
  Tokenizer* raw = t.get();
  t->post_processor_ =
      make_post_processor(j.value("post_processor", nlohmann::json()), where + ": post_processor",
                          [raw](const std::string& s) { return raw->token_to_id(s); });
  return t;
}

int32_t Tokenizer::vocab_size() const {
  int32_t n = model_->vocab_size();
  for (const auto& a : added_) n = std::max(n, a.id + 1);
  return n;
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  auto it = added_by_content_.find(token);
  if (it != added_by_content_.end()) return added_[it->second].id;
  return model_->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (id >= 0 && id < static_cast<int32_t>(added_by_id_.size()) && added_by_id_[id] >= 0)
    return added_[added_by_id_[id]].content;
  if (const std::string* s = model_->id_to_token(id)) return *s;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < static_cast<int32_t>(added_by_id_.size()) && added_by_id_[id] >= 0 &&
         added_[added_by_id_[id]].special;
}

void Tokenizer::split_added(std::string_view text, bool normalized_tokens, std::vector<Segment>& out) const {
  const auto& starts = starts_[normalized_tokens ? 1 : 0];
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const auto& cands = starts[static_cast<unsigned char>(text[pos])];
    const AddedToken* hit = nullptr;
    for (int32_t k : cands) {
      const auto& c = added_[k].content;
      if (text.compare(pos, c.size(), c) == 0) {
        hit = &added_[k];
        break;
      }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    size_t b = pos, e = pos + hit->content.size();
    pos = e;
    if (hit->single_word) {
      bool start_ok = b == 0 || !is_word_char(last_char(text.substr(0, b)));
      bool stop_ok = e == text.size() || !is_word_char(first_char(text.substr(e)));
      if (!start_ok || !stop_ok) continue;
    }
    if (hit->lstrip) {
      size_t nb = b;
      while (nb > start_offset) {
        size_t s = nb - 1;
        while (s > 0 && (static_cast<unsigned char>(text[s]) & 0xC0) == 0x80) --s;
        size_t i = s;
        if (!is_unicode_whitespace(utf8_next(text, i))) break;
        nb = s;
      }
      b = nb;
    }
    if (hit->rstrip) {
      while (e < text.size()) {
        size_t i = e;
        if (!is_unicode_whitespace(utf8_next(text, i))) break;
        e = i;
      }
      pos = e;
    }
    if (start_offset < b) out.push_back({text.substr(start_offset, b - start_offset), -1});
    out.push_back({text.substr(b, e - b), hit->id});
    start_offset = e;
  }
  if (start_offset < text.size()) out.push_back({text.substr(start_offset), -1});
}

void Tokenizer::encode_text(std::string text, bool first_span, std::vector<int32_t>& ids) const {
  thread_local Pieces pieces;
  pieces.clear();
  pieces.push_back(std::move(text));
  if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(pieces, first_span);
  for (const auto& p : pieces) model_->tokenize(p, ids);
}

std::vector<int32_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  std::string repaired;
  if (!valid_utf8(input)) {
    repaired = utf8_lossy(input);
    input = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(input.size() / 3 + 4);
  std::vector<Segment> raw_segs;
  split_added(input, false, raw_segs);
  for (const auto& seg : raw_segs) {
    if (seg.token >= 0) {
      ids.push_back(seg.token);
      continue;
    }
    bool first = seg.text.data() == input.data();
    std::string normalized(seg.text);
    if (normalizer_) normalizer_->normalize(normalized);
    std::vector<Segment> segs;
    split_added(normalized, true, segs);
    for (const auto& s : segs) {
      if (s.token >= 0)
        ids.push_back(s.token);
      else
        encode_text(std::string(s.text), first && s.text.data() == normalized.data(), ids);
    }
  }
  if (add_special_tokens && post_processor_) post_processor_->process(ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    if (auto t = id_to_token(id)) tokens.push_back(std::move(*t));
  }
  if (!decoder_) {
    std::string out;
    for (size_t k = 0; k < tokens.size(); ++k) out += (k ? " " : "") + tokens[k];
    return out;
  }
  decoder_->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

}  // namespace ms::tokenizer
