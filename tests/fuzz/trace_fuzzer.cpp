// libFuzzer entry point over the trace importer and the analysis (see trace_fuzz.hpp). Built
// with clang only (PIPEFILL_BUILD_FUZZERS); the ctest labelled "fuzz" runs a fixed number of
// executions from tests/fuzz/corpus.
#include <cstddef>
#include <cstdint>

#include "trace_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pipefill::analysis::fuzz::run_one(data, size);
  return 0;
}
