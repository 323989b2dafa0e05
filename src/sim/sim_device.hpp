// The simulated device: pipefill::Device on top of one device of a sim::World. Created by
// make_sim_device (device.hpp) either on a shared world (options.sim_world, device
// options.device) or on a private one-device world it owns (options.sim_seed, sim_sm_count,
// sim_memory_bytes).
#pragma once

#include <atomic>
#include <string>
#include <memory>
#include <unordered_set>

#include "common/mutex.hpp"
#include "common/thread_annotations.hpp"
#include "device/device.hpp"
#include "sim/sim_world.hpp"

namespace pipefill::sim {

class SimDevice final : public Device, public DrivenClock {
 public:
  // `owned` is non-null for a private world (then world == owned.get()).
  SimDevice(World* world, std::unique_ptr<World> owned, int device_index);
  ~SimDevice() override;

  // DrivenClock: virtual time advances only inside pfSimRunUntil*/pfSimRunUntilIdle.
  pfSimWorld_t world_handle() const override;
  void add_pre_run_hook(const void* owner, std::function<void()> hook) override {
    world_->add_pre_run_hook(owner, std::move(hook));
  }
  void remove_pre_run_hook(const void* owner) override { world_->remove_pre_run_hook(owner); }
  bool driven_by_calling_thread() const override { return world_->is_driven_by_calling_thread(); }
  DrivenClock* driven_clock() override { return this; }

  World& world() const { return *world_; }
  int device_index() const { return device_; }

  pfBackend_t backend() const override { return pfBackendSim; }
  std::string name() const override;

  pfResult_t priority_range(int* lowest, int* highest) override;
  pfResult_t create_fill_stream(Stream* out) override;
  pfResult_t create_stream(int priority, Stream* out) override;
  pfResult_t destroy_stream(Stream stream) override;
  bool is_valid_main_stream(Stream stream) const override;
  pfResult_t synchronize_stream(Stream stream) override;

  pfResult_t create_event(Event* out) override;
  pfResult_t destroy_event(Event event) override;
  pfResult_t record_event(Event event, Stream stream) override;
  pfResult_t stream_wait_event(Stream stream, Event event) override;
  pfResult_t query_event(Event event, bool* done, double* time_us) override;
  pfResult_t synchronize_event(Event event) override;

  pfResult_t allocate_words(size_t count, uint64_t** words) override;
  pfResult_t free_words(uint64_t* words) override;
  pfResult_t allocate_host_words(size_t count, uint64_t** words) override;
  pfResult_t free_host_words(uint64_t* words) override;
  pfResult_t write_word(Stream stream, uint64_t* word, uint64_t value) override;
  pfResult_t copy_word_to_host(Stream stream, const uint64_t* word, uint64_t* host) override;

  pfResult_t memory_info(size_t* free_bytes, size_t* total_bytes) override;
  pfResult_t allocate_arena(size_t bytes, void** base) override;
  pfResult_t free_arena(void* base) override;

  int sm_count() const override;
  pfResult_t configure_partition(int reserved_sms, FillPartition* partition) override;
  // Every runtime on one device of a world shares that device's partition (Device docs).
  bool shared_partition(std::string* key, int* reserved_now) const override {
    *key = "simulated world " + std::to_string(reinterpret_cast<uintptr_t>(world_)) +
           " device " + std::to_string(device_);
    *reserved_now = world_->sm_count(device_) - world_->fill_sms(device_);
    return true;
  }

  double now_us() override;

  // Calibration: the world's activity records of this device not collected before (the
  // simulated counterpart of the CUPTI collector).
  pfResult_t collect_activity(std::vector<ActivityRecord>* out) override;

  // Graph fill jobs: gated items of the job's cost on one block, through the ticket kernel
  // (World::launch_ticket); each item writes the index word, then calls the job's on_item.
  pfResult_t prepare_graph_items(const GraphJobSpec& spec,
                                 std::unique_ptr<GraphItems>* out) override;
  pfResult_t launch_graph_items(GraphItems& items, const pfSliceDesc_t& slice,
                                Stream stream) override;

 private:
  std::atomic<size_t> activity_collected_{0};
  World* world_;
  std::unique_ptr<World> owned_world_;  // private world (destroyed after our streams)
  int device_;
  // What this device created, destroyed with it when the runtime did not.
  mutable Mutex created_mutex_;
  std::unordered_set<void*> streams_ GUARDED_BY(created_mutex_);
  std::unordered_set<void*> events_ GUARDED_BY(created_mutex_);
};

}  // namespace pipefill::sim
