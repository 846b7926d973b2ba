// The tile configuration of the tensor-core grouped expert GEMMs (moe_experts_mma.h), chosen on the host from
// the shape and the device limits alone, so the chooser is tested without the hardware against the sm_90,
// sm_100 and sm_120 presets (tests/unit/kernels/kernel_fit_test.cpp). Header-only and free of CUDA types.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <optional>
#include <string>

#include "kernels/cuda/common/kernel_fit.h"

namespace ms::cuda {

// Weight formats the tensor-core path decodes (F32 stays on the CUDA-core kernels). FP8Block: e4m3 weights
// with one f32 scale per block x block tile (DeepSeek's weight_scale_inv), expanded to bf16 times the scale.
enum class MoeMmaFormat : int { BF16, NVFP4, FP8Block };

// FP8Block weights on the tensor-core kernels: every 64-k stage and every 64-row group of a weight tile must
// lie in one scale block (one scale per group and stage), so the block edge must be a multiple of 64.
constexpr int kMoeMmaFp8BlockQuantum = 64;

// Fixed by the kernel: 256 threads (8 warps as 2 x 4), 128 weight rows x 64 k per stage. gate_up: the 128
// weight rows are 64 gate and the 64 matching up rows, so a block writes 64 act columns; down: 128 output
// columns.
constexpr int kMoeMmaThreads = 256;
constexpr int kMoeMmaBN = 128;
constexpr int kMoeMmaBK = 64;

struct MoeMmaShape {
  MoeMmaFormat format = MoeMmaFormat::NVFP4;
  int m = 0;  // tokens of the step
  int top_k = 0, n_experts = 0, hidden = 0, inter = 0;
  int fp8_block = 128;  // FP8Block scale block edge (other formats ignore it)
};

struct MoeMmaConfig {
  int bm = 128;     // grouped rows per block tile: 64 or 128
  int stages = 4;   // cp.async pipeline depth, 2..4
  size_t smem = 0;  // dynamic shared memory per block, bytes
};

// Bytes of one weight stage of the mma.sync kernel as stored: BF16 [128][64] bf16; NVFP4 [128][32] packed
// bytes + [128][4] e4m3 scales; FP8Block [128][64] e4m3 + 4 f32 scale slots (one per 64-row group, 2 used).
inline size_t moe_mma_w_stage_bytes(MoeMmaFormat f) {
  switch (f) {
    case MoeMmaFormat::BF16:
      return size_t{kMoeMmaBN} * kMoeMmaBK * 2;
    case MoeMmaFormat::NVFP4:
      return size_t{kMoeMmaBN} * (kMoeMmaBK / 2 + kMoeMmaBK / 16);
    case MoeMmaFormat::FP8Block:
      return size_t{kMoeMmaBN} * kMoeMmaBK + 16;
  }
  return 0;
}

// Shared memory of one block: A stages [stages][bm][64] bf16; weight stages as stored
// (moe_mma_w_stage_bytes); NVFP4 and FP8Block add the decoded [128][64] bf16 tile; then the per-expert tile
// prefix [n_experts + 1] i32 and 8 warp sums.
inline size_t moe_mma_smem_bytes(MoeMmaFormat f, int bm, int stages, int n_experts) {
  const size_t a = static_cast<size_t>(stages) * bm * kMoeMmaBK * 2;
  const size_t w_stage = moe_mma_w_stage_bytes(f);
  const size_t decoded = f != MoeMmaFormat::BF16 ? size_t{kMoeMmaBN} * kMoeMmaBK * 2 : 0;
  const size_t table = (static_cast<size_t>(n_experts) + 1 + 8) * 4;
  return a + static_cast<size_t>(stages) * w_stage + decoded + (table + 127) / 128 * 128;
}

// Whether the shape can use the tensor-core kernels at all: N tiles and k steps must divide the widths.
inline std::optional<std::string> moe_mma_shape_unsupported(const MoeMmaShape& s) {
  if (s.hidden <= 0 || s.inter <= 0 || s.top_k <= 0 || s.n_experts <= 0)
    return fmt::format("moe_experts_mma: empty shape (hidden {}, inter {}, top_k {}, n_experts {})", s.hidden,
                       s.inter, s.top_k, s.n_experts);
  if (s.hidden % kMoeMmaBN != 0 || s.inter % kMoeMmaBK != 0)
    return fmt::format("moe_experts_mma: hidden {} must be a multiple of {} and inter {} of {}", s.hidden,
                       kMoeMmaBN, s.inter, kMoeMmaBK);
  if (s.n_experts > 1024) return fmt::format("moe_experts_mma: n_experts {} > 1024", s.n_experts);
  if (s.format == MoeMmaFormat::FP8Block && (s.fp8_block <= 0 || s.fp8_block % kMoeMmaFp8BlockQuantum != 0))
    return fmt::format("moe_experts_mma: fp8_block {} must be a positive multiple of {}", s.fp8_block,
                       kMoeMmaFp8BlockQuantum);
  return std::nullopt;
}

// The largest-throughput configuration that fits `dev`: bm 128 when experts average >= 96 rows (fewer
// weight decodes per FLOP), else 64 (less padding); then the deepest pipeline whose shared memory fits.
// nullopt (with *why set) when nothing fits or the device is older than sm_80 (mma.sync bf16, cp.async).
inline std::optional<MoeMmaConfig> choose_moe_mma_config(const MoeMmaShape& s, const DeviceLimits& dev,
                                                         std::string* why = nullptr) {
  auto fail = [&](std::string w) -> std::optional<MoeMmaConfig> {
    if (why != nullptr) *why = std::move(w);
    return std::nullopt;
  };
  if (auto bad = moe_mma_shape_unsupported(s)) return fail(*bad);
  const double rows_per_expert = static_cast<double>(s.m) * s.top_k / s.n_experts;
  const int bm = rows_per_expert >= 96.0 ? 128 : 64;
  std::string last;
  for (int stages = 4; stages >= 2; --stages) {
    const KernelNeed need{fmt::format("moe_experts_mma bm{} stages{}", bm, stages),
                          moe_mma_smem_bytes(s.format, bm, stages, s.n_experts), 80, false};
    const auto no = why_cannot_run(need, dev);
    if (!no) return MoeMmaConfig{bm, stages, need.smem_bytes};
    last = *no;
  }
  return fail(last);
}

// The regime rule shared by the decode and prefill kernels: prefill (tensor cores) when the step's grouped
// rows average at least 8 per expert (256 tokens at GLM-5's top-8 of 256), decode (weight streaming) below.
inline bool moe_experts_prefill_regime(int m, int top_k, int n_experts) {
  return n_experts > 0 && static_cast<long long>(m) * top_k >= 8LL * n_experts;
}

}  // namespace ms::cuda
