// Every seed of the fuzz corpus (tests/fuzz/corpus) through the fuzz target's checks in the
// normal build, so that the gcc ASan/UBSan stage of scripts/test.sh runs them too. A broken
// invariant aborts the test binary with its message.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "trace_fuzz.hpp"

namespace {

TEST(FuzzCorpus, EverySeedKeepsTheInvariants) {
  std::vector<std::filesystem::path> seeds;
  for (const auto& entry : std::filesystem::directory_iterator(PIPEFILL_FUZZ_CORPUS_DIR)) {
    if (entry.is_regular_file()) seeds.push_back(entry.path());
  }
  std::sort(seeds.begin(), seeds.end());
  ASSERT_GE(seeds.size(), 10u);
  for (const auto& seed : seeds) {
    SCOPED_TRACE(seed.string());
    std::ifstream in(seed, std::ios::binary);
    const std::string bytes(std::istreambuf_iterator<char>(in), {});
    ASSERT_FALSE(bytes.empty());
    pipefill::analysis::fuzz::run_one(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    // Every prefix of a small seed: truncated traces and gzip streams end in clear errors.
    if (bytes.size() <= 1400) {
      for (size_t n = 0; n < bytes.size(); ++n) {
        pipefill::analysis::fuzz::run_one(reinterpret_cast<const uint8_t*>(bytes.data()), n);
      }
    }
  }
}

}  // namespace
