# Finds PipeFill's C++ dependencies. Each one comes from the system (the Debian packages of
# scripts/install-deps.sh) when it is installed, else from the copy that scripts/stage-gpu-deps.sh
# put into PIPEFILL_DEPS_DIR (default: <source>/.gpu-deps, git-ignored) - the GPU machine has the
# CUDA toolkit, CMake and ninja but none of these packages, and nothing can be installed there.
# Either way the targets have the same names: fmt::fmt, spdlog::spdlog,
# nlohmann_json::nlohmann_json, CLI11::CLI11, GTest::gtest/gtest_main/gmock/gmock_main,
# benchmark::benchmark. A staged package also answers later find_package() calls for it (through
# CMAKE_FIND_PACKAGE_REDIRECTS_DIR), so subdirectories may keep calling find_package().
#
# Staged forms: fmt header-only (FMT_HEADER_ONLY), spdlog header-only on that same external fmt
# (SPDLOG_FMT_EXTERNAL: never spdlog's bundled copy), nlohmann-json and CLI11 headers, and
# GoogleTest and Google Benchmark built from source inside this build (EXCLUDE_FROM_ALL: only
# what a target links is built).
#
# PIPEFILL_STAGED_DEPS: AUTO (system first, staged where absent), ON (staged only: what the GPU
# machine does, and how scripts/gpu-check-hidden-deps.sh proves it), OFF (system only).

set(PIPEFILL_DEPS_DIR "${PROJECT_SOURCE_DIR}/.gpu-deps" CACHE PATH
    "Dependencies staged by scripts/stage-gpu-deps.sh, used where a system package is absent")
set(PIPEFILL_STAGED_DEPS AUTO CACHE STRING
    "Use the staged dependencies: AUTO (where the system lacks one), ON (always), OFF (never)")
set_property(CACHE PIPEFILL_STAGED_DEPS PROPERTY STRINGS AUTO ON OFF)
set(PIPEFILL_DEPENDENCY_SOURCES "" CACHE INTERNAL "name=system|staged for each dependency")
set(PIPEFILL_DEPENDENCY_SOURCES "")

# Makes later find_package(<package>) calls succeed with the targets already defined here.
function(_pipefill_redirect_find_package package version)
  string(TOLOWER "${package}" lower)
  file(WRITE "${CMAKE_FIND_PACKAGE_REDIRECTS_DIR}/${lower}-config.cmake"
       "# ${package} ${version}: staged copy in ${PIPEFILL_DEPS_DIR}; targets made by PipefillDependencies.cmake\n"
       "set(${package}_FOUND TRUE)\n")
  file(WRITE "${CMAKE_FIND_PACKAGE_REDIRECTS_DIR}/${lower}-config-version.cmake"
       "set(PACKAGE_VERSION \"${version}\")\n"
       "if(PACKAGE_FIND_VERSION AND PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)\n"
       "  set(PACKAGE_VERSION_COMPATIBLE FALSE)\n"
       "else()\n"
       "  set(PACKAGE_VERSION_COMPATIBLE TRUE)\n"
       "  if(PACKAGE_FIND_VERSION VERSION_EQUAL PACKAGE_VERSION)\n"
       "    set(PACKAGE_VERSION_EXACT TRUE)\n"
       "  endif()\n"
       "endif()\n")
endfunction()

# The staged copy's directory for `subdir`, or a fatal error that says how to get one.
function(_pipefill_staged_dir package subdir marker out)
  set(dir "${PIPEFILL_DEPS_DIR}/${subdir}")
  if(NOT EXISTS "${dir}/${marker}")
    message(FATAL_ERROR
      "PipeFill needs ${package}: install the Debian packages (bash scripts/install-deps.sh), or stage a "
      "copy with 'bash scripts/stage-gpu-deps.sh' (${dir}/${marker} is missing; "
      "PIPEFILL_STAGED_DEPS=${PIPEFILL_STAGED_DEPS}).")
  endif()
  set(${out} "${dir}" PARENT_SCOPE)
endfunction()

# The version a staged copy records in .gpu-deps/VERSIONS (written by the staging script).
function(_pipefill_staged_version name out)
  set(version "0")
  if(EXISTS "${PIPEFILL_DEPS_DIR}/VERSIONS")
    file(STRINGS "${PIPEFILL_DEPS_DIR}/VERSIONS" lines REGEX "^${name} ")
    if(lines)
      list(GET lines 0 line)
      string(REGEX REPLACE "^${name} ([^ ]+).*" "\\1" version "${line}")
    endif()
  endif()
  set(${out} "${version}" PARENT_SCOPE)
endfunction()

macro(_pipefill_note name source)
  list(APPEND PIPEFILL_DEPENDENCY_SOURCES "${name}=${source}")
  set(PIPEFILL_DEPENDENCY_SOURCES "${PIPEFILL_DEPENDENCY_SOURCES}" CACHE INTERNAL "")
endmacro()

# pipefill_dependency(<name> [version]): one of fmt, spdlog, nlohmann_json, CLI11, GTest, benchmark.
macro(pipefill_dependency name)
  set(_pf_found FALSE)
  if(NOT PIPEFILL_STAGED_DEPS STREQUAL "ON")
    if("${name}" STREQUAL "GTest")
      find_package(GTest ${ARGN} QUIET)
      if(GTest_FOUND AND TARGET GTest::gtest AND TARGET GTest::gmock)
        set(_pf_found TRUE)
      endif()
    else()
      find_package(${name} ${ARGN} QUIET CONFIG)
      set(_pf_found ${${name}_FOUND})
    endif()
  endif()
  if(_pf_found)
    _pipefill_note(${name} system)
  elseif(PIPEFILL_STAGED_DEPS STREQUAL "OFF")
    message(FATAL_ERROR "PipeFill needs ${name} ${ARGN}: install the Debian packages (bash scripts/install-deps.sh); "
                        "PIPEFILL_STAGED_DEPS=OFF forbids the staged copy.")
  else()
    cmake_language(CALL _pipefill_staged_${name})
    _pipefill_note(${name} staged)
  endif()
endmacro()

function(_pipefill_staged_fmt)
  _pipefill_staged_dir(fmt fmt include/fmt/format.h dir)
  _pipefill_staged_version(fmt version)
  add_library(pipefill_staged_fmt INTERFACE)
  target_include_directories(pipefill_staged_fmt SYSTEM INTERFACE "${dir}/include")
  target_compile_definitions(pipefill_staged_fmt INTERFACE FMT_HEADER_ONLY=1)
  add_library(fmt::fmt ALIAS pipefill_staged_fmt)
  add_library(fmt::fmt-header-only ALIAS pipefill_staged_fmt)
  _pipefill_redirect_find_package(fmt "${version}")
endfunction()

function(_pipefill_staged_spdlog)
  if(NOT TARGET fmt::fmt)
    message(FATAL_ERROR "PipefillDependencies: resolve fmt before spdlog")
  endif()
  _pipefill_staged_dir(spdlog spdlog include/spdlog/spdlog.h dir)
  _pipefill_staged_version(spdlog version)
  add_library(pipefill_staged_spdlog INTERFACE)
  target_include_directories(pipefill_staged_spdlog SYSTEM INTERFACE "${dir}/include")
  # Header-only spdlog on the external fmt above (whichever fmt::fmt is in use), never its own copy.
  target_compile_definitions(pipefill_staged_spdlog INTERFACE SPDLOG_FMT_EXTERNAL=1)
  target_link_libraries(pipefill_staged_spdlog INTERFACE fmt::fmt Threads::Threads)
  add_library(spdlog::spdlog ALIAS pipefill_staged_spdlog)
  add_library(spdlog::spdlog_header_only ALIAS pipefill_staged_spdlog)
  _pipefill_redirect_find_package(spdlog "${version}")
endfunction()

function(_pipefill_staged_nlohmann_json)
  _pipefill_staged_dir(nlohmann-json nlohmann_json include/nlohmann/json.hpp dir)
  _pipefill_staged_version(nlohmann_json version)
  add_library(pipefill_staged_nlohmann_json INTERFACE)
  target_include_directories(pipefill_staged_nlohmann_json SYSTEM INTERFACE "${dir}/include")
  add_library(nlohmann_json::nlohmann_json ALIAS pipefill_staged_nlohmann_json)
  _pipefill_redirect_find_package(nlohmann_json "${version}")
endfunction()

function(_pipefill_staged_CLI11)
  _pipefill_staged_dir(CLI11 cli11 include/CLI/CLI.hpp dir)
  _pipefill_staged_version(CLI11 version)
  add_library(pipefill_staged_cli11 INTERFACE)
  target_include_directories(pipefill_staged_cli11 SYSTEM INTERFACE "${dir}/include")
  add_library(CLI11::CLI11 ALIAS pipefill_staged_cli11)
  _pipefill_redirect_find_package(CLI11 "${version}")
endfunction()

function(_pipefill_staged_GTest)
  _pipefill_staged_dir(GoogleTest googletest CMakeLists.txt dir)
  _pipefill_staged_version(googletest version)
  set(BUILD_GMOCK ON CACHE BOOL "" FORCE)
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  set(gtest_force_shared_crt ON CACHE BOOL "" FORCE)
  # Old cmake_minimum_required lines of third-party sources stay accepted by CMake >= 4.
  set(CMAKE_POLICY_VERSION_MINIMUM 3.5)
  add_subdirectory("${dir}" "${PROJECT_BINARY_DIR}/_deps/googletest" EXCLUDE_FROM_ALL SYSTEM)
  foreach(t gtest gtest_main gmock gmock_main)
    if(NOT TARGET GTest::${t})
      message(FATAL_ERROR "staged GoogleTest in ${dir} did not define GTest::${t}")
    endif()
  endforeach()
  _pipefill_redirect_find_package(GTest "${version}")
endfunction()

function(_pipefill_staged_benchmark)
  _pipefill_staged_dir("Google Benchmark" benchmark CMakeLists.txt dir)
  _pipefill_staged_version(benchmark version)
  foreach(off BENCHMARK_ENABLE_TESTING BENCHMARK_ENABLE_GTEST_TESTS BENCHMARK_ENABLE_INSTALL
              BENCHMARK_INSTALL_DOCS BENCHMARK_ENABLE_WERROR BENCHMARK_FORCE_WERROR BENCHMARK_ENABLE_LIBPFM
              BENCHMARK_DOWNLOAD_DEPENDENCIES BENCHMARK_ENABLE_LTO BENCHMARK_ENABLE_ASSEMBLY_TESTS)
    set(${off} OFF CACHE BOOL "" FORCE)
  endforeach()
  set(CMAKE_POLICY_VERSION_MINIMUM 3.5)
  add_subdirectory("${dir}" "${PROJECT_BINARY_DIR}/_deps/benchmark" EXCLUDE_FROM_ALL SYSTEM)
  if(NOT TARGET benchmark::benchmark)
    message(FATAL_ERROR "staged Google Benchmark in ${dir} did not define benchmark::benchmark")
  endif()
  _pipefill_redirect_find_package(benchmark "${version}")
endfunction()
