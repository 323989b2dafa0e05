// The example fill jobs on a GPU.
//  - MLP inference: ticket kernel (one item per block, written with pipefill/device.cuh) or
//    opaque cuBLAS GEMMs over a chunk of items (admitted by the runtime only when they fit).
//  - Encoder-layer inference: ticket kernel (a block computes one sequence, scratch in the
//    arena) or opaque cuBLAS work (projections, strided-batched attention GEMMs per head, FFN)
//    over chunks of sequences, with small row-wise kernels for LayerNorm, softmax and biases.
//  - Training: one block runs SGD steps in order (parallelism 1), gated or not.
// Inputs are generated on the device with the same counter-based splitmix64 as reference.cpp,
// so every item's input is bit-identical to the CPU's; outputs differ only by summation order.
// Nothing here allocates, synchronises or loads modules in launch(): setup() does all of that,
// and the runtime's warm-up launch (a slice with max_items == 0, on the fill stream, outside any
// bubble, right after setup) loads every kernel and the cuBLAS kernels into the fill stream's
// context - a green context has its own module state, so setup's loads in the primary context
// do not cover it. A warm-up launch writes scratch buffers only, never an output or a parameter.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cublas_api.hpp"
#include "gpu_job.hpp"
#include "pipefill/device.cuh"

namespace fill_jobs {
namespace {

using pipefill::cuda::cublas_api;  // cuBLAS loaded at first use (cuda/cublas_api.hpp)

#define FJ_CUDA(call)                                                                      \
  do {                                                                                     \
    const cudaError_t fj_error_ = (call);                                                  \
    if (fj_error_ != cudaSuccess)                                                          \
      return fj_fail(pfErrorCudaFailure, "%s failed: %s (%s:%d)", #call,                   \
                     cudaGetErrorName(fj_error_), __FILE__, __LINE__);                     \
  } while (0)
#define FJ_CUBLAS(call)                                                                    \
  do {                                                                                     \
    const cublasStatus_t fj_status_ = (call);                                              \
    if (fj_status_ != CUBLAS_STATUS_SUCCESS)                                               \
      return fj_fail(pfErrorCudaFailure, "%s failed: cuBLAS status %d (%s:%d)", #call,     \
                     static_cast<int>(fj_status_), __FILE__, __LINE__);                    \
  } while (0)
#define FJ_TRY(expr)                        \
  do {                                      \
    const pfResult_t fj_try_ = (expr);      \
    if (fj_try_ != pfSuccess) return fj_try_; \
  } while (0)

constexpr int kThreads = 256;
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kOutputRingItems = 65536;  // inference outputs kept on the device

// ---- Counter-based splitmix64, identical to fill_jobs::Rng --------------------------------
__host__ __device__ inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__device__ inline uint64_t d_item_seed(uint64_t seed, uint64_t item) {
  return mix64((seed ^ (item * 0xD1B54A32D192ED03ull)) + kGolden);
}
// The index-th uniform(scale) drawn from Rng(stream_seed).
__device__ inline float d_uniform(uint64_t stream_seed, uint64_t index, float scale) {
  const uint64_t z = mix64(stream_seed + (index + 1) * kGolden);
  const float unit = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
  return (2.0f * unit - 1.0f) * scale;
}
__device__ inline float d_gelu(float x) {
  const float c = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

// Block-wide y[r][o] = act(b[o] + sum_i w[o][i] x[r][i]) (+ residual[r][o]).
enum class Act { None, Gelu, Tanh };
__device__ void block_linear(const float* x, int rows, int in, const float* w, const float* b,
                             int out, float* y, Act act, const float* residual) {
  for (int idx = threadIdx.x; idx < rows * out; idx += blockDim.x) {
    const int r = idx / out, o = idx % out;
    const float* xr = x + static_cast<size_t>(r) * in;
    const float* wo = w + static_cast<size_t>(o) * in;
    float acc = b ? b[o] : 0.0f;
    for (int i = 0; i < in; ++i) acc += wo[i] * xr[i];
    if (act == Act::Gelu) acc = d_gelu(acc);
    if (act == Act::Tanh) acc = tanhf(acc);
    if (residual) acc += residual[idx];
    y[idx] = acc;
  }
  __syncthreads();
}

// LayerNorm of row r of x (width columns) into y: the one definition both the ticket (block)
// and the opaque (grid) paths use, so their outputs agree bit for bit.
__device__ __forceinline__ void layer_norm_row(const float* x, int r, int width, const float* gain,
                                               const float* bias, float* y) {
  const float* xr = x + static_cast<size_t>(r) * width;
  float mean = 0.0f, var = 0.0f;
  for (int i = 0; i < width; ++i) mean += xr[i];
  mean /= static_cast<float>(width);
  for (int i = 0; i < width; ++i) var += (xr[i] - mean) * (xr[i] - mean);
  var /= static_cast<float>(width);
  const float inv = rsqrtf(var + 1e-5f);
  float* yr = y + static_cast<size_t>(r) * width;
  for (int i = 0; i < width; ++i) yr[i] = (xr[i] - mean) * inv * gain[i] + bias[i];
}

__device__ void block_layer_norm(const float* x, int rows, int width, const float* gain,
                                 const float* bias, float* y) {
  for (int r = threadIdx.x; r < rows; r += blockDim.x) layer_norm_row(x, r, width, gain, bias, y);
  __syncthreads();
}

// ---- MLP ------------------------------------------------------------------------------------
struct MlpArgs {
  const float *w1, *b1, *w2, *b2;
  int input, hidden, output, rows;
  uint64_t seed;
  float* outputs;  // ring of kOutputRingItems items
  uint64_t ring_items;
};

__device__ void mlp_item(const MlpArgs& a, uint64_t item, float* x, float* h) {
  const uint64_t s = d_item_seed(a.seed, item);
  for (int i = threadIdx.x; i < a.rows * a.input; i += blockDim.x) x[i] = d_uniform(s, i, 1.0f);
  __syncthreads();
  block_linear(x, a.rows, a.input, a.w1, a.b1, a.hidden, h, Act::Gelu, nullptr);
  float* y = a.outputs + (item % a.ring_items) * static_cast<size_t>(a.rows) * a.output;
  block_linear(h, a.rows, a.hidden, a.w2, a.b2, a.output, y, Act::None, nullptr);
}

__global__ void mlp_ticket_kernel(pfSliceDesc_t slice, MlpArgs a) {
  extern __shared__ float smem[];
  float* x = smem;
  float* h = smem + a.rows * a.input;
  pipefill::device::for_each_item(slice, [&](uint64_t item) { mlp_item(a, item, x, h); });
}

// Opaque path helpers: inputs of a chunk, bias+GELU, scatter of the outputs into the ring.
__global__ void mlp_inputs_kernel(MlpArgs a, uint64_t first, uint64_t items, float* x) {
  const uint64_t per_item = static_cast<uint64_t>(a.rows) * a.input;
  for (uint64_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < items * per_item;
       idx += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint64_t item = first + idx / per_item;
    x[idx] = d_uniform(d_item_seed(a.seed, item), idx % per_item, 1.0f);
  }
}
__global__ void bias_gelu_kernel(float* h, const float* b, int width, uint64_t n) {
  for (uint64_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    h[idx] = d_gelu(h[idx] + b[idx % width]);
}
__global__ void scatter_outputs_kernel(MlpArgs a, uint64_t first, uint64_t items, const float* y) {
  const uint64_t per_item = static_cast<uint64_t>(a.rows) * a.output;
  for (uint64_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < items * per_item;
       idx += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint64_t item = first + idx / per_item;
    a.outputs[(item % a.ring_items) * per_item + idx % per_item] =
        y[idx] + a.b2[idx % a.output];
  }
}

// ---- Encoder layer --------------------------------------------------------------------------
struct EncoderArgs {
  const float *wq, *wk, *wv, *wo, *bq, *bk, *bv, *bo;
  const float *ln1_gain, *ln1_bias, *ln2_gain, *ln2_bias, *w1, *b1, *w2, *b2;
  int hidden, heads, ffn, seq;
  uint64_t seed;
  float* outputs;
  uint64_t ring_items;
  float* scratch;  // per block: scratch_floats
  size_t scratch_floats;
};

size_t encoder_scratch_floats(const EncoderShape& s) {
  const size_t nh = static_cast<size_t>(s.seq) * s.hidden;
  return 7 * nh + static_cast<size_t>(s.seq) * s.ffn +
         static_cast<size_t>(s.heads) * s.seq * s.seq;
}

__device__ void encoder_item(const EncoderArgs& a, uint64_t item) {
  const int n = a.seq, h = a.hidden, dh = a.hidden / a.heads;
  const size_t nh = static_cast<size_t>(n) * h;
  float* t = a.scratch + blockIdx.x * a.scratch_floats;
  float *x = t, *normed = x + nh, *q = normed + nh, *k = q + nh, *v = k + nh, *att = v + nh,
        *hs = att + nh, *ffn = hs + nh, *scores = ffn + static_cast<size_t>(n) * a.ffn;
  const uint64_t s = d_item_seed(a.seed, item);
  for (size_t i = threadIdx.x; i < nh; i += blockDim.x) x[i] = d_uniform(s, i, 1.0f);
  __syncthreads();
  block_layer_norm(x, n, h, a.ln1_gain, a.ln1_bias, normed);
  block_linear(normed, n, h, a.wq, a.bq, h, q, Act::None, nullptr);
  block_linear(normed, n, h, a.wk, a.bk, h, k, Act::None, nullptr);
  block_linear(normed, n, h, a.wv, a.bv, h, v, Act::None, nullptr);
  const float scale = rsqrtf(static_cast<float>(dh));
  for (int pair = threadIdx.x; pair < a.heads * n; pair += blockDim.x) {
    const int head = pair / n, i = pair % n, off = head * dh;
    float* sc = scores + static_cast<size_t>(pair) * n;
    float max_score = -INFINITY;
    for (int j = 0; j < n; ++j) {
      float dot = 0.0f;
      for (int d = 0; d < dh; ++d) dot += q[i * h + off + d] * k[j * h + off + d];
      sc[j] = dot * scale;
      max_score = fmaxf(max_score, sc[j]);
    }
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) {
      sc[j] = expf(sc[j] - max_score);
      sum += sc[j];
    }
    for (int d = 0; d < dh; ++d) {
      float acc = 0.0f;
      for (int j = 0; j < n; ++j) acc += sc[j] / sum * v[j * h + off + d];
      att[i * h + off + d] = acc;
    }
  }
  __syncthreads();
  block_linear(att, n, h, a.wo, a.bo, h, hs, Act::None, x);  // + residual x
  block_layer_norm(hs, n, h, a.ln2_gain, a.ln2_bias, normed);
  block_linear(normed, n, h, a.w1, a.b1, a.ffn, ffn, Act::Gelu, nullptr);
  float* y = a.outputs + (item % a.ring_items) * nh;
  block_linear(ffn, n, a.ffn, a.w2, a.b2, h, y, Act::None, hs);  // + residual hs
}

__global__ void encoder_ticket_kernel(pfSliceDesc_t slice, EncoderArgs a) {
  pipefill::device::for_each_item(slice, [&](uint64_t item) { encoder_item(a, item); });
}

// cuBLAS encoder path (opaque): row-wise helpers, one thread per row / grid-stride elementwise.
__global__ void encoder_inputs_kernel(uint64_t seed, uint64_t first, uint64_t items,
                                      uint64_t per_item, float* x) {
  for (uint64_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < items * per_item;
       idx += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    x[idx] = d_uniform(d_item_seed(seed, first + idx / per_item), idx % per_item, 1.0f);
}
__global__ void rows_layer_norm_kernel(const float* x, int rows, int width, const float* gain,
                                       const float* bias, float* y) {
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x)
    layer_norm_row(x, r, width, gain, bias, y);
}
// y = act(y + b) (+ residual), row width `width`.
__global__ void bias_act_kernel(float* y, const float* b, int width, uint64_t n, int gelu,
                                const float* residual) {
  for (uint64_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    float v = y[idx] + b[idx % width];
    if (gelu) v = d_gelu(v);
    if (residual) v += residual[idx];
    y[idx] = v;
  }
}
__global__ void softmax_rows_kernel(float* s, int rows, int width, float scale) {
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
    float* row = s + static_cast<size_t>(r) * width;
    float max_score = -INFINITY;
    for (int j = 0; j < width; ++j) max_score = fmaxf(max_score, row[j] * scale);
    float sum = 0.0f;
    for (int j = 0; j < width; ++j) {
      row[j] = expf(row[j] * scale - max_score);
      sum += row[j];
    }
    for (int j = 0; j < width; ++j) row[j] /= sum;
  }
}
__global__ void scatter_ring_kernel(const float* y, uint64_t first, uint64_t items,
                                    uint64_t per_item, float* ring, uint64_t ring_items) {
  for (uint64_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < items * per_item;
       idx += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    ring[((first + idx / per_item) % ring_items) * per_item + idx % per_item] = y[idx];
}

// ---- Training (one block, steps in order) -----------------------------------------------------
struct TrainArgs {
  float *w1, *b1, *w2, *b2;
  const float* teacher;
  int input, hidden, output, batch;
  float lr;
  uint64_t data_seed;  // seed ^ 0x5DEECE66D, as RegressionTrainer::batch
  float *x, *target, *h, *y, *gy, *gh;  // scratch
};

__device__ void train_step(const TrainArgs& a, uint64_t step) {
  const int n = a.batch, in = a.input, hid = a.hidden, out = a.output;
  const uint64_t s = d_item_seed(a.data_seed, step);
  for (int i = threadIdx.x; i < n * in; i += blockDim.x) a.x[i] = d_uniform(s, i, 1.0f);
  __syncthreads();
  block_linear(a.x, n, in, a.teacher, nullptr, out, a.target, Act::Tanh, nullptr);
  block_linear(a.x, n, in, a.w1, a.b1, hid, a.h, Act::Tanh, nullptr);
  block_linear(a.h, n, hid, a.w2, a.b2, out, a.y, Act::None, nullptr);
  const float norm = 1.0f / static_cast<float>(n * out);
  for (int i = threadIdx.x; i < n * out; i += blockDim.x) a.gy[i] = 2.0f * (a.y[i] - a.target[i]) * norm;
  __syncthreads();
  for (int idx = threadIdx.x; idx < n * hid; idx += blockDim.x) {
    const int r = idx / hid, j = idx % hid;
    float acc = 0.0f;
    for (int o = 0; o < out; ++o) acc += a.gy[r * out + o] * a.w2[o * hid + j];
    a.gh[idx] = acc * (1.0f - a.h[idx] * a.h[idx]);
  }
  __syncthreads();  // the hidden gradient used w2 before its update
  for (int idx = threadIdx.x; idx < out * (hid + 1); idx += blockDim.x) {
    const int o = idx / (hid + 1), j = idx % (hid + 1);
    float g = 0.0f;
    if (j == hid) {
      for (int r = 0; r < n; ++r) g += a.gy[r * out + o];
      a.b2[o] -= a.lr * g;
    } else {
      for (int r = 0; r < n; ++r) g += a.gy[r * out + o] * a.h[r * hid + j];
      a.w2[o * hid + j] -= a.lr * g;
    }
  }
  for (int idx = threadIdx.x; idx < hid * (in + 1); idx += blockDim.x) {
    const int j = idx / (in + 1), i = idx % (in + 1);
    float g = 0.0f;
    if (i == in) {
      for (int r = 0; r < n; ++r) g += a.gh[r * hid + j];
      a.b1[j] -= a.lr * g;
    } else {
      for (int r = 0; r < n; ++r) g += a.gh[r * hid + j] * a.x[r * in + i];
      a.w1[j * in + i] -= a.lr * g;
    }
  }
  __syncthreads();
}

__global__ void train_ticket_kernel(pfSliceDesc_t slice, TrainArgs a) {
  pipefill::device::for_each_item(slice, [&](uint64_t step) { train_step(a, step); });
}
__global__ void train_range_kernel(uint64_t first, uint64_t count, TrainArgs a) {
  if (blockIdx.x != 0) return;  // steps are sequential: one block
  for (uint64_t s = 0; s < count; ++s) train_step(a, first + s);
}

// ---- Host side --------------------------------------------------------------------------------

pfResult_t arena_upload(const pfArenaAllocator_t* alloc, const std::vector<float>& host,
                        float** device) {
  void* p = nullptr;
  const pfResult_t r = alloc->allocate(alloc->context, std::max<size_t>(4, host.size() * 4), 256, &p);
  if (r != pfSuccess) return fj_fail(r, "arena allocation of %zu bytes failed", host.size() * 4);
  *device = static_cast<float*>(p);
  if (!host.empty()) FJ_CUDA(cudaMemcpy(p, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  return pfSuccess;
}

pfResult_t arena_zeros(const pfArenaAllocator_t* alloc, size_t floats, float** device) {
  void* p = nullptr;
  const pfResult_t r = alloc->allocate(alloc->context, std::max<size_t>(4, floats * 4), 256, &p);
  if (r != pfSuccess) return fj_fail(r, "arena allocation of %zu bytes failed", floats * 4);
  *device = static_cast<float*>(p);
  FJ_CUDA(cudaMemset(p, 0, floats * 4));
  return pfSuccess;
}

int grid_for(int per_sm_blocks, int sms, const pfSliceDesc_t* slice, int parallelism) {
  int grid = std::min(per_sm_blocks * sms, slice->max_blocks);
  if (parallelism > 0) grid = std::min(grid, parallelism);
  return std::max(1, grid);
}

class GpuJobImpl final : public GpuJob {
 public:
  GpuJobImpl(const HostModel& model, int sms) : m_(model), p_(model.params), sms_(sms) {
    ring_items_ = std::min<uint64_t>(p_.items, kOutputRingItems);
  }

  size_t resident_bytes() const override {
    // Every arena allocation rounded up to its 256-byte alignment.
    size_t total = 0;
    auto add = [&](size_t floats) { total += (std::max<size_t>(4, floats * 4) + 255) / 256 * 256; };
    const size_t i = p_.input, h = p_.hidden, o = p_.output, n = p_.rows, f = p_.ffn;
    switch (p_.kind) {
      case fjMlpInference:
        add(h * i), add(h), add(o * h), add(o), add(ring_items_ * n * o);
        if (p_.execution == fjExecOpaque) {
          add(kChunkItems * n * i), add(kChunkItems * n * h), add(kChunkItems * n * o);
          add(kCublasWorkspaceBytes / 4);
        }
        break;
      case fjEncoderInference:
        for (int k = 0; k < 4; ++k) add(h * h);
        for (int k = 0; k < 8; ++k) add(h);
        add(f * h), add(f), add(h * f), add(h);
        add(ring_items_ * p_.seq * h);
        add(encoder_scratch_floats(EncoderShape{p_.hidden, p_.heads, p_.ffn, p_.seq}) *
            static_cast<size_t>(sms_));
        if (p_.execution == fjExecOpaque) {
          const size_t rows = kEncoderChunk * static_cast<size_t>(p_.seq);
          for (int k = 0; k < 8; ++k) add(rows * h);
          add(rows * f), add(kEncoderChunk * static_cast<size_t>(p_.seq) * p_.seq);
          add(kCublasWorkspaceBytes / 4);
        }
        break;
      default:
        add(h * i), add(h), add(o * h), add(o), add(o * i);
        add(n * i), add(n * o), add(n * h), add(n * o), add(n * o), add(n * h);
        break;
    }
    return total;
  }
  ~GpuJobImpl() override {
    if (cublas_) cublas_api().cublasDestroy(cublas_);
  }

  pfResult_t setup(const pfArenaAllocator_t* alloc) override {
    switch (p_.kind) {
      case fjMlpInference: return setup_mlp(alloc);
      case fjEncoderInference: return setup_encoder(alloc);
      default: return setup_training(alloc);
    }
  }

  pfResult_t launch(const pfSliceDesc_t* slice, void* stream_handle) override {
    const auto stream = static_cast<cudaStream_t>(stream_handle);
    const bool ticket = p_.execution == fjExecTicket;
    if (slice->max_items == 0 && !ticket) return warm_up_opaque(stream);
    // Ticket kernels launched with an empty slice exit at once touching nothing (device.cuh).
    const uint64_t first = slice->first_item_hint;
    const uint64_t count = std::min(slice->max_items, p_.items - std::min(p_.items, first));
    switch (p_.kind) {
      case fjMlpInference:
        if (ticket) {
          mlp_ticket_kernel<<<grid_for(mlp_per_sm_, sms_, slice, p_.parallelism), kThreads,
                              mlp_smem_, stream>>>(*slice, mlp_);
        } else {
          FJ_TRY(launch_mlp_gemms(first, count, stream));
        }
        break;
      case fjEncoderInference:
        if (ticket) {
          encoder_ticket_kernel<<<std::min(encoder_blocks_, grid_for(encoder_blocks_, 1, slice, p_.parallelism)),
                                  kThreads, 0, stream>>>(*slice, encoder_);
        } else {
          FJ_TRY(launch_encoder_gemms(first, count, stream));
        }
        break;
      default:
        if (ticket) {
          train_ticket_kernel<<<1, kThreads, 0, stream>>>(*slice, train_);
        } else if (count > 0) {
          train_range_kernel<<<1, kThreads, 0, stream>>>(first, count, train_);
        }
        break;
    }
    FJ_CUDA(cudaGetLastError());
    return pfSuccess;
  }

  // The opaque paths' warm-up on `stream`: one full chunk through every kernel and cuBLAS call
  // with the shapes real slices use, writing only the chunk scratch buffers (the scatter into
  // the output ring runs with zero items); training runs zero steps.
  pfResult_t warm_up_opaque(cudaStream_t stream) {
    switch (p_.kind) {
      case fjMlpInference:
        return launch_mlp_gemms(0, std::min<uint64_t>(kChunkItems, p_.items), stream, /*scatter=*/false);
      case fjEncoderInference:
        return launch_encoder_gemms(0, std::min<uint64_t>(kEncoderChunk, p_.items), stream, /*scatter=*/false);
      default:
        train_range_kernel<<<1, kThreads, 0, stream>>>(0, 0, train_);
        FJ_CUDA(cudaGetLastError());
        return pfSuccess;
    }
  }

  pfResult_t read_output(uint64_t item, float* out, size_t count) override {
    const float* ring = p_.kind == fjMlpInference ? mlp_.outputs : encoder_.outputs;
    if (ring == nullptr) return fj_fail(pfErrorInvalidState, "read_output before setup");
    FJ_CUDA(cudaDeviceSynchronize());
    FJ_CUDA(cudaMemcpy(out, ring + (item % ring_items_) * count, count * 4, cudaMemcpyDeviceToHost));
    return pfSuccess;
  }

  pfResult_t read_parameters(std::vector<float>* parameters) override {
    if (train_.w1 == nullptr) return fj_fail(pfErrorInvalidState, "read_parameters before setup");
    FJ_CUDA(cudaDeviceSynchronize());
    const size_t i = p_.input, h = p_.hidden, o = p_.output;
    parameters->resize(h * i + h + o * h + o);
    float* dst = parameters->data();
    FJ_CUDA(cudaMemcpy(dst, train_.w1, h * i * 4, cudaMemcpyDeviceToHost));
    FJ_CUDA(cudaMemcpy(dst + h * i, train_.b1, h * 4, cudaMemcpyDeviceToHost));
    FJ_CUDA(cudaMemcpy(dst + h * i + h, train_.w2, o * h * 4, cudaMemcpyDeviceToHost));
    FJ_CUDA(cudaMemcpy(dst + h * i + h + o * h, train_.b2, o * 4, cudaMemcpyDeviceToHost));
    return pfSuccess;
  }

 private:
  pfResult_t setup_mlp(const pfArenaAllocator_t* alloc) {
    const MlpWeights& w = m_.mlp;
    mlp_ = MlpArgs{};
    float *w1, *b1, *w2, *b2;
    FJ_TRY(arena_upload(alloc, w.w1, &w1));
    FJ_TRY(arena_upload(alloc, w.b1, &b1));
    FJ_TRY(arena_upload(alloc, w.w2, &w2));
    FJ_TRY(arena_upload(alloc, w.b2, &b2));
    mlp_ = MlpArgs{w1, b1, w2, b2, p_.input, p_.hidden, p_.output, p_.rows, p_.seed, nullptr,
                   ring_items_};
    FJ_TRY(arena_zeros(alloc, ring_items_ * p_.rows * p_.output, &mlp_.outputs));
    if (p_.execution == fjExecTicket) {
      mlp_smem_ = static_cast<size_t>(p_.rows) * (p_.input + p_.hidden) * sizeof(float);
      if (mlp_smem_ > 48 * 1024)
        FJ_CUDA(cudaFuncSetAttribute(mlp_ticket_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(mlp_smem_)));
      // Also loads the module now, outside any bubble.
      FJ_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&mlp_per_sm_, mlp_ticket_kernel,
                                                            kThreads, mlp_smem_));
      if (mlp_per_sm_ < 1)
        return fj_fail(pfErrorNotSupported, "MLP item needs %zu bytes of shared memory: too big",
                       mlp_smem_);
      return pfSuccess;
    }
    // Opaque: cuBLAS with its workspace from the arena (no allocation in a bubble), chunk
    // buffers, and one warm-up chunk so cuBLAS picks and loads its kernels now.
    const size_t rows = kChunkItems * static_cast<size_t>(p_.rows);
    FJ_TRY(arena_zeros(alloc, rows * p_.input, &chunk_x_));
    FJ_TRY(arena_zeros(alloc, rows * p_.hidden, &chunk_h_));
    FJ_TRY(arena_zeros(alloc, rows * p_.output, &chunk_y_));
    float* workspace = nullptr;
    FJ_TRY(arena_zeros(alloc, kCublasWorkspaceBytes / 4, &workspace));
    if (!cublas_api().ok) return fj_fail(pfErrorNotSupported, "%s", cublas_api().error.c_str());
    FJ_CUBLAS(cublas_api().cublasCreate(&cublas_));
    FJ_CUBLAS(cublas_api().cublasSetWorkspace(cublas_, workspace, kCublasWorkspaceBytes));
    FJ_CUBLAS(cublas_api().cublasSetMathMode(cublas_, CUBLAS_PEDANTIC_MATH));  // fp32, comparable to the CPU
    FJ_TRY(launch_mlp_gemms(0, std::min<uint64_t>(kChunkItems, p_.items), nullptr, /*scatter=*/false));
    FJ_CUDA(cudaDeviceSynchronize());
    return pfSuccess;
  }

  pfResult_t launch_mlp_gemms(uint64_t first, uint64_t count, cudaStream_t stream, bool scatter = true) {
    FJ_CUBLAS(cublas_api().cublasSetStream(cublas_, stream));
    const float one = 1.0f, zero = 0.0f;
    for (uint64_t done = 0; done < count; done += kChunkItems) {
      const uint64_t items = std::min<uint64_t>(kChunkItems, count - done);
      const int rows = static_cast<int>(items * p_.rows);
      const int grid = std::max(1, std::min(sms_ * 4, (rows * p_.hidden + kThreads - 1) / kThreads));
      mlp_inputs_kernel<<<grid, kThreads, 0, stream>>>(mlp_, first + done, items, chunk_x_);
      // Row-major H (rows x hidden) = X W1^T: column-major H^T = W1 X^T.
      FJ_CUBLAS(cublas_api().cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, p_.hidden, rows, p_.input, &one,
                            mlp_.w1, p_.input, chunk_x_, p_.input, &zero, chunk_h_, p_.hidden));
      bias_gelu_kernel<<<grid, kThreads, 0, stream>>>(chunk_h_, mlp_.b1, p_.hidden,
                                                      static_cast<uint64_t>(rows) * p_.hidden);
      FJ_CUBLAS(cublas_api().cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, p_.output, rows, p_.hidden, &one,
                            mlp_.w2, p_.hidden, chunk_h_, p_.hidden, &zero, chunk_y_, p_.output));
      scatter_outputs_kernel<<<grid, kThreads, 0, stream>>>(mlp_, first + done, scatter ? items : 0, chunk_y_);
      FJ_CUDA(cudaGetLastError());
    }
    return pfSuccess;
  }

  pfResult_t setup_encoder(const pfArenaAllocator_t* alloc) {
    const EncoderWeights& w = m_.encoder;
    EncoderArgs& a = encoder_;
    a = EncoderArgs{};
    const std::vector<float>* parts[] = {&w.wq, &w.wk, &w.wv, &w.wo, &w.bq, &w.bk, &w.bv, &w.bo,
                                         &w.ln1_gain, &w.ln1_bias, &w.ln2_gain, &w.ln2_bias,
                                         &w.w1, &w.b1, &w.w2, &w.b2};
    const float** slots[] = {&a.wq, &a.wk, &a.wv, &a.wo, &a.bq, &a.bk, &a.bv, &a.bo,
                             &a.ln1_gain, &a.ln1_bias, &a.ln2_gain, &a.ln2_bias,
                             &a.w1, &a.b1, &a.w2, &a.b2};
    for (size_t i = 0; i < 16; ++i) {
      float* d = nullptr;
      FJ_TRY(arena_upload(alloc, *parts[i], &d));
      *slots[i] = d;
    }
    a.hidden = p_.hidden, a.heads = p_.heads, a.ffn = p_.ffn, a.seq = p_.seq;
    a.seed = p_.seed;
    a.ring_items = ring_items_;
    FJ_TRY(arena_zeros(alloc, ring_items_ * p_.seq * p_.hidden, &a.outputs));
    // One block per SM at most: each needs its own scratch.
    encoder_blocks_ = sms_;
    a.scratch_floats = encoder_scratch_floats(EncoderShape{p_.hidden, p_.heads, p_.ffn, p_.seq});
    FJ_TRY(arena_zeros(alloc, a.scratch_floats * encoder_blocks_, &a.scratch));
    cudaFuncAttributes attributes{};
    FJ_CUDA(cudaFuncGetAttributes(&attributes, encoder_ticket_kernel));  // eager module load
    if (p_.execution == fjExecTicket) return pfSuccess;
    // Opaque: cuBLAS over chunks of kEncoderChunk sequences, buffers from the arena, warm-up.
    const size_t rows = kEncoderChunk * static_cast<size_t>(p_.seq);
    for (float** b : {&ex_, &enormed_, &eq_, &ek_, &ev_, &eatt_, &ehs_, &ey_})
      FJ_TRY(arena_zeros(alloc, rows * p_.hidden, b));
    FJ_TRY(arena_zeros(alloc, rows * p_.ffn, &effn_));
    FJ_TRY(arena_zeros(alloc, kEncoderChunk * static_cast<size_t>(p_.seq) * p_.seq, &escores_));
    float* workspace = nullptr;
    FJ_TRY(arena_zeros(alloc, kCublasWorkspaceBytes / 4, &workspace));
    if (!cublas_api().ok) return fj_fail(pfErrorNotSupported, "%s", cublas_api().error.c_str());
    FJ_CUBLAS(cublas_api().cublasCreate(&cublas_));
    FJ_CUBLAS(cublas_api().cublasSetWorkspace(cublas_, workspace, kCublasWorkspaceBytes));
    FJ_CUBLAS(cublas_api().cublasSetMathMode(cublas_, CUBLAS_PEDANTIC_MATH));
    FJ_TRY(launch_encoder_gemms(0, std::min<uint64_t>(kEncoderChunk, p_.items), nullptr, /*scatter=*/false));
    FJ_CUDA(cudaDeviceSynchronize());
    return pfSuccess;
  }

  // Y (rows x out, row-major) = X (rows x in) W^T (+ bias/act/residual in a kernel).
  pfResult_t linear(cudaStream_t stream, const float* x, int rows, int in, const float* w,
                    const float* b, int out, float* y, bool gelu, const float* residual) {
    const float one = 1.0f, zero = 0.0f;
    FJ_CUBLAS(cublas_api().cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &one, w, in, x, in,
                          &zero, y, out));
    const uint64_t n = static_cast<uint64_t>(rows) * out;
    bias_act_kernel<<<elementwise_grid(n), kThreads, 0, stream>>>(y, b, out, n, gelu ? 1 : 0, residual);
    FJ_CUDA(cudaGetLastError());
    return pfSuccess;
  }

  int elementwise_grid(uint64_t n) const {
    return static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(static_cast<uint64_t>(sms_) * 4,
                                                                     (n + kThreads - 1) / kThreads)));
  }

  pfResult_t launch_encoder_gemms(uint64_t first, uint64_t count, cudaStream_t stream, bool scatter = true) {
    FJ_CUBLAS(cublas_api().cublasSetStream(cublas_, stream));
    const EncoderArgs& a = encoder_;
    const int h = p_.hidden, n = p_.seq, dh = p_.hidden / p_.heads;
    const float one = 1.0f, zero = 0.0f;
    for (uint64_t done = 0; done < count; done += kEncoderChunk) {
      const uint64_t items = std::min<uint64_t>(kEncoderChunk, count - done);
      const int rows = static_cast<int>(items * n);
      const uint64_t per_item = static_cast<uint64_t>(n) * h;
      encoder_inputs_kernel<<<elementwise_grid(items * per_item), kThreads, 0, stream>>>(
          p_.seed, first + done, items, per_item, ex_);
      rows_layer_norm_kernel<<<elementwise_grid(rows), kThreads, 0, stream>>>(
          ex_, rows, h, a.ln1_gain, a.ln1_bias, enormed_);
      FJ_TRY(linear(stream, enormed_, rows, h, a.wq, a.bq, h, eq_, false, nullptr));
      FJ_TRY(linear(stream, enormed_, rows, h, a.wk, a.bk, h, ek_, false, nullptr));
      FJ_TRY(linear(stream, enormed_, rows, h, a.wv, a.bv, h, ev_, false, nullptr));
      const long long seq_stride = static_cast<long long>(n) * h;
      const long long score_stride = static_cast<long long>(n) * n;
      for (int head = 0; head < p_.heads; ++head) {
        const int off = head * dh;
        // scores[i][j] = q_i . k_j per sequence: column-major C(j,i) = K_block^T Q_block.
        FJ_CUBLAS(cublas_api().cublasSgemmStridedBatched(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, n, dh, &one,
                                            ek_ + off, h, seq_stride, eq_ + off, h, seq_stride,
                                            &zero, escores_, n, score_stride,
                                            static_cast<int>(items)));
        softmax_rows_kernel<<<elementwise_grid(rows), kThreads, 0, stream>>>(
            escores_, rows, n, rsqrtf(static_cast<float>(dh)));
        FJ_CUDA(cudaGetLastError());
        // att_i = sum_j p_ij v_j: column-major C(d,i) = V_block P^T.
        FJ_CUBLAS(cublas_api().cublasSgemmStridedBatched(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, dh, n, n, &one,
                                            ev_ + off, h, seq_stride, escores_, n, score_stride,
                                            &zero, eatt_ + off, h, seq_stride,
                                            static_cast<int>(items)));
      }
      FJ_TRY(linear(stream, eatt_, rows, h, a.wo, a.bo, h, ehs_, false, ex_));  // + x
      rows_layer_norm_kernel<<<elementwise_grid(rows), kThreads, 0, stream>>>(
          ehs_, rows, h, a.ln2_gain, a.ln2_bias, enormed_);
      FJ_TRY(linear(stream, enormed_, rows, h, a.w1, a.b1, p_.ffn, effn_, true, nullptr));
      FJ_TRY(linear(stream, effn_, rows, p_.ffn, a.w2, a.b2, h, ey_, false, ehs_));  // + hs
      scatter_ring_kernel<<<elementwise_grid(items * per_item), kThreads, 0, stream>>>(
          ey_, first + done, scatter ? items : 0, per_item, a.outputs, ring_items_);
      FJ_CUDA(cudaGetLastError());
    }
    return pfSuccess;
  }

  pfResult_t setup_training(const pfArenaAllocator_t* alloc) {
    TrainArgs& a = train_;
    a = TrainArgs{};
    const size_t i = p_.input, h = p_.hidden, o = p_.output, n = p_.rows;
    const std::vector<float>& all = m_.trainer_parameters;
    const std::vector<float> w1(all.begin(), all.begin() + h * i);
    const std::vector<float> b1(all.begin() + h * i, all.begin() + h * i + h);
    const std::vector<float> w2(all.begin() + h * i + h, all.begin() + h * i + h + o * h);
    const std::vector<float> b2(all.begin() + h * i + h + o * h, all.end());
    FJ_TRY(arena_upload(alloc, w1, &a.w1));
    FJ_TRY(arena_upload(alloc, b1, &a.b1));
    FJ_TRY(arena_upload(alloc, w2, &a.w2));
    FJ_TRY(arena_upload(alloc, b2, &a.b2));
    float* teacher = nullptr;
    FJ_TRY(arena_upload(alloc, m_.trainer_teacher, &teacher));
    a.teacher = teacher;
    a.input = p_.input, a.hidden = p_.hidden, a.output = p_.output, a.batch = p_.rows;
    a.lr = p_.learning_rate;
    a.data_seed = p_.seed ^ 0x5DEECE66Dull;
    FJ_TRY(arena_zeros(alloc, n * i, &a.x));
    FJ_TRY(arena_zeros(alloc, n * o, &a.target));
    FJ_TRY(arena_zeros(alloc, n * h, &a.h));
    FJ_TRY(arena_zeros(alloc, n * o, &a.y));
    FJ_TRY(arena_zeros(alloc, n * o, &a.gy));
    FJ_TRY(arena_zeros(alloc, n * h, &a.gh));
    cudaFuncAttributes attributes{};
    FJ_CUDA(cudaFuncGetAttributes(&attributes, train_ticket_kernel));
    FJ_CUDA(cudaFuncGetAttributes(&attributes, train_range_kernel));
    return pfSuccess;
  }

  static constexpr uint64_t kChunkItems = 256;
  static constexpr uint64_t kEncoderChunk = 64;
  static constexpr size_t kCublasWorkspaceBytes = size_t{4} << 20;

  HostModel m_;
  fjParams_t p_;
  int sms_ = 0;
  uint64_t ring_items_ = 1;
  MlpArgs mlp_{};
  size_t mlp_smem_ = 0;
  int mlp_per_sm_ = 0;
  float *chunk_x_ = nullptr, *chunk_h_ = nullptr, *chunk_y_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  EncoderArgs encoder_{};
  int encoder_blocks_ = 1;
  float *ex_ = nullptr, *enormed_ = nullptr, *eq_ = nullptr, *ek_ = nullptr, *ev_ = nullptr,
        *eatt_ = nullptr, *ehs_ = nullptr, *ey_ = nullptr, *effn_ = nullptr, *escores_ = nullptr;
  TrainArgs train_{};
};

}  // namespace

pfResult_t make_gpu_job(const HostModel& model, std::unique_ptr<GpuJob>* out) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return fj_fail(pfErrorNoDevice, "no CUDA device for a GPU fill job (%s)",
                   e == cudaSuccess ? "0 devices" : cudaGetErrorName(e));
  }
  int device = 0, sms = 0;
  FJ_CUDA(cudaGetDevice(&device));
  FJ_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  *out = std::make_unique<GpuJobImpl>(model, sms);
  return pfSuccess;
}

}  // namespace fill_jobs
