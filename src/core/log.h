// Logging through spdlog; one logger for the whole process, level from MOESERVE_LOG (trace..off).
#pragma once

#include <spdlog/spdlog.h>

namespace ms {
void log_init();  // idempotent; reads MOESERVE_LOG
}  // namespace ms

#define MS_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define MS_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define MS_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define MS_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
