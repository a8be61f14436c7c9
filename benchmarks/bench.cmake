# specsample-bench: the speculative-sampling sweep behind docs/benchmarks.md (scripts/bench.sh
# builds it in Release and runs it). Included from benchmarks/CMakeLists.txt; written against
# CMAKE_CURRENT_LIST_DIR so a scratch project can include it too.
add_executable(specsample-bench "${CMAKE_CURRENT_LIST_DIR}/bench.cpp")
target_link_libraries(specsample-bench PRIVATE specsample::specsample)
if(TARGET specsample_dev_flags)
  target_link_libraries(specsample-bench PRIVATE specsample_dev_flags)
endif()
cmake_path(GET CMAKE_CURRENT_LIST_DIR PARENT_PATH _specsample_bench_root)
target_compile_definitions(specsample-bench PRIVATE
  SPECSAMPLE_SOURCE_MODELS="${_specsample_bench_root}/models"
  SPECSAMPLE_BENCH_PROMPTS="${CMAKE_CURRENT_LIST_DIR}/prompts.txt")
unset(_specsample_bench_root)

# specsample-leniency: the lossy leniency trade-off on an enumerable toy Markov pair
# (benchmarks/leniency.cpp; docs/benchmarks.md, "Leniency trade-off").
add_executable(specsample-leniency "${CMAKE_CURRENT_LIST_DIR}/leniency.cpp")
target_link_libraries(specsample-leniency PRIVATE specsample::specsample)
if(TARGET specsample_dev_flags)
  target_link_libraries(specsample-leniency PRIVATE specsample_dev_flags)
endif()
