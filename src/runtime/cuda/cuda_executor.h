// The CUDA executor: the model's weights on one GPU in their stored formats, the KV pages, the step buffers
// and the Workspace in device memory allocated once, the ops' CUDA backend on one stream, and decode steps
// replayed from CUDA graphs captured per batch-size bucket. Logits rows come back to pinned host memory for
// the Engine's sampler.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/step_inputs.h"
#include "model/tensor_source.h"
#include "model/workspace.h"
#include "ops/cuda_backend.h"
#include "profiler/timer.h"
#include "runtime/executor.h"

namespace ms::runtime::cuda {

struct CudaExecutorOptions {
  bool cuda_graphs = true;     // --disable-cuda-graph turns it off
  int cuda_graph_max_bs = 64;  // --cuda-graph-max-bs: largest decode batch replayed from a graph
  // Our kernels launch as programmatic dependents on sm_90+ (kernels/cuda/common/pdl.h), their launch and
  // prologue overlapping the previous kernel's tail; --disable-pdl turns it off. Process-wide (set when the
  // executor is made); MOESERVE_DISABLE_PDL=1 in the environment turns it off whatever this says.
  bool pdl = true;
  // Each MoE layer's shared expert runs inside the grouped experts' launches as one more expert every token
  // takes (model::ModelOptions::fuse_shared_expert, where widths and formats allow);
  // --disable-shared-expert-fusion runs it as a separate MLP.
  bool fuse_shared_expert = true;
  // DSA models: steps whose every query sees at most index_topk keys attend densely and skip the indexer's
  // query side (model::ModelOptions::dsa_dense_when_short); --dsa-index-every-step turns it off.
  bool dsa_dense_when_short = true;
  bool quiet = false;  // no load log lines
  // With ExecutorConfig::num_pages 0: the share of the GPU's memory for weights, workspace and KV pages
  // together (--mem-fraction-static); the KV pages take what the weights and the workspace leave.
  double mem_fraction_static = 0.85;
  int64_t max_pages = 0;  // with num_pages 0: at most this many pages (0: no cap)
  // --attention-backend: auto, mla_general, mla_fp8_decode, mla_decode_sm90 or mla_decode_wgmma.
  std::string attention_kernel = "auto";
  // f32 math in every linear layer (prefill GEMMs otherwise take bf16 activations): parity tests.
  bool exact_linear = false;
  // The group of a model split over ranks (dist::connect_nccl's NcclComm; not owned, must outlive the
  // executor): the forward's collectives run on the executor's stream. Null for a whole model.
  dist::Communicator* comm = nullptr;
};

// What graphs did, for tests and /metrics: a test proves capture happened (no silent fallback).
struct GraphStats {
  int64_t captured = 0;  // graphs captured (one per bucket)
  int64_t replays = 0;   // steps run by replaying a graph
  int64_t eager = 0;     // steps run op by op
  // Edges of the captured graphs (all of them together) that let a kernel start before its predecessor ends
  // (programmatic dependent launch, kernels/cuda/common/pdl.h): 0 with --disable-pdl or before sm_90.
  int64_t programmatic_edges = 0;
};

class CudaExecutor final : public Executor {
 public:
  // Copies host_model's weights to the current GPU (progress bar, GB/s) and allocates everything the config
  // asks for; refuses with what to change when it does not fit.
  CudaExecutor(const model::Model& host_model, ExecutorConfig cfg, CudaExecutorOptions opt = {});
  // The model of `mc` with its weights built on the GPU tensor by tensor from `weights` (--load-format dummy:
  // a RandomSource), never whole in host memory; `weight_bytes` (their stored size) reserves the arena.
  CudaExecutor(const io::ModelConfig& mc, const model::TensorSource& weights, double weight_bytes,
               ExecutorConfig cfg, CudaExecutorOptions opt = {}, model::ModelOptions mopt = {});
  ~CudaExecutor() override;

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::CUDA; }
  KvCapacity kv_capacity() const override;
  const model::Model& model() const override { return *model_; }
  const ExecutorConfig& config() const override { return cfg_; }
  Tensor run(const kv::ForwardBatch& b, const model::StepRouting& routing = {},
             profiler::OpSink* sink = nullptr) override;
  void check_batch(const kv::ForwardBatch& b, const model::StepRouting& routing = {}) const override;
  // Summary rows: kernels/cuda/sampling/logits_topc over the step's logits (after the graph replay, on the
  // executor's stream, temperatures through pinned staging), 1056 bytes per row to the host; full rows are
  // copied alone. Full rows stay valid until the next run, fetch_rows included.
  void run_rows(const kv::ForwardBatch& b, const LogitsRequest& req, StepLogits& out,
                const model::StepRouting& routing = {}, profiler::OpSink* sink = nullptr) override;
  bool supports_summaries() const override { return true; }
  Tensor fetch_rows(std::span<const int32_t> rows) override;

  const GraphStats& graph_stats() const { return graphs_stats_; }
  // The profiler's timer for this executor's stream (CUDA events).
  std::unique_ptr<profiler::TimerBackend> make_timer() const override;
  // Device memory by role, bytes.
  struct Memory {
    size_t weights = 0, kv = 0, workspace = 0, scratch = 0;
  };
  Memory memory() const;
  void* stream() const;  // the cudaStream_t every op and collective of this executor runs on

  struct Impl;

 private:
  CudaExecutor(const io::ModelConfig& mc, const model::ModelOptions& mopt,
               const std::function<model::ModelWeights(Impl&)>& make_weights, ExecutorConfig cfg,
               CudaExecutorOptions opt);
  // Device logits f32 [rows, vocab] of a step, handed to `take` once (before a first graph capture).
  using TakeLogits = std::function<void(const Tensor& dev, int64_t rows)>;
  void forward(const kv::ForwardBatch& b, const model::StepRouting& routing, profiler::OpSink* sink,
               const TakeLogits& take);
  void run_eager(const kv::ForwardBatch& b, const model::StepRouting& routing, profiler::OpSink* sink,
                 const TakeLogits& take);
  void run_graph(const kv::ForwardBatch& b, const model::StepRouting& routing, int bucket,
                 const TakeLogits& take);
  Tensor logits_to_host(const Tensor& dev, int64_t rows);
  void rows_to_host(const Tensor& dev, int64_t rows, const LogitsRequest& req, StepLogits& out);

  ExecutorConfig cfg_;
  CudaExecutorOptions opt_;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<const model::Model> model_;
  GraphStats graphs_stats_;
};

// A CudaExecutor; in a build without CUDA, throws saying so.
std::unique_ptr<Executor> make_cuda_executor(const model::Model& host_model, ExecutorConfig cfg,
                                             CudaExecutorOptions opt = {});

// A CudaExecutor over weights made tensor by tensor from `weights` (see the constructor); in a build without
// CUDA, throws saying so.
std::unique_ptr<Executor> make_cuda_executor(const io::ModelConfig& mc, const model::TensorSource& weights,
                                             double weight_bytes, ExecutorConfig cfg,
                                             CudaExecutorOptions opt = {});

// The cudaStream_t (as void*) of a CudaExecutor, for runtime::cuda::make_cuda_plan_staging; throws for
// another executor or in a build without CUDA.
void* cuda_executor_stream(const Executor& e);

// Batch-size buckets a decode step is padded to for graph replay, up to max_bs.
std::vector<int> cuda_graph_buckets(int max_bs);

}  // namespace ms::runtime::cuda
