/* Links against the installed libpipefill (pkg-config or find_package(pipefill)) from C99: the
 * header's version is the loaded library's, and a simulated runtime is created and destroyed. */
#include <pipefill/pipefill.h>
#include <stdio.h>

int main(void) {
  int version = 0;
  pfConfig_t config = PF_CONFIG_INITIALIZER;
  pfRuntime_t runtime = NULL;
  pfStats_t stats;
  if (pfGetVersion(&version) != pfSuccess) return 1;
  printf("pipefill %d (header %d)\n", version, PIPEFILL_VERSION_CODE);
  if (version != PIPEFILL_VERSION_CODE) return 2;
  config.backend = pfBackendSim;
  config.log_level = pfLogError;
  if (pfRuntimeCreate(&config, &runtime) != pfSuccess) {
    fprintf(stderr, "pfRuntimeCreate: %s\n", pfGetLastErrorMessage());
    return 3;
  }
  if (pfRuntimeGetStatsV2(runtime, &stats, sizeof stats) != pfSuccess) return 4;
  if (pfRuntimeDestroy(runtime) != pfSuccess) return 5;
  return stats.bubbles == 0 ? 0 : 6;
}
