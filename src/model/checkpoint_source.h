// TensorSource over a Hugging Face checkpoint directory (safetensors, mmap'ed: tensors borrow the mapping).
#pragma once

#include <filesystem>

#include "io/safetensors.h"
#include "model/tensor_source.h"

namespace ms::model {

class CheckpointSource : public TensorSource {
 public:
  explicit CheckpointSource(const std::filesystem::path& dir) : ckpt_(io::Checkpoint::open(dir)) {}
  bool contains(const std::string& name) const override { return ckpt_.contains(name); }
  Tensor tensor(const std::string& name) const override { return ckpt_.tensor(name); }
  std::string describe() const override { return "checkpoint " + ckpt_.dir().string(); }
  const io::Checkpoint& checkpoint() const { return ckpt_; }

 private:
  io::Checkpoint ckpt_;
};

}  // namespace ms::model
