#include "common/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace pipefill::log {
namespace {

spdlog::level::level_enum to_spdlog(int level) {
  switch (level) {
    case pfLogOff: return spdlog::level::off;
    case pfLogError: return spdlog::level::err;
    case pfLogWarn: return spdlog::level::warn;
    case pfLogInfo: return spdlog::level::info;
    case pfLogDebug: return spdlog::level::debug;
    case pfLogTrace: return spdlog::level::trace;
    default: return spdlog::level::warn;
  }
}

}  // namespace

int parse_level(const char* text) {
  if (text == nullptr || *text == '\0') return -1;
  if (std::isdigit(static_cast<unsigned char>(text[0])) && text[1] == '\0') {
    const int v = text[0] - '0';
    return v <= pfLogTrace ? v : -1;
  }
  static const char* const kNames[] = {"off", "error", "warn", "info", "debug", "trace"};
  for (int i = 0; i <= pfLogTrace; ++i) {
    if (strcasecmp(text, kNames[i]) == 0) return i;
  }
  return -1;
}

spdlog::logger& logger() {
  // Built once; never registered globally so it cannot clash with the host application's
  // own spdlog registry.
  static spdlog::logger* instance = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    auto* l = new spdlog::logger("pipefill", sink);
    l->set_pattern("%P:%t [%Y-%m-%d %H:%M:%S.%e] PIPEFILL %l %v");
    const int env = parse_level(std::getenv("PIPEFILL_DEBUG"));
    l->set_level(to_spdlog(env >= 0 ? env : pfLogWarn));
    return l;
  }();
  return *instance;
}

void set_level(int pf_log_level) { logger().set_level(to_spdlog(pf_log_level)); }

}  // namespace pipefill::log
