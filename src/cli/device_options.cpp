#include "cli/device_options.h"

#include "cli/rank_processes.h"
#include "core/error.h"
#include "ops/cuda_backend.h"
#include "runtime/cpu_executor.h"
#include "runtime/cuda/cuda_executor.h"
#include "runtime/cuda/cuda_plan_staging.h"
#include "runtime/local_parallel_executor.h"

namespace ms::cli {

void add_device_options(CLI::App& sub, DeviceOptions& o) {
  sub.add_option("--device", o.device, "auto (cuda where a GPU is visible), cuda or cpu")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}))
      ->capture_default_str();
  sub.add_flag("--disable-cuda-graph", o.disable_cuda_graph,
               "Run decode steps op by op instead of from CUDA graphs");
  sub.add_flag("--disable-pdl", o.disable_pdl,
               "Launch kernels plainly instead of as programmatic dependents (sm_90+: a kernel's launch and "
               "prologue overlap the previous kernel's tail); MOESERVE_DISABLE_PDL=1 does the same");
  sub.add_flag(
      "--disable-shared-expert-fusion", o.disable_shared_expert_fusion,
      "On the GPU, run each MoE layer's shared expert as a separate MLP instead of as one more expert "
      "of the grouped expert kernels (every token routed to it with weight 1)");
  sub.add_flag(
      "--dsa-index-every-step", o.dsa_index_every_step,
      "On the GPU, DSA models (GLM-5, DeepSeek-V3.2) run the indexer on every step; by default a step "
      "whose every query sees at most index_topk keys attends densely over all of them (what the "
      "indexer would select) and only writes the index keys");
  sub.add_option("--cuda-graph-max-bs", o.cuda_graph_max_bs,
                 "Largest decode batch replayed from a CUDA graph")
      ->capture_default_str();
  sub.add_option("--gpu-sampling", o.gpu_sampling,
                 "on: rows whose sampling allows it come back from the GPU as their top 128 tokens and sums "
                 "instead of full logits (the same tokens); off: every row in full")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  sub.add_option("--gpu-sampling-min-rows", o.gpu_sampling_min_rows,
                 "With --gpu-sampling on: steps with fewer sampling rows than this copy every row in full "
                 "(1: every step; a larger value sends small steps' rows whole)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub.add_option("--attention-backend", o.attention_backend,
                 "auto, or one of `moeserve backends` (attention): mla_general, mla_fp8_decode, "
                 "mla_decode_sm90, mla_decode_wgmma")
      ->capture_default_str();
  sub.add_option("--moe-runner-backend", o.moe_runner_backend,
                 "auto, or one of `moeserve backends` (moe): grouped")
      ->capture_default_str();
}

std::string resolve_device(const DeviceOptions& o) {
  if (o.device == "cpu") return "cpu";
  const bool built = ops::cuda_backend_built();
  const int n = built ? ops::cuda_device_count() : 0;
  if (o.device == "cuda") {
    MS_CHECK(built,
             "--device cuda: this build of moeserve has no CUDA backend (configure with -DMOESERVE_CUDA=ON "
             "on a machine with the CUDA toolkit)");
    MS_CHECK(n > 0,
             "--device cuda: no CUDA device is visible (no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides "
             "them); use --device cpu");
    return "cuda";
  }
  return n > 0 ? "cuda" : "cpu";
}

namespace {

// The resolved device, once the backends asked for are known to exist and to run there.
std::string checked_device(const DeviceOptions& o) {
  MS_CHECK(o.attention_backend == "auto" || o.attention_backend == "mla_general" ||
               o.attention_backend == "mla_fp8_decode" || o.attention_backend == "mla_decode_sm90" ||
               o.attention_backend == "mla_decode_wgmma" || o.attention_backend == "cpu",
           "--attention-backend '{}' is not one of auto, mla_general, mla_fp8_decode, mla_decode_sm90, "
           "mla_decode_wgmma, cpu (see "
           "`moeserve "
           "backends`)",
           o.attention_backend);
  MS_CHECK(
      o.moe_runner_backend == "auto" || o.moe_runner_backend == "grouped" || o.moe_runner_backend == "cpu",
      "--moe-runner-backend '{}' is not one of auto, grouped, cpu (see `moeserve backends`)",
      o.moe_runner_backend);
  const std::string dev = resolve_device(o);
  if (dev == "cpu") {
    MS_CHECK(o.attention_backend == "auto" || o.attention_backend == "cpu",
             "--attention-backend {} runs on the GPU; with --device cpu use auto or cpu",
             o.attention_backend);
    MS_CHECK(o.moe_runner_backend == "auto" || o.moe_runner_backend == "cpu",
             "--moe-runner-backend {} runs on the GPU; with --device cpu use auto or cpu",
             o.moe_runner_backend);
  } else {
    MS_CHECK(o.attention_backend != "cpu" && o.moe_runner_backend != "cpu",
             "the cpu backends run with --device cpu, not on the GPU");
  }
  return dev;
}

runtime::cuda::CudaExecutorOptions cuda_options(const DeviceOptions& o) {
  runtime::cuda::CudaExecutorOptions co;
  co.cuda_graphs = !o.disable_cuda_graph;
  co.pdl = !o.disable_pdl;
  co.fuse_shared_expert = !o.disable_shared_expert_fusion;
  co.dsa_dense_when_short = !o.dsa_index_every_step;
  co.cuda_graph_max_bs = o.cuda_graph_max_bs;
  co.attention_kernel = o.attention_backend;
  return co;
}

}  // namespace

namespace {

std::unique_ptr<runtime::Engine> make_engine_from(std::shared_ptr<model::Model> model,
                                                  const model::LoadedModel* lm, runtime::EngineConfig cfg,
                                                  const DeviceOptions& o, double mem_fraction) {
  const std::string dev = checked_device(o);
  cfg.logits_summaries = o.gpu_sampling == "on";
  cfg.logits_summary_min_rows = o.gpu_sampling_min_rows;
  const bool device_weights = lm && lm->device_weights;
  MS_CHECK(dev == "cuda" || !device_weights,
           "the model's weights are to be made on the GPU (--load-format dummy with --device cuda) but the "
           "engine runs on the cpu");
  if (RankProcess* rp = rank_process(); rp && lm && lm->model->shard().sharded()) {
    MS_CHECK(dev == rp->device, "rank processes were set up for {} but the engine runs on {}", rp->device,
             dev);
    const int64_t ctx = cfg.max_context > 0 ? cfg.max_context : model->config().max_position_embeddings;
    const int64_t tokens = cfg.kv_cache_tokens > 0 ? cfg.kv_cache_tokens : int64_t{cfg.max_running} * ctx;
    runtime::ExecutorConfig ec = runtime::executor_config_for(
        *model, cfg.page_size, tokens, cfg.kv_cache_dtype, cfg.max_running, cfg.max_prefill_tokens, ctx);
    if (dev == "cpu") {
      auto local = std::make_unique<runtime::CpuExecutor>(model, ec);
      local->set_comm(rp->comm.get());
      return rank_process_engine(*rp, std::move(local), cfg, nullptr);
    }
    // Every rank must have the same pages (rank 0 schedules for all); sized from free memory they may not.
    MS_CHECK(cfg.kv_cache_tokens > 0,
             "GPU rank processes size the KV cache from --kv-cache-tokens (every rank must hold the same "
             "pages); give it");
    runtime::cuda::CudaExecutorOptions co = cuda_options(o);
    co.comm = rp->comm.get();
    auto local = runtime::cuda::make_cuda_executor(*model, ec, co);
    auto staging = runtime::cuda::make_cuda_plan_staging(runtime::cuda::cuda_executor_stream(*local));
    return rank_process_engine(*rp, std::move(local), cfg, std::move(staging));
  }
  if (lm && !lm->shards.empty()) {
    MS_CHECK(dev == "cpu", "a model split over ranks runs on the cpu here (ranks as threads)");
    const int64_t ctx = cfg.max_context > 0 ? cfg.max_context : model->config().max_position_embeddings;
    const int64_t tokens = cfg.kv_cache_tokens > 0 ? cfg.kv_cache_tokens : int64_t{cfg.max_running} * ctx;
    runtime::ExecutorConfig ec = runtime::executor_config_for(
        *model, cfg.page_size, tokens, cfg.kv_cache_dtype, cfg.max_running, cfg.max_prefill_tokens, ctx);
    std::vector<std::shared_ptr<const model::Model>> ranks(lm->shards.begin(), lm->shards.end());
    return std::make_unique<runtime::Engine>(std::make_unique<runtime::LocalParallelExecutor>(ranks, ec),
                                             cfg);
  }
  if (dev == "cpu") return std::make_unique<runtime::Engine>(std::move(model), cfg);
  const int64_t ctx = cfg.max_context > 0 ? cfg.max_context : model->config().max_position_embeddings;
  const int64_t tokens = cfg.kv_cache_tokens > 0 ? cfg.kv_cache_tokens : cfg.page_size;
  runtime::ExecutorConfig ec = runtime::executor_config_for(*model, cfg.page_size, tokens, cfg.kv_cache_dtype,
                                                            cfg.max_running, cfg.max_prefill_tokens, ctx);
  runtime::cuda::CudaExecutorOptions co = cuda_options(o);
  co.mem_fraction_static = mem_fraction;
  if (cfg.kv_cache_tokens <= 0) {
    ec.num_pages = 0;  // from the memory fraction
    co.max_pages = static_cast<int64_t>(cfg.max_running) * ((ctx + cfg.page_size - 1) / cfg.page_size) + 1;
  }
  auto exec = device_weights ? runtime::cuda::make_cuda_executor(model->config(), *lm->device_weights,
                                                                 lm->device_weight_bytes, ec, co)
                             : runtime::cuda::make_cuda_executor(*model, ec, co);
  return std::make_unique<runtime::Engine>(std::move(exec), cfg);
}

}  // namespace

std::unique_ptr<runtime::Engine> make_engine(std::shared_ptr<model::Model> model, runtime::EngineConfig cfg,
                                             const DeviceOptions& o, double mem_fraction) {
  return make_engine_from(std::move(model), nullptr, cfg, o, mem_fraction);
}

std::unique_ptr<runtime::Engine> make_engine(const model::LoadedModel& lm, runtime::EngineConfig cfg,
                                             const DeviceOptions& o, double mem_fraction) {
  return make_engine_from(lm.model, &lm, cfg, o, mem_fraction);
}

std::unique_ptr<runtime::Executor> make_executor(const model::Model& model,
                                                 const runtime::ExecutorConfig& cfg, const DeviceOptions& o) {
  MS_CHECK(o.tp_size == 1 && o.ep_size == 1,
           "--tp-size / --ep-size apply to serve, generate, bench-one-batch and profile");
  const std::string dev = checked_device(o);
  if (dev == "cpu")
    return std::make_unique<runtime::CpuExecutor>(
        std::shared_ptr<const model::Model>(&model, [](const model::Model*) {}), cfg);
  return runtime::cuda::make_cuda_executor(model, cfg, cuda_options(o));
}

}  // namespace ms::cli
