// EngineStats from the scheduler's counters plus the token totals its owner keeps: one mapping shared by the
// Engine and by model-free backends that run the same scheduler.
#pragma once

#include <cstdint>

#include "runtime/engine_types.h"
#include "scheduler/scheduler.h"

namespace ms::runtime {

EngineStats engine_stats_from(const scheduler::SchedulerStats& s, int64_t prompt_tokens_total,
                              int64_t generation_tokens_total, int64_t max_context);

}  // namespace ms::runtime
