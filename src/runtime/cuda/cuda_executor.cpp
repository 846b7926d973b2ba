#if MOESERVE_HAVE_CUDA
#include "runtime/cuda/cuda_executor.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/log.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/pdl.h"
#include "kernels/cuda/sampling/logits_topc.h"
#include "ops/ops.h"
#include "runtime/cuda/cuda_event_timer.h"
#include "runtime/cuda/device_arena.h"
#include "runtime/cuda/weight_upload.h"

namespace ms::runtime::cuda {

std::vector<int> cuda_graph_buckets(int max_bs) {
  std::vector<int> b;
  for (int s : {1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512})
    if (s <= max_bs) b.push_back(s);
  if (max_bs > 0 && (b.empty() || b.back() < max_bs)) b.push_back(max_bs);
  return b;
}

struct CudaExecutor::Impl {
  ops::CudaBackend backend;
  cudaStream_t stream = nullptr;
  ops::Ctx ctx;
  DeviceArena weights{"weights", 0}, kv{"KV pages", 0}, work{"workspace", 0};
  std::unique_ptr<kv::KvPool> pool;
  model::StepBuffers steps;
  model::Workspace ws;
  float* logits_host = nullptr;  // pinned [max_logit_rows, vocab]
  // Candidate summaries: device [max_logit_rows] (workspace) and pinned host [max_logit_rows]; per-row
  // temperatures staged through pinned memory each step.
  kernels::cpu::LogitsTopC* summaries_dev = nullptr;
  kernels::cpu::LogitsTopC* summaries_ws = nullptr;  // segments of rows cut over several blocks
  kernels::cpu::LogitsTopC* summaries_host = nullptr;
  float* temperature_dev = nullptr;
  float* temperature_host = nullptr;
  // The last run_rows: its device logits (valid until the next forward) and how many rows came back full.
  Tensor last_logits;
  int64_t last_rows = 0, last_full = 0;
  bool last_summarised = false;
  std::vector<int> buckets;
  int32_t graph_max_blocks = 0;
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    Tensor logits;  // the workspace rows the graph writes
  };
  std::map<int, Graph> graphs;  // by 2 x bucket + (DSA dense step)
  kv::ForwardBatch padded;      // reused for graph steps
  std::vector<uint8_t> padded_mask;

  ~Impl() {
    for (auto& [b, g] : graphs) cudaGraphExecDestroy(g.exec);
    if (logits_host) cudaFreeHost(logits_host);
    if (summaries_host) cudaFreeHost(summaries_host);
    if (temperature_host) cudaFreeHost(temperature_host);
    if (stream) cudaStreamDestroy(stream);
  }
};

namespace {

TensorAlloc arena_alloc(DeviceArena& a) {
  return [&a](const Shape& shape, DType dtype) { return a.tensor(shape, dtype); };
}

}  // namespace

CudaExecutor::CudaExecutor(const model::Model& host_model, ExecutorConfig cfg, CudaExecutorOptions opt)
    : CudaExecutor(
          host_model.config(), host_model.options(),
          [&host_model](Impl& I) {
            UploadStats up;
            return upload_weights(host_model.weights(), I.weights, &up);
          },
          cfg, opt) {}

CudaExecutor::CudaExecutor(const io::ModelConfig& mc, const model::TensorSource& weights, double weight_bytes,
                           ExecutorConfig cfg, CudaExecutorOptions opt, model::ModelOptions mopt)
    : CudaExecutor(
          mc, mopt,
          [&](Impl& I) {
            UploadStats up;
            return upload_weights_from_source(mc, weights, weight_bytes, I.weights, &up);
          },
          cfg, opt) {}

CudaExecutor::CudaExecutor(const io::ModelConfig& mc, const model::ModelOptions& mopt,
                           const std::function<model::ModelWeights(Impl&)>& make_weights, ExecutorConfig cfg,
                           CudaExecutorOptions opt)
    : cfg_(resolve_executor_config(mc, cfg, true)), opt_(opt), impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  ms::cuda::set_pdl_enabled(opt_.pdl);
  CUDA_CHECK(cudaStreamCreateWithFlags(&I.stream, cudaStreamNonBlocking));
  I.ctx = I.backend.ctx(I.stream);
  I.backend.set_attention_kernel(opt_.attention_kernel);
  I.backend.set_exact_linear(opt_.exact_linear);
  if (opt_.attention_kernel == "mla_fp8_decode") {
    const io::ModelConfig& c = mc;
    MS_CHECK(
        cfg_.kv_cache_dtype == kv::KvCacheDType::FP8E4M3 && c.kv_lora_rank == 512 &&
            c.qk_rope_head_dim == 64 && cfg_.page_size == 64,
        "--attention-backend mla_fp8_decode reads fp8_e4m3 pages of 64 tokens x (512 + 64) values; this run "
        "has {} pages of {} x ({} + {}): use --kv-cache-dtype fp8_e4m3 --page-size 64, or "
        "--attention-backend auto",
        kv::kv_cache_dtype_name(cfg_.kv_cache_dtype), cfg_.page_size, c.kv_lora_rank, c.qk_rope_head_dim);
  }
  if (opt_.attention_kernel == "mla_decode_wgmma") {
    const io::ModelConfig& c = mc;
    MS_CHECK(
        cfg_.kv_cache_dtype == kv::KvCacheDType::FP8E4M3 && c.kv_lora_rank == 512 && c.qk_rope_head_dim == 64,
        "--attention-backend mla_decode_wgmma reads fp8_e4m3 pages of (512 + 64) values; this run has {} "
        "pages of ({} + {}): use --kv-cache-dtype fp8_e4m3, or --attention-backend auto",
        kv::kv_cache_dtype_name(cfg_.kv_cache_dtype), c.kv_lora_rank, c.qk_rope_head_dim);
  }
  if (opt_.attention_kernel == "mla_decode_sm90") {
    const io::ModelConfig& c = mc;
    MS_CHECK(
        (cfg_.kv_cache_dtype == kv::KvCacheDType::FP8E4M3 || cfg_.kv_cache_dtype == kv::KvCacheDType::BF16) &&
            c.kv_lora_rank == 512 && c.qk_rope_head_dim == 64,
        "--attention-backend mla_decode_sm90 reads fp8_e4m3 or bf16 pages of (512 + 64) values; this run has "
        "{} pages of ({} + {}): use --attention-backend auto",
        kv::kv_cache_dtype_name(cfg_.kv_cache_dtype), c.kv_lora_rank, c.qk_rope_head_dim);
  }

  // Weights, in their stored formats; then a model over them with its RoPE tables on the device.
  model::ModelWeights dw = make_weights(I);
  model::ModelOptions model_opt = mopt;
  model_opt.fuse_shared_expert = opt_.fuse_shared_expert;
  model_opt.dsa_dense_when_short = opt_.dsa_dense_when_short;
  auto m = std::make_shared<model::Model>(mc, std::move(dw), model_opt);
  m->place_tables(I.ctx, arena_alloc(I.weights));
  model_ = m;

  // Step buffers and workspace.
  I.graph_max_blocks = static_cast<int32_t>((cfg_.max_context + cfg_.page_size - 1) / cfg_.page_size);
  model::StepLimits sl;
  sl.max_tokens = cfg_.max_tokens;
  sl.max_seqs = cfg_.max_seqs;
  sl.max_logit_rows = cfg_.max_logit_rows;
  sl.max_blocks = I.graph_max_blocks;
  sl.max_keys = cfg_.max_context;
  I.steps = model::StepBuffers(sl, arena_alloc(I.work));
  model::WorkspaceLimits wl;
  wl.max_tokens = cfg_.max_tokens;
  wl.max_seqs = cfg_.max_seqs;
  wl.max_logit_rows = cfg_.max_logit_rows;
  wl.max_context = cfg_.max_context;
  MS_CHECK(!model_->options().debug_cast_whole_pool,
           "the planted whole-pool cast (MOESERVE_DEBUG_PLANT_POOL_CAST) is a CPU test switch; unset it for "
           "--device cuda");
  I.ws = model::Workspace::make(mc, wl, Device::CUDA, arena_alloc(I.work));
  I.ws.comm = opt_.comm;

  MS_CHECK(cfg_.kv_cache_dtype != kv::KvCacheDType::FP8E4M3Tile128Sim,
           "--kv-cache-dtype fp8_e4m3_tile128_sim measures a finer fp8 format's quality on the cpu; the GPU "
           "pages take f32, bf16 or fp8_e4m3");
  // KV pages: as many as the config asks, or (num_pages 0) what --mem-fraction-static leaves after the
  // weights and the workspace.
  const kv::KvPoolConfig probe = model_->kv_pool_config(1, cfg_.page_size, cfg_.kv_cache_dtype);
  const double page_bytes = static_cast<double>(kv::KvPool::bytes_for(probe));
  if (cfg_.num_pages <= 0) {
    size_t free_b = 0, total_b = 0;
    device_memory(free_b, total_b);
    const double budget = opt_.mem_fraction_static * static_cast<double>(total_b) -
                          static_cast<double>(I.weights.reserved() + I.work.reserved()) -
                          512.0 * 1048576.0;  // cuBLASLt, scratch, graphs
    const double usable = std::min(budget, static_cast<double>(free_b) - 1024.0 * 1048576.0);
    MS_CHECK(
        usable >= page_bytes,
        "--mem-fraction-static {}: {:.2f} GiB of {:.2f} GiB hold the weights ({:.2f} GiB) and the workspace "
        "({:.2f} GiB) but leave no room for KV pages; raise the fraction or use more GPUs",
        opt_.mem_fraction_static, opt_.mem_fraction_static * total_b / 1073741824.0, total_b / 1073741824.0,
        I.weights.reserved() / 1073741824.0, I.work.reserved() / 1073741824.0);
    cfg_.num_pages = static_cast<int32_t>(std::min(usable / page_bytes, 2.0e9));
    if (opt_.max_pages > 0)
      cfg_.num_pages = static_cast<int32_t>(std::min<int64_t>(cfg_.num_pages, opt_.max_pages));
  }
  I.pool = std::make_unique<kv::KvPool>(
      model_->kv_pool_config(cfg_.num_pages, cfg_.page_size, cfg_.kv_cache_dtype), arena_alloc(I.kv));
  // Pages start zeroed: a page tail no sequence has written yet holds finite values.
  for (int l = 0; l < mc.num_hidden_layers; ++l) {
    ops::fill_zero(I.ctx, I.pool->latent(l));
    if ((I.pool->index_keys(l).defined() && I.pool->index_keys(l).numel() > 0))
      ops::fill_zero(I.ctx, I.pool->index_keys(l));
  }
  CUDA_CHECK(cudaMallocHost(
      &I.logits_host, static_cast<size_t>(cfg_.max_logit_rows) * static_cast<size_t>(mc.vocab_size) * 4));
  const size_t summary_bytes = static_cast<size_t>(cfg_.max_logit_rows) * sizeof(kernels::cpu::LogitsTopC);
  I.summaries_dev = static_cast<kernels::cpu::LogitsTopC*>(I.work.alloc(summary_bytes));
  I.summaries_ws = static_cast<kernels::cpu::LogitsTopC*>(
      I.work.alloc(ms::cuda::logits_topc_workspace_bytes(cfg_.max_logit_rows)));
  I.temperature_dev = static_cast<float*>(I.work.alloc(static_cast<size_t>(cfg_.max_logit_rows) * 4));
  CUDA_CHECK(cudaMallocHost(&I.summaries_host, summary_bytes));
  CUDA_CHECK(cudaMallocHost(&I.temperature_host, static_cast<size_t>(cfg_.max_logit_rows) * 4));
  I.buckets = opt_.cuda_graphs
                  ? cuda_graph_buckets(std::min<int>(
                        opt_.cuda_graph_max_bs, static_cast<int>(std::min(cfg_.max_seqs, cfg_.max_tokens))))
                  : std::vector<int>{};
  CUDA_CHECK(cudaStreamSynchronize(I.stream));
  if (!opt_.quiet)
    MS_LOG_INFO(
        "cuda executor on {}: weights {:.2f} GiB, workspace {:.2f} GiB, KV {} pages of {} ({:.2f} GiB, {}), "
        "graphs for decode batches up to {}, programmatic dependent launch {}",
        I.backend.device_name(), I.weights.reserved() / 1073741824.0, I.work.reserved() / 1073741824.0,
        cfg_.num_pages, cfg_.page_size, I.kv.reserved() / 1073741824.0,
        kv::kv_cache_dtype_name(cfg_.kv_cache_dtype), I.buckets.empty() ? 0 : I.buckets.back(),
        ms::cuda::pdl_active() ? "on" : "off");
}

CudaExecutor::~CudaExecutor() {
  if (impl_ && impl_->stream) cudaStreamSynchronize(impl_->stream);
}

KvCapacity CudaExecutor::kv_capacity() const {
  const kv::KvPool& p = *impl_->pool;
  return {p.config().num_pages, p.config().page_size, p.config().dtype, p.bytes()};
}

CudaExecutor::Memory CudaExecutor::memory() const {
  return {impl_->weights.reserved(), impl_->kv.reserved(), impl_->work.reserved(),
          impl_->backend.scratch_bytes()};
}

std::unique_ptr<profiler::TimerBackend> CudaExecutor::make_timer() const {
  return make_cuda_event_timer(impl_->stream);
}

Tensor CudaExecutor::logits_to_host(const Tensor& dev, int64_t rows) {
  Impl& I = *impl_;
  const int64_t vocab = model_->config().vocab_size;
  if (rows > 0)
    CUDA_CHECK(cudaMemcpyAsync(I.logits_host, dev.raw(), static_cast<size_t>(rows * vocab) * 4,
                               cudaMemcpyDeviceToHost, I.stream));
  CUDA_CHECK(cudaStreamSynchronize(I.stream));
  return Tensor::borrow(I.logits_host, {rows, vocab}, DType::F32);
}

void CudaExecutor::rows_to_host(const Tensor& dev, int64_t rows, const LogitsRequest& req, StepLogits& out) {
  Impl& I = *impl_;
  const int64_t vocab = model_->config().vocab_size;
  MS_CHECK(req.summary.empty() || static_cast<int64_t>(req.summary.size()) == rows,
           "run_rows: the request covers {} rows, the step has {}", req.summary.size(), rows);
  MS_CHECK(req.summary.empty() || req.temperature.size() == req.summary.size(),
           "run_rows: {} temperatures for {} rows", req.temperature.size(), req.summary.size());
  bool any = false;
  for (uint8_t f : req.summary) any |= f != 0;
  // Full rows: consecutive ones in one copy (all of them, without summaries: the copy run() makes).
  out.full_index.assign(static_cast<size_t>(rows), -1);
  int64_t n_full = 0;
  const char* src = static_cast<const char*>(dev.raw());
  const size_t row_bytes = static_cast<size_t>(vocab) * 4;
  for (int64_t i = 0; i < rows;) {
    if (any && req.summary[i]) {
      ++i;
      continue;
    }
    int64_t j = i;
    while (j < rows && !(any && req.summary[j])) out.full_index[j++] = static_cast<int32_t>(n_full++);
    const int64_t dst_row = n_full - (j - i);
    CUDA_CHECK(cudaMemcpyAsync(I.logits_host + dst_row * vocab, src + i * row_bytes,
                               static_cast<size_t>(j - i) * row_bytes, cudaMemcpyDeviceToHost, I.stream));
    i = j;
  }
  if (any) {
    for (int64_t i = 0; i < rows; ++i) I.temperature_host[i] = req.summary[i] ? req.temperature[i] : 1.0f;
    CUDA_CHECK(cudaMemcpyAsync(I.temperature_dev, I.temperature_host, static_cast<size_t>(rows) * 4,
                               cudaMemcpyHostToDevice, I.stream));
    kernels::cpu::LogitsTopCParams p;
    p.logits = dev.data<float>();
    p.stride = vocab;
    p.temperature = I.temperature_dev;
    p.out = I.summaries_dev;
    p.rows = rows;
    p.vocab = vocab;
    ms::cuda::logits_topc(p, I.stream, I.summaries_ws, cfg_.max_logit_rows);
    CUDA_CHECK(cudaMemcpyAsync(I.summaries_host, I.summaries_dev,
                               static_cast<size_t>(rows) * sizeof(kernels::cpu::LogitsTopC),
                               cudaMemcpyDeviceToHost, I.stream));
  }
  CUDA_CHECK(cudaStreamSynchronize(I.stream));
  out.full = Tensor::borrow(I.logits_host, {n_full, vocab}, DType::F32);
  out.summaries = any ? std::span<const kernels::cpu::LogitsTopC>(I.summaries_host, static_cast<size_t>(rows))
                      : std::span<const kernels::cpu::LogitsTopC>{};
  I.last_logits = dev;
  I.last_rows = rows;
  I.last_full = n_full;
  I.last_summarised = any;
}

Tensor CudaExecutor::fetch_rows(std::span<const int32_t> rows) {
  Impl& I = *impl_;
  MS_CHECK(I.last_summarised, "fetch_rows: the last step returned every logits row in full");
  const int64_t vocab = model_->config().vocab_size;
  MS_CHECK(I.last_full + static_cast<int64_t>(rows.size()) <= cfg_.max_logit_rows,
           "fetch_rows: {} rows after {} full ones exceed the {} logit rows", rows.size(), I.last_full,
           cfg_.max_logit_rows);
  // After the step's full rows, so that those stay valid.
  float* dst = I.logits_host + I.last_full * vocab;
  const char* src = static_cast<const char*>(I.last_logits.raw());
  const size_t row_bytes = static_cast<size_t>(vocab) * 4;
  for (size_t j = 0; j < rows.size(); ++j) {
    MS_CHECK(rows[j] >= 0 && rows[j] < I.last_rows, "fetch_rows: row {} is outside the step's {} rows",
             rows[j], I.last_rows);
    CUDA_CHECK(cudaMemcpyAsync(dst + static_cast<int64_t>(j) * vocab, src + rows[j] * row_bytes, row_bytes,
                               cudaMemcpyDeviceToHost, I.stream));
  }
  CUDA_CHECK(cudaStreamSynchronize(I.stream));
  return Tensor::borrow(dst, {static_cast<int64_t>(rows.size()), vocab}, DType::F32);
}

void CudaExecutor::run_eager(const kv::ForwardBatch& b, const model::StepRouting& routing,
                             profiler::OpSink* sink, const TakeLogits& take) {
  Impl& I = *impl_;
  const model::StepInputs in = I.steps.fill(I.ctx, b, routing.decode_tokens);
  const Tensor logits = model_->forward(I.ctx, in, *I.pool, I.ws, routing, sink);
  ++graphs_stats_.eager;
  take(logits, in.n_logit_rows);
}

// A decode step padded to `bucket` rows: the padding rows are sequences of length 0 whose keys go nowhere
// (slot -1), routed plainly (decode flag 0, so they never widen the OEA base set); their logits are dropped.
void CudaExecutor::run_graph(const kv::ForwardBatch& b, const model::StepRouting& routing, int bucket,
                             const TakeLogits& take) {
  Impl& I = *impl_;
  const int n = b.n_tokens();
  kv::ForwardBatch& p = I.padded;
  p.token_ids.assign(b.token_ids.begin(), b.token_ids.end());
  p.positions.assign(b.positions.begin(), b.positions.end());
  p.token_seq.assign(b.token_seq.begin(), b.token_seq.end());
  p.seq_lens.assign(b.seq_lens.begin(), b.seq_lens.end());
  p.slot_mapping.assign(b.slot_mapping.begin(), b.slot_mapping.end());
  p.token_ids.resize(bucket, 0);
  p.positions.resize(bucket, 0);
  p.seq_lens.resize(bucket, 0);
  p.slot_mapping.resize(bucket, -1);
  for (int i = n; i < bucket; ++i) p.token_seq.push_back(i);
  // The host table keeps b's width; the device table has the graph's (StepBuffers::fill copies b's columns).
  p.max_blocks = b.max_blocks;
  p.block_table.assign(b.block_table.begin(), b.block_table.end());
  p.block_table.resize(static_cast<size_t>(bucket) * p.max_blocks, -1);
  p.logit_rows.resize(bucket);
  std::iota(p.logit_rows.begin(), p.logit_rows.end(), 0);
  I.padded_mask.assign(bucket, 0);
  std::fill_n(I.padded_mask.begin(), n, 1);
  model::StepRouting r = routing;
  r.decode_tokens = I.padded_mask;

  const model::StepInputs in = I.steps.fill(I.ctx, p, r.decode_tokens, I.graph_max_blocks);
  // A DSA model's short steps skip the indexer (Model::dsa_dense_step): a graph of its own.
  const int key = bucket * 2 + (model_->dsa_dense_step(p) ? 1 : 0);
  auto it = I.graphs.find(key);
  if (it == I.graphs.end()) {
    // First step of this bucket: run it op by op (sizes every scratch buffer, builds the expert tables and
    // cuBLASLt plans), then capture the same launches for the next steps.
    const Tensor logits = model_->forward(I.ctx, in, *I.pool, I.ws, r, nullptr);
    take(logits, n);
    ++graphs_stats_.eager;
    cudaGraph_t g = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(I.stream, cudaStreamCaptureModeThreadLocal));
    Tensor captured;
    try {
      captured = model_->forward(I.ctx, in, *I.pool, I.ws, r, nullptr);
    } catch (...) {
      cudaStreamEndCapture(I.stream, &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    CUDA_CHECK(cudaStreamEndCapture(I.stream, &g));
    int64_t prog = 0;
    try {
      prog = static_cast<int64_t>(ms::cuda::graph_edge_count(g).programmatic);
    } catch (...) {
      cudaGraphDestroy(g);
      throw;
    }
    Impl::Graph graph;
    const cudaError_t err = cudaGraphInstantiate(&graph.exec, g, 0);
    cudaGraphDestroy(g);
    if (err != cudaSuccess)
      MS_THROW("cudaGraphInstantiate for decode batch {}: {}", bucket, cudaGetErrorString(err));
    graph.logits = captured;
    I.graphs.emplace(key, graph);
    // The graph replays into today's scratch buffers: a later, larger prefill must not free them.
    I.backend.keep_replaced_buffers();
    ++graphs_stats_.captured;
    graphs_stats_.programmatic_edges += prog;
    return;
  }
  CUDA_CHECK(cudaGraphLaunch(it->second.exec, I.stream));
  ++graphs_stats_.replays;
  take(it->second.logits, n);
}

void CudaExecutor::check_batch(const kv::ForwardBatch& b, const model::StepRouting& routing) const {
  model_->check_batch(b, *impl_->pool, routing);
}

Tensor CudaExecutor::run(const kv::ForwardBatch& b, const model::StepRouting& routing,
                         profiler::OpSink* sink) {
  Tensor out;
  forward(b, routing, sink, [&](const Tensor& dev, int64_t rows) { out = logits_to_host(dev, rows); });
  impl_->last_summarised = false;
  return out;
}

void CudaExecutor::run_rows(const kv::ForwardBatch& b, const LogitsRequest& req, StepLogits& out,
                            const model::StepRouting& routing, profiler::OpSink* sink) {
  impl_->last_summarised = false;
  forward(b, routing, sink, [&](const Tensor& dev, int64_t rows) { rows_to_host(dev, rows, req, out); });
}

void CudaExecutor::forward(const kv::ForwardBatch& b, const model::StepRouting& routing,
                           profiler::OpSink* sink, const TakeLogits& take) {
  Impl& I = *impl_;
  model_->check_batch(b, *I.pool, routing);
  const int n = b.n_tokens();
  bool graph =
      !I.buckets.empty() && sink == nullptr && routing.expert_stats == nullptr &&
      routing.expert_distribution == nullptr && !model_->options().indexer_probe &&
      !model_->options().router_probe && n == b.n_seqs() && n <= I.buckets.back() &&
      b.max_blocks <= I.graph_max_blocks && static_cast<int>(b.logit_rows.size()) == n &&
      static_cast<int>(routing.decode_tokens.size()) == n &&
      std::all_of(routing.decode_tokens.begin(), routing.decode_tokens.end(), [](uint8_t f) { return f; });
  for (int i = 0; graph && i < n; ++i) graph = b.logit_rows[i] == i && b.token_seq[i] == i;
  if (!graph) return run_eager(b, routing, sink, take);
  const int bucket = *std::lower_bound(I.buckets.begin(), I.buckets.end(), n);
  run_graph(b, routing, bucket, take);
}

std::unique_ptr<Executor> make_cuda_executor(const model::Model& host_model, ExecutorConfig cfg,
                                             CudaExecutorOptions opt) {
  return std::make_unique<CudaExecutor>(host_model, cfg, opt);
}

void* CudaExecutor::stream() const {
  return impl_->stream;
}

void* cuda_executor_stream(const Executor& e) {
  MS_CHECK(e.name() == "cuda", "cuda_executor_stream: the executor is '{}', not cuda", e.name());
  return static_cast<const CudaExecutor&>(e).stream();
}

std::unique_ptr<Executor> make_cuda_executor(const io::ModelConfig& mc, const model::TensorSource& weights,
                                             double weight_bytes, ExecutorConfig cfg,
                                             CudaExecutorOptions opt) {
  return std::make_unique<CudaExecutor>(mc, weights, weight_bytes, cfg, opt);
}

}  // namespace ms::runtime::cuda
#else
#include "core/error.h"
#include "runtime/cuda/cuda_executor.h"

namespace ms::runtime::cuda {

std::unique_ptr<Executor> make_cuda_executor(const model::Model&, ExecutorConfig, CudaExecutorOptions) {
  MS_THROW("--device cuda: this build of moeserve has no CUDA backend (configure with -DMOESERVE_CUDA=ON)");
}

std::unique_ptr<Executor> make_cuda_executor(const io::ModelConfig&, const model::TensorSource&, double,
                                             ExecutorConfig, CudaExecutorOptions) {
  MS_THROW("--device cuda: this build of moeserve has no CUDA backend (configure with -DMOESERVE_CUDA=ON)");
}

void* cuda_executor_stream(const Executor&) {
  MS_THROW("--device cuda: this build of moeserve has no CUDA backend (configure with -DMOESERVE_CUDA=ON)");
}

}  // namespace ms::runtime::cuda
#endif
