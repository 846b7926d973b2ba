// Copies a model's weights from host memory (the mmap'ed checkpoint) to the device in their stored format
// (NVFP4, FP8 blocks, BF16, f32 norms): nothing is expanded. Shows a progress bar and reports GB/s.
#pragma once

#include "model/model_weights.h"
#include "runtime/cuda/device_arena.h"

namespace ms::runtime::cuda {

struct UploadStats {
  double bytes = 0;    // copied to the device
  double seconds = 0;  // wall time of the copy
};

// The same weights with every tensor on the device (allocated from `arena`).
model::ModelWeights upload_weights(const model::ModelWeights& host, DeviceArena& arena,
                                   UploadStats* stats = nullptr);

// Stored bytes of every tensor of `w`, as upload_weights copies them.
double weight_bytes(const model::ModelWeights& w);

}  // namespace ms::runtime::cuda
