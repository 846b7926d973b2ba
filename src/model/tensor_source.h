// Where weights come from, by checkpoint name: a checkpoint directory, or tensors made in memory (the
// built-in model, tests, quantised variants of a checkpoint).
#pragma once

#include <map>
#include <string>

#include "core/tensor.h"

namespace ms::model {

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual bool contains(const std::string& name) const = 0;
  // The tensor (may borrow the source's memory and keep it alive); throws naming it when absent.
  virtual Tensor tensor(const std::string& name) const = 0;
  virtual std::string describe() const = 0;  // "checkpoint DIR", "built-in model"
};

class MemorySource : public TensorSource {
 public:
  explicit MemorySource(std::string description = "in-memory weights") : desc_(std::move(description)) {}
  void put(const std::string& name, Tensor t) { tensors_[name] = std::move(t); }
  void erase(const std::string& name) { tensors_.erase(name); }
  bool contains(const std::string& name) const override { return tensors_.count(name) > 0; }
  Tensor tensor(const std::string& name) const override;
  std::string describe() const override { return desc_; }
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }

 private:
  std::string desc_;
  std::map<std::string, Tensor> tensors_;
};

}  // namespace ms::model
