#pragma once
/// @file simd.hpp
/// Run-time dispatched matmul micro-kernels for the GPT-2 reference model: a portable generic
/// path, an AVX2 + FMA + F16C path and an AVX-512 (F, BW, VL) path, for F32, F16 and BF16
/// weights, BF16 pairs (+ AVX512_BF16) and INT8 quads (+ AVX512_VNNI). The library is compiled for generic x86-64 (no -march): the fast paths are functions
/// with `__attribute__((target(...)))` selected once from `__builtin_cpu_supports`.
///
/// Weight layout: matmul weights are packed in panels of `panel` (64) output channels,
/// [OC/64][K][64]: for every input channel k the 64 weights of a panel's outputs are contiguous,
/// so a kernel streams one panel front to back and each weight vector feeds the outputs of every
/// row of the batch (the weights are read from memory once per call, whatever T). OC is padded
/// with zero rows to a multiple of 64.
///
/// Numerics (what batch invariance rests on): an output element out[t, o] = Σ_k x[t, k]·w[o, k]
/// lives in one vector lane and is accumulated sequentially in k (k = 0, 1, …, K−1; fused
/// multiply-add on the SIMD paths, multiply then add on the generic one), then the bias is
/// added. There is no horizontal reduction: which rows t or outputs o share a register tile, how
/// many rows the batch has and how panels are split over threads never changes that sequence,
/// so a position's result does not depend on T, on its place in the batch or on the thread
/// count. Different ISAs give (slightly) different bits; a model uses one ISA.
///
/// BF16 dot products (`matmul_precision::bf16`): the weights are held as `bf16_pairs` — BF16, with
/// weights 2k and 2k + 1 of an output adjacent, [OC/64][ceil(K/2)][64][2] — and every matmul first
/// rounds its input rows to BF16 (`bf16_operands`). Each output lane then takes, per column pair,
/// acc += w[2k+1]·x[2k+1], then acc += w[2k]·x[2k], each rounded once: exactly what vdpbf16ps
/// (AVX512_BF16) computes, two multiply-adds per lane and instruction. Without AVX512_BF16 the
/// AVX-512, AVX2 and generic paths compute the same sums with F32 FMAs (or multiply then add: a
/// product of two BF16 values is exact in F32), so the results are the same bits on every level
/// (unless a product or a partial sum falls below 2^-126, which vdpbf16ps flushes to zero; no
/// operand is subnormal, see `bf16_operand`).
///
/// INT8 dot products (`matmul_precision::int8`): the weights are held as `i8_quads` — each output
/// channel quantised to integers in [−127, 127] times one F32 scale (max |w| / 127), weights 4k to
/// 4k + 3 of an output adjacent, [OC/64][ceil(K/4)][64][4], then the panels' scales and integer row
/// sums — and every matmul first quantises each input row the same way (`i8_operands`: one scale
/// per row, the integers stored offset by 128 as unsigned bytes). An output is the exact integer
/// dot product times the weight's scale times the row's scale (`matmul_generic_i8`): integer sums
/// have no rounding, and the epilogue is the same few operations everywhere (`i8_output`), so every
/// level (vpdpbusd with AVX512_VNNI, vpmaddwd on AVX2, scalar C++) gives the same bits, for any
/// tiling, batch or thread split.

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

#include <specsample/detail/simd.hpp>
#include <specsample/io/half.hpp>

// Where the kernels are compiled. Two entry points lead into the SIMD kernel templates,
// `matmul_panels` and `attend`. By default (header-only) they are inline, and every TU that
// calls them compiles every kernel behind them: most of the compile time of a TU that runs the
// GPT-2 model (docs/getting-started.md, "Compile time"). A program may compile them once
// instead: SPECSAMPLE_SEPARATE_KERNELS, defined in every TU of the program, leaves them
// declared only here, and one TU that defines SPECSAMPLE_DEFINE_MATMUL_KERNELS and one that
// defines SPECSAMPLE_DEFINE_ATTENTION_KERNELS (they may be the same TU; either implies
// SPECSAMPLE_SEPARATE_KERNELS) compile them — src/matmul_kernels.cpp and
// src/attention_kernels.cpp, the CMake target specsample::kernels. The same switch, with
// SPECSAMPLE_DEFINE_GPT2_MODEL (src/gpt2_model.cpp), places the model's loading, construction and
// forward pass (SPECSAMPLE_GPT2_MODEL, models/gpt2/model.hpp). The kernels and their results are
// the same either way.
#if (defined(SPECSAMPLE_DEFINE_MATMUL_KERNELS) || defined(SPECSAMPLE_DEFINE_ATTENTION_KERNELS) || \
     defined(SPECSAMPLE_DEFINE_GPT2_MODEL)) &&                                                     \
    !defined(SPECSAMPLE_SEPARATE_KERNELS)
#define SPECSAMPLE_SEPARATE_KERNELS 1
#endif
#if !defined(SPECSAMPLE_SEPARATE_KERNELS)
#define SPECSAMPLE_MATMUL_KERNELS inline
#define SPECSAMPLE_ATTENTION_KERNELS inline
#define SPECSAMPLE_GPT2_MODEL inline
#else
#if defined(SPECSAMPLE_DEFINE_MATMUL_KERNELS)
#define SPECSAMPLE_MATMUL_KERNELS
#endif
#if defined(SPECSAMPLE_DEFINE_ATTENTION_KERNELS)
#define SPECSAMPLE_ATTENTION_KERNELS
#endif
#if defined(SPECSAMPLE_DEFINE_GPT2_MODEL)
#define SPECSAMPLE_GPT2_MODEL
#endif
#endif

namespace specsample::gpt2 {

/// The kernels' instruction-set level (shared with the sampling code): see
/// <specsample/detail/simd.hpp>.
using specsample::isa;
using specsample::isa_name;

/// Storage precision of a weight matrix. `bf16_pairs` is BF16 in the layout of the BF16 dot
/// products (`matmul_precision::bf16`; see "BF16 dot products" above), `i8_quads` INT8 with a
/// scale per output in the layout of the INT8 ones (`matmul_precision::int8`): only
/// `weight_matrix::converted` makes them, for the models that multiply that way.
enum class weight_format : std::uint8_t { f32, f16, bf16, bf16_pairs, i8_quads };

/// The element type a matrix of format F is stored in (F16 and BF16 as their 16-bit patterns).
template <weight_format F>
using weight_t = std::conditional_t<F == weight_format::f32, float,
                                    std::conditional_t<F == weight_format::i8_quads, std::int8_t, std::uint16_t>>;

/// "F32", "F16" or "BF16" (the safetensors spelling); "BF16 pairs" for `bf16_pairs`, "INT8
/// quads" for `i8_quads`.
[[nodiscard]] constexpr const char* format_name(weight_format f) noexcept {
  switch (f) {
    case weight_format::f32: return "F32";
    case weight_format::f16: return "F16";
    case weight_format::bf16: return "BF16";
    case weight_format::bf16_pairs: return "BF16 pairs";
    case weight_format::i8_quads: return "INT8 quads";
  }
  return "?";
}

/// The format named "f32", "f16" or "bf16" (in either case); nullopt for anything else
/// (`bf16_pairs` and `i8_quads` are not storages one asks for: see `matmul_precision`).
[[nodiscard]] constexpr std::optional<weight_format> format_from_name(std::string_view name) noexcept {
  for (const weight_format f : {weight_format::f32, weight_format::f16, weight_format::bf16}) {
    if (specsample::equal_ignoring_case(name, format_name(f))) return f;
  }
  return std::nullopt;
}

/// Bytes per element of a weight format.
[[nodiscard]] constexpr std::size_t format_bytes(weight_format f) noexcept {
  return f == weight_format::f32 ? 4 : f == weight_format::i8_quads ? 1 : 2;
}

/// A read-only view of a (rows, cols) weight matrix in its storage precision, packed in panels
/// of 64 rows ([ceil(rows/64)][cols][64], zero-padded rows; `bf16_pairs`:
/// [ceil(rows/64)][ceil(cols/2)][64][2]; `i8_quads`: [ceil(rows/64)][ceil(cols/4)][64][4], then
/// the scales and row sums; see simd.hpp).
struct weight_view {
  const void* data = nullptr;
  weight_format format = weight_format::f32;
  std::size_t rows = 0;
  std::size_t cols = 0;
  /// The weights come from memory on every call (a model's above `streamed_weight_bytes`): the
  /// AVX-512 matmuls of more rows than one tile holds (7, or 5 for emulated BF16 pairs) up to 12
  /// then share each block of a panel among their tiles (`simd::avx512_panels`). The same bits
  /// either way.
  bool streamed = false;
  /// Matmuls over these weights may run on AMX tiles where the CPU has them (`simd::has_amx`):
  /// BF16 pairs and INT8 quads whose width is a whole number of tile steps (`simd::amx_fits`), at the
  /// AVX-512 level. INT8 gives the same bits either way, BF16 its own (simd.hpp, "AMX"). A model
  /// sets it for all its matrices or none (`options::amx`).
  bool tiles = false;
};

/// Matmul weights above which a model marks its weights `weight_view::streamed`: 64 MiB, twice the
/// L3 a core of this project's machines reads from (32 MiB per Zen CCD) — GPT-2 small and larger
/// in every precision, never the bundled models (24 MB at most). A heuristic: where a CPU's
/// last-level cache holds such a model, its 7–12-row calls take the blocks where whole panels
/// could be faster (5–9% for the bundled 24 MB target in the L3, F32 or F16 weights, Zen 5).
inline constexpr std::size_t streamed_weight_bytes = std::size_t{64} << 20;

namespace simd {

using specsample::simd::detected;
using specsample::simd::avx512_kernels;
using specsample::simd::has_avx512_bf16;
using specsample::simd::has_avx512_vnni;
using specsample::simd::has_amx;
using specsample::simd::resolve;

inline constexpr float gelu_k = 0.7978845608028654f;  // sqrt(2 / pi), for the GELU
inline constexpr float gelu_c = 0.044715f;

// --- conversion ----------------------------------------------------------------------------------

/// Element i of a weight buffer as float (`i8_quads`: the integer, without its scale).
template <weight_format F>
[[nodiscard]] inline float load_scalar(const void* w, std::size_t i) noexcept {
  if constexpr (F == weight_format::f32) {
    return static_cast<const float*>(w)[i];
  } else if constexpr (F == weight_format::i8_quads) {
    return static_cast<float>(static_cast<const std::int8_t*>(w)[i]);
  } else if constexpr (F == weight_format::f16) {
    return io::f16_to_float(static_cast<const std::uint16_t*>(w)[i]);
  } else {  // BF16, either layout
    return io::bf16_to_float(static_cast<const std::uint16_t*>(w)[i]);
  }
}

#if SPECSAMPLE_X86
// F16C converts exactly like io::f16_to_float and, with an explicit round-to-nearest-even
// immediate (MXCSR's mode ignored), like io::float_to_f16 (NaN payloads aside), about 10x faster
// (F32 to F16: 0.5 against 5.4 ns per weight).
SPECSAMPLE_TARGET_AVX2 inline void f16_to_float_f16c(const std::uint16_t* src, std::size_t n, float* dst) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = io::f16_to_float(src[i]);
}
SPECSAMPLE_TARGET_AVX2 inline void float_to_f16_f16c(const float* src, std::size_t n, std::uint16_t* dst) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) dst[i] = io::float_to_f16(src[i]);
}
#endif

/// dst[i] = float(src[first + i]) for i < n (exact for every format; `i8_quads`: the integers,
/// without their scales — `packed_value` applies them).
inline void convert(weight_format f, const void* src, std::size_t first, std::size_t n,
                    float* dst) noexcept {
  switch (f) {
    case weight_format::f32:
      std::memcpy(dst, static_cast<const float*>(src) + first, n * sizeof(float));
      return;
    case weight_format::f16:
#if SPECSAMPLE_X86
      // (Runs shorter than a vector, such as the embedding's and `at`'s single elements, stay
      // scalar: no dispatch and no call on the embedding's per-token path.)
      if (n >= 8 && detected() >= isa::avx2) {
        f16_to_float_f16c(static_cast<const std::uint16_t*>(src) + first, n, dst);
        return;
      }
#endif
      for (std::size_t i = 0; i < n; ++i) dst[i] = load_scalar<weight_format::f16>(src, first + i);
      return;
    case weight_format::bf16:
    case weight_format::bf16_pairs:
      for (std::size_t i = 0; i < n; ++i) dst[i] = load_scalar<weight_format::bf16>(src, first + i);
      return;
    case weight_format::i8_quads:
      for (std::size_t i = 0; i < n; ++i) dst[i] = load_scalar<weight_format::i8_quads>(src, first + i);
      return;
  }
}


/// dst[i] = src[i] rounded to nearest even in `f` (F16 or BF16; overflow gives ±inf) for i < n.
inline void narrow(weight_format f, const float* src, std::size_t n, std::uint16_t* dst) noexcept {
  assert(f != weight_format::f32);
#if SPECSAMPLE_X86
  if (f == weight_format::f16 && detected() >= isa::avx2) {
    float_to_f16_f16c(src, n, dst);
    return;
  }
#endif
  for (std::size_t i = 0; i < n; ++i) {
    dst[i] = f == weight_format::f16 ? io::float_to_f16(src[i]) : io::float_to_bf16(src[i]);
  }
}

// --- packed panels ---------------------------------------------------------------------------------

/// Output channels per packed panel.
inline constexpr std::size_t panel = 64;

/// Panels for OC output channels.
[[nodiscard]] constexpr std::size_t panels(std::size_t OC) noexcept {
  return (OC + panel - 1) / panel;
}

/// Index of weight (o, k) in the packed layout of a K-column matrix.
[[nodiscard]] constexpr std::size_t packed_index(std::size_t o, std::size_t k,
                                                 std::size_t K) noexcept {
  return (o / panel) * K * panel + k * panel + o % panel;
}

/// Columns per k-step of the kernels over format `f`: 2 for `bf16_pairs` (a pair), 4 for
/// `i8_quads` (a quad), else 1.
[[nodiscard]] constexpr std::size_t group_cols(weight_format f) noexcept {
  return f == weight_format::bf16_pairs ? 2 : f == weight_format::i8_quads ? 4 : 1;
}

/// Columns a packed panel of a K-column matrix of format `f` holds: K rounded up to a whole
/// step (`group_cols`; the missing columns of the last pair or quad are zeros).
[[nodiscard]] constexpr std::size_t packed_cols(weight_format f, std::size_t K) noexcept {
  return (K + group_cols(f) - 1) / group_cols(f) * group_cols(f);
}

/// Columns per k-step of the kernels over format F (`group_cols`).
template <weight_format F>
inline constexpr std::size_t step_cols = group_cols(F);

/// Index of weight (o, k) in the packed layout of format `f` (`bf16_pairs`: weights k and k + 1
/// of output o adjacent, k even, the 64 pairs of a panel's outputs contiguous; `i8_quads` the
/// same with quads).
[[nodiscard]] constexpr std::size_t packed_index(weight_format f, std::size_t o, std::size_t k,
                                                 std::size_t K) noexcept {
  const std::size_t g = group_cols(f);
  return (o / panel) * packed_cols(f, K) * panel + k / g * g * panel + o % panel * g + k % g;
}

/// Steps per tile dot product (16 pairs or quads: 32 BF16 or 64 INT8 columns), and whether the
/// matmuls of format `f` and K columns run on tiles: BF16 pairs or INT8 quads, K padded to a pair
/// or quad (`packed_cols`) a whole number of tile steps (every GPT-2 width is; others take the
/// AVX-512 kernels for all their calls; `matmul_amx`).
inline constexpr std::size_t amx_steps = 16;
[[nodiscard]] constexpr bool amx_fits(weight_format f, std::size_t K) noexcept {
  return (f == weight_format::bf16_pairs || f == weight_format::i8_quads) && K > 0 &&
         packed_cols(f, K) % (amx_steps * group_cols(f)) == 0;
}

/// Bytes of a packed (rows, cols) matrix of format `f`: its panels, and for `i8_quads` after them
/// an F32 scale and an INT32 row sum per output (padding rows included; `i8_meta`).
[[nodiscard]] constexpr std::size_t packed_matrix_bytes(weight_format f, std::size_t rows, std::size_t cols) noexcept {
  const std::size_t weights = panels(rows) * packed_cols(f, cols) * panel * format_bytes(f);
  return f == weight_format::i8_quads ? weights + panels(rows) * panel * (sizeof(float) + sizeof(std::int32_t))
                                      : weights;
}

/// The per-output data of a packed `i8_quads` matrix, after its panels: output o's weights are
/// scale[o] times integers summing to sum[o].
struct i8_meta {
  const float* scale;
  const std::int32_t* sum;
};

/// Where the `i8_meta` of the packed (rows, cols) `i8_quads` matrix at `w` sits.
[[nodiscard]] inline i8_meta i8_meta_of(const void* w, std::size_t rows, std::size_t cols) noexcept {
  const auto* base = static_cast<const unsigned char*>(w) +
                     panels(rows) * packed_cols(weight_format::i8_quads, cols) * panel;
  const auto* scale = reinterpret_cast<const float*>(base);
  return {scale, reinterpret_cast<const std::int32_t*>(scale + panels(rows) * panel)};
}

/// Weight (o, k) of the packed matrix `w` as float: exact, and for `i8_quads` its integer times
/// the output's scale (rounded once: the value the embedding reads).
[[nodiscard]] inline float packed_value(const weight_view& w, std::size_t o, std::size_t k) noexcept {
  float v = 0.0f;
  convert(w.format, w.data, packed_index(w.format, o, k, w.cols), 1, &v);
  if (w.format == weight_format::i8_quads) v *= i8_meta_of(w.data, w.rows, w.cols).scale[o];
  return v;
}

/// x rounded to nearest even in BF16 as an operand of the BF16 dot products (weights and
/// activations alike): `io::float_to_bf16`, except that a subnormal float gives ±0. So no operand
/// is ever subnormal (a normal float never rounds to a subnormal BF16), and vdpbf16ps's treating
/// subnormal inputs as zero changes nothing: every level computes the same products.
[[nodiscard]] inline std::uint16_t bf16_operand(float x) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7F800000u) == 0) return static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  return io::float_to_bf16(x);
}

/// Packs a row-major (rows, cols) matrix `src` of `elem`-byte elements (the weight of output o
/// is row o) into the panel layout at `dst` (panels(rows)·cols·64 elements, padding zeroed).
inline void pack_rows(const void* src, void* dst, std::size_t rows, std::size_t cols,
                      std::size_t elem) noexcept {
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  std::memset(d, 0, panels(rows) * cols * panel * elem);
  for (std::size_t o = 0; o < rows; ++o) {
    for (std::size_t k = 0; k < cols; ++k) {
      std::memcpy(d + packed_index(o, k, cols) * elem, s + (o * cols + k) * elem, elem);
    }
  }
}

/// Packs a (cols, rows) row-major matrix — HF Conv1D's [in, out], the weight of output o is
/// column o — into the panel layout (runs of 64 outputs are contiguous in both layouts).
inline void pack_columns(const void* src, void* dst, std::size_t rows, std::size_t cols,
                         std::size_t elem) noexcept {
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  std::memset(d, 0, panels(rows) * cols * panel * elem);
  for (std::size_t p = 0; p < panels(rows); ++p) {
    const std::size_t n = std::min(panel, rows - p * panel);
    for (std::size_t k = 0; k < cols; ++k) {
      std::memcpy(d + packed_index(p * panel, k, cols) * elem, s + (k * rows + p * panel) * elem,
                  n * elem);
    }
  }
}

/// out[t·ldo + o] = Σ_k x[t·ldx + k]·w(o, k) (+ bias[o]) for t < T, o < OC; w packed.
struct matmul_args {
  float* out;
  std::size_t ldo;
  const float* x;
  std::size_t ldx;
  std::size_t T;
  std::size_t K;      ///< reduction length (input channels)
  std::size_t OC;     ///< output channels (the packed matrix has panels(OC) panels)
  const void* w;      ///< packed [panels][K][64] (bf16_pairs: [panels][ceil(K/2)][64][2]), in the kernel's format
  const float* bias;  ///< (OC) or nullptr
  /// `bf16_pairs` only: the rows of x as BF16 operands (`bf16_operand`), (T, ldxh) with ldxh =
  /// packed_cols(bf16_pairs, K) (a zero after an odd K's last column). The kernels read these, not x.
  const std::uint16_t* xh = nullptr;
  std::size_t ldxh = 0;
  /// `i8_quads` only: the rows of x as INT8 operands (`i8_operands`: each integer + 128 as a byte),
  /// (T, ldxq) with ldxq = packed_cols(i8_quads, K), and each row's scale (T). The kernels read these.
  const std::uint8_t* xq = nullptr;
  std::size_t ldxq = 0;
  const float* xs = nullptr;
  /// `weight_view::streamed` (`avx512_panels`).
  bool streamed = false;
  /// The AVX-512 level runs BF16-pair and INT8 matmuls that fit (`amx_fits`) on AMX tiles
  /// (`matmul_amx`); only where `has_amx()` (`kernels::matmul` sets it from `weight_view::tiles`).
  bool tiles = false;
};

// --- generic -------------------------------------------------------------------------------------

/// Panels [p_begin, p_end): per k the panel's 64 weights are converted once and applied to a
/// tile of up to 8 rows; every output is acc = acc + w·x in increasing k. `bf16_pairs`: per column
/// pair, acc = acc + w[2k+1]·x[2k+1], then acc + w[2k]·x[2k] (operands from `xh`) — vdpbf16ps's
/// sums, since a product of two BF16 values is exact in F32 and each multiply-then-add then rounds
/// once, like a fused multiply-add.
template <weight_format F>
inline void matmul_generic(const matmul_args& a, std::size_t p_begin, std::size_t p_end) noexcept {
  constexpr std::size_t TT = 8;
  constexpr std::size_t per = step_cols<F>;
  const std::size_t steps = packed_cols(F, a.K) / per;
  float w0[panel], w1[panel];  // a step's weights: column k (pairs: the even column; w1 the odd one)
  float acc[TT][panel];
  for (std::size_t p = p_begin; p < p_end; ++p) {
    const std::size_t o0 = p * panel;
    const std::size_t valid = std::min(panel, a.OC - o0);
    for (std::size_t t0 = 0; t0 < a.T; t0 += TT) {
      const std::size_t tn = std::min(TT, a.T - t0);
      for (std::size_t t = 0; t < tn; ++t) std::fill_n(acc[t], panel, 0.0f);
      for (std::size_t k = 0; k < steps; ++k) {
        const std::size_t base = (p * steps + k) * per * panel;
        for (std::size_t j = 0; j < panel; ++j) w0[j] = load_scalar<F>(a.w, base + per * j);
        if constexpr (per == 2) {
          for (std::size_t j = 0; j < panel; ++j) w1[j] = load_scalar<F>(a.w, base + 2 * j + 1);
        }
        for (std::size_t t = 0; t < tn; ++t) {
          if constexpr (per == 2) {
            const std::uint16_t* xk = a.xh + (t0 + t) * a.ldxh + 2 * k;
            const float xe = io::bf16_to_float(xk[0]), xo = io::bf16_to_float(xk[1]);
            for (std::size_t j = 0; j < panel; ++j) {
              acc[t][j] = acc[t][j] + w1[j] * xo;
              acc[t][j] = acc[t][j] + w0[j] * xe;
            }
          } else {
            const float xv = a.x[(t0 + t) * a.ldx + k];
            for (std::size_t j = 0; j < panel; ++j) acc[t][j] += w0[j] * xv;
          }
        }
      }
      for (std::size_t t = 0; t < tn; ++t) {
        float* out = a.out + (t0 + t) * a.ldo + o0;
        for (std::size_t j = 0; j < valid; ++j) {
          out[j] = a.bias != nullptr ? acc[t][j] + a.bias[o0 + j] : acc[t][j];
        }
      }
    }
  }
}

/// x = exp(x − max x) / Σ exp(x − max x) over one row of n, with the vector exp of `level`
/// (specsample::simd::exp_shifted: the same numerator the logit warper uses, summed in a fixed
/// order per level), so a row's result depends only on the row and the level.
inline void softmax_row(isa level, float* x, std::size_t n) noexcept {
  if (n == 0) return;
  const float mx = specsample::simd::max_value(level, x, n);
  const auto inv = static_cast<float>(1.0 / specsample::simd::exp_shifted(level, x, x, n, mx, 1.0f));
  specsample::simd::scale(level, x, n, inv);
}

// --- INT8 dot products (`i8_quads`, `matmul_precision::int8`) -------------------------------------

/// Rows and matrices whose largest magnitude is below this quantise to zeros (scale 0): it keeps
/// 127 / max finite. Such a row's products are below 2^-96 of the weights' magnitude.
inline constexpr float i8_smallest_max = 0x1p-96f;

/// Largest input width of an INT8 matmul: its integer sums (at most 255 · 127 per product,
/// `i8_operands` offsetting the row's integers by 128) stay below 2^31.
inline constexpr std::size_t i8_max_cols = 65536;

/// x rounded to the nearest integer, ties to even, whatever the rounding mode (x finite).
[[nodiscard]] inline float round_half_even(float x) noexcept {
  const float f = std::floor(x);
  const float d = x - f;  // exact
  if (d != 0.5f) return d > 0.5f ? f + 1.0f : f;
  return std::fmod(f, 2.0f) == 0.0f ? f : f + 1.0f;
}

/// The INT8 quantisation of n floats: scale = max |x| / 127 and the reciprocal 127 / max |x|
/// every value is multiplied by (0 and 0 for a zero row, or one whose largest magnitude is below
/// `i8_smallest_max`; NaN and NaN when a value is NaN or infinite: the products are then NaN).
struct i8_scaling {
  float scale;
  float inverse;
};

/// The scaling of `i8_scaling` for a row whose largest magnitude is m (NaN: not finite).
[[nodiscard]] inline i8_scaling i8_scaling_of(float m) noexcept {
  if (!(m <= std::numeric_limits<float>::max())) {
    return {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::quiet_NaN()};
  }
  if (m < i8_smallest_max) return {0.0f, 0.0f};
  return {m / 127.0f, 127.0f / m};
}

/// x · inverse clamped to [−127, 127] and rounded half to even (0 for a NaN inverse).
[[nodiscard]] inline int i8_value(float x, float inverse) noexcept {
  const float v = x * inverse;
  if (!(v == v)) return 0;
  return static_cast<int>(round_half_even(std::clamp(v, -127.0f, 127.0f)));
}

/// The scaling of x[0, n) (generic: `i8_operands` and the weights' quantisation).
[[nodiscard]] inline i8_scaling i8_scaling_of(const float* x, std::size_t n) noexcept {
  float m = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (!(a <= std::numeric_limits<float>::max())) return i8_scaling_of(a);
    m = std::max(m, a);
  }
  return i8_scaling_of(m);
}

/// One operand row, generic: dst[k] = i8_value(x[k]) + 128 for k < K, 128 (zero) up to ld.
inline float i8_operand_row_generic(const float* x, std::size_t K, std::uint8_t* dst, std::size_t ld) noexcept {
  const i8_scaling s = i8_scaling_of(x, K);
  for (std::size_t k = 0; k < K; ++k) dst[k] = static_cast<std::uint8_t>(i8_value(x[k], s.inverse) + 128);
  std::fill(dst + K, dst + ld, std::uint8_t{128});
  return s.scale;
}

/// Output o of row t of an INT8 matmul from its integer sum d (the offset removed): d converted to
/// float times scale[o] · xs[t], plus the bias in one fused multiply-add (so that no compiler's
/// contraction of a multiply and an add can make one level differ from another).
inline float i8_output(std::int32_t d, float scale, float row_scale, const float* bias,
                      std::size_t o) noexcept {
  const float s = scale * row_scale;
  return bias != nullptr ? std::fma(static_cast<float>(d), s, bias[o]) : static_cast<float>(d) * s;
}

/// Panels [p_begin, p_end), generic: per output the integer sum Σ_k xq[t][k]·w[o][k] (exact),
/// less 128 · sum[o] (the operands' offset), then `i8_output`: the result of every level.
inline void matmul_generic_i8(const matmul_args& a, std::size_t p_begin, std::size_t p_end) noexcept {
  const std::size_t Kq = packed_cols(weight_format::i8_quads, a.K);
  const i8_meta meta = i8_meta_of(a.w, a.OC, a.K);
  std::int32_t acc[panel];
  for (std::size_t p = p_begin; p < p_end; ++p) {
    const std::size_t o0 = p * panel;
    const std::size_t valid = std::min(panel, a.OC - o0);
    const std::int8_t* wp = static_cast<const std::int8_t*>(a.w) + p * Kq * panel;
    for (std::size_t t = 0; t < a.T; ++t) {
      const std::uint8_t* x = a.xq + t * a.ldxq;
      std::fill_n(acc, panel, 0);
      for (std::size_t k = 0; k < Kq; k += 4) {
        const std::int8_t* wk = wp + k * panel;
        for (std::size_t j = 0; j < panel; ++j) {
          acc[j] += x[k] * wk[4 * j] + x[k + 1] * wk[4 * j + 1] + x[k + 2] * wk[4 * j + 2] + x[k + 3] * wk[4 * j + 3];
        }
      }
      float* out = a.out + t * a.ldo + o0;
      for (std::size_t j = 0; j < valid; ++j) {
        out[j] = i8_output(acc[j] - 128 * meta.sum[o0 + j], meta.scale[o0 + j], a.xs[t], a.bias, o0 + j);
      }
    }
  }
}

// --- attention layout ----------------------------------------------------------------------------
// A head's keys are stored transposed in blocks of `key_block` positions: block b holds keys
// 16·b .. 16·b + 15 as (HS, 16), element [d][j] = channel d of key 16·b + j. A score is then a
// column of the block: Σ_d q[d]·k[d], summed in d order, 16 keys per vector with no horizontal
// reduction, and the rows of a block are one contiguous 64·HS-byte stream. Values stay rows
// (P, HS): out = Σ_p att[p]·v_p runs over them in p order.

/// Positions per block of the transposed key cache.
inline constexpr std::size_t key_block = 16;

/// Key blocks holding `positions` positions.
[[nodiscard]] constexpr std::size_t key_blocks(std::size_t positions) noexcept {
  return (positions + key_block - 1) / key_block;
}

/// Elements (of the cache's format) of one head's keys that attention over `positions` positions
/// reads (whole blocks).
[[nodiscard]] constexpr std::size_t key_elements(std::size_t positions, std::size_t HS) noexcept {
  return key_blocks(positions) * key_block * HS;
}

/// Key blocks a cache allocates per head for `positions` positions: a multiple of 4, since the
/// SIMD paths address 4 blocks (64 keys) at a time (loading only those below the length).
[[nodiscard]] constexpr std::size_t key_cache_blocks(std::size_t positions) noexcept {
  return (key_blocks(positions) + 3) / 4 * 4;
}

/// Offset of channel d of key p in one head's key blocks (head size HS).
[[nodiscard]] constexpr std::size_t key_offset(std::size_t p, std::size_t d, std::size_t HS) noexcept {
  return ((p / key_block) * HS + d) * key_block + p % key_block;
}

/// One attention head for one query: att[p] = (q · k_p)·scale for p < len (k in the blocked
/// layout above, `kb` the head's first block), softmax, then out = Σ_p att[p]·v_p with
/// v_p = v + p·HS (p increasing for every output channel). Every score is summed over d in
/// order, every output channel over p in order, on every path: nothing depends on how many
/// keys, queries or channels are computed together. Generic path: multiply then add. Keys and
/// values are held in F (F32 or F16: `options::kv_storage`) and read as floats.
template <weight_format F>
inline void attend_generic(const float* q, const weight_t<F>* kb, const weight_t<F>* v, std::size_t len,
                           std::size_t HS, float scale, float* att, float* out) noexcept {
  for (std::size_t b = 0; b < key_blocks(len); ++b) {
    const weight_t<F>* blk = kb + b * HS * key_block;
    float acc[key_block] = {};
    for (std::size_t d = 0; d < HS; ++d) {
      for (std::size_t j = 0; j < key_block; ++j) acc[j] += q[d] * load_scalar<F>(blk, d * key_block + j);
    }
    for (std::size_t j = 0; j < key_block && b * key_block + j < len; ++j) {
      att[b * key_block + j] = acc[j] * scale;
    }
  }
  softmax_row(isa::generic, att, len);
  std::fill(out, out + HS, 0.0f);
  for (std::size_t p = 0; p < len; ++p) {
    const float a = att[p];
    for (std::size_t d = 0; d < HS; ++d) out[d] += a * load_scalar<F>(v, p * HS + d);
  }
}

/// Where a prefetch puts its lines: `__builtin_prefetch`'s locality (3: prefetcht0, 2:
/// prefetcht1 on x86).
enum class prefetch_into : int { l1 = 3, l2 = 2 };

/// Prefetches the cache line holding the integer address `at` (no out-of-bounds pointer
/// arithmetic) into `Into`: every prefetch of the kernels goes through here.
template <prefetch_into Into>
SPECSAMPLE_ALWAYS_INLINE void prefetch_line(std::uintptr_t at) noexcept {
  __builtin_prefetch(reinterpret_cast<const void*>(at), 0, static_cast<int>(Into));
}

/// The next head's keys and values, prefetched while the current head computes. A head's cache is
/// evicted by the weight stream between calls (the target's 24 MB of weights pass through the
/// caches every call), and its keys are read as several interleaved 4 KiB blocks, which the
/// hardware prefetchers pick up late. `attend` walks the next head's key blocks, then its value
/// rows, `per_step` cache lines per step of its score and value loops. The lines go to L2
/// (prefetcht1), not L1: a head's keys and values (77 KB at context 141 with an F32 cache) do not
/// fit in L1 beside the head being computed. Prefetches only: no result changes. Measured on the
/// bundled target at context 141 (paired calls with and without; see the commit that introduced
/// it): appends of 1–9 tokens 1.8–3.2% faster with 2 lines per step into L1 (the keys alone:
/// 0.3–3.3%, least for 1–3 tokens), on the AVX2 path (forced on the same machine) 1.5–6%; where
/// the cache is already warm the prefetches cost 0.3–1 µs per layer. Into L2 with 4 lines per step
/// instead (Zen 4, paired medians of 400 calls, after four draft calls as in the loop): BF16
/// matmuls 2.6–3.9% faster for 1 token and 3.5–3.8% for 5, F32 0–3.8% and 0.8–3.6%, the draft's
/// call unchanged (0.98–1.01); 4 lines into L1 gained nothing over 2, nor 8 into L2 over 4.
///
/// `paced` spreads the walk over the steps the head takes (`attend_steps`): the fewest lines per
/// step, at most 4, that reach every line. Where the cache streams from DRAM a burst of 4 lines
/// per step queued the next head's lines ahead of the current one's demand misses: on the Zen 3
/// (AVX2, 12 GB/s) six layers' attention at context 141 with the keys and values evicted took
/// 490–606 µs for 5 queries at 4 lines per step and 363–444 µs at 1, the pace for 5 queries
/// there (scratch program, three alternating runs); on the AVX-512 path at that context the pace
/// is 4 lines with an F32 cache, as before (2 with an F16 cache: half the lines).
struct prefetch_stream {
  static constexpr int max_lines_per_step = 4;
  static constexpr std::uintptr_t line = 64;  ///< bytes per cache line
  std::uintptr_t cur = 0, end = 0;            ///< the range being walked: lines [cur, end)
  std::uintptr_t next = 0, next_end = 0;      ///< the range after it
  int per_step = max_lines_per_step;          ///< lines each `step` prefetches

  /// Every cache line holding one of the `a_bytes` bytes at `a`, then of the `b_bytes` at `b`
  /// (kept as integer addresses: no pointer past an array is ever formed).
  [[nodiscard]] static prefetch_stream of(const void* a, std::size_t a_bytes, const void* b,
                                          std::size_t b_bytes) noexcept {
    const auto ia = reinterpret_cast<std::uintptr_t>(a), ib = reinterpret_cast<std::uintptr_t>(b);
    return {ia & ~(line - 1), ia + a_bytes, ib & ~(line - 1), ib + b_bytes};
  }

  /// Lines the walk has still to give.
  [[nodiscard]] std::size_t lines() const noexcept {
    const auto of = [](std::uintptr_t from, std::uintptr_t to) {
      return to > from ? static_cast<std::size_t>((to - from + line - 1) / line) : std::size_t{0};
    };
    return of(cur, end) + of(next, next_end);
  }

  /// The same walk at the fewest lines per step (1..max_lines_per_step) that give every line
  /// within `steps` steps (max_lines_per_step when they cannot).
  [[nodiscard]] prefetch_stream paced(std::size_t steps) const noexcept {
    prefetch_stream s = *this;
    const std::size_t need = steps == 0 ? max_lines_per_step : (lines() + steps - 1) / steps;
    s.per_step = static_cast<int>(std::clamp<std::size_t>(need, 1, max_lines_per_step));
    return s;
  }

  /// The address of the next line of the walk, 0 once every line has been given.
  [[nodiscard, gnu::always_inline]] std::uintptr_t advance() noexcept {
    if (cur >= end) {
      if (next >= next_end) return 0;
      cur = next;
      end = next_end;
      next = next_end;
    }
    const std::uintptr_t at = cur;
    cur += line;
    return at;
  }

  /// Prefetches the next `per_step` lines, as many as are left. A switch onto unrolled takes of a
  /// constant count: a loop over the run-time count made warm attention 9–13% slower on the Zen 3.
  [[gnu::always_inline]] void step() noexcept {
    static_assert(max_lines_per_step == 4, "step covers paces 1..4");
    switch (per_step) {
      case 1: return take<1>();
      case 2: return take<2>();
      case 3: return take<3>();
      default: return take<4>();
    }
  }

  /// Prefetches the next N lines, as many as are left.
  template <std::size_t N>
  [[gnu::always_inline]] void take() noexcept {
#pragma GCC unroll 4
    for (std::size_t i = 0; i < N; ++i) {
      const std::uintptr_t at = advance();
      if (at == 0) return;
      prefetch_line<prefetch_into::l2>(at);
    }
  }
};

/// Queries that one pass of the attention's kernels processes together (a tile of `attend`): they
/// share every key and value load. Six is what the registers hold: 6 × 4 zmm accumulators, 4 loaded vectors and a
/// broadcast (AVX-512); 6 × 2 ymm, 2 and 1 (AVX2). Against 4, a 5-token append of the bundled
/// target is 1.3–1.7% faster and a 6-token one 0.2–1.3% (paired calls at context 141); the
/// attention of 5 and 6 queries alone (cache warm) 26–29% faster on AVX-512, 15–21% on AVX2.
inline constexpr std::size_t query_tile = 6;

/// Calls `f.template operator()<NQ>()` with NQ = nq (1..query_tile), a compile-time tile size.
template <class Fn>
void with_query_tile(std::size_t nq, Fn&& f) {
  switch (nq) {
    case 1: return f.template operator()<1>();
    case 2: return f.template operator()<2>();
    case 3: return f.template operator()<3>();
    case 4: return f.template operator()<4>();
    case 5: return f.template operator()<5>();
    default: return f.template operator()<6>();
  }
}
static_assert(query_tile == 6, "with_query_tile covers 1..6");

/// Queries one `attend` call takes: up to three tiles (`query_tiles`), whose passes interleave so
/// that one read of a head's keys and values from memory serves them all. A 7-token append of the
/// bundled target in two tiles run one after the other cost +44 µs of attention over a 6-token
/// one (194.5 against 150.3 µs), each further token +7: the second tile's passes did not overlap
/// the first one's stream; in a group +17 (167.8 µs; medians of 500 alternating calls, context
/// 132, BF16 matmuls on AMX tiles, Xeon family 6 model 207, 2026-12-01).
inline constexpr std::size_t query_group = 3 * query_tile;
// A group of several tiles has none of a single query (7 queries split as 3 + 4): attend_avx2
// gives all of a group's tiles one pass width, avx2_vectors of its first tile's size.
static_assert(query_tile >= 3, "the tiles of a group of several hold at least two queries each");

/// The tiles of nq (1..query_group) consecutive queries: the fewest of at most query_tile
/// queries, of sizes differing by at most one (tile s: queries [s·nq/n, (s + 1)·nq/n)).
struct query_tiles {
  std::size_t nq, n;
  explicit query_tiles(std::size_t queries) noexcept : nq(queries), n((queries + query_tile - 1) / query_tile) {}
  [[nodiscard]] std::size_t first(std::size_t s) const noexcept { return s * nq / n; }
  [[nodiscard]] std::size_t size(std::size_t s) const noexcept { return first(s + 1) - first(s); }
  /// f.template operator()<NQ>(t) for every tile in order: its first query t and its size NQ.
  template <class Fn>
  void each(Fn&& f) const {
    for (std::size_t s = 0; s < n; ++s) {
      with_query_tile(size(s), [&]<std::size_t NQ>() { f.template operator()<NQ>(first(s)); });
    }
  }
};

#if SPECSAMPLE_X86

using specsample::simd::avx512_first;
using specsample::simd::avx512_round_nearest;

/// How far ahead of the k-step being computed the micro-kernels prefetch their weights into L1:
/// 16 KiB (every cache line of the step), at most half a panel (8 KiB for the drafts' 128-input
/// matrices), and never past the end of the panels the call streams. Measured A/B against the
/// 8 KiB used before on the bundled target (Zen 5, weights streaming from L3; medians of 150
/// alternating calls at context 64): append of 1 token 420–428 against 456–459 µs, of 4 tokens
/// 535–546 against 582–586 µs; the drafts' appends stay within 3% (uncapped 16 KiB, or
/// prefetching past the end of a matrix, cost them 5–15%). (On Zen 4, one line per step 16
/// steps ahead left 5-token matmuls 60% slower than with their weights in cache.)
inline constexpr std::size_t prefetch_bytes = 16384;

/// Where a call's weight prefetches go: `ahead` bytes past the step being computed, never past
/// `stop` (the end of the panels the call streams; `prefetched_steps` says which steps may).
struct prefetch_window {
  std::uintptr_t stop;
  std::size_t ahead;
};

/// The prefetch window of a call over panels [0, p_end) of `a` (weights of format F).
template <weight_format F>
[[nodiscard]] inline prefetch_window window(const matmul_args& a, std::size_t p_end) noexcept {
  const std::size_t panel_bytes = packed_cols(F, a.K) * panel * sizeof(weight_t<F>);
  return {reinterpret_cast<std::uintptr_t>(a.w) + p_end * panel_bytes,
          std::min(prefetch_bytes, panel_bytes / 2)};
}

/// Prefetches the `bytes` (a multiple of 64) `ahead` bytes past `p` into `Into`.
template <prefetch_into Into = prefetch_into::l1>
SPECSAMPLE_ALWAYS_INLINE void prefetch_ahead(const void* p, std::size_t ahead, std::size_t bytes) {
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(p) + ahead;
  for (std::size_t b = 0; b < bytes; b += 64) prefetch_line<Into>(at + b);
}

/// How many of the k steps of a micro-kernel over `w` (step k reads `bytes` at w + k·row) can
/// prefetch `win.ahead` on without passing `win.stop`: those steps come first in the kernels,
/// prefetching unconditionally, and the rest follow without. A test inside one loop instead left
/// it with two back edges, and Clang 14 then spilled accumulators (the AVX2 single-row tile ran
/// 1.6× as long as without the test).
[[nodiscard]] inline std::size_t prefetched_steps(const void* w, std::size_t row, std::size_t bytes,
                                                  std::size_t K, prefetch_window win) noexcept {
  const std::uintptr_t first = reinterpret_cast<std::uintptr_t>(w) + win.ahead + bytes;
  return first > win.stop ? 0 : std::min(K, (win.stop - first) / row + 1);
}

/// Rows of a matmul the kernels take over one block of weights (`matmul_avx2`; `avx512_panels`
/// for streamed weights).
inline constexpr std::size_t block_rows = 12;

/// The prefetch of later weights, spread evenly over the tile steps of a block. The weights of a
/// call's panels lie in memory in the order its blocks are computed, so while the block [s, e) is
/// computed the bytes [s + ahead, e + ahead) are prefetched (`prefetch_window::ahead`: 16 KiB,
/// two AVX2 blocks or one AVX-512 block, or half a panel of a narrow matrix): the `total` tile
/// steps of the block (every tile of its rows, each over its steps) take `lines` lines each from a
/// cursor that advances by (e − s) / total bytes a step (kept in 1/256 bytes, in 64 bits), never
/// past `stop`, the end of the call's panels (from there, `left` = 0, the steps prefetch nothing).
struct block_prefetch {
  static constexpr std::size_t block_bytes = 8192;
  std::uint64_t pos = 0;  ///< the next line's address × 256
  std::uint64_t inc = 0;  ///< bytes per step × 256
  std::size_t left = 0;   ///< steps that may still prefetch
  int lines = 1;          ///< lines per step: 1, 2 or 4 (the steps after the first `left` take none)

  /// Steps of a block over weights of `row_bytes` per step (at least one).
  [[nodiscard]] static constexpr std::size_t block_steps(std::size_t row_bytes) noexcept {
    return std::max<std::size_t>(1, block_bytes / row_bytes);
  }

  /// The share of each tile step for `tiles` tiles over weights of `row_bytes` a step (`inc`,
  /// `lines`; the same for every block of a group of rows), prefetching nothing yet.
  [[nodiscard]] static block_prefetch per_step(std::size_t row_bytes, std::size_t tiles) noexcept {
    block_prefetch pf;
    pf.inc = (std::uint64_t{row_bytes} * 256 + tiles - 1) / tiles;
    pf.lines = pf.inc <= 64 * 256 ? 1 : pf.inc <= 128 * 256 ? 2 : 4;  // row_bytes is at most 256
    return pf;
  }

  /// This share's prefetch for the block starting at `s`, of `total` tile steps: `left` = 0 when
  /// nothing before `stop` is left to prefetch.
  [[nodiscard]] block_prefetch at(std::uintptr_t s, std::size_t total, prefetch_window win) const noexcept {
    block_prefetch pf = *this;
    const std::uintptr_t from = s + win.ahead;
    pf.left = 0;
    if (from >= win.stop) return pf;
    pf.pos = std::uint64_t{from} * 256;
    // Step i prefetches the lines from (pos + i·inc) / 256 on: all of them before `stop`.
    const std::uint64_t reach = static_cast<std::uint64_t>(pf.lines) * 64, end = win.stop;
    if (from + (total * pf.inc) / 256 + reach <= end) {
      pf.left = total;
    } else {
      pf.left = from + reach > end ? 0 : static_cast<std::size_t>(std::min<std::uint64_t>(total, ((end - from - reach) * 256) / pf.inc + 1));
    }
    return pf;
  }

  /// The steps of a tile's part [k0, k1) that prefetch: [k0, returned), the first `left` of them
  /// (taken from `left`; the tile's cursor starts at `pos` and is put back there after its steps).
  [[nodiscard]] std::size_t take(std::size_t k0, std::size_t k1) noexcept {
    const std::size_t n = std::min(left, k1 - k0);
    left -= n;
    return k0 + n;
  }

  /// The prefetch of a tile's steps: PF lines at the cursor, which then advances.
  template <int PF>
  struct cursor {
    std::uint64_t pos, inc;
    [[gnu::always_inline]] void step(const void*) noexcept {
      const auto at = static_cast<std::uintptr_t>(pos / 256);
#pragma GCC unroll 4
      for (int i = 0; i < PF; ++i) prefetch_line<prefetch_into::l1>(at + 64 * static_cast<std::uintptr_t>(i));
      pos += inc;
    }
  };

  /// `cursor` with the line count a run-time value (the AVX-512 tiles' shares, `avx512_panels`).
  struct lines_cursor {
    std::uint64_t pos, inc;
    int lines;
    [[gnu::always_inline]] void step(const void*) noexcept {
      const auto at = static_cast<std::uintptr_t>(pos / 256);
      for (int i = 0; i < lines; ++i) prefetch_line<prefetch_into::l1>(at + 64 * static_cast<std::uintptr_t>(i));
      pos += inc;
    }
  };
};

/// The prefetch of a tile's steps over a panel taken whole: `Bytes` `ahead` bytes past its weights,
/// into `Into`.
template <std::size_t Bytes, prefetch_into Into = prefetch_into::l1>
struct ahead_prefetch {
  std::size_t ahead;
  [[gnu::always_inline]] void step(const void* wk) const noexcept { prefetch_ahead<Into>(wk, ahead, Bytes); }
};

/// No prefetch.
struct no_prefetch {
  [[gnu::always_inline]] void step(const void*) const noexcept {}
};

// --- AVX2: W vectors of 8 outputs × R rows (16 ymm registers) ------------------------------------
// A single row takes the whole panel (8 accumulators, not 4: enough independent FMA chains to
// keep both FMA pipes busy instead of waiting on the FMA latency); several rows go block by block
// (`matmul_avx2`) in tiles of 2 rows × 32 outputs or 4–6 rows × 16 outputs (8–12 accumulators, two
// weight vectors, one row's broadcast at a time: `first_part`). Each weight vector is converted
// once per step and applied to every row of its tile, so the 6 × 16 tile converts 2 vectors per
// 12 multiply-adds where pairs of rows converted 4 per 8. Every output is still one accumulator
// summed over k in order, whatever the tile or block. (A 3-row tile of 32 outputs, 12
// accumulators + 3 broadcasts + a weight, all 16 registers, ran 15–19% faster than a pair and a
// single row with GCC 12, but Clang 14 spilled it and ran 40% slower; 3 × 16 has only 6 chains.)

template <weight_format F>
SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE __m256 avx2_load_w(const void* w, std::size_t i) {
  if constexpr (F == weight_format::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(w) + i);
  } else {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(w) + i));
    if constexpr (F == weight_format::f16) {
      return _mm256_cvtph_ps(h);
    } else {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

/// Steps [k0, k1) of an AVX2 tile: acc[r][j] += w[k][8j..8j+7] · x[r][k]. Each step first
/// calls `pf.step(wk)`, wk its weights (a prefetch: `no_prefetch`, `ahead_prefetch` or
/// `block_prefetch::cursor`).
template <weight_format F, std::size_t W, std::size_t R, class P>
SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE void avx2_steps(__m256 (&acc)[R][W], const void* w,
                                                            const float* x, std::size_t ldx,
                                                            std::size_t k0, std::size_t k1, P& pf) {
  using wt = weight_t<F>;
#pragma GCC unroll 2
  for (std::size_t k = k0; k < k1; ++k) {
    const wt* wk = static_cast<const wt*>(w) + k * panel;
    pf.step(wk);
    if constexpr (R <= 2) {  // the rows' broadcasts first, then one weight vector at a time
      __m256 xb[R];
#pragma GCC unroll 8
      for (std::size_t r = 0; r < R; ++r) xb[r] = _mm256_broadcast_ss(x + r * ldx + k);
#pragma GCC unroll 8
      for (std::size_t j = 0; j < W; ++j) {
        const __m256 wv = avx2_load_w<F>(wk, 8 * j);
#pragma GCC unroll 8
        for (std::size_t r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(wv, xb[r], acc[r][j]);
      }
    } else {  // the weight vectors first, then one row's broadcast at a time (R·W + W + 1 registers)
      __m256 wv[W];
#pragma GCC unroll 8
      for (std::size_t j = 0; j < W; ++j) wv[j] = avx2_load_w<F>(wk, 8 * j);
#pragma GCC unroll 8
      for (std::size_t r = 0; r < R; ++r) {
        const __m256 xb = _mm256_broadcast_ss(x + r * ldx + k);
#pragma GCC unroll 8
        for (std::size_t j = 0; j < W; ++j) acc[r][j] = _mm256_fmadd_ps(wv[j], xb, acc[r][j]);
      }
    }
  }
}

/// The BF16 pair in the 32-bit lanes of v as floats: the odd column's (high half) and the even
/// column's (low half), exactly.
SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE __m256 avx2_odd(__m256i v) {
  return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE __m256 avx2_even(__m256i v) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/// The four bytes at p as one 32-bit lane: a row's two BF16 operands of a column pair, or its four
/// INT8 operands of a quad.
SPECSAMPLE_ALWAYS_INLINE int load_lane(const void* p) noexcept {
  std::uint32_t u = 0;
  std::memcpy(&u, p, sizeof u);
  return static_cast<int>(u);
}

/// Column pairs [k0, k1) of an AVX2 tile of `bf16_pairs` weights, vdpbf16ps's sums with F32 FMAs:
/// acc[r][j] += w[2k+1]·x[r][2k+1], then += w[2k]·x[r][2k] (products of two BF16 values are exact
/// in F32, so each FMA rounds once, as vdpbf16ps does).
template <std::size_t W, std::size_t R, class P>
SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE void avx2_pair_steps(__m256 (&acc)[R][W], const std::uint16_t* w,
                                                                 const std::uint16_t* x, std::size_t ldx,
                                                                 std::size_t k0, std::size_t k1, P& pf) {
  for (std::size_t k = k0; k < k1; ++k) {
    const std::uint16_t* wk = w + k * 2 * panel;
    pf.step(wk);
    __m256 xo[R], xe[R];
#pragma GCC unroll 8
    for (std::size_t r = 0; r < R; ++r) {
      const __m256i pr = _mm256_set1_epi32(load_lane(x + r * ldx + 2 * k));
      xo[r] = avx2_odd(pr);
      xe[r] = avx2_even(pr);
    }
#pragma GCC unroll 8
    for (std::size_t j = 0; j < W; ++j) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wk + 16 * j));
      const __m256 wo = avx2_odd(v), we = avx2_even(v);
#pragma GCC unroll 8
      for (std::size_t r = 0; r < R; ++r) {
        acc[r][j] = _mm256_fmadd_ps(wo, xo[r], acc[r][j]);
        acc[r][j] = _mm256_fmadd_ps(we, xe[r], acc[r][j]);
      }
    }
  }
}

/// Quads [k0, k1) of an AVX2 INT8 tile (its weights at w, the k-th quad of a panel at w + 4·64·k):
/// vpmaddwd on the even and the odd bytes of each lane (the
/// operands zero-extended, the weights sign-extended to 16 bits: exact), the two sums added.
template <std::size_t W, std::size_t R, class P>
SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE void avx2_i8_steps(__m256i (&acc)[R][W], const std::int8_t* w,
                                                                const std::uint8_t* x, std::size_t ldx,
                                                                std::size_t k0, std::size_t k1, P& pf) {
  const __m256i even_bytes = _mm256_set1_epi32(0x00FF00FF);
  for (std::size_t k = k0; k < k1; ++k) {
    const std::int8_t* wk = w + k * 4 * panel;
    pf.step(wk);
    __m256i xe[R], xo[R];
#pragma GCC unroll 8
    for (std::size_t r = 0; r < R; ++r) {
      const __m256i q = _mm256_set1_epi32(load_lane(x + r * ldx + 4 * k));
      xe[r] = _mm256_and_si256(q, even_bytes);
      xo[r] = _mm256_srli_epi16(q, 8);
    }
#pragma GCC unroll 8
    for (std::size_t j = 0; j < W; ++j) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wk + 32 * j));
      const __m256i we = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8), wo = _mm256_srai_epi16(v, 8);
#pragma GCC unroll 8
      for (std::size_t r = 0; r < R; ++r) {
        acc[r][j] = _mm256_add_epi32(acc[r][j], _mm256_add_epi32(_mm256_madd_epi16(we, xe[r]), _mm256_madd_epi16(wo, xo[r])));
      }
    }
  }
}

/// An AVX2 tile's accumulator vector over weights of format F: 8 integer sums for INT8 quads,
/// else 8 floats; `acc_t<F>` their elements, as kept between blocks.
/// (A trait, not std::conditional_t: GCC warns that a vector type as a template argument loses
/// its attributes.)
template <weight_format F>
struct avx2_acc_of {
  using type = __m256;
};
template <>
struct avx2_acc_of<weight_format::i8_quads> {
  using type = __m256i;
};
template <weight_format F>
using avx2_acc = typename avx2_acc_of<F>::type;
template <weight_format F>
using acc_t = std::conditional_t<F == weight_format::i8_quads, std::int32_t, float>;

template <weight_format F>
SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE avx2_acc<F> avx2_acc_zero() {
  if constexpr (F == weight_format::i8_quads) {
    return _mm256_setzero_si256();
  } else {
    return _mm256_setzero_ps();
  }
}
template <weight_format F>
SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE avx2_acc<F> avx2_acc_load(const acc_t<F>* p) {
  if constexpr (F == weight_format::i8_quads) {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
  } else {
    return _mm256_load_ps(p);
  }
}
template <weight_format F>
SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE void avx2_acc_store(acc_t<F>* p, avx2_acc<F> v) {
  if constexpr (F == weight_format::i8_quads) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(p), v);
  } else {
    _mm256_store_ps(p, v);
  }
}

/// out[t][o0 + j] from the sums acc_buf[(t − g0)·64 + j] of rows [g0, g1), j < the panel's
/// outputs: + bias[o0 + j]; for INT8 quads `matmul_generic_i8`'s epilogue (`i8_output`).
template <weight_format F>
SPECSAMPLE_TARGET_AVX2 void avx2_store_rows(const matmul_args& a, const acc_t<F>* acc_buf, std::size_t o0,
                                            std::size_t g0, std::size_t g1) noexcept {
  const std::size_t valid = std::min<std::size_t>(panel, a.OC - o0);
  if constexpr (F == weight_format::i8_quads) {
    const i8_meta meta = i8_meta_of(a.w, a.OC, a.K);
    for (std::size_t t = g0; t < g1; ++t) {
      const std::int32_t* acc = acc_buf + (t - g0) * panel;
      float* out = a.out + t * a.ldo + o0;
      for (std::size_t j = 0; j < valid; ++j) {
        out[j] = i8_output(acc[j] - 128 * meta.sum[o0 + j], meta.scale[o0 + j], a.xs[t], a.bias, o0 + j);
      }
    }
  } else {
    for (std::size_t t = g0; t < g1; ++t) {
      const float* acc = acc_buf + (t - g0) * panel;
      float* out = a.out + t * a.ldo + o0;
      std::size_t j = 0;
      for (; j + 8 <= valid; j += 8) {
        const __m256 v = _mm256_load_ps(acc + j);
        _mm256_storeu_ps(out + j, a.bias != nullptr ? _mm256_add_ps(v, _mm256_loadu_ps(a.bias + o0 + j)) : v);
      }
      for (; j < valid; ++j) out[j] = a.bias != nullptr ? acc[j] + a.bias[o0 + j] : acc[j];
    }
  }
}

/// Steps [k0, k1) of the tile of rows [t0, t0 + R) whose weights start at w, with prefetch `pf`.
template <weight_format F, std::size_t W, std::size_t R, class P>
SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE void avx2_tile_steps(avx2_acc<F> (&acc)[R][W], const void* w, const matmul_args& a,
                                                                 std::size_t t0, std::size_t k0, std::size_t k1, P& pf) {
  if constexpr (F == weight_format::i8_quads) {
    avx2_i8_steps<W, R>(acc, static_cast<const std::int8_t*>(w), a.xq + t0 * a.ldxq, a.ldxq, k0, k1, pf);
  } else if constexpr (F == weight_format::bf16_pairs) {
    avx2_pair_steps<W, R>(acc, static_cast<const std::uint16_t*>(w), a.xh + t0 * a.ldxh, a.ldxh, k0, k1, pf);
  } else {
    avx2_steps<F, W, R>(acc, w, a.x + t0 * a.ldx, a.ldx, k0, k1, pf);
  }
}

/// A single row t over all of panel p (8 accumulators, not 4: enough independent FMA chains to keep
/// both FMA pipes busy), prefetching its weights `win.ahead` bytes on into L2, not L1 (a single row
/// streams its weights with little arithmetic beside; the likely cause, not measured: `prefetcht0`
/// ties the stream to the L1's few miss buffers). On a Zen 4 guest without AVX-512 (`isa::avx2`,
/// one core streaming the target's weights at 41–48 GB/s; a scratch program running both builds
/// interleaved in one process, three runs of 200 rounds of four draft tokens, the target's 5-token
/// call, four draft tokens, its single token, context 141, 2026-11-28) the target's single token
/// took 567–614 µs at the minimum and 669–996 at the median against 651–734 and 803–991 into L1,
/// the distilled draft's 40.5–41.7 µs against 45.6–45.9 at the minimum; the 5-token call the same.
/// (The blocks of several rows are bound by their multiply-adds there: their prefetch into L2
/// changed nothing. Prefetching 64 KiB ahead instead of 16: no better.)
template <weight_format F>
[[gnu::noinline]] SPECSAMPLE_TARGET_AVX2 void avx2_row_tile(const matmul_args& a, std::size_t p, std::size_t t,
                                                          prefetch_window win) {
  using wt = weight_t<F>;
  constexpr std::size_t per = step_cols<F>;
  constexpr std::size_t row_bytes = per * panel * sizeof(wt);
  const std::size_t steps = packed_cols(F, a.K) / per;
  const wt* w = static_cast<const wt*>(a.w) + p * steps * per * panel;
  avx2_acc<F> acc[1][8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) acc[0][j] = avx2_acc_zero<F>();
  const std::size_t k_pf = prefetched_steps(w, row_bytes, row_bytes, steps, win);
  ahead_prefetch<row_bytes, prefetch_into::l2> ahead{win.ahead};
  no_prefetch none;
  avx2_tile_steps<F, 8, 1>(acc, w, a, t, 0, k_pf, ahead);
  avx2_tile_steps<F, 8, 1>(acc, w, a, t, k_pf, steps, none);
  alignas(32) acc_t<F> buf[panel];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) avx2_acc_store<F>(buf + 8 * j, acc[0][j]);
  avx2_store_rows<F>(a, buf, p * panel, t, t + 1);
}

/// Steps [k0, k1) of rows [t0, t0 + R) × outputs [p·64 + o_off, + 8·W) of panel p, on the
/// accumulators in `acc_buf` (row t0 + r at acc_buf[r * panel + o_off]): loaded there (zeros
/// when k0 = 0), stored back, exactly. The first
/// `pf.left` steps prefetch (PF lines each). (Not inlined: Clang 14 inlined the tiles into
/// matmul_avx2 and spilled their accumulators.)
template <weight_format F, std::size_t W, std::size_t R, int PF>
[[gnu::noinline]] SPECSAMPLE_TARGET_AVX2 void avx2_tile(const matmul_args& a, std::size_t p, std::size_t o_off,
                                                      std::size_t t0, std::size_t k0, std::size_t k1,
                                                      acc_t<F>* acc_buf, block_prefetch& pf) {
  using wt = weight_t<F>;
  constexpr std::size_t per = step_cols<F>;
  const std::size_t steps = packed_cols(F, a.K) / per;
  const wt* w = static_cast<const wt*>(a.w) + p * steps * per * panel + o_off * per;
  avx2_acc<F> acc[R][W];
#pragma GCC unroll 8
  for (std::size_t r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (std::size_t j = 0; j < W; ++j) {
      acc[r][j] = k0 == 0 ? avx2_acc_zero<F>()
                          : avx2_acc_load<F>(acc_buf + r * panel + o_off + 8 * j);
    }
  }
  const std::size_t k_pf = pf.take(k0, k1);
  block_prefetch::cursor<PF> cur{pf.pos, pf.inc};  // a local copy, which stays in registers
  no_prefetch none;
  avx2_tile_steps<F, W, R>(acc, w, a, t0, k0, k_pf, cur);
  avx2_tile_steps<F, W, R>(acc, w, a, t0, k_pf, k1, none);
  pf.pos = cur.pos;
  // (Unrolled so that acc is only ever indexed by constants: an array indexed at run time lives
  // in memory, and GCC 12 then stored all of it on every k step.)
#pragma GCC unroll 8
  for (std::size_t r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (std::size_t j = 0; j < W; ++j) {
      avx2_acc_store<F>(acc_buf + r * panel + o_off + 8 * j, acc[r][j]);
    }
  }
}

/// Rows a tile of `matmul_avx2`'s blocks takes at most: 6 (6 × 16 outputs: 12 accumulators, two
/// weight vectors and a broadcast), 2 for `bf16_pairs` and `i8_quads` (whose weight vectors and
/// row operands are two registers each: a pair of rows on half a panel).
template <weight_format F>
inline constexpr std::size_t tile_rows = F == weight_format::bf16_pairs || F == weight_format::i8_quads ? 2 : 6;

/// Vectors of 8 outputs a tile of r rows takes: 8 for one row, 4 for two, else 2 (8 to 12
/// accumulators: enough independent chains of multiply-adds to keep both FMA pipes busy).
[[nodiscard]] constexpr std::size_t tile_vectors(std::size_t r) noexcept { return r == 1 ? 8 : r == 2 ? 4 : 2; }

/// Rows of the first tile of m rows of format F: at most `tile_rows<F>`, never 3 (a 3 × 16 tile has
/// only 6 accumulators: 2 + 1 instead), halves of 8 to 12 rows (9: 5 + 4), 5 + 2 for 7 (not 4 + 3).
template <weight_format F>
[[nodiscard]] constexpr std::size_t first_part(std::size_t m) noexcept {
  if (m <= 2 || tile_rows<F> == 2) return std::min<std::size_t>(m, tile_rows<F>);
  if (m == 3) return 2;
  if (m <= 6) return m;
  if (m == 7) return 5;
  return std::min<std::size_t>(tile_rows<F>, (m + 1) / 2);
}

/// Calls fn(t, r) for the tiles' parts of rows [g0, g1) (`first_part`: 12 rows → 6 + 6, 3 → 2 + 1).
template <weight_format F, class Fn>
SPECSAMPLE_ALWAYS_INLINE void for_each_part(std::size_t g0, std::size_t g1, Fn&& fn) {
  for (std::size_t t = g0; t < g1;) {
    const std::size_t r = first_part<F>(g1 - t);
    fn(t, r);
    t += r;
  }
}

/// Tiles of one block of rows [g0, g1) and steps [k0, k1) of panel p, whose outputs below `valid`
/// exist: each part of the rows (`for_each_part`) over each 8·W outputs holding any, with PF lines
/// prefetched per step.
template <weight_format F, int PF>
SPECSAMPLE_TARGET_AVX2 void avx2_block(const matmul_args& a, std::size_t p, std::size_t valid, std::size_t g0,
                                       std::size_t g1, std::size_t k0, std::size_t k1, acc_t<F>* acc_buf,
                                       block_prefetch& pf) {
  const auto tiles = [&]<std::size_t R>(std::size_t t) {
    constexpr std::size_t W = tile_vectors(R);
    for (std::size_t o = 0; o < valid; o += 8 * W) {
      avx2_tile<F, W, R, PF>(a, p, o, t, k0, k1, acc_buf + (t - g0) * panel, pf);
    }
  };
  for_each_part<F>(g0, g1, [&](std::size_t t, std::size_t r) {
    switch (r) {
      case 1: tiles.template operator()<1>(t); break;
      case 2: tiles.template operator()<2>(t); break;
      case 4: if constexpr (tile_rows<F> >= 4) tiles.template operator()<4>(t); break;
      case 5: if constexpr (tile_rows<F> >= 5) tiles.template operator()<5>(t); break;
      default: if constexpr (tile_rows<F> >= 6) tiles.template operator()<6>(t); break;
    }
  });
}

/// Panels [p_begin, p_end) of `a` with the AVX2 tiles. Rows are taken in groups of up to
/// `block_rows`, and each panel in blocks of steps (`block_prefetch::block_bytes` of weights):
/// every tile of a group (`avx2_block`) runs over one block before any moves to the next, so a
/// block is read from memory once per group (once for up to 12 rows), while the group's tiles
/// spread the prefetch of later weights over their steps: a verification of K + 1 rows streams the
/// weights as a single row does, its multiply-adds overlapping the stream. (Before, the tiles of a
/// panel ran one after another over all its steps, and the panel's weights came from memory in its
/// first tiles alone, with no multiply-adds beside them. On a Zen 3 whose core streams the bundled
/// target's weights from DRAM at 10–18 GB/s, `BM_append` of the target, four alternating runs of
/// both builds: 2 tokens 2.8–3.5 → 1.9–2.2 ms, 5 tokens 3.5–4.8 → 2.9–3.3 ms, 9 tokens 5.8–7.2 →
/// 4.9–6.2 ms, 1 token 1.6–2.3 ms in both.) A single row takes each panel whole (`avx2_row_tile`).
/// Every output is still one accumulator summed over k in order, kept in `acc_buf` between blocks
/// (for INT8 quads an exact integer sum: `acc_t`, `avx2_store_rows` then applies the scales).
template <weight_format F>
SPECSAMPLE_TARGET_AVX2 void matmul_avx2(const matmul_args& a, std::size_t p_begin,
                                      std::size_t p_end) {
  constexpr std::size_t per = step_cols<F>;
  const std::size_t steps = packed_cols(F, a.K) / per;
  const std::size_t row_bytes = per * panel * sizeof(weight_t<F>);  // one step of a panel
  const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(a.w);
  const prefetch_window win = window<F>(a, p_end);
  // One row: no block to share, each panel taken whole. (Through the blocks, the drafts' single
  // token cost 8-18% more: BM_append min / median of 8 alternating runs, Zen 3, 2026-11-26, draft
  // 41.5 / 49.5 -> 48.9 / 58.4 us, distilled draft 48.1 / 52.8 -> 51.9 / 59.6 us.)
  if (a.T == 1) {
    for (std::size_t p = p_begin; p < p_end; ++p) avx2_row_tile<F>(a, p, 0, win);
    return;
  }
  alignas(32) acc_t<F> acc_buf[block_rows * panel];
  const std::size_t block = block_prefetch::block_steps(row_bytes);
  for (std::size_t p = p_begin; p < p_end; ++p) {
    const std::size_t valid = std::min(panel, a.OC - p * panel);
    for (std::size_t g0 = 0; g0 < a.T; g0 += block_rows) {
      const std::size_t g1 = std::min(a.T, g0 + block_rows);
      std::size_t tiles = 0;  // tile runs per block
      for_each_part<F>(g0, g1, [&](std::size_t, std::size_t r) {
        const std::size_t outs = 8 * tile_vectors(r);
        tiles += (valid + outs - 1) / outs;
      });
      const block_prefetch share = block_prefetch::per_step(row_bytes, tiles);
      // (At least one block, empty when K = 0: the tiles then zero the accumulators.)
      for (std::size_t k0 = 0; k0 == 0 || k0 < steps; k0 += block) {
        const std::size_t k1 = std::min(steps, k0 + block);
        block_prefetch pf = share.at(base + (p * steps + k0) * row_bytes, tiles * (k1 - k0), win);
        switch (pf.lines) {
          case 1: avx2_block<F, 1>(a, p, valid, g0, g1, k0, k1, acc_buf, pf); break;
          case 2: avx2_block<F, 2>(a, p, valid, g0, g1, k0, k1, acc_buf, pf); break;
          default: avx2_block<F, 4>(a, p, valid, g0, g1, k0, k1, acc_buf, pf); break;
        }
      }
      avx2_store_rows<F>(a, acc_buf, p * panel, g0, g1);
    }
  }
}

// --- AVX-512: a panel of 64 outputs (4 × 16 lanes) × up to 6 rows ---------------------------------

template <weight_format F>
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE __m512 avx512_load_w(const void* w, std::size_t i) {
  if constexpr (F == weight_format::f32) {
    return _mm512_loadu_ps(static_cast<const float*>(w) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(w) + i));
    if constexpr (F == weight_format::f16) {
      return _mm512_mask_cvtph_ps(_mm512_setzero_ps(), 0xFFFF, h);  // (no _undefined: GCC 12 warns)
    } else {
      return _mm512_castsi512_ps(
          _mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, h), 16));
    }
  }
}

/// `avx512_load_w` of the lanes in `m` only (the others zero, their memory not read); F32 or F16.
template <weight_format F>
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE __m512 avx512_maskload_w(const void* w, std::size_t i,
                                                                         __mmask16 m) {
  static_assert(F == weight_format::f32 || F == weight_format::f16, "masked loads of F32 or F16 only: the KV cache");
  if constexpr (F == weight_format::f32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(w) + i);
  } else {
    return _mm512_mask_cvtph_ps(_mm512_setzero_ps(), 0xFFFF,
                                _mm256_maskz_loadu_epi16(m, static_cast<const std::uint16_t*>(w) + i));
  }
}

/// Holds the weight vector v in a register from its load on. Without it GCC 12 reads a tile's
/// weight vector from memory again at each multiply-add of up to 3 rows (a memory operand of each
/// vfmadd231ps / vpdpbusd, or a `vmovdqu16` per vdpbf16ps once the vector is cast to `__m512bh`):
/// 12 loads per step in a 3-row tile instead of 4, and a 3-token append of the bundled target in
/// BF16 took longer than a 4-token one (docs/gpt2.md, "Matmul precision"). Clang 14 loads each
/// vector once either way. No instruction is emitted.
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE void keep_in_register(__m512& v) noexcept { asm("" : "+v"(v)); }
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE void keep_in_register(__m512i& v) noexcept { asm("" : "+v"(v)); }

/// Steps [k0, k1) of an AVX-512 panel: acc[t][j] += w[k][16j..16j+15] · x[t][k]. Each step first
/// calls pf.step(its weights) (`ahead_prefetch`, a `block_prefetch::lines_cursor` or `no_prefetch`).
template <weight_format F, std::size_t TT, class P>
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE void avx512_steps(__m512 (&acc)[TT][4], const void* w,
                                                                const float* x, std::size_t ldx,
                                                                std::size_t k0, std::size_t k1, P& pf) {
  using wt = weight_t<F>;
  for (std::size_t k = k0; k < k1; ++k) {
    const wt* wk = static_cast<const wt*>(w) + k * panel;
    pf.step(wk);
    __m512 wv[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      wv[j] = avx512_load_w<F>(wk, static_cast<std::size_t>(16 * j));
      keep_in_register(wv[j]);
    }
#pragma GCC unroll 8
    for (std::size_t t = 0; t < TT; ++t) {
      const __m512 xb = _mm512_set1_ps(x[t * ldx + k]);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[t][j] = _mm512_fmadd_ps(wv[j], xb, acc[t][j]);
    }
  }
}

/// Column pairs [k0, k1) of an AVX-512 panel of `bf16_pairs` weights on CPUs without
/// AVX512_BF16: the sums of `avx2_pair_steps` (vdpbf16ps's, with F32 FMAs). The rows' operands
/// are split once per step and held in registers: with up to 4 rows (16 accumulators, 8 operands).
/// (The maskz forms of the shifts here and below: GCC 12 warns about the _undefined operand of the
/// plain ones.)
template <std::size_t TT, class P>
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE void avx512_pair_steps(__m512 (&acc)[TT][4], const std::uint16_t* w,
                                                                     const std::uint16_t* x, std::size_t ldx,
                                                                     std::size_t k0, std::size_t k1, P& pf) {
  static_assert(TT <= 4, "the split operands of more rows do not fit in the registers");
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (std::size_t k = k0; k < k1; ++k) {
    const std::uint16_t* wk = w + k * 2 * panel;
    pf.step(wk);
    __m512 xo[TT], xe[TT];
#pragma GCC unroll 8
    for (std::size_t t = 0; t < TT; ++t) {
      const __m512i pr = _mm512_set1_epi32(load_lane(x + t * ldx + 2 * k));
      xo[t] = _mm512_castsi512_ps(_mm512_and_si512(pr, high));
      xe[t] = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, pr, 16));
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_loadu_si512(wk + 32 * j);
      const __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, high));
      const __m512 we = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, v, 16));
#pragma GCC unroll 8
      for (std::size_t t = 0; t < TT; ++t) {
        acc[t][j] = _mm512_fmadd_ps(wo, xo[t], acc[t][j]);
        acc[t][j] = _mm512_fmadd_ps(we, xe[t], acc[t][j]);
      }
    }
  }
}

/// Column pairs [k0, k1) of an AVX-512 panel of `bf16_pairs` weights with vdpbf16ps: per 32-bit
/// lane, acc += w[2k+1]·x[2k+1], then += w[2k]·x[2k], each rounded once (two multiply-adds per lane
/// and instruction: twice the F32 FMA's rate on Zen 4 and later).
template <std::size_t TT, class P>
SPECSAMPLE_TARGET_AVX512_BF16 SPECSAMPLE_ALWAYS_INLINE void avx512_dot_steps(__m512 (&acc)[TT][4], const std::uint16_t* w,
                                                                         const std::uint16_t* x, std::size_t ldx,
                                                                         std::size_t k0, std::size_t k1, P& pf) {
  for (std::size_t k = k0; k < k1; ++k) {
    const std::uint16_t* wk = w + k * 2 * panel;
    pf.step(wk);
    __m512i wv[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      wv[j] = _mm512_loadu_si512(wk + 32 * j);
      keep_in_register(wv[j]);
    }
#pragma GCC unroll 8
    for (std::size_t t = 0; t < TT; ++t) {
      const __m512i xb = _mm512_set1_epi32(load_lane(x + t * ldx + 2 * k));
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[t][j] = _mm512_dpbf16_ps(acc[t][j], (__m512bh)wv[j], (__m512bh)xb);
    }
  }
}

/// Stores rows [t0, t0 + TT) × the 64 outputs of panel p (+ bias) from the accumulators.
template <std::size_t TT>
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE void avx512_store_panel(const matmul_args& a, const __m512 (&acc)[TT][4],
                                                                      std::size_t p, std::size_t t0) {
  // (Fully unrolled, so that acc is only ever indexed by constants: Clang 14 kept an array indexed
  // at run time here in memory and stored every accumulator on every k step, which made a 5-token
  // append of the bundled target 2.4× as slow as with GCC.)
  const std::size_t o0 = p * panel;
  const std::size_t valid = std::min(panel, a.OC - o0);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const std::size_t lo = 16 * static_cast<std::size_t>(j);
    if (lo >= valid) continue;
    const __mmask16 m = avx512_first(valid - lo);
    const __m512 b = a.bias != nullptr ? _mm512_maskz_loadu_ps(m, a.bias + o0 + lo)
                                       : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (std::size_t t = 0; t < TT; ++t) {
      float* out = a.out + (t0 + t) * a.ldo + o0 + lo;
      const __m512 v = a.bias != nullptr ? _mm512_add_ps(acc[t][j], b) : acc[t][j];
      _mm512_mask_storeu_ps(out, m, v);
    }
  }
}

/// The part of a panel one tile call computes (`avx512_panels`): steps [k0, k1) of its `steps`;
/// the prefetch its steps share with the other tiles of its group of rows, and where the tile's
/// TT × 64 accumulators wait between blocks of steps (four bytes each: floats, or the INT8
/// kernels' int32 sums) — both null when the tile takes the panel whole (k0 = 0, k1 = steps) and
/// prefetches its own weights ahead.
struct panel_part {
  std::size_t k0, k1;
  block_prefetch* share;
  void* acc;
};

// A tile's accumulators, F32 or (the INT8 kernels') int32: zeroed, loaded from and stored to a
// panel_part's buffer of four-byte elements.
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE void acc_zero(__m512& v) { v = _mm512_setzero_ps(); }
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE void acc_zero(__m512i& v) { v = _mm512_setzero_si512(); }
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE void acc_load(__m512& v, const void* p) { v = _mm512_load_ps(p); }
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE void acc_load(__m512i& v, const void* p) { v = _mm512_load_si512(p); }
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE void acc_store(void* p, __m512 v) { _mm512_store_ps(p, v); }
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE void acc_store(void* p, __m512i v) { _mm512_store_si512(p, v); }

/// The accumulators of a tile at the start of its part: zero at the panel's first step, else as
/// the previous block left them in part.acc.
template <class V, std::size_t TT>
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE void avx512_resume(V (&acc)[TT][4], const panel_part& part) {
#pragma GCC unroll 8
  for (std::size_t t = 0; t < TT; ++t) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      if (part.k0 == 0) {
        acc_zero(acc[t][j]);
      } else {
        acc_load(acc[t][j], static_cast<const char*>(part.acc) + 64 * (4 * t + static_cast<std::size_t>(j)));
      }
    }
  }
}

/// Whether the part ends before the panel's last step: then its accumulators are kept in part.acc
/// for the next block (and true is returned) instead of being stored as outputs.
template <class V, std::size_t TT>
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE bool avx512_suspend(const V (&acc)[TT][4], const panel_part& part,
                                                                  std::size_t steps) {
  if (part.acc == nullptr || part.k1 >= steps) return false;
#pragma GCC unroll 8
  for (std::size_t t = 0; t < TT; ++t) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      acc_store(static_cast<char*>(part.acc) + 64 * (4 * t + static_cast<std::size_t>(j)), acc[t][j]);
    }
  }
  return true;
}

/// `avx512_pair_steps` (emulated BF16 pairs) or `avx512_steps` (F32, F16, BF16) of rows
/// [t0, t0 + TT) over weights w.
template <weight_format F, std::size_t TT, class P>
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE void avx512_any_steps(__m512 (&acc)[TT][4], const matmul_args& a,
                                                                    const weight_t<F>* w, std::size_t t0,
                                                                    std::size_t k0, std::size_t k1, P& pf) {
  if constexpr (F == weight_format::bf16_pairs) {
    avx512_pair_steps<TT>(acc, w, a.xh + t0 * a.ldxh, a.ldxh, k0, k1, pf);
  } else {
    avx512_steps<F, TT>(acc, w, a.x + t0 * a.ldx, a.ldx, k0, k1, pf);
  }
}

/// Rows [t0, t0 + TT) × the 64 outputs of panel p, over the steps of `part`.
template <weight_format F, std::size_t TT>
SPECSAMPLE_TARGET_AVX512 void avx512_panel(const matmul_args& a, std::size_t p, std::size_t t0,
                                          prefetch_window win, panel_part part) {
  using wt = weight_t<F>;
  constexpr std::size_t per = step_cols<F>;
  const std::size_t steps = packed_cols(F, a.K) / per;
  const wt* w = static_cast<const wt*>(a.w) + p * steps * per * panel;
  __m512 acc[TT][4];
  avx512_resume(acc, part);
  constexpr std::size_t row = per * panel * sizeof(wt);
  no_prefetch none;
  if (part.share == nullptr) {
    ahead_prefetch<row> ahead{win.ahead};
    const std::size_t k_pf = prefetched_steps(w, row, row, steps, win);
    avx512_any_steps<F, TT>(acc, a, w, t0, 0, k_pf, ahead);
    avx512_any_steps<F, TT>(acc, a, w, t0, k_pf, steps, none);
  } else {
    block_prefetch& share = *part.share;
    const std::size_t k_pf = share.take(part.k0, part.k1);
    block_prefetch::lines_cursor cur{share.pos, share.inc, share.lines};
    avx512_any_steps<F, TT>(acc, a, w, t0, part.k0, k_pf, cur);
    avx512_any_steps<F, TT>(acc, a, w, t0, k_pf, part.k1, none);
    share.pos = cur.pos;
  }
  if (!avx512_suspend(acc, part, steps)) avx512_store_panel<TT>(a, acc, p, t0);
}

/// `avx512_panel` of `bf16_pairs` weights with vdpbf16ps (CPUs with AVX512_BF16).
template <std::size_t TT>
SPECSAMPLE_TARGET_AVX512_BF16 void avx512_dot_panel(const matmul_args& a, std::size_t p, std::size_t t0,
                                                   prefetch_window win, panel_part part) {
  const std::size_t steps = packed_cols(weight_format::bf16_pairs, a.K) / 2;
  const std::uint16_t* w = static_cast<const std::uint16_t*>(a.w) + p * steps * 2 * panel;
  const std::uint16_t* x = a.xh + t0 * a.ldxh;
  __m512 acc[TT][4];
  avx512_resume(acc, part);
  constexpr std::size_t row = 2 * panel * sizeof(std::uint16_t);
  no_prefetch none;
  if (part.share == nullptr) {
    ahead_prefetch<row> ahead{win.ahead};
    const std::size_t k_pf = prefetched_steps(w, row, row, steps, win);
    avx512_dot_steps<TT>(acc, w, x, a.ldxh, 0, k_pf, ahead);
    avx512_dot_steps<TT>(acc, w, x, a.ldxh, k_pf, steps, none);
  } else {
    block_prefetch& share = *part.share;
    const std::size_t k_pf = share.take(part.k0, part.k1);
    block_prefetch::lines_cursor cur{share.pos, share.inc, share.lines};
    avx512_dot_steps<TT>(acc, w, x, a.ldxh, part.k0, k_pf, cur);
    avx512_dot_steps<TT>(acc, w, x, a.ldxh, k_pf, part.k1, none);
    share.pos = cur.pos;
  }
  if (!avx512_suspend(acc, part, steps)) avx512_store_panel<TT>(a, acc, p, t0);
}

/// How `row_tiles` cuts T rows into tiles of at most Max: `greedy`, tiles of Max rows from row 0
/// and one of the T mod Max rows left, if any (a panel taken whole comes from memory in its first
/// tile, whose multiply-adds the stream hides: the most rows go there); `balanced`, the fewest
/// tiles, their sizes differing by at most one, the larger first (tiles sharing each block's
/// stream: `avx512_panels`' blocks). Balanced tiles over whole panels of the bundled target
/// (weights in the L3) measured mixed: 7 and 8 rows 5–15% slower with BF16 pairs, 3–8% faster
/// with F16 weights (two alternating runs, medians of 300 calls, 2026-11-28).
enum class tiling : std::uint8_t { greedy, balanced };

/// Tiles `row_tiles` cuts T rows into, either way: ceil(T / Max).
template <std::size_t Max>
[[nodiscard]] constexpr std::size_t row_tile_count(std::size_t T) noexcept {
  return (T + Max - 1) / Max;
}

/// Calls f.template operator()<TT>(t) over the row tiles of T rows cut as `How` says, t the tile's
/// first row, in increasing t.
template <std::size_t Max, tiling How, class Fn>
SPECSAMPLE_ALWAYS_INLINE void row_tiles(std::size_t T, Fn&& f) {
  const auto run = [&](std::size_t rows, std::size_t t) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((rows == I + 1 ? f.template operator()<I + 1>(t) : void()), ...);
    }(std::make_index_sequence<Max>{});
  };
  const std::size_t tiles = row_tile_count<Max>(T);
  std::size_t t = 0;
  for (std::size_t i = 0; i < tiles; ++i) {
    const std::size_t rows = How == tiling::greedy ? std::min<std::size_t>(Max, T - t)
                                                   : T / tiles + (i < T % tiles ? 1 : 0);
    run(rows, t);
    t += rows;
  }
}

/// Bytes of a panel's weights each block of `avx512_panels` covers.
inline constexpr std::size_t avx512_block_bytes = 16384;

/// Panels [p_begin, p_end) of a call of a.T rows, `steps` steps of `row_bytes` each per panel, in
/// tiles of up to Tile rows: `tile.template operator()<TT>(p, t0, part)` computes rows
/// [t0, t0 + TT) of panel p over `part` (`win`: the call's prefetch window). Each tile takes each
/// panel whole, except in a call of streamed weights (`matmul_args::streamed`) of Tile + 1 to
/// `block_rows` rows — a verification of K = 6..11 drafts (4..11 for emulated BF16 pairs, whose
/// tiles hold 4 rows): there each panel goes in blocks of `avx512_block_bytes`, and every tile
/// runs over one block before any moves to the next, the steps of all of them sharing the
/// prefetch of the blocks ahead (`block_prefetch`), so the panel comes from memory once per call,
/// not once per tile. Measured on gpt2-xl's shape (random weights, F32, one thread, context 100;
/// two alternating runs of the headers before and after, medians of 5 calls): 7 tokens 308 → 262–269
/// ms, 9 tokens 331–335 → 253–272, 12 tokens 352–355 → 287–295, against 211–226 for one token. The
/// tiles there are balanced (`tiling::balanced`: 7 rows 4 + 3, not 6 + 1, whose single row ran
/// through its share of the steps, and of the prefetch, in a fraction of the time): on gpt2-medium's
/// shape 7 / 8 / 9 tokens 44.5–45.4 / 42.6–43.1 / 41.5–42.2 → 40.3–40.7 / 39.6–40.2 / 40.2–40.9 ms
/// with F32 weights, 28.8–29.0 / 29.4–29.6 / 30.6–30.9 → 25.1–25.3 / 27.5–27.6 / 30.5–30.6 with F16,
/// 22.5–23.2 / 22.2–22.8 / 21.6–22.3 → 21.3 / 20.8–20.9 / 21.1–21.3 with BF16 pairs, one token
/// 18–35 ms alike (two alternating runs, medians of 8 calls, 2026-11-28). For
/// models in the last-level cache (the bundled ones) the blocks measured 5–9% slower with F32 or
/// F16 weights, and for prefills of more rows, bound by the multiply-adds, 5% slower (hence the
/// two conditions). Every output is still one accumulator summed over k in order, kept between
/// blocks in a buffer: the same bits as a panel taken whole.
template <std::size_t Tile, class TileFn>
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE void avx512_panels(const matmul_args& a, std::size_t p_begin,
                                                                 std::size_t p_end, std::size_t steps,
                                                                 std::size_t row_bytes, prefetch_window win,
                                                                 TileFn&& tile) {
  if (!a.streamed || a.T <= static_cast<std::size_t>(Tile) || a.T > block_rows) {
    const panel_part whole{0, steps, nullptr, nullptr};
    for (std::size_t p = p_begin; p < p_end; ++p) {
      row_tiles<Tile, tiling::greedy>(a.T, [&]<std::size_t TT>(std::size_t t) { tile.template operator()<TT>(p, t, whole); });
    }
    return;
  }
  alignas(64) float acc[block_rows * panel];
  const std::size_t block = std::max<std::size_t>(1, avx512_block_bytes / row_bytes);
  const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(a.w);
  const std::size_t tiles = row_tile_count<Tile>(a.T);
  const block_prefetch share = block_prefetch::per_step(row_bytes, tiles);
  for (std::size_t p = p_begin; p < p_end; ++p) {
    // (At least one block, empty when K = 0: the tiles then store zero sums.)
    for (std::size_t k0 = 0; k0 == 0 || k0 < steps; k0 += block) {
      const std::size_t k1 = std::min(steps, k0 + block);
      block_prefetch pf = share.at(base + (p * steps + k0) * row_bytes, tiles * (k1 - k0), win);
      row_tiles<Tile, tiling::balanced>(a.T, [&]<std::size_t TT>(std::size_t t) {
        tile.template operator()<TT>(p, t, panel_part{k0, k1, &pf, acc + t * panel});
      });
    }
  }
}

template <weight_format F>
SPECSAMPLE_TARGET_AVX512 void matmul_avx512(const matmul_args& a, std::size_t p_begin,
                                          std::size_t p_end) {
  const prefetch_window win = window<F>(a, p_end);
  // Tiles of 6 rows (24 accumulators), of 4 for emulated BF16 pairs (their split operands).
  constexpr std::size_t tile = F == weight_format::bf16_pairs ? 4 : 6;
  constexpr std::size_t per = step_cols<F>;
  avx512_panels<tile>(a, p_begin, p_end, packed_cols(F, a.K) / per, per * panel * sizeof(weight_t<F>), win,
                      [&]<std::size_t TT>(std::size_t p, std::size_t t, panel_part part) {
                        avx512_panel<F, TT>(a, p, t, win, part);
                      });
}

/// `matmul_avx512` of `bf16_pairs` weights with vdpbf16ps (CPUs with AVX512_BF16).
SPECSAMPLE_TARGET_AVX512_BF16 inline void matmul_avx512_dot(const matmul_args& a, std::size_t p_begin,
                                                           std::size_t p_end) {
  const prefetch_window win = window<weight_format::bf16_pairs>(a, p_end);
  avx512_panels<6>(a, p_begin, p_end, packed_cols(weight_format::bf16_pairs, a.K) / 2,
                   2 * panel * sizeof(std::uint16_t), win, [&]<std::size_t TT>(std::size_t p, std::size_t t, panel_part part) {
                     avx512_dot_panel<TT>(a, p, t, win, part);
                   });
}

/// bf16_operand of 16 floats (the lanes of u as bits), in the low halves of the lanes.
SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE __m256i avx512_bf16_operands(__m512i u) {
  const __m512i exponent = _mm512_set1_epi32(0x7F800000), magnitude = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_maskz_srli_epi32(0xFFFF, _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, magnitude), exponent);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_maskz_srli_epi32(0xFFFF, u, 16), _mm512_set1_epi32(0x40)));
  const __mmask16 tiny = _mm512_testn_epi32_mask(u, exponent);  // zero or subnormal: ±0
  r = _mm512_mask_mov_epi32(r, tiny, _mm512_maskz_srli_epi32(0xFFFF, _mm512_and_si512(u, sign), 16));
  return _mm512_maskz_cvtepi32_epi16(0xFFFF, r);
}

/// dst[i] = bf16_operand(x[i]) for i < n, 16 at a time: whole vectors unmasked, the tail masked
/// (a masked 16-bit store per vector made this 1.3× as slow on Zen 4, vcvtneps2bf16 1.8×).
SPECSAMPLE_TARGET_AVX512 inline void bf16_operands_avx512(const float* x, std::size_t n, std::uint16_t* dst) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), avx512_bf16_operands(_mm512_loadu_si512(x + i)));
  }
  if (i < n) {
    const __mmask16 m = avx512_first(n - i);
    _mm256_mask_storeu_epi16(dst + i, m, avx512_bf16_operands(_mm512_maskz_loadu_epi32(m, x + i)));
  }
}

/// `bf16_operands_avx512` in one instruction per 16 floats (CPUs with AVX512_BF16): vcvtneps2bf16
/// rounds to nearest even, quiets a NaN the same way and takes subnormal inputs as ±0, exactly as
/// `bf16_operand` (a test compares the two on every kind of float).
SPECSAMPLE_TARGET_AVX512_BF16 inline void bf16_operands_avx512_bf16(const float* x, std::size_t n,
                                                                   std::uint16_t* dst) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
  }
  if (i < n) {
    const __mmask16 m = avx512_first(n - i);
    _mm256_mask_storeu_epi16(dst + i, m, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

// --- GELU (tanh form) as x·sigmoid(2u) = x / (1 + exp(−2u)), u = √(2/π)(x + 0.044715 x³) ------
// A Cephes-style exp (range reduction by ln 2, degree-5 polynomial, ~1 ulp). Elementwise with
// the tail masked (AVX-512) or zero-padded (AVX2), so every element gets the same instructions
// wherever it sits in the buffer.

using specsample::simd::avx512_exp;
using specsample::simd::avx2_exp;

SPECSAMPLE_TARGET_AVX512 SPECSAMPLE_ALWAYS_INLINE __m512 avx512_gelu(__m512 x) {
  const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  const __m512 u2 = _mm512_mul_ps(_mm512_fmadd_ps(_mm512_set1_ps(gelu_c), x3, x),
                                  _mm512_set1_ps(-2.0f * gelu_k));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), avx512_exp(u2)));
}

inline SPECSAMPLE_TARGET_AVX512 void gelu_avx512(float* out, const float* in, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, avx512_gelu(_mm512_loadu_ps(in + i)));
  if (i < n) {
    const __mmask16 m = avx512_first(n - i);
    _mm512_mask_storeu_ps(out + i, m, avx512_gelu(_mm512_maskz_loadu_ps(m, in + i)));
  }
}

SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE __m256 avx2_gelu(__m256 x) {
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  const __m256 u2 = _mm256_mul_ps(_mm256_fmadd_ps(_mm256_set1_ps(gelu_c), x3, x),
                                  _mm256_set1_ps(-2.0f * gelu_k));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), avx2_exp(u2)));
}

inline SPECSAMPLE_TARGET_AVX2 void gelu_avx2(float* out, const float* in, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, avx2_gelu(_mm256_loadu_ps(in + i)));
  if (i < n) {
    alignas(32) float buf[8] = {};
    std::memcpy(buf, in + i, (n - i) * sizeof(float));
    _mm256_store_ps(buf, avx2_gelu(_mm256_load_ps(buf)));
    std::memcpy(out + i, buf, (n - i) * sizeof(float));
  }
}

// --- layer norm, one row of C: mean and biased variance in two passes, then (x − mean)·rstd·w + b
// Each sum in four vector accumulators (16 or 8 lanes; the tail masked or padded so that it adds
// 0), a fixed order per C, so a row's result depends only on the row.

using specsample::simd::avx2_load_first;
using specsample::simd::avx2_store_first;

// The sum of a vector's 8 lanes: halves, then pairs, then the last two (a fixed order).
SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE float avx2_sum(__m256 a) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

inline SPECSAMPLE_TARGET_AVX512 void layer_norm_row_avx512(float* y, const float* x, const float* w,
                                                           const float* b, std::size_t C, float eps) {
  const float inv_c = 1.0f / static_cast<float>(C);
  // Σ term(i, k) over the row, k the lanes of x + i in range.
  const auto total = [C](auto term) SPECSAMPLE_TARGET_AVX512 {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    std::size_t i = 0;
    for (; i + 64 <= C; i += 64) {
      a0 = _mm512_add_ps(a0, term(i, 0xFFFF));
      a1 = _mm512_add_ps(a1, term(i + 16, 0xFFFF));
      a2 = _mm512_add_ps(a2, term(i + 32, 0xFFFF));
      a3 = _mm512_add_ps(a3, term(i + 48, 0xFFFF));
    }
    for (; i < C; i += 16) a0 = _mm512_add_ps(a0, term(i, avx512_first(C - i)));
    const __m512 a = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
    // (the maskz forms: GCC 12 warns about the _undefined operand of the plain ones)
    return avx2_sum(_mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xFF, a, 0), _mm512_maskz_extractf32x8_ps(0xFF, a, 1)));
  };
  const float mean = total([x](std::size_t i, __mmask16 k) SPECSAMPLE_TARGET_AVX512 {
    return _mm512_maskz_loadu_ps(k, x + i);
  }) * inv_c;
  const __m512 mv = _mm512_set1_ps(mean);
  const float var = total([x, mv](std::size_t i, __mmask16 k) SPECSAMPLE_TARGET_AVX512 {
    const __m512 d = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, x + i), mv);
    return _mm512_mul_ps(d, d);
  }) * inv_c;
  const __m512 rv = _mm512_set1_ps(1.0f / std::sqrt(var + eps));
  for (std::size_t i = 0; i < C; i += 16) {
    const __mmask16 k = avx512_first(C - i);
    const __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv), rv);
    _mm512_mask_storeu_ps(y + i, k, _mm512_fmadd_ps(d, _mm512_maskz_loadu_ps(k, w + i), _mm512_maskz_loadu_ps(k, b + i)));
  }
}

inline SPECSAMPLE_TARGET_AVX2 void layer_norm_row_avx2(float* y, const float* x, const float* w,
                                                       const float* b, std::size_t C, float eps) {
  const float inv_c = 1.0f / static_cast<float>(C);
  // Σ term(v) over the row's vectors v of x, the tail padded with `pad` (whose term is 0).
  const auto total = [x, C](float pad, auto term) SPECSAMPLE_TARGET_AVX2 {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    std::size_t i = 0;
    for (; i + 32 <= C; i += 32) {
      a0 = _mm256_add_ps(a0, term(_mm256_loadu_ps(x + i)));
      a1 = _mm256_add_ps(a1, term(_mm256_loadu_ps(x + i + 8)));
      a2 = _mm256_add_ps(a2, term(_mm256_loadu_ps(x + i + 16)));
      a3 = _mm256_add_ps(a3, term(_mm256_loadu_ps(x + i + 24)));
    }
    for (; i + 8 <= C; i += 8) a0 = _mm256_add_ps(a0, term(_mm256_loadu_ps(x + i)));
    if (i < C) a1 = _mm256_add_ps(a1, term(avx2_load_first(x + i, C - i, pad)));
    return avx2_sum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  };
  // (a capturing lambda: a captureless one's function-pointer conversion lacks the target)
  const float mean = total(0.0f, [&](__m256 v) SPECSAMPLE_TARGET_AVX2 { return v; }) * inv_c;
  const __m256 mv = _mm256_set1_ps(mean);
  const float var = total(mean, [mv](__m256 v) SPECSAMPLE_TARGET_AVX2 {
    const __m256 d = _mm256_sub_ps(v, mv);
    return _mm256_mul_ps(d, d);
  }) * inv_c;
  const __m256 rv = _mm256_set1_ps(1.0f / std::sqrt(var + eps));
  const auto out = [mv, rv](__m256 v, __m256 wv, __m256 bv) SPECSAMPLE_TARGET_AVX2 {
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_sub_ps(v, mv), rv), wv, bv);
  };
  std::size_t i = 0;
  for (; i + 8 <= C; i += 8) _mm256_storeu_ps(y + i, out(_mm256_loadu_ps(x + i), _mm256_loadu_ps(w + i), _mm256_loadu_ps(b + i)));
  if (i < C) {
    const std::size_t n = C - i;
    avx2_store_first(y + i, out(avx2_load_first(x + i, n, 0.0f), avx2_load_first(w + i, n, 0.0f), avx2_load_first(b + i, n, 0.0f)), n);
  }
}

// --- attention heads (scores a lane per key, values a lane per channel) ---------------------------
// A head's keys (transposed blocks) and values (rows) are one contiguous region each (the cache
// is head-major). Softmax is `softmax_row` with this level's vector exp (~1 ulp); the value
// sum keeps several vector accumulators in flight (one per 16 or 8 channels and query), p
// increasing per channel, so no channel's result depends on how many channels or queries are
// computed together.

// The attention loops below never issue a load for a vector wholly past the data (a load with an
// all-zero mask still costs a microcode assist on some CPUs when its address is on a page never
// touched): the number of vectors in flight is a template parameter. On the AVX-512 path the last
// one is masked; the AVX2 scores load it whole (its lanes past the keys lie in the same 16-key
// block, which the cache holds) and store only the valid lanes, and the AVX2 values take no
// partial vectors (the last HS mod 8 channels run one at a time).

/// AVX2 lane mask of the first n (0..8) lanes.
SPECSAMPLE_TARGET_AVX2 SPECSAMPLE_ALWAYS_INLINE __m256i avx2_first(std::size_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/// Vectors of 8 keys (or channels) an AVX2 pass takes for a tile of nq queries: the nq × N
/// accumulators, the N loaded vectors and a broadcast within the 16 ymm registers.
[[nodiscard]] constexpr std::size_t avx2_vectors(std::size_t nq) noexcept { return nq == 1 ? 4 : 2; }

/// Scores of NQ (1..6) queries against N vectors of 8 keys from key p0 (a multiple of 8), the
/// last `tail` lanes wide: att_i[p] = scale · Σ_d q_i[d]·k_p[d], d in order (one lane per key).
/// The queries share every key load; each score is still its own FMA chain. Every vector is
/// loaded whole: the last one's lanes past `tail` lie in the same 16-key block (the cache holds
/// whole blocks) and are computed but never stored.
template <std::size_t NQ, std::size_t N, weight_format F>
[[gnu::noinline]] SPECSAMPLE_TARGET_AVX2 prefetch_stream avx2_scores(const float* q, std::size_t ldq,
                                                             const weight_t<F>* kb, std::size_t HS,
                                                             std::size_t p0, std::size_t tail, float scale,
                                                             float* att, std::size_t ldatt,
                                                             prefetch_stream ahead) {
  const weight_t<F>* at[N];
#pragma GCC unroll 4
  for (std::size_t j = 0; j < N; ++j) {
    const std::size_t p = p0 + 8 * j;
    at[j] = kb + (p / key_block) * HS * key_block + p % key_block;
  }
  const __m256i last = avx2_first(tail);
  __m256 acc[NQ][N];
#pragma GCC unroll 8
  for (std::size_t i = 0; i < NQ; ++i) {
#pragma GCC unroll 4
    for (std::size_t j = 0; j < N; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  for (std::size_t d = 0; d < HS; ++d) {
    ahead.step();
    __m256 kv[N];
#pragma GCC unroll 4
    for (std::size_t j = 0; j < N; ++j) kv[j] = avx2_load_w<F>(at[j], d * key_block);
#pragma GCC unroll 8
    for (std::size_t i = 0; i < NQ; ++i) {
      const __m256 qd = _mm256_broadcast_ss(q + i * ldq + d);
#pragma GCC unroll 4
      for (std::size_t j = 0; j < N; ++j) acc[i][j] = _mm256_fmadd_ps(qd, kv[j], acc[i][j]);
    }
  }
  const __m256 sc = _mm256_set1_ps(scale);
#pragma GCC unroll 8
  for (std::size_t i = 0; i < NQ; ++i) {
    float* a = att + i * ldatt + p0;
#pragma GCC unroll 4
    for (std::size_t j = 0; j + 1 < N; ++j) _mm256_storeu_ps(a + 8 * j, _mm256_mul_ps(acc[i][j], sc));
    _mm256_maskstore_ps(a + 8 * (N - 1), last, _mm256_mul_ps(acc[i][N - 1], sc));
  }
  return ahead;
}

/// out_i[d0 + 8j + c] = Σ_{p < len0 + i} att_i[p]·v_p[d0 + 8j + c] for NQ (1..6) queries (query i
/// sees len0 + i positions) and N vectors of 8 channels, p in order for every query. The queries
/// share the value loads of the first len0 positions; query i then adds its i causal-tail
/// positions on its own (still in p order).
template <std::size_t NQ, std::size_t N, weight_format F>
[[gnu::noinline]] SPECSAMPLE_TARGET_AVX2 prefetch_stream avx2_values(const float* att, std::size_t ldatt,
                                                             const weight_t<F>* v, std::size_t len0,
                                                             std::size_t HS, std::size_t d0, float* out,
                                                             std::size_t ldo, prefetch_stream ahead) {
  __m256 o[NQ][N];
#pragma GCC unroll 8
  for (std::size_t i = 0; i < NQ; ++i) {
#pragma GCC unroll 4
    for (std::size_t j = 0; j < N; ++j) o[i][j] = _mm256_setzero_ps();
  }
  for (std::size_t p = 0; p < len0; ++p) {
    ahead.step();
    const weight_t<F>* vp = v + p * HS + d0;
    __m256 vv[N];
#pragma GCC unroll 4
    for (std::size_t j = 0; j < N; ++j) vv[j] = avx2_load_w<F>(vp, 8 * j);
#pragma GCC unroll 8
    for (std::size_t i = 0; i < NQ; ++i) {
      const __m256 a = _mm256_set1_ps(att[i * ldatt + p]);
#pragma GCC unroll 4
      for (std::size_t j = 0; j < N; ++j) o[i][j] = _mm256_fmadd_ps(a, vv[j], o[i][j]);
    }
  }
#pragma GCC unroll 8
  for (std::size_t i = 1; i < NQ; ++i) {  // the causal tail: query i also sees positions len0 .. len0 + i − 1
    for (std::size_t p = len0; p < len0 + i; ++p) {
      const weight_t<F>* vp = v + p * HS + d0;
      const __m256 a = _mm256_set1_ps(att[i * ldatt + p]);
#pragma GCC unroll 4
      for (std::size_t j = 0; j < N; ++j) {
        o[i][j] = _mm256_fmadd_ps(a, avx2_load_w<F>(vp, 8 * j), o[i][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (std::size_t i = 0; i < NQ; ++i) {
#pragma GCC unroll 4
    for (std::size_t j = 0; j < N; ++j) _mm256_storeu_ps(out + i * ldo + d0 + 8 * j, o[i][j]);
  }
  return ahead;
}

/// nq (1..query_group) consecutive queries of one head (query i sees len0 + i positions) as
/// `query_tiles` tiles, interleaved pass by pass: each pass of 8 ·
/// avx2_vectors keys over the channels runs for every tile before the next pass, so the later
/// tiles read keys the first one just brought in; per-query softmax; then the values likewise in
/// passes of as many channels, the last HS mod 8 channels one at a time. How many queries run
/// together, and in which tiles, changes no query's result.
template <weight_format F>
SPECSAMPLE_TARGET_AVX2 prefetch_stream attend_avx2(const float* q, std::size_t ldq, std::size_t nq, const weight_t<F>* kb,
                                                 const weight_t<F>* v, std::size_t len0, std::size_t HS, float scale,
                                                 float* att, std::size_t ldatt, float* out, std::size_t ldo,
                                                 prefetch_stream ahead) {
  const query_tiles tiles(nq);
  // Every tile's pass width: tiles of several queries take 2 vectors, a lone query 4 (and runs
  // alone: a group of several tiles has at least 3 queries in each).
  const std::size_t step = 8 * static_cast<std::size_t>(avx2_vectors(tiles.size(0)));
  const std::size_t len = len0 + nq - 1;  // keys scored (the last query's); row i uses len0 + i
  for (std::size_t p0 = 0; p0 < len; p0 += step) {
    tiles.each([&]<std::size_t NQ>(std::size_t t) {
      constexpr std::size_t V = avx2_vectors(NQ);
      const std::size_t keys = len0 + t + NQ - 1;  // the tile's
      if (p0 >= keys) return;
      const std::size_t n = std::min(8 * V, keys - p0), vecs = (n + 7) / 8, tail = n - 8 * (vecs - 1);
      const float* qt = q + t * ldq;
      float* at = att + t * ldatt;
      switch (vecs) {  // (vecs <= V)
        case 1: ahead = avx2_scores<NQ, 1, F>(qt, ldq, kb, HS, p0, tail, scale, at, ldatt, ahead); break;
        case 2: ahead = avx2_scores<NQ, 2, F>(qt, ldq, kb, HS, p0, tail, scale, at, ldatt, ahead); break;
        case 3:
          if constexpr (V >= 3) ahead = avx2_scores<NQ, 3, F>(qt, ldq, kb, HS, p0, tail, scale, at, ldatt, ahead);
          break;
        default:
          if constexpr (V >= 4) ahead = avx2_scores<NQ, 4, F>(qt, ldq, kb, HS, p0, tail, scale, at, ldatt, ahead);
          break;
      }
    });
  }
  for (std::size_t i = 0; i < nq; ++i) softmax_row(isa::avx2, att + i * ldatt, len0 + i);
  std::size_t d = 0;
  for (; HS - d >= step; d += step) {
    tiles.each([&]<std::size_t NQ>(std::size_t t) {
      ahead = avx2_values<NQ, avx2_vectors(NQ), F>(att + t * ldatt, ldatt, v, len0 + t, HS, d, out + t * ldo, ldo, ahead);
    });
  }
  tiles.each([&]<std::size_t NQ>(std::size_t t) {
    constexpr std::size_t V = avx2_vectors(NQ);
    const float* at = att + t * ldatt;
    float* ot = out + t * ldo;
    switch ((HS - d) / 8) {  // (< V)
      case 1: ahead = avx2_values<NQ, 1, F>(at, ldatt, v, len0 + t, HS, d, ot, ldo, ahead); break;
      case 2:
        if constexpr (V >= 3) ahead = avx2_values<NQ, 2, F>(at, ldatt, v, len0 + t, HS, d, ot, ldo, ahead);
        break;
      case 3:
        if constexpr (V >= 4) ahead = avx2_values<NQ, 3, F>(at, ldatt, v, len0 + t, HS, d, ot, ldo, ahead);
        break;
      default: break;
    }
  });
  d += (HS - d) / 8 * 8;
  for (std::size_t i = 0; i < nq; ++i) {  // the last HS mod 8 channels, one at a time
    const float* a = att + i * ldatt;
    for (std::size_t c = d; c < HS; ++c) {
      float o = 0;
      for (std::size_t p = 0; p < len0 + i; ++p) {
        o = std::fma(a[p], load_scalar<F>(v, p * HS + c), o);
      }
      out[i * ldo + c] = o;
    }
  }
  return ahead;
}

/// Scores of NQ (1..6) queries against N (1..4) key blocks from key p0 (a multiple of 16), the
/// last `tail` keys wide: att_i[p] = scale · Σ_d q_i[d]·k_p[d], d in order (one lane per key).
/// The queries share every key load; each score is still its own FMA chain. (Every loop over i
/// and j is unrolled so that the NQ × N accumulators live in registers.) Returns `ahead` as far
/// as this pass advanced it.
///
/// The score and value passes (here and on the AVX2 path) are functions of their own, not inlined
/// into `attend_*`: inlined, every attend_avx512<NQ> held 8 fully unrolled passes, and clang++ 14
/// with ASan + UBSan took 38 of the 67–86 s of a test TU on them (`-ftime-trace`, Zen 4,
/// 2026-11-23); apart, that TU compiles in 44 s. A call per 64 keys or 64 channels costs nothing
/// measurable: the minima of 1- and 5-token appends of the bundled target moved by −0.7 to +1.6%
/// with no consistent sign (1000 calls each, four alternating pairs), those of the draft's 1- and
/// 4-token appends by under 0.3% (4000 calls, three pairs).
template <std::size_t NQ, std::size_t N, weight_format F>
[[gnu::noinline]] SPECSAMPLE_TARGET_AVX512 prefetch_stream avx512_scores(const float* q, std::size_t ldq,
                                                                 const weight_t<F>* kb, std::size_t HS,
                                                                 std::size_t p0, std::size_t tail, float scale,
                                                                 float* att, std::size_t ldatt,
                                                                 prefetch_stream ahead) {
  const weight_t<F>* b0 = kb + (p0 / key_block) * HS * key_block;
  const std::size_t bs = HS * key_block;
  const __mmask16 last = avx512_first(tail);
  __m512 acc[NQ][N];
#pragma GCC unroll 8
  for (std::size_t i = 0; i < NQ; ++i) {
#pragma GCC unroll 4
    for (std::size_t j = 0; j < N; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  for (std::size_t d = 0; d < HS; ++d) {
    ahead.step();
    const weight_t<F>* row = b0 + d * key_block;
    __m512 kv[N];
#pragma GCC unroll 4
    for (std::size_t j = 0; j + 1 < N; ++j) kv[j] = avx512_load_w<F>(row, j * bs);
    kv[N - 1] = avx512_maskload_w<F>(row, (N - 1) * bs, last);
#pragma GCC unroll 8
    for (std::size_t i = 0; i < NQ; ++i) {
      const __m512 qd = _mm512_set1_ps(q[i * ldq + d]);
#pragma GCC unroll 4
      for (std::size_t j = 0; j < N; ++j) acc[i][j] = _mm512_fmadd_ps(qd, kv[j], acc[i][j]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 8
  for (std::size_t i = 0; i < NQ; ++i) {
    float* a = att + i * ldatt + p0;
#pragma GCC unroll 4
    for (std::size_t j = 0; j + 1 < N; ++j) _mm512_storeu_ps(a + 16 * j, _mm512_mul_ps(acc[i][j], sc));
    _mm512_mask_storeu_ps(a + 16 * (N - 1), last, _mm512_mul_ps(acc[i][N - 1], sc));
  }
  return ahead;
}

/// out_i[d0 + 16j + c] = Σ_{p < len0 + i} att_i[p]·v_p[d0 + 16j + c] for NQ (1..6) queries (query i
/// sees len0 + i positions) and N (1..4) vectors of channels, the last `tail` channels wide; p in
/// order for every query. The queries share the value loads of the first len0 positions; query i
/// then adds its i causal-tail positions on its own (still in p order).
template <std::size_t NQ, std::size_t N, weight_format F>
[[gnu::noinline]] SPECSAMPLE_TARGET_AVX512 prefetch_stream avx512_values(const float* att, std::size_t ldatt,
                                                                 const weight_t<F>* v, std::size_t len0,
                                                                 std::size_t HS, std::size_t d0, std::size_t tail,
                                                                 float* out, std::size_t ldo,
                                                                 prefetch_stream ahead) {
  const __mmask16 last = avx512_first(tail);
  __m512 o[NQ][N];
#pragma GCC unroll 8
  for (std::size_t i = 0; i < NQ; ++i) {
#pragma GCC unroll 4
    for (std::size_t j = 0; j < N; ++j) o[i][j] = _mm512_setzero_ps();
  }
  for (std::size_t p = 0; p < len0; ++p) {
    ahead.step();
    const weight_t<F>* vp = v + p * HS + d0;
    __m512 vv[N];
#pragma GCC unroll 4
    for (std::size_t j = 0; j + 1 < N; ++j) vv[j] = avx512_load_w<F>(vp, 16 * j);
    vv[N - 1] = avx512_maskload_w<F>(vp, 16 * (N - 1), last);
#pragma GCC unroll 8
    for (std::size_t i = 0; i < NQ; ++i) {
      const __m512 a = _mm512_set1_ps(att[i * ldatt + p]);
#pragma GCC unroll 4
      for (std::size_t j = 0; j < N; ++j) o[i][j] = _mm512_fmadd_ps(a, vv[j], o[i][j]);
    }
  }
#pragma GCC unroll 8
  for (std::size_t i = 1; i < NQ; ++i) {  // the causal tail: query i also sees positions len0 .. len0 + i − 1
    for (std::size_t p = len0; p < len0 + i; ++p) {
      const weight_t<F>* vp = v + p * HS + d0;
      const __m512 a = _mm512_set1_ps(att[i * ldatt + p]);
#pragma GCC unroll 4
      for (std::size_t j = 0; j + 1 < N; ++j) {
        o[i][j] = _mm512_fmadd_ps(a, avx512_load_w<F>(vp, 16 * j), o[i][j]);
      }
      o[i][N - 1] = _mm512_fmadd_ps(a, avx512_maskload_w<F>(vp, 16 * (N - 1), last),
                                    o[i][N - 1]);
    }
  }
#pragma GCC unroll 8
  for (std::size_t i = 0; i < NQ; ++i) {
    float* oi = out + i * ldo + d0;
#pragma GCC unroll 4
    for (std::size_t j = 0; j + 1 < N; ++j) _mm512_storeu_ps(oi + 16 * j, o[i][j]);
    _mm512_mask_storeu_ps(oi + 16 * (N - 1), last, o[i][N - 1]);
  }
  return ahead;
}

/// nq (1..query_group) consecutive queries of one head (query i sees len0 + i positions) as
/// `query_tiles` tiles, interleaved pass by pass: scores of up to 64 keys per pass over the
/// channels, each pass for every tile before the next (the later tiles read the keys the first
/// one just brought in), per-query softmax, then values in passes of up to 64 channels likewise.
template <weight_format F>
SPECSAMPLE_TARGET_AVX512 prefetch_stream attend_avx512(const float* q, std::size_t ldq, std::size_t nq, const weight_t<F>* kb,
                                                     const weight_t<F>* v, std::size_t len0, std::size_t HS, float scale,
                                                     float* att, std::size_t ldatt, float* out, std::size_t ldo,
                                                     prefetch_stream ahead) {
  const query_tiles tiles(nq);
  const std::size_t len = len0 + nq - 1;  // keys scored (the last query's); row i uses len0 + i
  for (std::size_t p0 = 0; p0 < len; p0 += 64) {
    tiles.each([&]<std::size_t NQ>(std::size_t t) {
      const std::size_t keys = len0 + t + NQ - 1;  // the tile's
      if (p0 >= keys) return;
      const std::size_t n = std::min<std::size_t>(64, keys - p0), vecs = (n + 15) / 16, tail = n - 16 * (vecs - 1);
      const float* qt = q + t * ldq;
      float* at = att + t * ldatt;
      switch (vecs) {
        case 1: ahead = avx512_scores<NQ, 1, F>(qt, ldq, kb, HS, p0, tail, scale, at, ldatt, ahead); break;
        case 2: ahead = avx512_scores<NQ, 2, F>(qt, ldq, kb, HS, p0, tail, scale, at, ldatt, ahead); break;
        case 3: ahead = avx512_scores<NQ, 3, F>(qt, ldq, kb, HS, p0, tail, scale, at, ldatt, ahead); break;
        default: ahead = avx512_scores<NQ, 4, F>(qt, ldq, kb, HS, p0, tail, scale, at, ldatt, ahead); break;
      }
    });
  }
  for (std::size_t i = 0; i < nq; ++i) softmax_row(isa::avx512, att + i * ldatt, len0 + i);
  for (std::size_t d = 0; d < HS; d += 64) {
    const std::size_t n = std::min<std::size_t>(64, HS - d), vecs = (n + 15) / 16, tail = n - 16 * (vecs - 1);
    tiles.each([&]<std::size_t NQ>(std::size_t t) {
      const float* at = att + t * ldatt;
      float* ot = out + t * ldo;
      switch (vecs) {
        case 1: ahead = avx512_values<NQ, 1, F>(at, ldatt, v, len0 + t, HS, d, tail, ot, ldo, ahead); break;
        case 2: ahead = avx512_values<NQ, 2, F>(at, ldatt, v, len0 + t, HS, d, tail, ot, ldo, ahead); break;
        case 3: ahead = avx512_values<NQ, 3, F>(at, ldatt, v, len0 + t, HS, d, tail, ot, ldo, ahead); break;
        default: ahead = avx512_values<NQ, 4, F>(at, ldatt, v, len0 + t, HS, d, tail, ot, ldo, ahead); break;
      }
    });
  }
  return ahead;
}

#endif  // SPECSAMPLE_X86

/// Steps of `attend` on `level` for nq queries, query i over len0 + i positions, head size HS:
/// each step advances the prefetch walk by `prefetch_stream::per_step` lines. One step per
/// channel of every score pass and per position of every value pass; the generic path takes
/// none (it does not prefetch). A test checks it against the kernels' walk.
[[nodiscard]] inline std::size_t attend_steps(isa level, std::size_t nq, std::size_t len0, std::size_t HS) noexcept {
  std::size_t steps = 0;
  const query_tiles tiles(nq);
  for (std::size_t s = 0; s < tiles.n; ++s) {  // each tile's passes
    const std::size_t m = tiles.size(s), first = len0 + tiles.first(s), keys = first + m - 1;
#if SPECSAMPLE_X86
    if (avx512_kernels && level == isa::avx512) {
      steps += (keys + 63) / 64 * HS + (HS + 63) / 64 * first;
    } else if (level == isa::avx2) {
      // Passes of 8 · avx2_vectors(m) keys or channels; the values' last pass takes the rest in
      // whole vectors (the last HS mod 8 channels run without steps).
      const std::size_t w = 8 * static_cast<std::size_t>(avx2_vectors(m));
      steps += (keys + w - 1) / w * HS + (HS / w + (HS % w >= 8 ? 1 : 0)) * first;
    }
#else
    (void)level, (void)keys, (void)HS;
#endif
  }
  return steps;
}

/// `nq` (1..query_group) consecutive queries of one attention head with the kernels of `level`:
/// query i (at q + i·ldq) attends to len0 + i positions; its scores go to att + i·ldatt (room for
/// len0 + nq − 1 floats), its output to out + i·ldo. Every query's result is exactly that of
/// `attend_generic`'s fixed order on this level — whether it runs alone or in a tile. The vector
/// paths prefetch `ahead` (the next head's keys and values) as they go, `attend_steps` steps of
/// it, and return the rest of the walk. Keys and values are held in F: F32, or F16
/// (`options::kv_storage`), converted exactly to F32 as they are loaded.
#ifdef SPECSAMPLE_ATTENTION_KERNELS
template <weight_format F = weight_format::f32>
SPECSAMPLE_ATTENTION_KERNELS prefetch_stream attend(isa level, const float* q, std::size_t ldq, std::size_t nq,
                                                    const weight_t<F>* kb, const weight_t<F>* v, std::size_t len0,
                                                    std::size_t HS, float scale, float* att, std::size_t ldatt, float* out,
                                                    std::size_t ldo, prefetch_stream ahead = {}) noexcept {
  static_assert(F == weight_format::f32 || F == weight_format::f16, "the KV cache is F32 or F16");
  assert(nq >= 1 && nq <= query_group);
#if SPECSAMPLE_X86
  if (avx512_kernels && level == isa::avx512) return attend_avx512<F>(q, ldq, nq, kb, v, len0, HS, scale, att, ldatt, out, ldo, ahead);
  if (level == isa::avx2) return attend_avx2<F>(q, ldq, nq, kb, v, len0, HS, scale, att, ldatt, out, ldo, ahead);
#endif
  for (std::size_t i = 0; i < nq; ++i) {
    attend_generic<F>(q + i * ldq, kb, v, len0 + i, HS, scale, att + i * ldatt, out + i * ldo);
  }
  (void)level;
  return ahead;  // the generic path does not prefetch
}
#ifdef SPECSAMPLE_DEFINE_ATTENTION_KERNELS
#define SPECSAMPLE_ATTEND(F)                                                                                       \
  template prefetch_stream attend<F>(isa, const float*, std::size_t, std::size_t, const weight_t<F>*, const weight_t<F>*, \
                          std::size_t, std::size_t, float, float*, std::size_t, float*, std::size_t,          \
                          prefetch_stream) noexcept;
SPECSAMPLE_ATTEND(weight_format::f32)
SPECSAMPLE_ATTEND(weight_format::f16)
#undef SPECSAMPLE_ATTEND
#endif
#else
template <weight_format F = weight_format::f32>
prefetch_stream attend(isa level, const float* q, std::size_t ldq, std::size_t nq, const weight_t<F>* kb, const weight_t<F>* v,
                       std::size_t len0, std::size_t HS, float scale, float* att, std::size_t ldatt, float* out,
                       std::size_t ldo, prefetch_stream ahead = {}) noexcept;
#endif

#if SPECSAMPLE_X86
/// Quads [k0, k1) of an AVX-512 INT8 panel with vpdpbusd: per 32-bit lane, the four products of
/// the row's unsigned operand bytes and the output's signed weight bytes, added exactly.
template <std::size_t TT, class P>
SPECSAMPLE_TARGET_AVX512_VNNI SPECSAMPLE_ALWAYS_INLINE void avx512_vnni_steps(__m512i (&acc)[TT][4], const std::int8_t* w,
                                                                          const std::uint8_t* x, std::size_t ldx,
                                                                          std::size_t k0, std::size_t k1, P& pf) {
  for (std::size_t k = k0; k < k1; ++k) {
    const std::int8_t* wk = w + k * 4 * panel;
    pf.step(wk);
    __m512i wv[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      wv[j] = _mm512_loadu_si512(wk + 64 * j);
      keep_in_register(wv[j]);
    }
#pragma GCC unroll 8
    for (std::size_t t = 0; t < TT; ++t) {
      const __m512i xb = _mm512_set1_epi32(load_lane(x + t * ldx + 4 * k));
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[t][j] = _mm512_dpbusd_epi32(acc[t][j], xb, wv[j]);
    }
  }
}

/// Rows [t0, t0 + TT) × the 64 outputs of INT8 panel p with vpdpbusd, and the epilogue of
/// `i8_output` in vectors (the same operations).
template <std::size_t TT>
SPECSAMPLE_TARGET_AVX512_VNNI void avx512_vnni_panel(const matmul_args& a, const i8_meta& meta, std::size_t p,
                                                    std::size_t t0, prefetch_window win, panel_part part) {
  const std::size_t steps = packed_cols(weight_format::i8_quads, a.K) / 4;
  const std::int8_t* w = static_cast<const std::int8_t*>(a.w) + p * steps * 4 * panel;
  __m512i acc[TT][4];
  avx512_resume(acc, part);
  const std::uint8_t* x = a.xq + t0 * a.ldxq;
  constexpr std::size_t row = 4 * panel;
  no_prefetch none;
  if (part.share == nullptr) {
    ahead_prefetch<row> ahead{win.ahead};
    const std::size_t k_pf = prefetched_steps(w, row, row, steps, win);
    avx512_vnni_steps<TT>(acc, w, x, a.ldxq, 0, k_pf, ahead);
    avx512_vnni_steps<TT>(acc, w, x, a.ldxq, k_pf, steps, none);
  } else {
    block_prefetch& share = *part.share;
    const std::size_t k_pf = share.take(part.k0, part.k1);
    block_prefetch::lines_cursor cur{share.pos, share.inc, share.lines};
    avx512_vnni_steps<TT>(acc, w, x, a.ldxq, part.k0, k_pf, cur);
    avx512_vnni_steps<TT>(acc, w, x, a.ldxq, k_pf, part.k1, none);
    share.pos = cur.pos;
  }
  if (avx512_suspend(acc, part, steps)) return;
  const std::size_t o0 = p * panel;
  const std::size_t valid = std::min(panel, a.OC - o0);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const std::size_t lo = 16 * static_cast<std::size_t>(j);
    if (lo >= valid) continue;
    const __mmask16 m = avx512_first(valid - lo);
    const __m512 scale = _mm512_maskz_loadu_ps(m, meta.scale + o0 + lo);
    const __m512i offset = _mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_loadu_epi32(m, meta.sum + o0 + lo), 7);
    const __m512 b = a.bias != nullptr ? _mm512_maskz_loadu_ps(m, a.bias + o0 + lo) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (std::size_t t = 0; t < TT; ++t) {
      const __m512 d = _mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_sub_epi32(acc[t][j], offset));
      const __m512 s = _mm512_mul_ps(scale, _mm512_set1_ps(a.xs[t0 + t]));
      const __m512 y = a.bias != nullptr ? _mm512_fmadd_ps(d, s, b) : _mm512_mul_ps(d, s);
      _mm512_mask_storeu_ps(a.out + (t0 + t) * a.ldo + o0 + lo, m, y);
    }
  }
}

/// INT8 panels with vpdpbusd (CPUs with AVX512_VNNI): tiles of up to 6 rows.
SPECSAMPLE_TARGET_AVX512_VNNI inline void matmul_avx512_vnni(const matmul_args& a, std::size_t p_begin,
                                                            std::size_t p_end) {
  const prefetch_window win = window<weight_format::i8_quads>(a, p_end);
  const i8_meta meta = i8_meta_of(a.w, a.OC, a.K);
  avx512_panels<6>(a, p_begin, p_end, packed_cols(weight_format::i8_quads, a.K) / 4, 4 * panel, win,
                   [&]<std::size_t TT>(std::size_t p, std::size_t t, panel_part part) {
                     avx512_vnni_panel<TT>(a, meta, p, t, win, part);
                   });
}

// --- AMX: a panel of 64 outputs (4 tiles of 16) × up to 16 rows per tile dot product -------------
// TDPBF16PS and TDPBUSD multiply a tile of up to 16 rows × 64 bytes of operands (32 BF16 or 64
// bytes) by a tile of 16 rows × 64 bytes of weights in the "VNNI" layout — row i holds the pairs
// (quads) of steps 16·k0 + i of 16 outputs — which is what `bf16_pairs` and `i8_quads` panels are:
// the 16-output quarter j of 16 consecutive steps is a tile at stride 256 bytes, 64·j bytes into
// the panel's first step. One instruction takes the 16 steps of up to 16 rows at the same
// throughput, so a call of 2..16 rows costs the multiply-adds of one, and the weights still
// stream once per call: a verification of K ≤ 15 drafts pays only for what is not a matmul.
//
// Numerics. INT8: exact integer sums, the same bits as vpdpbusd and every other level. BF16: the
// products are exact, but TDPBF16PS adds each 32-column block of them into the accumulator in its
// own order and rounding, not vdpbf16ps's sequence of fused steps (on a Xeon of family 6, model
// 207, 43% of the outputs of random 32-column blocks differ in their last bit or so): the BF16 matmuls on
// tiles are their own arithmetic, close to the other levels' (tests bound the difference), and
// like them the same for every row of the tile, every T and every thread split: which rows share
// a tile never changes an output, and every output sums its blocks in k order. A model either uses
// tiles for all its calls or for none (`options::amx`).

/// LDTILECFG's 64-byte operand, palette 1: tiles 0–3 the accumulators (rows × 16 lanes), tile 4
/// the rows' operands (rows × 64 bytes), tiles 5–7 weights (16 × 64 bytes).
struct alignas(64) amx_config {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};

  explicit amx_config(std::size_t R) noexcept {
    for (int i = 0; i < 8; ++i) {
      bytes_per_row[i] = 64;
      rows[i] = static_cast<std::uint8_t>(i < 5 ? R : amx_steps);
    }
  }
};

/// Rows [t0, t0 + R) × the 64 outputs of panel p from their sums at `buf` (R rows of 64 four-byte
/// sums, as the tiles left them): + bias, or for INT8 `i8_output`'s operations (those of
/// `avx512_vnni_panel`).
template <weight_format F>
SPECSAMPLE_TARGET_AVX512 void amx_epilogue(const matmul_args& a, const i8_meta& meta, const std::int32_t* buf,
                                          std::size_t p, std::size_t t0, std::size_t R) {
  const std::size_t o0 = p * panel;
  const std::size_t valid = std::min(panel, a.OC - o0);
  for (std::size_t lo = 0; lo < valid; lo += 16) {
    const __mmask16 m = avx512_first(valid - lo);
    const __m512 b = a.bias != nullptr ? _mm512_maskz_loadu_ps(m, a.bias + o0 + lo) : _mm512_setzero_ps();
    if constexpr (F == weight_format::bf16_pairs) {
      for (std::size_t t = 0; t < R; ++t) {
        const __m512 v = _mm512_load_ps(reinterpret_cast<const float*>(buf + t * panel + lo));
        _mm512_mask_storeu_ps(a.out + (t0 + t) * a.ldo + o0 + lo, m, a.bias != nullptr ? _mm512_add_ps(v, b) : v);
      }
    } else {
      const __m512 scale = _mm512_maskz_loadu_ps(m, meta.scale + o0 + lo);
      const __m512i offset = _mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_loadu_epi32(m, meta.sum + o0 + lo), 7);
      for (std::size_t t = 0; t < R; ++t) {
        const __m512i acc = _mm512_load_si512(buf + t * panel + lo);
        const __m512 d = _mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_sub_epi32(acc, offset));
        const __m512 s = _mm512_mul_ps(scale, _mm512_set1_ps(a.xs[t0 + t]));
        const __m512 y = a.bias != nullptr ? _mm512_fmadd_ps(d, s, b) : _mm512_mul_ps(d, s);
        _mm512_mask_storeu_ps(a.out + (t0 + t) * a.ldo + o0 + lo, m, y);
      }
    }
  }
}

/// Rows from which an INT8 matmul takes the tiles: the same bits either way. Below it the AVX-512
/// VNNI kernel is faster (a draft's single-token calls: a 512 × 128 matrix, one row 0.89 µs
/// against 1.07 on tiles); from it the tiles win on wide matrices (1536 × 384, 4 rows: 7.57 against
/// 7.83 µs) and lose a little on narrow ones up to ~8 rows (512 × 128, 4 rows: 1.74 against 1.33;
/// 9 rows: 2.40 against 2.81), a 128-wide draft's rare calls of several tokens (scratch programs,
/// medians of 2000 and 4000 calls, Xeon family 6 model 207, 2026-12-01).
inline constexpr std::size_t amx_int8_rows = 4;

/// Panels [p_begin, p_end) of a `bf16_pairs` or `i8_quads` matmul on AMX tiles (`amx_fits`): rows
/// in blocks of 16 (the last one shorter), each block over all the panels; per panel the four
/// accumulator tiles over every 16-step block, then `amx_epilogue`.
template <weight_format F>
SPECSAMPLE_TARGET_AMX void matmul_amx(const matmul_args& a, std::size_t p_begin, std::size_t p_end) {
  static_assert(F == weight_format::bf16_pairs || F == weight_format::i8_quads);
  constexpr std::size_t per = step_cols<F>;
  constexpr std::size_t row = per * panel * format_bytes(F);  // bytes of one step of a panel
  const std::size_t steps = packed_cols(F, a.K) / per;
  const i8_meta meta = F == weight_format::i8_quads ? i8_meta_of(a.w, a.OC, a.K) : i8_meta{nullptr, nullptr};
  const std::size_t ldx = F == weight_format::bf16_pairs ? a.ldxh * 2 : a.ldxq;  // bytes per row
  alignas(64) std::int32_t buf[amx_steps * panel];
  for (std::size_t t0 = 0; t0 < a.T; t0 += amx_steps) {
    const std::size_t R = std::min(amx_steps, a.T - t0);
    if (t0 == 0 || R < amx_steps) {
      const amx_config cfg(R);
      // LDTILECFG's and TILELOADD's asm name only the configuration's first 8 bytes, and no
      // memory at all: the barrier makes every store before it (the configuration, the rows'
      // operands where the caller is inlined) happen first.
      asm volatile("" ::: "memory");
      _tile_loadconfig(&cfg);
    }
    const auto* x = F == weight_format::bf16_pairs ? reinterpret_cast<const unsigned char*>(a.xh + t0 * a.ldxh)
                                                   : a.xq + t0 * a.ldxq;
    for (std::size_t p = p_begin; p < p_end; ++p) {
      const auto* w = static_cast<const unsigned char*>(a.w) + p * steps * row;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (std::size_t s = 0; s < steps; s += amx_steps) {
        const unsigned char* ws = w + s * row;
        _tile_loadd(4, x + s * per * format_bytes(F), ldx);
        _tile_loadd(5, ws, row);
        _tile_loadd(6, ws + 64, row);
        _tile_loadd(7, ws + 128, row);
        if constexpr (F == weight_format::bf16_pairs) {
          _tile_dpbf16ps(0, 4, 5);
          _tile_loadd(5, ws + 192, row);
          _tile_dpbf16ps(1, 4, 6);
          _tile_dpbf16ps(2, 4, 7);
          _tile_dpbf16ps(3, 4, 5);
        } else {
          _tile_dpbusd(0, 4, 5);
          _tile_loadd(5, ws + 192, row);
          _tile_dpbusd(1, 4, 6);
          _tile_dpbusd(2, 4, 7);
          _tile_dpbusd(3, 4, 5);
        }
      }
      _tile_stored(0, buf, 4 * panel);
      _tile_stored(1, buf + 16, 4 * panel);
      _tile_stored(2, buf + 32, 4 * panel);
      _tile_stored(3, buf + 48, 4 * panel);
      // TILESTORED's asm names no memory operand (GCC 12's amxtileintrin.h): without the barrier
      // the compiler may read buf before the stores, as memory nothing wrote.
      asm volatile("" ::: "memory");
      amx_epilogue<F>(a, meta, buf, p, t0, R);
    }
  }
  // The tiles back to their initial state, so that the thread's context switches and signal frames
  // need not save them (it costs nothing measurable: a 512 × 128 BF16 matmul of one row 1.48 µs
  // with and without, alternating calls, Xeon family 6 model 207, 2026-12-01).
  _tile_release();
}

/// One INT8 operand row with AVX2: `i8_operand_row_generic`'s bytes and scale (the maximum of
/// magnitudes, then x · inverse clamped and rounded to nearest even: the same operations; the
/// tail of fewer than 8 columns by the generic code).
SPECSAMPLE_TARGET_AVX2 inline float i8_operand_row_avx2(const float* x, std::size_t K, std::uint8_t* dst,
                                                      std::size_t ld) noexcept {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 largest = _mm256_set1_ps(std::numeric_limits<float>::max());
  __m256 m = _mm256_setzero_ps();
  int bad = 0;  // NaN or infinite lanes
  std::size_t i = 0;
  for (; i + 8 <= K; i += 8) {
    const __m256 v = _mm256_and_ps(_mm256_loadu_ps(x + i), magnitude);
    bad |= _mm256_movemask_ps(_mm256_cmp_ps(v, largest, _CMP_NLE_UQ));
    m = _mm256_max_ps(m, v);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float mx = *std::max_element(lanes, lanes + 8);
  for (std::size_t j = i; j < K; ++j) {
    const float a = std::fabs(x[j]);
    bad |= !(a <= std::numeric_limits<float>::max()) ? 1 : 0;
    mx = std::max(mx, a);
  }
  const i8_scaling s = i8_scaling_of(bad != 0 ? std::numeric_limits<float>::quiet_NaN() : mx);
  const __m256 inv = _mm256_set1_ps(s.inverse), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  const __m256i offset = _mm256_set1_epi32(128);
  i = 0;
  for (; i + 8 <= K; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), inv);
    v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));  // NaN (a NaN scaling) to 0
    v = _mm256_round_ps(_mm256_min_ps(_mm256_max_ps(v, lo), hi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i q = _mm256_add_epi32(_mm256_cvttps_epi32(v), offset);  // 1 .. 255
    const __m256i w = _mm256_packus_epi32(q, q);                         // per 128-bit lane: 16-bit
    const __m256i b = _mm256_packus_epi16(w, w);                         // per 128-bit lane: bytes
    const int first = _mm_cvtsi128_si32(_mm256_castsi256_si128(b));
    const int second = _mm_cvtsi128_si32(_mm256_extracti128_si256(b, 1));
    std::memcpy(dst + i, &first, 4);
    std::memcpy(dst + i + 4, &second, 4);
  }
  for (; i < K; ++i) dst[i] = static_cast<std::uint8_t>(i8_value(x[i], s.inverse) + 128);
  std::fill(dst + K, dst + ld, std::uint8_t{128});
  return s.scale;
}

/// One INT8 operand row with AVX-512: `i8_operand_row_generic`'s bytes and scale (the maximum of
/// magnitudes, then x · inverse clamped and rounded to nearest even: the same operations).
SPECSAMPLE_TARGET_AVX512 inline float i8_operand_row_avx512(const float* x, std::size_t K, std::uint8_t* dst,
                                                          std::size_t ld) noexcept {
  const __m512 magnitude = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  __m512 m = _mm512_setzero_ps();
  __mmask16 bad = 0;  // NaN or infinite lanes
  const __m512 largest = _mm512_set1_ps(std::numeric_limits<float>::max());
  for (std::size_t i = 0; i < K; i += 16) {
    const __mmask16 in = avx512_first(K - i);
    const __m512 v = _mm512_and_ps(_mm512_maskz_loadu_ps(in, x + i), magnitude);
    bad |= _mm512_mask_cmp_ps_mask(in, v, largest, _CMP_NLE_UQ);
    m = _mm512_maskz_max_ps(0xFFFF, m, v);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, m);
  const i8_scaling s = bad != 0 ? i8_scaling_of(std::numeric_limits<float>::quiet_NaN())
                                : i8_scaling_of(*std::max_element(lanes, lanes + 16));
  const __m512 inv = _mm512_set1_ps(s.inverse), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  const __m512i offset = _mm512_set1_epi32(128);
  std::size_t i = 0;
  for (; i < ld; i += 16) {
    const __mmask16 in = i < K ? avx512_first(K - i) : __mmask16{0};
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, x + i), inv);
    v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);  // NaN (a NaN scaling) to 0
    v = avx512_round_nearest(_mm512_maskz_min_ps(0xFFFF, _mm512_maskz_max_ps(0xFFFF, v, lo), hi));
    const __m128i b = _mm512_maskz_cvtepi32_epi8(0xFFFF, _mm512_add_epi32(_mm512_maskz_cvttps_epi32(0xFFFF, v), offset));
    _mm_mask_storeu_epi8(dst + i, avx512_first(ld - i), b);
  }
  return s.scale;
}
#endif

/// dst[t·ldd + k] = i8_value(x[t·ldx + k], the row's inverse) + 128 for t < T, k < K, and 128
/// (zero) for K <= k < ldd; scales[t] = the row's scale: the operands of an `i8_quads` matmul
/// (`matmul_args::xq`, `xs`). Every level gives the same bytes and scales.
inline void i8_operands(isa level, const float* x, std::size_t ldx, std::size_t T, std::size_t K, std::uint8_t* dst,
                        std::size_t ldd, float* scales) noexcept {
  for (std::size_t t = 0; t < T; ++t) {
#if SPECSAMPLE_X86
    if (avx512_kernels && level == isa::avx512) {
      scales[t] = i8_operand_row_avx512(x + t * ldx, K, dst + t * ldd, ldd);
      continue;
    }
    if (level == isa::avx2) {
      scales[t] = i8_operand_row_avx2(x + t * ldx, K, dst + t * ldd, ldd);
      continue;
    }
#else
    (void)level;
#endif
    scales[t] = i8_operand_row_generic(x + t * ldx, K, dst + t * ldd, ldd);
  }
}

/// Computes the outputs of panels [p_begin, p_end) of `a` for all T rows with the kernels of
/// `level` (already resolved: `resolve(...)`).
#ifdef SPECSAMPLE_MATMUL_KERNELS
SPECSAMPLE_MATMUL_KERNELS void matmul_panels(isa level, weight_format f, const matmul_args& a, std::size_t p_begin,
                                             std::size_t p_end) noexcept {
#if SPECSAMPLE_X86
  if (avx512_kernels && level == isa::avx512) {
    switch (f) {
      case weight_format::f32: return matmul_avx512<weight_format::f32>(a, p_begin, p_end);
      case weight_format::f16: return matmul_avx512<weight_format::f16>(a, p_begin, p_end);
      case weight_format::bf16: return matmul_avx512<weight_format::bf16>(a, p_begin, p_end);
      case weight_format::bf16_pairs:
        if (a.tiles && amx_fits(f, a.K)) return matmul_amx<weight_format::bf16_pairs>(a, p_begin, p_end);
        if (has_avx512_bf16()) return matmul_avx512_dot(a, p_begin, p_end);
        return matmul_avx512<weight_format::bf16_pairs>(a, p_begin, p_end);
      case weight_format::i8_quads:
        if (a.tiles && a.T >= amx_int8_rows && amx_fits(f, a.K)) return matmul_amx<weight_format::i8_quads>(a, p_begin, p_end);
        if (has_avx512_vnni()) return matmul_avx512_vnni(a, p_begin, p_end);
        return matmul_avx2<weight_format::i8_quads>(a, p_begin, p_end);
    }
  }
  if (level == isa::avx2) {
    switch (f) {
      case weight_format::f32: return matmul_avx2<weight_format::f32>(a, p_begin, p_end);
      case weight_format::f16: return matmul_avx2<weight_format::f16>(a, p_begin, p_end);
      case weight_format::bf16: return matmul_avx2<weight_format::bf16>(a, p_begin, p_end);
      case weight_format::bf16_pairs: return matmul_avx2<weight_format::bf16_pairs>(a, p_begin, p_end);
      case weight_format::i8_quads: return matmul_avx2<weight_format::i8_quads>(a, p_begin, p_end);
    }
  }
#else
  (void)level;
#endif
  switch (f) {
    case weight_format::f32: return matmul_generic<weight_format::f32>(a, p_begin, p_end);
    case weight_format::f16: return matmul_generic<weight_format::f16>(a, p_begin, p_end);
    case weight_format::bf16: return matmul_generic<weight_format::bf16>(a, p_begin, p_end);
    case weight_format::bf16_pairs: return matmul_generic<weight_format::bf16_pairs>(a, p_begin, p_end);
    case weight_format::i8_quads: return matmul_generic_i8(a, p_begin, p_end);
  }
}
#else
void matmul_panels(isa level, weight_format f, const matmul_args& a, std::size_t p_begin, std::size_t p_end) noexcept;
#endif

/// dst[t·ldd + k] = bf16_operand(x[t·ldx + k]) for t < T, k < K, and 0 for K <= k < ldd: the
/// operands of a `bf16_pairs` matmul (`matmul_args::xh`).
inline void bf16_operands(isa level, const float* x, std::size_t ldx, std::size_t T, std::size_t K,
                          std::uint16_t* dst, std::size_t ldd) noexcept {
#if SPECSAMPLE_X86
  // Constant expressions where `avx512_kernels` is false (it comes first): the branches fold.
  const bool avx512 = avx512_kernels && level == isa::avx512;
  const bool dot = avx512 && has_avx512_bf16();
#endif
  for (std::size_t t = 0; t < T; ++t) {
    const float* xr = x + t * ldx;
    std::uint16_t* dr = dst + t * ldd;
#if SPECSAMPLE_X86
    if (dot) {
      bf16_operands_avx512_bf16(xr, K, dr);
    } else if (avx512) {
      bf16_operands_avx512(xr, K, dr);
    } else {
      for (std::size_t k = 0; k < K; ++k) dr[k] = bf16_operand(xr[k]);
    }
#else
    (void)level;
    for (std::size_t k = 0; k < K; ++k) dr[k] = bf16_operand(xr[k]);
#endif
    std::fill(dr + K, dr + ldd, std::uint16_t{0});
  }
}

/// y = (x − mean) / sqrt(var + eps) · w + b over one row of C (y may be x), mean and biased
/// variance in float, two passes, with the kernels of `level`: a row's result depends only on the
/// row and the level. The generic path keeps eight interleaved partial sums.
inline void layer_norm_row(isa level, float* y, const float* x, const float* w, const float* b, std::size_t C,
                           float eps) noexcept {
#if SPECSAMPLE_X86
  if (avx512_kernels && level == isa::avx512) return layer_norm_row_avx512(y, x, w, b, C, eps);
  if (level == isa::avx2) return layer_norm_row_avx2(y, x, w, b, C, eps);
#else
  (void)level;
#endif
  const float inv_c = 1.0f / static_cast<float>(C);
  // Σ in float, eight interleaved partial sums plus the tail, in a fixed order.
  using specsample::simd::weight_sum;
  const float mean = weight_sum<float>([x](std::size_t i) { return x[i]; }, C) * inv_c;
  const float var = weight_sum<float>([x, mean](std::size_t i) { return (x[i] - mean) * (x[i] - mean); }, C) * inv_c;
  const float rstd = 1.0f / std::sqrt(var + eps);
  for (std::size_t c = 0; c < C; ++c) y[c] = (x[c] - mean) * rstd * w[c] + b[c];
}

/// out = gelu(in) elementwise (may alias) with the kernels of `level`; the generic path is the
/// scalar tanh formula.
inline void gelu(isa level, float* out, const float* in, std::size_t n) noexcept {
#if SPECSAMPLE_X86
  if (avx512_kernels && level == isa::avx512) return gelu_avx512(out, in, n);
  if (level == isa::avx2) return gelu_avx2(out, in, n);
#else
  (void)level;
#endif
  for (std::size_t i = 0; i < n; ++i) {
    const float x = in[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(gelu_k * (x + gelu_c * x * x * x)));
  }
}

}  // namespace simd
}  // namespace specsample::gpt2
