#include "runtime/engine_stats.h"

namespace ms::runtime {

EngineStats engine_stats_from(const scheduler::SchedulerStats& s, int64_t prompt_tokens_total,
                              int64_t generation_tokens_total, int64_t max_context) {
  EngineStats st;
  st.running = s.running;
  st.waiting = s.waiting;
  st.kv_pages_total = s.pages_total;
  st.kv_pages_used = s.pages_used;
  st.kv_pages_cached = s.pages_cached;
  st.prompt_tokens_total = prompt_tokens_total;
  st.generation_tokens_total = generation_tokens_total;
  st.prefix_cache_queries = s.prefix_query_tokens;
  st.prefix_cache_hits = s.prefix_hit_tokens;
  st.preemptions = s.preemptions;
  st.max_context = max_context;
  return st;
}

}  // namespace ms::runtime
