#include "runtime/step_plan.h"

#include <cstring>

#include "core/error.h"

namespace ms::runtime {

namespace {

constexpr size_t kHeaderWords = 6;  // magic, version, size, op, step (2)

uint32_t fnv1a(std::span<const int32_t> words) {
  uint32_t h = 2166136261u;
  for (int32_t w : words) {
    uint32_t u = static_cast<uint32_t>(w);
    for (int i = 0; i < 4; ++i, u >>= 8) {
      h ^= u & 0xffu;
      h *= 16777619u;
    }
  }
  return h;
}

void put64(std::vector<int32_t>& out, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  out.push_back(static_cast<int32_t>(static_cast<uint32_t>(u)));
  out.push_back(static_cast<int32_t>(static_cast<uint32_t>(u >> 32)));
}

int64_t get64(const int32_t* w) {
  return static_cast<int64_t>(static_cast<uint64_t>(static_cast<uint32_t>(w[0])) |
                              (static_cast<uint64_t>(static_cast<uint32_t>(w[1])) << 32));
}

int32_t count_word(size_t n, const char* what) {
  MS_CHECK(n <= static_cast<size_t>(INT32_MAX), "step plan: {} has {} elements, more than a plan holds", what,
           n);
  return static_cast<int32_t>(n);
}

void put_array(std::vector<int32_t>& out, const std::vector<int32_t>& v, const char* what) {
  out.push_back(count_word(v.size(), what));
  out.insert(out.end(), v.begin(), v.end());
}

// Reads the words after the header; every read names the field it was reading when the words ran out.
class Reader {
 public:
  Reader(std::span<const int32_t> w, size_t pos) : w_(w), pos_(pos) {}
  int32_t word(const char* what) {
    need(1, what);
    return w_[pos_++];
  }
  size_t count(const char* what) {
    const int32_t n = word(what);
    MS_CHECK(n >= 0, "step plan: {} has a negative element count {}", what, n);
    return static_cast<size_t>(n);
  }
  void array(std::vector<int32_t>& v, const char* what) {
    const size_t n = count(what);
    need(n, what);
    v.assign(w_.begin() + static_cast<std::ptrdiff_t>(pos_),
             w_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
    pos_ += n;
  }
  void array64(std::vector<int64_t>& v, const char* what) {
    const size_t n = count(what);
    need(2 * n, what);
    v.resize(n);
    for (size_t i = 0; i < n; ++i) v[i] = get64(&w_[pos_ + 2 * i]);
    pos_ += 2 * n;
  }
  void flags(std::vector<uint8_t>& v, const char* what) {
    const size_t n = count(what);
    const size_t nw = (n + 3) / 4;
    need(nw, what);
    v.resize(n);
    for (size_t i = 0; i < n; ++i)
      v[i] = static_cast<uint8_t>((static_cast<uint32_t>(w_[pos_ + i / 4]) >> (8 * (i % 4))) & 0xffu);
    pos_ += nw;
  }
  size_t pos() const { return pos_; }

 private:
  void need(size_t n, const char* what) const {
    MS_CHECK(n <= w_.size() - pos_, "step plan: truncated in {} (needs {} more words at word {} of {})", what,
             n, pos_, w_.size());
  }
  std::span<const int32_t> w_;
  size_t pos_;
};

}  // namespace

void encode_step_plan(StepOp op, int64_t step, const kv::ForwardBatch* batch,
                      const model::StepRouting* routing, std::vector<int32_t>& out) {
  MS_CHECK(op == StepOp::Run || op == StepOp::Shutdown || op == StepOp::Keepalive, "step plan: unknown op {}",
           static_cast<int32_t>(op));
  MS_CHECK(op != StepOp::Run || (batch && routing), "step plan: a run needs its batch and routing");
  out.clear();
  out.push_back(kStepPlanMagic);
  out.push_back(kStepPlanVersion);
  out.push_back(0);  // total words, set below
  out.push_back(static_cast<int32_t>(op));
  put64(out, step);
  if (op == StepOp::Run) {
    const kv::ForwardBatch& b = *batch;
    out.push_back(b.max_blocks);
    out.push_back(routing->oea.enabled ? 1 : 0);
    out.push_back(routing->oea.k0);
    out.push_back(routing->oea.kmax);
    put_array(out, b.token_ids, "token_ids");
    put_array(out, b.positions, "positions");
    put_array(out, b.token_seq, "token_seq");
    put_array(out, b.seq_lens, "seq_lens");
    put_array(out, b.block_table, "block_table");
    out.push_back(count_word(b.slot_mapping.size(), "slot_mapping"));
    for (int64_t s : b.slot_mapping) put64(out, s);
    put_array(out, b.logit_rows, "logit_rows");
    const std::vector<uint8_t>& d = routing->decode_tokens;
    out.push_back(count_word(d.size(), "decode_tokens"));
    for (size_t i = 0; i < d.size(); i += 4) {
      uint32_t w = 0;
      for (size_t j = 0; j < 4 && i + j < d.size(); ++j) w |= static_cast<uint32_t>(d[i + j]) << (8 * j);
      out.push_back(static_cast<int32_t>(w));
    }
  }
  out[2] = count_word(out.size() + 1, "the plan");
  out.push_back(static_cast<int32_t>(fnv1a(out)));
}

StepPlan decode_step_plan(std::span<const int32_t> words) {
  MS_CHECK(words.size() >= kHeaderWords + 1, "step plan: {} words, shorter than its header", words.size());
  MS_CHECK(words[0] == kStepPlanMagic, "step plan: magic {:#010x}, expected {:#010x} (not a step plan)",
           static_cast<uint32_t>(words[0]), static_cast<uint32_t>(kStepPlanMagic));
  MS_CHECK(words[1] == kStepPlanVersion, "step plan: version {}, this build reads version {}", words[1],
           kStepPlanVersion);
  MS_CHECK(words[2] >= 0 && static_cast<size_t>(words[2]) == words.size(),
           "step plan: the header says {} words, the buffer holds {}", words[2], words.size());
  const uint32_t sum = fnv1a(words.first(words.size() - 1));
  MS_CHECK(static_cast<uint32_t>(words.back()) == sum,
           "step plan: checksum {:#010x}, computed {:#010x} (corrupt)", static_cast<uint32_t>(words.back()),
           sum);
  StepPlan p;
  const int32_t op = words[3];
  MS_CHECK(op == static_cast<int32_t>(StepOp::Run) || op == static_cast<int32_t>(StepOp::Shutdown) ||
               op == static_cast<int32_t>(StepOp::Keepalive),
           "step plan: unknown op {}", op);
  p.op = static_cast<StepOp>(op);
  p.step = get64(&words[4]);
  const auto body = words.first(words.size() - 1);  // the checksum is not read as data
  Reader r(body, kHeaderWords);
  if (p.op == StepOp::Run) {
    kv::ForwardBatch& b = p.batch;
    b.max_blocks = r.word("max_blocks");
    p.routing.oea.enabled = r.word("oea.enabled") != 0;
    p.routing.oea.k0 = r.word("oea.k0");
    p.routing.oea.kmax = r.word("oea.kmax");
    r.array(b.token_ids, "token_ids");
    r.array(b.positions, "positions");
    r.array(b.token_seq, "token_seq");
    r.array(b.seq_lens, "seq_lens");
    r.array(b.block_table, "block_table");
    r.array64(b.slot_mapping, "slot_mapping");
    r.array(b.logit_rows, "logit_rows");
    r.flags(p.routing.decode_tokens, "decode_tokens");
  }
  MS_CHECK(r.pos() == body.size(), "step plan: {} words left over after the {} plan", body.size() - r.pos(),
           p.op == StepOp::Run        ? "run"
           : p.op == StepOp::Shutdown ? "shutdown"
                                      : "keepalive");
  return p;
}

}  // namespace ms::runtime
