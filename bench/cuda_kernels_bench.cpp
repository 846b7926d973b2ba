// Kernel benchmarks on the GPU at hand: measured ceilings first (device-to-device copy bandwidth), then each
// kernel's time against its floor (bytes it must move / measured bandwidth). One table on stdout.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "gpu_bench.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/gemm/bf16_gemv.h"
#include "kernels/cuda/gemm/blaslt.h"
#include "kernels/cuda/gemm/linear.h"
#include "kernels/cuda/mla_attention/mla_absorb.h"
#include "kernels/cuda/mla_decode/mla_decode.h"
#include "kernels/cuda/nvfp4_gemv/nvfp4_gemv.h"

namespace {

using ms::bench::measure_copy_gbs;
using ms::bench::time_graph_ms;
using ms::bench::time_ms;

// The BF16 GEMV on GLM-5's BF16 linears (n = outputs, k = inputs) at decode row counts, against what the BF16
// path ran before it on the same inputs: x cast to a bf16 scratch, then a cuBLASLt GEMM (which at these m
// splits k and adds a reduction kernel). Floor: weight bytes + x (f32) + y over the copy ceiling. Weight
// copies rotate so the working set exceeds L2.
// With `sweep`, every configuration the chooser considers is timed too (m = 1 and 8), and the chooser's pick
// is printed against the fastest, with bf16_gemv_config::estimate_us of both (for tuning its TimeModel).
void bench_bf16_gemv(double bw, bool sweep) {
  namespace mc = ms::cuda;
  struct Shape {
    const char* name;
    int n, k;
  };
  const Shape shapes[] = {
      {"q_a", 2048, 6144},         {"kv_a", 576, 6144},          {"indexer wk", 128, 6144},
      {"q_b", 16384, 2048},        {"indexer wq_b", 4096, 2048}, {"o_proj", 6144, 16384},
      {"dense gate", 12288, 6144}, {"dense down", 6144, 12288},  {"shared gate", 2048, 6144},
      {"shared down", 6144, 2048}, {"lm_head", 154880, 6144},
  };
  mc::BlasLtHandle lt;
  const auto limits = mc::limits_of(mc::current_device_caps());
  if (sweep)
    std::printf("\n%-30s %9s %9s %-24s %9s %-24s %9s\n", "bf16_gemv sweep (glm5)", "floor us", "chosen us",
                "chosen (w/spb/spl/tpb)", "best us", "best", "est ch/bst");
  else
    std::printf("\n%-30s %8s %9s %9s %7s %9s %7s %7s\n", "bf16 linear (glm5)", "MB", "floor us", "gemv us",
                "% copy", "cuBLAS us", "% copy", "speedup");
  for (const auto& s : shapes) {
    const size_t wbytes = static_cast<size_t>(s.n) * s.k * 2;
    const int reps = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / wbytes + 1, 1, 16));
    std::vector<__nv_bfloat16*> dw(reps);
    for (auto& d : dw) {
      CUDA_CHECK(cudaMalloc(&d, wbytes));
      CUDA_CHECK(cudaMemset(d, 0x3c, wbytes));  // bf16 0x3c3c ~ 0.0115
    }
    const int max_m = mc::kBf16GemvMaxM;
    float *x, *y, *partial = nullptr;
    uint32_t* counters = nullptr;
    __nv_bfloat16* xb;
    CUDA_CHECK(cudaMalloc(&x, static_cast<size_t>(max_m) * s.k * 4));
    CUDA_CHECK(cudaMemset(x, 0x3f, static_cast<size_t>(max_m) * s.k * 4));  // ~0.75
    CUDA_CHECK(cudaMalloc(&xb, static_cast<size_t>(max_m) * s.k * 2));
    CUDA_CHECK(cudaMalloc(&y, static_cast<size_t>(max_m) * s.n * 4));
    const auto scratch = mc::bf16_gemv_scratch_bytes(max_m, s.n, s.k);
    if (scratch.partial_bytes) CUDA_CHECK(cudaMalloc(&partial, scratch.partial_bytes));
    if (scratch.counter_bytes) {
      CUDA_CHECK(cudaMalloc(&counters, scratch.counter_bytes));
      CUDA_CHECK(cudaMemset(counters, 0, scratch.counter_bytes));
    }
    // Microseconds per call of bf16_gemv at m rows (with `c`, that configuration instead of the chooser's),
    // `calls` captured in a graph; `graphed` says whether capture worked.
    auto time_config = [&](int m, const mc::bf16_gemv_config::Config* c, int calls, bool& graphed) {
      int which = 0;
      const float t = time_graph_ms(
          [&](cudaStream_t st) {
            mc::Bf16GemvParams p;
            p.x = x;
            p.x_stride = s.k;
            p.w = dw[which];
            p.w_stride = s.k;
            p.y = y;
            p.y_stride = s.n;
            p.m = m;
            p.n = s.n;
            p.k = s.k;
            p.partial = partial;
            p.counters = counters;
            if (c)
              mc::bf16_gemv_with(p, *c, st);
            else
              mc::bf16_gemv(p, st);
            which = (which + 1) % reps;
          },
          calls, 3, &graphed);
      return t * 1e3f;
    };
    for (int m : {1, 8}) {
      if (!sweep) break;
      namespace bc = mc::bf16_gemv_config;
      const bc::Config chosen = bc::choose(m, s.n, s.k, limits);
      bool graphed = false;
      const float t_chosen = time_config(m, &chosen, 10, graphed);
      bc::Config best = chosen;
      float t_best = t_chosen;
      const int tiles = bc::ceil_div(s.n, bc::kTileRows);
      for (int spb = chosen.slices; spb >= 1; --spb) {
        const int splits = bc::ceil_div(chosen.slices, spb);
        if (spb < chosen.slices && bc::ceil_div(chosen.slices, spb + 1) == splits) continue;
        for (int tpb = 1; tpb <= std::min(bc::kMaxTilesPerBlock, tiles); ++tpb) {
          const bc::Config c{chosen.warps, chosen.slices, spb, splits, tpb, bc::ceil_div(tiles, tpb)};
          const float t = time_config(m, &c, 10, graphed);
          if (t < t_best) {
            t_best = t;
            best = c;
          }
        }
      }
      const double floor_us =
          (static_cast<double>(wbytes) + m * s.k * 4.0 + m * static_cast<double>(s.n) * 4.0) / (bw * 1e9) *
          1e6;
      char name[64], cs[32], bs[32];
      std::snprintf(name, sizeof name, "%s %dx%d m%d", s.name, s.n, s.k, m);
      std::snprintf(cs, sizeof cs, "%d/%d/%d/%d", chosen.warps, chosen.slices_per_block, chosen.splits,
                    chosen.tiles_per_block);
      std::snprintf(bs, sizeof bs, "%d/%d/%d/%d", best.warps, best.slices_per_block, best.splits,
                    best.tiles_per_block);
      std::printf("%-30s %9.2f %9.2f %-24s %9.2f %-24s %4.1f/%4.1f\n", name, floor_us, t_chosen, cs, t_best,
                  bs, bc::estimate_us(m, s.n, s.k, chosen, limits),
                  bc::estimate_us(m, s.n, s.k, best, limits));
    }
    for (int m : {1, 2, 4, 8}) {
      if (sweep) break;
      bool g1 = false, g2 = false;
      const float t_gemv = time_config(m, nullptr, 20, g1) * 1e-3f;
      int which = 0;
      const float t_lt = time_graph_ms(
          [&](cudaStream_t st) {
            mc::GemmBf16Params g;
            g.x_f32 = x;
            g.x_f32_stride = s.k;
            g.x_bf16 = xb;
            g.x_bf16_stride = s.k;
            g.w = dw[which];
            g.w_stride = s.k;
            g.y = y;
            g.y_stride = s.n;
            g.m = m;
            g.n = s.n;
            g.k = s.k;
            mc::gemm_bf16(g, lt, st);
            which = (which + 1) % reps;
          },
          20, 3, &g2);
      if (!g1 || !g2) std::printf("(graph capture refused: plain launches)\n");
      const double bytes = static_cast<double>(wbytes) + m * s.k * 4.0 + m * static_cast<double>(s.n) * 4.0;
      const double floor_us = bytes / (bw * 1e9) * 1e6;
      char name[64];
      std::snprintf(name, sizeof name, "%s %dx%d m%d", s.name, s.n, s.k, m);
      std::printf("%-30s %8.1f %9.2f %9.2f %6.0f%% %9.2f %6.0f%% %6.2fx\n", name, bytes / 1e6, floor_us,
                  t_gemv * 1e3, 100.0 * floor_us / (t_gemv * 1e3), t_lt * 1e3,
                  100.0 * floor_us / (t_lt * 1e3), t_lt / t_gemv);
    }
    for (auto* d : dw) cudaFree(d);
    cudaFree(x);
    cudaFree(xb);
    cudaFree(y);
    cudaFree(partial);
    cudaFree(counters);
  }
}

// MLA decode over the paged fp8 cache. Floor: the KV bytes of every sequence (seq_len * 576) + q + out. Pages
// are spread at random over a pool of at least 256 MB and several block tables rotate through it, so a short
// context is not served from L2 by the previous iteration.
void bench_mla_decode(const ms::cuda::DeviceCaps& caps, double bw) {
  using ms::cuda::kMlaHeadDim;
  using ms::cuda::kMlaPageSize;
  struct Shape {
    const char* name;
    int batch, len, heads;
  };
  const Shape shapes[] = {
      {"mla_decode h64 b1 4k", 1, 4096, 64},     {"mla_decode h64 b8 4k", 8, 4096, 64},
      {"mla_decode h64 b32 4k", 32, 4096, 64},   {"mla_decode h64 b1 32k", 1, 32768, 64},
      {"mla_decode h64 b8 32k", 8, 32768, 64},   {"mla_decode h64 b32 32k", 32, 32768, 64},
      {"mla_decode h128 b1 32k", 1, 32768, 128}, {"mla_decode h128 b32 4k", 32, 4096, 128},
  };
  const size_t page_bytes = size_t{kMlaPageSize} * kMlaHeadDim;
  std::mt19937 rng(11);
  for (const auto& s : shapes) {
    const int pages_per_seq = (s.len + kMlaPageSize - 1) / kMlaPageSize;
    const int need = s.batch * pages_per_seq;
    const int pool_pages = std::max(need, static_cast<int>((size_t{256} << 20) / page_bytes));
    const int reps = std::min(8, pool_pages / need);
    uint8_t* pool;
    CUDA_CHECK(cudaMalloc(&pool, pool_pages * page_bytes));
    CUDA_CHECK(cudaMemset(pool, 0x38, pool_pages * page_bytes));  // fp8 1.0
    std::vector<int> perm(pool_pages);
    for (int i = 0; i < pool_pages; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t*> tables(reps);
    for (int r = 0; r < reps; ++r) {
      std::vector<int32_t> t(perm.begin() + static_cast<size_t>(r) * need,
                             perm.begin() + static_cast<size_t>(r + 1) * need);
      CUDA_CHECK(cudaMalloc(&tables[r], t.size() * 4));
      CUDA_CHECK(cudaMemcpy(tables[r], t.data(), t.size() * 4, cudaMemcpyHostToDevice));
    }
    std::vector<int32_t> lens(s.batch, s.len);
    int32_t* dlens;
    CUDA_CHECK(cudaMalloc(&dlens, lens.size() * 4));
    CUDA_CHECK(cudaMemcpy(dlens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
    __nv_bfloat16* q;
    float* out;
    const size_t q_elems = static_cast<size_t>(s.batch) * s.heads * kMlaHeadDim;
    const size_t out_elems = static_cast<size_t>(s.batch) * s.heads * ms::cuda::kMlaLatentDim;
    CUDA_CHECK(cudaMalloc(&q, q_elems * 2));
    CUDA_CHECK(cudaMemset(q, 0, q_elems * 2));
    CUDA_CHECK(cudaMalloc(&out, out_elems * 4));
    void* ws;
    CUDA_CHECK(cudaMalloc(&ws, ms::cuda::mla_decode_workspace_bytes(s.batch, s.heads, caps.multiprocessors)));
    ms::cuda::MlaDecodeParams p;
    p.q = q;
    p.q_batch_stride = static_cast<int64_t>(s.heads) * kMlaHeadDim;
    p.kv = pool;
    p.kv_scale = 1.f;
    p.block_table = tables[0];
    p.block_table_stride = pages_per_seq;
    p.seq_lens = dlens;
    p.out = out;
    p.out_batch_stride = static_cast<int64_t>(s.heads) * ms::cuda::kMlaLatentDim;
    p.batch = s.batch;
    p.heads = s.heads;
    p.num_pages = pool_pages;
    p.softmax_scale = 0.0625f;
    p.split_target = caps.multiprocessors;
    p.workspace = ws;
    ms::cuda::mla_decode_plan(p, nullptr);  // once per step, shared by every layer: not in the timing
    CUDA_CHECK(cudaDeviceSynchronize());
    int which = 0;
    bool graphed = false;
    float t = time_graph_ms(
        [&](cudaStream_t st) {
          p.block_table = tables[which];
          ms::cuda::mla_decode(p, st);
          which = (which + 1) % reps;
        },
        20, 3, &graphed);
    if (!graphed) std::printf("(graph capture refused: plain launches)\n");
    const double bytes = static_cast<double>(s.batch) * s.len * kMlaHeadDim + q_elems * 2.0 + out_elems * 4.0;
    const double floor_us = bytes / (bw * 1e9) * 1e6;
    const double flops = 2.0 * s.batch * s.len * s.heads * (kMlaHeadDim + ms::cuda::kMlaLatentDim);
    char name[96];
    std::snprintf(name, sizeof name, "%s (%.0f TFLOP/s)", s.name, flops / (t * 1e-3) / 1e12);
    std::printf("%-34s %8.1f %10.2f %10.2f %10.0f %7.0f%%\n", name, bytes / 1e6, floor_us, t * 1e3,
                bytes / (t * 1e-3) / 1e9, 100.0 * floor_us / (t * 1e3));
    for (auto* tb : tables) cudaFree(tb);
    cudaFree(pool);
    cudaFree(dlens);
    cudaFree(q);
    cudaFree(out);
    cudaFree(ws);
  }
}

// The two MLA weight-absorption products on GLM-5's shape (64 heads, nope 192, v 256, kv_lora_rank 512,
// rope 64), streaming and simple kernels. Floor: W_UK (absorb_q) or W_UV (out_v) in its stored format plus
// the f32 activations in and out. Several copies of kv_b_proj rotate so the weights come from memory, not L2.
void bench_mla_absorb(double bw) {
  namespace mc = ms::cuda;
  const int heads = 64, nope = 192, rope = 64, v = 256, r = 512, reps = 4;
  const int64_t rows = static_cast<int64_t>(heads) * (nope + v);
  for (auto f : {mc::DenseWeightFormat::BF16, mc::DenseWeightFormat::FP8Block}) {
    const size_t es = f == mc::DenseWeightFormat::BF16 ? 2 : 1;
    const size_t wbytes = static_cast<size_t>(rows) * r * es,
                 sbytes = ((rows + 127) / 128) * ((r + 127) / 128) * 4;
    std::vector<uint8_t> hw(wbytes);
    std::mt19937 rng(3);
    if (es == 2) {
      auto* h = reinterpret_cast<uint16_t*>(hw.data());
      for (size_t i = 0; i < wbytes / 2; ++i) h[i] = static_cast<uint16_t>(0x3c00 + rng() % 0x200);  // ~0.01
    } else {
      for (auto& b : hw) b = static_cast<uint8_t>(0x30 + rng() % 16);
    }
    std::vector<float> hs(sbytes / 4, 1.f / 448.f);
    std::vector<uint8_t*> dw(reps);
    float* ds;
    CUDA_CHECK(cudaMalloc(&ds, sbytes));
    CUDA_CHECK(cudaMemcpy(ds, hs.data(), sbytes, cudaMemcpyHostToDevice));
    for (auto& d : dw) {
      CUDA_CHECK(cudaMalloc(&d, wbytes));
      CUDA_CHECK(cudaMemcpy(d, hw.data(), wbytes, cudaMemcpyHostToDevice));
    }
    for (int m : {1, 8, 64}) {
      float *x, *y;
      const size_t xn = static_cast<size_t>(m) * heads * std::max(nope + rope, r);
      const size_t yn = static_cast<size_t>(m) * heads * std::max(r + rope, v);
      CUDA_CHECK(cudaMalloc(&x, xn * 4));
      CUDA_CHECK(cudaMemset(x, 0, xn * 4));
      CUDA_CHECK(cudaMalloc(&y, yn * 4));
      for (auto kernel : {mc::MlaAbsorbKernel::Streaming, mc::MlaAbsorbKernel::Simple})
        for (int op = 0; op < 2; ++op) {
          int which = 0;
          bool graphed = false;
          const float t = time_graph_ms(
              [&](cudaStream_t st) {
                mc::DenseWeightView w;
                w.format = f;
                w.rows = rows;
                w.cols = r;
                w.data = dw[which];
                w.scale = ds;
                if (op == 0) {
                  mc::MlaAbsorbQParams p;
                  p.q = x;
                  p.kv_b = w;
                  p.q_cat = y;
                  p.m = m;
                  p.heads = heads;
                  p.nope = nope;
                  p.rope = rope;
                  p.v = v;
                  p.kv_lora_rank = r;
                  p.kernel = kernel;
                  mc::mla_absorb_q(p, st);
                } else {
                  mc::MlaOutVParams p;
                  p.lat = x;
                  p.kv_b = w;
                  p.out = y;
                  p.m = m;
                  p.heads = heads;
                  p.nope = nope;
                  p.v = v;
                  p.kv_lora_rank = r;
                  p.kernel = kernel;
                  mc::mla_out_v(p, st);
                }
                which = (which + 1) % reps;
              },
              40, 3, &graphed);
          if (!graphed) std::printf("(graph capture refused: plain launches)\n");
          const double weight = static_cast<double>(heads) * (op == 0 ? nope : v) * r * es;
          const double act = op == 0 ? static_cast<double>(m) * heads * (nope + rope + r + rope) * 4.0
                                     : static_cast<double>(m) * heads * (r + v) * 4.0;
          const double bytes = weight + act + (es == 1 ? sbytes / 2.0 : 0.0);
          const double floor_us = bytes / (bw * 1e9) * 1e6;
          char name[96];
          std::snprintf(name, sizeof name, "mla %s glm5 %s m%d %s", op == 0 ? "absorb_q" : "out_v",
                        es == 2 ? "bf16" : "fp8", m,
                        kernel == mc::MlaAbsorbKernel::Streaming ? "stream" : "simple");
          std::printf("%-34s %8.1f %10.2f %10.2f %10.0f %7.0f%%\n", name, bytes / 1e6, floor_us, t * 1e3,
                      bytes / (t * 1e-3) / 1e9, 100.0 * floor_us / (t * 1e3));
        }
      cudaFree(x);
      cudaFree(y);
    }
    for (auto* d : dw) cudaFree(d);
    cudaFree(ds);
  }
}

}  // namespace

// FP8-block weights (e4m3, f32 scale per 128 x 128 block) at decode row counts: fp8_block_gemv against the
// path before it (the weight rows expanded to a bf16 scratch, x cast, a cuBLASLt GEMM), both through
// linear(). Floor: fp8 weight bytes + scales + x (f32) + y over the copy ceiling.
void bench_fp8_gemv(double bw) {
  namespace mc = ms::cuda;
  struct Shape {
    const char* name;
    int n, k;
  };
  const Shape shapes[] = {{"q_a", 2048, 6144},      {"kv_a", 576, 6144},         {"q_b", 16384, 2048},
                          {"o_proj", 6144, 16384},  {"dense gate", 12288, 6144}, {"shared down", 6144, 2048},
                          {"lm_head", 154880, 6144}};
  mc::BlasLtHandle lt;
  std::printf("\n%-30s %8s %9s %9s %7s %9s %7s %7s\n", "fp8-block linear (glm5)", "MB", "floor us", "gemv us",
              "% copy", "deq+cuBLAS", "% copy", "speedup");
  for (const auto& s : shapes) {
    const size_t wbytes = static_cast<size_t>(s.n) * s.k;
    const size_t sbytes = static_cast<size_t>((s.n + 127) / 128) * ((s.k + 127) / 128) * 4;
    const int reps = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / wbytes + 1, 1, 16));
    std::vector<uint8_t*> dw(reps);
    for (auto& d : dw) {
      CUDA_CHECK(cudaMalloc(&d, wbytes));
      CUDA_CHECK(cudaMemset(d, 0x30, wbytes));  // e4m3 0.5
    }
    float *scale, *x, *y, *partial = nullptr;
    uint32_t* counters = nullptr;
    __nv_bfloat16 *xb, *wb;
    CUDA_CHECK(cudaMalloc(&scale, sbytes));
    CUDA_CHECK(cudaMemset(scale, 0x3c, sbytes));  // ~0.0115
    const int max_m = mc::kBf16GemvMaxM;
    CUDA_CHECK(cudaMalloc(&x, static_cast<size_t>(max_m) * s.k * 4));
    CUDA_CHECK(cudaMemset(x, 0x3f, static_cast<size_t>(max_m) * s.k * 4));
    CUDA_CHECK(cudaMalloc(&y, static_cast<size_t>(max_m) * s.n * 4));
    CUDA_CHECK(cudaMalloc(&xb, static_cast<size_t>(max_m) * s.k * 2));
    CUDA_CHECK(cudaMalloc(&wb, wbytes * 2));
    const auto scratch = mc::fp8_block_gemv_scratch_bytes(max_m, s.n, s.k);
    if (scratch.partial_bytes) CUDA_CHECK(cudaMalloc(&partial, scratch.partial_bytes));
    if (scratch.counter_bytes) {
      CUDA_CHECK(cudaMalloc(&counters, scratch.counter_bytes));
      CUDA_CHECK(cudaMemset(counters, 0, scratch.counter_bytes));
    }
    for (int m : {1, 8}) {
      auto time_path = [&](mc::LinearPath path) {
        int which = 0;
        bool graphed = false;
        const float t = time_graph_ms(
            [&](cudaStream_t st) {
              mc::LinearParams p;
              p.x = x;
              p.x_stride = s.k;
              p.w.format = mc::WeightFormat::FP8Block;
              p.w.rows = s.n;
              p.w.cols = s.k;
              p.w.data = dw[which];
              p.w.scale = scale;
              p.w.block = 128;
              p.n = s.n;
              p.y = y;
              p.y_stride = s.n;
              p.m = m;
              p.x_scratch = xb;
              p.w_scratch = wb;
              p.gemv_partial = partial;
              p.gemv_counters = counters;
              mc::linear(p, path, lt, st);
              which = (which + 1) % reps;
            },
            20, 3, &graphed);
        if (!graphed) std::printf("(graph capture refused: plain launches)\n");
        return t * 1e3f;
      };
      const float t_gemv = time_path(mc::LinearPath::GemvFp8Block);
      const float t_old = time_path(mc::LinearPath::DequantBlasLt);
      const double bytes =
          static_cast<double>(wbytes + sbytes) + m * s.k * 4.0 + m * static_cast<double>(s.n) * 4.0;
      const double floor_us = bytes / (bw * 1e9) * 1e6;
      char name[64];
      std::snprintf(name, sizeof name, "%s %dx%d m%d", s.name, s.n, s.k, m);
      std::printf("%-30s %8.1f %9.2f %9.2f %6.0f%% %9.2f %6.0f%% %6.2fx\n", name, bytes / 1e6, floor_us,
                  t_gemv, 100.0 * floor_us / t_gemv, t_old, 100.0 * floor_us / t_old, t_old / t_gemv);
    }
    for (auto* d : dw) cudaFree(d);
    cudaFree(scale);
    cudaFree(x);
    cudaFree(y);
    cudaFree(xb);
    cudaFree(wb);
    cudaFree(partial);
    cudaFree(counters);
  }
}

// Usage: bench_cuda_kernels [section...] with sections nvfp4, bf16, fp8, mla (default: all of them) and
// bf16sweep (every bf16_gemv configuration, only when named).
int main(int argc, char** argv) {
  if (ms::cuda::device_count() == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  auto want = [&](const char* section) {
    if (argc < 2) return true;
    for (int i = 1; i < argc; ++i)
      if (std::strcmp(argv[i], section) == 0) return true;
    return false;
  };
  auto caps = ms::cuda::query_device(0);
  double bw = measure_copy_gbs();
  std::printf("device: %s (sm_%d, %d SMs, %zu KiB smem/block opt-in)\n", caps.name.c_str(), caps.arch(),
              caps.multiprocessors, caps.smem_per_block_optin / 1024);
  std::printf("ceiling: device-to-device copy %.0f GB/s (read + write)\n", bw);
  std::printf("times: per call, replayed from a CUDA graph of 20-50 calls (decode runs under graphs)\n\n");
  if (want("bf16")) bench_bf16_gemv(bw, false);
  if (want("fp8")) bench_fp8_gemv(bw);
  if (argc > 1 && want("bf16sweep")) bench_bf16_gemv(bw, true);
  if (!want("nvfp4") && !want("mla")) return 0;
  std::printf("\n%-34s %8s %10s %10s %10s %8s\n", "kernel", "MB", "floor us", "time us", "GB/s", "% floor");

  struct Shape {
    const char* name;
    int m, n, k, reps;  // reps: independent weight copies cycled so the working set exceeds L2
  };
  const Shape shapes[] = {
      {"nvfp4_gemv glm5 expert gate_up m1", 1, 4096, 6144, 16},
      {"nvfp4_gemv glm5 expert down m1", 1, 6144, 2048, 32},
      {"nvfp4_gemv glm5 9 experts gate_up m1", 1, 9 * 4096, 6144, 4},
      {"nvfp4_gemv glm5 9 experts gate_up m8", 8, 9 * 4096, 6144, 4},
      {"nvfp4_gemv 16384x16384 m1", 1, 16384, 16384, 2},
      {"nvfp4_gemv 16384x16384 m4", 4, 16384, 16384, 2},
      {"nvfp4_gemv 16384x16384 m8", 8, 16384, 16384, 2},
  };
  std::mt19937 rng(7);
  for (const auto& s : shapes) {
    if (!want("nvfp4")) break;
    const size_t wbytes = static_cast<size_t>(s.n) * s.k / 2, sbytes = static_cast<size_t>(s.n) * s.k / 16;
    std::vector<uint8_t> hw(wbytes), hs(sbytes);
    for (auto& b : hw) b = static_cast<uint8_t>(rng());
    for (auto& b : hs) b = static_cast<uint8_t>(0x30 + rng() % 8);  // small positive e4m3 scales
    std::vector<uint8_t*> dw(s.reps), ds(s.reps);
    for (int r = 0; r < s.reps; ++r) {
      CUDA_CHECK(cudaMalloc(&dw[r], wbytes));
      CUDA_CHECK(cudaMalloc(&ds[r], sbytes));
      CUDA_CHECK(cudaMemcpy(dw[r], hw.data(), wbytes, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(ds[r], hs.data(), sbytes, cudaMemcpyHostToDevice));
    }
    __nv_bfloat16* x;
    float *xf, *y;
    CUDA_CHECK(cudaMalloc(&x, static_cast<size_t>(s.m) * s.k * 2));
    CUDA_CHECK(cudaMemset(x, 0, static_cast<size_t>(s.m) * s.k * 2));
    CUDA_CHECK(cudaMalloc(&xf, static_cast<size_t>(s.m) * s.k * 4));
    CUDA_CHECK(cudaMemset(xf, 0, static_cast<size_t>(s.m) * s.k * 4));
    CUDA_CHECK(cudaMalloc(&y, static_cast<size_t>(s.m) * s.n * 4));
    float* ws = nullptr;
    const size_t ws_bytes = ms::cuda::nvfp4_gemv_workspace_bytes(s.m, s.n, s.k);
    if (ws_bytes) CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    uint32_t* counters = nullptr;
    CUDA_CHECK(cudaMalloc(&counters, ms::cuda::nvfp4_gemv_counter_bytes(s.n)));
    CUDA_CHECK(cudaMemset(counters, 0, ms::cuda::nvfp4_gemv_counter_bytes(s.n)));
    // bf16 x (cast by the caller) with the reduction pass; f32 x rounded in the kernel, k-slices added by the
    // last block (what the ops layer runs).
    for (bool f32x : {false, true}) {
      int which = 0;
      bool graphed = false;
      float t = time_graph_ms(
          [&](cudaStream_t st) {
            ms::cuda::Nvfp4GemvParams p{dw[which], ds[which], 1.f, f32x ? nullptr : x, y, s.m, s.n, s.k, ws};
            p.x_f32 = f32x ? xf : nullptr;
            p.counters = f32x ? counters : nullptr;
            ms::cuda::nvfp4_gemv(p, st);
            which = (which + 1) % s.reps;
          },
          50, 3, &graphed);
      if (!graphed) std::printf("(graph capture refused: plain launches)\n");
      double bytes = static_cast<double>(wbytes + sbytes) + s.m * s.k * (f32x ? 4.0 : 2.0) + s.m * s.n * 4.0;
      double floor_us = bytes / (bw * 1e9) * 1e6;
      char name[96];
      std::snprintf(name, sizeof name, "%s%s", s.name, f32x ? " f32x 1 pass" : "");
      std::printf("%-34s %8.1f %10.2f %10.2f %10.0f %7.0f%%\n", name, bytes / 1e6, floor_us, t * 1e3,
                  bytes / (t * 1e-3) / 1e9, 100.0 * floor_us / (t * 1e3));
    }
    for (int r = 0; r < s.reps; ++r) {
      cudaFree(dw[r]);
      cudaFree(ds[r]);
    }
    cudaFree(x);
    cudaFree(xf);
    cudaFree(y);
    cudaFree(ws);
    cudaFree(counters);
  }
  if (want("mla")) {
    bench_mla_decode(caps, bw);
    bench_mla_absorb(bw);
  }
  return 0;
}
