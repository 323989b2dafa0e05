// The engine's GPU transports. Both run real stage compute: per transformer layer the bf16
// GEMMs of a layer through cuBLAS (QKV, attention scores and weighted sum as batched GEMMs per
// 128-wide head, output projection, FFN up and down: 24 b s h^2 (1 + s/6h) FLOPs, the count the
// simulated transport uses) plus elementwise kernels; a backward pass runs them twice.
//
//  - EmulatedTransport (one GPU): this GPU runs ONE stage for real (--emulate-stage, default
//    the middle of the pipeline). Its receives are spinning kernels (holding comm_sms blocks,
//    like NCCL's) on a flag in mapped pinned memory; a host timeline thread sets each flag when
//    the modelled peer stage would deliver (the no-fill schedule's send time + p2p latency,
//    counted from the moment the GPU starts the iteration). Its naive baseline (--naive) is the
//    simulated transport's: at each bubble begin, ungated work of the engine's item count at the
//    fill job's item cost on every SM at the main job's priority - here spin items in blocks
//    that each own an SM (the opt-in shared memory, as a GEMM tile would), one per SM, which
//    run to the end whatever the bubble does.
//  - NcclTransport (>= stages GPUs, one process, one host thread per GPU): ncclSend/ncclRecv on
//    separate send/receive streams, one communicator per direction (activations forward,
//    gradients backward) so the pairs never cross, and an all-rank communicator for the
//    end-of-iteration reduction.
//
// Status: compiled and linked in the CUDA build; NOT yet run on a GPU (none was available while
// it was written). See docs/integration.md.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#ifdef ENGINE_WITH_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "pipefill/device.cuh"
#include "transport.hpp"

namespace engine {
namespace {

// fmt's headers do not compile under nvcc: printf-style formatting in this file.
std::string runtime_format(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string runtime_format(const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  return buffer;
}

#define ENGINE_CUDA(call)                                                                   \
  do {                                                                                      \
    const cudaError_t engine_cuda_ = (call);                                                \
    if (engine_cuda_ != cudaSuccess)                                                        \
      return Status{pfErrorCudaFailure, runtime_format("%s failed: %s (%s:%d)", #call,         \
                                                    cudaGetErrorName(engine_cuda_),         \
                                                    __FILE__, __LINE__)};                   \
  } while (0)
#define ENGINE_CUBLAS(call)                                                                 \
  do {                                                                                      \
    const cublasStatus_t engine_blas_ = (call);                                             \
    if (engine_blas_ != CUBLAS_STATUS_SUCCESS)                                              \
      return Status{pfErrorCudaFailure, runtime_format("%s failed: cuBLAS status %d (%s:%d)",  \
                                                    #call, static_cast<int>(engine_blas_),  \
                                                    __FILE__, __LINE__)};                   \
  } while (0)
#define ENGINE_NCCL(call)                                                                   \
  do {                                                                                      \
    const ncclResult_t engine_nccl_ = (call);                                               \
    if (engine_nccl_ != ncclSuccess)                                                        \
      return Status{pfErrorNcclFailure, runtime_format("%s failed: %s (%s:%d)", #call,         \
                                                    ncclGetErrorString(engine_nccl_),       \
                                                    __FILE__, __LINE__)};                   \
  } while (0)

__global__ void gelu_bf16_kernel(__nv_bfloat16* x, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = __bfloat162float(x[i]);
    x[i] = __float2bfloat16(0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))));
  }
}

// Adam-like memory traffic over the stage's weights.
__global__ void optimizer_kernel(__nv_bfloat16* w, size_t n, float lr) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    w[i] = __float2bfloat16(__bfloat162float(w[i]) * (1.0f - lr));
}

// A receive that waits for the host: every block spins until *flag >= expected (a spinning
// NCCL kernel holds its SMs the same way).
__global__ void spin_until_kernel(const volatile unsigned long long* flag, unsigned long long expected) {
  while (*flag < expected) __nanosleep(200);
}

// Occupies `blocks` SMs for `ns` (the data-parallel all-reduce's NCCL kernels).
__global__ void spin_for_kernel(unsigned long long ns) { pipefill::device::spin_ns(ns); }

// The naive baseline's ungated fill: items item_ns each, item i on block i % gridDim.x; every
// block counts its finished items in done[blockIdx.x] (host-mapped; launches on the naive stream
// are serialised, so each slot has one writer at a time). Dynamic shared memory is only held.
__global__ void naive_items_kernel(unsigned long long items, unsigned long long item_ns,
                                   volatile unsigned long long* done) {
  extern __shared__ unsigned char held_shared_memory[];
  (void)held_shared_memory;
  for (unsigned long long i = blockIdx.x; i < items; i += gridDim.x) {
    pipefill::device::spin_ns(item_ns);
    __syncthreads();
    if (threadIdx.x == 0) {
      done[blockIdx.x] = done[blockIdx.x] + 1;
      __threadfence_system();
    }
  }
}

// One stage's real compute.
class StageCompute {
 public:
  StageCompute() = default;
  StageCompute(const StageCompute&) = delete;
  StageCompute& operator=(const StageCompute&) = delete;
  ~StageCompute() { release(); }

  // Frees everything (call with the stage's device current).
  void release() {
    if (handle_) cublasDestroy(handle_);
    handle_ = nullptr;
    for (void* p : {static_cast<void*>(x_), static_cast<void*>(big_), static_cast<void*>(weights_),
                    static_cast<void*>(scores_)})
      if (p) cudaFree(p);
    x_ = big_ = weights_ = scores_ = nullptr;
  }

  Status init(const PipelineSpec& spec, const StageCosts& costs) {
    const size_t h = spec.model.hidden;
    tokens_ = static_cast<size_t>(spec.model.micro_batch) * spec.model.seq;
    hidden_ = h;
    layers_per_chunk_ = costs.layers_per_chunk;
    weight_elems_ = 12 * h * h;  // one layer's weights, reused by every layer of the stage
    ENGINE_CUDA(cudaMalloc(&x_, tokens_ * h * sizeof(__nv_bfloat16)));
    ENGINE_CUDA(cudaMalloc(&big_, tokens_ * 4 * h * sizeof(__nv_bfloat16)));
    ENGINE_CUDA(cudaMalloc(&weights_, weight_elems_ * sizeof(__nv_bfloat16)));
    seq_ = static_cast<size_t>(spec.model.seq);
    head_dim_ = h % 128 == 0 ? 128 : h;  // Megatron-like 128-wide heads when they divide h
    batch_heads_ = static_cast<size_t>(spec.model.micro_batch) * (h / head_dim_);
    ENGINE_CUDA(cudaMalloc(&scores_, batch_heads_ * seq_ * seq_ * sizeof(__nv_bfloat16)));
    ENGINE_CUDA(cudaMemset(x_, 0, tokens_ * h * sizeof(__nv_bfloat16)));
    ENGINE_CUDA(cudaMemset(weights_, 0, weight_elems_ * sizeof(__nv_bfloat16)));
    ENGINE_CUBLAS(cublasCreate(&handle_));
    // Warm-up outside any bubble: cuBLAS picks and loads its kernels now.
    ENGINE_TRY(layer(nullptr));
    ENGINE_CUDA(cudaDeviceSynchronize());
    return {};
  }

  Status chunk(cudaStream_t stream, bool backward) {
    // A backward pass costs ~2x the forward FLOPs: the layer's GEMMs twice.
    const int passes = backward ? 2 : 1;
    for (int l = 0; l < layers_per_chunk_; ++l)
      for (int pass = 0; pass < passes; ++pass) ENGINE_TRY(layer(stream));
    return {};
  }

  Status optimizer(cudaStream_t stream) {
    optimizer_kernel<<<264, 256, 0, stream>>>(weights_, weight_elems_, 1e-6f);
    ENGINE_CUDA(cudaGetLastError());
    return {};
  }

 private:
  Status gemm(cudaStream_t stream, int n_out, int k, const __nv_bfloat16* w, const __nv_bfloat16* in,
              __nv_bfloat16* out) {
    const float alpha = 1.0f, beta = 0.0f;
    ENGINE_CUBLAS(cublasSetStream(handle_, stream));
    ENGINE_CUBLAS(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, n_out, static_cast<int>(tokens_), k,
                               &alpha, w, CUDA_R_16BF, n_out, in, CUDA_R_16BF, k, &beta, out,
                               CUDA_R_16BF, n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return {};
  }

  Status layer(cudaStream_t stream) {
    const int h = static_cast<int>(hidden_);
    const __nv_bfloat16* w = weights_;
    ENGINE_TRY(gemm(stream, 3 * h, h, w, x_, big_));                       // QKV
    ENGINE_TRY(attention(stream));                                          // Q K^T, softmax, P V
    ENGINE_TRY(gemm(stream, h, h, w + 3 * hidden_ * hidden_, x_, big_));   // output projection
    ENGINE_TRY(gemm(stream, 4 * h, h, w + 4 * hidden_ * hidden_, x_, big_)); // FFN up
    gelu_bf16_kernel<<<264, 256, 0, stream>>>(big_, tokens_ * 4 * hidden_);
    ENGINE_CUDA(cudaGetLastError());
    ENGINE_TRY(gemm(stream, h, 4 * h, w + 8 * hidden_ * hidden_, big_, x_)); // FFN down
    return {};
  }

  // Per (sequence, head): scores = Q K^T (s x s x d), an elementwise pass standing in for the
  // softmax, then P V: the 4 b s^2 h FLOPs of attention.
  Status attention(cudaStream_t stream) {
    const float alpha = 1.0f, beta = 0.0f;
    const int s = static_cast<int>(seq_), d = static_cast<int>(head_dim_);
    const long long qk_stride = static_cast<long long>(seq_) * head_dim_;
    const long long score_stride = static_cast<long long>(seq_) * seq_;
    const int batch = static_cast<int>(batch_heads_);
    ENGINE_CUBLAS(cublasSetStream(handle_, stream));
    ENGINE_CUBLAS(cublasGemmStridedBatchedEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, s, s, d, &alpha,
                                             big_, CUDA_R_16BF, d, qk_stride, big_, CUDA_R_16BF, d,
                                             qk_stride, &beta, scores_, CUDA_R_16BF, s, score_stride,
                                             batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    gelu_bf16_kernel<<<264, 256, 0, stream>>>(scores_, batch_heads_ * seq_ * seq_);
    ENGINE_CUDA(cudaGetLastError());
    ENGINE_CUBLAS(cublasGemmStridedBatchedEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, d, s, s, &alpha,
                                             big_, CUDA_R_16BF, d, qk_stride, scores_, CUDA_R_16BF, s,
                                             score_stride, &beta, x_, CUDA_R_16BF, d, qk_stride,
                                             batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return {};
  }

  cublasHandle_t handle_ = nullptr;
  __nv_bfloat16 *x_ = nullptr, *big_ = nullptr, *weights_ = nullptr, *scores_ = nullptr;
  size_t tokens_ = 0, hidden_ = 0, weight_elems_ = 0;
  size_t seq_ = 0, head_dim_ = 0, batch_heads_ = 0;
  int layers_per_chunk_ = 1;
};

// Time of every message's arrival at `stage` in the no-fill schedule, from iteration start.
double arrival_us(const Programs& programs, const StageCosts& costs, int stage,
                  const Instruction& recv) {
  // The producer: forward of (mb, vs-1) for an activation, backward of (mb, vs+1) for a gradient.
  const bool gradient = recv.type == InstrType::RecvGradient;
  const int p = static_cast<int>(programs.stages.size());
  const int producer_vs = gradient ? recv.virtual_stage + 1 : recv.virtual_stage - 1;
  const int producer_stage = producer_vs % p, producer_chunk = producer_vs / p;
  for (const auto& op : programs.timeline.stages[static_cast<size_t>(producer_stage)].ops) {
    const bool match = op.microbatch == recv.microbatch && op.chunk == producer_chunk &&
                       (gradient ? op.type == pipefill::schedule::OpType::Backward
                                 : op.type == pipefill::schedule::OpType::Forward);
    if (match) return op.end_us + costs.p2p_us;
  }
  (void)stage;
  return 0.0;
}

class EmulatedTransport final : public Transport {
 public:
  explicit EmulatedTransport(int stage) : stage_(stage) {}
  ~EmulatedTransport() override { close(); }

  std::string name() const override { return runtime_format("emulated (stage %d on GPU 0)", stage_); }
  pfBackend_t backend() const override { return pfBackendCuda; }
  bool single_thread() const override { return false; }
  int local_stages() const override { return 1; }
  int first_local_stage() const override { return stage_; }

  Status open(const PipelineSpec& spec, const StageCosts& costs, const Programs& programs,
              const TransportOptions& options) override {
    spec_ = spec;
    costs_ = costs;
    if (stage_ < 0) stage_ = spec.stages / 2;  // default: a middle stage (bubbles both ways)
    if (stage_ >= spec.stages)
      return Status{pfErrorInvalidArgument,
                    runtime_format("PIPEFILL_EMULATE_STAGE %d is not a stage (0..%d)", stage_, spec.stages - 1)};
    ENGINE_CUDA(cudaSetDevice(0));
    // Release times of every wait of this stage, in program order.
    for (const Instruction& in : programs.stages[static_cast<size_t>(stage_)]) {
      if (in.type == InstrType::RecvActivation || in.type == InstrType::RecvGradient)
        release_us_.push_back(arrival_us(programs, costs, stage_, in));
      if (in.type == InstrType::ReduceGradients) release_us_.push_back(programs.timeline.pipeline_us);
    }
    ENGINE_CUDA(cudaHostAlloc(&flags_, std::max<size_t>(1, release_us_.size()) * sizeof(unsigned long long),
                              cudaHostAllocMapped));
    std::fill(flags_, flags_ + release_us_.size(), 0ull);
    ENGINE_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flags_), flags_, 0));
    for (cudaEvent_t* e : {&begin_, &end_, &recv_done_})
      ENGINE_CUDA(cudaEventCreate(e));
    ENGINE_TRY(compute_.init(spec, costs));
    if (!options.reserve_sms) ENGINE_TRY(open_naive());  // the naive baseline's run
    return {};
  }

  // Ungated spin items on every SM at the main job's priority, from the bubble's begin.
  Status naive_fill(int, uint64_t items, double item_cost_us) override {
    if (naive_stream_ == nullptr)
      return Status{pfErrorInvalidState, "emulated transport: naive_fill outside the naive run"};
    if (items == 0) return {};
    const auto item_ns = static_cast<unsigned long long>(item_cost_us * 1e3);
    ENGINE_CUDA(cudaEventRecord(naive_start_, stream(main_)));
    ENGINE_CUDA(cudaStreamWaitEvent(naive_stream_, naive_start_, 0));
    naive_items_kernel<<<naive_blocks_, 128, naive_smem_, naive_stream_>>>(items, item_ns, naive_done_device_);
    ENGINE_CUDA(cudaGetLastError());
    return {};
  }

  uint64_t naive_items_done() const override {
    uint64_t total = 0;
    for (int b = 0; b < naive_blocks_ && naive_done_ != nullptr; ++b)
      total += reinterpret_cast<const volatile unsigned long long*>(naive_done_)[b];
    return total;
  }

  void configure_runtime(int stage, pfConfig_t* config) override {
    config->backend = pfBackendCuda;
    config->device = 0;
    config->reserved_sms = spec_.comm_sms;
    (void)stage;
  }

  Status attach(int, pfRuntime_t runtime) override {
    ENGINE_PF(pfStreamCreateHighPriority(runtime, &main_));
    ENGINE_PF(pfStreamCreateHighPriority(runtime, &comm_));
    return {};
  }
  void* main_stream(int) override { return main_; }

  Status begin_iteration(int) override {
    ENGINE_CUDA(cudaSetDevice(0));
    ++iteration_;
    next_wait_ = 0;
    ENGINE_CUDA(cudaEventRecord(begin_, stream(main_)));
    // The modelled peers: release each wait at its scheduled time after the GPU starts.
    timeline_ = std::thread([this, iteration = iteration_] {
      if (cudaEventSynchronize(begin_) != cudaSuccess) return;
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<size_t> order(release_us_.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return release_us_[a] < release_us_[b]; });
      for (size_t i : order) {
        std::this_thread::sleep_until(t0 + std::chrono::duration<double, std::micro>(release_us_[i]));
        reinterpret_cast<volatile unsigned long long*>(flags_)[i] = iteration;
      }
    });
    return {};
  }

  Status arrive(int, const Instruction&) override { return {}; }

  Status execute(int, const Instruction& in) override {
    ENGINE_CUDA(cudaSetDevice(0));
    cudaStream_t main = stream(main_), comm = stream(comm_);
    switch (in.type) {
      case InstrType::LoadMicrobatch:
      case InstrType::SendActivation:
      case InstrType::SendGradient:
        return {};  // the modelled peers need nothing from us
      case InstrType::Forward:
      case InstrType::Backward:
        return compute_.chunk(main, in.type == InstrType::Backward);
      case InstrType::RecvActivation:
      case InstrType::RecvGradient:
      case InstrType::ReduceGradients: {
        if (next_wait_ >= release_us_.size())
          return Status{pfErrorInternal, "emulated transport: more waits than planned"};
        spin_until_kernel<<<spec_.comm_sms, 32, 0, comm>>>(device_flags_ + next_wait_, iteration_);
        ENGINE_CUDA(cudaGetLastError());
        ++next_wait_;
        if (in.type == InstrType::ReduceGradients && spec_.model.allreduce_us > 0) {
          spin_for_kernel<<<spec_.comm_sms, 32, 0, comm>>>(
              static_cast<unsigned long long>(spec_.model.allreduce_us * 1e3));
          ENGINE_CUDA(cudaGetLastError());
        }
        ENGINE_CUDA(cudaEventRecord(recv_done_, comm));
        return {};
      }
      case InstrType::WaitComm:
        ENGINE_CUDA(cudaStreamWaitEvent(main, recv_done_, 0));
        return {};
      case InstrType::OptimizerStep:
        return compute_.optimizer(main);
      default:
        return Status{pfErrorInternal, runtime_format("emulated transport cannot execute %s", instr_name(in.type))};
    }
  }

  Status end_iteration(int) override {
    ENGINE_CUDA(cudaEventRecord(end_, stream(main_)));
    return {};
  }

  Status finish_iteration(IterationTiming* timing) override {
    const cudaError_t synced = cudaEventSynchronize(end_);
    if (timeline_.joinable()) timeline_.join();
    ENGINE_CUDA(synced);
    float ms = 0.0f;
    ENGINE_CUDA(cudaEventElapsedTime(&ms, begin_, end_));
    timing->start_us = 0.0;
    timing->end_us = ms * 1e3;
    return {};
  }

  Status detach(int, pfRuntime_t runtime) override {
    Status status;
    for (void** s : {&main_, &comm_}) {
      if (*s && pfStreamDestroy(runtime, *s) != pfSuccess && status.ok())
        status = pf_status(pfErrorCudaFailure, "pfStreamDestroy");
      *s = nullptr;
    }
    return status;
  }

  void close() override {
    if (timeline_.joinable()) timeline_.join();
    close_naive();
    for (cudaEvent_t e : {begin_, end_, recv_done_})
      if (e) cudaEventDestroy(e);
    begin_ = end_ = recv_done_ = nullptr;
    if (flags_) cudaFreeHost(flags_);
    flags_ = nullptr;
    compute_.release();
  }

 private:
  static cudaStream_t stream(void* s) { return static_cast<cudaStream_t>(s); }

  // The naive run's stream (highest priority), counters and kernel, loaded now (outside bubbles).
  Status open_naive() {
    int device = 0, lowest = 0, highest = 0, optin = 0;
    ENGINE_CUDA(cudaGetDevice(&device));
    ENGINE_CUDA(cudaDeviceGetAttribute(&naive_blocks_, cudaDevAttrMultiProcessorCount, device));
    ENGINE_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    naive_smem_ = static_cast<size_t>(optin) - 1024;  // one block per SM, as a GEMM tile would
    ENGINE_CUDA(cudaFuncSetAttribute(naive_items_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(naive_smem_)));
    ENGINE_CUDA(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
    ENGINE_CUDA(cudaStreamCreateWithPriority(&naive_stream_, cudaStreamNonBlocking, highest));
    ENGINE_CUDA(cudaEventCreateWithFlags(&naive_start_, cudaEventDisableTiming));
    ENGINE_CUDA(cudaHostAlloc(&naive_done_, static_cast<size_t>(naive_blocks_) * sizeof(unsigned long long),
                              cudaHostAllocMapped));
    std::fill(naive_done_, naive_done_ + naive_blocks_, 0ull);
    ENGINE_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&naive_done_device_), naive_done_, 0));
    naive_items_kernel<<<naive_blocks_, 128, naive_smem_, naive_stream_>>>(0, 0, naive_done_device_);
    ENGINE_CUDA(cudaGetLastError());
    ENGINE_CUDA(cudaStreamSynchronize(naive_stream_));
    return {};
  }

  void close_naive() {
    if (naive_stream_) {
      cudaStreamSynchronize(naive_stream_);  // its kernels write naive_done_
      cudaStreamDestroy(naive_stream_);
    }
    if (naive_start_) cudaEventDestroy(naive_start_);
    if (naive_done_) cudaFreeHost(naive_done_);
    naive_stream_ = nullptr;
    naive_start_ = nullptr;
    naive_done_ = nullptr;
    naive_done_device_ = nullptr;
    naive_blocks_ = 0;
  }

  int stage_;
  PipelineSpec spec_;
  StageCosts costs_;
  StageCompute compute_;
  std::vector<double> release_us_;
  unsigned long long* flags_ = nullptr;
  unsigned long long* device_flags_ = nullptr;
  unsigned long long iteration_ = 0;
  size_t next_wait_ = 0;
  cudaEvent_t begin_ = nullptr, end_ = nullptr, recv_done_ = nullptr;
  void *main_ = nullptr, *comm_ = nullptr;
  std::thread timeline_;
  // Naive baseline (open_naive).
  cudaStream_t naive_stream_ = nullptr;
  cudaEvent_t naive_start_ = nullptr;
  unsigned long long* naive_done_ = nullptr;         // host view, one slot per block
  unsigned long long* naive_done_device_ = nullptr;  // device pointer of the same memory
  int naive_blocks_ = 0;
  size_t naive_smem_ = 0;
};

#ifdef ENGINE_WITH_NCCL
class NcclTransport final : public Transport {
 public:
  explicit NcclTransport(int stages) : stages_(static_cast<size_t>(stages)) {}
  ~NcclTransport() override { close(); }

  std::string name() const override { return runtime_format("nccl (%zu GPUs)", stages_.size()); }
  pfBackend_t backend() const override { return pfBackendCuda; }
  bool single_thread() const override { return false; }
  int local_stages() const override { return static_cast<int>(stages_.size()); }

  Status open(const PipelineSpec& spec, const StageCosts& costs, const Programs&,
              const TransportOptions&) override {
    spec_ = spec;
    costs_ = costs;
    const int n = spec.stages;
    std::vector<int> devices(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) devices[static_cast<size_t>(i)] = i;
    for (auto* comms : {&forward_, &backward_, &all_}) {
      comms->assign(static_cast<size_t>(n), nullptr);
      ENGINE_NCCL(ncclCommInitAll(comms->data(), n, devices.data()));
    }
    for (int s = 0; s < n; ++s) {
      Stage& st = stages_[static_cast<size_t>(s)];
      ENGINE_CUDA(cudaSetDevice(s));
      ENGINE_CUDA(cudaMalloc(&st.send_buffer, std::max<size_t>(costs.message_bytes, 4)));
      ENGINE_CUDA(cudaMalloc(&st.recv_buffer, std::max<size_t>(costs.message_bytes, 4)));
      ENGINE_CUDA(cudaMalloc(&st.norm, sizeof(float)));
      for (cudaEvent_t* e : {&st.begin, &st.end, &st.recv_done, &st.ready})
        ENGINE_CUDA(cudaEventCreate(e));
      ENGINE_TRY(st.compute.init(spec, costs));
    }
    return {};
  }

  void configure_runtime(int stage, pfConfig_t* config) override {
    config->backend = pfBackendCuda;
    config->device = stage;
    config->reserved_sms = spec_.comm_sms;
  }

  Status attach(int stage, pfRuntime_t runtime) override {
    Stage& st = stages_[static_cast<size_t>(stage)];
    ENGINE_CUDA(cudaSetDevice(stage));
    for (void** s : {&st.main, &st.send, &st.recv}) ENGINE_PF(pfStreamCreateHighPriority(runtime, s));
    return {};
  }
  void* main_stream(int stage) override { return stages_[static_cast<size_t>(stage)].main; }

  Status begin_iteration(int stage) override {
    Stage& st = stages_[static_cast<size_t>(stage)];
    ENGINE_CUDA(cudaSetDevice(stage));
    ENGINE_CUDA(cudaEventRecord(st.begin, stream(st.main)));
    return {};
  }

  Status arrive(int stage, const Instruction&) override {
    Stage& st = stages_[static_cast<size_t>(stage)];
    ENGINE_CUDA(cudaSetDevice(stage));
    ENGINE_CUDA(cudaEventRecord(st.ready, stream(st.main)));
    ENGINE_CUDA(cudaStreamWaitEvent(stream(st.recv), st.ready, 0));
    return {};
  }

  Status execute(int stage, const Instruction& in) override {
    Stage& st = stages_[static_cast<size_t>(stage)];
    ENGINE_CUDA(cudaSetDevice(stage));
    cudaStream_t main = stream(st.main);
    const size_t bytes = std::max<size_t>(costs_.message_bytes, 4);
    switch (in.type) {
      case InstrType::LoadMicrobatch:
        return {};  // token ids are tiny; the model's load time is negligible
      case InstrType::Forward:
      case InstrType::Backward:
        return st.compute.chunk(main, in.type == InstrType::Backward);
      case InstrType::SendActivation:
      case InstrType::SendGradient: {
        ENGINE_CUDA(cudaEventRecord(st.ready, main));
        ENGINE_CUDA(cudaStreamWaitEvent(stream(st.send), st.ready, 0));
        ncclComm_t comm = (in.type == InstrType::SendActivation ? forward_ : backward_)[static_cast<size_t>(stage)];
        ENGINE_NCCL(ncclSend(st.send_buffer, bytes, ncclChar, in.peer, comm, stream(st.send)));
        return {};
      }
      case InstrType::RecvActivation:
      case InstrType::RecvGradient: {
        ncclComm_t comm = (in.type == InstrType::RecvActivation ? forward_ : backward_)[static_cast<size_t>(stage)];
        ENGINE_NCCL(ncclRecv(st.recv_buffer, bytes, ncclChar, in.peer, comm, stream(st.recv)));
        ENGINE_CUDA(cudaEventRecord(st.recv_done, stream(st.recv)));
        return {};
      }
      case InstrType::ReduceGradients:
        // The cross-stage gradient-norm reduction (every stage takes part) and the DP all-reduce.
        ENGINE_NCCL(ncclAllReduce(st.norm, st.norm, 1, ncclFloat, ncclSum, all_[static_cast<size_t>(stage)],
                                  stream(st.recv)));
        if (spec_.model.allreduce_us > 0) {
          spin_for_kernel<<<spec_.comm_sms, 32, 0, stream(st.recv)>>>(
              static_cast<unsigned long long>(spec_.model.allreduce_us * 1e3));
          ENGINE_CUDA(cudaGetLastError());
        }
        ENGINE_CUDA(cudaEventRecord(st.recv_done, stream(st.recv)));
        return {};
      case InstrType::WaitComm:
        ENGINE_CUDA(cudaStreamWaitEvent(main, st.recv_done, 0));
        return {};
      case InstrType::OptimizerStep:
        return st.compute.optimizer(main);
      default:
        return Status{pfErrorInternal, runtime_format("nccl transport cannot execute %s", instr_name(in.type))};
    }
  }

  Status end_iteration(int stage) override {
    Stage& st = stages_[static_cast<size_t>(stage)];
    ENGINE_CUDA(cudaSetDevice(stage));
    ENGINE_CUDA(cudaEventRecord(st.end, stream(st.main)));
    return {};
  }

  Status finish_iteration(IterationTiming* timing) override {
    // Events of different GPUs share no clock: the iteration takes the slowest stage's span.
    double longest = 0.0;
    for (size_t s = 0; s < stages_.size(); ++s) {
      ENGINE_CUDA(cudaSetDevice(static_cast<int>(s)));
      ENGINE_CUDA(cudaEventSynchronize(stages_[s].end));
      float ms = 0.0f;
      ENGINE_CUDA(cudaEventElapsedTime(&ms, stages_[s].begin, stages_[s].end));
      longest = std::max(longest, ms * 1e3);
    }
    timing->start_us = 0.0;
    timing->end_us = longest;
    return {};
  }

  Status detach(int stage, pfRuntime_t runtime) override {
    Stage& st = stages_[static_cast<size_t>(stage)];
    Status status;
    for (void** s : {&st.main, &st.send, &st.recv}) {
      if (*s && pfStreamDestroy(runtime, *s) != pfSuccess && status.ok())
        status = pf_status(pfErrorCudaFailure, "pfStreamDestroy");
      *s = nullptr;
    }
    return status;
  }

  void close() override {
    for (auto* comms : {&forward_, &backward_, &all_}) {
      for (ncclComm_t c : *comms)
        if (c) ncclCommDestroy(c);
      comms->clear();
    }
    for (size_t s = 0; s < stages_.size(); ++s) {
      Stage& st = stages_[s];
      cudaSetDevice(static_cast<int>(s));
      for (cudaEvent_t e : {st.begin, st.end, st.recv_done, st.ready})
        if (e) cudaEventDestroy(e);
      for (void* p : {st.send_buffer, st.recv_buffer, static_cast<void*>(st.norm)})
        if (p) cudaFree(p);
      st.send_buffer = st.recv_buffer = nullptr;
      st.norm = nullptr;
      st.begin = st.end = st.recv_done = st.ready = nullptr;
      st.compute.release();
    }
  }

 private:
  struct Stage {
    void *main = nullptr, *send = nullptr, *recv = nullptr;
    void *send_buffer = nullptr, *recv_buffer = nullptr;
    float* norm = nullptr;
    cudaEvent_t begin = nullptr, end = nullptr, recv_done = nullptr, ready = nullptr;
    StageCompute compute;
  };
  static cudaStream_t stream(void* s) { return static_cast<cudaStream_t>(s); }

  PipelineSpec spec_;
  StageCosts costs_;
  std::vector<Stage> stages_;
  std::vector<ncclComm_t> forward_, backward_, all_;
};
#endif

}  // namespace

int cuda_gpu_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

std::unique_ptr<Transport> make_emulated_transport(std::string* why) {
  if (cuda_gpu_count() < 1) {
    *why = "no CUDA device (cudaGetDeviceCount reports none)";
    return nullptr;
  }
  int stage = -1;
  if (const char* env = std::getenv("PIPEFILL_EMULATE_STAGE")) stage = std::atoi(env);
  return std::make_unique<EmulatedTransport>(stage);
}

std::unique_ptr<Transport> make_nccl_transport(int stages, std::string* why) {
#ifdef ENGINE_WITH_NCCL
  const int gpus = cuda_gpu_count();
  if (gpus < stages || stages < 2) {
    *why = runtime_format("needs one GPU per stage: %d stages, %d GPUs", stages, gpus);
    return nullptr;
  }
  return std::make_unique<NcclTransport>(stages);
#else
  *why = "this build has no NCCL";
  (void)stages;
  return nullptr;
#endif
}

}  // namespace engine
