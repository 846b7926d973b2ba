// Device memory of one executor: a few large cudaMalloc blocks handed out by bump allocation, so nothing
// allocates during a step and every buffer has a fixed address for CUDA graphs. Freed as a whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ms::runtime::cuda {

class DeviceArena {
 public:
  // `label` names the arena in errors ("weights", "kv pages", "workspace").
  DeviceArena(std::string label, int device);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // Reserves one block of `bytes`; later allocations come from it. Throws naming the label, the request and
  // the device's free memory when cudaMalloc fails.
  void reserve(size_t bytes);
  // `bytes` from the current block, 256-byte aligned; reserves a new block of at least `bytes` when it does
  // not fit.
  void* alloc(size_t bytes);
  // A contiguous device tensor of the arena.
  Tensor tensor(Shape shape, DType dtype);

  size_t used() const { return used_; }
  size_t reserved() const { return reserved_; }
  const std::string& label() const { return label_; }

 private:
  struct Block {
    char* base;
    size_t size, top;
  };
  std::string label_;
  int device_;
  std::vector<Block> blocks_;
  size_t used_ = 0, reserved_ = 0;
};

// Free and total memory of the current device, bytes.
void device_memory(size_t& free_bytes, size_t& total_bytes);

}  // namespace ms::runtime::cuda
