// Every attention, MoE and linear backend moeserve has, what each supports, and whether it can run on a given
// device, and if not why (for `moeserve backends`, --attention-backend and --moe-runner-backend). A CUDA
// backend's fit is decided from the device's limits alone (kernels/cuda/common/kernel_fit.h), so it can be
// asked for a part that is not installed here.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/cuda/common/kernel_fit.h"

namespace ms::ops {

struct BackendInfo {
  std::string kind;       // "attention", "moe", "linear"
  std::string name;       // the value of --attention-backend / --moe-runner-backend
  std::string device;     // "cpu" or "cuda"
  std::string formats;    // weight formats, or KV cache dtypes for attention
  std::string shapes;     // heads, widths, page sizes, rows it takes
  std::string arch;       // architectures
  size_t smem_bytes = 0;  // shared memory per block it asks for (CUDA; for GLM-5's shape where it varies)
  bool usable = false;
  std::string why;  // why not, when not usable
};

// target null: this machine (its first CUDA device, when the build has CUDA and one is visible); otherwise
// the given limits (a preset of kernel_fit.h).
std::vector<BackendInfo> list_backends(const cuda::DeviceLimits* target = nullptr);

}  // namespace ms::ops
