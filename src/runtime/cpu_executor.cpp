#include "runtime/cpu_executor.h"

#include <algorithm>

#include "core/error.h"

namespace ms::runtime {

namespace {

model::WorkspaceLimits workspace_limits(const model::Model& m, const ExecutorConfig& c) {
  model::WorkspaceLimits l;
  l.max_tokens = c.max_tokens;
  l.max_seqs = c.max_seqs;
  l.max_logit_rows = c.max_logit_rows;
  l.max_context = c.max_context;
  if (m.options().debug_cast_whole_pool)
    l.debug_pool_floats = static_cast<int64_t>(c.num_pages) * c.page_size * m.config().kv_cache_width();
  return l;
}

model::StepLimits step_limits(const ExecutorConfig& c) {
  model::StepLimits l;
  l.max_tokens = c.max_tokens;
  l.max_seqs = c.max_seqs;
  l.max_logit_rows = c.max_logit_rows;
  // A block table row never names more pages than the pool has.
  l.max_blocks = c.num_pages;
  return l;
}

}  // namespace

CpuExecutor::CpuExecutor(std::shared_ptr<const model::Model> model, ExecutorConfig cfg)
    : model_(std::move(model)),
      cfg_(resolve_executor_config(model_->config(), cfg, false)),
      ctx_(ops::Ctx::cpu()),
      pool_(model_->kv_pool_config(cfg_.num_pages, cfg_.page_size, cfg_.kv_cache_dtype)),
      steps_(step_limits(cfg_), ops::cpu_alloc()),
      ws_(model::Workspace::make(model_->config(), workspace_limits(*model_, cfg_), Device::CPU,
                                 ops::cpu_alloc())) {}

KvCapacity CpuExecutor::kv_capacity() const {
  return {pool_.config().num_pages, pool_.config().page_size, pool_.config().dtype, pool_.bytes()};
}

Tensor CpuExecutor::run(const kv::ForwardBatch& b, const model::StepRouting& routing,
                        profiler::OpSink* sink) {
  model_->check_batch(b, pool_, routing);
  const model::StepInputs in = steps_.fill(ctx_, b, routing.decode_tokens);
  return model_->forward(ctx_, in, pool_, ws_, routing, sink);
}

ExecutorConfig executor_config_for(const model::Model& model, int32_t page_size, int64_t kv_cache_tokens,
                                   kv::KvCacheDType dtype, int max_running, int32_t max_prefill_tokens,
                                   int64_t max_context) {
  MS_CHECK(page_size > 0, "--page-size must be positive, got {}", page_size);
  MS_CHECK(kv_cache_tokens >= page_size, "KV cache of {} tokens holds less than one page of {}",
           kv_cache_tokens, page_size);
  ExecutorConfig c;
  c.page_size = page_size;
  c.num_pages = static_cast<int32_t>(kv_cache_tokens / page_size);
  c.kv_cache_dtype = dtype;
  c.max_seqs = std::max(max_running, 1);
  // Decodes first (one token each), then prefill chunks within the prefill budget.
  c.max_tokens = static_cast<int64_t>(c.max_seqs) + std::max(max_prefill_tokens, 1);
  c.max_logit_rows = c.max_seqs;
  c.max_context = max_context > 0 ? max_context : model.config().max_position_embeddings;
  return c;
}

}  // namespace ms::runtime
