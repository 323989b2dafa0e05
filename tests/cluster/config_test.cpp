// pipefill-sim configuration parsing: shipped configs load, bad values are named.
#include "cluster/config_io.hpp"
#include "cluster/run_plan.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/error.hpp"

namespace pipefill::cluster {
namespace {

using nlohmann::json;

const std::string kSource = PIPEFILL_SOURCE_DIR;

json minimal() {
  return json::parse(R"({
    "model": {"layers": 8, "hidden": 512, "heads": 8, "sequence": 512, "vocabulary": 1000},
    "parallelism": {"tensor": 2, "pipeline": 4, "gpus": 32, "micro_batch": 1, "global_batch": 32},
    "schedule": "gpipe",
    "fill": {"policy": "srpt", "jitter": 0.05, "jobs_file": "jobs.json"},
    "workload": {"seed": 9, "mix": {"a": 2}},
    "iterations": 12,
    "sweep_gpus": [8, 16],
    "sweep_schedules": ["1f1b", "zbh1"]
  })");
}

std::string parse_error(const json& doc) {
  SimConfig cfg;
  EXPECT_EQ(parse_sim_config(doc, "/base", &cfg), pfErrorInvalidArgument);
  return last_error_message();
}

TEST(Config, ParsesFieldsAndResolvesJobsFile) {
  SimConfig cfg;
  ASSERT_EQ(parse_sim_config(minimal(), "/base/configs", &cfg), pfSuccess) << last_error_message();
  EXPECT_EQ(cfg.sim.training.model.layers, 8);
  EXPECT_EQ(cfg.sim.training.parallel.data, 4);  // 32 / (2 * 4)
  EXPECT_EQ(cfg.sim.training.schedule, schedule::ScheduleKind::GPipe);
  EXPECT_EQ(cfg.sim.fill.policy, pfPolicyShortestRemaining);
  EXPECT_DOUBLE_EQ(cfg.sim.fill.jitter, 0.05);
  EXPECT_EQ(cfg.sim.workload.seed, 9u);
  EXPECT_DOUBLE_EQ(cfg.sim.workload.mix.at("a"), 2.0);
  EXPECT_EQ(cfg.sim.iterations, 12);
  EXPECT_EQ(cfg.jobs_file, "/base/configs/jobs.json");
  EXPECT_EQ(cfg.sweep_gpus, (std::vector<int>{8, 16}));
  ASSERT_EQ(cfg.sweep_schedules.size(), 2u);
  EXPECT_EQ(cfg.sweep_schedules[1], schedule::ScheduleKind::ZBH1);
}

// fill.gated_prediction_quantile (ours behind the gate) is read beside fill.prediction_quantile;
// left out, both stay "the runtime's default" (< 0) until run_cluster_sim resolves them.
TEST(Config, GatedPredictionQuantile) {
  SimConfig cfg;
  ASSERT_EQ(parse_sim_config(minimal(), "/base", &cfg), pfSuccess) << last_error_message();
  EXPECT_LT(cfg.sim.fill.gated_prediction_quantile, 0.0);
  EXPECT_LT(cfg.sim.fill.prediction_quantile, 0.0);
  json d = minimal();
  d["fill"]["gated_prediction_quantile"] = 0.75;
  d["fill"]["prediction_quantile"] = 0.2;
  ASSERT_EQ(parse_sim_config(d, "/base", &cfg), pfSuccess) << last_error_message();
  EXPECT_DOUBLE_EQ(cfg.sim.fill.gated_prediction_quantile, 0.75);
  EXPECT_DOUBLE_EQ(cfg.sim.fill.prediction_quantile, 0.2);
}

TEST(Config, ErrorsNameFieldAndValue) {
  json d = minimal();
  d["model"]["layerz"] = 3;
  EXPECT_NE(parse_error(d).find("unknown field 'model.layerz'"), std::string::npos);
  d = minimal();
  d["extra"] = 1;
  EXPECT_NE(parse_error(d).find("unknown field 'extra'"), std::string::npos);
  d = minimal();
  d["model"]["hidden"] = "big";
  EXPECT_NE(parse_error(d).find("model.hidden must be an integer, got \"big\""), std::string::npos);
  d = minimal();
  d["parallelism"]["pipeline"] = 0;
  EXPECT_NE(parse_error(d).find("parallelism.pipeline must be in [1, "), std::string::npos);
  d = minimal();
  d["parallelism"]["gpus"] = 30;
  EXPECT_NE(parse_error(d).find("parallelism.gpus (30) must be a positive multiple of parallelism.tensor (2) x parallelism.pipeline (4)"), std::string::npos);
  d = minimal();
  d["schedule"] = "2f2b";
  EXPECT_NE(parse_error(d).find("schedule must be gpipe, 1f1b, interleaved, zbh1, zbv, interleaved-zb, looped-bfs or dualpipev, got '2f2b'"), std::string::npos);
  d = minimal();
  d["fill"]["policy"] = "random";
  EXPECT_NE(parse_error(d).find("fill.policy must be fifo, priority, srpt or fair, got 'random'"), std::string::npos);
  d = minimal();
  d["fill"]["efficiency"] = 1.5;
  EXPECT_NE(parse_error(d).find("fill.efficiency must be in (0, 1], got 1.5"), std::string::npos);
  d = minimal();
  d["parallelism"]["recompute"] = "half";
  EXPECT_NE(parse_error(d).find("parallelism.recompute must be none, selective or full, got 'half'"), std::string::npos);
  d = minimal();
  d["sweep_gpus"] = json::array({8, -16});
  EXPECT_NE(parse_error(d).find("sweep_gpus[1] must be a positive integer, got -16"), std::string::npos);
  d = minimal();
  d["workload"]["mix"]["a"] = -1;
  EXPECT_NE(parse_error(d).find("workload.mix.a must be a number in [0, 1000000000000], got -1"), std::string::npos);
  d = minimal();
  d["fill"]["gated_prediction_quantile"] = 0;
  EXPECT_NE(parse_error(d).find("fill.gated_prediction_quantile must be in (0, 1], got 0"), std::string::npos);
  d = minimal();
  d["fill"]["gated_prediction_quantile"] = 1.5;
  EXPECT_NE(parse_error(d).find("fill.gated_prediction_quantile must be in (0, 1], got 1.5"), std::string::npos);
  d = minimal();
  d["fill"]["gated_prediction_quantile"] = "median";
  EXPECT_NE(parse_error(d).find("fill.gated_prediction_quantile must be a number, got \"median\""),
            std::string::npos);
  d = minimal();
  d["gpu"] = 5;
  EXPECT_NE(parse_error(d).find("gpu must be an object, got 5"), std::string::npos);
}

TEST(Config, ShippedConfigsLoad) {
  for (const char* name : {"llm40b_scale.json", "small_1f1b.json"}) {
    SimConfig cfg;
    ASSERT_EQ(load_sim_config(kSource + "/configs/" + name, &cfg), pfSuccess) << name << ": " << last_error_message();
    EXPECT_FALSE(cfg.sim.job_types.empty()) << name;
  }
  SimConfig cfg;
  EXPECT_EQ(load_sim_config(kSource + "/configs/no_such.json", &cfg), pfErrorIo);
  EXPECT_NE(last_error_message().find("no_such.json"), std::string::npos);
}

TEST(Config, IntListParsing) {
  std::vector<int> v;
  ASSERT_EQ(parse_int_list("1024,2048,4096", "--sweep-gpus", &v), pfSuccess);
  EXPECT_EQ(v, (std::vector<int>{1024, 2048, 4096}));
  EXPECT_EQ(parse_int_list("1024,,8", "--sweep-gpus", &v), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("--sweep-gpus: '' is not a positive integer (in '1024,,8')"), std::string::npos);
  EXPECT_EQ(parse_int_list("12x", "--sweep-gpus", &v), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("'12x'"), std::string::npos);
  EXPECT_EQ(parse_int_list("0", "--sweep-gpus", &v), pfErrorInvalidArgument);
}

}  // namespace
}  // namespace pipefill::cluster

namespace pipefill::cluster {
namespace {

TEST(Config, StrategyInterferenceAndOverrides) {
  json d = minimal();
  d["fill"]["strategy"] = "tally";
  d["fill"]["reserved_sms"] = 8;
  d["fill"]["max_arena_gib"] = 12.5;
  d["interference"] = {{"mem_slowdown", 0.25}, {"comm_slowdown", 1.5}};
  SimConfig cfg;
  ASSERT_EQ(parse_sim_config(d, "/base", &cfg), pfSuccess) << last_error_message();
  EXPECT_EQ(cfg.sim.fill.strategy, FillStrategy::Tally);
  EXPECT_EQ(cfg.sim.fill.reserved_sms, 8);
  EXPECT_DOUBLE_EQ(cfg.sim.fill.max_arena_gib, 12.5);
  EXPECT_DOUBLE_EQ(cfg.sim.interference.mem_slowdown, 0.25);
  EXPECT_DOUBLE_EQ(cfg.sim.interference.comm_slowdown, 1.5);
  // Absent: the calibrated defaults (beta 0.6, gamma 0.5), not zero.
  SimConfig plain;
  ASSERT_EQ(parse_sim_config(minimal(), "/base", &plain), pfSuccess);
  EXPECT_DOUBLE_EQ(plain.sim.interference.mem_slowdown, 0.6);
  EXPECT_DOUBLE_EQ(plain.sim.interference.comm_slowdown, 0.5);

  d = minimal();
  d["fill"]["strategy"] = "freerider";
  EXPECT_NE(parse_error(d).find("fill.strategy must be ours, naive"), std::string::npos);
  d = minimal();
  d["interference"] = {{"beta", 0.6}};
  EXPECT_NE(parse_error(d).find("unknown field 'interference.beta'"), std::string::npos);
  d = minimal();
  d["interference"] = {{"comm_slowdown", -0.1}};
  EXPECT_NE(parse_error(d).find("interference.comm_slowdown"), std::string::npos);

  // Command-line overrides: applied, and refused naming the flag.
  SimConfig base;
  ASSERT_EQ(parse_sim_config(minimal(), "/base", &base), pfSuccess);
  FillJobType a;
  a.name = "a";
  base.sim.job_types = {a};
  RunOverrides o;
  o.mem_interference = 1.6;
  o.comm_interference = 2.2;
  o.strategy = "paper";
  o.mix = "a=3";
  o.no_optimizer_fill = true;
  std::vector<PlannedRun> runs;
  ASSERT_EQ(plan_runs(base, o, &runs), pfSuccess) << last_error_message();
  ASSERT_FALSE(runs.empty());
  EXPECT_DOUBLE_EQ(runs[0].spec.interference.mem_slowdown, 1.6);
  EXPECT_DOUBLE_EQ(runs[0].spec.interference.comm_slowdown, 2.2);
  EXPECT_EQ(runs[0].spec.fill.strategy, FillStrategy::PaperStyle);
  EXPECT_FALSE(runs[0].spec.fill.fill_optimizer_bubble);
  EXPECT_DOUBLE_EQ(runs[0].spec.workload.mix.at("a"), 3.0);
  // The all-reduce window is left unfilled by default (like the runtime's
  // fill_optimizer_bubbles); --optimizer-fill opts in; both flags at once are refused.
  EXPECT_FALSE(base.sim.fill.fill_optimizer_bubble);
  RunOverrides opt_in;
  opt_in.optimizer_fill = true;
  ASSERT_EQ(plan_runs(base, opt_in, &runs), pfSuccess) << last_error_message();
  EXPECT_TRUE(runs[0].spec.fill.fill_optimizer_bubble);
  opt_in.no_optimizer_fill = true;
  EXPECT_EQ(plan_runs(base, opt_in, &runs), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("--optimizer-fill and --no-optimizer-fill"), std::string::npos);
  RunOverrides bad;
  bad.mix = "b=1";
  EXPECT_EQ(plan_runs(base, bad, &runs), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("--mix names unknown job type 'b'"), std::string::npos);
  bad = RunOverrides{};
  bad.mem_interference = -1;
  EXPECT_EQ(plan_runs(base, bad, &runs), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("--mem-interference"), std::string::npos);
  bad = RunOverrides{};
  bad.strategy = "gpu";
  EXPECT_EQ(plan_runs(base, bad, &runs), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("--strategy"), std::string::npos);
}

}  // namespace
}  // namespace pipefill::cluster
