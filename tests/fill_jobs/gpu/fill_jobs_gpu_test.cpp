// GPU vs CPU numerics of the example fill jobs, run through real PipeFill bubbles on the CUDA
// backend. Built only with CUDA (target pipefill_fill_jobs_gpu_tests, defined in
// examples/fill_jobs/CMakeLists.txt because it links the CUDA fill-job library); every test
// skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cupti_collector.hpp"
#include "fill_jobs.h"
#include "reference.hpp"

namespace {

#define ASSERT_PF(call) ASSERT_EQ((call), pfSuccess) << #call << ": " << pfGetLastErrorMessage()
#define ASSERT_FJ(call) ASSERT_EQ((call), pfSuccess) << #call << ": " << fjGetLastErrorMessage()

bool have_gpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

void CUDART_CB sleep_host(void* us) {
  std::this_thread::sleep_for(std::chrono::microseconds(reinterpret_cast<uintptr_t>(us)));
}

class GpuFill : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    pfConfig_t config = PF_CONFIG_INITIALIZER;
    config.backend = pfBackendCuda;
    config.arena_bytes = size_t{512} << 20;
    if (fill_streams_ > 0) config.fill_streams = fill_streams_;
    ASSERT_PF(pfRuntimeCreate(&config, &runtime_));
    ASSERT_PF(pfStreamCreateHighPriority(runtime_, &main_));
    ASSERT_PF(pfStreamCreateHighPriority(runtime_, &peer_));
    ASSERT_EQ(cudaEventCreateWithFlags(&arrived_, cudaEventDisableTiming), cudaSuccess);
  }
  void TearDown() override {
    if (job_) EXPECT_EQ(pfJobDestroy(job_), pfSuccess);
    if (fill_) fjJobDestroy(fill_);
    if (arrived_) cudaEventDestroy(arrived_);
    for (void* s : {main_, peer_})
      if (s) EXPECT_EQ(pfStreamDestroy(runtime_, s), pfSuccess);
    if (runtime_) EXPECT_EQ(pfRuntimeDestroy(runtime_), pfSuccess);
  }

  void attach(const fjParams_t& params) {
    ASSERT_FJ(fjJobCreate(&params, &fill_));
    pfJobDesc_t desc;
    ASSERT_FJ(fjJobGetDesc(fill_, &desc));
    ASSERT_PF(pfJobCreate(runtime_, &desc, &job_));
  }

  // A bubble of ~`us`: the "peer" stream is busy for that long (a host function), the main
  // stream waits on it between begin and end, as it would on a receive.
  void bubble(uint64_t us) {
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    hint.expected_duration_us = static_cast<double>(us);
    auto main = static_cast<cudaStream_t>(main_), peer = static_cast<cudaStream_t>(peer_);
    ASSERT_EQ(cudaLaunchHostFunc(peer, sleep_host, reinterpret_cast<void*>(us)), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(arrived_, peer), cudaSuccess);
    ASSERT_PF(pfBubbleBegin(runtime_, main_, &hint));
    ASSERT_EQ(cudaStreamWaitEvent(main, arrived_, 0), cudaSuccess);
    ASSERT_PF(pfBubbleEnd(runtime_, main_));
    ASSERT_PF(pfIterationEnd(runtime_));
  }

  void run_until_done(int max_bubbles) {
    pfJobInfo_t info{};
    for (int i = 0; i < max_bubbles; ++i) {
      bubble(2000);
      ASSERT_PF(pfRuntimeSynchronize(runtime_));
      ASSERT_PF(pfJobGetStatus(job_, &info));
      if (info.status == pfJobCompleted) return;
    }
    FAIL() << "job did not complete: " << info.items_completed << " items";
  }

  int fill_streams_ = 0;  // > 0: the runtime's fill_streams
  pfRuntime_t runtime_ = nullptr;
  void *main_ = nullptr, *peer_ = nullptr;
  cudaEvent_t arrived_ = nullptr;
  fjJob_t fill_ = nullptr;
  pfJob_t job_ = nullptr;
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::fabs(want[i]))) << "element " << i;
}

void check_mlp(fjJob_t fill, const fjParams_t& p) {
  const fill_jobs::MlpShape shape{p.input, p.hidden, p.output, p.rows};
  const auto weights = fill_jobs::MlpWeights::random(shape, p.seed);
  std::vector<float> x(p.rows * p.input), want(p.rows * p.output), hidden(p.rows * p.hidden),
      got(want.size());
  for (uint64_t item : {uint64_t{0}, uint64_t{1}, p.items / 2, p.items - 1}) {
    fill_jobs::mlp_item_input(shape, p.seed, item, x.data());
    fill_jobs::mlp_forward(weights, x.data(), p.rows, want.data(), hidden.data());
    ASSERT_EQ(fjJobGetOutput(fill, item, got.data(), got.size()), pfSuccess) << fjGetLastErrorMessage();
    expect_close(got, want, 1e-4);
  }
}

TEST_F(GpuFill, MlpTicketMatchesCpu) {
  fjParams_t p;
  ASSERT_FJ(fjParamsInit(&p, fjMlpInference, pfBackendCuda));
  p.items = 20000;
  attach(p);
  run_until_done(50);
  check_mlp(fill_, p);
}

TEST_F(GpuFill, MlpCublasMatchesCpu) {
  fjParams_t p;
  ASSERT_FJ(fjParamsInit(&p, fjMlpInference, pfBackendCuda));
  p.execution = fjExecOpaque;
  p.items = 20000;
  attach(p);
  run_until_done(50);
  check_mlp(fill_, p);
}

void check_encoder(fjJob_t fill, const fjParams_t& p) {
  const fill_jobs::EncoderShape shape{p.hidden, p.heads, p.ffn, p.seq};
  const auto weights = fill_jobs::EncoderWeights::random(shape, p.seed);
  fill_jobs::EncoderScratch scratch(shape);
  std::vector<float> x(p.seq * p.hidden), want(x.size()), got(x.size());
  for (uint64_t item : {uint64_t{0}, uint64_t{1}, p.items - 1}) {
    fill_jobs::encoder_item_input(shape, p.seed, item, x.data());
    fill_jobs::encoder_forward(weights, x.data(), want.data(), scratch);
    ASSERT_EQ(fjJobGetOutput(fill, item, got.data(), got.size()), pfSuccess) << fjGetLastErrorMessage();
    expect_close(got, want, 1e-3);
  }
}

TEST_F(GpuFill, EncoderTicketMatchesCpu) {
  fjParams_t p;
  ASSERT_FJ(fjParamsInit(&p, fjEncoderInference, pfBackendCuda));
  p.items = 2000;
  attach(p);
  run_until_done(100);
  check_encoder(fill_, p);
}

TEST_F(GpuFill, EncoderCublasMatchesCpu) {
  fjParams_t p;
  ASSERT_FJ(fjParamsInit(&p, fjEncoderInference, pfBackendCuda));
  p.execution = fjExecOpaque;
  p.items = 2000;
  attach(p);
  run_until_done(100);
  check_encoder(fill_, p);
}

TEST_F(GpuFill, TrainingMatchesCpuAndResumes) {
  fjParams_t p;
  ASSERT_FJ(fjParamsInit(&p, fjTraining, pfBackendCuda));
  p.items = 300;
  attach(p);
  run_until_done(200);
  fill_jobs::RegressionTrainer cpu(
      fill_jobs::TrainerShape{p.input, p.hidden, p.output, p.rows, p.learning_rate}, p.seed);
  const float initial = cpu.evaluation_loss();
  for (uint64_t s = 0; s < p.items; ++s) cpu.step(s);
  size_t count = 0;
  ASSERT_FJ(fjJobParameterCount(fill_, &count));
  std::vector<float> got(count);
  ASSERT_FJ(fjJobGetParameters(fill_, got.data(), count));
  expect_close(got, cpu.parameters(), 1e-3);
  double loss = 0;
  ASSERT_FJ(fjJobEvaluationLoss(fill_, &loss));
  EXPECT_LT(loss, 0.5 * initial);
}

// The runtime's warm-up launch (an empty slice on the fill stream, right after setup) must load
// every kernel a real slice uses into the stream's context, so that none loads inside a bubble:
// the kernels (CUPTI names) of a real slice must all have run during the warm-up, and the
// warm-up must leave the job's outputs untouched. Before, an opaque job's empty slice launched
// nothing and its cuBLAS kernels first met the fill stream inside a bubble.
class GpuFillWarmUp : public GpuFill {
 protected:
  void expect_warm_up_covers_a_slice(const fjParams_t& params, uint64_t slice_items) {
    std::unique_ptr<pipefill::cuda::ActivityCollector> collector;
    if (pipefill::cuda::start_cupti_collector([] { return 0.0; }, &collector) != pfSuccess)
      GTEST_SKIP() << "CUPTI unavailable: " << pfGetLastErrorMessage();
    attach(params);
    pfJobDesc_t desc;
    ASSERT_FJ(fjJobGetDesc(fill_, &desc));
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    uint64_t* words = nullptr;  // gate, cursor, budget for the ticket slice
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&words), 3 * sizeof(uint64_t)), cudaSuccess);
    ASSERT_EQ(cudaMemset(words, 0, 3 * sizeof(uint64_t)), cudaSuccess);
    const size_t out_count = params.kind == fjEncoderInference ? params.seq * params.hidden : params.rows * params.output;
    std::vector<float> before(out_count), after(out_count);
    if (params.kind != fjTraining) ASSERT_FJ(fjJobGetOutput(fill_, 0, before.data(), before.size()));
    auto kernels_of = [&](const pfSliceDesc_t& slice, std::set<std::string>* names) {
      std::vector<pipefill::ActivityRecord> records;
      ASSERT_EQ(collector->flush(&records), pfSuccess);  // drop what ran before
      ASSERT_EQ(desc.launch(desc.user, &slice, stream), pfSuccess) << fjGetLastErrorMessage();
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      records.clear();
      ASSERT_EQ(collector->flush(&records), pfSuccess);
      for (const auto& r : records)
        if (r.kind == pipefill::ActivityKind::Kernel || r.kind == pipefill::ActivityKind::Fill) names->insert(r.name);
    };
    pfSliceDesc_t warm{};
    warm.job = job_;
    warm.max_items = 0;
    warm.total_items = params.items;
    std::set<std::string> warm_kernels, slice_kernels;
    kernels_of(warm, &warm_kernels);
    if (HasFatalFailure()) return;
    if (params.kind != fjTraining) {
      ASSERT_FJ(fjJobGetOutput(fill_, 0, after.data(), after.size()));
      EXPECT_EQ(before, after) << "the warm-up launch wrote an output";
    }
    pfSliceDesc_t real = warm;
    real.bubble_id = 1;  // the gate (0) never reads as closed
    real.max_items = slice_items;
    real.max_blocks = 132;
    real.gate = &words[0];
    real.cursor = &words[1];
    real.budget_counter = &words[2];
    kernels_of(real, &slice_kernels);
    if (HasFatalFailure()) return;
    if (slice_kernels.empty()) GTEST_SKIP() << "CUPTI delivered no kernel record";
    for (const std::string& name : slice_kernels)
      EXPECT_TRUE(warm_kernels.count(name)) << name << " first ran in a real slice, not in the warm-up";
    cudaFree(words);
    cudaStreamDestroy(stream);
  }
};

TEST_F(GpuFillWarmUp, MlpCublas) {
  fjParams_t p;
  ASSERT_FJ(fjParamsInit(&p, fjMlpInference, pfBackendCuda));
  p.execution = fjExecOpaque;
  p.items = 20000;
  expect_warm_up_covers_a_slice(p, 256);  // one full chunk: the warm-up's shapes
}

TEST_F(GpuFillWarmUp, EncoderCublas) {
  fjParams_t p;
  ASSERT_FJ(fjParamsInit(&p, fjEncoderInference, pfBackendCuda));
  p.execution = fjExecOpaque;
  p.items = 2000;
  expect_warm_up_covers_a_slice(p, 64);
}

TEST_F(GpuFillWarmUp, MlpTicket) {
  fjParams_t p;
  ASSERT_FJ(fjParamsInit(&p, fjMlpInference, pfBackendCuda));
  p.items = 20000;
  expect_warm_up_covers_a_slice(p, 64);
}

TEST_F(GpuFillWarmUp, TrainingOpaque) {
  fjParams_t p;
  ASSERT_FJ(fjParamsInit(&p, fjTraining, pfBackendCuda));
  p.execution = fjExecOpaque;
  p.items = 300;
  expect_warm_up_covers_a_slice(p, 4);
}

// Issue 16 item 2: the cuBLAS jobs on a runtime with two fill streams. The warm-up runs on both
// streams at once; each stream gets its own cuBLAS handle with the arena workspace set after its
// stream (cublasSetStream resets it to cuBLAS's own pool, which grows with cudaMalloc). Outputs
// must match the CPU and no device memory may be allocated once the job is created.
class GpuFillTwoStreams : public GpuFill {
 protected:
  void SetUp() override {
    fill_streams_ = 2;
    GpuFill::SetUp();
  }
};

TEST_F(GpuFillTwoStreams, MlpCublasMatchesCpuWithoutAllocating) {
  fjParams_t p;
  ASSERT_FJ(fjParamsInit(&p, fjMlpInference, pfBackendCuda));
  p.execution = fjExecOpaque;
  p.items = 3000;
  attach(p);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  size_t free_before = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  run_until_done(400);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  size_t free_after = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_EQ(free_after, free_before) << "device memory was allocated while the job ran in bubbles";
  check_mlp(fill_, p);
}

TEST_F(GpuFillTwoStreams, EncoderCublasMatchesCpu) {
  fjParams_t p;
  ASSERT_FJ(fjParamsInit(&p, fjEncoderInference, pfBackendCuda));
  p.execution = fjExecOpaque;
  p.items = 300;
  attach(p);
  run_until_done(400);
  check_encoder(fill_, p);
}

}  // namespace
