# The installable package's tests (included from lib/CMakeLists.txt, label `package`):
#  - package.exports_only_c_api, package.no_cuda_library_dependencies, package.fmt_spdlog_compiled_in:
#    what libpipefill.so exports and loads;
#  - package.installed_prefix_consumers: `cmake --install` into a scratch prefix, the prefix moved
#    elsewhere, then a one-file C and C++ program built through pkg-config and through
#    find_package(pipefill) from the moved prefix, and run (tests/package_consumer/check_installed.sh;
#    scripts/test.sh runs the same script on the release tree as a stage of its own);
#  - package.public_headers_compile_alone: every public header compiled alone by gcc and clang
#    as C99/C11 (the C API: pipefill.h and pipefill_{graph,observe,sim,host}.h, each declaring all
#    of it) and C++17/C++20 with -Wall -Wextra -Wpedantic -Werror -Wold-style-cast, the
#    PF_*_INITIALIZER macros expanded (tests/headers/check_headers.sh).
# Sanitizer builds leave them out: an instrumented .so needs its sanitizer runtime preloaded, and
# the compile checks do not depend on the build type.
if(NOT BUILD_TESTING OR PIPEFILL_SANITIZE)
  return()
endif()

# The shared library exports the C API and nothing else.
add_test(NAME package.exports_only_c_api
  COMMAND sh -c "nm -D --defined-only '$<TARGET_FILE:pipefill>' | awk '{print $3}' | grep -v '^pf' | grep . && exit 1 || exit 0")
if(PIPEFILL_WITH_CUDA)
  # A library linked into a training process never chooses its CUDA/NCCL libraries: no
  # DT_NEEDED on any of them (cuda/CMakeLists.txt; the runtime is static, cuBLAS and CUPTI are
  # opened at first use, NCCL never).
  add_test(NAME package.no_cuda_library_dependencies
    COMMAND sh -c "readelf -d '$<TARGET_FILE:pipefill>' | grep NEEDED; readelf -d '$<TARGET_FILE:pipefill>' | grep -E 'NEEDED.*(libnccl|libcudart|libcublas|libcupti|libcuda[.])' && exit 1 || exit 0")
  set_tests_properties(package.no_cuda_library_dependencies PROPERTIES LABELS package)
endif()
# fmt and spdlog are compiled into it with hidden symbols (cmake/PipefillDependencies.cmake):
# no DT_NEEDED on their shared libraries and no fmt/spdlog symbol imported or exported.
add_test(NAME package.fmt_spdlog_compiled_in
  COMMAND sh -c "readelf -d '$<TARGET_FILE:pipefill>' | grep NEEDED || exit 1; \
! readelf -d '$<TARGET_FILE:pipefill>' | grep -E 'NEEDED.*(libfmt|libspdlog)' && \
! nm -DC '$<TARGET_FILE:pipefill>' | grep -E '(fmt|spdlog)::'")

# Install, move the prefix, build and run C and C++ consumers through pkg-config and CMake.
add_test(NAME package.installed_prefix_consumers
  COMMAND ${CMAKE_COMMAND} -E env "CC=${CMAKE_C_COMPILER}" "CXX=${CMAKE_CXX_COMPILER}"
          "CMAKE=${CMAKE_COMMAND}" "CMAKE_GENERATOR=${CMAKE_GENERATOR}"
          bash ${PROJECT_SOURCE_DIR}/tests/package_consumer/check_installed.sh
          ${PROJECT_BINARY_DIR} ${CMAKE_CURRENT_BINARY_DIR}/package-test ${PROJECT_VERSION})
# The install runs `cmake --install` on this build tree: the library must be built first.
set_tests_properties(package.installed_prefix_consumers PROPERTIES RESOURCE_LOCK package_install)

# Every public header alone, by both compilers where installed (clang-14 is, scripts/install-deps.sh).
add_test(NAME package.public_headers_compile_alone
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/headers/check_headers.sh ${PROJECT_SOURCE_DIR}/include)

# The one version: CMake's project(VERSION) is pipefill.h's PIPEFILL_VERSION_* and pyproject's.
add_test(NAME package.one_version
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/headers/check_version.sh ${PROJECT_SOURCE_DIR} ${PROJECT_VERSION})

set_tests_properties(package.exports_only_c_api package.fmt_spdlog_compiled_in
  package.installed_prefix_consumers package.public_headers_compile_alone package.one_version
  PROPERTIES LABELS package)
