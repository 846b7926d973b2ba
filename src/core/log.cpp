#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>

namespace ms {

void log_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("moeserve");
    logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    spdlog::set_default_logger(logger);
    const char* lvl = std::getenv("MOESERVE_LOG");
    spdlog::set_level(lvl ? spdlog::level::from_str(lvl) : spdlog::level::info);
  });
}

}  // namespace ms
