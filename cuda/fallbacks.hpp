// The CUDA backend's fallback decisions as pure functions (no CUDA call here, so each path is
// unit-tested on machines without a GPU): why a device ended up in grid-cap mode instead of a
// green context, whether that reason is an explanation or a bug, and what the cross-context
// event self-test run at device creation concluded.
#pragma once

#include <string>

namespace pipefill::cuda {

// Why the fill partition is not a green context (None: it is).
enum class FallbackCause {
  None,
  NoDriver,            // no CUDA driver at all
  DriverTooOld,        // driver < 12.5 (cuGreenCtxStreamCreate is a 12.5 symbol)
  EntryPointsMissing,  // driver >= 12.5 but an entry point did not resolve: a bug of ours
  DisabledByEnv,       // PIPEFILL_GREEN_CONTEXT=0
  NoUsefulSplit,       // no SM split leaves the reserved SMs free
  DriverCallFailed,    // resource query, split, descriptor or green-context creation failed
  StreamCreationFailed,
  WarmUpFailed,        // the fill kernels could not be launched on the green-context stream
  EventSelfTestFailed, // primary-context events do not work with green-context streams
  MemoryOpsSelfTestFailed, // the fill stream cannot write a word or copy the cursor back
};

const char* fallback_cause_name(FallbackCause cause);

struct PartitionOutcome {
  FallbackCause cause = FallbackCause::None;
  std::string detail;  // the failing call and its error name, or what the self-test saw
};

// Whether a device on `driver_version` may legitimately be in the outcome's mode. A green
// context (None) always is. A fallback is explained when it names a real cause: a driver older
// than 12.5, an opt-out, or a failing call / self-test with its error. Missing entry points or
// "driver too old" on a >= 12.5 driver are not explanations (they are how the 12040-vs-12050
// entry-point bug looked), and neither is a runtime failure without a detail. The GPU tests
// fail on an unexplained fallback.
bool fallback_is_explained(int driver_version, const PartitionOutcome& outcome);

// One line for logs and test output: "green context" or "grid cap: <cause>: <detail>".
std::string describe(const PartitionOutcome& outcome);

// What the device's cross-context event self-test observed. The test, on a device with a green
// context: main side (primary context) records event A, runs a kernel of known length, records
// B; the fill side (green-context stream) waits for B and records C, an event created in the
// primary context, as the runtime does with its slice events. Every error field is "" when
// that call succeeded, else "<call>: <error name>".
struct EventSelfTest {
  std::string create_error;   // cudaEventCreate of A, B, C
  std::string wait_error;     // cudaStreamWaitEvent(green stream, B)
  std::string record_error;   // cudaEventRecord(C, green stream)
  std::string sync_error;     // cudaEventSynchronize(C)
  std::string elapsed_error;  // cudaEventElapsedTime(A, C)
  double elapsed_ms = -1.0;   // elapsed(A, C): C comes after the main kernel, so >= its length
  double kernel_ms = 0.0;     // the main-side kernel's nominal length
};

// "" when the runtime may record primary-context events on green-context streams and time them
// against primary-context events; else the first thing that went wrong, in the order the calls
// ran. A timing that shows C before the end of the main kernel (below 90% of its nominal
// length) means the cross-context wait or the timing is wrong.
std::string event_self_test_failure(const EventSelfTest& test);

// What the fill stream's memory-operation self-test observed (green-context mode, at device
// creation, as the gate write is tested on the control stream): the runtime writes words on the
// fill streams (a slice's budget counter, a graph job's slice words) and copies the job's cursor
// back to pinned host memory after every slice. On the green-context stream, in order: the
// probe word is read back (it was zeroed), written with cuStreamWriteValue64 (when that is the
// device's write mode) and read back, written by a copy from a pinned slot and read back.
// Error fields: "" when the call succeeded, else "<call>: <error name>".
struct MemoryOpsSelfTest {
  std::string readback_error;      // cudaMemcpyAsync(pinned <- probe) on the fill stream
  bool readback_landed = false;    // the host word took the probe's value (0)
  bool stream_write_tried = false; // cuStreamWriteValue64 is the device's gate write mode
  std::string stream_write_error;  // cuStreamWriteValue64 (or its read-back)
  bool stream_write_landed = false;
  std::string pinned_copy_error;   // cudaMemcpyAsync(probe <- pinned slot) (or its read-back)
  bool pinned_copy_landed = false;
};

struct MemoryOpsVerdict {
  bool usable = false;        // the fill streams can do the runtime's word operations
  bool stream_write = false;  // ... writing words with cuStreamWriteValue64 (else pinned copies)
  std::string detail;         // why not (usable == false), or why the write falls back
};

// The fill streams' word writes use cuStreamWriteValue64 when it was tried and landed, else the
// pinned-slot copy when that landed; without a working read-back or any working write the green
// context cannot be used (grid-cap mode, cause MemoryOpsSelfTestFailed with the detail).
MemoryOpsVerdict judge_memory_ops(const MemoryOpsSelfTest& test);

}  // namespace pipefill::cuda
