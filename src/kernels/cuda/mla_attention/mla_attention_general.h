// The general paged MLA attention kernel (see mla_attention.h), for the dispatcher.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/mla_attention/mla_attention.h"

namespace ms::cuda {

constexpr int kMlaGeneralThreads = 256;

// Shared memory of one block: q rows and a key chunk as f32 (rows padded to an odd stride), scores, the
// latent accumulators and the softmax state.
size_t mla_general_smem_bytes(int heads_per_block, int keys_per_chunk, int width, int kv_lora_rank);

// Launches the general kernel with the given tile; shapes already checked by the caller.
void mla_general_launch(const MlaAttentionParams& p, int heads_per_block, int keys_per_chunk,
                        const DeviceCaps& caps, cudaStream_t stream);

}  // namespace ms::cuda
