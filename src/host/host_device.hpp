// The real-time host device: pipefill::Device on top of a host::Engine (host_engine.hpp). Made by
// make_host_device (device.hpp) for pfBackendHost; every runtime gets its own device, sized by
// PIPEFILL_HOST_SMS and PIPEFILL_HOST_MEMORY_BYTES. See docs/host-device.md.
#pragma once

#include <memory>

#include "device/device.hpp"
#include "host/host_engine.hpp"

namespace pipefill::host {

class HostDevice final : public Device {
 public:
  explicit HostDevice(std::shared_ptr<Engine> engine);
  ~HostDevice() override;  // stops the engine: queued work is dropped, threads joined

  Engine& engine() const { return *engine_; }

  pfBackend_t backend() const override { return pfBackendHost; }
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

  int sm_count() const override { return engine_->sm_count(); }
  pfResult_t configure_partition(int reserved_sms, FillPartition* partition) override;

  double now_us() override { return engine_->now_us(); }

  // Graph fill jobs: gated items on one block through the ticket kernel; each item writes the
  // index word, calls the job's on_item and lasts (at least) the job's item cost in real time.
  pfResult_t prepare_graph_items(const GraphJobSpec& spec,
                                 std::unique_ptr<GraphItems>* out) override;
  pfResult_t launch_graph_items(GraphItems& items, const pfSliceDesc_t& slice,
                                Stream stream) override;

 private:
  std::shared_ptr<Engine> engine_;
};

}  // namespace pipefill::host
