// The real-time host device: pipefill::Device on top of a host::Engine (host_engine.hpp). Made by
// make_host_device (device.hpp) for pfBackendHost; every runtime gets its own device, sized by
// PIPEFILL_HOST_SMS and PIPEFILL_HOST_MEMORY_BYTES. See docs/host-device.md. The Device
// operations are the shared engine adapter's (device/engine_device.hpp), the engine being its
// port; this file adds the name and graph items.
#pragma once

#include <memory>
#include <string>

#include "device/device.hpp"
#include "device/engine_device.hpp"
#include "host/host_engine.hpp"

namespace pipefill::host {

class HostDevice final : public EngineDevice<HostDevice, Engine> {
 public:
  static constexpr const char* kWhat = "host-device";

  explicit HostDevice(std::shared_ptr<Engine> engine);
  ~HostDevice() override;  // stops the engine: queued work is dropped, threads joined

  Engine& engine() const { return *engine_; }
  Engine& port() const { return *engine_; }

  pfBackend_t backend() const override { return pfBackendHost; }
  std::string name() const override;

  // Graph fill jobs: gated items on one block through the ticket kernel; each item writes the
  // index word, calls the job's on_item and lasts (at least) the job's item cost in real time.
  pfResult_t prepare_graph_items(const GraphJobSpec& spec,
                                 std::unique_ptr<GraphItems>* out) override;
  pfResult_t launch_graph_items(GraphItems& items, const pfSliceDesc_t& slice,
                                Stream stream) override;
  // The engine's host function (pfHostLaunchHostFunc): runs on the stream's thread.
  pfResult_t host_func(Stream stream, void (*fn)(void*), void* user) override {
    return engine_->host_func(stream, fn, user);
  }

 private:
  std::shared_ptr<Engine> engine_;
};

}  // namespace pipefill::host
