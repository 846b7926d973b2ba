// The Executor seam: step inputs filled from a ForwardBatch, workspace sizing, the CPU executor's capacity
// and its runs, and ops refusing a device they have no backend for.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "core/error.h"
#include "kv/forward_batch.h"
#include "model/builtin_model.h"
#include "model/step_inputs.h"
#include "model/workspace.h"
#include "ops/ops.h"
#include "runtime/cpu_executor.h"
#include "runtime/engine.h"

namespace ms {
namespace {

std::shared_ptr<model::Model> builtin() {
  static std::shared_ptr<model::Model> m = model::make_builtin_model();
  return m;
}

kv::ForwardBatch two_sequences() {
  kv::ForwardBatchBuilder bb(4);
  const std::vector<int32_t> a = {7, 8, 9}, b = {5};
  bb.add_sequence({2, 6}, 0, a.data(), 3, true);     // prefill of 3
  bb.add_sequence({1, 3, 0}, 8, b.data(), 1, true);  // decode at position 8
  return bb.finish();
}

std::vector<int64_t> values(const Tensor& t) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.dtype() == DType::I32) v.push_back(t.data<int32_t>()[i]);
    if (t.dtype() == DType::I64) v.push_back(t.data<int64_t>()[i]);
    if (t.dtype() == DType::U8) v.push_back(t.data<uint8_t>()[i]);
  }
  return v;
}

TEST(StepInputs, FilledFromAForwardBatch) {
  model::StepBuffers buf({.max_tokens = 8, .max_seqs = 4, .max_logit_rows = 4, .max_blocks = 5},
                         ops::cpu_alloc());
  const kv::ForwardBatch b = two_sequences();
  const model::StepInputs in = buf.fill(ops::Ctx::cpu(), b, {0, 0, 0, 1});
  EXPECT_EQ(in.m(), 4);
  EXPECT_EQ(in.host, &b);
  EXPECT_EQ(values(in.token_ids), (std::vector<int64_t>{7, 8, 9, 5}));
  EXPECT_EQ(values(in.meta.positions), (std::vector<int64_t>{0, 1, 2, 8}));
  EXPECT_EQ(values(in.meta.token_seq), (std::vector<int64_t>{0, 0, 0, 1}));
  EXPECT_EQ(values(in.meta.slots), (std::vector<int64_t>{8, 9, 10, 0}));
  EXPECT_EQ(in.meta.slots.dtype(), DType::I64);
  EXPECT_EQ(in.meta.block_table.shape(), (Shape{2, 3}));
  EXPECT_EQ(values(in.meta.block_table), (std::vector<int64_t>{2, 6, -1, 1, 3, 0}));
  EXPECT_EQ(values(in.meta.seq_lens), (std::vector<int64_t>{3, 9}));
  EXPECT_EQ(values(in.logit_rows), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(in.n_logit_rows, 2);
  EXPECT_EQ(in.n_decode, 1);
  EXPECT_EQ(values(in.decode_mask), (std::vector<int64_t>{0, 0, 0, 1}));
  EXPECT_EQ(in.meta.max_position, 8);
  // No decode token: an empty mask.
  EXPECT_EQ(buf.fill(ops::Ctx::cpu(), b, {}).decode_mask.numel(), 0);
}

// A captured graph's table is wider than the batch's: only the batch's columns are copied, the rest of each
// row keeps what was there, and the kernels see the wide stride.
TEST(StepInputs, ABlockTableOfAWiderStride) {
  model::StepBuffers buf({.max_tokens = 8, .max_seqs = 4, .max_logit_rows = 4, .max_blocks = 5},
                         ops::cpu_alloc());
  const kv::ForwardBatch b = two_sequences();
  kv::ForwardBatch wide = b;
  wide.max_blocks = 5;
  wide.block_table = {40, 41, 42, 43, 44, 50, 51, 52, 53, 54};
  (void)buf.fill(ops::Ctx::cpu(), wide, {});
  const model::StepInputs in = buf.fill(ops::Ctx::cpu(), b, {}, 5);
  EXPECT_EQ(in.meta.max_blocks, 5);
  EXPECT_EQ(in.meta.block_table.shape(), (Shape{2, 5}));
  EXPECT_EQ(values(in.meta.block_table), (std::vector<int64_t>{2, 6, -1, 43, 44, 1, 3, 0, 53, 54}));
  // The batch's own width when the stride is narrower; a stride past the limit is refused.
  EXPECT_EQ(buf.fill(ops::Ctx::cpu(), b, {}, 2).meta.block_table.shape(), (Shape{2, 3}));
  EXPECT_THROW(buf.fill(ops::Ctx::cpu(), b, {}, 6), Error);
}

TEST(StepInputs, RefusesBatchesPastItsLimits) {
  const kv::ForwardBatch b = two_sequences();
  auto alloc = ops::cpu_alloc();
  EXPECT_THROW(
      model::StepBuffers({.max_tokens = 3, .max_seqs = 4, .max_logit_rows = 4, .max_blocks = 5}, alloc)
          .fill(ops::Ctx::cpu(), b, {}),
      Error);
  EXPECT_THROW(
      model::StepBuffers({.max_tokens = 8, .max_seqs = 1, .max_logit_rows = 4, .max_blocks = 5}, alloc)
          .fill(ops::Ctx::cpu(), b, {}),
      Error);
  EXPECT_THROW(
      model::StepBuffers({.max_tokens = 8, .max_seqs = 4, .max_logit_rows = 1, .max_blocks = 5}, alloc)
          .fill(ops::Ctx::cpu(), b, {}),
      Error);
  EXPECT_THROW(
      model::StepBuffers({.max_tokens = 8, .max_seqs = 4, .max_logit_rows = 4, .max_blocks = 2}, alloc)
          .fill(ops::Ctx::cpu(), b, {}),
      Error);
  model::StepBuffers ok({.max_tokens = 8, .max_seqs = 4, .max_logit_rows = 4, .max_blocks = 5}, alloc);
  EXPECT_THROW(ok.fill(ops::Ctx::cpu(), b, {1, 0}), Error);  // flags for 2 of 4 tokens
}

TEST(Workspace, SizedFromTheConfigAndLimits) {
  const io::ModelConfig& c = builtin()->config();
  int allocs = 0;
  TensorAlloc counting = [&](const Shape& s, DType dt) {
    ++allocs;
    return Tensor::empty(s, dt);
  };
  const model::Workspace ws =
      model::Workspace::make(c, {.max_tokens = 24, .max_seqs = 3, .max_context = 256}, Device::CPU, counting);
  EXPECT_GT(allocs, 20);
  EXPECT_EQ(ws.h.shape(), (Shape{24, c.hidden_size}));
  EXPECT_EQ(ws.q.shape(), (Shape{24, c.num_attention_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim)}));
  EXPECT_EQ(ws.q_cat.shape(), (Shape{24, c.num_attention_heads, c.kv_lora_rank + c.qk_rope_head_dim}));
  EXPECT_EQ(ws.logits.shape(), (Shape{3, c.vocab_size}));  // max_logit_rows 0: one row per sequence
  EXPECT_EQ(ws.topk_ids.shape(), (Shape{24, c.num_experts_per_tok}));
  EXPECT_EQ(ws.topk_ids.dtype(), DType::I32);
  ASSERT_TRUE(c.has_indexer);
  EXPECT_EQ(ws.topk.shape(), (Shape{24, c.index_topk}));
  // MoE groups: one expert serves each of the 24 tokens at most once; with a shared expert the grouped op
  // may run it as one more slot per token (ModelOptions::fuse_shared_expert).
  EXPECT_EQ(ws.moe.x.numel(), 24 * c.hidden_size);
  const int fused = c.n_shared_experts > 0 ? 1 : 0;
  EXPECT_EQ(ws.moe.order.numel(), 24 * (c.num_experts_per_tok + fused));
  EXPECT_EQ(ws.moe.offsets.numel(), c.n_routed_experts + fused + 1);
  if (fused) {
    EXPECT_EQ(ws.topk_ids_ext.shape(), (Shape{24, c.num_experts_per_tok + 1}));
  }
  EXPECT_EQ(ws.pool_cast.raw(), nullptr);  // only with the planted pool cast
  EXPECT_GT(ws.bytes(), static_cast<size_t>(24 * c.hidden_size * 4 * 2));
  EXPECT_THROW(model::Workspace::make(c, {.max_tokens = 0, .max_seqs = 1, .max_context = 8}, Device::CPU,
                                      ops::cpu_alloc()),
               Error);
}

TEST(CpuExecutor, ReportsCapacityAndRunsSteps) {
  runtime::ExecutorConfig ec;
  ec.num_pages = 8;
  ec.page_size = 4;
  ec.max_tokens = 8;
  ec.max_seqs = 2;
  runtime::CpuExecutor ex(builtin(), ec);
  EXPECT_EQ(ex.name(), "cpu");
  EXPECT_EQ(ex.device(), Device::CPU);
  const runtime::KvCapacity cap = ex.kv_capacity();
  EXPECT_EQ(cap.num_pages, 8);
  EXPECT_EQ(cap.page_size, 4);
  EXPECT_EQ(cap.dtype, kv::KvCacheDType::BF16);  // Auto resolved
  EXPECT_EQ(cap.bytes, ex.kv_pool().bytes());
  EXPECT_EQ(ex.config().max_logit_rows, 2);

  const int64_t V = builtin()->config().vocab_size;
  const kv::ForwardBatch b = two_sequences();
  // The decode sequence's earlier positions are never written here; only determinism is checked.
  Tensor first = ex.run(b).clone();
  ASSERT_EQ(first.shape(), (Shape{2, V}));
  Tensor again = ex.run(b);
  EXPECT_EQ(std::memcmp(first.raw(), again.raw(), first.nbytes()), 0);
  // A step past the limits fails with a message and leaves the executor usable.
  kv::ForwardBatchBuilder big(4);
  const std::vector<int32_t> ids(9, 3);
  big.add_sequence({0, 1, 2}, 0, ids.data(), 9, true);
  EXPECT_THROW(ex.run(big.finish()), Error);
  kv::ForwardBatchBuilder bad(4);
  bad.add_sequence({9}, 0, ids.data(), 1, true);  // page 9 of 8
  EXPECT_THROW(ex.run(bad.finish()), Error);
  Tensor after = ex.run(b);
  EXPECT_EQ(std::memcmp(first.raw(), after.raw(), first.nbytes()), 0);
}

TEST(CpuExecutor, EngineOnAnExecutorTakesItsPages) {
  runtime::EngineConfig cfg;
  cfg.page_size = 16;
  cfg.kv_cache_tokens = 256;
  cfg.max_running = 2;
  runtime::Engine e(runtime::make_cpu_executor(builtin(), cfg), cfg);
  EXPECT_EQ(e.kv_capacity().num_pages, 16);
  EXPECT_EQ(e.page_allocator().num_pages(), 16);
  EXPECT_EQ(e.executor().name(), "cpu");
  runtime::Request r;
  r.prompt_ids = {1, 2, 3};
  r.max_tokens = 2;
  r.sampling.temperature = 0;
  e.submit(r);
  int tokens = 0;
  while (e.has_work())
    for (const auto& o : e.step()) tokens += static_cast<int>(o.tokens.size());
  EXPECT_EQ(tokens, 2);
  EXPECT_EQ(e.page_allocator().num_free() + e.stats().kv_pages_cached, 16);
}

TEST(Ops, CudaContextWithoutBackendIsRefused) {
  ops::Ctx cuda;
  cuda.device = Device::CUDA;
  Tensor x = Tensor::zeros({2, 4}, DType::F32);
  try {
    ops::scale(cuda, x, 2.0f);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is on cpu"), std::string::npos) << e.what();
  }
  Tensor on_cuda = Tensor::borrow(x.raw(), {2, 4}, DType::F32, nullptr, Device::CUDA);
  try {
    ops::scale(cuda, on_cuda, 2.0f);
    FAIL() << "no throw";
  } catch (const Error& e) {
#if MOESERVE_HAVE_CUDA
    // The CUDA branch runs only with the executor's backend (cuBLASLt handle, limits, scratch).
    EXPECT_NE(std::string(e.what()).find("without its backend"), std::string::npos) << e.what();
#else
    EXPECT_NE(std::string(e.what()).find("op scale: no CUDA backend built"), std::string::npos) << e.what();
#endif
  }
  // A CPU op given a tensor on another device.
  EXPECT_THROW(ops::scale(ops::Ctx::cpu(), on_cuda, 2.0f), Error);
}

}  // namespace
}  // namespace ms
