// Copies a model's weights from host memory (the mmap'ed checkpoint) to the device in their stored format
// (NVFP4, FP8 blocks, BF16, f32 norms): nothing is expanded. Shows a progress bar and reports GB/s.
#pragma once

#include "io/model_config.h"
#include "model/model_weights.h"
#include "model/tensor_source.h"
#include "runtime/cuda/device_arena.h"

namespace ms::runtime::cuda {

struct UploadStats {
  double bytes = 0;    // copied to the device
  double seconds = 0;  // wall time of the copy
};

// The same weights with every tensor on the device (allocated from `arena`).
model::ModelWeights upload_weights(const model::ModelWeights& host, DeviceArena& arena,
                                   UploadStats* stats = nullptr);

// The weights of `cfg` built tensor by tensor from `src` straight into `arena`: each matrix (weights and
// their scales) is made on the host by the source (a RandomSource generates it with OpenMP), copied to the
// device and dropped, so host memory peaks at what the source holds (one tensor group), not the model; norms,
// biases and scalars stay on the host through load_weights and are copied last. `reserve_bytes`: the
// device bytes to reserve up front (the specs' stored bytes). Same progress bar and GB/s line as
// upload_weights. `--load-format dummy` on the GPU: a full-size model never fits in host memory first.
model::ModelWeights upload_weights_from_source(const io::ModelConfig& cfg, const model::TensorSource& src,
                                               double reserve_bytes, DeviceArena& arena,
                                               UploadStats* stats = nullptr);

// Stored bytes of every tensor of `w`, as upload_weights copies them.
double weight_bytes(const model::ModelWeights& w);

}  // namespace ms::runtime::cuda
