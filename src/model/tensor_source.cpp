#include "model/tensor_source.h"

#include "core/error.h"

namespace ms::model {

Tensor MemorySource::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) MS_THROW("{}: tensor '{}' is missing", desc_, name);
  return it->second;
}

}  // namespace ms::model
