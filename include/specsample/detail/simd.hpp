#pragma once
/// @file detail/simd.hpp
/// What the vectorised code of the library shares: the instruction-set levels and their run-time
/// detection, the function-target macros, and a vector exp. The library is compiled for generic
/// x86-64 (no -march): fast paths are functions with `__attribute__((target(...)))`, chosen once
/// from `__builtin_cpu_supports`. Used by the GPT-2 kernels (models/gpt2/simd.hpp) and by the
/// logit warper (sampling/warp.hpp).

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>

// SPECSAMPLE_X86: 1 where the x86 fast paths are compiled (x86-64 with GCC or Clang), else 0.
// Defining it to 0 beforehand builds the portable code only, as on any other architecture (the
// test suite compiles every header that way to keep that path building).
#ifndef SPECSAMPLE_X86
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SPECSAMPLE_X86 1
#else
#define SPECSAMPLE_X86 0
#endif
#endif
// SPECSAMPLE_AVX512: 1 (the default where SPECSAMPLE_X86 is 1) compiles the AVX-512 kernels beside
// the AVX2 ones and runs them on CPUs that have AVX-512; 0 leaves them out: AVX2 is then the best
// level on every CPU, and no AVX-512 code is generated: the GPT-2 kernels' matmul and attention
// TUs compile in 49-71% less time (docs/gpt2.md, "Kernels and run-time dispatch").
// For builds that never run on AVX-512 (the sanitized test build on a CPU without it). Define it
// alike in every TU of a program (CMake: the option SPECSAMPLE_AVX512, which the specsample target
// carries to its users).
#ifndef SPECSAMPLE_AVX512
#define SPECSAMPLE_AVX512 SPECSAMPLE_X86
#endif
#if SPECSAMPLE_AVX512 && !SPECSAMPLE_X86
#error "SPECSAMPLE_AVX512 = 1 needs the x86 kernels (SPECSAMPLE_X86 = 1)"
#endif
#if SPECSAMPLE_X86
#include <cpuid.h>
#include <immintrin.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

#if SPECSAMPLE_X86
#define SPECSAMPLE_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SPECSAMPLE_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define SPECSAMPLE_TARGET_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))
#define SPECSAMPLE_TARGET_AVX512_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
// The AMX matmuls (models/gpt2/simd.hpp): tile loads, stores and both tile dot products, beside
// AVX-512 for their epilogues.
#define SPECSAMPLE_TARGET_AMX                                                                        \
  __attribute__((target("amx-tile,amx-bf16,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define SPECSAMPLE_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define SPECSAMPLE_ALWAYS_INLINE inline
#endif

namespace specsample {

/// Instruction-set level of the kernels, in increasing order.
enum class isa : std::uint8_t {
  generic = 0,  ///< portable C++ (whatever the compiler flags allow)
  avx2 = 1,     ///< AVX2 + FMA + F16C
  avx512 = 2,   ///< AVX-512 F + BW + VL + DQ (+ FMA, F16C)
  best = 255,   ///< as a request: the best level this CPU supports (and this build compiles)
};

/// Name of an ISA level ("generic", "avx2", "avx512").
[[nodiscard]] constexpr const char* isa_name(isa i) noexcept {
  switch (i) {
    case isa::generic: return "generic";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
    case isa::best: return "best";
  }
  return "?";
}

/// Whether a and b are the same string, ASCII letters compared in either case: how the names of
/// kernel levels, weight formats and matmul precisions are read ("AVX2", "bf16", "F16").
[[nodiscard]] constexpr bool equal_ignoring_case(std::string_view a, std::string_view b) noexcept {
  const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [&](char x, char y) { return lower(x) == lower(y); });
}

/// The level `isa_name` calls `name` ("best", "avx512", "avx2", "generic", in either case), or
/// nothing.
[[nodiscard]] constexpr std::optional<isa> isa_from_name(std::string_view name) noexcept {
  for (const isa i : {isa::best, isa::avx512, isa::avx2, isa::generic}) {
    if (equal_ignoring_case(name, isa_name(i))) return i;
  }
  return std::nullopt;
}

namespace simd {

/// Whether this build compiles the AVX-512 kernels (SPECSAMPLE_AVX512). Every dispatcher tests it
/// first, `if (avx512_kernels && level == isa::avx512)`: a constant false there folds the branch
/// away before code generation, and no code is generated for the kernels behind it (their
/// templates are still instantiated and checked). tests/support/no_avx512_code.sh checks it.
inline constexpr bool avx512_kernels = SPECSAMPLE_AVX512 != 0;

/// The best ISA level the running CPU supports and this build compiles (detected once).
[[nodiscard]] inline isa detected() noexcept {
#if SPECSAMPLE_X86
  static const isa level = [] {
    __builtin_cpu_init();
    // F16C from CPUID leaf 1 (clang 14's __builtin_cpu_supports does not know "f16c").
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    if (avx512_kernels && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("fma") && f16c) {
      return isa::avx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) {
      return isa::avx2;
    }
    return isa::generic;
  }();
  return level;
#else
  return isa::generic;
#endif
}

/// A register of CPUID's answer (`avx512_feature`).
enum class cpuid_register : std::uint8_t { eax, ecx, edx };

/// Whether the CPU runs the AVX-512 level and has every feature `bits` marks in register `reg` of
/// CPUID leaf 7, sub-leaf `subleaf`.
[[nodiscard]] inline bool avx512_feature(unsigned subleaf, cpuid_register reg, unsigned bits) noexcept {
#if SPECSAMPLE_X86
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (detected() != isa::avx512 || __get_cpuid_count(7, subleaf, &eax, &ebx, &ecx, &edx) == 0) return false;
  const unsigned r = reg == cpuid_register::eax ? eax : reg == cpuid_register::ecx ? ecx : edx;
  return (r & bits) == bits;
#else
  (void)subleaf;
  (void)reg;
  (void)bits;
  return false;
#endif
}

/// Whether the CPU runs the AVX-512 level and AVX512_BF16's dot products (vdpbf16ps; Zen 4 and
/// later, Cooper Lake, Sapphire Rapids): the BF16 matmuls of `gpt2::matmul_precision::bf16` use
/// them at the AVX-512 level (detected once; CPUID leaf 7, sub-leaf 1, EAX bit 5).
[[nodiscard]] inline bool has_avx512_bf16() noexcept {
  static const bool has = avx512_feature(1, cpuid_register::eax, 1u << 5);
  return has;
}

/// Whether the CPU runs the AVX-512 level and AVX512_VNNI's byte dot products (vpdpbusd; Intel
/// Cascade Lake, AMD Zen 4 and later): the INT8 matmuls of `gpt2::matmul_precision::int8` use them
/// at the AVX-512 level (detected once; CPUID leaf 7, sub-leaf 0, ECX bit 11).
[[nodiscard]] inline bool has_avx512_vnni() noexcept {
  static const bool has = avx512_feature(0, cpuid_register::ecx, 1u << 11);
  return has;
}

/// Whether the CPU runs the AVX-512 level and has AMX — tiles, TDPBF16PS and TDPBUSD (Intel Sapphire
/// Rapids and later) — and the operating system lets this process use them: the BF16 and INT8
/// matmuls of `gpt2::matmul_precision` may then run on tiles (`gpt2::options::amx`). Detected once:
/// CPUID leaf 7, sub-leaf 0, EDX bits 22 (AMX-BF16), 24 (AMX-TILE) and 25 (AMX-INT8); XCR0 bits 17
/// and 18 (the OS saves tile state); on Linux, which grants the tile data state per process on
/// request, `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` succeeds (the first call asks for
/// it). Elsewhere, and in builds without the AVX-512 kernels, false. The grant is the process's: from
/// then on Linux needs larger signal stacks (AT_MINSIGSTKSZ, ~12 KB on a Xeon of family 6, model
/// 207), so a later `sigaltstack` of a smaller stack fails; and a thread that already runs on a
/// smaller one has the request refused (then false: no tiles).
[[nodiscard]] inline bool has_amx() noexcept {
#if SPECSAMPLE_X86 && defined(__linux__)
  static const bool has = [] {
    if (!avx512_feature(0, cpuid_register::edx, (1u << 22) | (1u << 24) | (1u << 25))) return false;
    // XGETBV (OSXSAVE is implied by the AVX-512 level's detection) as bytes: no -mxsave needed.
    unsigned lo = 0, hi = 0;
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
    constexpr unsigned tile_state = (1u << 17) | (1u << 18);
    if ((lo & tile_state) != tile_state) return false;
    constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
  }();
  return has;
#else
  return false;
#endif
}

/// The level actually used for a request: `requested` capped at `detected()`, what the CPU
/// supports and the build compiles.
[[nodiscard]] inline isa resolve(isa requested) noexcept {
  const isa d = detected();
  if (requested == isa::best) return d;
  return static_cast<std::uint8_t>(requested) <= static_cast<std::uint8_t>(d) ? requested : d;
}

/// Thresholds `tally_above` handles in one pass.
inline constexpr std::size_t tally_width = 8;

/// The end of a vector `tally_above`: per threshold j < nt its count c[j] and its mass, the L
/// float partial masses lanes[j] summed in double in lane order.
template <std::size_t L>
inline void tally_result(const std::size_t* c, const float (*lanes)[L], std::size_t nt, std::size_t* count,
                         double* mass) noexcept {
  for (std::size_t j = 0; j < nt; ++j) {
    count[j] = c[j];
    mass[j] = 0.0;
    for (const float v : lanes[j]) mass[j] += static_cast<double>(v);
  }
}

/// Arguments below this give exp_shifted 0 (the vector exp's lower clamp: exp(-87.34) is the
/// smallest normal float).
inline constexpr float exp_floor = -87.3365447505531f;

/// max(d, 0) without a branch (a compare-and-jump on random data mispredicts half the time); NaN
/// gives 0.
[[nodiscard]] inline double positive_part(double d) noexcept {
#if SPECSAMPLE_X86
  return _mm_cvtsd_f64(_mm_max_sd(_mm_set_sd(d), _mm_setzero_pd()));
#else
  return d > 0.0 ? d : 0.0;
#endif
}

/// x, opaque to the optimiser: an expression stored through it is rounded on its own and cannot
/// be contracted with the next operation into a fused multiply-add (GCC contracts by default
/// wherever FMA is available).
[[nodiscard]] inline double rounded(double x) noexcept {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(x));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(x));
#else
  const volatile double v = x;
  x = v;
#endif
  return x;
}

/// max(0, s·p − q) in double: the residual weight of a rejected draft (s = 1 token-wise). The
/// product and the difference are each rounded once, never fused, so every level's `weight_sum`
/// and this scalar form agree bit for bit.
[[nodiscard]] inline double residual_weight(double p, double q, double s) noexcept {
  return positive_part(rounded(s * p) - q);
}

/// What `weight_sum` adds up: p[i] (`plain`); max(0, s·p[i] − q[i]) (`excess`, the residual of a
/// rejected draft); or max(0, q[i] − s·p[i]) (`shortfall`: block verification's denominator).
enum class weight_kind : std::uint8_t { plain, excess, shortfall };

/// Calls `f.template operator()<K>()` with K = kind: a run-time kind as the kernels' compile-time one.
template <class F>
decltype(auto) with_kind(weight_kind kind, F&& f) {
  switch (kind) {
    case weight_kind::plain: return f.template operator()<weight_kind::plain>();
    case weight_kind::excess: return f.template operator()<weight_kind::excess>();
    default: return f.template operator()<weight_kind::shortfall>();
  }
}

/// One weight of `weight_sum`, the product s·p rounded on its own as in `residual_weight`.
[[nodiscard]] inline double kind_weight(weight_kind kind, double p, double q, double s) noexcept {
  if (kind == weight_kind::plain) return p;
  if (kind == weight_kind::excess) return residual_weight(p, q, s);
  return positive_part(q - rounded(s * p));
}

/// The sum `weight_sum` computes, of any weights w(i) ≥ 0, i in [0, n): eight partial sums, sum j
/// taking w(j), w(j + 8), w(j + 16), … in order, combined pairwise, then the sequential sum of the
/// last n mod 8. No loop-carried dependency longer than every 8th element, and no branch. In
/// double (the default), or in the accumulator type `Acc` (the GPT-2 generic layer norm's float
/// sums).
template <class Acc = double, class W>
[[nodiscard]] Acc weight_sum(W&& w, std::size_t n) {
  Acc acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (std::size_t j = 0; j < 8; ++j) acc[j] += w(i + j);
  }
  Acc tail = 0;
  for (; i < n; ++i) tail += w(i);
  return (((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))) + tail;
}

/// The end of `weight_sum` for the vector kernels: the eight partial sums `a` combined pairwise,
/// plus the sequential sum of the `rest` (< 8) weights left at p (and q).
[[nodiscard]] inline double combine_partial_sums(const double* a, weight_kind kind, const float* p, const float* q,
                                                 double s, std::size_t rest) noexcept {
  double tail = 0.0;
  for (std::size_t i = 0; i < rest; ++i) tail += kind_weight(kind, p[i], kind == weight_kind::plain ? 0.0f : q[i], s);
  return (((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))) + tail;
}

/// Block verification's two sums over the vocabulary (verify.hpp): `weight_sum`s of kind
/// `excess` and `shortfall` of the same p, q and s.
struct excess_shortfall {
  double excess = 0.0;
  double shortfall = 0.0;
};

/// The largest of x[0, n) (-inf for n = 0) and whether some x[i] is NaN (the maximum then
/// unspecified): `max_scan`, the first pass of `argmax`.
struct max_scan_result {
  float max = -std::numeric_limits<float>::infinity();
  bool nan = false;
  /// Logits a softmax can normalise: no NaN, no +inf, at least one finite value.
  [[nodiscard]] bool finite() const noexcept {
    return !nan && max > -std::numeric_limits<float>::infinity() && max != std::numeric_limits<float>::infinity();
  }
};

/// The loop of `block_sums`: sum(b, len) of each block [b, b + len) of `block` weights of [0, n)
/// (the last one may be shorter), the first `max_sums` into sums[0..), and their total, added in
/// order from 0. Inlined into each level's kernel, so that the blocks' dependency chains overlap
/// (a call per block ran twice as slow at times).
template <class Sum>
SPECSAMPLE_ALWAYS_INLINE double each_block(const Sum& sum, std::size_t n, std::size_t block, double* sums,
                                           std::size_t max_sums) {
  double total = 0.0;
  for (std::size_t b = 0, k = 0; b < n; b += block, ++k) {
    const double v = sum(b, std::min(block, n - b));
    if (k < max_sums) sums[k] = v;
    total += v;
  }
  return total;
}

/// What `find_outside` found: the first index outside the interval (n when there is none) and,
/// when there is none, the entries' sum.
struct outside_scan {
  std::size_t first = 0;
  double sum = 0.0;
};

/// Σ lanes[0, n) in double, in order (the partial sums of a vector loop).
inline double lane_total(const float* lanes, std::size_t n) noexcept {
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i) total += static_cast<double>(lanes[i]);
  return total;
}

/// `find_outside` of x[i, n) one by one, `sum` holding Σ x[0, i) (the generic level from i = 0, a
/// vector loop's tail).
inline outside_scan outside_tail(const float* x, std::size_t i, std::size_t n, float lo, float hi, double sum) noexcept {
  for (; i < n; ++i) {
    if (!(x[i] >= lo && x[i] <= hi)) return {i, 0.0};
    sum += static_cast<double>(x[i]);
  }
  return {n, sum};
}

#if SPECSAMPLE_X86

/// AVX-512 lane mask of the first min(n, 16) lanes (tails of the vector loops).
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE __mmask16 avx512_first(std::size_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffffu) : static_cast<__mmask16>((1u << n) - 1u);
}

/// v rounded to the nearest integer (ties to even), no exception flags raised.
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE __m512 avx512_round_nearest(__m512 v) {
  // Without optimisation GCC's avx512fintrin.h defines the roundscale intrinsics as macros that
  // pass the mask to a builtin taking a short: -Wsign-conversion would warn in the including TU.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-conversion"
#endif
  return _mm512_maskz_roundscale_ps(0xFFFF, v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
}

// The tails of the AVX2 loops (fewer than 8 elements left) go through a buffer: no load or store
// past the data.

/// The n (< 8) floats at x in the low lanes, `pad` in the others.
SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE __m256 avx2_load_first(const float* x, std::size_t n, float pad) {
  alignas(32) float buf[8];
  for (std::size_t j = 0; j < 8; ++j) buf[j] = j < n ? x[j] : pad;
  return _mm256_load_ps(buf);
}

/// Stores the low n (< 8) lanes of v at y.
SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE void avx2_store_first(float* y, __m256 v, std::size_t n) {
  alignas(32) float buf[8];
  _mm256_store_ps(buf, v);
  std::memcpy(y, buf, n * sizeof(float));
}

// A Cephes-style exp (range reduction by ln 2, degree-5 polynomial, ~1 ulp), argument clamped to
// [-87.34, 88.38] (results from the smallest normal float up). Elementwise: every element gets
// the same instructions wherever it sits in a buffer. `*_exp_reduced` is its core without the
// clamp: exp(x) = y · 2^n for x in that range; `exp_shifted`, whose arguments are at most 0 and
// whose results below the range are 0 anyway, skips the clamp (and, at AVX-512, masks in the
// scaling).

struct avx512_exp_parts {
  __m512 y, n;
};

SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE avx512_exp_parts avx512_exp_reduced(__m512 x) {
  const __m512 n = avx512_round_nearest(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)));
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  return {_mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f)), n};
}

SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE __m512 avx512_exp(__m512 x) {
  x = _mm512_maskz_max_ps(0xFFFF, _mm512_maskz_min_ps(0xFFFF, x, _mm512_set1_ps(88.3762626647949f)),
                          _mm512_set1_ps(-87.3365447505531f));
  const auto [y, n] = avx512_exp_reduced(x);
  return _mm512_maskz_scalef_ps(0xFFFF, y, n);
}

struct avx2_exp_parts {
  __m256 y, n;
};

SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE avx2_exp_parts avx2_exp_reduced(__m256 x) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  return {_mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f)), n};
}

// 2^n for whole n in [-126, 127], built in the exponent field.
SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE __m256 avx2_pow2(__m256 n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}

SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE __m256 avx2_exp(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)),
                    _mm256_set1_ps(-87.3365447505531f));
  const auto [y, n] = avx2_exp_reduced(x);
  return _mm256_mul_ps(y, avx2_pow2(n));
}

/// See `exp_shifted`. Scale1: scale == 1, whose multiply is skipped (x · 1 = x, bit for bit).
/// Pairs of vectors are added in float, each pair's two halves then into its double accumulator.
template <bool Scale1>
SPECSAMPLE_TARGET_AVX512 double exp_shifted_avx512(const float* x, float* y, std::size_t n, float m, float scale) {
  const __m512 mv = _mm512_set1_ps(m), sv = _mm512_set1_ps(scale), floor = _mm512_set1_ps(exp_floor);
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  // One vector at x + i, the lanes of k in range (all but in the tail). A NaN argument passes the
  // floor test (unordered), so the total turns NaN.
  const auto step = [&](std::size_t i, __mmask16 k) SPECSAMPLE_TARGET_AVX512 {
    const bool full = k == 0xFFFF;
    const __m512 v = full ? _mm512_loadu_ps(x + i) : _mm512_maskz_loadu_ps(k, x + i);
    __m512 a = _mm512_sub_ps(v, mv);
    if constexpr (!Scale1) a = _mm512_mul_ps(a, sv);
    const __mmask16 live = _mm512_mask_cmp_ps_mask(k, a, floor, _CMP_NLT_UQ);
    const auto [ey, en] = avx512_exp_reduced(a);
    const __m512 e = _mm512_maskz_scalef_ps(live, ey, en);
    if (full) {
      _mm512_storeu_ps(y + i, e);
    } else {
      _mm512_mask_storeu_ps(y + i, k, e);
    }
    return e;
  };
  const auto add = [&](__m512 e) SPECSAMPLE_TARGET_AVX512 {
    // (the maskz forms: GCC 12 warns about the _undefined operand of the plain ones)
    lo = _mm512_add_pd(lo, _mm512_maskz_cvtps_pd(0xFF, _mm512_maskz_extractf32x8_ps(0xFF, e, 0)));
    hi = _mm512_add_pd(hi, _mm512_maskz_cvtps_pd(0xFF, _mm512_maskz_extractf32x8_ps(0xFF, e, 1)));
  };
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) add(_mm512_add_ps(step(i, 0xFFFF), step(i + 16, 0xFFFF)));
  for (; i < n; i += 16) add(step(i, avx512_first(n - i)));
  alignas(64) double l[16];
  _mm512_store_pd(l, lo);
  _mm512_store_pd(l + 8, hi);
  double total = 0.0;
  for (const double v : l) total += v;
  return total;
}

/// See `exp_shifted` and the AVX-512 version.
template <bool Scale1>
SPECSAMPLE_TARGET_AVX2 double exp_shifted_avx2(const float* x, float* y, std::size_t n, float m, float scale) {
  const __m256 mv = _mm256_set1_ps(m), sv = _mm256_set1_ps(scale), floor = _mm256_set1_ps(exp_floor);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  const auto step = [&](__m256 v) SPECSAMPLE_TARGET_AVX2 {
    __m256 a = _mm256_sub_ps(v, mv);
    if constexpr (!Scale1) a = _mm256_mul_ps(a, sv);
    const auto [ey, en] = avx2_exp_reduced(a);
    return _mm256_and_ps(_mm256_cmp_ps(a, floor, _CMP_NLT_UQ), _mm256_mul_ps(ey, avx2_pow2(en)));
  };
  const auto add = [&](__m256 e) SPECSAMPLE_TARGET_AVX2 {
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  };
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 e0 = step(_mm256_loadu_ps(x + i)), e1 = step(_mm256_loadu_ps(x + i + 8));
    _mm256_storeu_ps(y + i, e0);
    _mm256_storeu_ps(y + i + 8, e1);
    add(_mm256_add_ps(e0, e1));
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 e = step(_mm256_loadu_ps(x + i));
    _mm256_storeu_ps(y + i, e);
    add(e);
  }
  if (i < n) {  // the tail, padded with -inf (which gives 0)
    const __m256 e = step(avx2_load_first(x + i, n - i, -std::numeric_limits<float>::infinity()));
    avx2_store_first(y + i, e, n - i);
    add(e);
  }
  alignas(32) double l[8];
  _mm256_store_pd(l, lo);
  _mm256_store_pd(l + 4, hi);
  double total = 0.0;
  for (const double v : l) total += v;
  return total;
}

/// See `max_value`.
inline SPECSAMPLE_TARGET_AVX512 float max_value_avx512(const float* x, std::size_t n) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 best[2] = {ninf, ninf};
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    best[0] = _mm512_maskz_max_ps(0xFFFF, best[0], _mm512_loadu_ps(x + i));
    best[1] = _mm512_maskz_max_ps(0xFFFF, best[1], _mm512_loadu_ps(x + i + 16));
  }
  for (; i < n; i += 16) {
    const __mmask16 k = avx512_first(n - i);
    best[0] = _mm512_maskz_max_ps(0xFFFF, best[0], _mm512_mask_loadu_ps(ninf, k, x + i));
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_maskz_max_ps(0xFFFF, best[0], best[1]));
  float m = lanes[0];
  for (const float v : lanes) m = v > m ? v : m;
  return m;
}

/// See `scale`.
inline SPECSAMPLE_TARGET_AVX512 void scale_avx512(float* x, std::size_t n, float s) {
  const __m512 sv = _mm512_set1_ps(s);
  for (std::size_t i = 0; i < n; i += 16) {
    const __mmask16 k = avx512_first(n - i);
    _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), sv));
  }
}

/// See `max_scan`. Two vectors per step; the tail padded with -inf.
inline SPECSAMPLE_TARGET_AVX512 max_scan_result max_scan_avx512(const float* x, std::size_t n) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 best[2] = {ninf, ninf};
  __mmask16 nan = 0;
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    nan |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);  // lane j: a[j] or b[j] is NaN
    best[0] = _mm512_maskz_max_ps(0xFFFF, best[0], a);  // (maskz forms throughout: GCC 12 warns on the others)
    best[1] = _mm512_maskz_max_ps(0xFFFF, best[1], b);
  }
  for (; i < n; i += 16) {
    const __m512 v = _mm512_mask_loadu_ps(ninf, avx512_first(n - i), x + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    best[0] = _mm512_maskz_max_ps(0xFFFF, best[0], v);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_maskz_max_ps(0xFFFF, best[0], best[1]));
  float m = lanes[0];
  for (const float v : lanes) m = v > m ? v : m;
  return {m, nan != 0};
}

/// See `magnitudes_below`. Two vectors per step; the tail through a mask (never read past n).
inline SPECSAMPLE_TARGET_AVX512 bool magnitudes_below_avx512(const float* x, std::size_t n, std::uint32_t bound) {
  const __m512i abs = _mm512_set1_epi32(0x7fffffff), lim = _mm512_set1_epi32(static_cast<int>(bound));
  __mmask16 bad = 0;
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i a = _mm512_and_si512(_mm512_loadu_si512(x + i), abs);
    const __m512i b = _mm512_and_si512(_mm512_loadu_si512(x + i + 16), abs);
    bad |= static_cast<__mmask16>(_mm512_cmpge_epi32_mask(a, lim) | _mm512_cmpge_epi32_mask(b, lim));
  }
  for (; i < n; i += 16) {
    const __m512i v = _mm512_and_si512(_mm512_maskz_loadu_epi32(avx512_first(n - i), x + i), abs);
    bad |= _mm512_cmpge_epi32_mask(v, lim);
  }
  return bad == 0;
}

/// See `argmax`.
inline SPECSAMPLE_TARGET_AVX512 std::ptrdiff_t argmax_avx512(const float* x, std::size_t n) {
  const max_scan_result scan = max_scan_avx512(x, n);
  if (!scan.finite()) return -1;
  const __m512 mv = _mm512_set1_ps(scan.max);
  for (std::size_t i = 0; i < n; i += 16) {
    const __mmask16 k = avx512_first(n - i);
    const __mmask16 hit = _mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, x + i), mv, _CMP_EQ_OQ);
    if (hit != 0) return static_cast<std::ptrdiff_t>(i) + __builtin_ctz(hit);
  }
  return -1;  // unreachable
}

/// See `max_value`. Two vectors per step (the maximum is exact in any order); the tail padded with
/// -inf.
inline SPECSAMPLE_TARGET_AVX2 float max_value_avx2(const float* x, std::size_t n) {
  const float ninf = -std::numeric_limits<float>::infinity();
  __m256 best[2] = {_mm256_set1_ps(ninf), _mm256_set1_ps(ninf)};
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    best[0] = _mm256_max_ps(best[0], _mm256_loadu_ps(x + i));
    best[1] = _mm256_max_ps(best[1], _mm256_loadu_ps(x + i + 8));
  }
  if (i + 8 <= n) {
    best[0] = _mm256_max_ps(best[0], _mm256_loadu_ps(x + i));
    i += 8;
  }
  if (i < n) best[1] = _mm256_max_ps(best[1], avx2_load_first(x + i, n - i, ninf));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(best[0], best[1]));
  float m = lanes[0];
  for (const float v : lanes) m = v > m ? v : m;
  return m;
}

/// See `scale`.
inline SPECSAMPLE_TARGET_AVX2 void scale_avx2(float* x, std::size_t n, float s) {
  const __m256 sv = _mm256_set1_ps(s);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sv));
  if (i < n) avx2_store_first(x + i, _mm256_mul_ps(avx2_load_first(x + i, n - i, 0.0f), sv), n - i);
}

/// See `max_scan`.
inline SPECSAMPLE_TARGET_AVX2 max_scan_result max_scan_avx2(const float* x, std::size_t n) {
  const float ninf = -std::numeric_limits<float>::infinity();
  __m256 best = _mm256_set1_ps(ninf), nan = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    best = _mm256_max_ps(best, v);
  }
  alignas(32) float l[8];
  _mm256_store_ps(l, best);
  float m = ninf;
  bool any_nan = _mm256_movemask_ps(nan) != 0;
  for (const float v : l) m = v > m ? v : m;
  for (std::size_t j = i; j < n; ++j) {
    any_nan = any_nan || std::isnan(x[j]);
    m = x[j] > m ? x[j] : m;
  }
  return {m, any_nan};
}

/// See `magnitudes_below`. Two vectors per step; the tail through a buffer.
inline SPECSAMPLE_TARGET_AVX2 bool magnitudes_below_avx2(const float* x, std::size_t n, std::uint32_t bound) {
  const __m256i abs = _mm256_set1_epi32(0x7fffffff), lim = _mm256_set1_epi32(static_cast<int>(bound));
  __m256i bad = _mm256_setzero_si256();
  const auto over = [&](__m256 v) SPECSAMPLE_TARGET_AVX2 {  // lanes with |v| >= bound (as bits)
    return _mm256_xor_si256(_mm256_cmpgt_epi32(lim, _mm256_and_si256(_mm256_castps_si256(v), abs)),
                            _mm256_set1_epi32(-1));
  };
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    bad = _mm256_or_si256(bad, _mm256_or_si256(over(_mm256_loadu_ps(x + i)), over(_mm256_loadu_ps(x + i + 8))));
  }
  for (; i < n; i += 8) {
    bad = _mm256_or_si256(bad, over(n - i >= 8 ? _mm256_loadu_ps(x + i) : avx2_load_first(x + i, n - i, 0.0f)));
  }
  return _mm256_testz_si256(bad, bad) != 0;
}

/// See `argmax`.
inline SPECSAMPLE_TARGET_AVX2 std::ptrdiff_t argmax_avx2(const float* x, std::size_t n) {
  const max_scan_result scan = max_scan_avx2(x, n);
  if (!scan.finite()) return -1;
  const __m256 mv = _mm256_set1_ps(scan.max);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), mv, _CMP_EQ_OQ));
    if (hit != 0) return static_cast<std::ptrdiff_t>(i) + __builtin_ctz(static_cast<unsigned>(hit));
  }
  for (; i < n; ++i) {
    if (x[i] == scan.max) return static_cast<std::ptrdiff_t>(i);
  }
  return -1;  // unreachable
}

/// See `weight_sum`: lane j of one vector of 8 doubles is partial sum j.
template <weight_kind Kind>
inline SPECSAMPLE_TARGET_AVX512 double weight_sum_avx512(const float* p, const float* q, double s, std::size_t n) {
  if constexpr (Kind == weight_kind::plain) q = p;  // never read; keeps q + i a valid pointer
  const __m512d sv = _mm512_set1_pd(s), zero = _mm512_setzero_pd();
  __m512d acc = zero;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    // (the maskz forms: GCC 12 warns about the _undefined operand of the plain ones)
    __m512d w = _mm512_maskz_cvtps_pd(0xFF, _mm256_loadu_ps(p + i));
    if constexpr (Kind != weight_kind::plain) {
      __m512d sp = _mm512_mul_pd(sv, w);
      __asm__("" : "+v"(sp));  // rounded on its own, as in `kind_weight`
      const __m512d qv = _mm512_maskz_cvtps_pd(0xFF, _mm256_loadu_ps(q + i));
      w = _mm512_maskz_max_pd(0xFF, Kind == weight_kind::excess ? _mm512_sub_pd(sp, qv) : _mm512_sub_pd(qv, sp), zero);
    }
    acc = _mm512_add_pd(acc, w);
  }
  alignas(64) double a[8];
  _mm512_store_pd(a, acc);
  return combine_partial_sums(a, Kind, p + i, q + i, s, n - i);
}

/// See `weight_sum`: partial sums 0–3 and 4–7 in two vectors of 4 doubles.
template <weight_kind Kind>
inline SPECSAMPLE_TARGET_AVX2 double weight_sum_avx2(const float* p, const float* q, double s, std::size_t n) {
  if constexpr (Kind == weight_kind::plain) q = p;  // never read; keeps q + i a valid pointer
  const __m256d sv = _mm256_set1_pd(s), zero = _mm256_setzero_pd();
  __m256d lo = zero, hi = zero;
  const auto weights = [&](const float* x, const float* y) SPECSAMPLE_TARGET_AVX2 {
    __m256d w = _mm256_cvtps_pd(_mm_loadu_ps(x));
    if constexpr (Kind != weight_kind::plain) {
      __m256d sp = _mm256_mul_pd(sv, w);
      __asm__("" : "+x"(sp));  // rounded on its own, as in `kind_weight`
      const __m256d qv = _mm256_cvtps_pd(_mm_loadu_ps(y));
      w = _mm256_max_pd(Kind == weight_kind::excess ? _mm256_sub_pd(sp, qv) : _mm256_sub_pd(qv, sp), zero);
    }
    return w;
  };
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    lo = _mm256_add_pd(lo, weights(p + i, q + i));
    hi = _mm256_add_pd(hi, weights(p + i + 4, q + i + 4));
  }
  alignas(32) double a[8];
  _mm256_store_pd(a, lo);
  _mm256_store_pd(a + 4, hi);
  return combine_partial_sums(a, Kind, p + i, q + i, s, n - i);
}

/// See `excess_and_shortfall`: `weight_sum_avx512`'s loop with both sums' accumulators (two
/// independent dependency chains in one pass).
inline SPECSAMPLE_TARGET_AVX512 excess_shortfall excess_and_shortfall_avx512(const float* p, const float* q, double s,
                                                                            std::size_t n) {
  const __m512d sv = _mm512_set1_pd(s), zero = _mm512_setzero_pd();
  __m512d above = zero, below = zero;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m512d sp = _mm512_mul_pd(sv, _mm512_maskz_cvtps_pd(0xFF, _mm256_loadu_ps(p + i)));
    __asm__("" : "+v"(sp));  // rounded on its own, as in `kind_weight`
    const __m512d qv = _mm512_maskz_cvtps_pd(0xFF, _mm256_loadu_ps(q + i));
    above = _mm512_add_pd(above, _mm512_maskz_max_pd(0xFF, _mm512_sub_pd(sp, qv), zero));
    below = _mm512_add_pd(below, _mm512_maskz_max_pd(0xFF, _mm512_sub_pd(qv, sp), zero));
  }
  alignas(64) double a[8], b[8];
  _mm512_store_pd(a, above);
  _mm512_store_pd(b, below);
  return {combine_partial_sums(a, weight_kind::excess, p + i, q + i, s, n - i),
          combine_partial_sums(b, weight_kind::shortfall, p + i, q + i, s, n - i)};
}

/// See `excess_and_shortfall`: `weight_sum_avx2`'s loop with both sums' accumulators.
inline SPECSAMPLE_TARGET_AVX2 excess_shortfall excess_and_shortfall_avx2(const float* p, const float* q, double s,
                                                                        std::size_t n) {
  const __m256d sv = _mm256_set1_pd(s), zero = _mm256_setzero_pd();
  __m256d above_lo = zero, above_hi = zero, below_lo = zero, below_hi = zero;
  const auto add = [&](const float* x, const float* y, __m256d& above, __m256d& below) SPECSAMPLE_TARGET_AVX2 {
    __m256d sp = _mm256_mul_pd(sv, _mm256_cvtps_pd(_mm_loadu_ps(x)));
    __asm__("" : "+x"(sp));  // rounded on its own, as in `kind_weight`
    const __m256d qv = _mm256_cvtps_pd(_mm_loadu_ps(y));
    above = _mm256_add_pd(above, _mm256_max_pd(_mm256_sub_pd(sp, qv), zero));
    below = _mm256_add_pd(below, _mm256_max_pd(_mm256_sub_pd(qv, sp), zero));
  };
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    add(p + i, q + i, above_lo, below_lo);
    add(p + i + 4, q + i + 4, above_hi, below_hi);
  }
  alignas(32) double a[8], b[8];
  _mm256_store_pd(a, above_lo);
  _mm256_store_pd(a + 4, above_hi);
  _mm256_store_pd(b, below_lo);
  _mm256_store_pd(b + 4, below_hi);
  return {combine_partial_sums(a, weight_kind::excess, p + i, q + i, s, n - i),
          combine_partial_sums(b, weight_kind::shortfall, p + i, q + i, s, n - i)};
}

/// See `block_sums`: `weight_sum_avx512` per block, inlined into `each_block`'s loop.
template <weight_kind Kind>
inline SPECSAMPLE_TARGET_AVX512 double block_sums_avx512(const float* p, const float* q, double s, std::size_t n,
                                                        std::size_t block, double* sums, std::size_t max_sums) {
  const auto sum = [&](std::size_t b, std::size_t len) SPECSAMPLE_TARGET_AVX512 {
    return weight_sum_avx512<Kind>(p + b, Kind == weight_kind::plain ? p + b : q + b, s, len);
  };
  return each_block(sum, n, block, sums, max_sums);
}

/// See `block_sums`: `weight_sum_avx2` per block, inlined into `each_block`'s loop.
template <weight_kind Kind>
inline SPECSAMPLE_TARGET_AVX2 double block_sums_avx2(const float* p, const float* q, double s, std::size_t n,
                                                    std::size_t block, double* sums, std::size_t max_sums) {
  const auto sum = [&](std::size_t b, std::size_t len) SPECSAMPLE_TARGET_AVX2 {
    return weight_sum_avx2<Kind>(p + b, Kind == weight_kind::plain ? p + b : q + b, s, len);
  };
  return each_block(sum, n, block, sums, max_sums);
}

/// See `find_greater`.
inline SPECSAMPLE_TARGET_AVX512 std::size_t find_greater_avx512(const float* x, std::size_t n, float t) {
  const __m512 tv = _mm512_set1_ps(t);
  for (std::size_t i = 0; i < n; i += 16) {
    const __mmask16 k = avx512_first(n - i);
    const __mmask16 hit = _mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, x + i), tv, _CMP_GT_OQ);
    if (hit != 0) return i + static_cast<std::size_t>(__builtin_ctz(hit));
  }
  return n;
}

/// See `find_outside`. Whole vectors unmasked, the tail masked; two accumulators of 16 lanes.
inline SPECSAMPLE_TARGET_AVX512 outside_scan find_outside_avx512(const float* x, std::size_t n, float lo, float hi) {
  const __m512 lv = _mm512_set1_ps(lo), hv = _mm512_set1_ps(hi);
  const auto outside = [&](__mmask16 k, __m512 v) SPECSAMPLE_TARGET_AVX512 {
    return static_cast<__mmask16>(k & ~_mm512_mask_cmp_ps_mask(_mm512_mask_cmp_ps_mask(k, v, lv, _CMP_GE_OQ), v, hv,
                                                                _CMP_LE_OQ));
  };
  const auto found = [](std::size_t i, __mmask16 out) {
    return outside_scan{i + static_cast<std::size_t>(__builtin_ctz(out)), 0.0};
  };
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    if (const __mmask16 out = outside(0xFFFF, a); out != 0) return found(i, out);
    if (const __mmask16 out = outside(0xFFFF, b); out != 0) return found(i + 16, out);
    s0 = _mm512_add_ps(s0, a);
    s1 = _mm512_add_ps(s1, b);
  }
  for (; i < n; i += 16) {
    const __mmask16 k = avx512_first(n - i);
    const __m512 a = _mm512_maskz_loadu_ps(k, x + i);
    if (const __mmask16 out = outside(k, a); out != 0) return found(i, out);
    s0 = _mm512_add_ps(s0, a);
  }
  alignas(64) float lanes[32];
  _mm512_store_ps(lanes, s0);
  _mm512_store_ps(lanes + 16, s1);
  return {n, lane_total(lanes, 32)};
}

/// See `tally_above`.
inline SPECSAMPLE_TARGET_AVX512 void tally_above_avx512(const float* x, std::size_t n, const float* t, std::size_t nt,
                                                       std::size_t* count, double* mass) {
  __m512 tv[tally_width], w[tally_width];
  std::size_t c[tally_width] = {};
  for (std::size_t j = 0; j < tally_width; ++j) {
    tv[j] = _mm512_set1_ps(j < nt ? t[j] : std::numeric_limits<float>::infinity());
    w[j] = _mm512_setzero_ps();
  }
  for (std::size_t i = 0; i < n; i += 16) {
    const __mmask16 k = avx512_first(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(k, x + i);
#pragma GCC unroll 8
    for (std::size_t j = 0; j < tally_width; ++j) {  // (unrolled: the 16 vectors stay in registers)
      const __mmask16 above = _mm512_mask_cmp_ps_mask(k, v, tv[j], _CMP_GT_OQ);
      c[j] += static_cast<std::size_t>(__builtin_popcount(above));
      w[j] = _mm512_mask_add_ps(w[j], above, w[j], v);
    }
  }
  alignas(64) float lanes[tally_width][16];
  for (std::size_t j = 0; j < nt; ++j) _mm512_store_ps(lanes[j], w[j]);
  tally_result(c, lanes, nt, count, mass);
}

/// See `zero_after`.
inline SPECSAMPLE_TARGET_AVX512 void zero_after_avx512(float* x, std::size_t n, float p, std::uint32_t id) {
  const __m512 pv = _mm512_set1_ps(p);
  const __m512i idv = _mm512_set1_epi32(static_cast<int>(id)), sixteen = _mm512_set1_epi32(16);
  __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (std::size_t i = 0; i < n; i += 16, idx = _mm512_add_epi32(idx, sixteen)) {
    const __mmask16 k = avx512_first(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(k, x + i);
    const __mmask16 keep = _mm512_cmp_ps_mask(v, pv, _CMP_GT_OQ) |
                           (_mm512_cmp_ps_mask(v, pv, _CMP_EQ_OQ) & _mm512_cmple_epu32_mask(idx, idv));
    _mm512_mask_storeu_ps(x + i, k, _mm512_maskz_mov_ps(keep, v));
  }
}

// The AVX2 twins of the three above. Their searches pad the tail with NaN, which compares false
// with every threshold.

/// See `find_greater`.
inline SPECSAMPLE_TARGET_AVX2 std::size_t find_greater_avx2(const float* x, std::size_t n, float t) {
  const __m256 tv = _mm256_set1_ps(t);
  const auto hits = [&](__m256 v) SPECSAMPLE_TARGET_AVX2 {
    return static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(v, tv, _CMP_GT_OQ)));
  };
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    if (const unsigned hit = hits(_mm256_loadu_ps(x + i)); hit != 0) return i + static_cast<std::size_t>(__builtin_ctz(hit));
  }
  if (i < n) {
    const unsigned hit = hits(avx2_load_first(x + i, n - i, std::numeric_limits<float>::quiet_NaN()));
    if (hit != 0) return i + static_cast<std::size_t>(__builtin_ctz(hit));
  }
  return n;
}

/// See `find_outside`. Two accumulators of 8 lanes.
inline SPECSAMPLE_TARGET_AVX2 outside_scan find_outside_avx2(const float* x, std::size_t n, float lo, float hi) {
  const __m256 lv = _mm256_set1_ps(lo), hv = _mm256_set1_ps(hi);
  const auto outside = [&](__m256 v) SPECSAMPLE_TARGET_AVX2 {
    const __m256 in = _mm256_and_ps(_mm256_cmp_ps(v, lv, _CMP_GE_OQ), _mm256_cmp_ps(v, hv, _CMP_LE_OQ));
    return ~static_cast<unsigned>(_mm256_movemask_ps(in)) & 0xFFu;
  };
  const auto found = [](std::size_t i, unsigned out) {
    return outside_scan{i + static_cast<std::size_t>(__builtin_ctz(out)), 0.0};
  };
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    if (const unsigned out = outside(a); out != 0) return found(i, out);
    if (const unsigned out = outside(b); out != 0) return found(i + 8, out);
    s0 = _mm256_add_ps(s0, a);
    s1 = _mm256_add_ps(s1, b);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_loadu_ps(x + i);
    if (const unsigned out = outside(a); out != 0) return found(i, out);
    s0 = _mm256_add_ps(s0, a);
  }
  alignas(32) float lanes[16];
  _mm256_store_ps(lanes, s0);
  _mm256_store_ps(lanes + 8, s1);
  return outside_tail(x, i, n, lo, hi, lane_total(lanes, 16));
}

/// See `tally_above`: per threshold a count and eight float partial masses.
inline SPECSAMPLE_TARGET_AVX2 void tally_above_avx2(const float* x, std::size_t n, const float* t, std::size_t nt,
                                                   std::size_t* count, double* mass) {
  alignas(32) float tv[tally_width][8];
  __m256 w[tally_width];
  std::size_t c[tally_width] = {};
  for (std::size_t j = 0; j < tally_width; ++j) {
    const float tj = j < nt ? t[j] : std::numeric_limits<float>::infinity();
    for (float& l : tv[j]) l = tj;
    w[j] = _mm256_setzero_ps();
  }
  const auto step = [&](__m256 v) SPECSAMPLE_TARGET_AVX2 {
#pragma GCC unroll 8
    for (std::size_t j = 0; j < tally_width; ++j) {  // (unrolled: the 8 sums stay in registers)
      const __m256 above = _mm256_cmp_ps(v, _mm256_load_ps(tv[j]), _CMP_GT_OQ);
      c[j] += static_cast<std::size_t>(__builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(above))));
      w[j] = _mm256_add_ps(w[j], _mm256_and_ps(above, v));
    }
  };
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) step(_mm256_loadu_ps(x + i));
  if (i < n) step(avx2_load_first(x + i, n - i, std::numeric_limits<float>::quiet_NaN()));
  alignas(32) float lanes[tally_width][8];
  for (std::size_t j = 0; j < nt; ++j) _mm256_store_ps(lanes[j], w[j]);
  tally_result(c, lanes, nt, count, mass);
}

/// See `zero_after` (the index comparison unsigned: both sides offset by 2^31 for the signed one).
inline SPECSAMPLE_TARGET_AVX2 void zero_after_avx2(float* x, std::size_t n, float p, std::uint32_t id) {
  const __m256 pv = _mm256_set1_ps(p);
  const __m256i bias = _mm256_set1_epi32(std::numeric_limits<std::int32_t>::min()), eight = _mm256_set1_epi32(8);
  const __m256i idv = _mm256_xor_si256(_mm256_set1_epi32(static_cast<int>(id)), bias);
  __m256i idx = _mm256_xor_si256(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), bias);  // i + lane, offset
  const auto step = [&](__m256 v) SPECSAMPLE_TARGET_AVX2 {
    const __m256 after_id = _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, idv));
    const __m256 keep = _mm256_or_ps(_mm256_cmp_ps(v, pv, _CMP_GT_OQ),
                                     _mm256_andnot_ps(after_id, _mm256_cmp_ps(v, pv, _CMP_EQ_OQ)));
    idx = _mm256_add_epi32(idx, eight);
    return _mm256_and_ps(keep, v);
  };
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, step(_mm256_loadu_ps(x + i)));
  if (i < n) avx2_store_first(x + i, step(avx2_load_first(x + i, n - i, 0.0f)), n - i);
}

#endif  // SPECSAMPLE_X86

/// y[i] = exp((x[i] - m) · scale), 0 where (x[i] - m) · scale < exp_floor (so -inf gives exactly
/// 0), with the vector exp of `level`; m >= every x[i] and scale > 0 (callers pass the maximum:
/// the arguments are at most 0). Returns Σ y[i], or NaN when some x[i] is NaN. The vector levels
/// add two vectors' y in float, then each such sum into double accumulators in a fixed order per
/// level: within 2^-24 relative of the exact sum of the y[i] (every term is non-negative; one
/// float rounding per pair) plus the double additions' own, ~n·2^-53. y may be x (in place). The
/// softmax numerator of the logit warper and of the GPT-2 attention.
inline double exp_shifted(isa level, const float* x, float* y, std::size_t n, float m, float scale) noexcept {
#if SPECSAMPLE_X86
  if (avx512_kernels && level == isa::avx512) {
    return scale == 1.0f ? exp_shifted_avx512<true>(x, y, n, m, scale) : exp_shifted_avx512<false>(x, y, n, m, scale);
  }
  if (level == isa::avx2) {
    return scale == 1.0f ? exp_shifted_avx2<true>(x, y, n, m, scale) : exp_shifted_avx2<false>(x, y, n, m, scale);
  }
#else
  (void)level;
#endif
  double total = 0.0;
  bool nan = false;
  for (std::size_t i = 0; i < n; ++i) {
    nan = nan || std::isnan(x[i]);
    const float a = (x[i] - m) * scale;
    y[i] = a >= exp_floor ? std::exp(a) : 0.0f;
    total += static_cast<double>(y[i]);
  }
  return nan ? std::numeric_limits<double>::quiet_NaN() : total;
}

/// The largest of x[0, n) (n > 0; -inf for n = 0), NaNs aside: the result is the maximum when no
/// x[i] is NaN, and otherwise unspecified (callers detect NaN elsewhere, e.g. `exp_shifted`).
inline float max_value(isa level, const float* x, std::size_t n) noexcept {
#if SPECSAMPLE_X86
  if (avx512_kernels && level == isa::avx512) return max_value_avx512(x, n);
  if (level == isa::avx2) return max_value_avx2(x, n);
#else
  (void)level;
#endif
  float m = -std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

/// Σ kind_weight(kind, p[i], q[i], s) over [0, n) in double (q is not read for `plain`), in the
/// order of the scalar `weight_sum` above. Every level gives the same bits (double additions of
/// exactly converted floats and of separately rounded products, in the same order): the weight
/// sums of categorical draws (sampling/random.hpp) and the warper's renormalisations; block
/// verification's two sums come from `excess_and_shortfall`, one pass for both.
inline double weight_sum(isa level, weight_kind kind, const float* p, const float* q, double s, std::size_t n) noexcept {
#if SPECSAMPLE_X86
  if (avx512_kernels && level == isa::avx512) return with_kind(kind, [&]<weight_kind K>() { return weight_sum_avx512<K>(p, q, s, n); });
  if (level == isa::avx2) return with_kind(kind, [&]<weight_kind K>() { return weight_sum_avx2<K>(p, q, s, n); });
#else
  (void)level;
#endif
  if (kind == weight_kind::plain) return weight_sum([=](std::size_t i) { return static_cast<double>(p[i]); }, n);
  return weight_sum([=](std::size_t i) { return kind_weight(kind, p[i], q[i], s); }, n);
}

/// `weight_sum(level, kind, …)` of each block of `block` weights of [0, n) (the last one may be
/// shorter), bit for bit: the first `max_sums` into sums[0..), and their total, the blocks' sums
/// added in order from 0. The block sums of categorical draws (sampling/random.hpp).
inline double block_sums(isa level, weight_kind kind, const float* p, const float* q, double s, std::size_t n,
                         std::size_t block, double* sums, std::size_t max_sums) noexcept {
#if SPECSAMPLE_X86
  if (avx512_kernels && level == isa::avx512) {
    return with_kind(kind, [&]<weight_kind K>() { return block_sums_avx512<K>(p, q, s, n, block, sums, max_sums); });
  }
  if (level == isa::avx2) {
    return with_kind(kind, [&]<weight_kind K>() { return block_sums_avx2<K>(p, q, s, n, block, sums, max_sums); });
  }
#endif
  const auto sum = [&](std::size_t b, std::size_t len) {
    return weight_sum(level, kind, p + b, kind == weight_kind::plain ? p + b : q + b, s, len);
  };
  return each_block(sum, n, block, sums, max_sums);
}

/// `weight_sum(level, weight_kind::excess, …)` and `weight_sum(level, weight_kind::shortfall, …)`
/// of the same arguments, bit for bit, from one pass over p and q (the vector levels; the two
/// sums' dependency chains run side by side).
inline excess_shortfall excess_and_shortfall(isa level, const float* p, const float* q, double s, std::size_t n) noexcept {
#if SPECSAMPLE_X86
  if (avx512_kernels && level == isa::avx512) return excess_and_shortfall_avx512(p, q, s, n);
  if (level == isa::avx2) return excess_and_shortfall_avx2(p, q, s, n);
#endif
  return {weight_sum(level, weight_kind::excess, p, q, s, n), weight_sum(level, weight_kind::shortfall, p, q, s, n)};
}

/// The first i < n with x[i] > t, or n (NaN compares false).
inline std::size_t find_greater(isa level, const float* x, std::size_t n, float t) noexcept {
#if SPECSAMPLE_X86
  if (avx512_kernels && level == isa::avx512) return find_greater_avx512(x, n, t);
  if (level == isa::avx2) return find_greater_avx2(x, n, t);
#else
  (void)level;
#endif
  for (std::size_t i = 0; i < n; ++i) {
    if (x[i] > t) return i;
  }
  return n;
}

/// The index of the first x[i], i < n, outside [lo, hi] — a NaN is outside any interval — or n
/// when there is none, and then Σ x[i]: in one pass (the checks of the distributions a caller
/// hands the verifiers and the sampling loop: [0, FLT_MAX], and a sum near 1). The vector levels
/// add in float lanes (32 at AVX-512 and 16 at AVX2, each ~n/16 or fewer of the entries, then the
/// lanes in double): for entries >= 0, within (n/16) · 2^-24 relative of the exact sum (to 2^-24
/// per addition of a lane); the generic level adds in double.
inline outside_scan find_outside(isa level, const float* x, std::size_t n, float lo, float hi) noexcept {
#if SPECSAMPLE_X86
  if (avx512_kernels && level == isa::avx512) return find_outside_avx512(x, n, lo, hi);
  if (level == isa::avx2) return find_outside_avx2(x, n, lo, hi);
#else
  (void)level;
#endif
  return outside_tail(x, 0, n, lo, hi, 0.0);
}

/// For each of the nt (≤ tally_width) thresholds t[j]: count[j] = #{i < n : x[i] > t[j]} and
/// mass[j] ≈ Σ of those x[i], in one pass over x. The mass is approximate (float partial sums,
/// in an order that depends on the level): it picks candidate sets whose exact sums are
/// computed afterwards, never a result.
inline void tally_above(isa level, const float* x, std::size_t n, const float* t, std::size_t nt, std::size_t* count,
                        double* mass) noexcept {
  assert(nt <= tally_width);
#if SPECSAMPLE_X86
  if (avx512_kernels && level == isa::avx512) return tally_above_avx512(x, n, t, nt, count, mass);
  if (level == isa::avx2) return tally_above_avx2(x, n, t, nt, count, mass);
#else
  (void)level;
#endif
  for (std::size_t j = 0; j < nt; ++j) {
    count[j] = 0;
    mass[j] = 0.0;
  }
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < nt; ++j) {
      if (x[i] > t[j]) {
        ++count[j];
        mass[j] += static_cast<double>(x[i]);
      }
    }
  }
}

/// x[i] = 0 for every i ordered after (p, id), where i is ordered before j when x[i] > x[j], or
/// x[i] == x[j] and i < j: keeps x[i] > p, and x[i] == p for i ≤ id. (n ≤ 2^32.)
inline void zero_after(isa level, float* x, std::size_t n, float p, std::uint32_t id) noexcept {
#if SPECSAMPLE_X86
  if (avx512_kernels && level == isa::avx512) return zero_after_avx512(x, n, p, id);
  if (level == isa::avx2) return zero_after_avx2(x, n, p, id);
#else
  (void)level;
#endif
  for (std::size_t i = 0; i < n; ++i) x[i] = x[i] > p || (x[i] == p && i <= id) ? x[i] : 0.0f;
}

/// x[i] *= s for i < n (each product rounded once, whatever the level).
inline void scale(isa level, float* x, std::size_t n, float s) noexcept {
#if SPECSAMPLE_X86
  if (avx512_kernels && level == isa::avx512) return scale_avx512(x, n, s);
  if (level == isa::avx2) return scale_avx2(x, n, s);
#else
  (void)level;
#endif
  for (std::size_t i = 0; i < n; ++i) x[i] *= s;
}

/// See `max_scan_result`: one pass, vectorised. The loop's check of target columns it does not warp.
inline max_scan_result max_scan(isa level, const float* x, std::size_t n) noexcept {
#if SPECSAMPLE_X86
  if (avx512_kernels && level == isa::avx512) return max_scan_avx512(x, n);
  if (level == isa::avx2) return max_scan_avx2(x, n);
#else
  (void)level;
#endif
  max_scan_result r;
  for (std::size_t i = 0; i < n; ++i) {
    r.nan = r.nan || std::isnan(x[i]);
    r.max = x[i] > r.max ? x[i] : r.max;
  }
  return r;
}

/// The bits of |x| (`magnitudes_below` compares them as integers).
[[nodiscard]] inline std::uint32_t magnitude_bits(float x) noexcept {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  return bits & 0x7fffffffu;
}

/// Whether every |x[i]| of x[0, n) is below `bound` (> 0; a NaN never is): one vectorised pass
/// that compares bit patterns as integers, which order like the magnitudes of non-negative floats
/// (and put every NaN above +inf), so no floating-point assumption of the caller's flags (such as
/// -ffinite-math-only) can fold it. With the default bound, +inf: whether every x[i] is finite.
inline bool magnitudes_below(isa level, const float* x, std::size_t n,
                             float bound = std::numeric_limits<float>::infinity()) noexcept {
  assert(bound > 0.0f);
  const std::uint32_t lim = magnitude_bits(bound);
#if SPECSAMPLE_X86
  if (avx512_kernels && level == isa::avx512) return magnitudes_below_avx512(x, n, lim);
  if (level == isa::avx2) return magnitudes_below_avx2(x, n, lim);
#else
  (void)level;
#endif
  std::uint32_t bad = 0;  // branch-free, so that compilers vectorise it
  for (std::size_t i = 0; i < n; ++i) bad |= static_cast<std::uint32_t>(magnitude_bits(x[i]) >= lim);
  return bad == 0;
}

/// The index of the first x[i] that `magnitudes_below` finds at or above `bound` (by the same bit
/// test), or n. Scalar: for naming the value once a check has failed.
inline std::size_t first_magnitude_at_least(const float* x, std::size_t n,
                                            float bound = std::numeric_limits<float>::infinity()) noexcept {
  const std::uint32_t lim = magnitude_bits(bound);
  std::size_t i = 0;
  while (i < n && magnitude_bits(x[i]) < lim) ++i;
  return i;
}

/// The index of the first maximum of x[0, n) (the lowest id on ties), or -1 when some x[i] is
/// NaN, the maximum is +inf, or every x[i] is -inf (n > 0; `max_scan_result::finite`). Greedy
/// decoding's argmax.
inline std::ptrdiff_t argmax(isa level, const float* x, std::size_t n) noexcept {
#if SPECSAMPLE_X86
  if (avx512_kernels && level == isa::avx512) return argmax_avx512(x, n);
  if (level == isa::avx2) return argmax_avx2(x, n);
#else
  (void)level;
#endif
  std::ptrdiff_t best = -1;
  float m = -std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isnan(x[i]) || x[i] == std::numeric_limits<float>::infinity()) return -1;
    if (x[i] > m) {
      m = x[i];
      best = static_cast<std::ptrdiff_t>(i);
    }
  }
  return best;
}

}  // namespace simd
}  // namespace specsample
