// Training-job description (transformer, parallelism, GPU, network) and its cost model: FLOP
// counts, memory, communication, and the ScheduleSpec it implies. Every formula is written out
// in docs/simulator.md; units are µs, bytes and FLOP throughout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipefill/pipefill.h"
#include "schedule/schedule.hpp"

namespace pipefill::cluster {

struct TransformerSpec {
  std::string name = "model";
  int layers = 24;
  int hidden = 1024;
  int heads = 16;
  int sequence = 2048;
  int vocabulary = 51200;
  int ffn_hidden = 0;  // 0: 4 * hidden
};

enum class Recompute { None, Selective, Full };

struct ParallelSpec {
  int tensor = 1;     // TP
  int pipeline = 1;   // PP (= stages p)
  int data = 1;       // DP
  int micro_batch = 1;     // b (sequences per micro-batch)
  int global_batch = 8;    // sequences per iteration; m = global / (DP * b)
  int chunks = 2;          // v for the looped multi-chunk schedules (interleaved, interleaved-zb,
                           // looped-bfs); ZB-V and DualPipeV run 2; the others 1
  int microbatch_group_size = 0;  // interleaved kinds: Megatron's microbatch_group_size_per_vp_stage;
                                  // 0: PyTorch's rounds rule (docs/simulator.md 1.1); ignored by the others
  bool sequence_parallel = true;
  Recompute recompute = Recompute::Selective;
  bool distributed_optimizer = false;  // ZeRO-1: optimizer state sharded over DP
};

struct GpuSpec {
  std::string name = "H100-SXM-80GB";
  double peak_tflops = 989.0;        // dense BF16 tensor-core peak
  double achieved_fraction = 0.5;    // of peak, for the training job's GEMM-dominated layers
  double memory_gib = 80.0;
  double memory_reserve_gib = 4.0;   // CUDA context, NCCL buffers, allocator fragmentation
  double memory_bandwidth_gbps = 3350.0;  // HBM, GB/s (1e9 B/s)
  int sm_count = 132;
};

struct NetworkSpec {
  int gpus_per_node = 8;
  double intra_node_gbps = 450.0;     // NVLink per GPU per direction, GB/s
  double intra_node_latency_us = 3.0;
  double inter_node_gbps = 50.0;      // InfiniBand per GPU (400 Gb/s), GB/s
  double inter_node_latency_us = 5.0;
};

struct TrainingSpec {
  TransformerSpec model;
  ParallelSpec parallel;
  GpuSpec gpu;
  NetworkSpec network;
  schedule::ScheduleKind schedule = schedule::ScheduleKind::OneFOneB;
  int weight_grad_bytes = 2;   // bytes per gradient element in the DP all-reduce (bf16)
  // A user-supplied op order (PyTorch CSV, "schedule_csv" / --schedule-csv): replaces
  // `schedule`; its ranks must equal parallelism.pipeline and its micro-batches m.
  std::shared_ptr<const schedule::CustomSchedule> custom_schedule;
  std::string custom_schedule_source;  // file name, for messages
};

// Value ranges every TrainingSpec field is checked against (docs/simulator.md section 5): wide
// enough for any real job, narrow enough that no derived quantity overflows.
struct TrainingLimits {
  static constexpr long long kMaxLayers = 1 << 20;
  static constexpr long long kMaxHidden = 1 << 20;
  static constexpr long long kMaxSequence = 1 << 24;
  static constexpr long long kMaxVocabulary = 1 << 26;
  static constexpr long long kMaxFfnHidden = 1 << 22;
  static constexpr long long kMaxTensor = 1 << 20;
  static constexpr long long kMaxData = 1 << 30;
  static constexpr long long kMaxMicroBatch = 1 << 30;
  static constexpr long long kMaxChunks = 1 << 20;
  static constexpr long long kMaxGpus = 2147483647;  // the GPU count is an int
  static constexpr double kMaxTflops = 1e6;
  static constexpr double kMinRate = 1e-3;           // TFLOP/s, fraction, GB/s lower ends
  static constexpr double kMaxMemoryGib = 1 << 20;
  static constexpr double kMaxGbps = 1e7;
  static constexpr double kMaxLatencyUs = 1e7;
  static constexpr long long kMaxSmCount = 1 << 20;
  static constexpr long long kMaxGpusPerNode = 1 << 20;
};

// Everything derived from a TrainingSpec; per GPU (one TP rank of a stage) unless stated.
struct DerivedCosts {
  int gpus = 0;                 // TP * PP * DP
  int microbatches = 0;         // m
  double params_total = 0.0;    // whole model
  std::vector<int> layers_per_stage;
  std::vector<double> params_per_gpu;       // per stage: that stage's parameters / TP
  std::vector<double> forward_flops_per_gpu;// per stage, one micro-batch (whole stage, all chunks)
  std::vector<double> tp_comm_us_per_pass;  // per stage: TP all-reduces of one forward (= of one backward)
  double layer_forward_flops = 0.0;         // one layer, one micro-batch, whole (un-split) layer
  double logits_forward_flops = 0.0;        // output layer, one micro-batch
  double layer_activation_bytes = 0.0;      // one layer, one micro-batch, per GPU
  double p2p_message_bytes = 0.0;
  double p2p_latency_us = 0.0;
  double p2p_bytes_per_us = 0.0;
  bool p2p_inter_node = false;
  double dp_allreduce_us = 0.0;             // max over stages
  double dp_allreduce_latency_us = 0.0;     // its latency part, 2 (d-1) x link latency (the rest is bandwidth)
  double optimizer_us = 0.0;                // max over stages
  double achieved_flops_per_us = 0.0;       // peak * fraction, in FLOP/µs
  double model_flops_per_iteration = 0.0;   // 3 x forward FLOPs of all micro-batches (no recompute), whole job
  int logits_stage = 0;                     // the stage holding the output layer (last virtual stage)
};

// Validates the spec (every bad value named in the message) and derives the costs.
pfResult_t derive_costs(const TrainingSpec& spec, DerivedCosts* out);
// Builds the schedule spec (per-stage costs, p2p, all-reduce, memory) for spec.schedule.
pfResult_t build_schedule_spec(const TrainingSpec& spec, schedule::ScheduleSpec* out,
                               DerivedCosts* costs = nullptr);

// Ring all-reduce of `bytes` over `ranks` ranks: 2 (n-1)/n * bytes / bandwidth + 2 (n-1) * latency.
double ring_allreduce_us(double bytes, int ranks, double bytes_per_us, double latency_us);

const char* recompute_name(Recompute r);
bool parse_recompute(const std::string& text, Recompute* out);

}  // namespace pipefill::cluster
