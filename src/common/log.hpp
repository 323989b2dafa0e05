// Logging through spdlog, level from PIPEFILL_DEBUG (off|error|warn|info|debug|trace) or the
// runtime config. One named logger "pipefill" writing to stderr, prefixed like NCCL's
// "host:pid:tid [stage] PIPEFILL LEVEL message".
#pragma once

#include <spdlog/spdlog.h>

#include "pipefill/pipefill.h"

namespace pipefill::log {

spdlog::logger& logger();
// Applies a pfLogLevel_t (the config's) to the logger.
void set_level(int pf_log_level);
// Parses "off|error|warn|info|debug|trace" or a digit; returns -1 when not recognised.
int parse_level(const char* text);

template <typename... Args>
void error(spdlog::format_string_t<Args...> f, Args&&... a) { logger().error(f, std::forward<Args>(a)...); }
template <typename... Args>
void warn(spdlog::format_string_t<Args...> f, Args&&... a) { logger().warn(f, std::forward<Args>(a)...); }
template <typename... Args>
void info(spdlog::format_string_t<Args...> f, Args&&... a) { logger().info(f, std::forward<Args>(a)...); }
template <typename... Args>
void debug(spdlog::format_string_t<Args...> f, Args&&... a) { logger().debug(f, std::forward<Args>(a)...); }
template <typename... Args>
void trace(spdlog::format_string_t<Args...> f, Args&&... a) { logger().trace(f, std::forward<Args>(a)...); }

}  // namespace pipefill::log
