#include "runtime/executor.h"

#include <numeric>

#include "core/error.h"

namespace ms::runtime {

ExecutorConfig resolve_executor_config(const io::ModelConfig& mc, ExecutorConfig c, bool pages_from_memory) {
  MS_CHECK(c.page_size > 0, "--page-size must be positive, got {}", c.page_size);
  MS_CHECK(c.num_pages > 0 || (pages_from_memory && c.num_pages == 0),
           "the KV cache needs at least one page");
  MS_CHECK(c.max_tokens > 0 && c.max_seqs > 0,
           "executor: max tokens ({}) and sequences ({}) per step must be positive", c.max_tokens,
           c.max_seqs);
  if (c.max_context <= 0 || c.max_context > mc.max_position_embeddings)
    c.max_context = mc.max_position_embeddings;
  if (c.max_logit_rows <= 0) c.max_logit_rows = c.max_seqs;
  if (c.kv_cache_dtype == kv::KvCacheDType::Auto) c.kv_cache_dtype = kv::KvCacheDType::BF16;
  return c;
}

void Executor::run_rows(const kv::ForwardBatch& b, const LogitsRequest&, StepLogits& out,
                        const model::StepRouting& routing, profiler::OpSink* sink) {
  out.full = run(b, routing, sink);
  out.full_index.resize(b.logit_rows.size());
  std::iota(out.full_index.begin(), out.full_index.end(), 0);
  out.summaries = {};
}

Tensor Executor::fetch_rows(std::span<const int32_t>) {
  MS_THROW("executor '{}' returned every logits row in full; there is no row to fetch", name());
}

}  // namespace ms::runtime
