// The configuration of the warp-specialised warpgroup-MMA grouped expert GEMMs (moe_experts_wgmma.h), chosen
// on the host from the shape and the device limits alone (tested without the hardware against the sm_90,
// sm_100 and sm_120 presets). Header-only and free of CUDA types.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <optional>
#include <string>

#include "kernels/cuda/common/kernel_fit.h"
#include "kernels/cuda/moe/moe_experts_mma_config.h"

namespace ms::cuda {

// Fixed by the kernel: 3 warpgroups (one producer, two consumers of 64 rows each), block tile 128 grouped
// rows x bn weight rows (128 or 256), 64 k per stage.
constexpr int kMoeWgThreads = 384;
constexpr int kMoeWgBM = 128;
constexpr int kMoeWgBK = 64;
constexpr int kMoeWgMaxStages = 6;
constexpr int kMoeWgMinStages = 3;

// Who expands NVFP4 tiles to bf16 (BF16 weights ignore it; FP8Block tiles are always expanded by the
// consumers). Consumer (the default): the producer only copies
// (A rows and raw NVFP4 into one ring of `stages`), the 256 consumer threads expand stage q into one of 3
// bf16 W buffers while the tensor cores run stage q - 1. Producer: the earlier layout, the producer warpgroup
// copies and expands (bf16 ring of `stages`, raw ring of stages - 1); kept selectable for A/B timing
// (MOESERVE_MOE_WGMMA_EXPAND=producer).
// Registers: the product is taken transposed (weight rows as wgmma's M, grouped rows as its N) so that each
// consumer thread expands the NVFP4 codes of its own A fragment straight into registers: no bf16 W tile in
// shared memory, no consumer barrier a stage, and each expanded value serves up to 256 grouped rows (block
// tile kMoeWgRsBN weight rows x kMoeWgRsBM grouped rows). NVFP4 with tensor-copy loads only (the choosers
// fall back to Consumer elsewhere); both projections take it or neither (the activations between them are
// stored with k permuted inside each 64-column block, see moe_experts_wgmma.cu).
enum class MoeWgExpand { Consumer, Producer, Registers };
constexpr int kMoeWgRsBM = 256;  // grouped rows per block tile of the Registers layout
constexpr int kMoeWgRsBN = 128;  // weight rows per block tile of the Registers layout
// Average grouped rows per expert from which the launcher asks for the Registers layout when neither the
// caller nor MOESERVE_MOE_WGMMA_EXPAND says (below it the consumer layout): measured on an H200 at GLM-5's
// shape, the Registers layout is 16% faster at 256 rows an expert (8192 tokens) and 10-15% slower at 16 and
// 64 (512 and 2048 tokens, where it was on par before its items were handed out by a counter); 128 is the
// untested middle (docs/PERFORMANCE.md).
constexpr int kMoeWgRegistersMinRows = 128;

// The layout asked for by default for shape s (the choosers still fall back where it cannot apply).
inline MoeWgExpand moe_wgmma_default_expand(const MoeMmaShape& s) {
  return s.n_experts > 0 &&
                 static_cast<long long>(s.m) * s.top_k >= 1LL * kMoeWgRegistersMinRows * s.n_experts
             ? MoeWgExpand::Registers
             : MoeWgExpand::Consumer;
}

// How the producer fills the ring. CpAsync: the producer warpgroup's 128 threads copy with cp.async (A rows
// gathered through the plan's permutation), arriving on `full` when their own copies landed. Tma: one thread
// issues tensor copies (TMA) that complete on `full` by bytes: A from activation rows already in grouped
// order (a tile is 128 consecutive rows, swizzled by the copy), weight tiles through per-expert tensor maps
// built on the host (moe_experts_wgmma_maps); NVFP4 codes and scales land raw (scales as the 16-byte row
// piece that holds the stage's 4, see kMoeWgTmaScaleRow) and the consumers expand them (Tma implies
// MoeWgExpand::Consumer).
enum class MoeWgLoad { CpAsync, Tma };

// Scale bytes per weight row in one raw NVFP4 stage of the Tma layout. A tensor copy's box row is a multiple
// of 16 bytes AND must start at a 16-byte aligned global address (a box whose innermost start is not is an
// illegal instruction on the hardware), so k step kc loads the aligned piece at byte 16 * (kc / 4) of the
// scale row (scales of k 256 * (kc / 4) .. + 255) and uses its bytes 4 * (kc % 4) .. + 3.
constexpr int kMoeWgTmaScaleRow = 16;

// Bf16 W buffers of the consumer-expansion layout: the consumers write buffer q % 3 after the barrier of
// stage q - 1, which both warpgroups pass only after their MMAs of stage q - 3 completed.
constexpr int kMoeWgConsumerWBufs = 3;

struct MoeWgmmaGemmConfig {
  int bn = 256;     // weight rows per block tile: 128 or 256 (gate_up: half gate, half up rows)
  int stages = 4;   // shared-memory ring depth (the producer keeps stages - 1 copies in flight)
  size_t smem = 0;  // dynamic shared memory per block, bytes
  MoeWgExpand expand = MoeWgExpand::Consumer;  // NVFP4 only (FP8Block, and NVFP4 with Tma: always Consumer)
  MoeWgLoad load = MoeWgLoad::CpAsync;         // FP8Block: always CpAsync (moe_wgmma_tma_unsupported)
};

struct MoeWgmmaConfig {
  MoeWgmmaGemmConfig gate_up, down;
};

// Whether the consumers expand the weight tiles (3 bf16 W buffers, a raw ring of `stages`): NVFP4 with
// MoeWgExpand::Consumer, and FP8Block always.
inline bool moe_wgmma_consumer_expands(MoeMmaFormat f, MoeWgExpand x) {
  return f == MoeMmaFormat::FP8Block ||
         (f == MoeMmaFormat::NVFP4 && (x == MoeWgExpand::Consumer || x == MoeWgExpand::Registers));
}

// Bf16 W buffers of a layout: the consumer expansion's 3, none where the consumers expand into registers,
// else (the bf16 ring) `stages`.
inline int moe_wgmma_w_buffers(MoeMmaFormat f, MoeWgExpand x, int stages) {
  if (f == MoeMmaFormat::NVFP4 && x == MoeWgExpand::Registers) return 0;
  return moe_wgmma_consumer_expands(f, x) ? kMoeWgConsumerWBufs : stages;
}

// Why the tensor-copy loads cannot take format f (nullopt when they can). FP8Block: its raw stage rotates
// each row's 16-byte pieces (moe_dev::fp8_raw_offset, against bank conflicts in the expansion), which a
// tensor copy cannot do, and its per-stage block scale is one f32 (4 bytes), below the 16-byte minimum of a
// box row; the choosers fall back to CpAsync.
inline std::optional<std::string> moe_wgmma_tma_unsupported(MoeMmaFormat f) {
  if (f == MoeMmaFormat::FP8Block)
    return std::string(
        "moe_experts_wgmma tma: FP8Block is not loaded by tensor copies (rotated raw pieces, 4-byte block "
        "scales below a box row's 16 bytes); cp.async instead");
  return std::nullopt;
}

// One raw (as stored) weight stage of bn rows: NVFP4 bn x (32 packed bytes + 4 e4m3 scales; Tma loads:
// + kMoeWgTmaScaleRow); FP8Block bn x 64 e4m3, then one f32 scale per 64-row group (at most 4) in a 128-byte
// slot (keeps the next stage aligned).
inline size_t moe_wgmma_raw_stage_bytes(MoeMmaFormat f, int bn, MoeWgLoad load = MoeWgLoad::CpAsync) {
  if (f == MoeMmaFormat::FP8Block) return static_cast<size_t>(bn) * kMoeWgBK + 128;
  return static_cast<size_t>(bn) *
         (kMoeWgBK / 2 + (load == MoeWgLoad::Tma ? kMoeWgTmaScaleRow : kMoeWgBK / 16));
}

// Shared memory of one block, 1024 bytes of slack to align the dynamic window first.
//   BF16, and NVFP4 with MoeWgExpand::Producer: the bf16 ring [stages] x (A [128][64] + W [bn][64]), each
//     tile 1024-aligned (the 128-byte swizzle); NVFP4 adds the raw ring [stages - 1] x bn x (32 packed bytes
//     + 4 e4m3 scales).
//   Consumer expansion (NVFP4 with MoeWgExpand::Consumer, FP8Block): A ring [stages] x [128][64] bf16, 3 bf16
//     W buffers [bn][64], raw ring [stages] x moe_wgmma_raw_stage_bytes.
//   MoeWgLoad::Tma: as the layouts above (NVFP4 the consumer one, or Registers) with raw NVFP4 rows of 32
//     packed bytes + kMoeWgTmaScaleRow scale bytes (moe_wgmma_raw_stage_bytes).
//   Registers (NVFP4, Tma): A ring [stages] x [kMoeWgRsBM][64] bf16 and the raw ring, no W buffers.
// Then 2 x stages mbarriers, the per-expert M-tile prefix [n_experts + 1] i32, 12 warp sums and one item
// index per ring slot (the Registers layout's dynamic items).
inline size_t moe_wgmma_smem_bytes(MoeMmaFormat f, int bn, int stages, int n_experts,
                                   MoeWgExpand x = MoeWgExpand::Consumer,
                                   MoeWgLoad load = MoeWgLoad::CpAsync) {
  const bool tma = load == MoeWgLoad::Tma;
  const bool rs = x == MoeWgExpand::Registers && f == MoeMmaFormat::NVFP4;
  const size_t a_tile = static_cast<size_t>(rs ? kMoeWgRsBM : kMoeWgBM) * kMoeWgBK * 2,
               w_tile = static_cast<size_t>(bn) * kMoeWgBK * 2;
  const size_t raw_stage = moe_wgmma_raw_stage_bytes(f, bn, load);
  if (tma && x == MoeWgExpand::Producer) x = MoeWgExpand::Consumer;
  const bool cx = moe_wgmma_consumer_expands(f, x);
  const size_t ring =
      static_cast<size_t>(stages) * a_tile + static_cast<size_t>(moe_wgmma_w_buffers(f, x, stages)) * w_tile;
  const size_t raw = f != MoeMmaFormat::BF16 ? static_cast<size_t>(cx ? stages : stages - 1) * raw_stage : 0;
  const size_t bars = static_cast<size_t>(2) * stages * 8;
  const size_t table = (static_cast<size_t>(n_experts) + 1 + 12 + kMoeWgMaxStages) * 4;
  return 1024 + ring + (raw + 127) / 128 * 128 + (bars + 127) / 128 * 128 + (table + 127) / 128 * 128;
}

// Weight rows per block tile of one projection: 256 where the output width allows (gate_up: 128 act columns
// per tile, so inter % 128; down: hidden % 256), else 128.
inline int moe_wgmma_bn(bool gate_up, int hidden, int inter) {
  return gate_up ? (inter % 128 == 0 ? 256 : 128) : (hidden % 256 == 0 ? 256 : 128);
}

// Why the shape cannot use the wgmma kernels (nullopt when it can): k widths multiples of 64, output widths
// of the 128-row tiles (gate_up: inter % 64; down: hidden % 128), n_experts <= 1024.
inline std::optional<std::string> moe_wgmma_shape_unsupported(const MoeMmaShape& s) {
  if (s.hidden <= 0 || s.inter <= 0 || s.top_k <= 0 || s.n_experts <= 0)
    return fmt::format("moe_experts_wgmma: empty shape (hidden {}, inter {}, top_k {}, n_experts {})",
                       s.hidden, s.inter, s.top_k, s.n_experts);
  if (s.hidden % 128 != 0 || s.inter % 64 != 0)
    return fmt::format("moe_experts_wgmma: hidden {} must be a multiple of 128 and inter {} of 64", s.hidden,
                       s.inter);
  if (s.n_experts > 1024) return fmt::format("moe_experts_wgmma: n_experts {} > 1024", s.n_experts);
  if (s.format == MoeMmaFormat::FP8Block && (s.fp8_block <= 0 || s.fp8_block % kMoeMmaFp8BlockQuantum != 0))
    return fmt::format("moe_experts_wgmma: fp8_block {} must be a positive multiple of {}", s.fp8_block,
                       kMoeMmaFp8BlockQuantum);
  return std::nullopt;
}

// One projection's configuration: the deepest ring (from kMoeWgMaxStages for bn 128 or consumer expansion,
// 4 for bn 256 otherwise, down to kMoeWgMinStages) whose shared memory fits `dev`; nullopt with *why when
// none does or `dev` is not sm_90 (the kernel is sm_90a code). FP8Block always expands in the consumers
// (the returned expand says so whatever x was asked).
inline std::optional<MoeWgmmaGemmConfig> choose_moe_wgmma_gemm(MoeMmaFormat f, int bn, int n_experts,
                                                               const DeviceLimits& dev, std::string* why,
                                                               MoeWgExpand x = MoeWgExpand::Consumer,
                                                               MoeWgLoad load = MoeWgLoad::CpAsync) {
  std::string last;
  if (f == MoeMmaFormat::FP8Block) x = MoeWgExpand::Consumer;
  if (moe_wgmma_tma_unsupported(f)) load = MoeWgLoad::CpAsync;
  if (x == MoeWgExpand::Registers && (f != MoeMmaFormat::NVFP4 || load != MoeWgLoad::Tma))
    x = MoeWgExpand::Consumer;
  // The Registers layout's tiles: 128 weight rows (gate_up: 64 gate + 64 up; the shape rules, inter % 64 and
  // hidden % 128, make both projections divide).
  if (x == MoeWgExpand::Registers) bn = kMoeWgRsBN;
  if (load == MoeWgLoad::Tma && x == MoeWgExpand::Producer) x = MoeWgExpand::Consumer;
  const bool cx = moe_wgmma_consumer_expands(f, x);
  for (int stages = bn == 256 && !cx ? 4 : kMoeWgMaxStages; stages >= kMoeWgMinStages; --stages) {
    const KernelNeed need{
        fmt::format("moe_experts_wgmma bn{} stages{}{}{}", bn, stages, load == MoeWgLoad::Tma ? " tma" : "",
                    x == MoeWgExpand::Registers ? " rs" : ""),
        moe_wgmma_smem_bytes(f, bn, stages, n_experts, x, load), 90, true};
    const auto no = why_cannot_run(need, dev);
    if (!no) return MoeWgmmaGemmConfig{bn, stages, need.smem_bytes, x, load};
    last = *no;
  }
  if (why != nullptr) *why = last;
  return std::nullopt;
}

// Why the shape cannot take the Tma loads (nullopt when it can): NVFP4 scale rows (k / 16 bytes) must be
// multiples of 16 bytes for a tensor map, so hidden and inter multiples of 256.
inline std::optional<std::string> moe_wgmma_tma_shape_unsupported(const MoeMmaShape& s) {
  if (auto bad = moe_wgmma_tma_unsupported(s.format)) return bad;
  if (s.format == MoeMmaFormat::NVFP4 && (s.hidden % 256 != 0 || s.inter % 256 != 0))
    return fmt::format("moe_experts_wgmma tma: NVFP4 hidden {} and inter {} must be multiples of 256",
                       s.hidden, s.inter);
  return std::nullopt;
}

// Both projections' configurations. load Tma where the shape does not allow it falls back to CpAsync (the
// configuration says which it got).
inline std::optional<MoeWgmmaConfig> choose_moe_wgmma_config(const MoeMmaShape& s, const DeviceLimits& dev,
                                                             std::string* why = nullptr,
                                                             MoeWgExpand x = MoeWgExpand::Consumer,
                                                             MoeWgLoad load = MoeWgLoad::CpAsync) {
  if (auto bad = moe_wgmma_shape_unsupported(s)) {
    if (why != nullptr) *why = *bad;
    return std::nullopt;
  }
  if (load == MoeWgLoad::Tma && moe_wgmma_tma_shape_unsupported(s)) load = MoeWgLoad::CpAsync;
  const auto gu =
      choose_moe_wgmma_gemm(s.format, moe_wgmma_bn(true, s.hidden, s.inter), s.n_experts, dev, why, x, load);
  if (!gu) return std::nullopt;
  // Both projections get the Registers layout or neither (gate_up's output is down's permuted input): the
  // projection chooser decides it from the format and the loads alone, which the two share.
  const auto dn =
      choose_moe_wgmma_gemm(s.format, moe_wgmma_bn(false, s.hidden, s.inter), s.n_experts, dev, why, x, load);
  if (!dn) return std::nullopt;
  return MoeWgmmaConfig{*gu, *dn};
}

// The automatic choice between the prefill kernels where both can run: wgmma when the grouped rows average
// at least 64 per expert (half a 128-row tile; below that the mma.sync kernel's 64-row tiles waste less).
inline bool moe_wgmma_preferred(const MoeMmaShape& s) {
  return s.n_experts > 0 && static_cast<long long>(s.m) * s.top_k >= 64LL * s.n_experts;
}

}  // namespace ms::cuda
