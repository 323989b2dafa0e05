// The same seed gives byte-identical trace output; the trace is valid Chrome-trace JSON.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <string>

#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A 4-stage pipeline with jittered kernels and items; writes stage 1's trace to `path`.
void traced_run(uint64_t seed, const std::string& path) {
  constexpr int kStages = 4;
  auto world = make_world(kStages, 32, seed, /*jitter=*/0.05);
  std::vector<pfRuntime_t> runtimes;
  std::vector<std::unique_ptr<CountingJob>> jobs;
  std::vector<pfJob_t> handles;
  for (int s = 0; s < kStages; ++s) {
    pfConfig_t c = sim_config(world.get(), s, kStages, 4);
    c.safety_margin_fraction = 0.05;
    pfRuntime_t rt = nullptr;
    PF_ASSERT_OK(pfRuntimeCreate(&c, &rt));
    runtimes.push_back(rt);
    auto job = std::make_unique<CountingJob>();
    job->items = 1u << 20;
    pfJobDesc_t d = job->desc();
    pfJob_t h = nullptr;
    PF_ASSERT_OK(pfJobCreate(rt, &d, &h));
    handles.push_back(h);
    jobs.push_back(std::move(job));
  }
  sim::PipelineOptions options;
  options.spec = one_f_one_b(kStages, 8);
  options.comm_sms = 4;
  options.runtimes = runtimes;
  std::unique_ptr<sim::Pipeline> pipeline;
  PF_ASSERT_OK(sim::Pipeline::create(world.get(), options, &pipeline));
  PF_ASSERT_OK(pipeline->run(5, nullptr));
  for (pfRuntime_t rt : runtimes) PF_ASSERT_OK(pfRuntimeSynchronize(rt));
  PF_ASSERT_OK(pfTraceWrite(runtimes[1], path.c_str()));
  for (pfJob_t h : handles) PF_ASSERT_OK(pfJobDestroy(h));
  pipeline.reset();
  for (pfRuntime_t rt : runtimes) PF_ASSERT_OK(pfRuntimeDestroy(rt));
}

TEST(Trace, SameSeedGivesByteIdenticalTraces) {
  const std::string dir = ::testing::TempDir();
  const std::string a = dir + "pipefill_trace_a.json";
  const std::string b = dir + "pipefill_trace_b.json";
  const std::string c = dir + "pipefill_trace_c.json";
  ASSERT_NO_FATAL_FAILURE(traced_run(7, a));
  ASSERT_NO_FATAL_FAILURE(traced_run(7, b));
  ASSERT_NO_FATAL_FAILURE(traced_run(8, c));
  const std::string ta = read_file(a), tb = read_file(b), tc = read_file(c);
  ASSERT_FALSE(ta.empty());
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc) << "a different jitter seed must change the timings";

  const nlohmann::json trace = nlohmann::json::parse(ta);
  ASSERT_TRUE(trace.contains("traceEvents"));
  size_t bubbles = 0, slices = 0, counters = 0;
  size_t predicted_bubbles = 0, slices_per_bubbles = 0;
  std::multiset<double> predicted_begins, counter_times;
  std::map<uint64_t, size_t> slices_of_bubble;
  for (const auto& e : trace["traceEvents"]) {
    const std::string ph = e["ph"];
    if (ph == "X" && e["cat"] == "bubble") {
      ++bubbles;
      EXPECT_EQ(e["tid"], 1);
      EXPECT_GE(e["dur"].get<double>(), 0.0);
      slices_per_bubbles += e["args"]["slices"].get<size_t>();
      if (e["args"]["predicted_us"].get<double>() > 0) {
        ++predicted_bubbles;
        predicted_begins.insert(e["ts"].get<double>());
      }
    } else if (ph == "X" && e["cat"] == "fill") {
      ++slices;
      EXPECT_EQ(e["name"], "infer");
      EXPECT_EQ(e["tid"], 2);
      EXPECT_TRUE(e["args"].contains("items"));
      ++slices_of_bubble[e["args"]["bubble"].get<uint64_t>()];
    } else if (ph == "C") {
      ++counters;
      counter_times.insert(e["ts"].get<double>());
    }
    EXPECT_EQ(e["pid"], 1);  // stage 1
  }
  EXPECT_EQ(bubbles, 5u * 5u);  // stage 1 of 4-stage 1F1B: 5 bubbles per iteration
  EXPECT_GT(slices, 0u);
  // One prediction counter per bubble that had a prediction, at that bubble's begin.
  EXPECT_GT(counters, 0u);
  EXPECT_EQ(counters, predicted_bubbles);
  EXPECT_EQ(counter_times, predicted_begins);
  // Every fill slice belongs to a traced bubble, and the bubbles' slice counts add up.
  EXPECT_EQ(slices, slices_per_bubbles);
  EXPECT_LE(slices_of_bubble.size(), predicted_bubbles);
  std::remove(a.c_str());
  std::remove(b.c_str());
  std::remove(c.c_str());
}

}  // namespace
}  // namespace pipefill::testing
