#include "cli/engine_flags.h"

#include <algorithm>

#include "cli/rank_processes.h"
#include "dist/memory_plan.h"
#include "io/model_config.h"
#include "io/quant_config.h"
#include "model/weight_spec.h"
#include "runtime/kv_budget.h"
#if MOESERVE_HAVE_CUDA
#include "runtime/cuda/device_arena.h"
#endif
#include "core/error.h"
#include "core/log.h"
#include "model/random_weights.h"

namespace ms::cli {

void add_engine_flags(CLI::App& sub, EngineFlags& f, unsigned groups) {
  using namespace engine_flag;
  if (groups & kDevice) add_device_options(sub, f.dev);
  if (groups & kModel)
    sub.add_option("--model", f.model_dir, "Hugging Face checkpoint directory (default: the built-in model)");
  if (groups & kLoadFormat) {
    sub.add_option(
           "--load-format", f.load_format,
           "auto (the checkpoint's weights) or dummy (random weights from --model's config.json alone, "
           "to time a model without its checkpoint)")
        ->capture_default_str();
    sub.add_option("--quantization", f.quantization,
                   "With --load-format dummy: nvfp4, fp8 (128x128 blocks) or bf16; the checkpoint's own "
                   "quantization config is ignored")
        ->capture_default_str();
    sub.add_option("--tp-size", f.dev.tp_size,
                   "Tensor parallel ranks: attention heads and dense MLPs split over them (CPU: threads of "
                   "this process, or processes with --rank-processes; GPU: one process per GPU)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    sub.add_option("--ep-size", f.dev.ep_size,
                   "Expert parallel ranks: routed experts split over them (equal to --tp-size when both "
                   "are above 1)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    sub.add_flag("--rank-processes", f.dev.rank_processes,
                 "With --tp-size/--ep-size: one process per rank (this one is rank 0 and starts the others; "
                 "CPU ranks talk over TCP), the layout of GPU runs. Implied under torchrun, mpirun or srun");
    sub.add_option("--nnodes", f.dev.nnodes,
                   "Nodes the --tp-size/--ep-size ranks spread over (default 1), the same number of ranks on "
                   "each; start the command on every node with its --node-rank. Implies --rank-processes");
    sub.add_option("--node-rank", f.dev.node_rank,
                   "This node's index, 0..nnodes-1 (default 0); node 0 runs rank 0: the HTTP server, "
                   "tokenizer and scheduler");
    sub.add_option("--dist-init-addr", f.dev.dist_init_addr,
                   "host:port where rank 0 (node 0) listens for the other ranks to join (needed with "
                   "--nnodes above 1; one node: 127.0.0.1 and a free port)");
    sub.add_option("--dist-timeout", f.dev.dist_timeout_s,
                   "Seconds a rank waits for the others to join, or for a collective, before the run fails "
                   "naming the missing ranks")
        ->check(CLI::Range(1, 86400))
        ->capture_default_str();
    add_expert_placement_flags(sub, f.eplb);
  }
  if (groups & kKvCacheDtype)
    sub.add_option("--kv-cache-dtype", f.kv_dtype,
                   "auto (the checkpoint's, else bf16), f32 (exact), bf16 or fp8_e4m3")
        ->capture_default_str();
  if (groups & kPageSize)
    sub.add_option("--page-size", f.page_size, "Tokens per KV page")->capture_default_str();
  if (groups & kOea) {
    sub.add_option("--oea-k0", f.oea_k0,
                   "Opportunistic Expert Activation on decode tokens: experts each token keeps (0: off)")
        ->capture_default_str();
    sub.add_option("--oea-kmax", f.oea_kmax, "OEA: slots a token may fill (0: the model's top-k)")
        ->capture_default_str();
  }
  if (groups & kServing) {
    sub.add_option("--max-running-requests", f.max_running, "Requests decoding together at most")
        ->capture_default_str();
    sub.add_option("--max-prefill-tokens", f.max_prefill_tokens,
                   "Prompt tokens per step (longer prompts are prefilled in chunks)")
        ->capture_default_str();
    sub.add_option("--mem-fraction-static", f.mem_fraction,
                   "CPU: the KV cache's share of the memory available after the weights are loaded (default "
                   "0.5); GPU: the share of the GPU's memory for weights, workspace and KV cache together "
                   "(default 0.85). Capped at max running requests x context")
        ->capture_default_str();
    sub.add_option("--context-length", f.context_length,
                   "Tokens per request, prompt and completion (default: the model's)");
  }
  if (groups & kKvCacheTokens)
    sub.add_option("--kv-cache-tokens", f.kv_cache_tokens,
                   (groups & kServing)
                       ? "KV cache size in tokens (overrides --mem-fraction-static)"
                       : "KV pool size in tokens (0: the server's default, or what the run needs)")
        ->capture_default_str();
}

namespace {

// The per-rank memory plan of a sharded run (dist::plan_memory over the checkpoint's stored bytes by role),
// printed by every rank before it loads anything; a set-up that cannot fit is refused with what to change.
// The budget is this rank's GPU on cuda; on the CPU the host's available memory shared by the node's ranks
// (printed there, not enforced).
void plan_rank_memory(const EngineFlags& f, const std::string& device, const dist::LayerPlacements* pl,
                      const std::string& who, int ranks_on_node) {
  const io::ModelConfig cfg = io::load_model_config(f.model_dir);
  const io::QuantConfig quant = io::load_quant_config(f.model_dir);
  DType kv = quant.kv_cache_fp8 ? DType::F8_E4M3 : DType::BF16;
  switch (kv::parse_kv_cache_dtype(f.kv_dtype)) {
    case kv::KvCacheDType::F32:
    case kv::KvCacheDType::FP8E4M3Tile128Sim:
      kv = DType::F32;
      break;
    case kv::KvCacheDType::BF16:
      kv = DType::BF16;
      break;
    case kv::KvCacheDType::FP8E4M3:
      kv = DType::F8_E4M3;
      break;
    default:
      break;
  }
  dist::MemoryOptions o;
  o.tp_size = f.dev.tp_size;
  o.ep_size = f.dev.ep_size;
  if (pl) o.num_redundant_experts = pl->slots_per_rank() * f.dev.ep_size - cfg.n_routed_experts;
  o.page_size = f.page_size;
  o.max_num_tokens = std::max<int64_t>(f.max_prefill_tokens, 1);
  o.max_decode_batch = std::max(f.max_running, 1);
  if (f.kv_cache_tokens > 0) o.min_kv_tokens = std::min<int64_t>(o.min_kv_tokens, f.kv_cache_tokens);
  const char* budget_of = "host memory available to each of the node's ranks";
  if (device == "cuda") {
#if MOESERVE_HAVE_CUDA
    size_t free_b = 0, total_b = 0;
    runtime::cuda::device_memory(free_b, total_b);
    o.gpu_memory_bytes = total_b;
    o.mem_fraction_static = f.mem_fraction > 0 ? f.mem_fraction : 0.85;
    budget_of = "this rank's GPU";
#endif
  } else {
    o.gpu_memory_bytes =
        runtime::available_memory_bytes(Device::CPU) / static_cast<size_t>(std::max(ranks_on_node, 1));
    o.mem_fraction_static = f.mem_fraction > 0 ? f.mem_fraction : 0.85;
  }
  if (o.gpu_memory_bytes == 0) return;  // no device to judge (a build without CUDA refuses cuda elsewhere)
  const dist::MemoryPlan plan = dist::plan_memory(model::parallel_weight_bytes(cfg, quant, kv), o);
  MS_LOG_INFO("{} ({}):\n{}", who, budget_of, dist::format_memory_plan(plan, o));
  // GPU ranks are refused before they allocate; CPU ranks (tests, small models) only print the plan, whose
  // workspace and KV figures are sized for GPU serving.
  if (device == "cuda") dist::require_fits(plan);
}

}  // namespace

model::LoadedModel load_engine_model(const EngineFlags& f) {
  check_node_flags(f.dev);
  const bool sharded = f.dev.tp_size > 1 || f.dev.ep_size > 1;
  if (sharded) {
    const std::string dev = resolve_device(f.dev);
    const bool processes = dev == "cuda" || wants_rank_processes(f.dev);
    MS_CHECK(f.load_format == "auto", "--tp-size / --ep-size need a checkpoint (--load-format auto)");
    MS_CHECK(!f.model_dir.empty(),
             "--tp-size / --ep-size need a checkpoint directory (--model, or the trained built-in model)");
    // Every rank builds the same placement from the same files, before any rank starts; rank 0 saves it.
    std::optional<dist::LayerPlacements> placement;
    if (wants_expert_placement(f.eplb))
      placement = expert_placement_for(f.eplb, io::load_model_config(f.model_dir), f.dev.ep_size);
    const dist::LayerPlacements* pl = placement ? &*placement : nullptr;
    if (processes) {
      model::shard_for_rank(f.dev.tp_size, f.dev.ep_size, 0);  // the sizes, checked before any rank starts
      const RankProcess& rp = start_rank_process(f.dev, dev);
      plan_rank_memory(f, dev, pl, rp.info.rank_name(rp.info.rank), rp.info.local_world_size);
      if (pl && rp.info.rank == 0) save_expert_placement(f.eplb, *pl);
      return model::load_model_shard(f.model_dir, f.dev.tp_size, f.dev.ep_size, rp.info.rank, pl);
    }
    plan_rank_memory(f, dev, pl, "every rank", std::max(f.dev.tp_size, f.dev.ep_size));
    if (pl) save_expert_placement(f.eplb, *pl);
    return model::load_model_sharded(f.model_dir, f.dev.tp_size, f.dev.ep_size, pl);
  }
  MS_CHECK(!wants_expert_placement(f.eplb),
           "--ep-num-redundant-experts, --expert-distribution, --ep-placement and --ep-placement-out need "
           "--ep-size 2 or more");
  if (f.load_format == "auto") {
    MS_CHECK(f.quantization == "bf16",
             "--quantization {} applies to --load-format dummy; a checkpoint keeps its own format",
             f.quantization);
    return model::load_model(f.model_dir);
  }
  MS_CHECK(f.load_format == "dummy", "--load-format '{}' is not one of auto, dummy", f.load_format);
  MS_CHECK(!f.model_dir.empty(),
           "--load-format dummy needs --model (a directory with config.json, or the file)");
  // On the GPU the weights are made there tensor by tensor (make_engine): a full-size model never fits in
  // host memory first.
  const bool on_gpu = resolve_device(f.dev) == "cuda";
  // The commands print the description: the one line saying what was made (format, seed, params, bytes).
  return model::load_dummy(f.model_dir, f.quantization, 0, !on_gpu);
}

kv::KvCacheDType resolve_kv_dtype(const EngineFlags& f, const model::LoadedModel& lm) {
  const kv::KvCacheDType dt = kv::parse_kv_cache_dtype(f.kv_dtype);
  return dt == kv::KvCacheDType::Auto ? lm.kv_auto : dt;
}

std::optional<moe::OeaConfig> oea_config(const EngineFlags& f) {
  MS_CHECK(f.oea_kmax == 0 || f.oea_k0 > 0, "--oea-kmax needs --oea-k0");
  if (f.oea_k0 <= 0) return std::nullopt;
  return moe::OeaConfig{true, f.oea_k0, f.oea_kmax};
}

}  // namespace ms::cli
