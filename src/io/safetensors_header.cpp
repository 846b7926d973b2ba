// The safetensors header parser. Kept free of logging and of everything but core/error, core/dtype,
// nlohmann::json and fmt: the fuzz target (tests/fuzz/fuzz_safetensors_header.cpp) compiles this file on
// its own with clang.
#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"

namespace ms::io {
namespace {

using json = nlohmann::json;

// Root object -> tensor entry -> shape list: three levels. A little slack lets a shape like [[1]] reach
// the shape check, which says more than "too deep" would.
constexpr int kMaxDepth = 6;

constexpr std::string_view kDtypes[] = {"F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "U8", "I32", "I64"};

// Only the names the safetensors format uses; our own spellings ("bf16", "nvfp4") are not valid there.
std::optional<DType> safetensors_dtype(std::string_view s) {
  for (auto n : kDtypes)
    if (s == n) return dtype_from_name(s);
  return std::nullopt;
}

std::string supported_dtypes() {
  std::string out;
  for (auto n : kDtypes) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

// Keeps tensor names readable in messages even when the fuzzer puts control bytes or megabytes in them.
std::string shown(std::string_view name) {
  std::string out = "'";
  size_t n = 0;
  for (char ch : name) {
    const auto c = static_cast<unsigned char>(ch);
    if (++n > 200) {
      out += "...";
      break;
    }
    if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += ch;
  }
  return out + "'";
}

// Tracks keys per open object, to refuse duplicates (nlohmann silently keeps the last), and the depth.
struct KeyChecker {
  const std::string& file;
  std::vector<std::set<std::string>> open;
  std::string tensor;  // the current root-level key

  bool operator()(int depth, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxDepth)
          MS_THROW("{}: header JSON nests deeper than {} levels{}", file, kMaxDepth,
                   tensor.empty() ? "" : fmt::format(" (in tensor {})", shown(tensor)));
        if (ev == json::parse_event_t::object_start) open.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open.empty()) open.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (depth == 1) tensor = key;
        if (!open.empty() && !open.back().insert(key).second) {
          if (depth == 1) MS_THROW("{}: tensor {} appears twice in the header", file, shown(key));
          MS_THROW("{}: tensor {}: key {} appears twice", file, shown(tensor), shown(key));
        }
        break;
      }
      default:
        break;
    }
    return true;
  }
};

uint64_t read_u64_le(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

TensorInfo parse_entry(const std::string& file, const std::string& name, const json& e, uint64_t data_size) {
  const std::string where = fmt::format("{}: tensor {}", file, shown(name));
  if (name.empty()) MS_THROW("{}: a tensor has an empty name", file);
  if (!e.is_object()) MS_THROW("{}: entry must be an object, got {}", where, e.type_name());
  for (const auto& [k, v] : e.items()) {
    (void)v;
    if (k != "dtype" && k != "shape" && k != "data_offsets") MS_THROW("{}: unknown key {}", where, shown(k));
  }
  TensorInfo info;
  info.name = name;

  auto dt = e.find("dtype");
  if (dt == e.end()) MS_THROW("{}: missing dtype", where);
  if (!dt->is_string()) MS_THROW("{}: dtype must be a string, got {}", where, dt->type_name());
  const std::string& dts = dt->get_ref<const std::string&>();
  auto parsed = safetensors_dtype(dts);
  if (!parsed) MS_THROW("{}: unknown dtype {} (supported: {})", where, shown(dts), supported_dtypes());
  info.dtype = *parsed;

  auto sh = e.find("shape");
  if (sh == e.end()) MS_THROW("{}: missing shape", where);
  if (!sh->is_array())
    MS_THROW("{}: shape must be a list of non-negative integers, got {}", where, sh->type_name());
  // numel in uint64 with overflow checks; it must also fit int64, the element count type of Tensor.
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned())
      MS_THROW("{}: shape must be a list of non-negative integers, got {}", where, sh->dump());
    uint64_t v = d.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      MS_THROW("{}: shape dimension {} is too large", where, v);
    info.shape.push_back(static_cast<int64_t>(v));
    if (!overflow && __builtin_mul_overflow(numel, v, &numel)) overflow = true;
  }
  // A zero dimension makes the count 0 no matter how big the others are.
  if (std::find(info.shape.begin(), info.shape.end(), 0) != info.shape.end()) {
    numel = 0;
    overflow = false;
  }
  if (overflow || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    MS_THROW("{}: shape {} has more elements than fit in 64 bits", where, sh->dump());
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_bits(info.dtype) / 8), &nbytes))
    MS_THROW("{}: shape {} of {} is more bytes than fit in 64 bits", where, sh->dump(), dts);

  auto off = e.find("data_offsets");
  if (off == e.end()) MS_THROW("{}: missing data_offsets", where);
  if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    MS_THROW("{}: data_offsets must be [begin, end] with non-negative integers, got {}", where, off->dump());
  info.begin = (*off)[0].get<uint64_t>();
  info.end = (*off)[1].get<uint64_t>();
  if (info.end < info.begin)
    MS_THROW("{}: data_offsets [{}, {}] end before begin", where, info.begin, info.end);
  if (info.end > data_size)
    MS_THROW("{}: data_offsets [{}, {}] out of range: the data section holds {} bytes (truncated file?)",
             where, info.begin, info.end, data_size);
  if (info.end - info.begin != nbytes)
    MS_THROW("{}: shape {} of {} needs {} bytes but data_offsets [{}, {}] span {}", where, sh->dump(), dts,
             nbytes, info.begin, info.end, info.end - info.begin);
  return info;
}

}  // namespace

std::vector<TensorInfo> parse_safetensors_header(const char* text, size_t len, uint64_t data_size,
                                                 const std::string& file,
                                                 std::map<std::string, std::string>* metadata) {
  if (len > kMaxSafetensorsHeader)
    MS_THROW("{}: header of {} bytes is larger than the limit of {}", file, len, kMaxSafetensorsHeader);
  json root;
  KeyChecker keys{file, {}, {}};
  try {
    root = json::parse(text, text + len, std::ref(keys));
  } catch (const json::exception& e) {
    MS_THROW("{}: header is not valid JSON{}: {}", file,
             keys.tensor.empty() ? "" : fmt::format(" (near tensor {})", shown(keys.tensor)), e.what());
  }
  if (!root.is_object()) MS_THROW("{}: header must be a JSON object, got {}", file, root.type_name());

  std::vector<TensorInfo> out;
  out.reserve(root.size());
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object())
        MS_THROW("{}: __metadata__ must be an object of strings, got {}", file, entry.type_name());
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string())
          MS_THROW("{}: __metadata__ value of {} must be a string, got {}", file, shown(k), v.type_name());
        if (metadata) (*metadata)[k] = v.get<std::string>();
      }
      continue;
    }
    out.push_back(parse_entry(file, name, entry, data_size));
  }

  std::sort(out.begin(), out.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Sorted by begin, ranges are disjoint exactly when each begins at or after the furthest end so far.
  // A zero-byte tensor inside another's range counts as overlapping, as in the reference reader.
  size_t furthest = 0;
  for (size_t i = 1; i < out.size(); ++i) {
    const TensorInfo& prev = out[furthest];
    if (out[i].begin < prev.end)
      MS_THROW("{}: tensor {} bytes [{}, {}) overlap tensor {} bytes [{}, {})", file, shown(out[i].name),
               out[i].begin, out[i].end, shown(prev.name), prev.begin, prev.end);
    if (out[i].end >= prev.end) furthest = i;
  }
  return out;
}

std::vector<TensorInfo> parse_safetensors_image(const char* bytes, size_t size, const std::string& file,
                                                uint64_t* data_start,
                                                std::map<std::string, std::string>* metadata) {
  if (size < 8)
    MS_THROW("{}: file is truncated: {} bytes, shorter than the 8-byte header length", file, size);
  const uint64_t n = read_u64_le(bytes);
  if (n > size - 8)
    MS_THROW(
        "{}: header length {} runs past the end of the file ({} bytes after the length field); "
        "truncated or not a safetensors file",
        file, n, size - 8);
  if (n > kMaxSafetensorsHeader)
    MS_THROW("{}: header length {} is larger than the limit of {}", file, n, kMaxSafetensorsHeader);
  if (data_start) *data_start = 8 + n;
  return parse_safetensors_header(bytes + 8, static_cast<size_t>(n), size - 8 - n, file, metadata);
}

}  // namespace ms::io
