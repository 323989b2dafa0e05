// Misspelled PIPEFILL_* environment variables: the library reads only the names it knows, so a
// typo (PIPEFILL_RESERVED_SM) would otherwise be ignored without a word. pfRuntimeCreate warns
// once per process about each unknown name, with the nearest known one.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pipefill::core {

// Every PIPEFILL_* variable the library, its tools and its scripts read.
const std::vector<std::string_view>& known_environment_variables();

// The known name closest to `name` (edit distance), or "" when none is close enough to be a
// likely typo (more than a third of the name differs).
std::string nearest_environment_variable(std::string_view name);

// The PIPEFILL_* names in `environment` (a NULL-terminated "NAME=value" array, like environ)
// that are not known, in order.
std::vector<std::string> unknown_environment_variables(const char* const* environment);

// Logs a warning for each unknown PIPEFILL_* variable of the process, the first time only.
void warn_unknown_environment_once();

}  // namespace pipefill::core
