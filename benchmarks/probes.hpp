#pragma once
// Machine probes shared by the benchmark programs (bench.cpp, micro.cpp): the streaming read that
// a single-token decode's bandwidth is compared with, and the register-only FMA loop that the
// batched matmuls' compute is compared with. Both use the kernels' instruction set.

#include <specsample/detail/simd.hpp>
#include <specsample/models/gpt2/config.hpp>
#include <specsample/models/gpt2/simd.hpp>
#include <specsample/models/gpt2/weights.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>

namespace specsample_bench {

/// `n` floats allocated as model weights are (`gpt2::allocate_weight_storage`: huge pages when
/// large), so a probe over it sees the same page sizes as the kernels.
class float_buffer {
 public:
  explicit float_buffer(std::size_t n)
      : storage_(specsample::gpt2::allocate_weight_storage(std::max<std::size_t>(n, 1) * sizeof(float))) {}
  [[nodiscard]] float* get() const noexcept { return reinterpret_cast<float*>(storage_.get()); }

 private:
  std::shared_ptr<unsigned char[]> storage_;
};

// --- streaming read ---------------------------------------------------------------------------
// Sums of n floats with the widest vectors, four 64-byte lines per step, each line prefetched
// `prefetch_bytes` (16 KiB) ahead as the matmul kernels do: the best streaming read this core
// manages, not a weaker loop the kernels could beat. The generic path has 64 independent lanes
// (the compiler emits packed SSE2 adds without reassociating).

inline float stream_sum_generic(const float* p, std::size_t n) {
  constexpr std::size_t lanes = 64;
  float acc[lanes] = {};
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    for (std::size_t j = 0; j < lanes; ++j) acc[j] += p[i + j];
  }
  float s = 0.0f;
  for (; i < n; ++i) s += p[i];
  for (const float a : acc) s += a;
  return s;
}

#if SPECSAMPLE_X86
inline constexpr std::size_t probe_ahead = specsample::gpt2::simd::prefetch_bytes / sizeof(float);

SPECSAMPLE_TARGET_AVX512 inline float stream_sum_avx512(const float* p, std::size_t n) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (std::size_t j = 0; j < 4; ++j) {
      if (i + probe_ahead + 16 * j < n) _mm_prefetch(reinterpret_cast<const char*>(p + i + probe_ahead + 16 * j), _MM_HINT_T0);
      acc[j] = _mm512_add_ps(acc[j], _mm512_loadu_ps(p + i + 16 * j));
    }
  }
  alignas(64) float lanes[16];  // (not _mm512_reduce_add_ps: GCC 12 warns about its _undefined operand)
  _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
  float s = std::accumulate(lanes, lanes + 16, 0.0f);
  for (; i < n; ++i) s += p[i];
  return s;
}

SPECSAMPLE_TARGET_AVX2 inline float stream_sum_avx2(const float* p, std::size_t n) {
  __m256 acc[8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (std::size_t j = 0; j < 8; ++j) {
      if (j % 2 == 0 && i + probe_ahead + 8 * j < n) {
        _mm_prefetch(reinterpret_cast<const char*>(p + i + probe_ahead + 8 * j), _MM_HINT_T0);
      }
      acc[j] = _mm256_add_ps(acc[j], _mm256_loadu_ps(p + i + 8 * j));
    }
  }
  for (std::size_t j = 1; j < 8; ++j) acc[0] = _mm256_add_ps(acc[0], acc[j]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  float s = std::accumulate(lanes, lanes + 8, 0.0f);
  for (; i < n; ++i) s += p[i];
  return s;
}
#endif

/// The streaming sum of p[0, n) with the kernels of `level`.
inline float stream_sum(specsample::isa level, const float* p, std::size_t n) {
#if SPECSAMPLE_X86
  if (specsample::simd::avx512_kernels && level == specsample::isa::avx512) return stream_sum_avx512(p, n);
  if (level == specsample::isa::avx2) return stream_sum_avx2(p, n);
#endif
  (void)level;
  return stream_sum_generic(p, n);
}

// --- streaming read with multiply-adds ---------------------------------------------------------
// The streaming read above (four 64-byte lines per step, prefetched 16 KiB ahead) with, per step,
// the F32 multiply-adds of `Tokens` tokens over its 128 F16 weights (128 × Tokens) spread over the
// FMA peak's register chains, which depend on no loaded data. (Until 2026-11-27 the probe took one
// line per step and advanced 2 × Tokens chains once per line: the FMA's latency, 4 cycles a line,
// then bound it to ~56 GB/s on the Zen 5 whatever its throughput; each chain now advances at most
// ceil(8 × Tokens / 16) times per 256 bytes, ceil(16 × Tokens / 12) with AVX2. Its Zen 3 figures,
// streams of 10–18 GB/s from DRAM, were below that bound.) How much of a Tokens-token call's
// multiply-adds this core hides under the weight stream when nothing else gets in the way — a
// bound for the matmul kernels, which also convert the weights, broadcast the inputs and store
// the outputs. Tokens = 0 is the stream alone. The machine floors of specsample-bench take a call
// as the longer of the stream and the multiply-adds at the peak; this probe measures whether the
// two overlap that well ("How much of the multiply-adds the stream can hide": Zen 5 in
// docs/benchmarks-notes.md, Zen 3 in docs/benchmarks-machines.md).

#if SPECSAMPLE_X86
template <int Tokens>
SPECSAMPLE_TARGET_AVX512 __attribute__((noinline)) inline float stream_fma_avx512(const float* p, std::size_t n) {
  constexpr int fmas = 8 * Tokens;  // per step of 4 lines: 4 × 32 × Tokens multiply-adds, 16 per FMA
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
  const __m512 x = _mm512_set1_ps(0.9999f), y = _mm512_set1_ps(1e-4f);
  __m512i seen = _mm512_setzero_si512();
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (std::size_t j = 0; j < 4; ++j) {
      if (i + probe_ahead + 16 * j < n) _mm_prefetch(reinterpret_cast<const char*>(p + i + probe_ahead + 16 * j), _MM_HINT_T0);
      seen = _mm512_xor_si512(seen, _mm512_loadu_si512(p + i + 16 * j));
    }
#pragma GCC unroll 72
    for (int f = 0; f < fmas; ++f) acc[f % 16] = _mm512_fmadd_ps(acc[f % 16], x, y);
  }
  for (int j = 1; j < 16; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  alignas(64) float out[16];
  _mm512_store_ps(out, _mm512_add_ps(acc[0], _mm512_castsi512_ps(seen)));
  return std::accumulate(out, out + 16, 0.0f);
}

template <int Tokens>
SPECSAMPLE_TARGET_AVX2 __attribute__((noinline)) inline float stream_fma_avx2(const float* p, std::size_t n) {
  constexpr int fmas = 16 * Tokens;  // per step of 4 lines: 4 × 32 × Tokens multiply-adds, 8 per FMA
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(0.001f * static_cast<float>(i));
  const __m256 x = _mm256_set1_ps(0.9999f), y = _mm256_set1_ps(1e-4f);
  __m256 seen = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (std::size_t j = 0; j < 4; ++j) {
      if (i + probe_ahead + 16 * j < n) _mm_prefetch(reinterpret_cast<const char*>(p + i + probe_ahead + 16 * j), _MM_HINT_T0);
      seen = _mm256_xor_ps(seen, _mm256_xor_ps(_mm256_loadu_ps(p + i + 16 * j), _mm256_loadu_ps(p + i + 16 * j + 8)));
    }
#pragma GCC unroll 144
    for (int f = 0; f < fmas; ++f) acc[f % 12] = _mm256_fmadd_ps(acc[f % 12], x, y);
  }
  for (int j = 1; j < 12; ++j) acc[0] = _mm256_add_ps(acc[0], acc[j]);
  alignas(32) float out[8];
  _mm256_store_ps(out, _mm256_add_ps(acc[0], seen));
  return std::accumulate(out, out + 8, 0.0f);
}
#endif

#if SPECSAMPLE_X86
template <int Tokens>
inline std::optional<float> stream_fma_at(specsample::isa level, const float* p, std::size_t n) {
  if (specsample::simd::avx512_kernels && level == specsample::isa::avx512) return stream_fma_avx512<Tokens>(p, n);
  if (level == specsample::isa::avx2) return stream_fma_avx2<Tokens>(p, n);
  return std::nullopt;
}
#endif

/// `stream_fma_*<tokens>` over p[0, n) at `level`, for tokens 0, 1, 5 or 9; nullopt for another
/// count or at the generic level (whose kernels are not vectorised this way).
inline std::optional<float> stream_fma(specsample::isa level, int tokens, const float* p, std::size_t n) {
#if SPECSAMPLE_X86
  switch (tokens) {
    case 0: return stream_fma_at<0>(level, p, n);
    case 1: return stream_fma_at<1>(level, p, n);
    case 5: return stream_fma_at<5>(level, p, n);
    case 9: return stream_fma_at<9>(level, p, n);
    default: return std::nullopt;
  }
#else
  (void)level, (void)tokens, (void)p, (void)n;
  return std::nullopt;
#endif
}

// --- streaming read with BF16 dot products -----------------------------------------------------
// The same stream read as BF16 weight pairs, with per 256-byte step (64 outputs × one column pair,
// a step of the BF16 matmul's panel) what `Tokens` rows of `matmul_avx512_dot` do there: per row
// one activation pair broadcast from memory (a 1 KiB row per token, in L1) and four vdpbf16ps on
// the loaded weights, into 4 × Tokens accumulators. Up to 6 rows, the kernel's tile (more would
// spill). How much of a verification's BF16 multiply-adds this core hides under the weight stream
// when nothing else gets in the way: a bound for the BF16 matmuls, which also round the
// activations, store the outputs and move from panel to panel (docs/benchmarks-notes.md, "How much of
// the multiply-adds the stream can hide (Zen 5)"). CPUs with AVX512_BF16 only.

#if SPECSAMPLE_X86
template <int Tokens>
SPECSAMPLE_TARGET_AVX512_BF16 __attribute__((noinline)) inline float stream_dot_avx512(const float* p, std::size_t n) {
  static_assert(Tokens >= 0 && Tokens <= 6);
  constexpr int rows = Tokens > 0 ? Tokens : 1;
  constexpr std::size_t row_pairs = 256;
  alignas(64) static const auto x = [] {
    std::array<std::uint32_t, rows * row_pairs> v{};
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0x3F803F80u + static_cast<std::uint32_t>(i % 7);  // ~1.0 pairs
    return v;
  }();
  __m512 acc[rows][4];
  for (auto& r : acc) {
    for (__m512& a : r) a = _mm512_setzero_ps();
  }
  __m512i seen = _mm512_setzero_si512();
  std::size_t k = 0;
  for (std::size_t i = 0; i + 64 <= n; i += 64, k = (k + 1) % row_pairs) {
    __m512i w[4];
#pragma GCC unroll 4
    for (std::size_t j = 0; j < 4; ++j) {
      if (i + probe_ahead + 16 * j < n) _mm_prefetch(reinterpret_cast<const char*>(p + i + probe_ahead + 16 * j), _MM_HINT_T0);
      w[j] = _mm512_loadu_si512(p + i + 16 * j);
      specsample::gpt2::simd::keep_in_register(w[j]);  // as the kernels' tile does
    }
    if constexpr (Tokens == 0) {
      for (const __m512i& v : w) seen = _mm512_xor_si512(seen, v);
    } else {
#pragma GCC unroll 6
      for (int t = 0; t < Tokens; ++t) {
        const __m512i xb = _mm512_set1_epi32(static_cast<int>(x[static_cast<std::size_t>(t) * row_pairs + k]));
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) acc[t][j] = _mm512_dpbf16_ps(acc[t][j], (__m512bh)w[j], (__m512bh)xb);
      }
    }
  }
  __m512 s = _mm512_castsi512_ps(seen);
  for (const auto& r : acc) {
    for (const __m512& a : r) s = _mm512_add_ps(s, a);
  }
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  return std::accumulate(out, out + 16, 0.0f);
}
#endif

/// `stream_dot_avx512<tokens>` over p[0, n) (read as BF16 pairs), for tokens 0 to 6;
/// nullopt below the AVX-512 level, on a CPU without AVX512_BF16 or for another count.
inline std::optional<float> stream_dot(specsample::isa level, int tokens, const float* p, std::size_t n) {
#if SPECSAMPLE_X86
  if (specsample::simd::avx512_kernels && level == specsample::isa::avx512 && specsample::simd::has_avx512_bf16()) {
    switch (tokens) {
      case 0: return stream_dot_avx512<0>(p, n);
      case 1: return stream_dot_avx512<1>(p, n);
      case 2: return stream_dot_avx512<2>(p, n);
      case 3: return stream_dot_avx512<3>(p, n);
      case 4: return stream_dot_avx512<4>(p, n);
      case 5: return stream_dot_avx512<5>(p, n);
      case 6: return stream_dot_avx512<6>(p, n);
      default: return std::nullopt;
    }
  }
#endif
  (void)level, (void)tokens, (void)p, (void)n;
  return std::nullopt;
}

// --- FMA peak ---------------------------------------------------------------------------------
// Independent accumulators of fused multiply-adds held in registers, with the vector width of the
// kernels' instruction set: what the matmuls could reach with every operand in a register. As
// many chains as fit the level's registers beside the two constants — 16 of AVX-512's 32, 12 of
// AVX2's 16 (16 + 2 spilled to the stack and read 39 GMAC/s on this project's machine, below what
// the AVX2 matmul itself sustains), 12 SSE vectors of 4 floats for the generic level (multiply
// then add, as the generic kernels do) — more than the FMA latency × pipes that keep the units
// busy.

#if SPECSAMPLE_X86
SPECSAMPLE_TARGET_AVX512 __attribute__((noinline)) inline float fma_loop_avx512(std::size_t iters) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
  const __m512 x = _mm512_set1_ps(0.9999f), y = _mm512_set1_ps(1e-4f);
  for (std::size_t n = 0; n < iters; ++n) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  }
  for (int i = 1; i < 16; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  alignas(64) float out[16];
  _mm512_store_ps(out, acc[0]);
  return std::accumulate(out, out + 16, 0.0f);
}

// The BF16 dot products of `matmul_precision::bf16` (vdpbf16ps: two multiply-adds per 32-bit
// lane), 16 chains as above.
SPECSAMPLE_TARGET_AVX512_BF16 __attribute__((noinline)) inline float dot_loop_avx512_bf16(std::size_t iters) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
  const __m512i x = _mm512_set1_epi32(0x3F7F3F7F), y = _mm512_set1_epi32(0x38D138D1);  // 0.996, 1e-4
  for (std::size_t n = 0; n < iters; ++n) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)x, (__m512bh)y);
  }
  for (int i = 1; i < 16; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  alignas(64) float out[16];
  _mm512_store_ps(out, acc[0]);
  return std::accumulate(out, out + 16, 0.0f);
}

// The INT8 dot products of `matmul_precision::int8` (vpdpbusd: four multiply-adds per 32-bit
// lane), 16 chains as above.
SPECSAMPLE_TARGET_AVX512_VNNI __attribute__((noinline)) inline float dot_loop_avx512_vnni(std::size_t iters) {
  __m512i acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i x = _mm512_set1_epi32(0x01020304), y = _mm512_set1_epi32(0x01FF01FF);
  for (std::size_t n = 0; n < iters; ++n) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], x, y);
  }
  for (int i = 1; i < 16; ++i) acc[0] = _mm512_add_epi32(acc[0], acc[i]);
  alignas(64) std::int32_t out[16];
  _mm512_store_si512(out, acc[0]);
  return static_cast<float>(std::accumulate(out, out + 16, std::int64_t{0}));
}

// The INT8 dot products of the AVX2 kernels (vpmaddwd on 16-bit operands: two multiply-adds per
// 32-bit lane, then an add), 6 chains, in asm: written with intrinsics, GCC 12 folded the multiply
// of two constant operands away and timed the adds alone (the F32 FMA's rate on the Zen 5, 67-71
// GMAC/s against the instruction's 112), and with the accumulators as operands it spilled them to
// the stack every step (56). Each multiply is independent, each add extends its chain by one cycle.
SPECSAMPLE_TARGET_AVX2 __attribute__((noinline)) inline float madd_loop_avx2(std::size_t iters) {
  __m256i a0 = _mm256_set1_epi32(0), a1 = _mm256_set1_epi32(1), a2 = _mm256_set1_epi32(2),
          a3 = _mm256_set1_epi32(3), a4 = _mm256_set1_epi32(4), a5 = _mm256_set1_epi32(5);
  const __m256i x = _mm256_set1_epi32(0x00030004), y = _mm256_set1_epi32(0x0001FFFF);
  for (std::size_t n = 0; n < iters; ++n) {
    asm volatile(
        "vpmaddwd %[y], %[x], %%ymm10\n\tvpaddd %%ymm10, %[a0], %[a0]\n\t"
        "vpmaddwd %[y], %[x], %%ymm11\n\tvpaddd %%ymm11, %[a1], %[a1]\n\t"
        "vpmaddwd %[y], %[x], %%ymm12\n\tvpaddd %%ymm12, %[a2], %[a2]\n\t"
        "vpmaddwd %[y], %[x], %%ymm13\n\tvpaddd %%ymm13, %[a3], %[a3]\n\t"
        "vpmaddwd %[y], %[x], %%ymm14\n\tvpaddd %%ymm14, %[a4], %[a4]\n\t"
        "vpmaddwd %[y], %[x], %%ymm15\n\tvpaddd %%ymm15, %[a5], %[a5]"
        : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5)
        : [x] "x"(x), [y] "x"(y)
        : "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
  }
  const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                                       _mm256_add_epi32(a4, a5));
  alignas(32) std::int32_t out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), sum);
  return static_cast<float>(std::accumulate(out, out + 8, std::int64_t{0}));
}

// The tile dot products of the AMX matmuls (`gpt2::options::amx`): TDPBF16PS or TDPBUSD into four
// accumulator tiles in turn, operand tiles of one row (the cheapest: an instruction takes 16 rows
// at about the time of one, 5.0 against 6.4 ns for BF16 on a Xeon of family 6, model 207), each instruction
// counted as 16 rows' multiply-adds, so the peak says what a call of up to 16 rows can reach.
template <bool Int8>
SPECSAMPLE_TARGET_AMX __attribute__((noinline)) inline float tile_loop(std::size_t iters) {
  const specsample::gpt2::simd::amx_config cfg(1);
  asm volatile("" ::: "memory");  // (the tile asm names no memory: see simd::matmul_amx)
  _tile_loadconfig(&cfg);
  alignas(64) static const std::uint16_t operands[16 * 32] = {};  // zeros: no value can overflow
  alignas(64) float out[16];
  _tile_loadd(4, operands, 64);
  _tile_loadd(5, operands, 64);
  _tile_loadd(6, operands, 64);
  _tile_loadd(7, operands, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (std::size_t n = 0; n < iters; ++n) {
    if constexpr (Int8) {
      _tile_dpbusd(0, 4, 5);
      _tile_dpbusd(1, 4, 6);
      _tile_dpbusd(2, 4, 7);
      _tile_dpbusd(3, 4, 5);
    } else {
      _tile_dpbf16ps(0, 4, 5);
      _tile_dpbf16ps(1, 4, 6);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, out, 64);
  asm volatile("" ::: "memory");
  _tile_release();
  return out[0];
}

SPECSAMPLE_TARGET_AVX2 __attribute__((noinline)) inline float fma_loop_avx2(std::size_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(0.001f * static_cast<float>(i));
  const __m256 x = _mm256_set1_ps(0.9999f), y = _mm256_set1_ps(1e-4f);
  for (std::size_t n = 0; n < iters; ++n) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  }
  for (int i = 1; i < 12; ++i) acc[0] = _mm256_add_ps(acc[0], acc[i]);
  alignas(32) float out[8];
  _mm256_store_ps(out, acc[0]);
  return std::accumulate(out, out + 8, 0.0f);
}
#endif

__attribute__((noinline)) inline float fma_loop_generic(std::size_t iters) {
  float acc[12][4];
  for (int i = 0; i < 12; ++i) std::fill_n(acc[i], 4, 0.001f * static_cast<float>(i));
  for (std::size_t n = 0; n < iters; ++n) {
    for (auto& a : acc) {
      for (float& v : a) v = v * 0.9999f + 1e-4f;
    }
  }
  float s = 0.0f;
  for (const auto& a : acc) s += std::accumulate(a, a + 4, 0.0f);
  return s;
}

/// A loop of `macs_per_iteration` multiply-adds per iteration (`run(iters)` returns a sum to sink).
struct fma_loop {
  float (*run)(std::size_t);
  std::size_t macs_per_iteration;
  const char* instruction;  ///< what multiplies: "F32 FMA" or "BF16 dot product (vdpbf16ps)"
  /// Rows (tokens) an instruction multiplies at once, all counted in `macs_per_iteration`: 1 for
  /// vectors (j tokens take j times the multiply-adds), 16 for AMX tiles (up to 16 tokens take
  /// one instruction's time: a call of j tokens costs ceil(j / 16) × 16 rows' multiply-adds).
  std::size_t rows = 1;
};

/// The multiply-add loop of the matmuls of `level` and `precision`: with `tiles` (`model::amx`) the
/// tile dot products; else vdpbf16ps for BF16 matmuls
/// at the AVX-512 level of a CPU with AVX512_BF16; for INT8 matmuls vpdpbusd at the AVX-512 level
/// of a CPU with AVX512_VNNI, vpmaddwd at AVX2 (or AVX-512 without it); else F32 FMAs (what the
/// kernels then use). The generic level's INT8 matmuls are plain integer C++, which the F32 loop
/// stands in for.
inline fma_loop fma_loop_for(specsample::isa level, specsample::gpt2::matmul_precision precision, bool tiles = false) {
#if SPECSAMPLE_X86
  // A constant expression where `avx512_kernels` is false (it comes first): the branches fold.
  const bool avx512 = specsample::simd::avx512_kernels && level == specsample::isa::avx512;
  if (avx512 && tiles && specsample::simd::has_amx()) {
    if (precision == specsample::gpt2::matmul_precision::bf16) {
      return {tile_loop<false>, 4 * 16 * 16 * 32, "BF16 tile dot product (TDPBF16PS, AMX)", 16};
    }
    if (precision == specsample::gpt2::matmul_precision::int8) {
      return {tile_loop<true>, 4 * 16 * 16 * 64, "INT8 tile dot product (TDPBUSD, AMX)", 16};
    }
  }
  if (avx512 && precision == specsample::gpt2::matmul_precision::bf16 &&
      specsample::simd::has_avx512_bf16()) {
    return {dot_loop_avx512_bf16, 16 * 32, "BF16 dot product (vdpbf16ps)"};
  }
  if (precision == specsample::gpt2::matmul_precision::int8 && level != specsample::isa::generic) {
    if (avx512 && specsample::simd::has_avx512_vnni()) {
      return {dot_loop_avx512_vnni, 16 * 64, "INT8 dot product (vpdpbusd)"};
    }
    return {madd_loop_avx2, 6 * 16, "INT16 multiply-add (vpmaddwd)"};
  }
  if (avx512) return {fma_loop_avx512, 16 * 16, "F32 FMA"};
  if (level == specsample::isa::avx2) return {fma_loop_avx2, 12 * 8, "F32 FMA"};
#endif
  (void)level;
  (void)precision;
  return {fma_loop_generic, 12 * 4, "F32 multiply then add"};
}

}  // namespace specsample_bench
