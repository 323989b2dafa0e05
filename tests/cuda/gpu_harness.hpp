// Shared fixture of the GPU tests: a CUDA device with its fill partition, a fill stream, a
// high-priority main stream, the slice words, and helpers to run bubbles the way the runtime
// does (main stream: begin event, a "receive wait" kernel, gate close; fill stream: wait on the
// begin event, zero the budget, launch the slice). Every test skips without a GPU.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/error.hpp"
#include "core/config.hpp"
#include "cuda_device.hpp"
#include "device/device.hpp"
#include "fill_kernels.hpp"

namespace pipefill::cuda::testing {

#define PF_ASSERT_OK(expr) ASSERT_EQ((expr), pfSuccess) << ::pipefill::last_error_message()
#define PF_EXPECT_OK(expr) EXPECT_EQ((expr), pfSuccess) << ::pipefill::last_error_message()

// A zeroed device array that frees itself.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : count_(count) {
    if (cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T)) != cudaSuccess || cudaMemset(data_, 0, count * sizeof(T)) != cudaSuccess)
      data_ = nullptr;
  }
  ~DeviceArray() {
    if (data_) (void)cudaFree(data_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return data_; }
  std::vector<T> to_host() const {
    std::vector<T> host(count_);
    if (cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) host.clear();
    return host;
  }
  bool fill(const std::vector<T>& values) {
    return cudaMemcpy(data_, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess;
  }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};

class CudaGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    RuntimeOptions options;
    options.device = 0;
    PF_ASSERT_OK(make_cuda_device(options, &device_));
    PF_ASSERT_OK(device_->configure_partition(-1, &partition_));
    PF_ASSERT_OK(device_->create_fill_stream(&fill_));
    int lowest = 0;
    PF_ASSERT_OK(device_->priority_range(&lowest, &highest_priority_));
    PF_ASSERT_OK(device_->create_stream(highest_priority_, &main_));
    PF_ASSERT_OK(device_->allocate_words(3, &words_));
    PF_ASSERT_OK(device_->create_event(&begin_));
    PF_ASSERT_OK(device_->create_event(&end_));
  }

  void TearDown() override {
    if (!device_) return;
    if (fill_) (void)device_->synchronize_stream(fill_);
    if (main_) (void)device_->synchronize_stream(main_);
    if (begin_) (void)device_->destroy_event(begin_);
    if (end_) (void)device_->destroy_event(end_);
    device_.reset();
  }

  uint64_t* gate() const { return &words_[0]; }
  uint64_t* cursor() const { return &words_[1]; }
  uint64_t* budget() const { return &words_[2]; }

  // Blocks of a slice: one per fill SM (grid-cap) or `per_sm` per SM inside a green context.
  int max_blocks(int per_sm = 1) const {
    return partition_.hardware_confined ? partition_.fill_sms * per_sm : partition_.fill_sms;
  }

  pfSliceDesc_t slice(uint64_t bubble_id, uint64_t max_items, uint64_t total_items) const {
    pfSliceDesc_t s{};
    s.bubble_id = bubble_id;
    s.max_items = max_items;
    s.total_items = total_items;
    s.max_blocks = max_blocks();
    s.gate = gate();
    s.cursor = cursor();
    s.budget_counter = budget();
    return s;
  }

  // Main stream: begin event, a `bubble_ns` wait (stamped into *bubble_end_ns if given), gate
  // closed with `bubble_id`, end event. Fill stream: waits for begin, zeroes the budget, runs
  // the slice. The fill side is enqueued before the main side's wait and gate close: with
  // CUDA_DEVICE_MAX_CONNECTIONS=1 both streams of one context share one hardware queue, which
  // runs operations in enqueue order, so a slice enqueued after the gate write would only start
  // once the gate is closed and run nothing (docs/cuda-backend-fill.md, "One device connection").
  void run_bubble(uint64_t bubble_id, uint64_t bubble_ns, const pfSliceDesc_t& s, const SpinItemsParams& params,
                  uint64_t* bubble_end_ns = nullptr, int* grid = nullptr) {
    PF_ASSERT_OK(device_->record_event(begin_, main_));
    PF_ASSERT_OK(device_->stream_wait_event(fill_, begin_));
    PF_ASSERT_OK(device_->write_word(fill_, budget(), 0));
    PF_ASSERT_OK(launch_spin_items(s, fill_, params, grid));
    PF_ASSERT_OK(launch_spin_and_stamp(main_, bubble_ns, bubble_end_ns));
    PF_ASSERT_OK(device_->write_word(main_, gate(), bubble_id));
    PF_ASSERT_OK(device_->record_event(end_, main_));
  }

  CudaDeviceExtras& extras() const { return dynamic_cast<CudaDeviceExtras&>(*device_); }

  uint64_t read_word(const uint64_t* word) {
    uint64_t value = ~uint64_t{0};
    EXPECT_EQ(cudaMemcpy(&value, word, sizeof value, cudaMemcpyDeviceToHost), cudaSuccess);
    return value;
  }

  void sync_all() {
    PF_ASSERT_OK(device_->synchronize_stream(main_));
    PF_ASSERT_OK(device_->synchronize_stream(fill_));
  }

  std::unique_ptr<Device> device_;
  FillPartition partition_;
  Stream fill_ = nullptr;
  Stream main_ = nullptr;
  int highest_priority_ = 0;
  uint64_t* words_ = nullptr;
  Event begin_ = nullptr;
  Event end_ = nullptr;
};

}  // namespace pipefill::cuda::testing
