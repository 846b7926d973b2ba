#include "dist/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace ms::dist {

uint64_t WeightBytes::total() const {
  return embedding + lm_head + attention_heads + attention_shared + norms + router + dense_mlp +
         shared_expert + routed_experts;
}

namespace {

std::string gb(uint64_t b) {
  return fmt::format("{:.1f} GB", static_cast<double>(b) / 1e9);
}

void check_options(const WeightBytes& w, const MemoryOptions& o) {
  MS_CHECK(o.tp_size >= 1 && o.ep_size >= 1, "--tp-size {} and --ep-size {} must be at least 1", o.tp_size,
           o.ep_size);
  const int world = std::max(o.tp_size, o.ep_size);
  MS_CHECK(world % o.tp_size == 0 && world % o.ep_size == 0,
           "--tp-size {} and --ep-size {}: the smaller must divide the larger", o.tp_size, o.ep_size);
  if (!o.dp_attention)
    MS_CHECK(w.num_attention_heads % o.tp_size == 0, "--tp-size {} does not divide the {} attention heads",
             o.tp_size, w.num_attention_heads);
  if (w.n_routed_experts > 0) {
    MS_CHECK(w.n_routed_experts % o.ep_size == 0, "--ep-size {} does not divide the {} routed experts",
             o.ep_size, w.n_routed_experts);
    MS_CHECK(o.num_redundant_experts >= 0 && o.num_redundant_experts % o.ep_size == 0,
             "--ep-num-redundant-experts {} is not a multiple of --ep-size {}", o.num_redundant_experts,
             o.ep_size);
  }
  MS_CHECK(o.gpu_memory_bytes > 0, "GPU memory must be positive");
  MS_CHECK(o.mem_fraction_static > 0 && o.mem_fraction_static <= 1, "--mem-fraction-static {} not in (0, 1]",
           o.mem_fraction_static);
  MS_CHECK(o.page_size >= 1, "page size {} must be positive", o.page_size);
  MS_CHECK(w.kv_bytes_per_token > 0, "kv bytes per token must be positive");
}

MemoryPlan plan_unchecked(const WeightBytes& w, const MemoryOptions& o) {
  MemoryPlan p;
  p.world_size = std::max(o.tp_size, o.ep_size);
  const uint64_t tp = o.dp_attention ? 1 : static_cast<uint64_t>(o.tp_size);
  uint64_t routed = 0;
  if (w.n_routed_experts > 0) {
    // Every expert of a layer has the same size; a rank holds n/ep + K/ep of them per layer.
    const uint64_t slots =
        static_cast<uint64_t>(w.n_routed_experts / o.ep_size + o.num_redundant_experts / o.ep_size);
    routed = w.routed_experts / static_cast<uint64_t>(w.n_routed_experts) * slots;
  }
  p.weights = {
      {"embedding", w.embedding},
      {"lm_head", w.lm_head},
      {"attention", (w.attention_heads + tp - 1) / tp + w.attention_shared},
      {"norms+router", w.norms + w.router},
      {"dense_mlp", (w.dense_mlp + tp - 1) / tp},
      {"shared_expert", w.shared_expert},
      {"routed_experts", routed},
  };
  for (const auto& r : p.weights) p.weight_bytes += r.bytes;
  // Workspace estimate: ~16 bf16 activation rows of hidden width per prefill token (residual, norms, MLA
  // latents, attention output, MoE gather / combine buffers), f32 logits of a decode batch, graph-safe EP
  // send/receive blocks (ep ranks x max_decode_batch rows, both ways), and 1 GB for the CUDA context, NCCL
  // buffers and captured graphs.
  const uint64_t H = static_cast<uint64_t>(w.hidden_size);
  p.workspace_bytes = static_cast<uint64_t>(o.max_num_tokens) * H * 2 * 16 +
                      static_cast<uint64_t>(o.max_decode_batch) * static_cast<uint64_t>(w.vocab_size) * 4 +
                      (o.ep_size > 1 ? 2ull * o.ep_size * o.max_decode_batch * H * 2 : 0) + 1'000'000'000ull;
  p.budget_bytes = static_cast<uint64_t>(static_cast<double>(o.gpu_memory_bytes) * o.mem_fraction_static);
  const uint64_t fixed = p.weight_bytes + p.workspace_bytes;
  p.kv_bytes = p.budget_bytes > fixed ? p.budget_bytes - fixed : 0;
  const uint64_t page = w.kv_bytes_per_token * static_cast<uint64_t>(o.page_size);
  p.kv_pages = static_cast<int64_t>(p.kv_bytes / page);
  p.kv_tokens = p.kv_pages * o.page_size;
  p.fits = p.kv_tokens >= o.min_kv_tokens;
  return p;
}

}  // namespace

MemoryPlan plan_memory(const WeightBytes& w, const MemoryOptions& o) {
  check_options(w, o);
  MemoryPlan p = plan_unchecked(w, o);
  if (p.fits) return p;
  std::string what = fmt::format(
      "{} on {} x {}: weights need {} per rank ({} in all) and the workspace {}, but --mem-fraction-static "
      "{} "
      "of the GPU is {}, leaving room for {} KV tokens (at least {} needed)",
      w.label.empty() ? "the model" : w.label, p.world_size, gb(o.gpu_memory_bytes), gb(p.weight_bytes),
      gb(w.total()), gb(p.workspace_bytes), o.mem_fraction_static, gb(p.budget_bytes), p.kv_tokens,
      o.min_kv_tokens);
  // The smallest power-of-two GPU count, TP and EP alike, that fits.
  int need = 0;
  for (int n = 2; n <= 256; n *= 2) {
    if (n <= p.world_size) continue;
    MemoryOptions t = o;
    t.tp_size = t.ep_size = n;
    t.num_redundant_experts = o.num_redundant_experts / o.ep_size * n;
    if (!o.dp_attention && w.num_attention_heads % n != 0) t.tp_size = o.tp_size;
    if (w.n_routed_experts > 0 && w.n_routed_experts % n != 0) break;
    if (std::max(t.tp_size, t.ep_size) % std::min(t.tp_size, t.ep_size) != 0) continue;
    if (plan_unchecked(w, t).fits) {
      need = n;
      break;
    }
  }
  if (need > 0)
    p.message = fmt::format("{}; use --tp-size/--ep-size {} or more ({} GPUs)", what, need, need);
  else
    p.message = fmt::format("{}; no power-of-two GPU count up to 256 of this size fits it", what);
  return p;
}

void require_fits(const MemoryPlan& plan) {
  if (!plan.fits) MS_THROW("{}", plan.message);
}

std::string format_memory_plan(const MemoryPlan& p, const MemoryOptions& o) {
  std::string s = fmt::format("memory plan per rank (tp {}, ep {}{}, {} x {}):\n", o.tp_size, o.ep_size,
                              o.dp_attention ? ", dp attention" : "", p.world_size, gb(o.gpu_memory_bytes));
  for (const auto& r : p.weights) s += fmt::format("  {:<16} {}\n", r.role, gb(r.bytes));
  s += fmt::format("  {:<16} {}\n", "weights", gb(p.weight_bytes));
  s += fmt::format("  {:<16} {}\n", "workspace", gb(p.workspace_bytes));
  s += fmt::format("  {:<16} {} ({} pages of {} tokens, {} tokens)\n", "kv cache", gb(p.kv_bytes), p.kv_pages,
                   o.page_size, p.kv_tokens);
  s += fmt::format("  {:<16} {} of {} (--mem-fraction-static {})\n", "budget", gb(p.budget_bytes),
                   gb(o.gpu_memory_bytes), o.mem_fraction_static);
  if (!p.fits) s += "  refused: " + p.message + "\n";
  return s;
}

}  // namespace ms::dist
