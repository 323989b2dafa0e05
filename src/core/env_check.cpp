// Unknown PIPEFILL_* environment variables (env_check.hpp): the known names and the warning.
#include "core/env_check.hpp"

#include <algorithm>
#include <mutex>

#include "common/log.hpp"

extern char** environ;  // POSIX: the process environment

namespace pipefill::core {

const std::vector<std::string_view>& known_environment_variables() {
  // The library (config.cpp, log.cpp, host/, cuda/), then the variables of the example engine,
  // the tools, the build and test scripts: set by users running those, not typos.
  static const std::vector<std::string_view> names = {
      "PIPEFILL_ARENA_BYTES", "PIPEFILL_BACKEND", "PIPEFILL_BUBBLE_EVENT_PAIRS", "PIPEFILL_CUPTI", "PIPEFILL_DEBUG",
      "PIPEFILL_DEVICE", "PIPEFILL_FILL_OPTIMIZER_BUBBLES", "PIPEFILL_FILL_STREAMS",
      "PIPEFILL_FILL_WINDOW", "PIPEFILL_GATED_QUANTILE", "PIPEFILL_GREEN_CONTEXT", "PIPEFILL_HOST_FILL_NICE", "PIPEFILL_HOST_MEMORY_BYTES",
      "PIPEFILL_HOST_SMS", "PIPEFILL_HOST_TIME_BUDGET", "PIPEFILL_LAUNCH", "PIPEFILL_MIN_SAMPLES",
      "PIPEFILL_NOTICED_QUANTILE", "PIPEFILL_POLICY",
      "PIPEFILL_QUANTILE", "PIPEFILL_RESERVED_SMS", "PIPEFILL_SAFETY_MARGIN_FRACTION",
      "PIPEFILL_SAFETY_MARGIN_US", "PIPEFILL_SIM_MEMORY_BYTES", "PIPEFILL_SIM_SEED",
      "PIPEFILL_SIM_SMS", "PIPEFILL_STAGE_COUNT", "PIPEFILL_STAGE_ID",
      "PIPEFILL_TOO_SHORT_WARN_BUBBLES",
      // not the library's: example engine, benchmarks, fuzzers, scripts, Python tests
      "PIPEFILL_EMULATE_STAGE", "PIPEFILL_BENCH_COMPARE_ITERATIONS", "PIPEFILL_BENCHMARK_TARBALL",
      "PIPEFILL_BUILD_DIR", "PIPEFILL_DEPS_CACHE", "PIPEFILL_DEPS_DIR", "PIPEFILL_FUZZ_CORPUS_DIR",
      "PIPEFILL_FUZZ_RUNS", "PIPEFILL_LEAK_WARNINGS", "PIPEFILL_LIST_MISSING",
      "PIPEFILL_MUTATION_DUMP_DIR",
      "PIPEFILL_NCCL_LIBRARY", "PIPEFILL_PY_BUILD_DIR", "PIPEFILL_PY_CMAKE_ARGS",
      "PIPEFILL_REQUIRE_BUILD", "PIPEFILL_REQUIRE_CUDA_BUILD", "PIPEFILL_REQUIRE_SERVICE",
      "PIPEFILL_SERVICE", "PIPEFILL_SERVICE_FAULT_SHARDS", "PIPEFILL_SERVICE_PASSWORD",
      "PIPEFILL_SERVICE_PASSWORD_FILE", "PIPEFILL_SERVICE_RANK",
      "PIPEFILL_SERVICE_CAPACITY_INTERVAL_S",
      "PIPEFILL_STAGED_DEPS", "PIPEFILL_TEST_OUT"};
  return names;
}

namespace {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string nearest_environment_variable(std::string_view name) {
  std::string_view best;
  size_t best_distance = SIZE_MAX;
  for (const std::string_view known : known_environment_variables()) {
    const size_t d = edit_distance(name, known);
    if (d < best_distance) {
      best_distance = d;
      best = known;
    }
  }
  // Only the part after the prefix can be misspelled: judge the distance against it.
  const size_t suffix = name.size() > 9 ? name.size() - 9 : 1;
  if (best_distance * 3 > suffix + 2) return {};
  return std::string(best);
}

std::vector<std::string> unknown_environment_variables(const char* const* environment) {
  std::vector<std::string> unknown;
  if (environment == nullptr) return unknown;
  const auto& known = known_environment_variables();
  for (const char* const* entry = environment; *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    if (!text.starts_with("PIPEFILL_")) continue;
    const std::string_view name = text.substr(0, text.find('='));
    if (std::find(known.begin(), known.end(), name) == known.end()) unknown.emplace_back(name);
  }
  return unknown;
}

void warn_unknown_environment_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const std::string& name : unknown_environment_variables(environ)) {
      const std::string nearest = nearest_environment_variable(name);
      if (nearest.empty()) {
        log::warn("environment variable {} is not a PipeFill variable and is ignored "
                  "(docs/api.md lists them)", name);
      } else {
        log::warn("environment variable {} is not a PipeFill variable and is ignored: did you "
                  "mean {}?", name, nearest);
      }
    }
  });
}

}  // namespace pipefill::core
