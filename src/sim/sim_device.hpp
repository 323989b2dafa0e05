// The simulated device: pipefill::Device on top of one device of a sim::World. Created by
// make_sim_device (device.hpp) either on a shared world (options.sim_world, device
// options.device) or on a private one-device world it owns (options.sim_seed, sim_sm_count,
// sim_memory_bytes). The Device operations are the shared engine adapter's
// (device/engine_device.hpp); this file adds the world's clock, calibration and graph items.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "device/device.hpp"
#include "device/engine_device.hpp"
#include "sim/sim_world.hpp"

namespace pipefill::sim {

// One device of a world with the port interface of EngineDevice (the device index bound).
class WorldPort {
 public:
  static constexpr int kLowestPriority = sim::kLowestPriority;
  static constexpr int kHighestPriority = sim::kHighestPriority;

  WorldPort(World* world, int device) : world_(world), device_(device) {}
  World& world() const { return *world_; }
  int device() const { return device_; }

  pfResult_t create_stream(int priority, bool fill, void** out) {
    return world_->create_stream(device_, priority, fill, out);
  }
  pfResult_t destroy_stream(void* stream) { return world_->destroy_stream(stream); }
  bool is_main_stream(const void* stream) const { return world_->is_main_stream_of(stream, device_); }
  bool is_live_stream(const void* stream) const { return world_->is_live_stream(stream); }
  pfResult_t synchronize_stream(void* stream) { return world_->synchronize_stream(stream); }
  pfResult_t create_event(void** out) { return world_->create_event(out); }
  pfResult_t destroy_event(void* event) { return world_->destroy_event(event); }
  bool is_live_event(const void* event) const { return world_->is_live_event(event); }
  pfResult_t record_event(void* event, void* stream) { return world_->record_event(event, stream); }
  // No latency and no SMs held: the runtime's own waits are plain stream-order dependencies.
  pfResult_t wait_event(void* stream, void* event) {
    return world_->wait_event(stream, event, 0.0, 0);
  }
  pfResult_t event_state(void* event, bool* recorded, bool* done, double* time_us) const {
    return world_->event_state(event, recorded, done, time_us);
  }
  pfResult_t event_item_failures(void* event, uint64_t* count, uint64_t* not_run,
                                 std::string* first) const {
    return world_->event_item_failures(event, count, not_run, first);
  }
  pfResult_t synchronize_event(void* event) { return world_->synchronize_event(event); }
  pfResult_t allocate_words(size_t count, uint64_t** words) {
    return world_->allocate_words(count, words);
  }
  pfResult_t free_words(uint64_t* words) { return world_->free_words(words); }
  pfResult_t write_word(void* stream, uint64_t* word, uint64_t value) {
    return world_->write_word(stream, word, value);
  }
  pfResult_t write_word_max(void* stream, uint64_t* word, uint64_t value) {
    return world_->write_word_max(stream, word, value);
  }
  pfResult_t copy_word(void* stream, const uint64_t* source, uint64_t* destination) {
    return world_->copy_word(stream, source, destination);
  }
  pfResult_t memory_info(size_t* free_bytes, size_t* total_bytes) const {
    return world_->memory_info(device_, free_bytes, total_bytes);
  }
  pfResult_t allocate_arena(size_t bytes, void** base) {
    return world_->allocate_arena(device_, bytes, base);
  }
  pfResult_t free_arena(void* base) { return world_->free_arena(device_, base); }
  pfResult_t configure_partition(int reserved_sms, FillPartition* partition) {
    return world_->configure_partition(device_, reserved_sms, partition);
  }
  int sm_count() const { return world_->sm_count(device_); }
  double now_us() const { return world_->now(); }

 private:
  World* world_;
  int device_;
};

class SimDevice final : public EngineDevice<SimDevice, WorldPort>, public DrivenClock {
 public:
  static constexpr const char* kWhat = "simulated device";

  // `owned` is non-null for a private world (then world == owned.get()).
  SimDevice(World* world, std::unique_ptr<World> owned, int device_index);
  ~SimDevice() override;

  WorldPort& port() const { return port_; }

  // DrivenClock: virtual time advances only inside pfSimRunUntil*/pfSimRunUntilIdle.
  pfSimWorld_t world_handle() const override;
  void add_pre_run_hook(const void* owner, std::function<void()> hook) override {
    world().add_pre_run_hook(owner, std::move(hook));
  }
  void remove_pre_run_hook(const void* owner) override { world().remove_pre_run_hook(owner); }
  bool driven_by_calling_thread() const override { return world().is_driven_by_calling_thread(); }
  DrivenClock* driven_clock() override { return this; }

  World& world() const { return port_.world(); }
  int device_index() const { return port_.device(); }

  pfBackend_t backend() const override { return pfBackendSim; }
  std::string name() const override;

  // Every runtime on one device of a world shares that device's partition (Device docs).
  bool shared_partition(std::string* key, int* reserved_now) const override {
    *key = "simulated world " + std::to_string(reinterpret_cast<uintptr_t>(&world())) +
           " device " + std::to_string(device_index());
    *reserved_now = world().sm_count(device_index()) - world().fill_sms(device_index());
    return true;
  }

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
  std::unique_ptr<World> owned_world_;  // private world (destroyed after our streams)
  mutable WorldPort port_;
};

}  // namespace pipefill::sim
