// The CUDA executor end to end: logits of the golden fixtures (transformers, f32 on the CPU) and of the CPU
// executor on the same inputs; greedy tokens through the Engine with decode steps replayed from CUDA graphs;
// optionally gen-model checkpoints named in MOESERVE_TEST_SLICES (comma-separated directories, e.g. the
// glm5-slice models scripts/gpu-test.sh writes) against the CPU executor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "golden_fixture.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/common/pdl.h"
#include "kv/forward_batch.h"
#include "kv/page_allocator.h"
#include "model/checkpoint_source.h"
#include "model/load_model.h"
#include "model/random_weights.h"
#include "model/weight_loader.h"
#include "profiler/op_record.h"
#include "runtime/cpu_executor.h"
#include "runtime/cuda/cuda_executor.h"
#include "runtime/engine.h"

namespace ms {
namespace {

namespace fs = std::filesystem;

using test::Fixture;
using test::load_fixture;

// max |a - b| / max |b| over n values.
double rel_err(const float* got, const float* want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num = std::max(num, std::fabs(static_cast<double>(got[i]) - want[i]));
    den = std::max(den, std::fabs(static_cast<double>(want[i])));
  }
  return num / den;
}

runtime::ExecutorConfig exec_config(const model::Model& m, kv::KvCacheDType dt, int32_t pages = 64) {
  runtime::ExecutorConfig c = runtime::executor_config_for(m, 16, int64_t{pages} * 16, dt, 8, 512, 0);
  c.max_logit_rows = c.max_tokens;
  return c;
}

// Logits of every position of `ids`: one forward over all of them, or the prompt then one token per step.
// decode_routing: the one-token steps say they are decode tokens (StepRouting::decode_tokens), which is what
// lets the CUDA executor replay them from its graphs.
std::vector<float> run(runtime::Executor& ex, const std::vector<int32_t>& ids, size_t prompt_len, bool decode,
                       bool decode_routing = false) {
  kv::PageAllocator alloc(ex.kv_capacity().num_pages);
  const int32_t ps = ex.kv_capacity().page_size;
  std::vector<int32_t> pages;
  EXPECT_TRUE(alloc.allocate(static_cast<int32_t>((ids.size() + ps - 1) / ps), pages));
  std::vector<float> out;
  const int64_t V = ex.model().config().vocab_size;
  size_t start = 0;
  while (start < ids.size()) {
    const size_t n = !decode ? ids.size() : (start == 0 ? prompt_len : 1);
    kv::ForwardBatchBuilder bb(ps);
    bb.add_sequence(pages, static_cast<int32_t>(start), ids.data() + start, static_cast<int32_t>(n), false);
    kv::ForwardBatch b = bb.finish();
    for (size_t i = 0; i < n; ++i) b.logit_rows.push_back(static_cast<int32_t>(i));
    model::StepRouting routing;
    if (decode_routing && start > 0) routing.decode_tokens.assign(n, 1);
    Tensor lg = ex.run(b, routing);
    out.insert(out.end(), lg.data<float>(), lg.data<float>() + static_cast<int64_t>(n) * V);
    start += n;
  }
  return out;
}

bool have_gpu() {
  return cuda::device_count() > 0;
}

class CudaGolden : public ::testing::TestWithParam<std::string> {};

// Two modes. Exact (CudaExecutorOptions::exact_linear): f32 math everywhere, held to the CPU's tolerance
// against transformers. Default: GEMMs over more than 16 rows take bf16 activations (cuBLASLt); on these
// random tiny models, whose logits are chaotic (a bf16 KV cache alone moves them by 10-19%), that moves
// prefill logits by far more than bf16 rounding, so the default mode's figures are printed, not bounded.
constexpr double kExactTol = 1e-3;

TEST_P(CudaGolden, LogitsMatchTransformersAndTheCpuExecutor) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto f = load_fixture(GetParam());
  if (!f) GTEST_SKIP() << "fixture " << GetParam() << " is absent";
  model::Model m(f->cfg, model::load_weights(f->cfg, *f->src));
  runtime::cuda::CudaExecutorOptions opt;
  opt.quiet = true;
  runtime::cuda::CudaExecutorOptions exact_opt = opt;
  exact_opt.exact_linear = true;
  runtime::cuda::CudaExecutor gpu(m, exec_config(m, kv::KvCacheDType::F32), opt);
  runtime::cuda::CudaExecutor exact(m, exec_config(m, kv::KvCacheDType::F32), exact_opt);
  runtime::CpuExecutor cpu(std::shared_ptr<const model::Model>(&m, [](const model::Model*) {}),
                           exec_config(m, kv::KvCacheDType::F32));
  const int64_t V = f->cfg.vocab_size;
  for (size_t i = 0; i < f->prompts.size(); ++i) {
    std::vector<int32_t> ids = f->prompts[i];
    ids.insert(ids.end(), f->greedy[i].begin(), f->greedy[i].end() - 1);
    auto file =
        io::SafetensorsFile::open(fs::path(MS_TEST_DATA) / "golden" / GetParam() / "logits.safetensors");
    Tensor want = file->tensor("logits." + std::to_string(i));
    ASSERT_EQ(want.size(0), static_cast<int64_t>(ids.size()));
    const size_t P = f->prompts[i].size(), n = ids.size() * static_cast<size_t>(V);
    for (bool decode : {false, true}) {
      const auto x = run(exact, ids, decode ? P : ids.size(), decode);
      const auto g = run(gpu, ids, decode ? P : ids.size(), decode);
      const auto c = run(cpu, ids, decode ? P : ids.size(), decode);
      const double e_hf = rel_err(x.data(), want.data<float>(), n), e_cpu = rel_err(x.data(), c.data(), n);
      std::printf(
          "[ measured ] %s prompt %zu (%zu tokens) %s: exact vs transformers %.2e, vs cpu %.2e; "
          "default (bf16 prefill GEMMs) vs transformers %.2e\n",
          GetParam().c_str(), i, ids.size(), decode ? "decode" : "full", e_hf, e_cpu,
          rel_err(g.data(), want.data<float>(), n));
      EXPECT_LT(e_hf, kExactTol) << GetParam() << " prompt " << i << (decode ? " decode" : " full");
      EXPECT_LT(e_cpu, kExactTol) << GetParam() << " prompt " << i << (decode ? " decode" : " full");
    }
  }
}

std::map<size_t, std::vector<int32_t>> engine_greedy(const Fixture& f, const model::Model& m, bool graphs,
                                                     runtime::cuda::GraphStats* stats, bool exact = true,
                                                     bool pdl = true) {
  runtime::cuda::CudaExecutorOptions opt;
  opt.quiet = true;
  opt.cuda_graphs = graphs;
  opt.exact_linear = exact;
  opt.pdl = pdl;
  auto ex = std::make_unique<runtime::cuda::CudaExecutor>(m, exec_config(m, kv::KvCacheDType::F32, 256), opt);
  runtime::cuda::CudaExecutor* raw = ex.get();
  runtime::EngineConfig ec;
  ec.max_running = 8;
  ec.max_prefill_tokens = 512;
  ec.enable_prefix_cache = false;
  runtime::Engine e(std::move(ex), ec);
  std::map<uint64_t, size_t> which;
  for (size_t i = 0; i < f.prompts.size(); ++i) {
    runtime::Request r;
    r.prompt_ids = f.prompts[i];
    r.max_tokens = static_cast<int>(f.greedy[i].size());
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    which[e.submit(r)] = i;
  }
  std::map<size_t, std::vector<int32_t>> got;
  while (e.has_work())
    for (const auto& o : e.step()) {
      EXPECT_NE(o.finish, runtime::FinishReason::Error) << o.error;
      for (const auto& g : o.tokens) got[which[o.request_id]].push_back(g.token);
    }
  if (stats) *stats = raw->graph_stats();
  return got;
}

// All prompts batched through the Engine; decode steps replayed from captured graphs (the test fails if no
// graph was captured or replayed: no silent fallback to plain launches).
TEST_P(CudaGolden, GreedyTokensIdenticalWithAndWithoutGraphs) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto f = load_fixture(GetParam());
  if (!f) GTEST_SKIP() << "fixture " << GetParam() << " is absent";
  model::Model m(f->cfg, model::load_weights(f->cfg, *f->src));
  runtime::cuda::GraphStats gs, es;
  const auto with = engine_greedy(*f, m, true, &gs);
  const auto without = engine_greedy(*f, m, false, &es);
  const auto fast = engine_greedy(*f, m, true, nullptr, false);
  size_t same = 0, total = 0;
  for (size_t i = 0; i < f->prompts.size(); ++i)
    for (size_t t = 0; t < f->greedy[i].size(); ++t, ++total)
      same += t < fast.at(i).size() && fast.at(i)[t] == f->greedy[i][t];
  std::printf("[ measured ] %s default mode (bf16 prefill GEMMs): %zu of %zu greedy tokens as transformers\n",
              GetParam().c_str(), same, total);
  std::printf("[ measured ] %s graphs: %lld captured, %lld replays, %lld eager steps\n", GetParam().c_str(),
              static_cast<long long>(gs.captured), static_cast<long long>(gs.replays),
              static_cast<long long>(gs.eager));
  EXPECT_GE(gs.captured, 1);
  EXPECT_GE(gs.replays, 1);
  EXPECT_EQ(es.captured, 0);
  for (size_t i = 0; i < f->prompts.size(); ++i) {
    EXPECT_EQ(with.at(i), f->greedy[i]) << GetParam() << " prompt " << i << " (graphs)";
    EXPECT_EQ(without.at(i), f->greedy[i]) << GetParam() << " prompt " << i << " (no graphs)";
  }
}

// Captured decode graphs keep working after a prefill larger than any before grows the scratch buffers
// they were captured with (the grown buffers must not free the old allocations under the graphs): the same
// decode run before and after such a prefill gives the same logits, and matches an executor without graphs.
TEST_P(CudaGolden, GraphsSurviveScratchGrowth) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto f = load_fixture(GetParam());
  if (!f) GTEST_SKIP() << "fixture " << GetParam() << " is absent";
  model::Model m(f->cfg, model::load_weights(f->cfg, *f->src));
  std::vector<int32_t> ids = f->prompts[0];
  ids.insert(ids.end(), f->greedy[0].begin(), f->greedy[0].end() - 1);
  // A prompt several times longer than any decode step or the first prompt.
  std::vector<int32_t> big;
  while (big.size() < 8 * ids.size() + 64) big.insert(big.end(), ids.begin(), ids.end());
  big.resize(std::min<size_t>(big.size(), 500));  // within the configuration's 512-token context
  const auto cfg = exec_config(m, kv::KvCacheDType::F32, 256);
  runtime::cuda::CudaExecutorOptions opt;
  opt.quiet = true;
  runtime::cuda::CudaExecutor ex(m, cfg, opt);
  const std::vector<float> before = run(ex, ids, f->prompts[0].size(), true, true);
  const size_t scratch_before = ex.memory().scratch;
  run(ex, big, big.size(), false);
  const std::vector<float> after = run(ex, ids, f->prompts[0].size(), true, true);
  std::printf("[ measured ] %s: scratch %zu -> %zu bytes, %lld graph replays\n", GetParam().c_str(),
              scratch_before, ex.memory().scratch, static_cast<long long>(ex.graph_stats().replays));
  EXPECT_GT(ex.memory().scratch, scratch_before) << "the long prefill did not grow any scratch buffer";
  EXPECT_GE(ex.graph_stats().replays, 2);
  ASSERT_EQ(before.size(), after.size());
  EXPECT_EQ(rel_err(after.data(), before.data(), before.size()), 0.0);
  runtime::cuda::CudaExecutorOptions eager_opt = opt;
  eager_opt.cuda_graphs = false;
  runtime::cuda::CudaExecutor eager(m, cfg, eager_opt);
  const std::vector<float> want = run(eager, ids, f->prompts[0].size(), true, true);
  EXPECT_LT(rel_err(after.data(), want.data(), want.size()), 1e-5);
}

// Programmatic dependent launch (kernels/cuda/common/pdl.h) changes no result: decode logits with PDL on and
// off agree (every kernel waits for its predecessor before touching what it wrote), eagerly and replayed from
// graphs, and greedy tokens through the Engine are the fixture's either way.
TEST_P(CudaGolden, ProgrammaticDependentLaunchChangesNoResult) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto f = load_fixture(GetParam());
  if (!f) GTEST_SKIP() << "fixture " << GetParam() << " is absent";
  model::Model m(f->cfg, model::load_weights(f->cfg, *f->src));
  struct Restore {  // the process-wide switch as it was, whatever the assertions do
    bool was = cuda::pdl_enabled();
    ~Restore() { cuda::set_pdl_enabled(was); }
  } restore;
  std::printf("[ measured ] %s programmatic dependent launch active: %s\n", GetParam().c_str(),
              cuda::pdl_active() ? "yes" : "no (MOESERVE_DISABLE_PDL or a device before sm_90)");
  const int64_t V = f->cfg.vocab_size;
  for (bool graphs : {true, false}) {
    std::vector<float> logits[2];
    runtime::cuda::GraphStats stats[2];
    std::vector<int32_t> ids = f->prompts[0];
    ids.insert(ids.end(), f->greedy[0].begin(), f->greedy[0].end() - 1);
    for (int on = 0; on < 2; ++on) {
      runtime::cuda::CudaExecutorOptions opt;
      opt.quiet = true;
      opt.cuda_graphs = graphs;
      opt.pdl = on == 1;
      runtime::cuda::CudaExecutor ex(m, exec_config(m, kv::KvCacheDType::F32), opt);
      if (on == 0) {
        EXPECT_FALSE(cuda::pdl_active());
      }
      logits[on] = run(ex, ids, f->prompts[0].size(), true, true);
      stats[on] = ex.graph_stats();
    }
    ASSERT_EQ(logits[0].size(), logits[1].size());
    const double e = rel_err(logits[1].data(), logits[0].data(), logits[0].size());
    std::printf("[ measured ] %s %s: PDL on vs off, logits rel err %.2e over %zu decode positions\n",
                GetParam().c_str(), graphs ? "graphs" : "eager", e,
                logits[0].size() / static_cast<size_t>(V));
    EXPECT_LT(e, 1e-5) << GetParam() << (graphs ? " graphs" : " eager");
    if (graphs) {
      EXPECT_GE(stats[1].replays, 1) << "no decode step was replayed from a graph";
      std::printf("[ measured ] %s graphs: %lld programmatic edges with PDL on, %lld off\n",
                  GetParam().c_str(), static_cast<long long>(stats[1].programmatic_edges),
                  static_cast<long long>(stats[0].programmatic_edges));
      EXPECT_EQ(stats[0].programmatic_edges, 0);
      if (cuda::pdl_active()) {
        EXPECT_GT(stats[1].programmatic_edges, 0) << "capture kept no programmatic edge";
      }
    }
  }
  runtime::cuda::GraphStats gs;
  const auto on = engine_greedy(*f, m, true, &gs, true, true);
  const auto off = engine_greedy(*f, m, true, nullptr, true, false);
  EXPECT_GE(gs.replays, 1);
  for (size_t i = 0; i < f->prompts.size(); ++i) {
    EXPECT_EQ(on.at(i), f->greedy[i]) << GetParam() << " prompt " << i << " (PDL on)";
    EXPECT_EQ(off.at(i), f->greedy[i]) << GetParam() << " prompt " << i << " (PDL off)";
  }
}

// The shared expert run as one more expert of the grouped kernels (CudaExecutorOptions::fuse_shared_expert,
// on by default; every fixture has one shared expert as wide as the routed ones) gives the logits of the
// separate MLP, in exact mode eagerly and replayed from graphs, and the fused step records no op of the
// shared MLP (so the fusion did happen).
TEST_P(CudaGolden, SharedExpertFusionChangesNoResult) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto f = load_fixture(GetParam());
  if (!f) GTEST_SKIP() << "fixture " << GetParam() << " is absent";
  model::Model m(f->cfg, model::load_weights(f->cfg, *f->src));
  struct Names final : profiler::OpSink {
    std::vector<std::string> seen;
    void op_begin(const profiler::OpInfo& info) override { seen.emplace_back(info.name); }
    void op_end() noexcept override {}
  };
  std::vector<int32_t> ids = f->prompts[0];
  ids.insert(ids.end(), f->greedy[0].begin(), f->greedy[0].end() - 1);
  for (bool graphs : {false, true}) {
    std::vector<float> logits[2];
    for (int fuse = 0; fuse < 2; ++fuse) {
      runtime::cuda::CudaExecutorOptions opt;
      opt.quiet = true;
      opt.exact_linear = true;
      opt.cuda_graphs = graphs;
      opt.fuse_shared_expert = fuse == 1;
      runtime::cuda::CudaExecutor ex(m, exec_config(m, kv::KvCacheDType::F32), opt);
      logits[fuse] = run(ex, ids, f->prompts[0].size(), true, true);
      if (graphs) continue;
      kv::PageAllocator alloc(ex.kv_capacity().num_pages);
      std::vector<int32_t> pages;
      ASSERT_TRUE(alloc.allocate(1, pages));
      kv::ForwardBatchBuilder bb(ex.kv_capacity().page_size);
      bb.add_sequence(pages, 0, ids.data(), 1, false);
      kv::ForwardBatch b = bb.finish();
      b.logit_rows.push_back(0);
      Names names;
      ex.run(b, {}, &names);
      int shared_ops = 0, expert_ops = 0;
      for (const std::string& n : names.seen) {
        shared_ops += n.find("moe.shared") != std::string::npos;
        expert_ops += n.find("moe.experts") != std::string::npos;
      }
      EXPECT_GT(expert_ops, 0) << GetParam();
      if (fuse == 1)
        EXPECT_EQ(shared_ops, 0) << GetParam() << ": the shared expert still ran as its own MLP";
      else
        EXPECT_GT(shared_ops, 0) << GetParam();
    }
    ASSERT_EQ(logits[0].size(), logits[1].size());
    const double e = rel_err(logits[1].data(), logits[0].data(), logits[0].size());
    std::printf("[ measured ] %s %s: shared expert fused vs separate, logits rel err %.2e\n",
                GetParam().c_str(), graphs ? "graphs" : "eager", e);
    EXPECT_LT(e, 1e-4) << GetParam() << (graphs ? " graphs" : " eager");
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGolden,
                         ::testing::Values("deepseek_v3_tiny", "deepseek_v3_tiny_qproj", "glm5_tiny"));

// Whether the GPU upload should fuse a layer's q_a / kv_a / indexer wk (model::AttentionWeights::qkv_a): a
// q_lora layer whose three are BF16 (unless MOESERVE_FUSE_QKV_A=0). Checks the device model's layers against
// that and counts the fused ones.
int check_qkv_fusion(const model::Model& host, const model::Model& dev) {
  const char* off = std::getenv("MOESERVE_FUSE_QKV_A");
  const bool enabled = !(off != nullptr && std::string(off) == "0");
  int fused = 0;
  const auto& hl = host.weights().layers;
  const auto& dl = dev.weights().layers;
  EXPECT_EQ(hl.size(), dl.size());
  for (size_t l = 0; l < hl.size() && l < dl.size(); ++l) {
    const model::AttentionWeights& a = hl[l].attn;
    const auto bf16 = [](const ops::LinearWeight& w) { return w.format == ops::WeightFormat::BF16; };
    const bool want = enabled && host.config().q_lora_rank.has_value() && bf16(a.q_a_proj) &&
                      bf16(a.kv_a_proj) && (!a.has_indexer || bf16(a.indexer.wk));
    const model::AttentionWeights& d = dl[l].attn;
    EXPECT_EQ(d.qkv_a.defined(), want) << "layer " << l;
    if (!d.qkv_a.defined()) continue;
    ++fused;
    EXPECT_EQ(d.qkv_a.out, a.q_a_proj.out + a.kv_a_proj.out + (a.has_indexer ? a.indexer.wk.out : 0));
    EXPECT_EQ(d.qkv_a_q, a.q_a_proj.out);
    EXPECT_EQ(d.qkv_a_wk, a.has_indexer);
    // The three weights are the fused tensor's row slices (no second copy).
    const auto* base = static_cast<const char*>(d.qkv_a.weight.raw());
    const int64_t row = d.qkv_a.in * 2;
    EXPECT_EQ(static_cast<const char*>(d.q_a_proj.weight.raw()), base);
    EXPECT_EQ(static_cast<const char*>(d.kv_a_proj.weight.raw()), base + d.qkv_a_q * row);
    if (a.has_indexer) {
      EXPECT_EQ(static_cast<const char*>(d.indexer.wk.weight.raw()),
                base + (d.qkv_a_q + a.kv_a_proj.out) * row);
    }
  }
  return fused;
}

class CudaDummy : public ::testing::TestWithParam<std::string> {};

// --load-format dummy on the GPU: weights built on the device tensor by tensor from a RandomSource give the
// logits (bit for bit) of the same dummy model built in host memory and uploaded whole; the host-memory model
// on the CPU executor is within the exact mode's tolerance of both.
TEST_P(CudaDummy, SourceBuiltWeightsEqualTheUploadedDummyModel) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto f = load_fixture("glm5_tiny");
  if (!f) GTEST_SKIP() << "fixture glm5_tiny is absent";
  const io::QuantConfig q = model::quant_config_for(f->cfg, GetParam(), "--quantization");
  model::RandomSource src(f->cfg, q, 11);
  model::Model host(f->cfg, model::load_weights(f->cfg, src));
  uint64_t spec_bytes = 0;
  for (const auto& [dt, b] : model::bytes_by_dtype(src.specs(), false)) spec_bytes += b;
  runtime::cuda::CudaExecutorOptions opt;
  opt.quiet = true;
  opt.exact_linear = true;
  const runtime::ExecutorConfig ec = exec_config(host, kv::KvCacheDType::F32);
  runtime::cuda::CudaExecutor uploaded(host, ec, opt);
  runtime::cuda::CudaExecutor built(f->cfg, src, static_cast<double>(spec_bytes), ec, opt);
  runtime::CpuExecutor cpu(std::shared_ptr<const model::Model>(&host, [](const model::Model*) {}), ec);
  // Both upload paths fuse the same layers' q_a / kv_a / wk (so the bitwise comparison covers the fused
  // product).
  const int fused_uploaded = check_qkv_fusion(host, uploaded.model());
  EXPECT_EQ(check_qkv_fusion(host, built.model()), fused_uploaded);
  std::printf("[ measured ] dummy %s: q_a / kv_a / wk fused in %d of %d layers\n", GetParam().c_str(),
              fused_uploaded, f->cfg.num_hidden_layers);
  std::vector<int32_t> ids;
  for (int i = 0; i < 12; ++i) ids.push_back((i * 97 + 13) % static_cast<int32_t>(f->cfg.vocab_size));
  for (bool decode : {false, true}) {
    const auto a = run(built, ids, decode ? 4 : ids.size(), decode);
    const auto b = run(uploaded, ids, decode ? 4 : ids.size(), decode);
    const auto c = run(cpu, ids, decode ? 4 : ids.size(), decode);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << GetParam() << " logit " << i;
    const double e = rel_err(a.data(), c.data(), a.size());
    std::printf("[ measured ] dummy %s %s: gpu vs cpu %.2e\n", GetParam().c_str(), decode ? "decode" : "full",
                e);
    EXPECT_LT(e, kExactTol) << GetParam();
  }
}

INSTANTIATE_TEST_SUITE_P(LoadFormat, CudaDummy, ::testing::Values("bf16", "fp8", "nvfp4"));

// A batch of two sequences (prefill, then decode steps) on a full-width checkpoint: GPU vs CPU executor.
TEST(CudaExecutorSlice, MatchesTheCpuExecutor) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const char* env = std::getenv("MOESERVE_TEST_SLICES");
  if (!env || !*env) GTEST_SKIP() << "MOESERVE_TEST_SLICES names no checkpoint";
  std::stringstream ss(env);
  std::string dir;
  while (std::getline(ss, dir, ',')) {
    SCOPED_TRACE(dir);
    model::LoadedModel lm = model::load_model(dir);
    const model::Model& m = *lm.model;
    runtime::ExecutorConfig c =
        runtime::executor_config_for(m, 64, 64 * 8, kv::KvCacheDType::BF16, 2, 64, 4096);
    c.max_logit_rows = c.max_tokens;
    runtime::cuda::CudaExecutorOptions opt;
    opt.quiet = true;
    opt.exact_linear = true;
    runtime::cuda::CudaExecutor gpu(m, c, opt);
    runtime::CpuExecutor cpu(lm.model, c);
    std::printf("[ measured ] %s: q_a / kv_a / wk fused in %d of %d layers\n", dir.c_str(),
                check_qkv_fusion(m, gpu.model()), m.config().num_hidden_layers);
    kv::PageAllocator alloc(8);
    std::vector<int32_t> p0, p1;
    ASSERT_TRUE(alloc.allocate(2, p0));
    ASSERT_TRUE(alloc.allocate(2, p1));
    const int64_t V = m.config().vocab_size;
    std::vector<int32_t> a(24), b(17);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int32_t>((i * 7919 + 11) % V);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<int32_t>((i * 104729 + 3) % V);
    int32_t la = 0, lb = 0;
    int agree = 0, steps = 0;
    for (int step = 0; step < 5; ++step) {
      kv::ForwardBatchBuilder bb(64);
      const int32_t na = step == 0 ? static_cast<int32_t>(a.size()) : 1;
      const int32_t nb = step == 0 ? static_cast<int32_t>(b.size()) : 1;
      bb.add_sequence(p0, la, a.data() + la, na, true);
      bb.add_sequence(p1, lb, b.data() + lb, nb, true);
      const kv::ForwardBatch batch = bb.finish();
      const Tensor g = gpu.run(batch).clone();
      const Tensor cc = cpu.run(batch).clone();
      const double e = rel_err(g.data<float>(), cc.data<float>(), static_cast<size_t>(g.numel()));
      std::printf("[ measured ] %s step %d: gpu vs cpu logits %.2e\n", dir.c_str(), step, e);
      EXPECT_LT(e, kExactTol) << "step " << step;
      // Greedy continuation from the CPU's choice (so both see the same next tokens).
      for (int r = 0; r < 2; ++r) {
        const float* gr = g.data<float>() + r * V;
        const float* cr = cc.data<float>() + r * V;
        const int32_t gi = static_cast<int32_t>(std::max_element(gr, gr + V) - gr);
        const int32_t ci = static_cast<int32_t>(std::max_element(cr, cr + V) - cr);
        agree += gi == ci;
        ++steps;
        auto& seq = r == 0 ? a : b;
        seq.push_back(ci);
      }
      la += na;
      lb += nb;
    }
    std::printf("[ measured ] %s greedy agreement %d of %d\n", dir.c_str(), agree, steps);
    EXPECT_EQ(agree, steps);
  }
}

}  // namespace
}  // namespace ms
