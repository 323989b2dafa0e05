#include "cluster/workload.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numbers>

#include <nlohmann/json.hpp>

#include "common/error.hpp"

namespace pipefill::cluster {
namespace {

using nlohmann::json;

constexpr double kMiB = 1024.0 * 1024.0;

// A number field in [lo, hi] (lo excluded when lo_open); `where` is the JSON path of the object.
pfResult_t get_number(const json& obj, const std::string& where, const char* key, bool required, double* out,
                      double lo, double hi, bool lo_open = false) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) return fail(pfErrorInvalidArgument, "{}.{}: missing field", where, key);
    return pfSuccess;
  }
  if (!it->is_number()) return fail(pfErrorInvalidArgument, "{}.{} must be a number, got {}", where, key, it->dump());
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi || (lo_open && v == lo))
    return fail(pfErrorInvalidArgument, "{}.{} must be in {}{}, {}], got {}", where, key, lo_open ? "(" : "[", lo, hi,
                it->dump());
  *out = v;
  return pfSuccess;
}

pfResult_t get_string(const json& obj, const std::string& where, const char* key, bool required,
                      std::string* out) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) return fail(pfErrorInvalidArgument, "{}.{}: missing field", where, key);
    return pfSuccess;
  }
  if (!it->is_string()) return fail(pfErrorInvalidArgument, "{}.{} must be a string, got {}", where, key, it->dump());
  *out = it->get<std::string>();
  return pfSuccess;
}

}  // namespace

double Rng::exponential(double rate) {
  // 1 - u is in (0, 1], so the log is finite.
  return -std::log(1.0 - uniform()) / rate;
}

double Rng::normal() {
  // Box-Muller, one value per call (simple, deterministic).
  const double u1 = 1.0 - uniform();
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

pfResult_t parse_fill_job_types(const json& doc, std::vector<FillJobType>* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "parse_fill_job_types: out must not be null");
  if (!doc.is_object() || !doc.contains("job_types") || !doc["job_types"].is_array())
    return fail(pfErrorInvalidArgument, "fill jobs: expected an object with a 'job_types' array");
  std::vector<FillJobType> types;
  for (size_t i = 0; i < doc["job_types"].size(); ++i) {
    const json& j = doc["job_types"][i];
    const std::string where = fmt::format("job_types[{}]", i);
    if (!j.is_object()) return fail(pfErrorInvalidArgument, "{} must be an object, got {}", where, j.dump());
    FillJobType t;
    PF_TRY(get_string(j, where, "name", true, &t.name));
    PF_TRY(get_string(j, where, "kind", true, &t.kind));
    if (t.kind != "inference" && t.kind != "training")
      return fail(pfErrorInvalidArgument, "{}.kind must be 'inference' or 'training', got '{}'", where, t.kind);
    PF_TRY(get_string(j, where, "work_unit", false, &t.work_unit));
    PF_TRY(get_string(j, where, "provenance", false, &t.provenance));
    PF_TRY(get_number(j, where, "size_median", true, &t.size_median, 0, kMaxJobSize, true));
    PF_TRY(get_number(j, where, "size_sigma", false, &t.size_sigma, 0, 10));
    double priority = 0;
    PF_TRY(get_number(j, where, "priority", false, &priority, -1e9, 1e9));
    t.priority = static_cast<int>(priority);
    for (const auto& other : types)
      if (other.name == t.name)
        return fail(pfErrorInvalidArgument, "{}.name: duplicate job type name '{}'", where, t.name);
    if (!j.contains("configs") || !j["configs"].is_array() || j["configs"].empty())
      return fail(pfErrorInvalidArgument, "{}.configs must be a non-empty array", where);
    for (size_t k = 0; k < j["configs"].size(); ++k) {
      const json& c = j["configs"][k];
      const std::string cw = fmt::format("{}.configs[{}]", where, k);
      if (!c.is_object()) return fail(pfErrorInvalidArgument, "{} must be an object, got {}", cw, c.dump());
      FillConfigSpec cs;
      PF_TRY(get_string(c, cw, "name", false, &cs.name));
      // Item costs from 1 ns: a bubble never holds more than 1e15 items per worker (the planner's cap).
      PF_TRY(get_number(c, cw, "item_us", true, &cs.item_us, 1e-3, 1e12));
      PF_TRY(get_number(c, cw, "work_per_item", true, &cs.work_per_item, 1e-6, 1e12));
      double resident_mib = 0, workspace_mib = 0;
      PF_TRY(get_number(c, cw, "resident_mib", true, &resident_mib, 0, 1e9));
      PF_TRY(get_number(c, cw, "workspace_mib", true, &workspace_mib, 0, 1e9));
      cs.resident_bytes = static_cast<size_t>(resident_mib * kMiB);
      cs.workspace_bytes = static_cast<size_t>(workspace_mib * kMiB);
      t.configs.push_back(std::move(cs));
    }
    types.push_back(std::move(t));
  }
  if (types.empty()) return fail(pfErrorInvalidArgument, "fill jobs: 'job_types' is empty");
  *out = std::move(types);
  return pfSuccess;
}

pfResult_t load_fill_job_types(const std::string& path, std::vector<FillJobType>* out) {
  std::ifstream in(path);
  if (!in) return fail(pfErrorIo, "cannot open fill jobs file '{}'", path);
  json doc;
  try {
    doc = json::parse(in);
  } catch (const std::exception& e) {
    return fail(pfErrorInvalidArgument, "fill jobs file '{}' is not valid JSON: {}", path, e.what());
  }
  return parse_fill_job_types(doc, out);
}

std::vector<JobConfigModel> planner_configs(const FillJobType& type, double fill_efficiency) {
  std::vector<JobConfigModel> out;
  out.reserve(type.configs.size());
  for (const auto& c : type.configs) {
    JobConfigModel m;
    m.item_cost_us = c.item_us / fill_efficiency;
    m.parallelism = 1;
    m.resident_bytes = c.resident_bytes;
    m.workspace_bytes_per_item = c.workspace_bytes;
    m.work_per_item = c.work_per_item;
    out.push_back(m);
  }
  return out;
}

pfResult_t generate_jobs(const WorkloadSpec& spec, const std::vector<FillJobType>& types, int gpus,
                         double horizon_us, std::vector<FillJob>* out, uint64_t max_jobs) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "generate_jobs: out must not be null");
  if (types.empty()) return fail(pfErrorInvalidArgument, "generate_jobs: no job types");
  if (gpus < 1) return fail(pfErrorInvalidArgument, "generate_jobs: gpus must be >= 1, got {}", gpus);
  if (!std::isfinite(horizon_us) || horizon_us < 0)
    return fail(pfErrorInvalidArgument, "generate_jobs: horizon_us must be >= 0, got {}", horizon_us);
  if (!std::isfinite(spec.initial_jobs_per_gpu) || spec.initial_jobs_per_gpu < 0)
    return fail(pfErrorInvalidArgument, "workload.initial_jobs_per_gpu must be >= 0, got {}", spec.initial_jobs_per_gpu);
  if (!std::isfinite(spec.arrivals_per_gpu_hour) || spec.arrivals_per_gpu_hour < 0)
    return fail(pfErrorInvalidArgument, "workload.arrivals_per_gpu_hour must be >= 0, got {}", spec.arrivals_per_gpu_hour);
  // Cumulative weights of the mix, in the types' order.
  std::vector<double> cumulative(types.size(), 0.0);
  double total = 0.0;
  for (const auto& [name, weight] : spec.mix) {
    auto it = std::find_if(types.begin(), types.end(), [&name = name](const FillJobType& t) { return t.name == name; });
    if (it == types.end()) return fail(pfErrorInvalidArgument, "workload.mix names unknown job type '{}'", name);
    if (!std::isfinite(weight) || weight < 0)
      return fail(pfErrorInvalidArgument, "workload.mix['{}'] must be >= 0, got {}", name, weight);
  }
  for (size_t i = 0; i < types.size(); ++i) {
    double w = 1.0;
    if (!spec.mix.empty()) {
      auto it = spec.mix.find(types[i].name);
      w = it == spec.mix.end() ? 0.0 : it->second;
    }
    total += w;
    cumulative[i] = total;
  }
  if (!(total > 0)) return fail(pfErrorInvalidArgument, "workload.mix has no positive weight");

  Rng rng(spec.seed);
  std::vector<FillJob> jobs;
  auto make_job = [&](double arrival) {
    FillJob j;
    j.sequence = jobs.size();
    const double pick = rng.uniform() * total;
    j.type = static_cast<int>(std::upper_bound(cumulative.begin(), cumulative.end(), pick) - cumulative.begin());
    j.type = std::min<int>(j.type, static_cast<int>(types.size()) - 1);
    const FillJobType& t = types[j.type];
    double min_work = t.configs[0].work_per_item;
    for (const auto& c : t.configs) min_work = std::min(min_work, c.work_per_item);
    j.size = std::min(kMaxJobSize, std::max(min_work, std::round(t.size_median * std::exp(t.size_sigma * rng.normal()))));
    j.arrival_us = arrival;
    j.priority = t.priority;
    jobs.push_back(j);
  };
  const double initial = std::round(spec.initial_jobs_per_gpu * gpus);
  auto too_many = [&]() {
    return fail(pfErrorInvalidArgument,
                "the workload generates more than {} fill jobs (workload.initial_jobs_per_gpu {} and "
                "workload.arrivals_per_gpu_hour {} on {} GPUs over {:.4g} us); raise --max-sim-jobs or lower them",
                max_jobs, spec.initial_jobs_per_gpu, spec.arrivals_per_gpu_hour, gpus, horizon_us);
  };
  if (initial > static_cast<double>(max_jobs)) return too_many();
  for (long long i = 0; i < static_cast<long long>(initial); ++i) make_job(0.0);
  const double rate_per_us = spec.arrivals_per_gpu_hour * gpus / 3.6e9;
  if (rate_per_us > 0) {
    double t = rng.exponential(rate_per_us);
    while (t < horizon_us) {
      if (jobs.size() >= max_jobs) return too_many();
      make_job(t);
      t += rng.exponential(rate_per_us);
    }
  }
  *out = std::move(jobs);
  return pfSuccess;
}

}  // namespace pipefill::cluster
