# Finds everything specsample::specsample links. Shared by the build tree and the installed
# package config so both consumption paths see the same dependencies.
include(CMakeFindDependencyMacro)
list(APPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_LIST_DIR}")
set(THREADS_PREFER_PTHREAD_FLAG ON)
find_dependency(Threads)
find_dependency(Eigen3 3.4 NO_MODULE)
find_dependency(xtensor)
find_dependency(nlohmann_json 3.11)
find_dependency(fmt)
find_dependency(PCRE2)
