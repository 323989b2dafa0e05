// Cost model on small hand-computed cases.
#include "cluster/model.hpp"

#include <gtest/gtest.h>

#include "common/error.hpp"

namespace pipefill::cluster {
namespace {

TrainingSpec tiny() {
  TrainingSpec t;
  t.model.layers = 4;
  t.model.hidden = 64;
  t.model.heads = 4;
  t.model.sequence = 32;
  t.model.vocabulary = 100;
  t.parallel.tensor = 1;
  t.parallel.pipeline = 2;
  t.parallel.data = 2;
  t.parallel.micro_batch = 2;
  t.parallel.global_batch = 16;
  t.parallel.sequence_parallel = false;
  t.parallel.recompute = Recompute::None;
  t.gpu.peak_tflops = 100.0;      // 1e14 FLOP/s
  t.gpu.achieved_fraction = 0.5;  // 5e7 FLOP/us
  t.gpu.memory_gib = 1.0;
  t.gpu.memory_reserve_gib = 0.0;
  t.gpu.memory_bandwidth_gbps = 1000.0;  // 1e6 B/us
  t.network.gpus_per_node = 8;
  t.network.intra_node_gbps = 100.0;     // 1e5 B/us
  t.network.intra_node_latency_us = 2.0;
  t.network.inter_node_gbps = 10.0;      // 1e4 B/us
  t.network.inter_node_latency_us = 5.0;
  return t;
}

TEST(Model, FlopsParamsAndMicrobatches) {
  DerivedCosts c;
  ASSERT_EQ(derive_costs(tiny(), &c), pfSuccess) << last_error_message();
  const double b = 2, s = 32, h = 64, V = 100;
  EXPECT_EQ(c.gpus, 4);
  EXPECT_EQ(c.microbatches, 4);  // 16 / (2 * 2)
  EXPECT_DOUBLE_EQ(c.layer_forward_flops, 24 * b * s * h * h * (1 + s / (6 * h)));
  EXPECT_DOUBLE_EQ(c.logits_forward_flops, 2 * b * s * h * V);
  EXPECT_DOUBLE_EQ(c.params_total, 4 * (12 * h * h + 13 * h) + V * h + s * h);
  ASSERT_EQ(c.layers_per_stage, (std::vector<int>{2, 2}));
  EXPECT_DOUBLE_EQ(c.forward_flops_per_gpu[0], 2 * c.layer_forward_flops);
  EXPECT_DOUBLE_EQ(c.forward_flops_per_gpu[1], 2 * c.layer_forward_flops + c.logits_forward_flops);
  EXPECT_DOUBLE_EQ(c.params_per_gpu[0], 2 * (12 * h * h + 13 * h) + V * h + s * h);
  EXPECT_DOUBLE_EQ(c.params_per_gpu[1], 2 * (12 * h * h + 13 * h) + V * h);
  // Activations without SP / recompute, t = 1: s b h (10 + 24 + 5 a s / h).
  EXPECT_DOUBLE_EQ(c.layer_activation_bytes, s * b * h * (34 + 5 * 4 * s / h));
  EXPECT_DOUBLE_EQ(c.model_flops_per_iteration, 3 * 8 * (4 * c.layer_forward_flops + c.logits_forward_flops));
}

TEST(Model, CommunicationPlacementAndRing) {
  EXPECT_DOUBLE_EQ(ring_allreduce_us(1000, 1, 10, 1), 0.0);
  EXPECT_DOUBLE_EQ(ring_allreduce_us(1000, 4, 10, 1), 2 * 0.75 * 100 + 6 * 1);
  DerivedCosts c;
  TrainingSpec t = tiny();
  ASSERT_EQ(derive_costs(t, &c), pfSuccess);
  // TP*DP = 2 < 8 GPUs per node: pipeline neighbours share a node.
  EXPECT_FALSE(c.p2p_inter_node);
  EXPECT_DOUBLE_EQ(c.p2p_message_bytes, 2 * 32 * 64 * 2.0);
  EXPECT_DOUBLE_EQ(c.p2p_bytes_per_us, 1e5);
  EXPECT_DOUBLE_EQ(c.p2p_latency_us, 2.0);
  // DP all-reduce: ring over 2 ranks (same node) of the larger stage's bf16 gradients.
  EXPECT_DOUBLE_EQ(c.dp_allreduce_us, ring_allreduce_us(c.params_per_gpu[0] * 2, 2, 1e5, 2.0));
  // Optimizer: 32 bytes moved per parameter at 1e6 B/us.
  EXPECT_DOUBLE_EQ(c.optimizer_us, c.params_per_gpu[0] * 32 / 1e6);
  t.network.gpus_per_node = 2;
  ASSERT_EQ(derive_costs(t, &c), pfSuccess);
  EXPECT_TRUE(c.p2p_inter_node);
  EXPECT_DOUBLE_EQ(c.p2p_bytes_per_us, 1e4);
}

TEST(Model, TensorParallelSplitsFlopsAndAddsAllReduces) {
  TrainingSpec t = tiny();
  t.parallel.tensor = 2;
  t.parallel.sequence_parallel = true;
  DerivedCosts c;
  ASSERT_EQ(derive_costs(t, &c), pfSuccess) << last_error_message();
  const double b = 2, s = 32, h = 64;
  EXPECT_DOUBLE_EQ(c.forward_flops_per_gpu[0], 2 * c.layer_forward_flops / 2);
  // Two all-reduces of b s h * 2 bytes per layer per pass over 2 ranks within a node.
  EXPECT_DOUBLE_EQ(c.tp_comm_us_per_pass[0], 2 * 2 * ring_allreduce_us(b * s * h * 2, 2, 1e5, 2.0));
  // SP without recompute: s b h (34 + 5 a s / h) / t.
  EXPECT_DOUBLE_EQ(c.layer_activation_bytes, s * b * h * (34 + 5 * 4 * s / h) / 2);
  EXPECT_DOUBLE_EQ(c.p2p_message_bytes, b * s * h * 2 / 2);
}

TEST(Model, ScheduleSpecCostsAndMemory) {
  TrainingSpec t = tiny();
  schedule::ScheduleSpec sp;
  DerivedCosts c;
  ASSERT_EQ(build_schedule_spec(t, &sp, &c), pfSuccess) << last_error_message();
  const double rate = 5e7;  // FLOP per us
  ASSERT_EQ(sp.costs.size(), 2u);
  EXPECT_EQ(sp.microbatches, 4);
  EXPECT_EQ(sp.stages, 2);
  EXPECT_DOUBLE_EQ(sp.costs[0].forward_us, c.forward_flops_per_gpu[0] / rate);
  EXPECT_DOUBLE_EQ(sp.costs[0].backward_us, 2 * c.forward_flops_per_gpu[0] / rate);
  EXPECT_DOUBLE_EQ(sp.costs[1].forward_us, c.forward_flops_per_gpu[1] / rate);
  EXPECT_EQ(sp.costs[0].weight_bytes, static_cast<size_t>(c.params_per_gpu[0] * 4));
  EXPECT_EQ(sp.costs[0].optimizer_bytes, static_cast<size_t>(c.params_per_gpu[0] * 12));
  EXPECT_EQ(sp.costs[0].activation_bytes, static_cast<size_t>(2 * c.layer_activation_bytes));
  // Last stage also keeps fp32 logits: 4 b s V / t.
  EXPECT_EQ(sp.costs[1].activation_bytes, static_cast<size_t>(2 * c.layer_activation_bytes + 4.0 * 2 * 32 * 100));
  EXPECT_EQ(sp.device_memory_bytes, size_t{1} << 30);
  EXPECT_DOUBLE_EQ(sp.allreduce_us, c.dp_allreduce_us);
  EXPECT_DOUBLE_EQ(sp.p2p_latency_us, 2.0);
  // Full recompute adds one forward to the backward.
  t.parallel.recompute = Recompute::Full;
  ASSERT_EQ(build_schedule_spec(t, &sp, &c), pfSuccess);
  EXPECT_DOUBLE_EQ(sp.costs[0].backward_us, 3 * c.forward_flops_per_gpu[0] / rate);
  EXPECT_DOUBLE_EQ(c.layer_activation_bytes, 2.0 * 32 * 2 * 64);
  // Distributed optimizer shards the optimizer state over DP.
  t.parallel.distributed_optimizer = true;
  ASSERT_EQ(build_schedule_spec(t, &sp, &c), pfSuccess);
  EXPECT_EQ(sp.costs[0].optimizer_bytes, static_cast<size_t>(c.params_per_gpu[0] * 12 / 2));
}

TEST(Model, InvalidSpecsNameTheValue) {
  struct Case {
    void (*mutate)(TrainingSpec&);
    const char* needle;
  };
  const Case cases[] = {
      {[](TrainingSpec& t) { t.parallel.global_batch = 10; }, "parallelism.global_batch (10) must be a multiple of parallelism.data (2) x parallelism.micro_batch (2)"},
      {[](TrainingSpec& t) { t.parallel.tensor = 3; }, "parallelism.tensor (3) must divide model.heads (4)"},
      {[](TrainingSpec& t) { t.model.layers = 0; }, "model.layers must be in [1, 1048576], got 0"},
      {[](TrainingSpec& t) { t.parallel.pipeline = 5; }, "parallelism.pipeline (5) exceeds model.layers (4)"},
      {[](TrainingSpec& t) { t.gpu.achieved_fraction = 1.5; }, "gpu.achieved_fraction must be in [0.001, 1], got 1.5"},
      {[](TrainingSpec& t) { t.gpu.memory_reserve_gib = 2; }, "gpu.memory_reserve_gib must be in [0, gpu.memory_gib), got 2"},
      {[](TrainingSpec& t) { t.network.inter_node_gbps = -1; }, "network.inter_node_gbps must be in [0.001, 10000000], got -1"},
      {[](TrainingSpec& t) {
         t.schedule = schedule::ScheduleKind::Interleaved1F1B;
         t.parallel.chunks = 3;
       },
       "interleaved needs model.layers (4) to be a multiple of parallelism.pipeline (2) x parallelism.chunks (3)"},
  };
  for (const auto& c : cases) {
    TrainingSpec t = tiny();
    c.mutate(t);
    DerivedCosts d;
    EXPECT_EQ(derive_costs(t, &d), pfErrorInvalidArgument);
    EXPECT_NE(last_error_message().find(c.needle), std::string::npos) << last_error_message() << " / " << c.needle;
  }
}

TEST(Model, RecomputeNames) {
  Recompute r;
  for (Recompute x : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    ASSERT_TRUE(parse_recompute(recompute_name(x), &r));
    EXPECT_EQ(r, x);
  }
  EXPECT_FALSE(parse_recompute("some", &r));
}

}  // namespace
}  // namespace pipefill::cluster
