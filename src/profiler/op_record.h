// Every op of the forward pass reports itself here: its name (`layer.12.attn.mla_decode`), its shapes and
// dtypes, and its cost model (the bytes it must move at least, its FLOPs). A Profiler, when attached, times
// each op; without one the scope costs a pointer test.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ms::profiler {

struct OpCost {
  double bytes_floor = 0;  // bytes the op must read + write at least
  double bytes_moved = 0;  // bytes it actually moves (== floor unless it does needless work)
  double flops = 0;
};

struct OpInfo {
  std::string_view name;  // "layer.12.attn.mla_decode"
  std::string_view kind;  // "attn.mla_decode" (name without the layer prefix), for summing over layers
  std::string shapes;     // "q bf16[4,64,576] kv fp8_e4m3[pages 12 x 64 x 576]"
  OpCost cost;
};

class OpSink {
 public:
  virtual ~OpSink() = default;
  virtual void op_begin(const OpInfo& info) = 0;
  virtual void op_end() = 0;
};

// RAII scope around one op. `sink` may be null (profiling off).
class OpScope {
 public:
  OpScope(OpSink* sink, OpInfo info) : sink_(sink) {
    if (sink_) sink_->op_begin(info);
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
