#include "model/step_inputs.h"

#include <algorithm>

#include "core/error.h"

namespace ms::model {

StepBuffers::StepBuffers(const StepLimits& l, const TensorAlloc& alloc) : limits_(l) {
  MS_CHECK(l.max_tokens > 0 && l.max_seqs > 0 && l.max_logit_rows >= 0 && l.max_blocks > 0,
           "step buffers: limits must be positive (tokens {}, seqs {}, blocks {})", l.max_tokens, l.max_seqs,
           l.max_blocks);
  token_ids_ = alloc({l.max_tokens}, DType::I32);
  positions_ = alloc({l.max_tokens}, DType::I32);
  token_seq_ = alloc({l.max_tokens}, DType::I32);
  slots_ = alloc({l.max_tokens}, DType::I64);
  decode_mask_ = alloc({l.max_tokens}, DType::U8);
  block_table_ = alloc({l.max_seqs * l.max_blocks}, DType::I32);
  seq_lens_ = alloc({l.max_seqs}, DType::I32);
  logit_rows_ = alloc({std::max<int64_t>(l.max_logit_rows, 1)}, DType::I32);
}

namespace {

template <typename T>
Tensor upload(const ops::Ctx& ctx, const std::vector<T>& v, const Tensor& buf) {
  const auto n = static_cast<int64_t>(v.size());
  Tensor view = buf.slice(0, 0, n);
  ops::copy_from_host(ctx, v.data(), view, v.size() * sizeof(T));
  return view;
}

}  // namespace

StepInputs StepBuffers::fill(const ops::Ctx& ctx, const kv::ForwardBatch& b,
                             const std::vector<uint8_t>& decode_tokens, int64_t table_stride) {
  const int64_t m = b.n_tokens(), n_seqs = b.n_seqs(), n_logits = static_cast<int64_t>(b.logit_rows.size());
  MS_CHECK(m <= limits_.max_tokens, "step of {} tokens exceeds the executor's {} tokens per step", m,
           limits_.max_tokens);
  MS_CHECK(n_seqs <= limits_.max_seqs, "step of {} sequences exceeds the executor's {} sequences per step",
           n_seqs, limits_.max_seqs);
  MS_CHECK(n_logits <= limits_.max_logit_rows, "step wants {} logit rows, the executor holds {}", n_logits,
           limits_.max_logit_rows);
  MS_CHECK(b.max_blocks <= limits_.max_blocks, "step block table of {} pages per sequence exceeds {}",
           b.max_blocks, limits_.max_blocks);
  MS_CHECK(table_stride <= limits_.max_blocks, "step block table stride of {} pages exceeds {}", table_stride,
           limits_.max_blocks);
  MS_CHECK(b.block_table.size() == static_cast<size_t>(n_seqs) * static_cast<size_t>(b.max_blocks),
           "step block table of {} entries is not [{} sequences, {} pages]", b.block_table.size(), n_seqs,
           b.max_blocks);
  MS_CHECK(decode_tokens.empty() || static_cast<int64_t>(decode_tokens.size()) == m,
           "step: {} decode-token flags for {} tokens", decode_tokens.size(), m);
  StepInputs in;
  in.host = &b;
  in.token_ids = upload(ctx, b.token_ids, token_ids_);
  in.logit_rows = upload(ctx, b.logit_rows, logit_rows_);
  in.n_logit_rows = n_logits;
  in.n_decode = std::count_if(decode_tokens.begin(), decode_tokens.end(), [](uint8_t f) { return f != 0; });
  in.decode_mask = in.n_decode > 0 ? upload(ctx, decode_tokens, decode_mask_) : decode_mask_.slice(0, 0, 0);
  ops::AttentionMeta& a = in.meta;
  a.token_seq = upload(ctx, b.token_seq, token_seq_);
  a.positions = upload(ctx, b.positions, positions_);
  a.slots = upload(ctx, b.slot_mapping, slots_);
  a.seq_lens = upload(ctx, b.seq_lens, seq_lens_);
  const int64_t width = std::max<int64_t>(table_stride, b.max_blocks);
  if (width == b.max_blocks) {
    a.block_table = upload(ctx, b.block_table, block_table_).view({n_seqs, width});
  } else {
    a.block_table = block_table_.slice(0, 0, n_seqs * width).view({n_seqs, width});
    ops::copy_rows_from_host(ctx, b.block_table.data(), static_cast<size_t>(b.max_blocks) * sizeof(int32_t),
                             n_seqs, a.block_table);
  }
  a.m = m;
  a.n_seqs = n_seqs;
  a.max_blocks = width;
  a.max_position = b.max_position();
  a.max_keys = limits_.max_keys > 0 ? limits_.max_keys : static_cast<int64_t>(a.max_position) + 1;
  MS_CHECK(a.max_keys > a.max_position, "step position {} at or past the executor's context of {}",
           a.max_position, a.max_keys);
  return in;
}

}  // namespace ms::model
