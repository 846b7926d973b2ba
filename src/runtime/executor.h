// The seam between the Engine and a device: an Executor runs one ForwardBatch on one device and owns that
// device's memory for the model: its weights, the KV pages (kv::KvPool; the page ids come from the Engine's
// PageAllocator), the step buffers and the Workspace (and, on CUDA, the captured graphs). CpuExecutor is the
// reference; a CUDA executor implements the same interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/logits_topc.h"
#include "kv/forward_batch.h"
#include "kv/kv_pool.h"
#include "model/model.h"
#include "profiler/op_record.h"
#include "profiler/timer.h"

namespace ms::runtime {

// What the KV pages of an executor hold.
struct KvCapacity {
  int32_t num_pages = 0;
  int32_t page_size = 0;
  kv::KvCacheDType dtype = kv::KvCacheDType::BF16;  // resolved, never Auto
  size_t bytes = 0;                                 // device memory of all pages, every layer
};

// Sizes an executor allocates for once.
struct ExecutorConfig {
  int32_t num_pages = 0;
  int32_t page_size = 64;
  kv::KvCacheDType kv_cache_dtype = kv::KvCacheDType::Auto;  // Auto: the model's default (bf16)
  int64_t max_tokens = 0;                                    // tokens per step (decodes + prefill chunks)
  int64_t max_seqs = 0;                                      // sequences per step
  int64_t max_logit_rows = 0;                                // rows of logits per step; 0: max_seqs
  int64_t max_context = 0;  // tokens per sequence; 0: the model's max_position_embeddings
};

// cfg with its defaults filled in for `mc` (context: the model's, logit rows: one per sequence, KV dtype
// Auto: bf16); throws naming the field that cannot work. num_pages 0 is accepted only where the executor
// sizes the pages itself (the CUDA executor, from --mem-fraction-static).
ExecutorConfig resolve_executor_config(const io::ModelConfig& mc, ExecutorConfig cfg, bool pages_from_memory);

// How the Engine wants a step's logits rows back (Executor::run_rows): per logit row, whether a candidate
// summary (kernels/cpu/logits_topc.h) will do, and the temperature its sum_exp_t is taken at.
struct LogitsRequest {
  std::span<const uint8_t> summary;    // [logit rows] 1: a summary suffices; empty: every row in full
  std::span<const float> temperature;  // [logit rows] (read for summary rows only)
};

// A step's logits rows as they came back: row i is full.row(full_index[i]) when full_index[i] >= 0, else
// summaries[i]. Host memory, valid until the executor's next run or fetch.
struct StepLogits {
  Tensor full;                                          // f32 [rows in full, vocab]
  std::vector<int32_t> full_index;                      // [logit rows]
  std::span<const kernels::cpu::LogitsTopC> summaries;  // [logit rows], read where full_index < 0
  int32_t full_rows() const { return full.defined() ? static_cast<int32_t>(full.shape()[0]) : 0; }
};

class Executor {
 public:
  virtual ~Executor() = default;

  virtual std::string_view name() const = 0;  // "cpu"
  virtual Device device() const = 0;
  virtual KvCapacity kv_capacity() const = 0;
  // The model as this executor runs it (config and router; weights on the executor's device).
  virtual const model::Model& model() const = 0;
  virtual const ExecutorConfig& config() const = 0;

  // Runs one step: writes the batch's keys into the executor's KV pages and returns logits f32
  // [b.logit_rows.size(), vocab] in host memory, valid until the next run. Throws ms::Error naming what does
  // not fit (a page id past the pool, more tokens than max_tokens, ...), leaving the executor usable.
  virtual Tensor run(const kv::ForwardBatch& b, const model::StepRouting& routing = {},
                     profiler::OpSink* sink = nullptr) = 0;
  // run() with a say in how each row comes back. An executor that can summarise (supports_summaries())
  // returns summaries for the rows `req` allows and full rows for the rest; the default runs run() and
  // returns every row in full, which a caller must handle too.
  virtual void run_rows(const kv::ForwardBatch& b, const LogitsRequest& req, StepLogits& out,
                        const model::StepRouting& routing = {}, profiler::OpSink* sink = nullptr);
  virtual bool supports_summaries() const { return false; }
  // Full rows of the last run_rows, for rows whose summary could not decide: f32 [rows.size(), vocab] in
  // host memory, row j = logit row rows[j]; valid until the next run or fetch. Throws unless the last run
  // returned summaries (the default never does).
  virtual Tensor fetch_rows(std::span<const int32_t> rows);
  // The host checks run() makes before touching the device (Model::check_batch on this executor's pool):
  // throws ms::Error naming what in `b` cannot run. The default accepts every batch (run() still checks).
  virtual void check_batch(const kv::ForwardBatch& b, const model::StepRouting& routing = {}) const {}
  // The profiler's timer for this executor's work (CUDA events on a GPU); null: a steady clock.
  virtual std::unique_ptr<profiler::TimerBackend> make_timer() const { return nullptr; }
};

}  // namespace ms::runtime
