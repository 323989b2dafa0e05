// The example fill jobs: parameters, cost model, the pfJobDesc_t callbacks and the simulated /
// host backends' per-item CPU computation. The CUDA work lives behind GpuJob (gpu_job.cu).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "fill_jobs.h"
#include "gpu_job.hpp"
#include "reference.hpp"

namespace fill_jobs {
namespace {

thread_local std::string t_last_error;

// Default rates of the cost model (estimates, see docs/integration.md): one H100/H200 SM runs
// ~0.5 TFLOP/s of fp32 FMA at its peak; a hand-written ticket item reaches ~60% of it. cuBLAS
// with TF32 tensor cores gives ~3.7 TFLOP/s per SM at peak; ~50% for these small GEMMs.
constexpr double kTicketFlopsPerUs = 0.3e6;
constexpr double kOpaqueFlopsPerUs = 1.8e6;
constexpr int kOpaqueBlocks = 16;
// Floor for an opaque item: a handful of kernel launches back to back on the device.
constexpr double kOpaqueItemFloorUs = 10.0;
// One byte per item tracks exactly-once completion on the simulated backend.
constexpr uint64_t kMaxSimItems = uint64_t{1} << 31;

}  // namespace

pfResult_t fj_fail(pfResult_t code, const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  t_last_error = buffer;
  return code;
}

}  // namespace fill_jobs

using namespace fill_jobs;

struct fjJob {
  HostModel model;
  fjParams_t params{};
  std::string name;
  double item_cost_us = 0.0;
  size_t output_floats = 0;  // per inference item
  pfJobConfig_t config{};

  // Simulated backend: per-item CPU results. Callbacks arrive on whichever thread runs the
  // simulated world, so the state is guarded.
  std::mutex mutex;
  std::vector<uint8_t> completions;  // per item, saturating at 2
  uint64_t items_done = 0;
  uint64_t duplicates = 0;
  uint64_t out_of_order = 0;
  std::unordered_map<uint64_t, std::vector<float>> kept_outputs;
  std::unique_ptr<RegressionTrainer> trainer;
  uint64_t next_step = 0;
  double first_loss = std::numeric_limits<double>::quiet_NaN();
  double last_loss = std::numeric_limits<double>::quiet_NaN();
  std::vector<float> input_scratch, output_scratch, hidden_scratch;
  std::unique_ptr<EncoderScratch> encoder_scratch;

  std::unique_ptr<GpuJob> gpu;

  void compute_item(uint64_t item);
};

void fjJob::compute_item(uint64_t item) {
  std::lock_guard<std::mutex> lock(mutex);
  if (item >= completions.size()) {
    ++duplicates;  // an item outside the job: count it as an error the checks will see
    return;
  }
  if (completions[item] != 0) {
    ++duplicates;
    completions[item] = 2;
    return;
  }
  completions[item] = 1;
  ++items_done;
  switch (params.kind) {
    case fjTraining: {
      if (item != next_step) ++out_of_order;  // SGD steps must run in order
      const float loss = trainer->step(item);
      next_step = item + 1;
      if (item == 0) first_loss = loss;
      last_loss = loss;
      break;
    }
    case fjMlpInference:
    case fjEncoderInference: {
      if (params.keep_every == 0 || item % params.keep_every != 0) break;
      if (params.kind == fjMlpInference) {
        mlp_item_input(model.mlp.shape, params.seed, item, input_scratch.data());
        mlp_forward(model.mlp, input_scratch.data(), model.mlp.shape.rows, output_scratch.data(),
                    hidden_scratch.data());
      } else {
        encoder_item_input(model.encoder.shape, params.seed, item, input_scratch.data());
        encoder_forward(model.encoder, input_scratch.data(), output_scratch.data(),
                        *encoder_scratch);
      }
      kept_outputs.emplace(item, output_scratch);
      break;
    }
    default:
      break;
  }
}

namespace {

void sim_item_callback(void* user, uint64_t item) {
  auto* job = static_cast<fjJob*>(user);
  job->compute_item(item);
  if (job->params.on_item) job->params.on_item(job->params.on_item_user, item);
}

// Host (real-time) backend: an SM thread runs the item; it takes the item's modelled cost in real
// time (sleeping out what the CPU result leaves of it), so the planner's sizing holds there too.
void host_item_callback(void* user, uint64_t item) {
  auto* job = static_cast<fjJob*>(user);
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double, std::micro>(job->item_cost_us));
  job->compute_item(item);
  std::this_thread::sleep_until(until);
  if (job->params.on_item) job->params.on_item(job->params.on_item_user, item);
}

pfResult_t launch_callback(void* user, const pfSliceDesc_t* slice, void* stream) {
  auto* job = static_cast<fjJob*>(user);
  if (job->gpu) return job->gpu->launch(slice, stream);
  if (job->params.backend == pfBackendHost) {
    int blocks = slice->max_blocks;
    if (job->params.parallelism > 0) blocks = std::min(blocks, job->params.parallelism);
    blocks = std::max(1, blocks);
    if (job->params.execution == fjExecOpaque)
      return pfHostLaunchOpaque(stream, slice->first_item_hint, slice->max_items, blocks,
                                &host_item_callback, job);
    return pfHostLaunchTicketKernel(stream, slice, blocks, &host_item_callback, job);
  }
  // The simulated device models every fill item as one block's work on one SM; `blocks` items
  // are in flight at once. Training steps must run in order: one block.
  int blocks = slice->max_blocks;
  if (job->params.parallelism > 0) blocks = std::min(blocks, job->params.parallelism);
  blocks = std::max(1, blocks);
  if (job->params.execution == fjExecOpaque)
    return pfSimLaunchOpaque(stream, slice->first_item_hint, slice->max_items, blocks,
                             job->item_cost_us, &sim_item_callback, job);
  return pfSimLaunchTicketKernel(stream, slice, blocks, job->item_cost_us, &sim_item_callback,
                                 job);
}

pfResult_t setup_callback(void* user, const pfArenaAllocator_t* allocator, int) {
  auto* job = static_cast<fjJob*>(user);
  return job->gpu ? job->gpu->setup(allocator) : pfSuccess;
}

double flops_per_item(const fjParams_t& p) {
  switch (p.kind) {
    case fjMlpInference:
      return mlp_flops_per_item(MlpShape{p.input, p.hidden, p.output, p.rows});
    case fjEncoderInference:
      return encoder_flops_per_item(EncoderShape{p.hidden, p.heads, p.ffn, p.seq});
    default:
      return trainer_flops_per_item(TrainerShape{p.input, p.hidden, p.output, p.rows,
                                                 p.learning_rate});
  }
}

size_t weight_floats(const fjParams_t& p) {
  const size_t i = p.input, h = p.hidden, o = p.output, f = p.ffn;
  switch (p.kind) {
    case fjMlpInference: return h * i + h + o * h + o;
    case fjEncoderInference: return 4 * h * h + 8 * h + f * h + f + h * f + h;
    default: return h * i + h + o * h + o;
  }
}

pfResult_t validate(const fjParams_t& p) {
  if (p.kind < 0 || p.kind >= fjKindCount)
    return fj_fail(pfErrorInvalidArgument, "fjParams_t.kind %d is not a fjKind_t", p.kind);
  if (p.backend != pfBackendSim && p.backend != pfBackendCuda && p.backend != pfBackendHost)
    return fj_fail(pfErrorInvalidArgument,
                   "fjParams_t.backend %d: must be pfBackendCuda (1), pfBackendSim (2) or "
                   "pfBackendHost (3), the backend of the runtime the job runs on",
                   p.backend);
  if (p.execution != fjExecTicket && p.execution != fjExecOpaque)
    return fj_fail(pfErrorInvalidArgument, "fjParams_t.execution %d is not a fjExecution_t",
                   p.execution);
  if (p.items == 0) return fj_fail(pfErrorInvalidArgument, "fjParams_t.items must be > 0, got 0");
  if (p.backend != pfBackendCuda && p.items > kMaxSimItems)
    return fj_fail(pfErrorInvalidArgument,
                   "fjParams_t.items %llu exceeds %llu, the most the simulated and host backends "
                   "track",
                   static_cast<unsigned long long>(p.items),
                   static_cast<unsigned long long>(kMaxSimItems));
  bool shape_ok = false;
  switch (p.kind) {
    case fjMlpInference: shape_ok = valid_shape(MlpShape{p.input, p.hidden, p.output, p.rows}); break;
    case fjEncoderInference: shape_ok = valid_shape(EncoderShape{p.hidden, p.heads, p.ffn, p.seq}); break;
    default:
      shape_ok = valid_shape(TrainerShape{p.input, p.hidden, p.output, p.rows, p.learning_rate});
  }
  if (!shape_ok)
    return fj_fail(pfErrorInvalidArgument,
                   "invalid %s shape: input %d hidden %d output %d rows %d heads %d ffn %d seq %d "
                   "learning_rate %g (all must be > 0; hidden divisible by heads)",
                   fjKindName(p.kind), p.input, p.hidden, p.output, p.rows, p.heads, p.ffn, p.seq,
                   static_cast<double>(p.learning_rate));
  if (std::isnan(p.item_cost_us) || std::isinf(p.item_cost_us))
    return fj_fail(pfErrorInvalidArgument, "fjParams_t.item_cost_us %g is not finite",
                   p.item_cost_us);
  if (p.parallelism < 0)
    return fj_fail(pfErrorInvalidArgument, "fjParams_t.parallelism %d must be >= 0", p.parallelism);
  if (p.kind == fjTraining && p.parallelism != 1)
    return fj_fail(pfErrorInvalidArgument,
                   "training steps run in order: a training job needs parallelism 1, got %d",
                   p.parallelism);
  return pfSuccess;
}

}  // namespace

extern "C" {

const char* fjGetLastErrorMessage(void) { return t_last_error.c_str(); }

const char* fjKindName(int kind) {
  switch (kind) {
    case fjMlpInference: return "mlp-inference";
    case fjEncoderInference: return "encoder-inference";
    case fjTraining: return "training";
    default: return "unknown";
  }
}

pfResult_t fjParamsInit(fjParams_t* p, int kind, int backend) {
  t_last_error.clear();
  if (!p) return fj_fail(pfErrorInvalidArgument, "fjParamsInit: params is NULL");
  if (kind < 0 || kind >= fjKindCount)
    return fj_fail(pfErrorInvalidArgument, "fjParamsInit: kind %d is not a fjKind_t", kind);
  *p = fjParams_t{};
  p->kind = kind;
  p->backend = backend;
  p->items = 1000000;
  p->seed = 1;
  p->learning_rate = 0.05f;
  p->ticket_flops_per_us = kTicketFlopsPerUs;
  p->opaque_flops_per_us = kOpaqueFlopsPerUs;
  p->opaque_blocks = kOpaqueBlocks;
  p->keep_every = 1;
  switch (kind) {
    case fjMlpInference: {
      const MlpShape s;
      p->input = s.input, p->hidden = s.hidden, p->output = s.output, p->rows = s.rows;
      p->execution = fjExecTicket;
      break;
    }
    case fjEncoderInference: {
      const EncoderShape s;
      p->hidden = s.hidden, p->heads = s.heads, p->ffn = s.ffn, p->seq = s.seq;
      p->execution = fjExecTicket;
      break;
    }
    default: {
      const TrainerShape s;
      p->input = s.input, p->hidden = s.hidden, p->output = s.output, p->rows = s.batch;
      p->learning_rate = s.learning_rate;
      p->items = 2000;
      // Whole-GPU library steps, one after another; resumes at the runtime's exact item hint.
      p->execution = fjExecOpaque;
      p->parallelism = 1;
      break;
    }
  }
  return pfSuccess;
}

pfResult_t fjJobCreate(const fjParams_t* params, fjJob_t* out) {
  t_last_error.clear();
  if (!params || !out)
    return fj_fail(pfErrorInvalidArgument, "fjJobCreate: %s is NULL", params ? "job" : "params");
  *out = nullptr;
  const pfResult_t valid = validate(*params);
  if (valid != pfSuccess) return valid;
  try {
    auto job = std::make_unique<fjJob>();
    fjParams_t& p = job->params;
    p = *params;
    if (p.ticket_flops_per_us <= 0) p.ticket_flops_per_us = kTicketFlopsPerUs;
    if (p.opaque_flops_per_us <= 0) p.opaque_flops_per_us = kOpaqueFlopsPerUs;
    if (p.opaque_blocks <= 0) p.opaque_blocks = kOpaqueBlocks;
    const double flops = flops_per_item(p);
    if (p.item_cost_us > 0) {
      job->item_cost_us = p.item_cost_us;
    } else if (p.kind == fjTraining) {
      // A step's kernels spread over opaque_blocks SMs (cuBLAS); small steps are launch-bound.
      job->item_cost_us =
          std::max(kOpaqueItemFloorUs, flops / (p.opaque_flops_per_us * p.opaque_blocks));
    } else if (p.execution == fjExecTicket) {
      job->item_cost_us = flops / p.ticket_flops_per_us;
    } else {
      job->item_cost_us = std::max(kOpaqueItemFloorUs, flops / p.opaque_flops_per_us);
    }
    job->name = std::string(fjKindName(p.kind)) +
                (p.execution == fjExecTicket ? "/ticket" : "/opaque");

    HostModel& m = job->model;
    m.params = p;
    switch (p.kind) {
      case fjMlpInference:
        m.mlp = MlpWeights::random(MlpShape{p.input, p.hidden, p.output, p.rows}, p.seed);
        job->output_floats = static_cast<size_t>(p.rows) * p.output;
        job->input_scratch.resize(static_cast<size_t>(p.rows) * p.input);
        job->hidden_scratch.resize(static_cast<size_t>(p.rows) * p.hidden);
        break;
      case fjEncoderInference: {
        const EncoderShape s{p.hidden, p.heads, p.ffn, p.seq};
        m.encoder = EncoderWeights::random(s, p.seed);
        job->output_floats = static_cast<size_t>(p.seq) * p.hidden;
        job->input_scratch.resize(job->output_floats);
        job->encoder_scratch = std::make_unique<EncoderScratch>(s);
        break;
      }
      default:
        job->trainer = std::make_unique<RegressionTrainer>(
            TrainerShape{p.input, p.hidden, p.output, p.rows, p.learning_rate}, p.seed);
        m.trainer_parameters = job->trainer->parameters();
        m.trainer_teacher = job->trainer->teacher();
        break;
    }
    job->output_scratch.resize(job->output_floats);

    if (p.backend == pfBackendCuda) {
      const pfResult_t made = make_gpu_job(m, &job->gpu);
      if (made != pfSuccess) return made;
    } else {
      job->completions.assign(p.items, 0);
    }

    pfJobConfig_t& c = job->config;
    c.name = p.execution == fjExecTicket ? "ticket" : "opaque";
    c.item_cost_us = job->item_cost_us;
    c.parallelism = p.parallelism;
    c.resident_bytes = job->gpu ? job->gpu->resident_bytes() : weight_floats(p) * sizeof(float);
    c.workspace_bytes_per_item = 0;
    c.items_per_item = p.kind == fjMlpInference ? p.rows : 1.0;
    *out = job.release();
    return pfSuccess;
  } catch (const std::exception& e) {
    return fj_fail(pfErrorInternal, "fjJobCreate: %s", e.what());
  }
}

pfResult_t fjJobGetDesc(fjJob_t job, pfJobDesc_t* desc) {
  t_last_error.clear();
  if (!job || !desc)
    return fj_fail(pfErrorInvalidArgument, "fjJobGetDesc: %s is NULL", job ? "desc" : "job");
  pfJobDesc_t d = PF_JOB_DESC_INITIALIZER;
  d.name = job->name.c_str();
  d.kind = job->params.execution == fjExecTicket ? pfJobTicket : pfJobOpaque;
  d.priority = job->params.priority;
  d.item_count = job->params.items;
  d.resident_bytes = job->config.resident_bytes;
  d.workspace_bytes_per_item = job->config.workspace_bytes_per_item;
  d.item_cost_hint_us = job->item_cost_us;
  d.configs = &job->config;
  d.config_count = 1;
  d.user = job;
  d.setup = &setup_callback;
  d.launch = &launch_callback;
  d.teardown = nullptr;
  *desc = d;
  return pfSuccess;
}

pfResult_t fjJobGetProgress(fjJob_t job, fjProgress_t* progress) {
  t_last_error.clear();
  if (!job || !progress)
    return fj_fail(pfErrorInvalidArgument, "fjJobGetProgress: %s is NULL",
                   job ? "progress" : "job");
  std::lock_guard<std::mutex> lock(job->mutex);
  progress->items_done = job->items_done;
  progress->duplicate_items = job->duplicates;
  progress->out_of_order = job->out_of_order;
  progress->outputs_kept = job->kept_outputs.size();
  progress->first_loss = job->first_loss;
  progress->last_loss = job->last_loss;
  return pfSuccess;
}

pfResult_t fjJobGetOutput(fjJob_t job, uint64_t item, float* out, size_t count) {
  t_last_error.clear();
  if (!job || !out)
    return fj_fail(pfErrorInvalidArgument, "fjJobGetOutput: %s is NULL", job ? "out" : "job");
  if (job->params.kind == fjTraining)
    return fj_fail(pfErrorInvalidArgument, "fjJobGetOutput: a training job has no item outputs");
  if (count != job->output_floats)
    return fj_fail(pfErrorInvalidArgument, "fjJobGetOutput: count %zu, an item has %zu floats",
                   count, job->output_floats);
  if (item >= job->params.items)
    return fj_fail(pfErrorInvalidArgument, "fjJobGetOutput: item %llu >= item count %llu",
                   static_cast<unsigned long long>(item),
                   static_cast<unsigned long long>(job->params.items));
  if (job->gpu) return job->gpu->read_output(item, out, count);
  std::lock_guard<std::mutex> lock(job->mutex);
  const auto it = job->kept_outputs.find(item);
  if (it == job->kept_outputs.end())
    return fj_fail(pfErrorInvalidState,
                   "fjJobGetOutput: item %llu has no kept output (not run yet, or keep_every %llu "
                   "skips it)",
                   static_cast<unsigned long long>(item),
                   static_cast<unsigned long long>(job->params.keep_every));
  std::copy(it->second.begin(), it->second.end(), out);
  return pfSuccess;
}

pfResult_t fjJobEvaluationLoss(fjJob_t job, double* loss) {
  t_last_error.clear();
  if (!job || !loss)
    return fj_fail(pfErrorInvalidArgument, "fjJobEvaluationLoss: %s is NULL", job ? "loss" : "job");
  if (job->params.kind != fjTraining)
    return fj_fail(pfErrorInvalidArgument, "fjJobEvaluationLoss: job kind %s is not training",
                   fjKindName(job->params.kind));
  std::lock_guard<std::mutex> lock(job->mutex);
  if (job->gpu) {
    // Evaluate the device's parameters with the CPU reference.
    std::vector<float> parameters;
    const pfResult_t read = job->gpu->read_parameters(&parameters);
    if (read != pfSuccess) return read;
    if (!job->trainer->set_parameters(parameters))
      return fj_fail(pfErrorInternal, "fjJobEvaluationLoss: device returned %zu parameters",
                     parameters.size());
  }
  *loss = job->trainer->evaluation_loss();
  return pfSuccess;
}

pfResult_t fjJobParameterCount(fjJob_t job, size_t* count) {
  t_last_error.clear();
  if (!job || !count)
    return fj_fail(pfErrorInvalidArgument, "fjJobParameterCount: %s is NULL", job ? "count" : "job");
  if (job->params.kind != fjTraining)
    return fj_fail(pfErrorInvalidArgument, "fjJobParameterCount: job kind %s is not training",
                   fjKindName(job->params.kind));
  *count = job->model.trainer_parameters.size();
  return pfSuccess;
}

pfResult_t fjJobGetParameters(fjJob_t job, float* out, size_t count) {
  t_last_error.clear();
  if (!job || !out)
    return fj_fail(pfErrorInvalidArgument, "fjJobGetParameters: %s is NULL", job ? "out" : "job");
  if (job->params.kind != fjTraining)
    return fj_fail(pfErrorInvalidArgument, "fjJobGetParameters: job kind %s is not training",
                   fjKindName(job->params.kind));
  std::vector<float> parameters;
  if (job->gpu) {
    const pfResult_t read = job->gpu->read_parameters(&parameters);
    if (read != pfSuccess) return read;
  } else {
    std::lock_guard<std::mutex> lock(job->mutex);
    parameters = job->trainer->parameters();
  }
  if (count != parameters.size())
    return fj_fail(pfErrorInvalidArgument, "fjJobGetParameters: count %zu, the job has %zu",
                   count, parameters.size());
  std::copy(parameters.begin(), parameters.end(), out);
  return pfSuccess;
}

pfResult_t fjJobItemCost(fjJob_t job, double* item_cost_us) {
  t_last_error.clear();
  if (!job || !item_cost_us)
    return fj_fail(pfErrorInvalidArgument, "fjJobItemCost: %s is NULL",
                   job ? "item_cost_us" : "job");
  *item_cost_us = job->item_cost_us;
  return pfSuccess;
}

pfResult_t fjJobDestroy(fjJob_t job) {
  t_last_error.clear();
  delete job;  // NULL is a no-op, like free()
  return pfSuccess;
}

}  // extern "C"
