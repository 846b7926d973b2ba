// The two weight-absorption products around MLA attention, on kv_b_proj as stored (BF16, F32 or FP8 with
// 128x128 block scales, dequantised as it is read):
//   mla_absorb_q: q_cat[i, h] = [q_nope[i, h] W_UK_h (kv_lora_rank), q_pe[i, h] (rope)]
//   mla_out_v:    out[i, h * v + e] = W_UV_h[e] . lat[i, h]
// with W_UK_h / W_UV_h head h's nope rows / v rows of kv_b_proj [heads * (nope + v), kv_lora_rank]. Semantics
// of kernels/cpu/mla.h. Two implementations:
//   streaming (the default where the shape allows it, mla_absorb_stream.cu): built for decode batches. A
//   block
//     owns one head, one slice of the weight and every token of a tile of up to kMlaStreamTokens tokens, so
//     up to that many tokens each weight byte is read once per step, with 16-byte loads, many in flight per
//     thread, and enough blocks for every SM at batch 1. Results do not depend on the run (fixed reduction
//     order).
//   simple (mla_absorb.cu): any shape; a block per 128 columns / 32 rows of a head and kMlaAbsorbTokens
//   tokens.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace ms::cuda {

enum class DenseWeightFormat : uint8_t { F32, BF16, FP8Block };

struct DenseWeightView {
  DenseWeightFormat format = DenseWeightFormat::BF16;
  int64_t rows = 0, cols = 0;
  const void* __restrict__ data = nullptr;    // F32: f32 [rows, cols]; BF16: u16 [rows, cols]; FP8Block: e4m3
  const float* __restrict__ scale = nullptr;  // FP8Block: f32 [ceil(rows/block), ceil(cols/block)]
  int block = 128;                            // FP8Block block edge
};

constexpr int kMlaAbsorbTokens = 16;  // simple kernels: tokens per block (weights re-read per this many)
constexpr int kMlaStreamTokens = 64;  // streaming kernels: tokens per block (weights re-read per this many)

// Which implementation a launch uses. Auto: streaming where the shape allows it, else simple. Streaming:
// throws ms::Error naming the field when the shape does not allow it.
enum class MlaAbsorbKernel : uint8_t { Auto, Streaming, Simple };

struct MlaAbsorbQParams {
  const float* __restrict__ q = nullptr;  // [m, heads, nope + rope] rope part rotated, contiguous
  DenseWeightView kv_b;                   // [heads * (nope + v), kv_lora_rank]
  float* __restrict__ q_cat = nullptr;    // [m, heads, kv_lora_rank + rope] contiguous
  int m = 0, heads = 0, nope = 0, rope = 0, v = 0, kv_lora_rank = 0;
  MlaAbsorbKernel kernel = MlaAbsorbKernel::Auto;
};

struct MlaOutVParams {
  const float* __restrict__ lat = nullptr;  // [m, heads, kv_lora_rank] contiguous
  DenseWeightView kv_b;                     // [heads * (nope + v), kv_lora_rank]
  float* __restrict__ out = nullptr;        // [m, heads * v] contiguous
  int m = 0, heads = 0, nope = 0, v = 0, kv_lora_rank = 0;
  MlaAbsorbKernel kernel = MlaAbsorbKernel::Auto;
};

// Check shapes and the device's shared memory, then launch on `stream`. No workspace; graph-capturable.
// m = 0 launches nothing.
void mla_absorb_q(const MlaAbsorbQParams& p, cudaStream_t stream);
void mla_out_v(const MlaOutVParams& p, cudaStream_t stream);

// Why the streaming kernel cannot take this shape on the current device (the field and the need), or "" when
// it can. Shapes must already pass the launchers' general checks.
std::string mla_absorb_q_streaming_refusal(const MlaAbsorbQParams& p);
std::string mla_out_v_streaming_refusal(const MlaOutVParams& p);

}  // namespace ms::cuda
