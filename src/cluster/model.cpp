// Cost model of a Megatron-style transformer training job. Formulas (docs/simulator.md):
//  forward FLOPs per layer and micro-batch   24 b s h^2 (1 + s / (6 h))  (h_ffn = 4h; general:
//                                            b s h (8 h + 4 h_ffn) + 4 b s^2 h)
//  output layer (logits)                     2 b s h V, on the last stage
//  backward                                  2 x forward (+1 forward with full recompute)
//  weight-gradient part of the backward      the GEMM part, 1 x forward GEMM FLOPs (ZB-H1)
//  parameters per layer                      12 h^2 + 13 h (h_ffn = 4h)
//  weights+grads / optimizer bytes per param 4 / 12 (mixed-precision Adam: 16 bytes)
//  activations per layer (Korthikanti 2022)  s b h (10 + 24/t + 5 a s / (h t)), /t with SP, etc.
//  TP all-reduces                            2 per layer per pass of b s h * 2 bytes
//  p2p message                               b s h * 2 / t bytes
//  DP all-reduce                             ring over DP of params/GPU * grad bytes
#include "cluster/model.hpp"

#include <algorithm>
#include <cmath>

#include "cluster/checks.hpp"
#include "common/error.hpp"

namespace pipefill::cluster {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kBytesPerParamWeightsGrads = 4.0;  // bf16 weight + bf16 gradient
constexpr double kBytesPerParamOptimizer = 12.0;    // fp32 master weight + Adam m + v

using Lim = TrainingLimits;

// Model chunks per stage the spec's schedule runs.
int chunks_of(const TrainingSpec& spec) {
  if (spec.custom_schedule) return spec.custom_schedule->chunks;
  return schedule::chunks_for(spec.schedule, spec.parallel.chunks);
}

pfResult_t validate(const TrainingSpec& spec) {
  using checks::int_in;
  using checks::real_in;
  const auto& m = spec.model;
  const auto& p = spec.parallel;
  const auto& g = spec.gpu;
  const auto& n = spec.network;
  PF_TRY(int_in("model.layers", m.layers, 1, Lim::kMaxLayers));
  PF_TRY(int_in("model.hidden", m.hidden, 1, Lim::kMaxHidden));
  if (m.heads < 1 || m.heads > m.hidden || m.hidden % m.heads != 0)
    return fail(pfErrorInvalidArgument, "model.heads must be >= 1 and divide model.hidden ({}), got {}", m.hidden, m.heads);
  PF_TRY(int_in("model.sequence", m.sequence, 1, Lim::kMaxSequence));
  PF_TRY(int_in("model.vocabulary", m.vocabulary, 1, Lim::kMaxVocabulary));
  PF_TRY(int_in("model.ffn_hidden", m.ffn_hidden, 0, Lim::kMaxFfnHidden));
  PF_TRY(int_in("parallelism.tensor", p.tensor, 1, Lim::kMaxTensor));
  if (m.heads % p.tensor != 0)
    return fail(pfErrorInvalidArgument, "parallelism.tensor ({}) must divide model.heads ({})", p.tensor, m.heads);
  if (p.pipeline < 1) return fail(pfErrorInvalidArgument, "parallelism.pipeline must be >= 1, got {}", p.pipeline);
  if (p.pipeline > m.layers)
    return fail(pfErrorInvalidArgument, "parallelism.pipeline ({}) exceeds model.layers ({})", p.pipeline, m.layers);
  PF_TRY(int_in("parallelism.data", p.data, 1, Lim::kMaxData));
  PF_TRY(int_in("parallelism.micro_batch", p.micro_batch, 1, Lim::kMaxMicroBatch));
  if (p.global_batch < 1)
    return fail(pfErrorInvalidArgument, "parallelism.global_batch must be >= 1, got {}", p.global_batch);
  long long replica = 0, gpus = 0, per_step = 0;
  if (!checks::mul(p.tensor, p.pipeline, &replica) || !checks::mul(replica, p.data, &gpus) || gpus > Lim::kMaxGpus)
    return fail(pfErrorInvalidArgument,
                "parallelism.tensor ({}) x parallelism.pipeline ({}) x parallelism.data ({}) GPUs exceed {}", p.tensor,
                p.pipeline, p.data, Lim::kMaxGpus);
  checks::mul(p.data, p.micro_batch, &per_step);  // both <= 2^30: fits
  if (p.global_batch % per_step != 0)
    return fail(pfErrorInvalidArgument,
                "parallelism.global_batch ({}) must be a multiple of parallelism.data ({}) x parallelism.micro_batch ({})",
                p.global_batch, p.data, p.micro_batch);
  const int chunks = chunks_of(spec);
  if (!spec.custom_schedule && chunks != 1) PF_TRY(int_in("parallelism.chunks", chunks, 1, Lim::kMaxChunks));
  if (!spec.custom_schedule && spec.schedule == schedule::ScheduleKind::Interleaved1F1B && chunks < 2)
    return fail(pfErrorInvalidArgument, "parallelism.chunks must be >= 2 for interleaved, got {}", chunks);
  if (chunks > 1) {
    long long virtual_stages = 0;
    if (!checks::mul(p.pipeline, chunks, &virtual_stages) || m.layers % virtual_stages != 0)
      return fail(pfErrorInvalidArgument,
                  "{} needs model.layers ({}) to be a multiple of parallelism.pipeline ({}) x parallelism.chunks ({})",
                  spec.custom_schedule ? "the schedule CSV" : schedule::schedule_kind_name(spec.schedule), m.layers,
                  p.pipeline, chunks);
  }
  PF_TRY(int_in("parallelism.microbatch_group_size", p.microbatch_group_size, 0, Lim::kMaxMicroBatch));
  PF_TRY(real_in("gpu.peak_tflops", g.peak_tflops, Lim::kMinRate, Lim::kMaxTflops));
  PF_TRY(real_in("gpu.achieved_fraction", g.achieved_fraction, Lim::kMinRate, 1.0));
  PF_TRY(real_in("gpu.memory_gib", g.memory_gib, 0, Lim::kMaxMemoryGib, true));
  if (!std::isfinite(g.memory_reserve_gib) || g.memory_reserve_gib < 0 || g.memory_reserve_gib >= g.memory_gib)
    return fail(pfErrorInvalidArgument, "gpu.memory_reserve_gib must be in [0, gpu.memory_gib), got {}",
                g.memory_reserve_gib);
  PF_TRY(real_in("gpu.memory_bandwidth_gbps", g.memory_bandwidth_gbps, Lim::kMinRate, Lim::kMaxGbps));
  PF_TRY(int_in("gpu.sm_count", g.sm_count, 1, Lim::kMaxSmCount));
  PF_TRY(int_in("network.gpus_per_node", n.gpus_per_node, 1, Lim::kMaxGpusPerNode));
  PF_TRY(real_in("network.intra_node_gbps", n.intra_node_gbps, Lim::kMinRate, Lim::kMaxGbps));
  PF_TRY(real_in("network.inter_node_gbps", n.inter_node_gbps, Lim::kMinRate, Lim::kMaxGbps));
  PF_TRY(real_in("network.intra_node_latency_us", n.intra_node_latency_us, 0, Lim::kMaxLatencyUs));
  PF_TRY(real_in("network.inter_node_latency_us", n.inter_node_latency_us, 0, Lim::kMaxLatencyUs));
  PF_TRY(int_in("weight_grad_bytes", spec.weight_grad_bytes, 1, 8));
  return pfSuccess;
}

// GB/s to bytes per µs.
double bytes_per_us(double gbps) { return gbps * 1e3; }

}  // namespace

double ring_allreduce_us(double bytes, int ranks, double bw_bytes_per_us, double latency_us) {
  if (ranks <= 1 || bytes <= 0.0) return 0.0;
  const double n = ranks;
  return 2.0 * (n - 1.0) / n * bytes / bw_bytes_per_us + 2.0 * (n - 1.0) * latency_us;
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "unknown";
}

bool parse_recompute(const std::string& text, Recompute* out) {
  if (text == "none") *out = Recompute::None;
  else if (text == "selective") *out = Recompute::Selective;
  else if (text == "full") *out = Recompute::Full;
  else return false;
  return true;
}

pfResult_t derive_costs(const TrainingSpec& spec, DerivedCosts* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "derive_costs: out must not be null");
  PF_TRY(validate(spec));
  const auto& m = spec.model;
  const auto& par = spec.parallel;
  const double b = par.micro_batch, s = m.sequence, h = m.hidden, a = m.heads, V = m.vocabulary;
  const double f = m.ffn_hidden > 0 ? m.ffn_hidden : 4.0 * h;
  const double t = par.tensor;
  const int p = par.pipeline;

  DerivedCosts c;
  c.gpus = static_cast<int>(static_cast<long long>(par.tensor) * par.pipeline * par.data);  // <= INT_MAX (validate)
  c.microbatches = static_cast<int>(par.global_batch / (static_cast<long long>(par.data) * par.micro_batch));
  // GEMMs: QKV 6bsh^2, projection 2bsh^2, MLP 4bsh*f; attention scores+values 4bs^2h.
  // With f = 4h: 24 b s h^2 (1 + s / (6h)).
  c.layer_forward_flops = b * s * h * (8.0 * h + 4.0 * f) + 4.0 * b * s * s * h;
  c.logits_forward_flops = 2.0 * b * s * h * V;
  const double params_per_layer = 4.0 * h * h + 2.0 * h * f + 9.0 * h + f;  // 12h^2+13h for f=4h
  const double embedding_params = V * h + s * h;
  c.params_total = m.layers * params_per_layer + embedding_params;
  c.achieved_flops_per_us = spec.gpu.peak_tflops * 1e12 * spec.gpu.achieved_fraction / 1e6;

  // Activations per layer per micro-batch (Korthikanti et al. 2022, Table 2), per GPU.
  const double attn = 5.0 * a * s / h;
  double act;
  switch (par.recompute) {
    case Recompute::None:
      act = par.sequence_parallel ? s * b * h * (34.0 + attn) / t : s * b * h * (10.0 + 24.0 / t + attn / t);
      break;
    case Recompute::Selective:
      act = par.sequence_parallel ? s * b * h * 34.0 / t : s * b * h * (10.0 + 24.0 / t);
      break;
    case Recompute::Full:
    default:
      act = 2.0 * s * b * h / (par.sequence_parallel ? t : 1.0);  // only the layer input
      break;
  }
  c.layer_activation_bytes = act;

  // Layers: evenly, the remainder to the first stages (the last stage also holds the logits).
  c.layers_per_stage.assign(p, m.layers / p);
  for (int i = 0; i < m.layers % p; ++i) ++c.layers_per_stage[i];
  // The embedding lives with virtual stage 0, the output layer with the last virtual stage:
  // stage 0 and p-1 in the looped placement, both on stage 0 in the V (ZB-V, DualPipeV).
  const int virtual_stages = p * chunks_of(spec);
  int embed_stage = 0, logits_stage = p - 1;
  if (spec.custom_schedule) {
    embed_stage = spec.custom_schedule->stage_of_virtual.front();
    logits_stage = spec.custom_schedule->stage_of_virtual.back();
  } else {
    const schedule::PlacementStyle style = schedule::placement_style(spec.schedule);
    embed_stage = schedule::stage_of_virtual(style, p, 0);
    logits_stage = schedule::stage_of_virtual(style, p, virtual_stages - 1);
  }
  c.logits_stage = logits_stage;

  // Network placement (Megatron rank order: TP fastest, then DP, then PP): pipeline neighbours
  // are TP*DP ranks apart, DP peers TP ranks apart.
  const auto& net = spec.network;
  const bool tp_intra = par.tensor <= net.gpus_per_node;
  const double tp_bw = bytes_per_us(tp_intra ? net.intra_node_gbps : net.inter_node_gbps);
  const double tp_lat = tp_intra ? net.intra_node_latency_us : net.inter_node_latency_us;
  c.p2p_inter_node = static_cast<long long>(par.tensor) * par.data >= net.gpus_per_node;
  c.p2p_bytes_per_us = bytes_per_us(c.p2p_inter_node ? net.inter_node_gbps : net.intra_node_gbps);
  c.p2p_latency_us = c.p2p_inter_node ? net.inter_node_latency_us : net.intra_node_latency_us;
  c.p2p_message_bytes = b * s * h * 2.0 / t;
  const bool dp_inter = static_cast<long long>(par.tensor) * par.data > net.gpus_per_node;
  const double dp_bw = bytes_per_us(dp_inter ? net.inter_node_gbps : net.intra_node_gbps);
  const double dp_lat = dp_inter ? net.inter_node_latency_us : net.intra_node_latency_us;
  c.dp_allreduce_latency_us = par.data > 1 ? 2.0 * (par.data - 1) * dp_lat : 0.0;

  // TP: 2 all-reduces (or reduce-scatter + all-gather with SP: same bytes) per layer per pass.
  const double tp_message = b * s * h * 2.0;
  const double tp_allreduce = ring_allreduce_us(tp_message, par.tensor, tp_bw, tp_lat);

  c.params_per_gpu.resize(p);
  c.forward_flops_per_gpu.resize(p);
  c.tp_comm_us_per_pass.resize(p);
  for (int st = 0; st < p; ++st) {
    const int L = c.layers_per_stage[st];
    double params = L * params_per_layer;
    double flops = L * c.layer_forward_flops;
    if (st == embed_stage) params += embedding_params;  // embedding lookup: negligible FLOPs
    if (st == logits_stage) {
      flops += c.logits_forward_flops;
      if (logits_stage != embed_stage) params += V * h;  // untied output layer copy on another stage
    }
    c.params_per_gpu[st] = params / t;
    c.forward_flops_per_gpu[st] = flops / t;
    c.tp_comm_us_per_pass[st] = 2.0 * L * tp_allreduce;
    const double grad_bytes = c.params_per_gpu[st] * spec.weight_grad_bytes;
    c.dp_allreduce_us = std::max(c.dp_allreduce_us, ring_allreduce_us(grad_bytes, par.data, dp_bw, dp_lat));
    // Optimizer step: memory-bound, reads and writes 16 bytes of state per parameter (sharded
    // over DP with the distributed optimizer).
    const double opt_params = c.params_per_gpu[st] / (par.distributed_optimizer ? par.data : 1);
    const double opt_us = opt_params * 2.0 * (kBytesPerParamWeightsGrads + kBytesPerParamOptimizer) /
                          bytes_per_us(spec.gpu.memory_bandwidth_gbps);
    c.optimizer_us = std::max(c.optimizer_us, opt_us);
  }
  c.model_flops_per_iteration = 3.0 * par.global_batch / par.micro_batch *
                                (m.layers * c.layer_forward_flops + c.logits_forward_flops);
  *out = std::move(c);
  return pfSuccess;
}

pfResult_t build_schedule_spec(const TrainingSpec& spec, schedule::ScheduleSpec* out, DerivedCosts* costs_out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "build_schedule_spec: out must not be null");
  DerivedCosts c;
  PF_TRY(derive_costs(spec, &c));
  const auto& par = spec.parallel;
  const auto& m = spec.model;
  const double b = par.micro_batch, s = m.sequence, h = m.hidden;
  const double f = m.ffn_hidden > 0 ? m.ffn_hidden : 4.0 * h;
  const int p = par.pipeline;
  const double rate = c.achieved_flops_per_us;

  schedule::ScheduleSpec sp;
  if (spec.custom_schedule) {
    const schedule::CustomSchedule& cs = *spec.custom_schedule;
    const std::string& src = spec.custom_schedule_source.empty() ? cs.source : spec.custom_schedule_source;
    if (cs.stages != p)
      return fail(pfErrorInvalidArgument, "schedule_csv '{}' has {} ranks but parallelism.pipeline is {}", src, cs.stages, p);
    if (cs.microbatches != c.microbatches)
      return fail(pfErrorInvalidArgument,
                  "schedule_csv '{}' runs {} micro-batches but parallelism.global_batch ({}) / (parallelism.data ({}) x "
                  "parallelism.micro_batch ({})) = {}", src, cs.microbatches, par.global_batch, par.data,
                  par.micro_batch, c.microbatches);
    sp.kind = schedule::ScheduleKind::Custom;
    sp.custom = spec.custom_schedule;
    sp.chunks = cs.chunks;
  } else {
    sp.kind = spec.schedule;
    sp.chunks = chunks_of(spec);
    if (spec.schedule == schedule::ScheduleKind::Interleaved1F1B || spec.schedule == schedule::ScheduleKind::InterleavedZB)
      sp.microbatch_group_size = par.microbatch_group_size;
  }
  sp.stages = p;
  sp.microbatches = c.microbatches;
  sp.p2p_latency_us = p > 1 ? c.p2p_latency_us : 0.0;
  sp.p2p_bytes_per_us = c.p2p_bytes_per_us;
  PF_TRY(checks::to_bytes(c.p2p_message_bytes, "the p2p message (parallelism.micro_batch x model.sequence x model.hidden x 2 / parallelism.tensor)", &sp.p2p_message_bytes));
  sp.allreduce_us = c.dp_allreduce_us;
  sp.optimizer_us = c.optimizer_us;
  const double usable = (spec.gpu.memory_gib - spec.gpu.memory_reserve_gib) * kGiB;
  PF_TRY(checks::to_bytes(usable, "gpu.memory_gib - gpu.memory_reserve_gib", &sp.device_memory_bytes));
  sp.costs.resize(p);
  for (int st = 0; st < p; ++st) {
    schedule::StageCosts& sc = sp.costs[st];
    const double fwd_compute = c.forward_flops_per_gpu[st] / rate;
    const double tp = c.tp_comm_us_per_pass[st];
    const double recompute = par.recompute == Recompute::Full ? fwd_compute + tp : 0.0;
    sc.forward_us = fwd_compute + tp;
    sc.backward_us = 2.0 * fwd_compute + tp + recompute;
    // Weight gradients: one more pass over the GEMMs (same FLOPs as their forward).
    double wflops = c.layers_per_stage[st] * b * s * h * (8.0 * h + 4.0 * f);
    if (st == c.logits_stage) wflops += c.logits_forward_flops;
    sc.weight_us = wflops / par.tensor / rate;
    const std::string where = fmt::format("stage {}'s ", st);
    PF_TRY(checks::to_bytes(c.params_per_gpu[st] * kBytesPerParamWeightsGrads,
                            where + "weights (model.layers, model.hidden, model.vocabulary / parallelism.pipeline, parallelism.tensor)",
                            &sc.weight_bytes));
    const double opt_share = par.distributed_optimizer ? 1.0 / par.data : 1.0;
    PF_TRY(checks::to_bytes(c.params_per_gpu[st] * kBytesPerParamOptimizer * opt_share,
                            where + "optimizer state (model.layers, model.hidden, model.vocabulary / parallelism.pipeline, parallelism.tensor)",
                            &sc.optimizer_bytes));
    double act = c.layers_per_stage[st] * c.layer_activation_bytes;
    if (st == c.logits_stage) act += 4.0 * b * s * m.vocabulary / par.tensor;  // fp32 logits for the loss
    PF_TRY(checks::to_bytes(act / sp.chunks,
                            where + "activations per micro-batch (parallelism.micro_batch, model.sequence, model.hidden, model.heads, model.vocabulary / parallelism.tensor)",
                            &sc.activation_bytes));
    if (!std::isfinite(sc.forward_us) || !std::isfinite(sc.backward_us) || !std::isfinite(sc.weight_us))
      return fail(pfErrorInvalidArgument, "stage {}'s op times are not finite (model sizes / gpu.peak_tflops x gpu.achieved_fraction)", st);
  }
  *out = std::move(sp);
  if (costs_out != nullptr) *costs_out = std::move(c);
  return pfSuccess;
}

}  // namespace pipefill::cluster
