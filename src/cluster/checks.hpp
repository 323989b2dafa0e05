// Range checks and 64-bit checked arithmetic for the cluster simulator's inputs: every check
// fails with pfErrorInvalidArgument and a message naming the field and the value, so a config
// value can never overflow an int, a size_t or a double downstream (the ranges are documented
// in docs/simulator.md, section 5).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "common/error.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::cluster::checks {

inline pfResult_t int_in(const std::string& field, long long value, long long lo, long long hi) {
  if (value < lo || value > hi) return fail(pfErrorInvalidArgument, "{} must be in [{}, {}], got {}", field, lo, hi, value);
  return pfSuccess;
}

// Finite and in [lo, hi] (lo excluded when lo_open).
inline pfResult_t real_in(const std::string& field, double value, double lo, double hi, bool lo_open = false) {
  if (!std::isfinite(value) || value < lo || value > hi || (lo_open && value == lo))
    return fail(pfErrorInvalidArgument, "{} must be in {}{}, {}], got {}", field, lo_open ? "(" : "[", lo, hi, value);
  return pfSuccess;
}

// a * b in 64 bits; false on overflow.
inline bool mul(long long a, long long b, long long* out) { return !__builtin_mul_overflow(a, b, out); }

// Bytes that must fit the simulator's size_t arithmetic (sums of a few of them, and products
// with in-flight counts): at most 2^56 bytes (64 PiB).
constexpr double kMaxBytes = 72057594037927936.0;  // 2^56

inline pfResult_t to_bytes(double value, const std::string& what, size_t* out) {
  if (!std::isfinite(value) || value < 0 || value > kMaxBytes)
    return fail(pfErrorInvalidArgument, "{} is {} bytes, outside [0, 2^56]", what, value);
  *out = static_cast<size_t>(value);
  return pfSuccess;
}

}  // namespace pipefill::cluster::checks
