// A program compiled with SPECSAMPLE_AVX512=0 leaves the AVX-512 kernels out: its best level is
// AVX2 whatever the CPU offers, so no request reaches code that was never compiled. On a CPU with
// AVX-512 this is where the cap shows; the other test executables run the avx512 level there.
// Compiled header-only with SPECSAMPLE_AVX512=0 (tests/gpt2/CMakeLists.txt).
#include <specsample/detail/simd.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

namespace {

using specsample::isa;
namespace simd = specsample::simd;

// The level this CPU runs without AVX-512, read here from CPUID rather than from the library.
isa level_without_avx512() {
#if SPECSAMPLE_X86
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) return isa::avx2;
#endif
  return isa::generic;
}

}  // namespace

TEST_CASE("without the AVX-512 kernels (SPECSAMPLE_AVX512=0) every level stops below AVX-512", "[simd]") {
  STATIC_REQUIRE_FALSE(simd::avx512_kernels);
  const isa cpu = level_without_avx512();
  CHECK(simd::detected() == cpu);
  for (const isa requested : {isa::best, isa::avx512, isa::avx2, isa::generic}) {
    const isa expected = requested == isa::best ? cpu : std::min(requested, cpu);
    CHECK(simd::resolve(requested) == expected);
  }
  CHECK_FALSE(simd::has_avx512_bf16());
  CHECK_FALSE(simd::has_avx512_vnni());

  // The dispatchers run at the level they get: a vector argmax and a vector maximum at the best one.
  std::vector<float> x(100);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 100);
  const isa best = simd::resolve(isa::best);
  CHECK(simd::argmax(best, x.data(), x.size()) == std::max_element(x.begin(), x.end()) - x.begin());
  CHECK(simd::max_value(best, x.data(), x.size()) == 99.0f);
}
