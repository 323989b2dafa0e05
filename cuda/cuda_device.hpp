// The CUDA implementation of pipefill::Device. Internal to the backend; the core reaches it only
// through device/device.hpp (make_cuda_device). Tests and benchmarks may include it for the
// CUDA-specific extras (gate-write mode, CUPTI collector).
#pragma once

#include <memory>
#include <string>

#include "device/device.hpp"
#include "fallbacks.hpp"

namespace pipefill::cuda {

class ActivityCollector;

// How write_word (the gate close) is enqueued.
enum class GateWriteMode {
  StreamWriteValue,  // cuStreamWriteValue64 via driver entry point: executed by the stream's
                     // front end, no SM, no host memory to keep alive
  PinnedCopy         // fallback: cudaMemcpyAsync of the value from a pinned slot ring
};
const char* gate_write_mode_name(GateWriteMode mode);

// Cluster occupancy (issue 33 item 6): clusters of `cluster_size` blocks resident at once on the
// fill partition (its green context's SMs, or the whole device in grid-cap mode) and on the whole
// device; 0 when the query failed (logged).
struct ClusterOccupancy {
  int cluster_size = 0;
  int fill_partition = 0;
  int device = 0;
};

// Backend-specific view of a CUDA device (dynamic_cast a Device made by make_cuda_device).
class CudaDeviceExtras {
 public:
  virtual ~CudaDeviceExtras() = default;
  virtual int ordinal() const = 0;
  virtual GateWriteMode gate_write_mode() const = 0;
  // The CUPTI collector when calibration mode is on and CUPTI could start; else nullptr.
  virtual ActivityCollector* activity_collector() = 0;
  virtual const FillPartition& partition() const = 0;
  // Why the partition is (not) a green context; see fallbacks.hpp. Set by configure_partition.
  virtual const PartitionOutcome& partition_outcome() const = 0;
  // CUDA_DEVICE_MAX_CONNECTIONS=1 was in force when the device was created (one hardware queue
  // per context: see docs/cuda-backend-fill.md, "One device connection").
  virtual bool single_connection() const = 0;
  // Measured by configure_partition.
  virtual ClusterOccupancy cluster_occupancy() const = 0;
};

}  // namespace pipefill::cuda
