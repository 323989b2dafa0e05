// The fill jobs live in examples/fill_jobs (library pipefill_fill_jobs), but every tests/<area>
// executable links only pipefill_core and must build even with PIPEFILL_BUILD_EXAMPLES=OFF, so
// the sources under test are compiled into this executable directly.
#include "../../examples/fill_jobs/reference.cpp"
#include "../../examples/fill_jobs/jobs.cpp"
#include "../../examples/fill_jobs/gpu_job_stub.cpp"
