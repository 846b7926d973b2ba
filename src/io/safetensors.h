// safetensors: an 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {...}}
// then the data. Files are mmap'ed and tensors borrow the mapping (zero copy).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ms::io {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;  // U8 for packed NVFP4 weights, as stored
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

// Parses and validates a header (the JSON after the 8-byte length). `data_size` is the size of the data
// section. Throws ms::Error naming `file` and the offending tensor on any malformation. Pure: no I/O (the
// fuzz target).
std::vector<TensorInfo> parse_safetensors_header(const char* json, size_t len, uint64_t data_size,
                                                 const std::string& file,
                                                 std::map<std::string, std::string>* metadata = nullptr);

class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  ~SafetensorsFile();
  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;
  // A tensor borrowing the mapping; it keeps the file mapped while alive.
  Tensor tensor(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const char* data_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
  std::weak_ptr<SafetensorsFile> self_;
};

// A checkpoint directory: one model.safetensors, or shards listed in model.safetensors.index.json.
class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& dir);
  const std::filesystem::path& dir() const { return dir_; }
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // throws naming the tensor when missing
  Tensor tensor(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted

 private:
  std::filesystem::path dir_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> by_name_;
};

// Writes tensors (CPU, contiguous) into one safetensors file.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace ms::io
