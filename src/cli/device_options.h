// The device flags every engine command shares (--device, --disable-cuda-graph, --disable-pdl,
// --cuda-graph-max-bs, --attention-backend, --moe-runner-backend) and the one place that builds an Engine on
// the chosen device.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>

#include "model/load_model.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/executor.h"

namespace ms::cli {

struct DeviceOptions {
  std::string device = "auto";  // auto: cuda where a GPU is visible and the build has CUDA, else cpu
  bool disable_cuda_graph = false;
  bool disable_pdl = false;  // --disable-pdl: kernels launch plainly (CudaExecutorOptions::pdl)
  // --disable-shared-expert-fusion: the shared expert as its own MLP
  // (CudaExecutorOptions::fuse_shared_expert)
  bool disable_shared_expert_fusion = false;
  // --dsa-index-every-step: DSA models run the indexer on short steps too
  // (CudaExecutorOptions::dsa_dense_when_short off)
  bool dsa_index_every_step = false;
  int cuda_graph_max_bs = 64;
  std::string attention_backend = "auto", moe_runner_backend = "auto";
  // --gpu-sampling on|off: candidate summaries of logits rows from the GPU (EngineConfig::logits_summaries).
  std::string gpu_sampling = "on";
  int gpu_sampling_min_rows = 1;  // runtime::EngineConfig::logits_summary_min_rows
  // --tp-size / --ep-size (serve, generate, bench-one-batch, profile): the model split over ranks. On the CPU
  // the ranks are threads of this process (runtime::LocalParallelExecutor) unless rank_processes; on the GPU
  // they are always processes (cli/rank_processes.h).
  int tp_size = 1, ep_size = 1;
  // --rank-processes: one process per rank (cli/rank_processes.h), as under a launcher.
  bool rank_processes = false;
  // --nnodes / --node-rank / --dist-init-addr host:port: the ranks spread over nodes, each node's first
  // process starting its node's ranks; rank 0's node listens on the address (the TCP rendezvous of the NCCL
  // id or of the CPU's TcpComm). Any of them implies rank_processes. Unset: 1 node, node 0 (or a launcher's).
  std::optional<int> nnodes, node_rank;
  std::string dist_init_addr;
  // --dist-timeout: seconds a rank waits for the others to join, and for a collective, before failing.
  int dist_timeout_s = 300;
};

void add_device_options(CLI::App& sub, DeviceOptions& o);

// "cpu" or "cuda", resolved; `--device cuda` without a GPU or without a CUDA build throws at once, saying
// which.
std::string resolve_device(const DeviceOptions& o);

// An Engine on the resolved device. On the GPU, a KV size of 0 tokens (cfg.kv_cache_tokens <= 0) means: what
// mem_fraction of the GPU's memory leaves after the weights and the workspace, capped at max running
// requests x context.
std::unique_ptr<runtime::Engine> make_engine(std::shared_ptr<model::Model> model, runtime::EngineConfig cfg,
                                             const DeviceOptions& o, double mem_fraction = 0.85);

// The same for a loaded model: with LoadedModel::device_weights (--load-format dummy on the GPU), the
// CudaExecutor builds the weights on the GPU tensor by tensor from that source.
std::unique_ptr<runtime::Engine> make_engine(const model::LoadedModel& lm, runtime::EngineConfig cfg,
                                             const DeviceOptions& o, double mem_fraction = 0.85);

// An Executor alone (no Engine) on the resolved device, for the commands that drive batches themselves
// (logits, perplexity, moe-eval): a CpuExecutor over `model` (which must outlive it), or a CudaExecutor with
// the model's weights copied to the GPU; `cfg` sizes everything, KV pages included.
std::unique_ptr<runtime::Executor> make_executor(const model::Model& model,
                                                 const runtime::ExecutorConfig& cfg, const DeviceOptions& o);

}  // namespace ms::cli
