/* Links against the installed libpipefill through find_package(pipefill). */
#include <pipefill/pipefill.h>
#include <stdio.h>

int main(void) {
  int version = 0;
  if (pfGetVersion(&version) != pfSuccess) return 1;
  printf("pipefill %d\n", version);
  return version == PIPEFILL_VERSION_CODE ? 0 : 2;
}
