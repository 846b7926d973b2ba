// MLA decode attention (absorbed form) over the paged FP8 e4m3 latent cache, read in place.
//
// Per sequence b and head h: s_t = softmax_scale * kv_scale * <q[b,h,:576], kv[t,:576]> over the sequence's
// tokens t, p = softmax(s), out[b,h,:512] = kv_scale * sum_t p_t kv[t,:512] (the latent output; W_UV is
// applied by the caller). Flash-decoding: the plan splits every sequence's pages into chunks so that batch 1
// with a long context still fills the GPU; one block computes a chunk for 64 heads at once (each page it
// reads is shared by those heads), a combine pass merges the chunks by their log-sum-exp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/mla_decode/mla_decode_config.h"

namespace ms::cuda {

struct MlaDecodeParams {
  const __nv_bfloat16* __restrict__ q =
      nullptr;                 // [batch, heads, 576] latent (absorbed) + rope part; head stride 576
  int64_t q_batch_stride = 0;  // elements between sequences of q (heads * 576 when packed)
  const uint8_t* __restrict__ kv =
      nullptr;           // [num_pages, 64, 576] fp8 e4m3 pool of this layer, 16-byte aligned
  float kv_scale = 1.f;  // the layer's KV dequantisation scale
  const int32_t* __restrict__ block_table = nullptr;  // [batch, block_table_stride] page ids, in token order
  int block_table_stride = 0;                         // max pages per sequence
  const int32_t* __restrict__ seq_lens =
      nullptr;                       // [batch] tokens in each sequence (0 allowed: output zeros)
  void* __restrict__ out = nullptr;  // [batch, heads, 512] f32 or bf16 (out_bf16)
  int64_t out_batch_stride = 0;      // elements between sequences of out (heads * 512 when packed)
  bool out_bf16 = false;
  int batch = 0, heads = 0, num_pages = 0;
  float softmax_scale = 1.f;
  int split_target = 0;  // blocks the plan aims to fill (the multiprocessor count); > 0
  // mla_decode_workspace_bytes(batch, heads, split_target) bytes, 256-byte aligned: split plan, partial
  // outputs and their log-sum-exps.
  void* __restrict__ workspace = nullptr;
};

size_t mla_decode_workspace_bytes(int batch, int heads, int split_target);

// Fills the split plan in the workspace from seq_lens on the device (one small kernel). Run once per decode
// step; every layer's mla_decode then reuses it. Graph-capturable: no host reads of device data.
void mla_decode_plan(const MlaDecodeParams& p, cudaStream_t stream);

// Attention for every sequence from the plan already in the workspace: a split pass and a combine pass.
// Checks shapes and the device's shared memory (a block needs about 200 KB) before launching.
void mla_decode(const MlaDecodeParams& p, cudaStream_t stream);

}  // namespace ms::cuda
