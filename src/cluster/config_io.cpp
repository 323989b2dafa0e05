#include "cluster/config_io.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "core/scheduler.hpp"
#include "schedule/pytorch_csv.hpp"

namespace pipefill::cluster {
namespace {

using nlohmann::json;

// Reads the fields of one JSON object, remembering which keys were used so that unknown ones
// can be reported.
class Section {
 public:
  Section(const json* obj, std::string path) : obj_(obj), path_(std::move(path)) {}

  static pfResult_t open(const json& parent, const std::string& parent_path, const char* key, Section* out,
                         bool* present) {
    *present = false;
    auto it = parent.find(key);
    const std::string path = parent_path.empty() ? key : parent_path + "." + key;
    if (it == parent.end()) return pfSuccess;
    if (!it->is_object()) return fail(pfErrorInvalidArgument, "{} must be an object, got {}", path, it->dump());
    *out = Section(&*it, path);
    *present = true;
    return pfSuccess;
  }

  pfResult_t number(const char* key, double* out, double min = -std::numeric_limits<double>::infinity(),
                    double max = std::numeric_limits<double>::infinity(), bool min_exclusive = false) {
    const json* v = take(key);
    if (v == nullptr) return pfSuccess;
    if (!v->is_number()) return fail(pfErrorInvalidArgument, "{} must be a number, got {}", name(key), v->dump());
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < min || x > max || (min_exclusive && x == min))
      return fail(pfErrorInvalidArgument, "{} must be in {}{}, {}], got {}", name(key), min_exclusive ? "(" : "[", min,
                  max, v->dump());
    *out = x;
    return pfSuccess;
  }

  pfResult_t integer(const char* key, int* out, long long min, long long max = std::numeric_limits<int>::max()) {
    const json* v = take(key);
    if (v == nullptr) return pfSuccess;
    if (!v->is_number_integer())
      return fail(pfErrorInvalidArgument, "{} must be an integer, got {}", name(key), v->dump());
    // Unsigned values above LLONG_MAX do not fit a long long: compare them before converting.
    if ((v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(max)) ||
        (!v->is_number_unsigned() && (v->get<long long>() < min || v->get<long long>() > max)))
      return fail(pfErrorInvalidArgument, "{} must be in [{}, {}], got {}", name(key), min, max, v->dump());
    *out = static_cast<int>(v->get<long long>());
    return pfSuccess;
  }

  pfResult_t uint64(const char* key, uint64_t* out) {
    const json* v = take(key);
    if (v == nullptr) return pfSuccess;
    if (!v->is_number_unsigned())
      return fail(pfErrorInvalidArgument, "{} must be a non-negative integer, got {}", name(key), v->dump());
    *out = v->get<uint64_t>();
    return pfSuccess;
  }

  pfResult_t boolean(const char* key, bool* out) {
    const json* v = take(key);
    if (v == nullptr) return pfSuccess;
    if (!v->is_boolean()) return fail(pfErrorInvalidArgument, "{} must be true or false, got {}", name(key), v->dump());
    *out = v->get<bool>();
    return pfSuccess;
  }

  pfResult_t string(const char* key, std::string* out) {
    const json* v = take(key);
    if (v == nullptr) return pfSuccess;
    if (!v->is_string()) return fail(pfErrorInvalidArgument, "{} must be a string, got {}", name(key), v->dump());
    *out = v->get<std::string>();
    return pfSuccess;
  }

  const json* raw(const char* key) { return take(key); }

  pfResult_t finish() const {
    if (obj_ == nullptr) return pfSuccess;
    for (auto it = obj_->begin(); it != obj_->end(); ++it)
      if (!used_.count(it.key())) return fail(pfErrorInvalidArgument, "unknown field '{}'", name(it.key().c_str()));
    return pfSuccess;
  }

  std::string name(const char* key) const { return path_.empty() ? key : path_ + "." + key; }

 private:
  const json* take(const char* key) {
    used_.insert(key);
    if (obj_ == nullptr) return nullptr;
    auto it = obj_->find(key);
    return it == obj_->end() ? nullptr : &*it;
  }
  const json* obj_ = nullptr;
  std::string path_;
  std::set<std::string> used_;
};

pfResult_t parse_schedule_value(const json& v, const std::string& where, schedule::ScheduleKind* out) {
  if (!v.is_string()) return fail(pfErrorInvalidArgument, "{} must be a string, got {}", where, v.dump());
  if (!schedule::parse_schedule_kind(v.get<std::string>(), out))
    return fail(pfErrorInvalidArgument, "{} must be {}, got '{}'", where, schedule::schedule_kind_choices(),
                v.get<std::string>());
  return pfSuccess;
}

constexpr double kMax = std::numeric_limits<double>::infinity();
constexpr double kMaxMixWeight = 1e12;

std::string resolve(const std::string& file, const std::string& base_dir) {
  std::filesystem::path path(file);
  if (path.is_relative() && !base_dir.empty()) path = std::filesystem::path(base_dir) / path;
  return path.lexically_normal().string();
}

}  // namespace

pfResult_t parse_int_list(const std::string& text, const char* what, std::vector<int>* out) {
  std::vector<int> values;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || end == nullptr || *end != '\0' || errno != 0 || v < 1 || v > std::numeric_limits<int>::max())
      return fail(pfErrorInvalidArgument, "{}: '{}' is not a positive integer (in '{}')", what, item, text);
    values.push_back(static_cast<int>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  *out = std::move(values);
  return pfSuccess;
}

pfResult_t parse_sim_config(const json& doc, const std::string& base_dir, SimConfig* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "parse_sim_config: out must not be null");
  if (!doc.is_object()) return fail(pfErrorInvalidArgument, "config must be a JSON object, got {}", doc.dump());
  SimConfig cfg;
  ClusterSimSpec& sim = cfg.sim;
  TrainingSpec& tr = sim.training;
  Section root(&doc, "");
  bool present = false;

  Section model(nullptr, "model");
  PF_TRY(Section::open(doc, "", "model", &model, &present));
  PF_TRY(model.string("name", &tr.model.name));
  PF_TRY(model.integer("layers", &tr.model.layers, 1));
  PF_TRY(model.integer("hidden", &tr.model.hidden, 1));
  PF_TRY(model.integer("heads", &tr.model.heads, 1));
  PF_TRY(model.integer("sequence", &tr.model.sequence, 1));
  PF_TRY(model.integer("vocabulary", &tr.model.vocabulary, 1));
  PF_TRY(model.integer("ffn_hidden", &tr.model.ffn_hidden, 0));
  PF_TRY(model.finish());
  root.raw("model");

  Section par(nullptr, "parallelism");
  PF_TRY(Section::open(doc, "", "parallelism", &par, &present));
  PF_TRY(par.integer("tensor", &tr.parallel.tensor, 1));
  PF_TRY(par.integer("pipeline", &tr.parallel.pipeline, 1));
  PF_TRY(par.integer("data", &tr.parallel.data, 1));
  PF_TRY(par.integer("micro_batch", &tr.parallel.micro_batch, 1));
  PF_TRY(par.integer("global_batch", &tr.parallel.global_batch, 1));
  PF_TRY(par.integer("chunks", &tr.parallel.chunks, 1));
  PF_TRY(par.integer("microbatch_group_size", &tr.parallel.microbatch_group_size, 0));
  PF_TRY(par.boolean("sequence_parallel", &tr.parallel.sequence_parallel));
  PF_TRY(par.boolean("distributed_optimizer", &tr.parallel.distributed_optimizer));
  std::string recompute;
  PF_TRY(par.string("recompute", &recompute));
  if (!recompute.empty() && !parse_recompute(recompute, &tr.parallel.recompute))
    return fail(pfErrorInvalidArgument, "parallelism.recompute must be none, selective or full, got '{}'", recompute);
  int gpus = 0;
  PF_TRY(par.integer("gpus", &gpus, 1));
  PF_TRY(par.finish());
  root.raw("parallelism");
  if (gpus > 0) PF_TRY(set_gpu_count(&tr, gpus, "parallelism.gpus"));

  if (const json* v = root.raw("schedule")) PF_TRY(parse_schedule_value(*v, "schedule", &tr.schedule));
  std::string schedule_csv;
  PF_TRY(root.string("schedule_csv", &schedule_csv));
  if (!schedule_csv.empty()) cfg.schedule_csv = resolve(schedule_csv, base_dir);
  PF_TRY(root.integer("weight_grad_bytes", &tr.weight_grad_bytes, 1, 8));
  PF_TRY(root.integer("iterations", &sim.iterations, 1));
  PF_TRY(root.integer("record_iteration", &sim.record_iteration, -1));

  Section gpu(nullptr, "gpu");
  PF_TRY(Section::open(doc, "", "gpu", &gpu, &present));
  PF_TRY(gpu.string("name", &tr.gpu.name));
  PF_TRY(gpu.number("peak_tflops", &tr.gpu.peak_tflops, 0, kMax, true));
  PF_TRY(gpu.number("achieved_fraction", &tr.gpu.achieved_fraction, 0, 1, true));
  PF_TRY(gpu.number("memory_gib", &tr.gpu.memory_gib, 0, kMax, true));
  PF_TRY(gpu.number("memory_reserve_gib", &tr.gpu.memory_reserve_gib, 0));
  PF_TRY(gpu.number("memory_bandwidth_gbps", &tr.gpu.memory_bandwidth_gbps, 0, kMax, true));
  PF_TRY(gpu.integer("sm_count", &tr.gpu.sm_count, 1));
  PF_TRY(gpu.finish());
  root.raw("gpu");

  Section net(nullptr, "network");
  PF_TRY(Section::open(doc, "", "network", &net, &present));
  PF_TRY(net.integer("gpus_per_node", &tr.network.gpus_per_node, 1));
  PF_TRY(net.number("intra_node_gbps", &tr.network.intra_node_gbps, 0, kMax, true));
  PF_TRY(net.number("intra_node_latency_us", &tr.network.intra_node_latency_us, 0));
  PF_TRY(net.number("inter_node_gbps", &tr.network.inter_node_gbps, 0, kMax, true));
  PF_TRY(net.number("inter_node_latency_us", &tr.network.inter_node_latency_us, 0));
  PF_TRY(net.finish());
  root.raw("network");

  Section fill(nullptr, "fill");
  PF_TRY(Section::open(doc, "", "fill", &fill, &present));
  FillOptions& f = sim.fill;
  PF_TRY(fill.boolean("enabled", &f.enabled));
  std::string policy;
  PF_TRY(fill.string("policy", &policy));
  if (!policy.empty() && !parse_policy(policy.c_str(), &f.policy))
    return fail(pfErrorInvalidArgument, "fill.policy must be fifo, priority, srpt or fair, got '{}'", policy);
  PF_TRY(fill.number("efficiency", &f.efficiency, 0, 1, true));
  PF_TRY(fill.number("margin_us", &f.margin_us, 0));
  PF_TRY(fill.number("margin_fraction", &f.margin_fraction, 0, 0.99));
  PF_TRY(fill.number("prediction_quantile", &f.prediction_quantile, 0, 1, true));
  PF_TRY(fill.number("gated_prediction_quantile", &f.gated_prediction_quantile, 0, 1, true));
  PF_TRY(fill.integer("warmup_iterations", &f.warmup_iterations, 0));
  PF_TRY(fill.number("launch_overhead_us", &f.launch_overhead_us, 0));
  PF_TRY(fill.number("jitter", &f.jitter, 0, 0.99));
  PF_TRY(fill.number("min_bubble_us", &f.min_bubble_us, 0));
  PF_TRY(fill.boolean("gated", &f.gated));
  PF_TRY(fill.boolean("fill_optimizer_bubble", &f.fill_optimizer_bubble));
  std::string strategy;
  PF_TRY(fill.string("strategy", &strategy));
  if (!strategy.empty() && !parse_strategy(strategy, &f.strategy))
    return fail(pfErrorInvalidArgument, "fill.strategy must be {}, got '{}'", strategy_choices(), strategy);
  PF_TRY(fill.integer("reserved_sms", &f.reserved_sms, 0));
  PF_TRY(fill.number("gate_visibility_us", &f.gate_visibility_us, 0, 1e9));
  PF_TRY(fill.number("max_arena_gib", &f.max_arena_gib, 0, 1 << 20));
  std::string jobs_file;
  PF_TRY(fill.string("jobs_file", &jobs_file));
  PF_TRY(fill.finish());
  root.raw("fill");
  if (!jobs_file.empty()) cfg.jobs_file = resolve(jobs_file, base_dir);

  Section inter(nullptr, "interference");
  PF_TRY(Section::open(doc, "", "interference", &inter, &present));
  PF_TRY(inter.number("mem_slowdown", &sim.interference.mem_slowdown, 0, 100));
  PF_TRY(inter.number("comm_slowdown", &sim.interference.comm_slowdown, 0, 100));
  PF_TRY(inter.finish());
  root.raw("interference");

  Section wl(nullptr, "workload");
  PF_TRY(Section::open(doc, "", "workload", &wl, &present));
  PF_TRY(wl.uint64("seed", &sim.workload.seed));
  PF_TRY(wl.number("initial_jobs_per_gpu", &sim.workload.initial_jobs_per_gpu, 0));
  PF_TRY(wl.number("arrivals_per_gpu_hour", &sim.workload.arrivals_per_gpu_hour, 0));
  if (const json* mix = wl.raw("mix")) {
    if (!mix->is_object()) return fail(pfErrorInvalidArgument, "workload.mix must be an object, got {}", mix->dump());
    for (auto it = mix->begin(); it != mix->end(); ++it) {
      if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < 0 ||
          it->get<double>() > kMaxMixWeight)
        return fail(pfErrorInvalidArgument, "workload.mix.{} must be a number in [0, {}], got {}", it.key(),
                    kMaxMixWeight, it->dump());
      sim.workload.mix[it.key()] = it->get<double>();
    }
  }
  PF_TRY(wl.finish());
  root.raw("workload");

  if (const json* sweep = root.raw("sweep_gpus")) {
    if (!sweep->is_array()) return fail(pfErrorInvalidArgument, "sweep_gpus must be an array, got {}", sweep->dump());
    for (size_t i = 0; i < sweep->size(); ++i) {
      const json& v = (*sweep)[i];
      if (!v.is_number_integer() || v.get<long long>() < 1 || v.get<long long>() > std::numeric_limits<int>::max())
        return fail(pfErrorInvalidArgument, "sweep_gpus[{}] must be a positive integer, got {}", i, v.dump());
      cfg.sweep_gpus.push_back(v.get<int>());
    }
  }
  if (const json* sweep = root.raw("sweep_schedules")) {
    if (!sweep->is_array()) return fail(pfErrorInvalidArgument, "sweep_schedules must be an array, got {}", sweep->dump());
    for (size_t i = 0; i < sweep->size(); ++i) {
      schedule::ScheduleKind k;
      PF_TRY(parse_schedule_value((*sweep)[i], fmt::format("sweep_schedules[{}]", i), &k));
      cfg.sweep_schedules.push_back(k);
    }
  }
  std::string description;  // free text, ignored
  PF_TRY(root.string("description", &description));
  PF_TRY(root.finish());
  *out = std::move(cfg);
  return pfSuccess;
}

pfResult_t load_config_files(SimConfig* cfg) {
  if (!cfg->jobs_file.empty()) {
    const pfResult_t rc = load_fill_job_types(cfg->jobs_file, &cfg->sim.job_types);
    if (rc != pfSuccess) return fail(rc, "fill.jobs_file: {}", last_error_message());
  }
  if (!cfg->schedule_csv.empty()) PF_TRY(load_schedule_csv(cfg->schedule_csv, "schedule_csv", &cfg->sim.training));
  return pfSuccess;
}

pfResult_t load_schedule_csv(const std::string& path, const std::string& field, TrainingSpec* training) {
  auto custom = std::make_shared<schedule::CustomSchedule>();
  std::string error;
  if (!schedule::load_pytorch_csv(path, custom.get(), &error))
    return fail(pfErrorInvalidArgument, "{}: {}", field, error);
  training->custom_schedule = std::move(custom);
  training->custom_schedule_source = path;
  return pfSuccess;
}

pfResult_t load_sim_config(const std::string& path, SimConfig* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "load_sim_config: out must not be null");
  std::ifstream in(path);
  if (!in) return fail(pfErrorIo, "cannot open config file '{}'", path);
  json doc;
  try {
    doc = json::parse(in, nullptr, true, /*ignore_comments=*/true);
  } catch (const std::exception& e) {
    return fail(pfErrorInvalidArgument, "config file '{}' is not valid JSON: {}", path, e.what());
  }
  SimConfig cfg;
  const std::string base = std::filesystem::path(path).parent_path().string();
  PF_TRY(parse_sim_config(doc, base, &cfg));
  PF_TRY(load_config_files(&cfg));
  *out = std::move(cfg);
  return pfSuccess;
}

}  // namespace pipefill::cluster
