#include "ops/backends.h"

#include <algorithm>
#include <optional>

#include "kernels/cuda/mla_decode/mla_decode_config.h"
#include "kernels/cuda/mla_decode/mla_decode_sm90_config.h"
#include "kernels/cuda/mla_decode/mla_decode_wgmma_config.h"
#include "kernels/cuda/moe/moe_decode_config.h"
#include "kernels/cuda/moe/moe_decode_fp8_config.h"
#include "kernels/cuda/moe/moe_experts_mma_config.h"
#include "kernels/cuda/moe/moe_stream_config.h"
#include "kernels/cuda/nvfp4_gemv/nvfp4_gemv_config.h"
#include "ops/cuda_backend.h"

#if MOESERVE_HAVE_CUDA
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/mla_attention/mla_attention.h"
#include "kernels/cuda/moe/moe_experts.h"
#endif

namespace ms::ops {

namespace {

// Where the CUDA backends would run: the target, this machine's first GPU, or nowhere (with the reason).
std::optional<cuda::DeviceLimits> cuda_target(const cuda::DeviceLimits* target, std::string& why_none) {
  if (target) return *target;
  if (!cuda_backend_built()) {
    why_none = "this build has no CUDA backend (configure with -DMOESERVE_CUDA=ON)";
    return std::nullopt;
  }
  if (cuda_device_count() == 0) {
    why_none = "no CUDA device is visible";
    return std::nullopt;
  }
#if MOESERVE_HAVE_CUDA
  return cuda::limits_of(cuda::query_device(0));
#else
  return std::nullopt;
#endif
}

void fit(BackendInfo& b, const std::optional<cuda::DeviceLimits>& dev, const std::string& why_none,
         const cuda::KernelNeed& need) {
  b.smem_bytes = need.smem_bytes;
  if (!dev) {
    b.why = why_none;
    return;
  }
  if (auto why = cuda::why_cannot_run(need, *dev)) {
    b.why = *why;
    return;
  }
  b.usable = true;
}

}  // namespace

std::vector<BackendInfo> list_backends(const cuda::DeviceLimits* target) {
  std::string why_none;
  const auto dev = cuda_target(target, why_none);
  std::vector<BackendInfo> out;
  out.push_back({"attention", "cpu", "cpu", "f32, bf16, fp8_e4m3 pages",
                 "any heads, widths and page size; prefill "
                 "and decode; dense or DSA-selected keys",
                 "x86-64 (AVX-512 or AVX2 kernels where it matters)", 0, true, ""});
  {
    BackendInfo b{
        "attention",
        "mla_general",
        "cuda",
        "f32, bf16, fp8_e4m3 pages (read in place)",
        "any heads, widths and page size; prefill chunks and decode mixed; dense or DSA-selected keys",
        "sm_80 or newer",
        0,
        false,
        ""};
#if MOESERVE_HAVE_CUDA
    if (dev) {
      cuda::DeviceCaps caps;
      caps.name = dev->name;
      caps.sm_major = dev->arch / 10;
      caps.sm_minor = dev->arch % 10;
      caps.smem_per_block_optin = dev->smem_per_block_optin;
      caps.multiprocessors = dev->multiprocessors;
      const cuda::MlaAttentionShape glm{64, 64, 512, 64, 64, cuda::KvFormat::FP8E4M3, true, true, 64};
      try {
        const auto c = cuda::mla_attention_choose(glm, caps);
        fit(b, dev, why_none, {"mla_attention_general", c.smem_bytes, 80, false});
      } catch (const std::exception& e) {
        b.why = e.what();
      }
    } else {
      b.why = why_none;
    }
#else
    b.why = why_none;
#endif
    out.push_back(b);
  }
  {
    BackendInfo b{
        "attention",
        "mla_fp8_decode",
        "cuda",
        "fp8_e4m3 pages",
        "decode steps (one token per sequence), 64 tokens x (512 + 64) per page, dense keys (no DSA "
        "selection); any heads",
        "sm_80 or newer",
        0,
        false,
        ""};
    fit(b, dev, why_none, cuda::mla_decode_config::need());
    out.push_back(b);
  }
  {
    BackendInfo b{
        "attention",
        "mla_decode_sm90",
        "cuda",
        "fp8_e4m3 and bf16 pages",
        "decode steps (dense) and any batch over a DSA selection; 512 + 64 wide rows, any page size, "
        "any heads; split-KV planned on the device",
        "sm_80 or newer (tuned for sm_90)",
        0,
        false,
        ""};
    fit(b, dev, why_none, cuda::mla_sm90::need());
    out.push_back(b);
  }
  {
    BackendInfo b{
        "attention",
        "mla_decode_wgmma",
        "cuda",
        "fp8_e4m3 pages",
        "decode steps (1-4 query tokens per sequence), dense keys (no DSA selection), 512 + 64 wide rows, "
        "any page size; 64 query rows a block on warpgroup MMA (64 and 128 heads by default under auto); "
        "split-KV planned on the device",
        "sm_90 (Hopper) only",
        0,
        false,
        ""};
    fit(b, dev, why_none, cuda::mla_wgmma::need());
    out.push_back(b);
  }
  out.push_back({"moe", "cpu", "cpu", "f32, bf16, fp8 128x128 blocks, nvfp4", "any", "x86-64", 0, true, ""});
  {
    BackendInfo b{
        "moe",
        "grouped",
        "cuda",
        "f32, bf16, fp8 128x128 blocks, nvfp4",
        "one launch for every touched expert; any hidden and intermediate size (nvfp4: multiples of 16; "
        "a tiled path for multiples of 64)",
        "sm_80 or newer",
        0,
        false,
        ""};
#if MOESERVE_HAVE_CUDA
    fit(b, dev, why_none,
        {"moe_experts", cuda::moe_experts_smem_bytes(cuda::MoeExpertsPath::General), 80, false});
#else
    b.why = why_none;
#endif
    out.push_back(b);
  }
  {
    BackendInfo b{
        "moe",
        "grouped_stream",
        "cuda",
        "nvfp4",
        "decode steps of 1 to 256 tokens (m * top_k <= 4096, up to 1024 experts); hidden and intermediate "
        "multiples of 512; weights streamed through a cp.async ring, tensor cores, down fused with the "
        "combine; used by `grouped` automatically where it applies",
        "sm_80 or newer",
        0,
        false,
        ""};
    fit(b, dev, why_none, cuda::moe_stream_config::need_down(2048, cuda::moe_stream_config::kMaxM));
    if (b.usable) fit(b, dev, why_none, cuda::moe_stream_config::need_gate_up());
    b.smem_bytes = std::max(cuda::moe_stream_config::gate_up_smem(),
                            cuda::moe_stream_config::down_smem(2048, cuda::moe_stream_config::kMaxM));
    out.push_back(b);
  }
  {
    BackendInfo b{
        "moe",
        "grouped_decode",
        "cuda",
        "nvfp4",
        "decode steps of 1 to 128 tokens (m * top_k <= 1152, up to 1024 experts); hidden a multiple of "
        "1024 and intermediate of 512; weights streamed straight into registers (or through a per-warp "
        "cp.async ring: MOESERVE_MOE_DECODE_KERNEL=registers|ring), tensor cores with f16 "
        "activations, down summed in a fixed order; used by `grouped` first where it applies (not in "
        "exact mode)",
        "sm_80 or newer",
        0,
        false,
        ""};
    // GLM-5's widths at the largest token count (the down kernel's tiles grow with m).
    fit(b, dev, why_none, cuda::moe_decode_config::need_down(cuda::moe_decode_config::kMaxM));
    if (b.usable) fit(b, dev, why_none, cuda::moe_decode_config::need_gate_up(6144, 1));
    b.smem_bytes = std::max(cuda::moe_decode_config::gate_up_smem(6144, 1),
                            cuda::moe_decode_config::down_smem(cuda::moe_decode_config::kMaxM));
    out.push_back(b);
  }
  {
    BackendInfo b{
        "moe",
        "grouped_decode_fp8",
        "cuda",
        "fp8 128x128 blocks",
        "decode steps of 1 to 128 tokens (m * top_k <= 1152, up to 1024 experts); hidden and intermediate "
        "multiples of 128; e4m3 weights streamed into registers, converted to f16 by the hardware, tensor "
        "cores with f16 activations, each 128-k block's partial sum times its scale, down summed in a fixed "
        "order; used by `grouped` first where it applies (not in exact mode)",
        "sm_80 or newer",
        0,
        false,
        ""};
    // DeepSeek-V3's widths at the largest token count (the down kernel's tiles grow with m).
    fit(b, dev, why_none, cuda::moe_decode_fp8_config::need_down(cuda::moe_decode_fp8_config::kMaxM));
    if (b.usable) fit(b, dev, why_none, cuda::moe_decode_fp8_config::need_gate_up(7168, 1));
    b.smem_bytes = std::max(cuda::moe_decode_fp8_config::gate_up_smem(7168, 1),
                            cuda::moe_decode_fp8_config::down_smem(cuda::moe_decode_fp8_config::kMaxM));
    out.push_back(b);
  }
  {
    BackendInfo b{
        "moe",
        "grouped_mma",
        "cuda",
        "nvfp4, fp8_block, bf16",
        "prefill steps (grouped rows averaging 8+ per expert); hidden a multiple of 128 and "
        "intermediate of 64, up to 1024 experts (fp8_block: block edge a multiple of 64); multi-stage "
        "cp.async tiles, nvfp4 and fp8_block (times its block scale) expanded to bf16 in shared memory, "
        "mma.sync; on sm_90 with 64+ grouped rows per expert the warp-specialised wgmma "
        "kernel instead (MOESERVE_MOE_PREFILL_KERNEL=mma|wgmma forces one), loading nvfp4 and bf16 tiles by "
        "tensor copies where the layer's tensor maps apply, else by cp.async "
        "(MOESERVE_MOE_WGMMA_LOAD=cpasync|tma forces one); nvfp4 by tensor copies from 128 grouped rows per "
        "expert as a transposed product whose consumers expand the weights into the wgmma register "
        "fragments (MOESERVE_MOE_WGMMA_EXPAND=consumer|producer|registers forces one); used by `grouped` "
        "automatically "
        "where it applies (not in exact mode)",
        "sm_80 or newer",
        0,
        false,
        ""};
    // The smallest configuration (64 rows, two stages) at GLM-5's 256 experts: what a device is judged by
    // (fp8_block, whose raw stage is the largest of the expanded formats).
    const cuda::KernelNeed need{"moe_experts_mma bm64 stages2",
                                cuda::moe_mma_smem_bytes(cuda::MoeMmaFormat::FP8Block, 64, 2, 256), 80,
                                false};
    fit(b, dev, why_none, need);
    b.smem_bytes = need.smem_bytes;
    out.push_back(b);
  }
  {
    BackendInfo b{
        "linear", "nvfp4_gemv", "cuda", "nvfp4", "1 to 8 rows (decode), k a multiple of 32", "sm_80 or newer",
        0,        false,        ""};
    const auto cfg = dev ? cuda::nvfp4_gemv_config::choose(8, 6144, 6144, *dev)
                         : cuda::nvfp4_gemv_config::Config{1, 16, 1};
    fit(b, dev, why_none, cuda::nvfp4_gemv_config::need(8, cfg));
    out.push_back(b);
  }
  {
    BackendInfo b{"linear",
                  "cublaslt",
                  "cuda",
                  "f32, bf16; fp8 blocks and nvfp4 expanded to bf16 first",
                  "any rows; k a multiple of 8 (f32: 4)",
                  "any CUDA device",
                  0,
                  false,
                  ""};
    fit(b, dev, why_none, {"cublaslt", 0, 0, false});
    out.push_back(b);
  }
  out.push_back(
      {"linear", "cpu", "cpu", "f32, bf16, fp8 128x128 blocks, nvfp4", "any", "x86-64", 0, true, ""});
  return out;
}

}  // namespace ms::ops
