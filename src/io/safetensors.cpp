#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/log.h"

namespace ms::io {
namespace fs = std::filesystem;
using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------------------
// SafetensorsFile

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const fs::path& path) {
  const std::string file = path.string();
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) MS_THROW("{}: cannot open: {}", file, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    MS_THROW("{}: cannot stat: {}", file, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    MS_THROW("{}: not a regular file", file);
  }
  auto f = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  f->path_ = path;
  f->self_ = f;
  const auto size = static_cast<size_t>(st.st_size);
  if (size > 0) {
    // Read-only and private: the checkpoint on disk can never be changed through a tensor.
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    if (m == MAP_FAILED) MS_THROW("{}: cannot mmap {} bytes: {}", file, size, std::strerror(err));
    f->map_ = m;  // owned from here: the destructor unmaps even if parsing throws
    f->map_size_ = size;
  } else {
    ::close(fd);
  }
  uint64_t start = 0;
  static const char kEmpty[1] = {0};
  const char* base = f->map_ ? static_cast<const char*>(f->map_) : kEmpty;
  f->tensors_ = parse_safetensors_image(base, size, file, &start, &f->metadata_);
  f->data_ = base + start;
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->by_name_.emplace(f->tensors_[i].name, i);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

bool SafetensorsFile::contains(const std::string& name) const {
  return by_name_.count(name) != 0;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) MS_THROW("{}: no tensor '{}' in this file", path_.string(), name);
  return tensors_[it->second];
}

bool SafetensorsFile::zero_copy(const std::string& name) const {
  const TensorInfo& ti = info(name);
  const auto addr = reinterpret_cast<uintptr_t>(data_ + ti.begin);
  return addr % static_cast<uintptr_t>(dtype_bits(ti.dtype) / 8) == 0;
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo& ti = info(name);
  const char* p = data_ + ti.begin;
  if (!zero_copy(name)) {
    Tensor t = Tensor::empty(ti.shape, ti.dtype);
    if (ti.end > ti.begin) std::memcpy(t.raw(), p, ti.end - ti.begin);
    return t;
  }
  std::shared_ptr<const void> keep = self_.lock();
  MS_CHECK(keep != nullptr, "{}: tensor '{}' requested from a file not made by SafetensorsFile::open",
           path_.string(), name);
  // const_cast: Tensor has no const storage; the mapping is PROT_READ, so a write faults instead of
  // silently changing anything.
  return Tensor::borrow(const_cast<char*>(p), ti.shape, ti.dtype, std::move(keep));
}

// ---------------------------------------------------------------------------------------------------------
// Checkpoint

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) MS_THROW("{}: cannot open: {}", p.string(), std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) MS_THROW("{}: read error", p.string());
  return ss.str();
}

// A shard name from an index must name a file in the checkpoint directory itself.
bool plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

}  // namespace

void Checkpoint::add_file(std::shared_ptr<SafetensorsFile> file) {
  for (const auto& ti : file->tensors()) {
    auto [it, fresh] = by_name_.emplace(ti.name, file);
    if (!fresh)
      MS_THROW("{}: tensor '{}' is in both {} and {}", dir_.string(), ti.name, it->second->path().string(),
               file->path().string());
  }
}

void Checkpoint::open_index(const fs::path& index) {
  const std::string idx = index.string();
  json root;
  try {
    root = json::parse(read_text(index));
  } catch (const json::exception& e) {
    MS_THROW("{}: not valid JSON: {}", idx, e.what());
  }
  if (!root.is_object()) MS_THROW("{}: must be a JSON object, got {}", idx, root.type_name());
  auto wm = root.find("weight_map");
  if (wm == root.end()) MS_THROW("{}: missing weight_map", idx);
  if (!wm->is_object()) MS_THROW("{}: weight_map must be an object, got {}", idx, wm->type_name());

  // shard file -> tensors the index places there
  std::map<std::string, std::vector<std::string>> shards;
  for (const auto& [name, v] : wm->items()) {
    if (!v.is_string())
      MS_THROW("{}: weight_map entry for tensor '{}' must be a file name string, got {}", idx, name,
               v.type_name());
    const std::string& shard = v.get_ref<const std::string&>();
    if (!plain_file_name(shard))
      MS_THROW("{}: tensor '{}' maps to '{}', which is not a file name inside the checkpoint directory", idx,
               name, shard);
    shards[shard].push_back(name);
  }
  for (const auto& [shard, names] : shards) {
    const fs::path p = dir_ / shard;
    std::error_code ec;
    if (!fs::exists(p, ec))
      MS_THROW("{}: shard file {} (holding tensor '{}'{}) listed in {} does not exist", dir_.string(),
               p.string(), names.front(),
               names.size() > 1 ? fmt::format(" and {} more", names.size() - 1) : "", idx);
    auto file = SafetensorsFile::open(p);
    for (const auto& name : names) {
      if (!file->contains(name))
        MS_THROW("{}: tensor '{}' is listed in the index but missing from its shard {}", idx, name,
                 p.string());
      by_name_.emplace(name, file);
    }
    if (file->tensors().size() > names.size())
      MS_LOG_DEBUG("{}: {} tensors not named in the index are ignored", p.string(),
                   file->tensors().size() - names.size());
  }
}

Checkpoint Checkpoint::open(const fs::path& dir) {
  Checkpoint ck;
  ck.dir_ = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    MS_THROW("{}: not a directory (expected a checkpoint directory)", dir.string());
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    ck.open_index(index);
    return ck;
  }
  const fs::path single = dir / "model.safetensors";
  if (fs::exists(single, ec)) {
    ck.add_file(SafetensorsFile::open(single));
    return ck;
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  if (ec) MS_THROW("{}: cannot list directory: {}", dir.string(), ec.message());
  if (files.empty())
    MS_THROW("{}: no model.safetensors.index.json, model.safetensors or *.safetensors file", dir.string());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) ck.add_file(SafetensorsFile::open(f));
  return ck;
}

bool Checkpoint::contains(const std::string& name) const {
  return by_name_.count(name) != 0;
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) MS_THROW("{}: checkpoint has no tensor '{}'", dir_.string(), name);
  return it->second->info(name);
}

Tensor Checkpoint::tensor(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) MS_THROW("{}: checkpoint has no tensor '{}'", dir_.string(), name);
  return it->second->tensor(name);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [n, f] : by_name_) out.push_back(n);
  return out;  // std::map keeps them sorted
}

std::vector<std::shared_ptr<SafetensorsFile>> Checkpoint::files() const {
  std::vector<std::shared_ptr<SafetensorsFile>> out;
  std::set<const SafetensorsFile*> seen;
  for (const auto& [n, f] : by_name_)
    if (seen.insert(f.get()).second) out.push_back(f);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->path() < b->path(); });
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// Writer

void write_safetensors(const fs::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string file = path.string();
  struct Item {
    const std::string* name;
    Tensor t;  // contiguous CPU
    DType dtype;
    Shape shape;
    size_t elem;
  };
  std::vector<Item> items;
  std::set<std::string_view> seen;
  for (const auto& [name, t0] : tensors) {
    if (name.empty()) MS_THROW("{}: cannot write a tensor with an empty name", file);
    if (name == "__metadata__") MS_THROW("{}: '__metadata__' is reserved and cannot name a tensor", file);
    if (!seen.insert(name).second) MS_THROW("{}: tensor '{}' given twice", file, name);
    if (!t0.defined()) MS_THROW("{}: tensor '{}' is undefined", file, name);
    if (t0.device() != Device::CPU) MS_THROW("{}: tensor '{}' is not on the CPU", file, name);
    Item it{&name, t0.is_contiguous() ? t0 : t0.clone(), t0.dtype(), t0.shape(), 0};
    if (it.dtype == DType::NVFP4) {
      if (it.shape.empty() || it.shape.back() % 2 != 0)
        MS_THROW("{}: nvfp4 tensor '{}' {} needs an even last dimension to pack into bytes", file, name,
                 t0.desc());
      it.shape.back() /= 2;
      it.dtype = DType::U8;
    }
    it.elem = static_cast<size_t>(dtype_bits(it.dtype) / 8);
    items.push_back(std::move(it));
  }
  // Larger elements first: with an 8-byte-aligned header and no gaps, every tensor starts aligned.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.elem > b.elem; });

  std::string header;
  try {
    json h = json::object();
    if (!metadata.empty()) h["__metadata__"] = metadata;
    uint64_t offset = 0;
    for (const auto& it : items) {
      const uint64_t n = it.t.nbytes();
      h[*it.name] = {{"dtype", std::string(dtype_safetensors_name(it.dtype))},
                     {"shape", it.shape},
                     {"data_offsets", {offset, offset + n}}};
      offset += n;
    }
    header = h.dump();
  } catch (const json::exception& e) {
    MS_THROW("{}: cannot encode the header (tensor names and metadata must be UTF-8): {}", file, e.what());
  }
  header.append((8 - header.size() % 8) % 8, ' ');

  const std::string tmp = file + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) MS_THROW("{}: cannot create: {}", tmp, std::strerror(errno));
  auto fail = [&](const std::string& what) {
    int err = errno;
    std::fclose(f);
    std::remove(tmp.c_str());
    MS_THROW("{}: {}: {}", tmp, what, std::strerror(err));
  };
  unsigned char len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  if (std::fwrite(len, 1, 8, f) != 8 || std::fwrite(header.data(), 1, header.size(), f) != header.size())
    fail("write failed");
  for (const auto& it : items) {
    const size_t n = it.t.nbytes();
    if (n && std::fwrite(it.t.raw(), 1, n, f) != n) fail(fmt::format("writing tensor '{}' failed", *it.name));
  }
  if (std::fflush(f) != 0) fail("write failed");
  if (std::fclose(f) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    MS_THROW("{}: close failed: {}", tmp, std::strerror(err));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    MS_THROW("{}: cannot move into place: {}", file, ec.message());
  }
}

}  // namespace ms::io
