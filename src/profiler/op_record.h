// Every op of the forward pass reports itself here: its name (`layer.12.attn.mla_decode`), its shapes and
// dtypes, and its cost model (the bytes it must move at least, its FLOPs). A Profiler, when attached, times
// each op; without one the scope costs a pointer test (use the lazy form so the shapes string is not even
// formatted when profiling is off).
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace ms::profiler {

struct OpCost {
  double bytes_floor = 0;  // bytes the op must read + write at least
  double bytes_moved = 0;  // bytes it actually moves (== floor unless it does needless work); 0 = the floor
  double flops = 0;

  double moved() const { return bytes_moved > 0 ? bytes_moved : bytes_floor; }
};

struct OpInfo {
  std::string_view name;  // "layer.12.attn.mla_decode"; the profiler copies it, it need outlive only the call
  std::string_view kind;  // "attn.mla_decode" (name without the layer prefix); empty = derived from name
  std::string shapes;     // "q bf16[4,64,576] kv fp8_e4m3[pages 12 x 64 x 576]"
  OpCost cost;
};

// The op kind of a name: the name without a leading "layer.<digits>." ("layer.12.attn.mla_decode" ->
// "attn.mla_decode"); other names are their own kind ("lm_head" -> "lm_head").
constexpr std::string_view op_kind_of(std::string_view name) {
  constexpr std::string_view prefix = "layer.";
  if (!name.starts_with(prefix)) return name;
  size_t i = prefix.size();
  size_t digits = 0;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i, ++digits;
  if (digits == 0 || i >= name.size() || name[i] != '.' || i + 1 == name.size()) return name;
  return name.substr(i + 1);
}

// Receives the ops of a forward pass. Ops do not nest: op_begin while an op is open is an error (each
// microsecond is charged to exactly one op). op_end must not throw (it runs in a destructor); a sink that
// sees it unbalanced reports that at the end of the step instead.
class OpSink {
 public:
  virtual ~OpSink() = default;
  virtual void op_begin(const OpInfo& info) = 0;
  virtual void op_end() noexcept = 0;
};

// RAII scope around one op. `sink` may be null (profiling off).
//   OpScope s(sink, [&] { return OpInfo{name, {}, shapes_of(q, kv), cost_of(q, kv)}; });  // lazy
//   OpScope s(sink, OpInfo{...});                                                          // eager
class OpScope {
 public:
  OpScope(OpSink* sink, const OpInfo& info) : sink_(sink) {
    if (sink_) sink_->op_begin(info);
  }
  // The info is built only when a sink listens.
  template <typename MakeInfo>
  requires std::invocable<MakeInfo&> && std::convertible_to < std::invoke_result_t<MakeInfo&>,
  const OpInfo& > OpScope(OpSink* sink, MakeInfo&& make_info) : sink_(sink) {
    if (sink_) sink_->op_begin(make_info());
  }
  ~OpScope() {
    if (sink_) sink_->op_end();
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  OpSink* sink_;
};

}  // namespace ms::profiler
