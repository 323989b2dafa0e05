// Built without CUDA: GPU fill jobs are refused with a clear message instead of failing to link.
#ifndef FILL_JOBS_WITH_CUDA
#include "gpu_job.hpp"

namespace fill_jobs {

pfResult_t make_gpu_job(const HostModel&, std::unique_ptr<GpuJob>*) {
  return fj_fail(pfErrorNotSupported,
                 "the fill jobs were built without CUDA; backend=%d (cuda) is not available, "
                 "use the simulated backend",
                 static_cast<int>(pfBackendCuda));
}

}  // namespace fill_jobs
#endif
