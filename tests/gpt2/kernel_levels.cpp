// Not a test: a report that the test command prints after each suite (scripts/test.sh). The
// kernel tests run every level this CPU can run (tests/support/kernel_levels.hpp, which this
// reads), so on a CPU without AVX-512, or without AVX512_BF16, AVX512_VNNI or AMX, some kernels are
// compiled but never run; a build with SPECSAMPLE_AVX512=0 leaves the AVX-512 ones out
// (tests/CMakeLists.txt compiles them apart, unoptimised). This says which, instead of leaving a
// passing suite silent about it.

#include "../support/kernel_levels.hpp"

#include <specsample/detail/simd.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <vector>

int main() {
  namespace simd = specsample::simd;
  using specsample::isa;
  const std::vector<isa> levels = specsample::test::kernel_levels();
  const auto runs = [&](isa level) { return std::find(levels.begin(), levels.end(), level) != levels.end(); };
  std::vector<std::string> ran, not_run;
  for (const isa level : levels) ran.emplace_back(specsample::isa_name(level));
  if (!runs(isa::avx2)) not_run.emplace_back("avx2 (it needs an x86 CPU with AVX2, FMA and F16C)");
  if (simd::avx512_kernels && !runs(isa::avx512)) {
    not_run.emplace_back("avx512 (it needs AVX-512 F, BW, VL and DQ)");
  } else if (simd::avx512_kernels) {
    if (!simd::has_avx512_bf16()) not_run.emplace_back("the AVX512_BF16 dot products (vdpbf16ps) of the BF16 matmuls");
    if (!simd::has_avx512_vnni()) not_run.emplace_back("the AVX512_VNNI byte dot products (vpdpbusd) of the INT8 matmuls");
    if (!simd::has_amx()) {
      not_run.emplace_back("the AMX tile matmuls (TDPBF16PS, TDPBUSD) of the BF16 and INT8 matmuls (Intel Sapphire "
                           "Rapids and later, on Linux)");
    }
  }
  fmt::print("specsample: the kernel tests ran the levels {} on this CPU", fmt::join(ran, ", "));
  if (not_run.empty() && simd::avx512_kernels) fmt::print(", every kernel path");
  if (!not_run.empty()) fmt::print("; compiled but not run here: {}", fmt::join(not_run, "; "));
  if (!simd::avx512_kernels) {
    fmt::print("; left out of this build (SPECSAMPLE_AVX512=0): the avx512 kernels, compiled apart without "
               "optimisation or sanitizers only");
  }
  fmt::print("\n");
}
