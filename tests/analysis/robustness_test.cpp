// Whatever a trace holds, the importer and the analyser return a result code: every field of
// one event of each shape in a real-looking trace is replaced by values of every JSON type.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <set>
#include <nlohmann/json.hpp>
#include <string>

#include "analysis/bubbles.hpp"
#include "analysis/chrome_trace.hpp"
#include "common/error.hpp"

namespace pipefill::analysis {
namespace {

using json = nlohmann::json;

TEST(Robustness, EveryFieldReplacedByEveryJsonTypeGivesAResultCode) {
  std::ifstream in(std::string(PIPEFILL_TEST_DATA_DIR) + "/torch_stage_filled.json");
  ASSERT_TRUE(in.good());
  const json original = json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  const json replacements[] = {nullptr, "x", json::array(), json::object(), -1, 1e300, 0.5};

  size_t imported = 0, rejected = 0;
  auto check = [&](const json& trace) {
    ImportedTrace t;
    const pfResult_t r = import_chrome_trace(trace.dump(), "mutated.json", ImportOptions{}, &t);
    if (r != pfSuccess) {
      ASSERT_EQ(r, pfErrorInvalidArgument);
      ASSERT_EQ(last_error_message().rfind("mutated.json: ", 0), 0u) << last_error_message();
      ++rejected;
      return;
    }
    ++imported;
    for (const int device : analysable_devices(t.records)) {
      DeviceAnalysis a;
      const pfResult_t ar = analyze_device(t.records, device, AnalysisOptions{}, &a);
      ASSERT_TRUE(ar == pfSuccess || ar == pfErrorInvalidArgument) << ar;
      if (ar == pfSuccess) {
        double sum = 0;
        for (const Bubble& b : a.bubbles) sum += b.duration_us();
        EXPECT_DOUBLE_EQ(sum, a.bubble_us);
      }
    }
  };

  // One event of each shape (phase, category, memory or not) keeps this fast under sanitizers.
  const json& events = original["traceEvents"];
  std::set<std::string> shapes_seen;
  for (size_t i = 0; i < events.size(); ++i) {
    const std::string shape = events[i].value("ph", "") + "/" + events[i].value("cat", "") + "/" +
                              (events[i].value("name", "") == "[memory]" ? "memory" : "");
    if (!shapes_seen.insert(shape).second) continue;
    for (const auto& [key, value] : events[i].items()) {
      for (const json& replacement : replacements) {
        json trace = original;
        trace["traceEvents"][i][key] = replacement;
        ASSERT_NO_FATAL_FAILURE(check(trace)) << "event " << i << " key " << key;
      }
    }
    if (events[i].contains("args") && events[i]["args"].is_object()) {
      for (const auto& [key, value] : events[i]["args"].items()) {
        json trace = original;
        trace["traceEvents"][i]["args"][key] = "not a number";
        ASSERT_NO_FATAL_FAILURE(check(trace)) << "event " << i << " args." << key;
      }
    }
  }
  // Both outcomes happen: loose fields are tolerated, broken required ones are rejected.
  EXPECT_GT(imported, 0u);
  EXPECT_GT(rejected, 0u);
}

}  // namespace
}  // namespace pipefill::analysis
