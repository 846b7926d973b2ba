// Tests that drive a model step by step: a CpuExecutor (KV pages, workspace) with its own page allocator,
// sized generously, whose forward() returns a copy of the logits (the executor's own view lives only until
// its next step).
#pragma once

#include <memory>

#include "kv/forward_batch.h"
#include "kv/page_allocator.h"
#include "model/model.h"
#include "runtime/cpu_executor.h"

namespace ms::test {

struct ExecPool {
  runtime::CpuExecutor exec;
  kv::PageAllocator alloc;

  // `model` must outlive the pool.
  ExecPool(const model::Model& model, int32_t num_pages, int32_t page_size, kv::KvCacheDType dt,
           int64_t max_tokens = 1024, int64_t max_seqs = 64)
      : exec(std::shared_ptr<const model::Model>(&model, [](const model::Model*) {}),
             config(num_pages, page_size, dt, max_tokens, max_seqs)),
        alloc(num_pages) {}

  static runtime::ExecutorConfig config(int32_t num_pages, int32_t page_size, kv::KvCacheDType dt,
                                        int64_t max_tokens, int64_t max_seqs) {
    runtime::ExecutorConfig c;
    c.num_pages = num_pages;
    c.page_size = page_size;
    c.kv_cache_dtype = dt;
    c.max_tokens = max_tokens;
    c.max_seqs = max_seqs;
    c.max_logit_rows = max_tokens;
    return c;
  }

  kv::PageAllocator& allocator() { return alloc; }
  int32_t page_size() const { return exec.kv_capacity().page_size; }
  int32_t pages_for(int64_t tokens) const {
    return static_cast<int32_t>((tokens + page_size() - 1) / page_size());
  }
  const kv::KvPool& kv() const { return exec.kv_pool(); }
  Tensor forward(const kv::ForwardBatch& b, const model::StepRouting& routing = {},
                 profiler::OpSink* sink = nullptr) {
    return exec.run(b, routing, sink).clone();
  }
};

}  // namespace ms::test
