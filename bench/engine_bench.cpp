// Engine throughput on the CPU: 512-token prefill and decode at batch 1 and 8, on a model of
// `moeserve gen-model --preset small` dimensions (GLM-5 architecture, bf16 weights, 64 experts top 6).
// The model is built in memory with deterministic weights, or loaded from the checkpoint directory named by
// MS_BENCH_MODEL. Counters: tokens/s, and the batch-1 decode floor (bytes one token reads / the measured
// memory bandwidth) to compare against.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <set>

#include "io/model_config.h"
#include "model/builtin_model.h"
#include "model/load_model.h"
#include "model/weight_loader.h"
#include "model/weight_spec.h"
#include "profiler/ceilings.h"
#include "runtime/engine.h"

namespace {

using namespace ms;

// gen-model --preset small --arch glm5 (see cmd_gen_model.cpp): hidden 1024, 8 layers (1 dense + 7 MoE),
// 64 experts top 6 + 1 shared, vocab 32000.
io::ModelConfig small_config() {
  io::ModelConfig c = model::builtin_model_config();
  c.vocab_size = 32000;
  c.hidden_size = 1024;
  c.intermediate_size = 2816;
  c.moe_intermediate_size = 128;
  c.num_hidden_layers = 8;
  c.num_attention_heads = 8;
  c.max_position_embeddings = 32768;
  c.q_lora_rank = 384;
  c.kv_lora_rank = 256;
  c.qk_nope_head_dim = 96;
  c.qk_rope_head_dim = 32;
  c.v_head_dim = 128;
  c.rope.theta = 1e6;
  c.n_routed_experts = 64;
  c.num_experts_per_tok = 6;
  c.n_shared_experts = 1;
  c.index_n_heads = 8;
  c.index_head_dim = 64;
  c.index_topk = 256;
  c.layer_is_moe.assign(8, true);
  c.layer_is_moe[0] = false;
  c.indexer_types.assign(8, io::IndexerKind::Full);
  c.eos_token_ids.clear();
  return c;
}

std::shared_ptr<model::Model> bench_model() {
  static std::shared_ptr<model::Model> m = [] {
    if (const char* dir = std::getenv("MS_BENCH_MODEL"); dir && *dir) return model::load_model(dir).model;
    io::ModelConfig cfg = small_config();
    auto src = model::builtin_model_weights(cfg, 7);
    model::ModelWeights w = model::load_weights(cfg, *src);
    return std::make_shared<model::Model>(cfg, std::move(w));
  }();
  return m;
}

runtime::EngineConfig engine_config() {
  runtime::EngineConfig ec;
  ec.kv_cache_dtype = kv::KvCacheDType::BF16;
  ec.kv_cache_tokens = 16384;
  ec.max_running = 8;
  ec.max_prefill_tokens = 4096;
  ec.enable_prefix_cache = false;  // the prefill benchmark repeats one prompt: every run must compute it
  return ec;
}

std::vector<int32_t> prompt(int n, int salt, int64_t vocab) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 7919 + salt * 104729 + 17) % vocab));
  return ids;
}

runtime::Request request(std::vector<int32_t> ids, int max_tokens) {
  runtime::Request r;
  r.prompt_ids = std::move(ids);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  return r;
}

// One 512-token prompt, prefilled in one step (the step also samples its first token).
void BM_Prefill512(benchmark::State& state) {
  auto m = bench_model();
  runtime::Engine e(m, engine_config());
  const auto ids = prompt(512, 1, m->config().vocab_size);
  for (auto _ : state) {
    e.submit(request(ids, 1));
    while (e.has_work()) benchmark::DoNotOptimize(e.step());
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 512, benchmark::Counter::kIsRate);
}

// `batch` sequences with 64-token prompts, prefilled before timing; each iteration is one decode step that
// gives every sequence one token.
void BM_Decode(benchmark::State& state) {
  auto m = bench_model();
  const int batch = static_cast<int>(state.range(0));
  runtime::Engine e(m, engine_config());
  for (int b = 0; b < batch; ++b) e.submit(request(prompt(64, b + 2, m->config().vocab_size), 1000));
  // Prefill outside the timing: step until every sequence has its first token (the scheduler may spread
  // the prompts over several steps).
  std::set<uint64_t> started;
  while (static_cast<int>(started.size()) < batch)
    for (const auto& o : e.step())
      if (!o.tokens.empty()) started.insert(o.request_id);
  for (auto _ : state) benchmark::DoNotOptimize(e.step());
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * batch, benchmark::Counter::kIsRate);
  if (batch == 1) {
    const auto specs = model::model_weight_specs(m->config(), io::QuantConfig{});
    const double bytes = static_cast<double>(model::decode_floor_bytes(m->config(), specs));
    static const profiler::Ceilings ceil = profiler::measure_ceilings();
    state.counters["floor_MB"] = bytes / 1e6;
    state.counters["mem_GBps"] = ceil.mem_gbps;
    state.counters["floor_tokens_per_s"] = ceil.mem_gbps * 1e9 / bytes;
  }
}

BENCHMARK(BM_Prefill512)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_Decode)->Arg(1)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

}  // namespace

BENCHMARK_MAIN();
