# Flags for our own tests, examples and benchmarks only: consumers never inherit them.
add_library(specsample_dev_flags INTERFACE)
target_compile_options(specsample_dev_flags INTERFACE
  -Wall -Wextra -Wpedantic -Wconversion $<$<BOOL:${SPECSAMPLE_WERROR}>:-Werror>)
if(SPECSAMPLE_SANITIZE)
  target_compile_options(specsample_dev_flags INTERFACE
    -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  target_link_options(specsample_dev_flags INTERFACE -fsanitize=address,undefined)
endif()

# The library as our own targets link it, with those flags: header-only (as by default for a
# consumer), or with the GPT-2 kernels compiled once (SPECSAMPLE_SEPARATE_KERNELS, which the
# sanitized build of scripts/test.sh uses: one compile of the kernels instead of one per program).
add_library(specsample_dev INTERFACE)
if(SPECSAMPLE_SEPARATE_KERNELS)
  target_link_libraries(specsample_kernels PRIVATE specsample_dev_flags)
  target_link_libraries(specsample_dev INTERFACE specsample::kernels specsample_dev_flags)
else()
  target_link_libraries(specsample_dev INTERFACE specsample::specsample specsample_dev_flags)
endif()

# Precompiled headers: the heavy dependencies and the library's own headers, parsed once per build
# instead of once per TU (the suite is built twice, plain and sanitized, on two cores: compile time
# is most of its cost; parsing them was ~5 of a toy example's 13 s with clang++ 14 and ASan).
# One for the test executables (with Catch2 and their definitions), one for the programs
# (examples and benchmarks). -Winvalid-pch (an error with SPECSAMPLE_WERROR): g++ silently
# compiles without a precompiled header it cannot use, e.g. when a macro it was built with is
# not defined in the TU, and nothing would show the time lost.
target_compile_options(specsample_dev_flags INTERFACE -Winvalid-pch)
set(SPECSAMPLE_PCH_HEADERS
  <specsample/specsample.hpp> <specsample/testing/distribution.hpp> <specsample/io/prompt_list.hpp>
  <Eigen/Core> <xtensor/xarray.hpp> <xtensor/xtensor.hpp> <fmt/format.h> <nlohmann/json.hpp>
  <random> <span> <vector> <string> <filesystem>)

function(specsample_pch_target name)  # name, extra libraries...
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/${name}_anchor.cpp" "// anchors the precompiled header ${name}\n")
  add_library(${name} OBJECT "${CMAKE_CURRENT_BINARY_DIR}/${name}_anchor.cpp")
  target_link_libraries(${name} PRIVATE specsample_dev ${ARGN})
endfunction()

function(specsample_test_pch)
  specsample_pch_target(specsample_test_pch Catch2::Catch2)
  specsample_test_definitions(specsample_test_pch)
  target_precompile_headers(specsample_test_pch PRIVATE <catch2/catch.hpp> ${SPECSAMPLE_PCH_HEADERS})
endfunction()

# specsample_add_program(name SOURCES...): an example or benchmark program, with the programs'
# precompiled header (which has no definitions: each program keeps its own).
function(specsample_add_program name)
  if(NOT TARGET specsample_program_pch)
    specsample_pch_target(specsample_program_pch)
    target_precompile_headers(specsample_program_pch PRIVATE ${SPECSAMPLE_PCH_HEADERS})
  endif()
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE specsample_dev)
  target_precompile_headers(${name} REUSE_FROM specsample_program_pch)
endfunction()

function(specsample_test_definitions target)
  target_compile_definitions(${target} PRIVATE
    SPECSAMPLE_SOURCE_DIR="${PROJECT_SOURCE_DIR}" SPECSAMPLE_TEST_DATA="${PROJECT_SOURCE_DIR}/tests/data")
endfunction()

# specsample_add_test(name SOURCES...): one Catch2 executable registered with ctest.
function(specsample_add_test name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE specsample_dev Catch2::Catch2WithMain)
  specsample_test_definitions(${name})
  target_precompile_headers(${name} REUSE_FROM specsample_test_pch)
  # --warn NoTests: a ctest entry whose name filter matches no test case fails instead of passing
  # with "No tests ran" (a '[' in a test name breaks catch_discover_tests' list and used to merge
  # the rest of the executable's tests into one entry that ran nothing).
  catch_discover_tests(${name} EXTRA_ARGS --warn NoTests PROPERTIES TIMEOUT 600)
endfunction()

# specsample_add_allocation_test(name SOURCES...): a test executable counting every heap
# allocation (tests/support/counting_allocator.hpp, included by one of its TUs, wraps malloc and
# replaces the global operator new for the whole executable).
function(specsample_add_allocation_test name)
  specsample_add_test(${name} ${ARGN})
  target_link_options(${name} PRIVATE -Wl,--wrap=malloc -Wl,--wrap=calloc -Wl,--wrap=realloc)
  target_compile_options(${name} PRIVATE -Wno-mismatched-new-delete)
endfunction()
