#!/usr/bin/env bash
# The whole test suite, twice: an optimised build with g++ and an ASan+UBSan build with clang++ 14
# (so both compilers the project supports build it with -Werror and pass it); the sanitized build
# also runs the thread pool's tests under ThreadSanitizer (tests/gpt2/CMakeLists.txt).
# Usage: scripts/test.sh            (both builds)
#        SPECSAMPLE_SKIP_SANITIZE=1 scripts/test.sh   (optimised build only, for quick iteration)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh"
jobs=${SPECSAMPLE_JOBS:-$(nproc)}

# Every option of ours that either build sets is given on each configure, the defaults too: a value
# left in an existing build directory's CMakeCache.txt (from a configure by hand) would otherwise
# outlive the script's, and the directory would build something other than what CI builds. ctest
# fails when it finds no tests (a build that lost them must not pass as green).
run_suite() {  # name, extra cmake args...
  local dir="$root/build/$1"; shift
  echo "== specsample: $(basename "$dir") build =="
  cmake -S "$root" -B "$dir" -DSPECSAMPLE_WERROR=ON -DSPECSAMPLE_BUILD_TESTS=ON -DSPECSAMPLE_BUILD_EXAMPLES=ON \
    -DSPECSAMPLE_BUILD_BENCHMARKS=ON "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
  ctest --test-dir "$dir" -j "$jobs" --output-on-failure --no-tests=error
  "$dir/tests/gpt2/specsample_kernel_levels"  # which kernel levels those tests could run here
}

# Both builds compile the GPT-2 kernels and the model's loading and forward pass once, in
# specsample::kernels (SPECSAMPLE_SEPARATE_KERNELS), not in each of the programs that run the model
# (docs/getting-started.md, "Compile time"): the kernels alone took the optimised build from 674 to
# 499 s of compiler time (Zen 5, 2026-11-28). The header-only way is built and run by the
# add_subdirectory consumer (tests/consumers), so both are tested.
run_suite release -DCMAKE_BUILD_TYPE=Release -DSPECSAMPLE_SANITIZE=OFF -DSPECSAMPLE_BUILD_MICRO=ON \
  -DSPECSAMPLE_SEPARATE_KERNELS=ON -DSPECSAMPLE_AVX512=ON
if [ -z "${SPECSAMPLE_SKIP_SANITIZE:-}" ]; then
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # -O1 -g1: fast enough to run the statistical tests, line tables for the reports. The benchmark
  # harnesses' smoke tests run here too, smaller than --quick (~2 minutes of CPU; see
  # benchmarks/CMakeLists.txt): a dangling reference in specsample-bench once passed the optimised
  # build unnoticed. The micro-benchmarks, which no test runs, are not built.
  # ASan's checks stay inline: clang's -fsanitize-address-outline-instrumentation (checks as calls)
  # cut this build from 508 to 355 s, but the ~120 tests it ran took 3.8x as long (745 s against
  # 195; the harness and specsample-generate smoke tests 6-13x; Zen 3, 2026-11-27). Nor do the
  # kernels drop to -O0 here: src/matmul_kernels.cpp then compiles in 8 s instead of 79, but
  # bench.strategies_quick took 957 s against 29 (Zen 4 without AVX-512, 2026-11-29). Of those
  # 79 s, UBSan's pointer-overflow check costs 37 (ASan alone 27, UBSan alone 30); it stays, as it
  # checks the kernels' index arithmetic. Nor do the programs (examples, benchmarks) alone drop to
  # -O0, the kernels library staying at -O1: they compiled in 124 s instead of ~235, but their
  # tests took 400 s instead of 188 (distribution_check's 66 -> 226 s; Xeon, 2026-12-01), and the
  # programs whose tests slowed least would save ~50 s of CPU in all.
  # On a CPU without AVX-512 the sanitized build leaves the AVX-512 kernels out (SPECSAMPLE_AVX512):
  # its tests could not run them, and instrumented they took ~18% of its compile (the kernels' TUs
  # 175 -> 67 s of ~600 s in all; Zen 4 without AVX-512, 2026-11-29). tests/CMakeLists.txt still
  # compiles them once with clang++, unoptimised; the optimised build compiles and, where the CPU
  # has AVX-512, runs them.
  avx512=ON
  for flag in avx512f avx512bw avx512vl avx512dq; do
    grep -qw "$flag" /proc/cpuinfo 2>/dev/null || avx512=OFF
  done
  run_suite sanitize-clang -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=-O1 -g1" \
    -DSPECSAMPLE_SANITIZE=ON -DSPECSAMPLE_BUILD_MICRO=OFF -DSPECSAMPLE_SEPARATE_KERNELS=ON -DSPECSAMPLE_AVX512=$avx512
  echo "specsample: all tests passed"
else
  echo "specsample: release tests passed (sanitized suite skipped: SPECSAMPLE_SKIP_SANITIZE)"
fi
