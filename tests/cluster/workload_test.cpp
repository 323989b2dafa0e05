// Fill-job types parsing and the seeded workload generator.
#include "cluster/workload.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/error.hpp"

namespace pipefill::cluster {
namespace {

using nlohmann::json;

json two_types() {
  return json::parse(R"({"job_types": [
    {"name": "a", "kind": "inference", "size_median": 100, "size_sigma": 0.5, "priority": 2,
     "configs": [{"item_us": 500, "work_per_item": 4, "resident_mib": 10, "workspace_mib": 1}]},
    {"name": "b", "kind": "training", "size_median": 50, "size_sigma": 0,
     "configs": [{"item_us": 1000, "work_per_item": 2, "resident_mib": 20, "workspace_mib": 2},
                 {"item_us": 3000, "work_per_item": 8, "resident_mib": 20, "workspace_mib": 8}]}]})");
}

TEST(Workload, ParsesTypesAndConfigs) {
  std::vector<FillJobType> types;
  ASSERT_EQ(parse_fill_job_types(two_types(), &types), pfSuccess) << last_error_message();
  ASSERT_EQ(types.size(), 2u);
  EXPECT_EQ(types[0].name, "a");
  EXPECT_EQ(types[0].priority, 2);
  ASSERT_EQ(types[1].configs.size(), 2u);
  EXPECT_EQ(types[1].configs[1].resident_bytes, size_t{20} << 20);
  EXPECT_EQ(types[1].configs[1].workspace_bytes, size_t{8} << 20);
  const auto models = planner_configs(types[1], 0.5);
  ASSERT_EQ(models.size(), 2u);
  EXPECT_DOUBLE_EQ(models[0].item_cost_us, 2000.0);  // slowed by the fill efficiency
  EXPECT_DOUBLE_EQ(models[1].work_per_item, 8.0);
  EXPECT_EQ(models[0].parallelism, 1);
}

TEST(Workload, ShippedJobFileLoads) {
  std::vector<FillJobType> types;
  ASSERT_EQ(load_fill_job_types(std::string(PIPEFILL_SOURCE_DIR) + "/data/fill_jobs.json", &types), pfSuccess)
      << last_error_message();
  EXPECT_GE(types.size(), 4u);
  for (const auto& t : types) {
    EXPECT_FALSE(t.provenance.empty()) << t.name;
    for (const auto& c : t.configs) EXPECT_GT(c.item_us, 0.0) << t.name;
  }
}

TEST(Workload, BadTypesNameTheField) {
  json doc = two_types();
  doc["job_types"][1]["configs"][0]["item_us"] = -5;
  std::vector<FillJobType> types;
  EXPECT_EQ(parse_fill_job_types(doc, &types), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("job_types[1].configs[0].item_us must be in [0.001, 1000000000000], got -5"), std::string::npos)
      << last_error_message();
  doc = two_types();
  doc["job_types"][0]["kind"] = "batch";
  EXPECT_EQ(parse_fill_job_types(doc, &types), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("kind must be 'inference' or 'training', got 'batch'"), std::string::npos);
  doc = two_types();
  doc["job_types"][1]["name"] = "a";
  EXPECT_EQ(parse_fill_job_types(doc, &types), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("duplicate job type name 'a'"), std::string::npos);
  EXPECT_EQ(load_fill_job_types("/nonexistent/jobs.json", &types), pfErrorIo);
  EXPECT_NE(last_error_message().find("/nonexistent/jobs.json"), std::string::npos);
}

TEST(Workload, GeneratorIsDeterministicAndSeedDependent) {
  std::vector<FillJobType> types;
  ASSERT_EQ(parse_fill_job_types(two_types(), &types), pfSuccess);
  WorkloadSpec spec;
  spec.seed = 42;
  spec.initial_jobs_per_gpu = 0.5;
  spec.arrivals_per_gpu_hour = 360;  // 0.1 per GPU-second
  std::vector<FillJob> a, b, c;
  ASSERT_EQ(generate_jobs(spec, types, 8, 100e6, &a), pfSuccess);
  ASSERT_EQ(generate_jobs(spec, types, 8, 100e6, &b), pfSuccess);
  spec.seed = 43;
  ASSERT_EQ(generate_jobs(spec, types, 8, 100e6, &c), pfSuccess);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].type, b[i].type);
    EXPECT_EQ(a[i].arrival_us, b[i].arrival_us);
    EXPECT_EQ(a[i].size, b[i].size);
    EXPECT_EQ(a[i].sequence, i);
  }
  bool differs = a.size() != c.size();
  for (size_t i = 0; !differs && i < a.size(); ++i) differs = a[i].arrival_us != c[i].arrival_us;
  EXPECT_TRUE(differs);
  // 4 initial jobs at time 0, then arrivals in order within the horizon. Expected arrivals:
  // 0.8 per second over 100 s = 80; a Poisson count beyond +-6 sigma (~54) would be a bug.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a[i].arrival_us, 0.0);
  const double arrivals = static_cast<double>(a.size()) - 4;
  EXPECT_GT(arrivals, 80 - 54);
  EXPECT_LT(arrivals, 80 + 54);
  for (size_t i = 5; i < a.size(); ++i) {
    EXPECT_GE(a[i].arrival_us, a[i - 1].arrival_us);
    EXPECT_LT(a[i].arrival_us, 100e6);
  }
  // Type b has sigma 0: every b job has exactly the median size; priorities come from the type.
  for (const auto& j : a) {
    if (j.type == 1) EXPECT_EQ(j.size, 50.0);
    else EXPECT_EQ(j.priority, 2);
    EXPECT_GE(j.size, 2.0);
  }
}

TEST(Workload, MixSelectsTypes) {
  std::vector<FillJobType> types;
  ASSERT_EQ(parse_fill_job_types(two_types(), &types), pfSuccess);
  WorkloadSpec spec;
  spec.initial_jobs_per_gpu = 10;
  spec.arrivals_per_gpu_hour = 0;
  spec.mix = {{"b", 1.0}};
  std::vector<FillJob> jobs;
  ASSERT_EQ(generate_jobs(spec, types, 4, 1e6, &jobs), pfSuccess);
  ASSERT_EQ(jobs.size(), 40u);
  for (const auto& j : jobs) EXPECT_EQ(j.type, 1);
  spec.mix = {{"nope", 1.0}};
  EXPECT_EQ(generate_jobs(spec, types, 4, 1e6, &jobs), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("unknown job type 'nope'"), std::string::npos);
  spec.mix = {{"a", 0.0}};
  EXPECT_EQ(generate_jobs(spec, types, 4, 1e6, &jobs), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("no positive weight"), std::string::npos);
}

TEST(Workload, RngUniformAndExponentialRanges) {
  Rng rng(1);
  double sum = 0;
  for (int i = 0; i < 10000; ++i) {
    const double u = rng.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    const double e = rng.exponential(2.0);
    ASSERT_GE(e, 0.0);
    sum += e;
  }
  // Mean 0.5 with standard error 0.005: 10 sigma bound.
  EXPECT_NEAR(sum / 10000, 0.5, 0.05);
}

}  // namespace
}  // namespace pipefill::cluster
