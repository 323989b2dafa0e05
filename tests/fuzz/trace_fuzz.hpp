// One fuzz input through the trace analyser: the streaming importer at two chunk sizes (same
// outcome required), the DOM importer (same records required whenever both accept the input),
// then the analysis, the report (text and JSON) and a self-comparison of every analysable
// device. A broken invariant aborts with a message: a crash for libFuzzer, a failure for the
// corpus regression test that runs the same code in the normal (gcc, sanitizer) build.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pipefill::analysis::fuzz {

void run_one(const uint8_t* data, size_t size);

}  // namespace pipefill::analysis::fuzz
