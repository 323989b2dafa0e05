// Calling a fill item's function on the host and simulated devices: an exception it throws is
// caught and described, never let out of the device's thread or event loop; the device then
// stops the item's block and records the failure, which fails the job at harvest.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#include <fmt/format.h>

namespace pipefill {

// Runs call(); true when it returned. When it threw, *what says so ("item N threw: <what()>").
template <class Call>
bool call_item(Call&& call, uint64_t item, std::string* what) {
  try {
    call();
    return true;
  } catch (const std::exception& error) {
    *what = fmt::format("item {} threw: {}", item, error.what());
  } catch (...) {
    *what = fmt::format("item {} threw an exception that is not a std::exception", item);
  }
  return false;
}

}  // namespace pipefill
