// HostDevice: the host engine's name and graph items; the Device operations come from the shared
// engine adapter (device/engine_device.hpp), which catches every exception.
#include "host/host_device.hpp"

#include <atomic>
#include <chrono>
#include <exception>
#include <thread>
#include <new>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/log.hpp"
#include "core/config.hpp"

namespace pipefill::host {

HostDevice::HostDevice(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {}

// The engine's shutdown drops every stream and event it has, those the runtime left included.
HostDevice::~HostDevice() { engine_->shutdown(); }

std::string HostDevice::name() const {
  return fmt::format("host device ({} SM threads, real time)", engine_->sm_count());
}

// ---- Graph fill jobs -----------------------------------------------------------------------
namespace {

// A graph job on the host device: each item is a ticket item (claimed by the protocol a GPU
// block runs) that writes its index where the graph would read it, reports it, and then takes
// the job's item cost of real time (sleeping, so idle cores stay idle) - unless on_item is the
// item's work (a Python item job): then the item lasts as long as on_item, and a wrong
// item_cost_us (the planner's prior) does not stretch every item to it.
class HostGraphItems final : public GraphItems {
 public:
  explicit HostGraphItems(const GraphJobSpec& spec)
      : index_word_(spec.index_word), on_item_(spec.on_item), user_(spec.user),
        items_are_work_(spec.on_item_is_work),
        item_cost_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double, std::micro>(spec.on_item_is_work ? 0.0
                                                                            : spec.item_cost_us))) {}
  int sms_used() const override { return 1; }  // launch_graph_items runs items on one worker
  bool items_are_work() const { return items_are_work_; }

  static void run_item(void* self, uint64_t item) {
    auto* items = static_cast<HostGraphItems*>(self);
    const auto start = std::chrono::steady_clock::now();
    std::atomic_ref<uint64_t>(*items->index_word_).store(item);
    if (items->on_item_ != nullptr) items->on_item_(items->user_, item);
    std::this_thread::sleep_until(start + items->item_cost_);
  }

 private:
  uint64_t* index_word_;
  pfGraphItemFn on_item_;
  void* user_;
  bool items_are_work_;
  std::chrono::steady_clock::duration item_cost_;
};

}  // namespace

pfResult_t HostDevice::prepare_graph_items(const GraphJobSpec& spec,
                                           std::unique_ptr<GraphItems>* out) {
  return guarded("prepare_graph_items", [&] {
    *out = std::make_unique<HostGraphItems>(spec);
    return pfSuccess;
  });
}

pfResult_t HostDevice::launch_graph_items(GraphItems& items, const pfSliceDesc_t& slice,
                                          Stream stream) {
  auto* graph = dynamic_cast<HostGraphItems*>(&items);
  if (graph == nullptr) {
    return fail(pfErrorInternal, "launch_graph_items: the items were not prepared by {}", name());
  }
  return guarded("launch_graph_items", [&] {
    // Items that are the host thread's own work (Python) are counted at their fastest sample:
    // the time budget keeps the slice's last one out of the main job's next step.
    return engine_->launch_ticket(stream, &slice, 1, &HostGraphItems::run_item, graph,
                                  /*time_budget=*/graph->items_are_work());
  });
}

}  // namespace pipefill::host

namespace pipefill {

pfResult_t make_host_device(const RuntimeOptions& options, std::unique_ptr<Device>* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "device output pointer is NULL");
  try {
    host::EngineOptions engine_options;
    PF_TRY(host::engine_options_from_env(&engine_options));
    std::shared_ptr<host::Engine> engine;
    PF_TRY(host::Engine::create(engine_options, &engine));
    if (options.device != 0) {
      log::debug("the host device is private to its runtime; device {} is ignored",
                 options.device);
    }
    *out = std::make_unique<host::HostDevice>(std::move(engine));
    return pfSuccess;
  } catch (const std::bad_alloc&) {
    return fail(pfErrorOutOfMemory, "host memory exhausted creating the host device");
  } catch (const std::exception& error) {
    return fail(pfErrorInternal, "creating the host device failed: {}", error.what());
  }
}

}  // namespace pipefill
