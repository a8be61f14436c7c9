#pragma once
// The kernel levels the kernel tests run on this CPU: every level it can run (the generic fallback
// always; AVX2 and AVX-512 when present), so the fallbacks are tested on every machine that has
// them. test_kernels.cpp runs over them; tests/gpt2/kernel_levels.cpp reports them after each
// suite (scripts/test.sh), so the levels a CPU lacks are said, not passed over.

#include <specsample/detail/simd.hpp>

#include <vector>

namespace specsample::test {

inline std::vector<isa> kernel_levels() {
  std::vector<isa> out = {isa::generic};
  if (simd::resolve(isa::avx2) == isa::avx2) out.push_back(isa::avx2);
  if (simd::resolve(isa::avx512) == isa::avx512) out.push_back(isa::avx512);
  return out;
}

}  // namespace specsample::test
