// The prefill regime of the routed experts on GLM-5 shapes (256 experts, top-8, hidden 6144, moe intermediate
// 2048): the tensor-core grouped kernels (moe_experts_mma with each of its GEMM kernels: mma.sync and, on
// sm_90, the warp-specialised wgmma one; BF16, NVFP4 and FP8Block weights (format column bf16 / nvfp4 /
// fp8: DeepSeek-style e4m3 with an f32 scale per 128x128 block, on the same GLM-5 shapes) against the BF16
// matrix rate measured first in the same run (cuBLASLt BF16 GEMM 8192^3; column "% bf16"), our BF16 weights
// on the same kernel and routing ("vs bf16": its time over this row's), cuBLASLt BF16 on the same routed
// problem (per-expert GEMMs over BF16 copies of the weights, rows already grouped: no gather, no SiLU, no
// combine) and the CUDA-core kernels (moe_experts). FLOPs count 6 * hidden * inter per routed slot (gate,
// up, down). One table on stdout.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_bench.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/gemm/blaslt.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_experts_mma.h"
#include "kernels/cuda/moe/moe_experts_wgmma.h"
#include "kernels/cuda/moe/moe_plan.h"

namespace {

constexpr int kE = 256, kK = 8, kH = 6144, kI = 2048;

// One untimed call before each timing: the CUDA-core reference takes a third of a second at 8192 tokens.
constexpr int kWarmup = 1;

void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

// Random bytes on the host, uploaded once and copied device to device `copies` times (distinct memory for
// every expert, so the kernels really read 256 experts' bytes).
std::vector<void*> replicate(const std::vector<uint8_t>& host, int copies) {
  std::vector<void*> out(copies);
  out[0] = dev_alloc(host.size());
  CUDA_CHECK(cudaMemcpy(out[0], host.data(), host.size(), cudaMemcpyHostToDevice));
  for (int i = 1; i < copies; ++i) {
    out[i] = dev_alloc(host.size());
    CUDA_CHECK(cudaMemcpy(out[i], out[0], host.size(), cudaMemcpyDeviceToDevice));
  }
  return out;
}

std::vector<uint8_t> random_bytes(size_t n, std::mt19937& rng, uint8_t lo, uint8_t hi) {
  std::vector<uint8_t> v(n);
  std::uniform_int_distribution<int> d(lo, hi);
  for (auto& b : v) b = static_cast<uint8_t>(d(rng));
  return v;
}

// e4m3 bytes of magnitude 0.125 .. 30 (exponent fields 4 .. 11; never the NaN codes 0x7f / 0xff), random
// sign.
std::vector<uint8_t> random_e4m3(size_t n, std::mt19937& rng) {
  std::vector<uint8_t> v(n);
  std::uniform_int_distribution<int> mag(0x20, 0x5f), sign(0, 1);
  for (auto& b : v) b = static_cast<uint8_t>(mag(rng) | (sign(rng) << 7));
  return v;
}

// f32 values in [lo, hi] as raw bytes.
std::vector<uint8_t> random_f32(size_t n, float lo, float hi, std::mt19937& rng) {
  std::vector<uint8_t> v(n * 4);
  std::uniform_real_distribution<float> u(lo, hi);
  for (size_t i = 0; i < n; ++i) {
    const float f = u(rng);
    std::memcpy(v.data() + 4 * i, &f, 4);
  }
  return v;
}

// bf16 values ~ N(0, sd) as raw bytes.
std::vector<uint8_t> random_bf16(size_t n, float sd, std::mt19937& rng) {
  std::vector<uint8_t> v(n * 2);
  std::normal_distribution<float> nd(0.f, sd);
  for (size_t i = 0; i < n; ++i) {
    const __nv_bfloat16 b = __float2bfloat16(nd(rng));
    std::memcpy(v.data() + 2 * i, &b, 2);
  }
  return v;
}

// K distinct experts per token; skewed: expert e drawn with weight 1 / (e + 1) (a Zipf-like hot set).
std::vector<int32_t> make_ids(int m, bool skewed, std::mt19937& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(m) * kK);
  std::vector<double> base(kE);
  for (int e = 0; e < kE; ++e) base[e] = skewed ? 1.0 / (e + 1.0) : 1.0;
  for (int t = 0; t < m; ++t) {
    std::vector<double> w = base;
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
  const ms::cuda::DeviceCaps caps = ms::cuda::query_device(0);
  std::printf("device: %s (sm_%d), %d SMs\n", caps.name.c_str(), caps.arch(), caps.multiprocessors);
  ms::cuda::BlasLtHandle lt;
  std::mt19937 rng(7);

  // ---- the BF16 matrix rate of this run: cuBLASLt 8192^3, bf16 in, f32 out ----
  const double bf16_tflops = ms::bench::measure_bf16_tflops(lt);
  std::printf("BF16 matrix rate (cuBLASLt 8192x8192x8192, f32 out): %.1f TFLOP/s\n", bf16_tflops);

  // ---- weights: NVFP4 and BF16 experts (tables), BF16 fused gate_up / down copies for cuBLAS ----
  std::printf("building 256 experts (NVFP4, BF16, FP8Block)...\n");
  // NVFP4: codes uniform, e4m3 scales in [0.25, 0.5] (bytes 0x28..0x30), scale2 1/64.
  const auto gu_q = replicate(random_bytes(size_t{2} * kI * kH / 2, rng, 0, 255), kE);
  const auto gu_s = replicate(random_bytes(size_t{2} * kI * kH / 16, rng, 0x28, 0x30), kE);
  const auto dn_q = replicate(random_bytes(size_t{kH} * kI / 2, rng, 0, 255), kE);
  const auto dn_s = replicate(random_bytes(size_t{kH} * kI / 16, rng, 0x28, 0x30), kE);
  const auto gu_b = replicate(random_bf16(size_t{2} * kI * kH, 1.0f / 78.0f, rng), kE);  // [2I, H]
  const auto dn_b = replicate(random_bf16(size_t{kH} * kI, 1.0f / 45.0f, rng), kE);      // [H, I]
  // FP8Block: e4m3 [2I, H] fused gate_up and [H, I] down, f32 scales per 128x128 block in [1/1024, 1/512].
  constexpr int kBlk = 128;
  const auto gu_f = replicate(random_e4m3(size_t{2} * kI * kH, rng), kE);
  const auto gu_fs =
      replicate(random_f32(size_t{2} * kI / kBlk * (kH / kBlk), 1.f / 1024, 1.f / 512, rng), kE);
  const auto dn_f = replicate(random_e4m3(size_t{kH} * kI, rng), kE);
  const auto dn_fs = replicate(random_f32(size_t{kH} / kBlk * (kI / kBlk), 1.f / 1024, 1.f / 512, rng), kE);
  std::vector<ms::cuda::MoeExpertWeights> t4(kE), tb(kE), t8(kE);
  for (int e = 0; e < kE; ++e) {
    auto* q = static_cast<uint8_t*>(gu_q[e]);
    auto* s = static_cast<uint8_t*>(gu_s[e]);
    t4[e] = {
        q,        s,  q + size_t{kI} * kH / 2, s + size_t{kI} * kH / 16, dn_q[e], dn_s[e], 1.f / 64, 1.f / 64,
        1.f / 64, 0.f};
    auto* b = static_cast<uint8_t*>(gu_b[e]);
    tb[e] = {b, nullptr, b + size_t{kI} * kH * 2, nullptr, dn_b[e], nullptr, 1.f, 1.f, 1.f, 0.f};
    // up: the second half of the fused matrix, its scales from block row I / 128 on.
    auto* f = static_cast<uint8_t*>(gu_f[e]);
    auto* fs = static_cast<float*>(gu_fs[e]);
    t8[e] = {f,   fs, f + size_t{kI} * kH, fs + size_t{kI} / kBlk * (kH / kBlk), dn_f[e], dn_fs[e], 1.f, 1.f,
             1.f, 0.f};
  }
  auto* d_t4 = static_cast<ms::cuda::MoeExpertWeights*>(dev_alloc(kE * sizeof(ms::cuda::MoeExpertWeights)));
  auto* d_tb = static_cast<ms::cuda::MoeExpertWeights*>(dev_alloc(kE * sizeof(ms::cuda::MoeExpertWeights)));
  auto* d_t8 = static_cast<ms::cuda::MoeExpertWeights*>(dev_alloc(kE * sizeof(ms::cuda::MoeExpertWeights)));
  CUDA_CHECK(cudaMemcpy(d_t8, t8.data(), kE * sizeof(t8[0]), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_t4, t4.data(), kE * sizeof(t4[0]), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_tb, tb.data(), kE * sizeof(tb[0]), cudaMemcpyHostToDevice));
  // Per-expert tensor maps for the wgmma kernel's tensor-copy loads (sm_90 only).
  void* maps4 = nullptr;
  void* mapsb = nullptr;
  if (caps.arch() == 90) {
    maps4 = ms::cuda::moe_experts_wgmma_maps(t4.data(), kE, ms::cuda::MoeWeightFormat::NVFP4, kH, kI);
    mapsb = ms::cuda::moe_experts_wgmma_maps(tb.data(), kE, ms::cuda::MoeWeightFormat::BF16, kH, kI);
  }

  const int max_m = 8192;
  const size_t max_slots = size_t{max_m} * kK;
  auto* x = static_cast<float*>(dev_alloc(size_t{max_m} * kH * 4));
  auto* out = static_cast<float*>(dev_alloc(size_t{max_m} * kH * 4));
  auto* wts = static_cast<float*>(dev_alloc(max_slots * 4));
  auto* ids_d = static_cast<int32_t*>(dev_alloc(max_slots * 4));
  auto* counts = static_cast<int32_t*>(dev_alloc(kE * 4));
  auto* offsets = static_cast<int32_t*>(dev_alloc((kE + 1) * 4));
  auto* sorted = static_cast<int32_t*>(dev_alloc(max_slots * 4));
  auto* slot_out = static_cast<float*>(dev_alloc(max_slots * kH * 4));
  auto* act = static_cast<float*>(dev_alloc(max_slots * kI * 4));
  void* ws = dev_alloc(ms::cuda::moe_experts_mma_workspace_bytes(max_m, kK, kH, kI));
  // cuBLAS peer buffers: grouped rows already in place.
  auto* ca = static_cast<__nv_bfloat16*>(dev_alloc(max_slots * kH * 2));
  auto* cact = static_cast<__nv_bfloat16*>(dev_alloc(max_slots * kI * 2));
  auto* cy = static_cast<float*>(dev_alloc(max_slots * 2 * kI * 4));
  {
    std::vector<float> hx(size_t{max_m} * kH);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : hx) v = nd(rng);
    CUDA_CHECK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    std::vector<float> hw(max_slots, 0.125f);
    CUDA_CHECK(cudaMemcpy(wts, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(ca, 0x3c, max_slots * kH * 2));
    CUDA_CHECK(cudaMemset(cact, 0x3c, max_slots * kI * 2));
    CUDA_CHECK(cudaMemset(out, 0, size_t{max_m} * kH * 4));
  }

  std::printf("\n%-6s %6s %-8s %-9s %18s %9s %9s %8s %8s %11s %9s %8s %12s\n", "format", "tokens", "routing",
              "kernel", "config", "ours ms", "TFLOP/s", "% bf16", "vs bf16", "cuBLAS ms", "TFLOP/s", "% bf16",
              "CUDA-core ms");
  // MOE_PREFILL_TOKENS=8192 (a comma list) and MOE_PREFILL_ONLY=wgmma (uniform routing, our two GEMM launches
  // and their plan only, no peers) narrow the run for a profiler.
  std::vector<int> token_counts{512, 2048, 8192};
  if (const char* env = std::getenv("MOE_PREFILL_TOKENS"); env && *env) {
    token_counts.clear();
    for (const char* s = env; *s;) {
      char* end = nullptr;
      const long v = std::strtol(s, &end, 10);
      if (end == s || v < 1 || v > max_m) {
        std::fprintf(stderr, "MOE_PREFILL_TOKENS: '%s' is not a comma list of 1..%d\n", env, max_m);
        return 2;
      }
      token_counts.push_back(static_cast<int>(v));
      s = *end == ',' ? end + 1 : end;
    }
  }
  const char* only_env = std::getenv("MOE_PREFILL_ONLY");
  const bool only_wgmma = only_env && std::string(only_env) == "wgmma";
  for (int m : token_counts) {
    for (bool skewed : {false, true}) {
      if (only_wgmma && skewed) continue;
      const auto ids = make_ids(m, skewed, rng);
      std::vector<int> cnt(kE, 0);
      for (int32_t e : ids) ++cnt[e];
      CUDA_CHECK(cudaMemcpy(ids_d, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
      const double flops = 6.0 * kH * kI * static_cast<double>(ids.size());

      ms::cuda::MoePlanParams pp{ids_d, counts, offsets, sorted, m, kK, kE};
      ms::cuda::moe_plan(pp, nullptr);
      ms::cuda::MoeExpertsParams p;
      p.x = x;
      p.ldx = kH;
      p.topk_ids = ids_d;
      p.topk_weights = wts;
      p.expert_counts = counts;
      p.expert_offsets = offsets;
      p.sorted_slots = sorted;
      p.act = act;
      p.slot_out = slot_out;
      p.out = out;
      p.ldo = kH;
      p.m = m;
      p.top_k = kK;
      p.n_experts = kE;
      p.hidden = kH;
      p.inter = kI;

      // cuBLAS on the same routed problem: per touched expert, [n, H] x [2I, H]^T then [n, I] x [H, I]^T.
      auto cublas = [&] {
        int64_t row = 0;
        for (int e = 0; e < kE; ++e) {
          if (cnt[e] == 0) continue;
          ms::cuda::GemmBf16Params g;
          g.x_bf16 = ca + row * kH;
          g.x_bf16_stride = kH;
          g.w = static_cast<const __nv_bfloat16*>(gu_b[e]);
          g.w_stride = kH;
          g.y = cy + row * 2 * kI;
          g.y_stride = 2 * kI;
          g.m = cnt[e];
          g.n = 2 * kI;
          g.k = kH;
          ms::cuda::gemm_bf16(g, lt, nullptr);
          ms::cuda::GemmBf16Params d;
          d.x_bf16 = cact + row * kI;
          d.x_bf16_stride = kI;
          d.w = static_cast<const __nv_bfloat16*>(dn_b[e]);
          d.w_stride = kI;
          d.y = slot_out + row * kH;
          d.y_stride = kH;
          d.m = cnt[e];
          d.n = kH;
          d.k = kI;
          ms::cuda::gemm_bf16(d, lt, nullptr);
          row += cnt[e];
        }
      };
      const int iters = m >= 8192 ? 5 : 10;
      const float t_cublas = only_wgmma ? 0.f : ms::bench::time_ms(cublas, iters, nullptr, kWarmup);
      p.experts = d_t4;
      p.format = ms::cuda::MoeWeightFormat::NVFP4;
      const float t_old = only_wgmma ? 0.f
                                     : ms::bench::time_ms([&] { ms::cuda::moe_experts(p, nullptr); },
                                                          m >= 8192 ? 1 : 3, nullptr, kWarmup);
      // Our BF16 time per variant (mma, wgmma, wgmma-tma) of this routing: the "vs bf16" column of the other
      // formats.
      float t_bf16[3] = {0.f, 0.f, 0.f};
      for (auto f : {ms::cuda::MoeWeightFormat::BF16, ms::cuda::MoeWeightFormat::NVFP4,
                     ms::cuda::MoeWeightFormat::FP8Block}) {
        p.format = f;
        p.experts = f == ms::cuda::MoeWeightFormat::NVFP4  ? d_t4
                    : f == ms::cuda::MoeWeightFormat::BF16 ? d_tb
                                                           : d_t8;
        p.fp8_block = kBlk;
        const char* fname = f == ms::cuda::MoeWeightFormat::NVFP4  ? "nvfp4"
                            : f == ms::cuda::MoeWeightFormat::BF16 ? "bf16"
                                                                   : "fp8";
        // (kernel, loads): mma.sync; wgmma with cp.async loads; wgmma with tensor copies (BF16 and NVFP4:
        // FP8Block has no tensor-copy loads, moe_wgmma_tma_unsupported).
        for (int variant = 0; variant < 3; ++variant) {
          const auto kernel =
              variant == 0 ? ms::cuda::MoePrefillKernel::Mma : ms::cuda::MoePrefillKernel::Wgmma;
          if (only_wgmma && kernel != ms::cuda::MoePrefillKernel::Wgmma) continue;
          p.prefill_kernel = kernel;
          p.wgmma_load = variant == 2 ? 1 : 0;
          p.wgmma_maps = variant != 2                            ? nullptr
                         : f == ms::cuda::MoeWeightFormat::NVFP4 ? maps4
                         : f == ms::cuda::MoeWeightFormat::BF16  ? mapsb
                                                                 : nullptr;
          if (variant == 2 && p.wgmma_maps == nullptr) continue;
          const char* kname = variant == 0 ? "mma" : variant == 1 ? "wgmma" : "wgmma-tma";
          char cfgs[48];
          if (kernel == ms::cuda::MoePrefillKernel::Wgmma) {
            if (const auto no = ms::cuda::moe_experts_wgmma_unavailable(p)) {
              std::printf("%-6s %6d %-8s %-9s not run: %s\n", fname, m, skewed ? "skewed" : "uniform", kname,
                          no->c_str());
              continue;
            }
            const auto cfg = ms::cuda::moe_experts_wgmma_config(p);
            // NVFP4: "cx" expanded by the consumers, "px" by the producer
            // (MOESERVE_MOE_WGMMA_EXPAND=producer), "rs" into the consumers' wgmma fragments (=registers).
            const char* ex = f != ms::cuda::MoeWeightFormat::NVFP4                    ? ""
                             : cfg.gate_up.expand == ms::cuda::MoeWgExpand::Consumer  ? " cx"
                             : cfg.gate_up.expand == ms::cuda::MoeWgExpand::Registers ? " rs"
                                                                                      : " px";
            std::snprintf(cfgs, sizeof cfgs, "bn%d/%d s%d/%d%s%s", cfg.gate_up.bn, cfg.down.bn,
                          cfg.gate_up.stages, cfg.down.stages, ex,
                          cfg.gate_up.load == ms::cuda::MoeWgLoad::Tma ? " tma" : "");
          } else {
            const auto cfg = ms::cuda::moe_experts_mma_config(p);
            std::snprintf(cfgs, sizeof cfgs, "bm%d s%d", cfg.bm, cfg.stages);
          }
          const float t = ms::bench::time_ms(
              [&] {
                ms::cuda::moe_plan(pp, nullptr);
                ms::cuda::moe_experts_mma(p, ws, nullptr);
              },
              iters, nullptr, kWarmup);
          const double tf = flops / (t * 1e-3) / 1e12, tc = flops / (t_cublas * 1e-3) / 1e12;
          if (f == ms::cuda::MoeWeightFormat::BF16) t_bf16[variant] = t;
          char vs[16] = "-";
          if (t_bf16[variant] > 0.f) std::snprintf(vs, sizeof vs, "%.2fx", t_bf16[variant] / t);
          std::printf("%-6s %6d %-8s %-9s %18s %9.3f %9.1f %7.1f%% %8s %11.3f %9.1f %7.1f%% %12s\n", fname, m,
                      skewed ? "skewed" : "uniform", kname, cfgs, t, tf, 100.0 * tf / bf16_tflops, vs,
                      t_cublas, tc, 100.0 * tc / bf16_tflops,
                      f == ms::cuda::MoeWeightFormat::NVFP4 && kernel == ms::cuda::MoePrefillKernel::Mma
                          ? std::to_string(t_old).c_str()
                          : "-");
        }
      }
    }
  }
  std::printf(
      "\nours: moe_plan + convert + gate_up (SiLU-and-mul) + down + combine, with the mma.sync or the wgmma "
      "GEMMs; cuBLAS: the GEMMs alone on "
      "pre-grouped rows; CUDA-core: moe_experts (NVFP4), without the plan.\n");
  return 0;
}
