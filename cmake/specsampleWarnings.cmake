# Flags for our own tests, examples and benchmarks only: consumers never inherit them.
add_library(specsample_dev_flags INTERFACE)
target_compile_options(specsample_dev_flags INTERFACE
  -Wall -Wextra -Wpedantic -Wconversion $<$<BOOL:${SPECSAMPLE_WERROR}>:-Werror>)
if(SPECSAMPLE_SANITIZE)
  target_compile_options(specsample_dev_flags INTERFACE
    -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  target_link_options(specsample_dev_flags INTERFACE -fsanitize=address,undefined)
endif()

# specsample_add_test(name SOURCES...): one Catch2 executable registered with ctest.
function(specsample_add_test name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE specsample::specsample specsample_dev_flags Catch2::Catch2WithMain)
  target_compile_definitions(${name} PRIVATE
    SPECSAMPLE_SOURCE_DIR="${PROJECT_SOURCE_DIR}" SPECSAMPLE_TEST_DATA="${PROJECT_SOURCE_DIR}/tests/data")
  catch_discover_tests(${name} PROPERTIES TIMEOUT 600)
endfunction()
