#include "runtime/cpu_executor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "core/error.h"

namespace ms::runtime {

namespace {

// Step inputs and the workspace are written once here: fresh pages fault on their first touch (thousands of
// 4 KB faults for a 128-token prefill's buffers), which would otherwise land in the first steps served.
TensorAlloc touched_alloc() {
  return [](const Shape& shape, DType dtype) { return Tensor::zeros(shape, dtype); };
}

// The weights' pages mapped into this process before the first step. A checkpoint's tensors borrow its mmap:
// each page not yet in the page table faults on its first read (fault-around maps ~64 KB at a time), so a
// step that touches experts no earlier step used (every prefill of a fresh process) paid thousands of faults.
// MADV_POPULATE_READ (Linux 5.14+) maps them in one call; elsewhere one read per page does it. Owned host
// memory is already mapped and costs a walk over its pages.
void populate(const Tensor& t) {
  if (t.raw() == nullptr || t.nbytes() == 0) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<uintptr_t>(t.raw());
  const uintptr_t begin = start & ~(page - 1), end = start + t.nbytes();
#ifdef MADV_POPULATE_READ
  if (::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ) == 0) return;
#endif
  for (uintptr_t a = start; a < end; a = (a & ~(page - 1)) + page)
    (void)*reinterpret_cast<const volatile unsigned char*>(a);  // a volatile read is never dropped
}

void populate(const ops::LinearWeight& w) {
  if (!w.defined()) return;
  populate(w.weight);
  populate(w.scale);
}

void populate(const model::MlpWeights& m) {
  populate(m.gate);
  populate(m.up);
  populate(m.down);
}

void populate_weights(const model::ModelWeights& w) {
  populate(w.embed);
  populate(w.lm_head);
  for (const model::LayerWeights& l : w.layers) {
    const model::AttentionWeights& a = l.attn;
    for (const ops::LinearWeight* lw :
         {&a.q_a_proj, &a.q_b_proj, &a.q_proj, &a.kv_a_proj, &a.kv_b_proj, &a.o_proj})
      populate(*lw);
    populate(l.mlp);
    populate(l.moe.router);
    for (const ops::ExpertWeights& e : l.moe.experts) {
      populate(e.gate);
      populate(e.up);
      populate(e.down);
    }
    populate(l.moe.shared);
  }
}

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
      steps_(step_limits(cfg_), touched_alloc()),
      ws_(model::Workspace::make(model_->config(), workspace_limits(*model_, cfg_), Device::CPU,
                                 touched_alloc())) {
  populate_weights(model_->weights());
}

KvCapacity CpuExecutor::kv_capacity() const {
  return {pool_.config().num_pages, pool_.config().page_size, pool_.config().dtype, pool_.bytes()};
}

Tensor CpuExecutor::run(const kv::ForwardBatch& b, const model::StepRouting& routing,
                        profiler::OpSink* sink) {
  model_->check_batch(b, pool_, routing);
  const model::StepInputs in = steps_.fill(ctx_, b, routing.decode_tokens);
  return model_->forward(ctx_, in, pool_, ws_, routing, sink);
}

void CpuExecutor::check_batch(const kv::ForwardBatch& b, const model::StepRouting& routing) const {
  model_->check_batch(b, pool_, routing);
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
