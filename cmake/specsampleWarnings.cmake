# Flags for our own tests, examples and benchmarks only: consumers never inherit them.
add_library(specsample_warning_flags INTERFACE)
target_compile_options(specsample_warning_flags INTERFACE
  -Wall -Wextra -Wpedantic -Wconversion -Winvalid-pch $<$<BOOL:${SPECSAMPLE_WERROR}>:-Werror>)
add_library(specsample_dev_flags INTERFACE)
target_link_libraries(specsample_dev_flags INTERFACE specsample_warning_flags)
if(SPECSAMPLE_SANITIZE)
  target_compile_options(specsample_dev_flags INTERFACE
    -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  target_link_options(specsample_dev_flags INTERFACE -fsanitize=address,undefined)
endif()

# The library as our own targets link it, with those flags: header-only (as by default for a
# consumer), or with the GPT-2 kernels compiled once (SPECSAMPLE_SEPARATE_KERNELS, which both
# builds of scripts/test.sh use: one compile of the kernels instead of one per program).
add_library(specsample_dev INTERFACE)
if(SPECSAMPLE_SEPARATE_KERNELS)
  target_link_libraries(specsample_kernels PRIVATE specsample_dev_flags)
  target_link_libraries(specsample_dev INTERFACE specsample::kernels specsample_dev_flags)
else()
  target_link_libraries(specsample_dev INTERFACE specsample::specsample specsample_dev_flags)
endif()

# One precompiled header for the test executables: the heavy dependencies, Catch2 and the
# library's own headers, parsed once per build instead of once per TU (the suite is built twice,
# plain and sanitized, on two cores: compile time is most of its cost). With the library's headers
# in it (one compile of each TU each way, 2026-11-27, Zen 5): clang++ 14 with ASan,
# test_exactness.cpp 14.6 -> 10.8 s; g++ 12 -O3, whose precompiled header grew to ~350 MB to load,
# test_exactness.cpp 16.3 -> 12.9 s and test_gpt2's 74 -> 53 s, the smallest ~2 s slower
# (test_prompt_list.cpp 2.1 -> 4.4 s). The programs (examples, benchmarks) have none: their own
# precompiled header saved ~5 s of parsing per program but put the largest TU
# (specsample-generate) last in the build, alone on one core for ~35 s.
# -Winvalid-pch (above; an error with SPECSAMPLE_WERROR): g++ silently compiles without a
# precompiled header it cannot use, e.g. when a macro it was built with is not defined in the TU.
function(specsample_test_pch)
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/pch_anchor.cpp" "// anchors the shared precompiled header\n")
  add_library(specsample_test_pch OBJECT "${CMAKE_CURRENT_BINARY_DIR}/pch_anchor.cpp")
  target_link_libraries(specsample_test_pch PRIVATE specsample_dev Catch2::Catch2)
  specsample_test_definitions(specsample_test_pch)
  target_precompile_headers(specsample_test_pch PRIVATE
    <catch2/catch.hpp> <specsample/specsample.hpp> <specsample/testing/distribution.hpp>
    <specsample/io/prompt_list.hpp> <Eigen/Core> <xtensor/xarray.hpp> <xtensor/xtensor.hpp> <fmt/format.h>
    <nlohmann/json.hpp> <random> <span> <vector> <string> <filesystem>)
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
  specsample_register_test(${name})
endfunction()

# specsample_register_test(name): registers a Catch2 executable's tests with ctest.
function(specsample_register_test name)
  # --warn NoTests: a ctest entry whose name filter matches no test case fails instead of passing
  # with "No tests ran" (a '[' in a test name breaks catch_discover_tests' list and used to merge
  # the rest of the executable's tests into one entry that ran nothing).
  catch_discover_tests(${name} EXTRA_ARGS --warn NoTests PROPERTIES TIMEOUT 600)
  # Catch2 2.13's discovery takes a failing listing run's exit status for a count of tests and
  # registers none, silently: an executable that cannot start (a sanitizer's runtime that aborts on
  # this kernel) would pass the suite with its tests gone. This entry lists them once more, and
  # fails on a crash, on a sanitizer's report or on no test listed.
  add_test(NAME ${name}.lists_its_tests COMMAND ${name} --list-test-names-only)
  set_tests_properties(${name}.lists_its_tests PROPERTIES PASS_REGULAR_EXPRESSION "[A-Za-z]"
                       FAIL_REGULAR_EXPRESSION "Sanitizer|sanitizer|ERROR")
endfunction()

# specsample_output_test(name status regex [ENDS] program [args...]): a ctest test of a program's
# output and of its exit status. ctest ignores the exit status of a test with
# PASS_REGULAR_EXPRESSION (an error's status after the expected output, or a sanitizer's, would
# pass), so the program runs through sh, which prints "exit status N" after it: the test passes when
# the output matches `regex` and then ends with "exit status <status>" — right after what `regex`
# matched with ENDS (the output ends there), after anything without. `program` is a target or a
# path. An empty argument cannot pass through ARGN (CMake drops it): such a test writes its own sh
# -c line.
function(specsample_output_test name status regex)
  cmake_parse_arguments(PARSE_ARGV 3 test "ENDS" "" "")
  list(POP_FRONT test_UNPARSED_ARGUMENTS program)
  if(TARGET ${program})
    set(program $<TARGET_FILE:${program}>)
  endif()
  set(between ".*")
  if(test_ENDS)
    set(between "")
  endif()
  add_test(NAME ${name} COMMAND sh -c "\"$0\" \"$@\"; echo \"exit status $?\"" ${program} ${test_UNPARSED_ARGUMENTS})
  set_tests_properties(${name} PROPERTIES PASS_REGULAR_EXPRESSION "(${regex})${between}exit status ${status}\n$")
endfunction()

# specsample_mismatched_checkpoint(dir): a GPT-2 directory whose model and tokenizer disagree, made
# of links (the tiny GPT-2's 50257-token config.json and weights, the bundled 4096-token tokenizer).
function(specsample_mismatched_checkpoint dir)
  file(MAKE_DIRECTORY "${dir}")
  foreach(f config.json model.safetensors)
    file(CREATE_LINK "${PROJECT_SOURCE_DIR}/tests/data/models/tiny-random-gpt2/${f}" "${dir}/${f}" SYMBOLIC)
  endforeach()
  foreach(f vocab.json merges.txt)
    file(CREATE_LINK "${PROJECT_SOURCE_DIR}/models/shakespeare-target/${f}" "${dir}/${f}" SYMBOLIC)
  endforeach()
endfunction()

# specsample_add_allocation_test(name SOURCES...): a test executable counting every heap
# allocation (tests/support/counting_allocator.hpp, included by one of its TUs, wraps malloc and
# its kin and replaces the global operator new for the whole executable).
function(specsample_add_allocation_test name)
  specsample_add_test(${name} ${ARGN})
  target_link_options(${name} PRIVATE -Wl,--wrap=malloc -Wl,--wrap=calloc -Wl,--wrap=realloc
                      -Wl,--wrap=aligned_alloc -Wl,--wrap=posix_memalign)
  target_compile_options(${name} PRIVATE -Wno-mismatched-new-delete)
endfunction()
