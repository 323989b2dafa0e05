// Links against the installed libpipefill from C++17 (pkg-config or find_package(pipefill)): the
// C++ layer (pipefill.hpp, devices.hpp) and the item protocol compile at C++17, a simulated runtime
// runs a bubble, and a job outliving its Runtime object keeps the runtime alive.
#include <pipefill/item_protocol.hpp>
#include <pipefill/pipefill.hpp>

#include <cstdio>

int main() {
  if (pipefill::version() != PIPEFILL_VERSION_CODE) return 2;
  pfConfig_t config = pipefill::default_config();
  config.backend = pfBackendSim;
  config.log_level = pfLogError;
  pipefill::SimWorld world(1);
  pipefill::Runtime runtime(config, world);
  pipefill::OwnedStream main_stream = runtime.high_priority_stream();
  {
    pipefill::BubbleScope bubble(runtime, main_stream.get());
    pipefill::sim_device::stream_delay(main_stream.get(), 100.0);
  }
  runtime.iteration_end();
  world.run_until_idle();
  runtime.synchronize();
  const pfStats_t stats = runtime.stats();
  std::printf("pipefill %d: %llu bubble(s), %zu class(es)\n", pipefill::version(),
              static_cast<unsigned long long>(stats.bubbles), runtime.class_count());
  return stats.bubbles == 1 && pipefill::last_destructor_error() == pfSuccess ? 0 : 3;
}
