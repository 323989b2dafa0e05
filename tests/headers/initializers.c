/* Expands every PF_*_INITIALIZER macro of pipefill.h and the headers it includes, at file scope
 * (constant initializers) and in a function; compiled as C99/C11 and as C++17/C++20
 * (-Wold-style-cast, -Wmissing-field-initializers via -Wextra) by tests/headers/check_headers.sh. */
#include <pipefill/pipefill.h>

static const pfConfig_t kConfig = PF_CONFIG_INITIALIZER;
static const pfBubbleHint_t kHint = PF_BUBBLE_HINT_INITIALIZER;
static const pfJobDesc_t kJob = PF_JOB_DESC_INITIALIZER;
static const pfGraphJobDesc_t kGraph = PF_GRAPH_JOB_DESC_INITIALIZER;
static const pfSimDeviceDesc_t kDevice = PF_SIM_DEVICE_DESC_INITIALIZER;
static const pfSimDeviceDesc_t kQuiet = PF_SIM_DEVICE_DESC_NO_INTERFERENCE_INITIALIZER;
static const pfSimFillDesc_t kFill = PF_SIM_FILL_DESC_INITIALIZER;

int pipefill_header_check_initializers(void);
int pipefill_header_check_initializers(void) {
  pfConfig_t config = PF_CONFIG_INITIALIZER;
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  pfJobDesc_t job = PF_JOB_DESC_INITIALIZER;
  pfGraphJobDesc_t graph = PF_GRAPH_JOB_DESC_INITIALIZER;
  pfSimDeviceDesc_t device = PF_SIM_DEVICE_DESC_INITIALIZER;
  pfSimDeviceDesc_t quiet = PF_SIM_DEVICE_DESC_NO_INTERFERENCE_INITIALIZER;
  pfSimFillDesc_t fill = PF_SIM_FILL_DESC_INITIALIZER;
  return config.version + kConfig.version + hint.kind + kHint.kind + job.kind + kJob.kind +
         (graph.size + kGraph.size + fill.size + kFill.size > 0 ? 1 : 0) + device.sm_count +
         kDevice.sm_count + quiet.sm_count + kQuiet.sm_count + PIPEFILL_VERSION_CODE;
}
