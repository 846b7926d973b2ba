// Routed experts on GLM-5 shapes (256 experts, top-8, hidden 6144, moe intermediate 2048, NVFP4), tokens per
// step 1 .. 8192, uniform and skewed routing: the copy ceiling measured first in the same run, then per case
// the time of moe_experts (the path it takes: register-streamed decode, else streamed decode, else the
// grouped kernels; MOE_BENCH_PATH=stream forces the streamed one, =decode times only the path taken, and by
// default the streamed path is timed as well in a "stream us" column where decode applies) and of the old
// grouped kernels, the bytes of the touched experts, GB/s, % of the copy ceiling, and cuBLAS BF16 on the same
// routed problem (per touched expert: gate_up GEMM, down GEMM, over BF16 copies of those experts; SiLU and
// the combine are not timed for it, which favours cuBLAS). Times are per step, replayed from a CUDA graph.
// One table on stdout. MOE_BENCH_FORMAT=fp8 runs the same on DeepSeek-V3's FP8-block experts (hidden 7168,
// intermediate 2048, e4m3 weights with one f32 scale per 128x128 block; the FP8 decode path where it
// applies).
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_bench.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_experts_decode.h"
#include "kernels/cuda/moe/moe_experts_decode_fp8.h"
#include "kernels/cuda/moe/moe_experts_stream.h"
#include "kernels/cuda/moe/moe_plan.h"

namespace {

constexpr int kE = 256, kK = 8;
// hidden and moe intermediate: GLM-5's (6144, 2048) for NVFP4, DeepSeek-V3's (7168, 2048) for
// MOE_BENCH_FORMAT=fp8; set once in main.
int H = 6144, I = 2048;

#define CUBLAS_OK(x) MS_CHECK((x) == CUBLAS_STATUS_SUCCESS, "cuBLAS call failed: {}", #x)

using ms::bench::measure_copy_gbs;
using ms::bench::time_graph_ms;

std::vector<int32_t> route(int m, bool skewed, std::mt19937& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(m) * kK);
  std::vector<double> pw(kE);
  for (int e = 0; e < kE; ++e) pw[e] = skewed ? 1.0 / ((e + 1.0) * (e + 1.0)) : 1.0;
  for (int t = 0; t < m; ++t) {
    std::vector<double> w = pw;
    for (int k = 0; k < kK; ++k) {
      std::discrete_distribution<int> d(w.begin(), w.end());
      const int e = d(rng);
      w[e] = 0.0;
      ids[static_cast<size_t>(t) * kK + k] = e;
    }
  }
  return ids;
}

}  // namespace

int main() {
  if (ms::cuda::device_count() == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  const char* format_env = std::getenv("MOE_BENCH_FORMAT");
  const std::string format = format_env && *format_env ? format_env : "nvfp4";
  if (format != "nvfp4" && format != "fp8") {
    std::fprintf(stderr, "MOE_BENCH_FORMAT: expected nvfp4 or fp8, got '%s'\n", format.c_str());
    return 2;
  }
  const bool fp8 = format == "fp8";
  if (fp8) H = 7168;
  const auto caps = ms::cuda::query_device(0);
  const double bw = measure_copy_gbs();
  std::printf("device: %s (sm_%d, %d SMs)\nceiling: device-to-device copy %.0f GB/s (read + write)\n",
              caps.name.c_str(), caps.arch(), caps.multiprocessors, bw);
  std::printf("%s routed experts: %d experts, top-%d, hidden %d, intermediate %d, %s; times per step\n\n",
              fp8 ? "DeepSeek-V3" : "GLM-5", kE, kK, H, I, fp8 ? "FP8 128x128 blocks" : "NVFP4");

  // NVFP4 experts: random codes, small positive e4m3 scales. Two copies of every expert, alternated per step,
  // so a step does not find the previous step's experts in L2.
  constexpr int kCopies = 2;
  // FP8 blocks: e4m3 [rows, cols] and f32 scales [rows / 128, cols / 128] (multiples of 16 bytes here).
  const size_t gu_bytes = fp8 ? size_t(I) * H : size_t(I) * H / 2;
  const size_t gu_sbytes = fp8 ? size_t(I / 128) * (H / 128) * 4 : size_t(I) * H / 16;
  const size_t dn_bytes = gu_bytes, dn_sbytes = gu_sbytes;
  const size_t per_expert = 2 * (gu_bytes + gu_sbytes) + dn_bytes + dn_sbytes;
  uint8_t* pool;
  CUDA_CHECK(cudaMalloc(&pool, per_expert * kE * kCopies));
  {
    std::mt19937 rng(5);
    std::vector<uint8_t> h(per_expert);
    // FP8: random e4m3 codes with bits 6 and 3 clear (exponents <= 6: no NaN), scales 1e-3.
    for (auto& b : h) b = static_cast<uint8_t>(rng()) & (fp8 ? 0xb7u : 0xffu);
    for (int i = 0; i < kE * kCopies; ++i) {
      if (fp8) {
        const float s = 1e-3f;
        for (size_t o : {gu_bytes, 2 * gu_bytes + gu_sbytes, 2 * (gu_bytes + gu_sbytes) + dn_bytes})
          for (size_t j = 0; j < gu_sbytes; j += 4) std::memcpy(h.data() + o + j, &s, 4);
        CUDA_CHECK(cudaMemcpy(pool + per_expert * i, h.data(), per_expert, cudaMemcpyHostToDevice));
        continue;
      }
      // scales: small positive e4m3 (0x30..0x37) at the scale offsets
      uint8_t* base = h.data();
      for (size_t o : {gu_bytes, 2 * gu_bytes + gu_sbytes, 2 * (gu_bytes + gu_sbytes) + dn_bytes}) {
        const size_t n = o == 2 * (gu_bytes + gu_sbytes) + dn_bytes ? dn_sbytes : gu_sbytes;
        for (size_t j = 0; j < n; ++j) base[o + j] = static_cast<uint8_t>(0x30 + (j % 8));
      }
      CUDA_CHECK(cudaMemcpy(pool + per_expert * i, h.data(), per_expert, cudaMemcpyHostToDevice));
    }
  }
  std::vector<ms::cuda::MoeExpertWeights*> tables(kCopies);
  for (int c = 0; c < kCopies; ++c) {
    std::vector<ms::cuda::MoeExpertWeights> t(kE);
    for (int e = 0; e < kE; ++e) {
      const uint8_t* b = pool + per_expert * (static_cast<size_t>(c) * kE + e);
      t[e] = {b,
              b + gu_bytes,
              b + gu_bytes + gu_sbytes,
              b + 2 * gu_bytes + gu_sbytes,
              b + 2 * (gu_bytes + gu_sbytes),
              b + 2 * (gu_bytes + gu_sbytes) + dn_bytes,
              fp8 ? 1.f : 1e-3f,
              fp8 ? 1.f : 1e-3f,
              fp8 ? 1.f : 1e-3f,
              0.f};
    }
    CUDA_CHECK(cudaMalloc(&tables[c], kE * sizeof(ms::cuda::MoeExpertWeights)));
    CUDA_CHECK(
        cudaMemcpy(tables[c], t.data(), kE * sizeof(ms::cuda::MoeExpertWeights), cudaMemcpyHostToDevice));
  }
  // BF16 copies for cuBLAS: one gate_up [2I, H] and one down [H, I] per touched expert (up to 64 distinct).
  constexpr int kBf16Experts = 64;
  __nv_bfloat16 *bw_gu, *bw_dn;
  CUDA_CHECK(cudaMalloc(&bw_gu, size_t{kBf16Experts} * 2 * I * H * 2));
  CUDA_CHECK(cudaMalloc(&bw_dn, size_t{kBf16Experts} * H * I * 2));
  CUDA_CHECK(cudaMemset(bw_gu, 0, size_t{kBf16Experts} * 2 * I * H * 2));
  CUDA_CHECK(cudaMemset(bw_dn, 0, size_t{kBf16Experts} * H * I * 2));
  cublasHandle_t blas;
  CUBLAS_OK(cublasCreate(&blas));

  // MOE_BENCH_PATH: "both" (default: the path moe_experts takes, and the streamed path too where the decode
  // path is taken), "decode" (only the path taken), "stream" (the decode path switched off).
  const char* path_env = std::getenv("MOE_BENCH_PATH");
  const std::string path_mode = path_env && *path_env ? path_env : "both";
  if (path_mode != "both" && path_mode != "decode" && path_mode != "stream") {
    std::fprintf(stderr, "MOE_BENCH_PATH: expected both, decode or stream, got '%s'\n", path_mode.c_str());
    return 2;
  }
  std::printf("%-8s %-8s %7s %9s %10s %8s %8s %10s %10s %9s %9s %10s %8s\n", "tokens", "routing", "experts",
              "MB", "floor us", "path", "time us", "GB/s", "% copy", "stream us", "old us", "cuBLAS us",
              "speedup");
  // MOE_BENCH_TOKENS=1,32 runs only those token counts (e.g. under a kernel profiler); MOE_BENCH_PEERS=0
  // leaves out the old kernels and cuBLAS.
  std::vector<int> token_counts = {1, 8, 32, 128, 512, 8192};
  if (const char* env = std::getenv("MOE_BENCH_TOKENS"); env && *env) {
    token_counts.clear();
    for (const char* c = env; *c;) {
      char* end = nullptr;
      const long v = std::strtol(c, &end, 10);
      if (end == c || v <= 0) {
        std::fprintf(stderr,
                     "MOE_BENCH_TOKENS: expected a comma-separated list of positive counts, got '%s'\n", env);
        return 2;
      }
      token_counts.push_back(static_cast<int>(v));
      c = *end == ',' ? end + 1 : end;
    }
  }
  const char* peers_env = std::getenv("MOE_BENCH_PEERS");
  const bool peers = !(peers_env && std::string(peers_env) == "0");
  std::mt19937 rng(9);
  for (int m : token_counts)
    for (bool skewed : {false, true}) {
      const auto ids = route(m, skewed, rng);
      std::vector<int> cnt(kE, 0);
      for (int32_t e : ids) ++cnt[e];
      int touched = 0;
      for (int c : cnt) touched += c > 0;
      const double bytes = static_cast<double>(touched) * per_expert;
      const double floor_us = bytes / (bw * 1e9) * 1e6;
      std::vector<float> wts(ids.size(), 0.125f), xh(static_cast<size_t>(m) * H, 0.01f);
      float *x, *w, *out, *act, *slot;
      int32_t *d_ids, *counts, *offsets, *sorted;
      CUDA_CHECK(cudaMalloc(&x, xh.size() * 4));
      CUDA_CHECK(cudaMemcpy(x, xh.data(), xh.size() * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMalloc(&w, wts.size() * 4));
      CUDA_CHECK(cudaMemcpy(w, wts.data(), wts.size() * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMalloc(&out, xh.size() * 4));
      CUDA_CHECK(cudaMemset(out, 0, xh.size() * 4));
      CUDA_CHECK(cudaMalloc(&d_ids, ids.size() * 4));
      CUDA_CHECK(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMalloc(&counts, kE * 4));
      CUDA_CHECK(cudaMalloc(&offsets, (kE + 1) * 4));
      CUDA_CHECK(cudaMalloc(&sorted, ids.size() * 4));
      CUDA_CHECK(cudaMalloc(&act, ms::cuda::moe_experts_act_bytes(m, kK, I)));
      CUDA_CHECK(cudaMalloc(&slot, ms::cuda::moe_experts_slot_out_bytes(m, kK, H)));
      ms::cuda::moe_plan({d_ids, counts, offsets, sorted, m, kK, kE}, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      ms::cuda::MoeExpertsParams p;
      p.x = x;
      p.ldx = H;
      p.topk_ids = d_ids;
      p.topk_weights = w;
      p.expert_counts = counts;
      p.expert_offsets = offsets;
      p.sorted_slots = sorted;
      p.format = fp8 ? ms::cuda::MoeWeightFormat::FP8Block : ms::cuda::MoeWeightFormat::NVFP4;
      p.fp8_block = 128;
      p.act = act;
      p.slot_out = slot;
      p.out = out;
      p.ldo = H;
      p.m = m;
      p.top_k = kK;
      p.n_experts = kE;
      p.hidden = H;
      p.inter = I;
      p.experts_aligned16 = true;
      p.disable_decode = path_mode == "stream";
      const bool decode = ms::cuda::moe_experts_decode_applies(p);
      const bool stream = ms::cuda::moe_experts_stream_applies(p);
      const bool decode_fp8 = ms::cuda::moe_experts_decode_fp8_applies(p);
      const char* path_name = decode ? "decode" : decode_fp8 ? "fp8dec" : stream ? "stream" : "grouped";
      const int iters = m <= 128 ? 20 : 3;
      int which = 0;
      auto run = [&](cudaStream_t s, bool disable, bool no_decode, int ring = 0, int variant = -1) {
        p.experts = tables[which];
        p.disable_stream = disable;
        p.disable_decode = no_decode;
        p.decode_ring = ring;
        p.decode_variant = variant;
        ms::cuda::moe_experts(p, s);
        which = (which + 1) % kCopies;
      };
      const bool forced_stream = path_mode == "stream";
      const float t_new = time_graph_ms([&](cudaStream_t s) { run(s, false, forced_stream); }, iters);
      // The decode path's cp.async ring variant (decode_ring = 1), timed in the same run, and the largest
      // |difference| of one step's output against the register kernels (same expert copy, out zeroed first;
      // they are meant to agree bit for bit).
      p.decode_ring = 1;
      const bool ring = decode && ms::cuda::moe_experts_decode_uses_ring(p);
      float t_ring = 0.f, ring_diff = 0.f;
      if (ring) {
        t_ring = time_graph_ms([&](cudaStream_t s) { run(s, false, false, 1); }, iters);
        std::vector<float> o[2];
        for (int v = 0; v < 2; ++v) {
          CUDA_CHECK(cudaMemset(out, 0, xh.size() * 4));
          which = 0;
          run(nullptr, false, false, v);
          CUDA_CHECK(cudaDeviceSynchronize());
          o[v].resize(xh.size());
          CUDA_CHECK(cudaMemcpy(o[v].data(), out, xh.size() * 4, cudaMemcpyDeviceToHost));
        }
        for (size_t i = 0; i < xh.size(); ++i) ring_diff = std::max(ring_diff, std::fabs(o[0][i] - o[1][i]));
        const auto rc = ms::cuda::moe_decode_config::choose(
            ms::cuda::moe_decode_shape(p), ms::cuda::limits_of(ms::cuda::current_device_caps()));
        std::printf(
            "%-8d %-8s decode ring (depth gate_up %d, down %d; registers on the next line): %.2f us, "
            "%.0f%% of floor, max |ring - registers| %g\n",
            m, skewed ? "skewed" : "uniform", rc.ring_depth_gate_up, rc.ring_depth_down, t_ring * 1e3,
            100.0 * floor_us / (t_ring * 1e3), ring_diff);
      }
      // The register kernels' variants (MoeDecodeVariant), each timed in the same run, one line each, with
      // the largest |difference| of one step's output against base (sc8 is meant to agree bit for bit, the
      // acc2 and half variants to the last bits of f32 sums).
      if (decode) {
        std::vector<float> o_base(xh.size()), o_v(xh.size());
        for (int v : ms::cuda::kMoeDecodeVariantList) {
          const float t_v = time_graph_ms([&](cudaStream_t s) { run(s, false, false, 0, v); }, iters);
          CUDA_CHECK(cudaMemset(out, 0, xh.size() * 4));
          which = 0;
          run(nullptr, false, false, 0, v);
          CUDA_CHECK(cudaDeviceSynchronize());
          CUDA_CHECK(cudaMemcpy((v == 0 ? o_base : o_v).data(), out, xh.size() * 4, cudaMemcpyDeviceToHost));
          float diff = 0.f;
          if (v > 0)
            for (size_t i = 0; i < xh.size(); ++i) diff = std::max(diff, std::fabs(o_v[i] - o_base[i]));
          std::printf(
              "%-8d %-8s decode registers, variant %-8s %.2f us, %.0f%% of floor, max |%s - base| %g\n", m,
              skewed ? "skewed" : "uniform", ms::cuda::moe_decode_variant_name(v), t_v * 1e3,
              100.0 * floor_us / (t_v * 1e3), ms::cuda::moe_decode_variant_name(v), diff);
        }
        // A 64-bit FNV-1a hash of base's output bytes: two builds of the kernels (a change to their math
        // meant to keep every bit) compare by this line.
        uint64_t hash = 1469598103934665603ull;
        for (const float f : o_base) {
          uint32_t u;
          std::memcpy(&u, &f, 4);
          for (int b = 0; b < 4; ++b) hash = (hash ^ ((u >> (8 * b)) & 0xffu)) * 1099511628211ull;
        }
        std::printf("%-8d %-8s decode registers, base output hash %016llx\n", m,
                    skewed ? "skewed" : "uniform", static_cast<unsigned long long>(hash));
      }
      const float t_stream = decode && stream && path_mode == "both"
                                 ? time_graph_ms([&](cudaStream_t s) { run(s, false, true); }, iters)
                                 : 0.f;
      const float t_old = peers ? time_graph_ms([&](cudaStream_t s) { run(s, true, true); }, iters) : 0.f;
      // cuBLAS BF16: per touched expert, gate_up [cnt, 2I] = x_e [cnt, H] @ W^T and down [cnt, H] = a [cnt,
      // I] @ D^T.
      __nv_bfloat16 *xb, *gub, *ab, *yb;
      const size_t rows = ids.size();
      CUDA_CHECK(cudaMalloc(&xb, rows * H * 2));
      CUDA_CHECK(cudaMalloc(&gub, rows * 2 * I * 2));
      CUDA_CHECK(cudaMalloc(&ab, rows * I * 2));
      CUDA_CHECK(cudaMalloc(&yb, rows * H * 2));
      CUDA_CHECK(cudaMemset(xb, 0, rows * H * 2));
      CUDA_CHECK(cudaMemset(ab, 0, rows * I * 2));
      const float one = 1.f, zero = 0.f;
      const float t_blas =
          !peers ? 0.f
                 : time_graph_ms(
                       [&](cudaStream_t s) {
                         CUBLAS_OK(cublasSetStream(blas, s));
                         size_t r0 = 0;
                         int slot_e = 0;
                         for (int e = 0; e < kE; ++e) {
                           if (cnt[e] == 0) continue;
                           const size_t eb = static_cast<size_t>(slot_e++ % kBf16Experts);
                           CUBLAS_OK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, 2 * I, cnt[e], H, &one,
                                                  bw_gu + eb * 2 * I * H, CUDA_R_16BF, H, xb + r0 * H,
                                                  CUDA_R_16BF, H, &zero, gub + r0 * 2 * I, CUDA_R_16BF, 2 * I,
                                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                           CUBLAS_OK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, H, cnt[e], I, &one,
                                                  bw_dn + eb * H * I, CUDA_R_16BF, I, ab + r0 * I,
                                                  CUDA_R_16BF, I, &zero, yb + r0 * H, CUDA_R_16BF, H,
                                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                           r0 += static_cast<size_t>(cnt[e]);
                         }
                       },
                       m <= 128 ? 5 : 1);
      std::printf("%-8d %-8s %7d %9.1f %10.2f %8s %8.2f %10.0f %9.0f%% %9.2f %9.2f %10.2f %7.2fx\n", m,
                  skewed ? "skewed" : "uniform", touched, bytes / 1e6, floor_us, path_name, t_new * 1e3,
                  bytes / (t_new * 1e-3) / 1e9, 100.0 * floor_us / (t_new * 1e3), t_stream * 1e3, t_old * 1e3,
                  t_blas * 1e3, t_blas / t_new);
      for (void* ptr : std::initializer_list<void*>{x, w, out, act, slot, d_ids, counts, offsets, sorted, xb,
                                                    gub, ab, yb})
        cudaFree(ptr);
    }
  std::printf(
      "\nfloor: touched-expert bytes / copy ceiling; cuBLAS BF16 reads %.2fx the bytes (with 64 BF16 experts "
      "cycled, so above 64 touched experts its weights partly hit L2)\n",
      3.0 * H * I * 2 / static_cast<double>(per_expert));
  cublasDestroy(blas);
  return 0;
}
