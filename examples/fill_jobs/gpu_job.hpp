// The CUDA side of the example fill jobs, behind a small interface so that the job logic
// (jobs.cpp) compiles without CUDA headers. gpu_job.cu implements it when the library is built
// with CUDA (FILL_JOBS_WITH_CUDA); gpu_job_stub.cpp otherwise refuses with pfErrorNotSupported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "fill_jobs.h"
#include "reference.hpp"

namespace fill_jobs {

// Host copies of everything the device needs (weights are generated on the host so CPU and GPU
// see identical values).
struct HostModel {
  fjParams_t params{};
  MlpWeights mlp;
  EncoderWeights encoder;
  std::vector<float> trainer_parameters;  // RegressionTrainer::parameters() layout
  std::vector<float> trainer_teacher;     // RegressionTrainer::teacher()
};

class GpuJob {
 public:
  virtual ~GpuJob() = default;
  // Outside any bubble: allocate from the arena, upload weights, create library handles.
  virtual pfResult_t setup(const pfArenaAllocator_t* allocator) = 0;
  // Enqueue one slice on the fill stream: no allocation, no synchronisation.
  virtual pfResult_t launch(const pfSliceDesc_t* slice, void* stream) = 0;
  // Outside bubbles: read an inference item's output back (synchronises the device).
  virtual pfResult_t read_output(uint64_t item, float* out, size_t count) = 0;
  // Outside bubbles: training parameters in RegressionTrainer::parameters() layout.
  virtual pfResult_t read_parameters(std::vector<float>* parameters) = 0;
  // Arena bytes setup() will allocate (weights, output ring, scratch, library workspace).
  virtual size_t resident_bytes() const = 0;
};

// Sets fjGetLastErrorMessage's text; returns code.
pfResult_t fj_fail(pfResult_t code, const char* format, ...);

pfResult_t make_gpu_job(const HostModel& model, std::unique_ptr<GpuJob>* out);

}  // namespace fill_jobs
