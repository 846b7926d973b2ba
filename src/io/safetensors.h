// safetensors: an 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {...}}
// then the data. Files are mmap'ed and tensors borrow the mapping (zero copy).
//
// Reader rules (strict; every violation is an ms::Error naming the file and, where there is one, the tensor):
// the length N fits in the file and is at most kMaxSafetensorsHeader; the JSON parses, is an object, has no
// duplicate keys and nests no deeper than the format needs; each tensor entry has exactly dtype (one of F32
// F16 BF16 F8_E4M3 F8_E5M2 U8 I32 I64), shape (non-negative integers whose product fits int64) and
// data_offsets ([begin, end], begin <= end <= data size, end - begin == numel * element size); no two
// tensors' byte ranges overlap; `__metadata__` maps strings to strings. Gaps between tensors and trailing
// bytes after the last one are tolerated. The format does not align tensor data, so neither does the reader.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ms::io {

// Headers above this size are refused before parsing (the reference implementation uses the same bound).
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;  // U8 for packed NVFP4 weights, as stored
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

// Parses and validates a header (the JSON after the 8-byte length). `data_size` is the size of the data
// section. Throws ms::Error naming `file` and the offending tensor on any malformation. Pure: no I/O (the
// fuzz target). The result is sorted by begin offset (file order).
std::vector<TensorInfo> parse_safetensors_header(const char* json, size_t len, uint64_t data_size,
                                                 const std::string& file,
                                                 std::map<std::string, std::string>* metadata = nullptr);

// Parses a whole file image: the 8-byte length, the header, and checks the data section against it.
// `*data_start` (if given) receives the offset of the data section from the start of `bytes`.
std::vector<TensorInfo> parse_safetensors_image(const char* bytes, size_t size, const std::string& file,
                                                uint64_t* data_start = nullptr,
                                                std::map<std::string, std::string>* metadata = nullptr);

class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;
  // A tensor borrowing the mapping; it keeps the file mapped while alive. The mapping is read-only:
  // writing through the tensor faults, so clone() what must change. Data whose address is not a multiple
  // of the element size (legal in the format, never made by write_safetensors) is copied into an owned,
  // aligned tensor instead, so kernels may rely on natural alignment.
  Tensor tensor(const std::string& name) const;
  // True when tensor(name) borrows the mapping (natural alignment) rather than copying.
  bool zero_copy(const std::string& name) const;

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

// A checkpoint directory, in this order of preference:
//  - model.safetensors.index.json {"weight_map": {tensor: shard file}}: the index is the authority. Every
//    tensor it names must be in its shard; shard files must be plain names inside the directory. Tensors
//    a shard holds but the index does not name are ignored (logged at debug level), as loaders that
//    follow the index would never read them.
//  - model.safetensors alone (other *.safetensors next to it are not read).
//  - every *.safetensors in the directory; a tensor name found in two files is an error.
class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& dir);
  const std::filesystem::path& dir() const { return dir_; }
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // throws naming the tensor when missing
  Tensor tensor(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  // The distinct files the checkpoint reads, sorted by path.
  std::vector<std::shared_ptr<SafetensorsFile>> files() const;

 private:
  void open_index(const std::filesystem::path& index);
  void add_file(std::shared_ptr<SafetensorsFile> file);
  std::filesystem::path dir_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> by_name_;
};

// Writes CPU tensors into one safetensors file, as the reference writer lays it out: the header padded with
// spaces to a multiple of 8 bytes, tensors packed without gaps in order of decreasing element size (then
// in the given order), so every tensor is naturally aligned. NVFP4 tensors are stored as U8 with the last
// dimension halved (two codes per byte), which is what reading them back yields. Non-contiguous tensors
// are copied first. The file is written beside `path` and renamed into place.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace ms::io
