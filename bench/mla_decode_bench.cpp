// MLA decode attention on the GPU at hand against its roofline, measured in the same run:
//   copy bandwidth: a 2 GiB device-to-device cudaMemcpy (read + write bytes / time);
//   BF16 matrix rate: a cuBLASLt 8192^3 bf16 GEMM with f32 accumulation (the math the kernel uses).
// For each shape: time per call replayed from a CUDA graph, bytes = the KV rows the step references + q
// (bf16)
// + out (f32), FLOPs = 2 * tokens * heads * keys * (576 + 512), roofline = max(bytes / copy bandwidth,
// FLOPs / matrix rate), and the time of the kernel decode used before (the older fp8 kernel for fp8 dense
// pages of 64, else the general kernel); dense fp8 shapes on sm_90 also time the warpgroup-MMA kernel (both
// consumer schedules; `--wgmma`: only the shapes it is built for); `--narrow`: 8-32 heads over fp8 pages,
// dense and DSA, where the sm90 kernel's narrow configuration runs, timed beside its other block count and
// the whole-tile widening kernel. Pages are spread at random over a pool of at least 256 MB and several block
// tables rotate through it, so a short context is not served from L2 by the previous call.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_bench.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/mla_attention/mla_attention.h"
#include "kernels/cuda/mla_decode/mla_decode.h"
#include "kernels/cuda/mla_decode/mla_decode_sm90.h"
#include "kernels/cuda/mla_decode/mla_decode_wgmma.h"

namespace {

namespace gpu = ms::cuda;
constexpr int kDim = 576, kLat = 512, kPage = 64;

using ms::bench::measure_copy_gbs;
using ms::bench::time_graph_ms;
using ms::bench::time_ms;

struct Shape {
  int heads, batch, ctx;
  bool fp8;
  int topk;  // 0: dense
};

// The environment variable `name` as a comma-separated list of integers in [lo, hi]; empty when unset or
// empty; exits with a message naming the variable for anything else.
std::vector<int> env_int_list(const char* name, int lo, int hi) {
  std::vector<int> out;
  const char* env = std::getenv(name);
  if (env == nullptr) return out;
  for (const char* c = env; *c;) {
    char* end = nullptr;
    const long v = std::strtol(c, &end, 10);
    if (end == c || v < lo || v > hi || (*end != ',' && *end != '\0')) {
      std::fprintf(stderr, "%s: expected a comma-separated list of %d..%d, got '%s'\n", name, lo, hi, env);
      std::exit(2);
    }
    out.push_back(static_cast<int>(v));
    c = *end == ',' ? end + 1 : end;
  }
  return out;
}

void run(const Shape& s, const gpu::DeviceCaps& caps, double bw, double tflops) {
  const int eb = s.fp8 ? 1 : 2;
  const size_t page_bytes = size_t{kPage} * kDim * eb;
  const int pages_per_seq = (s.ctx + kPage - 1) / kPage;
  const int need = s.batch * pages_per_seq;
  const int pool_pages = std::max(need, static_cast<int>((size_t{256} << 20) / page_bytes));
  const int reps = std::max(1, std::min(4, pool_pages / need));
  std::mt19937 rng(11);
  void* pool;
  CUDA_CHECK(cudaMalloc(&pool, pool_pages * page_bytes));
  CUDA_CHECK(cudaMemset(pool, s.fp8 ? 0x30 : 0x3c, pool_pages * page_bytes));
  std::vector<int> perm(pool_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t*> tables(reps);
  for (int r = 0; r < reps; ++r) {
    std::vector<int32_t> t(perm.begin() + static_cast<size_t>(r) * need,
                           perm.begin() + static_cast<size_t>(r + 1) * need);
    CUDA_CHECK(cudaMalloc(&tables[r], t.size() * 4));
    CUDA_CHECK(cudaMemcpy(tables[r], t.data(), t.size() * 4, cudaMemcpyHostToDevice));
  }
  const int tokens = s.batch;
  std::vector<int32_t> lens(s.batch, s.ctx), pos(tokens, s.ctx - 1), seq(tokens);
  std::iota(seq.begin(), seq.end(), 0);
  std::vector<int32_t> topk(static_cast<size_t>(tokens) * s.topk);
  for (int i = 0; i < tokens && s.topk; ++i) {  // distinct positions, ascending (as the indexer emits them)
    std::vector<int32_t> all(s.ctx);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::sort(all.begin(), all.begin() + s.topk);
    std::copy(all.begin(), all.begin() + s.topk, topk.begin() + static_cast<size_t>(i) * s.topk);
  }
  int32_t *dlens, *dpos, *dseq, *dtopk = nullptr;
  CUDA_CHECK(cudaMalloc(&dlens, lens.size() * 4));
  CUDA_CHECK(cudaMalloc(&dpos, pos.size() * 4));
  CUDA_CHECK(cudaMalloc(&dseq, seq.size() * 4));
  CUDA_CHECK(cudaMemcpy(dlens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dpos, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dseq, seq.data(), seq.size() * 4, cudaMemcpyHostToDevice));
  if (s.topk) {
    CUDA_CHECK(cudaMalloc(&dtopk, topk.size() * 4));
    CUDA_CHECK(cudaMemcpy(dtopk, topk.data(), topk.size() * 4, cudaMemcpyHostToDevice));
  }
  const size_t q_elems = static_cast<size_t>(tokens) * s.heads * kDim;
  const size_t out_elems = static_cast<size_t>(tokens) * s.heads * kLat;
  void *qb, *qf, *out;
  CUDA_CHECK(cudaMalloc(&qb, q_elems * 2));
  CUDA_CHECK(cudaMalloc(&qf, q_elems * 4));
  CUDA_CHECK(cudaMemset(qb, 0x3c, q_elems * 2));
  CUDA_CHECK(cudaMemset(qf, 0, q_elems * 4));
  CUDA_CHECK(cudaMalloc(&out, out_elems * 4));

  // The new kernel.
  gpu::MlaDecodeSm90Params p;
  p.q = qb;
  p.q_bf16 = true;
  p.q_token_stride = static_cast<int64_t>(s.heads) * kDim;
  p.kv = pool;
  p.kv_fp8 = s.fp8;
  p.kv_scale = 1.f;
  p.num_pages = pool_pages;
  p.page_size = kPage;
  p.block_table = tables[0];
  p.block_table_stride = pages_per_seq;
  p.seq_lens = dlens;
  p.positions = dpos;
  p.topk = dtopk;
  p.topk_width = s.topk;
  p.token_seq = s.topk ? dseq : nullptr;
  p.out = out;
  p.out_token_stride = static_cast<int64_t>(s.heads) * kLat;
  p.n_seqs = s.batch;
  p.heads = s.heads;
  p.softmax_scale = 0.0625f;
  const auto cfg = gpu::mla_decode_sm90_choose(p, gpu::limits_of(caps));
  int which = 0;
  // Times the sm90 kernel with configuration c on params `base` and a workspace of its own.
  auto time_cfg = [&](const gpu::mla_sm90::Config& c, const gpu::MlaDecodeSm90Params& base) {
    void* w = nullptr;
    if (c.workspace) CUDA_CHECK(cudaMalloc(&w, c.workspace));
    gpu::MlaDecodeSm90Params pc = base;
    pc.workspace = w;
    const float ms = time_graph_ms(
        [&](cudaStream_t st) {
          pc.block_table = tables[which];
          gpu::mla_decode_sm90(c, pc, st);
          which = (which + 1) % reps;
        },
        20);
    cudaFree(w);
    return ms;
  };
  const float t = time_cfg(cfg, p);
  // Tuning data: 16-row configurations run two blocks per multiprocessor with a two-tile ring; time also one
  // block with the deepest ring that fits (more bytes in flight, no second block to overlap with).
  float t_alt = 0, t_wide = 0;
  int alt_stages = 0;
  // The narrow configuration's three schedules (two blocks a multiprocessor with a 2-step ring, one block
  // with the deepest ring, the warp-specialised one), whichever fit.
  float t_narrow[3] = {0, 0, 0};
  int narrow_stages[3] = {0, 0, 0};
  if (cfg.narrow_nt > 0) {
    for (int blocks : {2, 1}) {
      gpu::mla_sm90::Config alt = cfg;
      alt.narrow_ws = false;
      alt.blocks_per_sm = blocks;
      alt.stages = 0;
      for (int st = gpu::mla_sm90::kMaxStages; st >= 2 && alt.stages == 0; --st)
        if (gpu::mla_sm90::narrow_smem_bytes(cfg.narrow_nt, st) + (blocks == 2 ? 1024 : 0) <=
            caps.smem_per_block_optin / blocks)
          alt.stages = st;
      if (alt.stages == 0 || (blocks == 2 && cfg.narrow_nt == 4)) continue;
      alt.smem = gpu::mla_sm90::narrow_smem_bytes(cfg.narrow_nt, alt.stages);
      alt.max_splits = std::clamp(caps.multiprocessors * blocks / (alt.units * alt.head_groups), 1,
                                  gpu::mla_sm90::kMaxSplits);
      alt.workspace = alt.max_splits > 1 ? gpu::mla_sm90::workspace_bytes(alt.units, alt.max_splits,
                                                                          alt.q_per_unit * s.heads)
                                         : 0;
      narrow_stages[blocks == 2 ? 0 : 1] = alt.stages;
      t_narrow[blocks == 2 ? 0 : 1] = time_cfg(alt, p);
    }
    const gpu::mla_sm90::Config ws = gpu::mla_sm90::narrow_ws_of(cfg, s.heads, gpu::limits_of(caps));
    if (ws.narrow_nt > 0) {
      narrow_stages[2] = ws.stages;
      t_narrow[2] = time_cfg(ws, p);
    }
    // MLA_BENCH_WAVES="2,3": the default narrow configuration again with that many times its splits (as many
    // waves of blocks: the hardware hands a finished block's slot to the next, so uneven blocks even out).
    if (const auto waves = env_int_list("MLA_BENCH_WAVES", 1, 16); !waves.empty()) {
      std::printf("%-26s   narrow, splits x waves:", "");
      for (const int k : waves) {
        gpu::mla_sm90::Config alt = cfg;
        alt.max_splits = std::clamp(cfg.max_splits * k, 1, gpu::mla_sm90::kMaxSplits);
        alt.workspace = alt.max_splits > 1 ? gpu::mla_sm90::workspace_bytes(alt.units, alt.max_splits,
                                                                            alt.q_per_unit * s.heads)
                                           : 0;
        std::printf("  x%d (%d splits) %.2f us", k, alt.max_splits, time_cfg(alt, p) * 1e3);
      }
      std::printf("\n");
    }
    // MLA_BENCH_HEADS_CAP="8": the configuration chosen with at most that many heads a block (more head
    // groups, each reading the same keys: the second read mostly from L2).
    if (const auto heads_caps = env_int_list("MLA_BENCH_HEADS_CAP", 1, 64); !heads_caps.empty()) {
      std::printf("%-26s   heads a block at most:", "");
      for (const int hb : heads_caps) {
        gpu::MlaDecodeSm90Params pc = p;
        pc.max_heads_per_block = hb;
        const auto cc = gpu::mla_decode_sm90_choose(pc, gpu::limits_of(caps));
        std::printf("  %d (%d head groups x %d splits, narrow %d) %.2f us", hb, cc.head_groups, cc.max_splits,
                    cc.narrow_nt, time_cfg(cc, pc) * 1e3);
      }
      std::printf("\n");
    }
    gpu::MlaDecodeSm90Params pw = p;
    pw.no_narrow = true;
    t_wide = time_cfg(gpu::mla_decode_sm90_choose(pw, gpu::limits_of(caps)), pw);
  } else if (cfg.blocks_per_sm == 2) {
    gpu::mla_sm90::Config alt = cfg;
    for (int st = gpu::mla_sm90::kMaxStages; st > cfg.stages && alt_stages == 0; --st)
      if (gpu::mla_sm90::smem_bytes(16 * cfg.row_groups, s.fp8, st) <= caps.smem_per_block_optin)
        alt_stages = st;
    if (alt_stages) {
      alt.stages = alt_stages;
      alt.smem = gpu::mla_sm90::smem_bytes(16 * cfg.row_groups, s.fp8, alt_stages);
      alt.blocks_per_sm = 1;
      alt.max_splits =
          std::clamp(caps.multiprocessors / (alt.units * alt.head_groups), 1, gpu::mla_sm90::kMaxSplits);
      alt.workspace =
          alt.max_splits > 1 ? gpu::mla_sm90::workspace_bytes(alt.units, alt.max_splits, s.heads) : 0;
      t_alt = time_cfg(alt, p);
    }
  }

  // The warpgroup-MMA kernel (sm_90a, dense fp8 pages), on the same inputs.
  float t_wg = 0;
  gpu::mla_wgmma::Config wcfg;
  if (!s.topk && s.fp8) wcfg = gpu::mla_decode_wgmma_choose(p, gpu::limits_of(caps));
  if (wcfg.heads_per_block > 0) {
    void* wws = nullptr;
    if (wcfg.workspace) CUDA_CHECK(cudaMalloc(&wws, wcfg.workspace));
    gpu::MlaDecodeSm90Params pw = p;
    pw.workspace = wws;
    t_wg = time_graph_ms(
        [&](cudaStream_t st) {
          pw.block_table = tables[which];
          gpu::mla_decode_wgmma(wcfg, pw, st);
          which = (which + 1) % reps;
        },
        20);
    cudaFree(wws);
  }

  // The kernel used before: the older fp8 kernel (fp8, dense), else the general kernel.
  float t_old = 0;
  const bool old_fp8 = s.fp8 && !s.topk;
  void* ows = nullptr;
  if (old_fp8) {
    gpu::MlaDecodeParams o;
    o.q = static_cast<const __nv_bfloat16*>(qb);
    o.q_batch_stride = static_cast<int64_t>(s.heads) * kDim;
    o.kv = static_cast<const uint8_t*>(pool);
    o.block_table = tables[0];
    o.block_table_stride = pages_per_seq;
    o.seq_lens = dlens;
    o.out = out;
    o.out_batch_stride = static_cast<int64_t>(s.heads) * kLat;
    o.batch = s.batch;
    o.heads = s.heads;
    o.num_pages = pool_pages;
    o.softmax_scale = 0.0625f;
    o.split_target = caps.multiprocessors;
    CUDA_CHECK(cudaMalloc(&ows, gpu::mla_decode_workspace_bytes(s.batch, s.heads, caps.multiprocessors)));
    o.workspace = ows;
    gpu::mla_decode_plan(o, nullptr);  // once per step, shared by every layer: not in the timing
    CUDA_CHECK(cudaDeviceSynchronize());
    t_old = time_graph_ms(
        [&](cudaStream_t st) {
          o.block_table = tables[which];
          gpu::mla_decode(o, st);
          which = (which + 1) % reps;
        },
        20);
  } else {
    gpu::MlaAttentionShape sh;
    sh.m = tokens;
    sh.heads = s.heads;
    sh.kv_lora_rank = kLat;
    sh.rope = kDim - kLat;
    sh.page_size = kPage;
    sh.format = s.fp8 ? gpu::KvFormat::FP8E4M3 : gpu::KvFormat::BF16;
    sh.has_topk = s.topk > 0;
    sh.decode_only = true;
    sh.n_seqs = s.batch;
    sh.prefer = gpu::MlaAttentionPrefer::General;
    const auto oc = gpu::mla_attention_choose(sh, caps);
    gpu::MlaAttentionParams a;
    a.q_cat = static_cast<const float*>(qf);
    a.kv = {pool, sh.format, 1.f, pool_pages, kPage, kDim};
    a.meta.token_seq = dseq;
    a.meta.positions = dpos;
    a.meta.block_table = tables[0];
    a.meta.max_blocks = pages_per_seq;
    a.meta.seq_lens = dlens;
    a.meta.n_seqs = s.batch;
    a.topk = dtopk;
    a.topk_width = s.topk;
    a.lat = static_cast<float*>(out);
    a.m = tokens;
    a.heads = s.heads;
    a.kv_lora_rank = kLat;
    a.softmax_scale = 0.0625f;
    if (oc.workspace_bytes) CUDA_CHECK(cudaMalloc(&ows, oc.workspace_bytes));
    a.workspace = ows;
    const bool slow = !s.topk && static_cast<double>(s.batch) * s.ctx * s.heads > 64.0 * 32768 * 64;
    t_old = time_graph_ms(
        [&](cudaStream_t st) {
          a.meta.block_table = tables[which];
          gpu::mla_attention(oc, a, st);
          which = (which + 1) % reps;
        },
        slow ? 2 : 5, 1);
  }

  const double keys = s.topk ? s.topk : s.ctx;
  const double bytes = tokens * keys * kDim * eb + q_elems * 2.0 + out_elems * 4.0;
  const double flops = 2.0 * tokens * s.heads * keys * (kDim + kLat);
  const double mem_us = bytes / (bw * 1e9) * 1e6, math_us = flops / (tflops * 1e12) * 1e6;
  const double roof_us = std::max(mem_us, math_us), t_us = t * 1e3;
  char name[64];
  std::snprintf(name, sizeof name, "h%d b%d %s %s%s", s.heads, s.batch,
                s.ctx >= 1024 ? (std::to_string(s.ctx / 1024) + "k").c_str() : std::to_string(s.ctx).c_str(),
                s.fp8 ? "fp8" : "bf16", s.topk ? (" dsa" + std::to_string(s.topk)).c_str() : "");
  std::printf(
      "%-26s %9.1f %8.2f %9.2f %9.2f %9.2f %9.2f %8.0f %8.1f %6.0f%% %10.2f %6.2fx  splits %d stages %d hb "
      "%d\n",
      name, bytes / 1e6, flops / 1e9, mem_us, math_us, roof_us, t_us, bytes / (t * 1e-3) / 1e9,
      flops / (t * 1e-3) / 1e12, 100.0 * roof_us / t_us, t_old * 1e3, t_old / t, cfg.max_splits, cfg.stages,
      cfg.heads_per_block);
  if (t_wg > 0)
    std::printf(
        "%-26s   wgmma: %.2f us (%.0f%% of roofline, %.2fx the sm90 kernel, %.2fx the old one), %d splits, "
        "%d heads/block\n",
        "", t_wg * 1e3, 100.0 * roof_us / (t_wg * 1e3), t / t_wg, t_old / t_wg, wcfg.max_splits,
        wcfg.heads_per_block);
  if (cfg.narrow_nt > 0) {
    const char* names[3] = {"two blocks/SM", "one block/SM", "warp-specialised"};
    std::printf("%-26s   narrow, %d rows (default %s):", "", 8 * cfg.narrow_nt,
                cfg.narrow_ws ? names[2] : names[cfg.blocks_per_sm == 2 ? 0 : 1]);
    for (int k = 0; k < 3; ++k)
      if (t_narrow[k] > 0)
        std::printf("  %s, %d-step ring %.2f us (%.0f%%)", names[k], narrow_stages[k], t_narrow[k] * 1e3,
                    100.0 * roof_us / (t_narrow[k] * 1e3));
    std::printf("\n");
  }
  if (t_alt > 0)
    std::printf("%-26s   one block per SM, %d-tile ring: %.2f us (%.0f%% of roofline)\n", "", alt_stages,
                t_alt * 1e3, 100.0 * roof_us / (t_alt * 1e3));
  if (t_wide > 0)
    std::printf("%-26s   whole-tile widening kernel: %.2f us (%.0f%% of roofline); narrow %.2fx it\n", "",
                t_wide * 1e3, 100.0 * roof_us / (t_wide * 1e3), t_wide / t);
  std::fflush(stdout);
  for (auto* tb : tables) cudaFree(tb);
  cudaFree(pool);
  cudaFree(dlens);
  cudaFree(dpos);
  cudaFree(dseq);
  cudaFree(dtopk);
  cudaFree(qb);
  cudaFree(qf);
  cudaFree(out);
  cudaFree(ows);
}

}  // namespace

int main(int argc, char** argv) {
  if (gpu::device_count() == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";  // the four headline shapes only
  // The warpgroup-MMA kernel's shapes (64 and 128 heads, dense fp8 pages).
  const bool wgmma_shapes = argc > 1 && std::string(argv[1]) == "--wgmma";
  // Short contexts and few sequences (a decode step's attention at the start of generation): 64 heads, fp8.
  const bool short_shapes = argc > 1 && std::string(argv[1]) == "--short";
  // The narrow kernel's shapes: 8-32 heads over fp8 pages, dense and DSA.
  const bool narrow_shapes = argc > 1 && std::string(argv[1]) == "--narrow";
  const auto caps = gpu::query_device(0);
  ms::cuda::BlasLtHandle lt;
  const double bw = measure_copy_gbs(), tflops = ms::bench::measure_bf16_tflops(lt);
  std::printf("device: %s (sm_%d, %d SMs, %zu KiB smem/block opt-in)\n", caps.name.c_str(), caps.arch(),
              caps.multiprocessors, caps.smem_per_block_optin / 1024);
  std::printf(
      "ceilings (this run): device-to-device copy %.0f GB/s (read + write); bf16 GEMM (cuBLASLt 8192^3) "
      "%.0f TFLOP/s\n",
      bw, tflops);
  std::printf(
      "times: per call, replayed from a CUDA graph; pages of 64 tokens; old = previous kernel "
      "(fp8 dense: mla_decode, else mla_attention_general)\n\n");
  std::printf("%-26s %9s %8s %9s %9s %9s %9s %8s %8s %7s %10s %7s\n", "shape", "MB", "GFLOP", "mem us",
              "math us", "roof us", "time us", "GB/s", "TFLOP/s", "%roof", "old us", "speedup");
  std::vector<Shape> shapes;
  if (wgmma_shapes) {
    shapes = {{64, 32, 4096, true, 0},
              {64, 32, 32768, true, 0},
              {64, 64, 32768, true, 0},
              {64, 1, 32768, true, 0},
              {128, 32, 32768, true, 0}};
  } else if (short_shapes) {
    shapes = {{64, 1, 512, true, 0},  {64, 1, 4096, true, 0},  {64, 8, 512, true, 0},  {64, 8, 4096, true, 0},
              {64, 64, 512, true, 0}, {64, 1, 32768, true, 0}, {64, 32, 4096, true, 0}};
  } else if (narrow_shapes) {
    for (int heads : {8, 16, 32})
      for (int batch : {1, 32, 64})
        for (int ctx : {4096, 32768}) shapes.push_back({heads, batch, ctx, true, 0});
    for (int heads : {8, 16})
      for (int batch : {1, 32, 64}) shapes.push_back({heads, batch, 32768, true, 2048});
  } else if (quick) {
    shapes = {{64, 32, 4096, true, 0},
              {64, 1, 32768, true, 0},
              {8, 64, 4096, true, 0},
              {64, 32, 32768, true, 2048}};
  } else {
    for (bool fp8 : {true, false})
      for (int heads : {8, 16, 64, 128})
        for (int batch : {1, 32, 64})
          for (int ctx : {4096, 32768}) shapes.push_back({heads, batch, ctx, fp8, 0});
    for (bool fp8 : {true, false})
      for (int heads : {8, 16, 64, 128})
        for (int batch : {1, 8, 32, 64}) shapes.push_back({heads, batch, 32768, fp8, 2048});
  }
  // MLA_BENCH_SHAPES="HxBxC[xK][b],...": only these shapes (H heads, batch B, context C, DSA top-K; fp8
  // pages, bf16 with the suffix b), e.g. under a kernel profiler.
  if (const char* only = std::getenv("MLA_BENCH_SHAPES"); only && *only) {
    shapes.clear();
    std::string list = only;
    for (size_t at = 0; at < list.size();) {
      const size_t end = std::min(list.find(',', at), list.size());
      std::string item = list.substr(at, end - at);
      const bool bf16 = !item.empty() && item.back() == 'b';
      if (bf16) item.pop_back();
      int h = 0, b = 0, c = 0, k = 0;
      const int got = std::sscanf(item.c_str(), "%dx%dx%dx%d", &h, &b, &c, &k);
      if (got < 3 || h <= 0 || b <= 0 || c <= 0 || k < 0) {
        std::fprintf(stderr, "MLA_BENCH_SHAPES: '%s' is not HEADSxBATCHxCONTEXT[xTOPK][b]\n", item.c_str());
        return 2;
      }
      shapes.push_back({h, b, c, !bf16, k});
      at = end + 1;
    }
  }
  for (const auto& s : shapes) run(s, caps, bw, tflops);
  return 0;
}
