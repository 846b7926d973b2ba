#if MOESERVE_HAVE_CUDA
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/log.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/moe/moe_experts.h"
#include "kernels/cuda/moe/moe_experts_mma.h"
#include "kernels/cuda/moe/moe_experts_wgmma.h"
#include "kernels/cuda/moe/moe_plan.h"
#include "ops/cuda/backend_impl.h"
#include "ops/cuda/cuda_ops.h"

namespace ms::ops::cuda_ops {

namespace {

// Tokens per pass through the grouped kernels: bounds the slot outputs ([tokens * top_k, hidden] f32) in
// prefill, where thousands of tokens would otherwise need gigabytes.
constexpr int64_t kMoeChunkTokens = 1024;
// The tensor-core path takes bigger passes (more rows per expert tile, fewer weight reads per token):
// 2048 tokens keep its f32 slot outputs at 2048 * top_k * hidden * 4 bytes (403 MB on GLM-5 shapes).
constexpr int64_t kMoeMmaChunkTokens = 2048;

// The layer's expert weight pointers as the device table holds them.
std::vector<cuda::MoeExpertWeights> host_table(std::span<const ExpertWeights> experts) {
  std::vector<cuda::MoeExpertWeights> host(experts.size());
  for (size_t e = 0; e < experts.size(); ++e) {
    const ExpertWeights& w = experts[e];
    auto scale = [](const LinearWeight& l) {
      return (l.scale.defined() && l.scale.numel() > 0) ? l.scale.raw() : nullptr;
    };
    host[e] = {w.gate.weight.raw(), scale(w.gate), w.up.weight.raw(), scale(w.up),   w.down.weight.raw(),
               scale(w.down),       w.gate.scale2, w.up.scale2,       w.down.scale2, 0.f};
  }
  return host;
}

// The tensor maps of the warpgroup prefill kernel's tensor-copy loads for a layer (NVFP4 or BF16 experts on
// sm_90), built at its first prefill-regime pass and kept: measured on an H200 at 8192 tokens on GLM-5
// shapes, 22.6 -> 14.6 ms (NVFP4) and 15.3 -> 14.9 ms (BF16) against the cp.async loads. Null where they
// cannot apply (another format or device, a shape or pointer the tensor-map rules refuse: the encoder names
// which); the kernel then loads with cp.async, as before.
const void* expert_maps(CudaBackend::Impl& be, std::span<const ExpertWeights> experts,
                        cuda::MoeWeightFormat format, int hidden, int inter) {
  auto it = be.expert_maps.find(experts.data());
  if (it != be.expert_maps.end()) return it->second;
  void* maps = nullptr;
  if (be.caps.arch() == 90 &&
      (format == cuda::MoeWeightFormat::NVFP4 || format == cuda::MoeWeightFormat::BF16)) {
    const std::vector<cuda::MoeExpertWeights> host = host_table(experts);
    try {
      maps = cuda::moe_experts_wgmma_maps(host.data(), static_cast<int>(host.size()), format, hidden, inter);
    } catch (const Error& e) {
      MS_LOG_DEBUG("moe_experts {}: prefill loads by cp.async ({})", experts.front().gate.name, e.what());
      maps = nullptr;
    }
  }
  be.expert_maps.emplace(experts.data(), maps);
  return maps;
}

// The device table of a layer's expert weights, built on first use (the eager warm-up before any capture)
// and kept for the backend's lifetime.
const cuda::MoeExpertWeights* expert_table(CudaBackend::Impl& be, std::span<const ExpertWeights> experts,
                                           cudaStream_t stream) {
  auto it = be.expert_tables.find(experts.data());
  if (it != be.expert_tables.end()) return static_cast<const cuda::MoeExpertWeights*>(it->second);
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &st));
  MS_CHECK(st == cudaStreamCaptureStatusNone,
           "moe_experts: the expert table of {} is built during graph capture; run the step once first",
           experts.front().gate.name);
  const std::vector<cuda::MoeExpertWeights> host = host_table(experts);
  void* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, host.size() * sizeof(cuda::MoeExpertWeights)));
  CUDA_CHECK(
      cudaMemcpy(d, host.data(), host.size() * sizeof(cuda::MoeExpertWeights), cudaMemcpyHostToDevice));
  be.expert_tables.emplace(experts.data(), d);
  return static_cast<const cuda::MoeExpertWeights*>(d);
}

}  // namespace

void moe_experts(const Ctx& ctx, const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                 std::span<const ExpertWeights> experts, const Tensor& out) {
  CudaBackend::Impl& be = cuda_impl(ctx);
  const cudaStream_t stream = cuda_stream(ctx);
  const ExpertWeights& e0 = experts.front();
  for (const ExpertWeights& e : experts)
    MS_CHECK(
        e.gate.format == e0.gate.format && e.up.format == e0.gate.format && e.down.format == e0.gate.format,
        "moe_experts: expert {} is stored as {}, expert 0 as {}; the GPU kernels take one format per layer",
        e.gate.name, weight_format_name(e.gate.format), weight_format_name(e0.gate.format));
  const int64_t m = x.size(0), hidden = x.size(1), inter = e0.gate.out;
  const int top_k = static_cast<int>(topk_ids.size(1)), n_experts = static_cast<int>(experts.size());
  const cuda::MoeExpertWeights* table = expert_table(be, experts, stream);
  // Prefill regime (the rule the decode kernels share) on a format and shape the tensor-core kernels take,
  // when a tile configuration fits this device; else the CUDA-core kernels.
  const auto format = static_cast<cuda::MoeWeightFormat>(static_cast<int32_t>(e0.gate.format));
  const int64_t mma_chunk = std::min(m, kMoeMmaChunkTokens);
  bool use_mma = false;
  // Exact mode (f32 math everywhere) keeps the CUDA-core kernels.
  if (!be.exact_linear &&
      cuda::moe_experts_prefill_regime(static_cast<int>(std::min(m, kMoeMmaChunkTokens)), top_k, n_experts)) {
    const bool tc_format = format == cuda::MoeWeightFormat::BF16 || format == cuda::MoeWeightFormat::NVFP4 ||
                           format == cuda::MoeWeightFormat::FP8Block;
    cuda::MoeMmaShape shape{format == cuda::MoeWeightFormat::BF16       ? cuda::MoeMmaFormat::BF16
                            : format == cuda::MoeWeightFormat::FP8Block ? cuda::MoeMmaFormat::FP8Block
                                                                        : cuda::MoeMmaFormat::NVFP4,
                            static_cast<int>(mma_chunk),
                            top_k,
                            n_experts,
                            static_cast<int>(hidden),
                            static_cast<int>(inter),
                            e0.gate.block};
    use_mma = tc_format && cuda::choose_moe_mma_config(shape, cuda::limits_of(be.caps)).has_value();
  }
  // The streamed NVFP4 decode path reads weights in 16-byte pieces: allowed when every pointer is aligned.
  bool aligned16 = true;
  for (const ExpertWeights& w : experts)
    for (const LinearWeight* l : {&w.gate, &w.up, &w.down}) {
      aligned16 = aligned16 && reinterpret_cast<uintptr_t>(l->weight.raw()) % 16 == 0;
      if (l->scale.defined() && l->scale.numel() > 0)
        aligned16 = aligned16 && reinterpret_cast<uintptr_t>(l->scale.raw()) % 16 == 0;
    }
  const int64_t chunk = use_mma ? mma_chunk : std::min(m, kMoeChunkTokens);
  // Plan buffers: counts [E], offsets [E + 1], sorted slots [chunk * K], each 256-byte aligned.
  const size_t a256 = 256;
  auto up = [&](size_t b) { return (b + a256 - 1) / a256 * a256; };
  const size_t counts_b = up(4 * static_cast<size_t>(n_experts)),
               offs_b = up(4 * (static_cast<size_t>(n_experts) + 1));
  const size_t slots_b = up(4 * static_cast<size_t>(chunk) * top_k);
  char* plan = static_cast<char*>(be.moe_plan.get(counts_b + offs_b + slots_b, stream));
  float* act = nullptr;
  void* mma_ws = nullptr;
  if (use_mma) {
    mma_ws =
        be.moe_mma.get(cuda::moe_experts_mma_workspace_bytes(
                           static_cast<int>(chunk), top_k, static_cast<int>(hidden), static_cast<int>(inter)),
                       stream);
  } else {
    act = static_cast<float*>(be.moe_act.get(
        cuda::moe_experts_act_bytes(static_cast<int>(chunk), top_k, static_cast<int>(inter)), stream));
  }
  auto* slot_out = static_cast<float*>(be.moe_slot.get(
      cuda::moe_experts_slot_out_bytes(static_cast<int>(chunk), top_k, static_cast<int>(hidden)), stream));
  for (int64_t t0 = 0; t0 < m; t0 += chunk) {
    const int n = static_cast<int>(std::min(chunk, m - t0));
    cuda::MoePlanParams pp;
    pp.topk_ids = topk_ids.data<int32_t>() + t0 * top_k;
    pp.expert_counts = reinterpret_cast<int32_t*>(plan);
    pp.expert_offsets = reinterpret_cast<int32_t*>(plan + counts_b);
    pp.sorted_slots = reinterpret_cast<int32_t*>(plan + counts_b + offs_b);
    pp.m = n;
    pp.top_k = top_k;
    pp.n_experts = n_experts;
    cuda::moe_plan(pp, stream);
    cuda::MoeExpertsParams p;
    p.x = x.data<float>() + t0 * x.stride(0);
    p.ldx = x.stride(0);
    p.topk_ids = pp.topk_ids;
    p.topk_weights = topk_weights.data<float>() + t0 * top_k;
    p.expert_counts = pp.expert_counts;
    p.expert_offsets = pp.expert_offsets;
    p.sorted_slots = pp.sorted_slots;
    p.experts = table;
    p.format = format;
    p.fp8_block = e0.gate.block;
    p.act = act;
    p.slot_out = slot_out;
    p.out = out.data<float>() + t0 * out.stride(0);
    p.ldo = out.stride(0);
    p.m = n;
    p.top_k = top_k;
    p.n_experts = n_experts;
    p.hidden = static_cast<int>(hidden);
    p.inter = static_cast<int>(inter);
    p.experts_aligned16 = aligned16;
    p.disable_decode = be.exact_linear;  // exact mode keeps f32-exact activations (the decode path is bf16)
    // The last pass of a long prefill may be short: the regime is decided per pass, the workspace was sized
    // for the largest.
    if (use_mma && cuda::moe_experts_prefill_regime(n, top_k, n_experts)) {
      p.wgmma_maps = expert_maps(be, experts, format, p.hidden, p.inter);
      cuda::moe_experts_mma(p, mma_ws, stream);
    } else if (use_mma) {
      p.act = static_cast<float*>(be.moe_act.get(
          cuda::moe_experts_act_bytes(static_cast<int>(chunk), top_k, static_cast<int>(inter)), stream));
      cuda::moe_experts(p, stream);
    } else {
      cuda::moe_experts(p, stream);
    }
  }
}

}  // namespace ms::ops::cuda_ops
#endif
