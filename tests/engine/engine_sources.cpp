// The engine and fill jobs live in examples/ (targets pipeline_engine, pipefill_fill_jobs), but
// every tests/<area> executable links only pipefill_core and must build even with
// PIPEFILL_BUILD_EXAMPLES=OFF, so the sources under test are compiled in here directly.
#include "../../examples/fill_jobs/reference.cpp"
#include "../../examples/fill_jobs/jobs.cpp"
#include "../../examples/fill_jobs/gpu_job_stub.cpp"
#include "../../examples/pipeline_engine/instructions.cpp"
#include "../../examples/pipeline_engine/sender_notice.cpp"
#include "../../examples/pipeline_engine/sim_transport.cpp"
#include "../../examples/pipeline_engine/host_timeline.cpp"
#include "../../examples/pipeline_engine/host_transport.cpp"
#include "../../examples/pipeline_engine/host_report.cpp"
#include "../../examples/pipeline_engine/stage_stats.cpp"
#include "../../examples/pipeline_engine/engine.cpp"
#include "../../examples/pipeline_engine/cuda_transport_stub.cpp"
#include "../../examples/pipeline_engine/peers.cpp"
#include "../../examples/pipeline_engine/frontier.cpp"
