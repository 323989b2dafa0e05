// pipefill-sim's inputs under mutation, in process: every field of every shipped config
// (configs/*.json) and of the fill-job types file (data/fill_jobs.json) is set to extreme
// values (0, -1, 0.5, 2^16, 2^30, 2^31-1, 2^31, 2^53, 1e308, "NaN", true, [], {}) or removed,
// and each mutated input goes through the CLI's own path (parse_sim_config, load_config_files,
// plan_runs, run_cluster_sim) under small work bounds. Every input must either run within the
// bounds or fail with a message naming the mutated field; no exception may escape.
//
// Test budget: each shipped config is reduced before mutating (3 iterations, the first filled;
// the first GPU count of its sweep; the first schedule of its sweep, except when a
// sweep_schedules entry is the mutated field; no jitter) so that accepted mutations cost milliseconds;
// the work bounds below are what keep the explosive ones cheap (refused before any work).
//
// With PIPEFILL_MUTATION_DUMP_DIR set, the mutated inputs are also written there as config
// files (with absolute jobs_file paths), for running the real binary over them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <variant>

#include <nlohmann/json.hpp>

#include "cluster/cluster_sim.hpp"
#include "cluster/config_io.hpp"
#include "cluster/run_plan.hpp"
#include "common/error.hpp"

namespace pipefill::cluster {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const std::string kSource = PIPEFILL_SOURCE_DIR;

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in, nullptr, true, /*ignore_comments=*/true);
}

// A JSON location: a key or an index per level, and its dotted name as messages spell it
// ("workload.mix.a", "sweep_gpus[2]", "job_types[0].configs[1].item_us").
struct Path {
  std::vector<std::variant<std::string, size_t>> steps;
  std::string name;
};

void collect(const json& node, Path at, std::vector<Path>* out) {
  if (!at.steps.empty()) out->push_back(at);
  if (node.is_object()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      Path child = at;
      child.steps.emplace_back(it.key());
      child.name = at.name.empty() ? it.key() : at.name + "." + it.key();
      collect(*it, child, out);
    }
  } else if (node.is_array()) {
    for (size_t i = 0; i < node.size(); ++i) {
      Path child = at;
      child.steps.emplace_back(i);
      child.name = at.name + "[" + std::to_string(i) + "]";
      collect(node[i], child, out);
    }
  }
}

// Sets (value != nullptr) or removes (value == nullptr) the location.
json mutate(json doc, const Path& path, const json* value) {
  json* node = &doc;
  for (size_t i = 0; i + 1 < path.steps.size(); ++i) {
    if (const auto* key = std::get_if<std::string>(&path.steps[i])) node = &(*node)[*key];
    else node = &(*node)[std::get<size_t>(path.steps[i])];
  }
  const auto& last = path.steps.back();
  if (const auto* key = std::get_if<std::string>(&last)) {
    if (value) (*node)[*key] = *value;
    else node->erase(*key);
  } else {
    const size_t i = std::get<size_t>(last);
    if (value) (*node)[i] = *value;
    else node->erase(i);
  }
  return doc;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// Every field gets every value in normal builds; sanitizer builds (10x slower) give every field
// a subset that still holds a zero, a negative, the int limit, the double limit, a string and
// a wrong container (the full set runs in the release stage of scripts/test.sh).
const std::vector<json>& extreme_values() {
  static const std::vector<json> all = {
      json(0),           json(-1),           json(0.5),  json(65536),   json(1073741824),  json(2147483647),
      json(2147483648LL), json(9007199254740992LL), json(1e308), json("NaN"), json(true), json::array(),
      json::object()};
  static const std::vector<json> subset = {json(0), json(-1), json(2147483647), json(1e308), json("NaN"),
                                           json::object()};
  return kSanitized ? subset : all;
}

SimBounds test_bounds() {
  SimBounds b;
  b.max_schedule_ops = 1'000'000;
  b.max_fill_events = 1'000'000;
  b.max_jobs = 100'000;
  b.max_memory_bytes = uint64_t{256} << 20;
  return b;
}

struct Tally {
  int inputs = 0, succeeded = 0, refused = 0;
  std::vector<std::string> unnamed;   // failed without naming the field
  std::vector<std::string> escaped;   // an exception escaped
};

// Runs one input through the CLI's path. Returns "" on success, else the first error.
std::string run_input(const json& config_doc, const std::string& config_dir, const json* jobs_doc) {
  SimConfig cfg;
  if (parse_sim_config(config_doc, config_dir, &cfg) != pfSuccess) return last_error_message();
  if (jobs_doc != nullptr) {
    if (parse_fill_job_types(*jobs_doc, &cfg.sim.job_types) != pfSuccess) return last_error_message();
    cfg.jobs_file.clear();
  }
  if (load_config_files(&cfg) != pfSuccess) return last_error_message();
  RunOverrides overrides;
  overrides.bounds = test_bounds();
  std::vector<PlannedRun> runs;
  if (plan_runs(cfg, overrides, &runs) != pfSuccess) return last_error_message();
  for (PlannedRun& run : runs) {
    if (!run.error.empty()) return run.error;
    ClusterResult result;
    if (run_cluster_sim(run.spec, &result) != pfSuccess) return last_error_message();
  }
  return "";
}

void check(Tally* tally, const std::string& what, const std::string& field, const std::function<std::string()>& run) {
  ++tally->inputs;
  std::string error;
  try {
    error = run();
  } catch (const std::exception& e) {
    tally->escaped.push_back(what + ": " + e.what());
    return;
  }
  if (error.empty()) {
    ++tally->succeeded;
  } else if (error.find(field) != std::string::npos) {
    ++tally->refused;
  } else {
    tally->unnamed.push_back(what + ": " + error);
  }
}

// The shipped config, made cheap to run: 3 iterations (the runtime's 2 warm-up iterations, then
// one filled), the first GPU count of its sweep, no bubble jitter (the predictor then needs 2
// samples per bubble class instead of 64; jitter itself is one of the mutated fields).
json reduced(json doc) {
  doc["iterations"] = 3;
  if (doc.contains("fill") && doc["fill"].is_object() && doc["fill"].contains("jitter")) doc["fill"]["jitter"] = 0.0;
  if (doc.contains("sweep_gpus") && doc["sweep_gpus"].is_array() && doc["sweep_gpus"].size() > 1)
    doc["sweep_gpus"] = json::array({doc["sweep_gpus"][0]});
  return doc;
}

// The same with only the first schedule of its sweep (mutations of other fields run one schedule).
json one_schedule(json doc) {
  if (doc.contains("sweep_schedules") && doc["sweep_schedules"].is_array() && doc["sweep_schedules"].size() > 1)
    doc["sweep_schedules"] = json::array({doc["sweep_schedules"][0]});
  return doc;
}

void dump(const std::string& dir, const std::string& name, json config, const json* jobs) {
  if (dir.empty()) return;
  fs::create_directories(dir);
  if (jobs != nullptr) {
    std::ofstream(dir + "/" + name + ".jobs.json") << jobs->dump();
    if (config.contains("fill") && config["fill"].is_object()) config["fill"]["jobs_file"] = fs::absolute(dir + "/" + name + ".jobs.json").string();
  } else if (config.contains("fill") && config["fill"].is_object() && config["fill"].contains("jobs_file") &&
             config["fill"]["jobs_file"] == "../data/fill_jobs.json") {
    config["fill"]["jobs_file"] = kSource + "/data/fill_jobs.json";
  }
  std::ofstream(dir + "/" + name + ".json") << config.dump();
}

std::string safe(std::string s) {
  for (char& c : s)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

TEST(ConfigMutation, EveryFieldOfTheShippedInputsRunsOrIsRefusedNamingIt) {
  const char* dump_env = std::getenv("PIPEFILL_MUTATION_DUMP_DIR");
  const std::string dump_dir = dump_env ? dump_env : "";
  Tally tally;
  std::vector<std::string> configs;
  for (const auto& entry : fs::directory_iterator(kSource + "/configs"))
    if (entry.path().extension() == ".json") configs.push_back(entry.path().string());
  std::sort(configs.begin(), configs.end());
  ASSERT_GE(configs.size(), 2u);
  const std::string config_dir = kSource + "/configs";

  for (const std::string& file : configs) {
    const json full = reduced(read_json(file));
    const json single = one_schedule(full);
    const std::string stem = fs::path(file).stem().string();
    // The reduced shipped config itself runs.
    const std::string base_error = run_input(full, config_dir, nullptr);
    ASSERT_EQ(base_error, "") << file;
    std::vector<Path> paths;
    collect(full, Path{}, &paths);
    for (const Path& path : paths) {
      const json& base = path.name.rfind("sweep_schedules", 0) == 0 ? full : single;
      int k = 0;
      for (const json& value : extreme_values()) {
        const json doc = mutate(base, path, &value);
        const std::string what = fmt::format("{} {} = {}", stem, path.name, value.dump());
        dump(dump_dir, fmt::format("{}__{}__{}", stem, safe(path.name), k++), doc, nullptr);
        check(&tally, what, path.name, [&] { return run_input(doc, config_dir, nullptr); });
      }
      const json doc = mutate(base, path, nullptr);
      dump(dump_dir, fmt::format("{}__{}__missing", stem, safe(path.name)), doc, nullptr);
      check(&tally, fmt::format("{} {} missing", stem, path.name), path.name,
            [&] { return run_input(doc, config_dir, nullptr); });
    }
  }

  // The fill-job types, under the small config.
  const json small = reduced(read_json(config_dir + "/small_1f1b.json"));
  const json jobs = read_json(kSource + "/data/fill_jobs.json");
  ASSERT_EQ(run_input(small, config_dir, &jobs), "");
  std::vector<Path> paths;
  collect(jobs, Path{}, &paths);
  for (const Path& path : paths) {
    int k = 0;
    for (const json& value : extreme_values()) {
      const json doc = mutate(jobs, path, &value);
      dump(dump_dir, fmt::format("jobs__{}__{}", safe(path.name), k++), small, &doc);
      check(&tally, fmt::format("fill_jobs {} = {}", path.name, value.dump()), path.name,
            [&] { return run_input(small, config_dir, &doc); });
    }
    const json doc = mutate(jobs, path, nullptr);
    dump(dump_dir, fmt::format("jobs__{}__missing", safe(path.name)), small, &doc);
    check(&tally, fmt::format("fill_jobs {} missing", path.name), path.name, [&] { return run_input(small, config_dir, &doc); });
  }

  std::printf("config mutation: %d inputs, %d ran within the bounds, %d refused naming the field, %zu refused "
              "without naming it, %zu exceptions\n",
              tally.inputs, tally.succeeded, tally.refused, tally.unnamed.size(), tally.escaped.size());
  for (const auto& u : tally.unnamed) ADD_FAILURE() << "error does not name the field: " << u;
  for (const auto& e : tally.escaped) ADD_FAILURE() << "exception escaped: " << e;
  EXPECT_GT(tally.inputs, kSanitized ? 1000 : 3000);
  EXPECT_GT(tally.refused, tally.inputs / 3);  // most extreme values are refusals
  EXPECT_GT(tally.succeeded, kSanitized ? 50 : 300);  // and the harmless ones still run
}

}  // namespace
}  // namespace pipefill::cluster
