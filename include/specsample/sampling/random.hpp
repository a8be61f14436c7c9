#pragma once
/// @file random.hpp
/// Uniform doubles and categorical draws from any `std::uniform_random_bit_generator`.

#include <specsample/concepts.hpp>
#include <specsample/detail/simd.hpp>
#include <specsample/error.hpp>

#include <Eigen/Core>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <concepts>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>


namespace specsample {

/// A uniform double in [0, 1) with 53 random bits, from any uniform random bit generator.
/// (std::generate_canonical may return 1.0 on some implementations; this never does.)
template <std::uniform_random_bit_generator Rng>
[[nodiscard]] double uniform_01(Rng& rng) {
  constexpr auto lo = static_cast<std::uint64_t>(Rng::min());
  constexpr auto hi = static_cast<std::uint64_t>(Rng::max());
  std::uint64_t bits = 0;
  if constexpr (lo == 0 && hi == std::numeric_limits<std::uint64_t>::max()) {
    bits = static_cast<std::uint64_t>(rng()) >> 11;  // e.g. std::mt19937_64: one call
  } else {
    bits = std::uniform_int_distribution<std::uint64_t>(0, (std::uint64_t{1} << 53) - 1)(rng);
  }
  return static_cast<double>(bits) * 0x1.0p-53;
}

namespace detail {

/// Weights per block of the blocked inverse CDF below.
inline constexpr std::size_t sample_block = 64;

/// Weights read from contiguous floats: p[i], or simd::residual_weight(p[i], q[i], s) when q is
/// set. Their block sums run the vector kernels of `level` (simd::weight_sum), bit for bit the sums
/// of the scalar form.
struct float_weights {
  const float* p = nullptr;
  const float* q = nullptr;
  double s = 1.0;
  isa level = simd::detected();

  [[nodiscard]] double operator()(std::size_t i) const noexcept {
    return q != nullptr ? simd::residual_weight(p[i], q[i], s) : static_cast<double>(p[i]);
  }
  [[nodiscard]] simd::weight_kind kind() const noexcept {
    return q == nullptr ? simd::weight_kind::plain : simd::weight_kind::excess;
  }
  [[nodiscard]] double sum(std::size_t begin, std::size_t end) const noexcept {
    return simd::weight_sum(level, kind(), p + begin, q == nullptr ? nullptr : q + begin, s, end - begin);
  }
  /// `sum` of each block of `block` weights of [0, n), in one vector loop: see simd::block_sums.
  [[nodiscard]] double sum_blocks(std::size_t n, std::size_t block, double* sums, std::size_t max_sums) const noexcept {
    return simd::block_sums(level, kind(), p, q, s, n, block, sums, max_sums);
  }
};

/// The coefficients of an Eigen vector as contiguous floats, or null when they are not. (Some
/// expressions flag direct access without offering data(): an IndexedView with a run-time step.)
template <class Derived>
[[nodiscard]] const float* contiguous_floats(const Eigen::DenseBase<Derived>& x) noexcept {
  if constexpr (std::is_same_v<typename Derived::Scalar, float> && Derived::IsVectorAtCompileTime &&
                (static_cast<unsigned>(Derived::Flags) & Eigen::DirectAccessBit) != 0 &&
                requires(const Derived& d) {
                  { d.data() } -> std::convertible_to<const float*>;
                  d.innerStride();
                }) {
    if (x.derived().innerStride() == 1) return x.derived().data();
  }
  return nullptr;
}

/// Σ weight(i) for i in [begin, end), in double, in a fixed order that does not depend on where
/// the range sits (simd::weight_sum's: eight interleaved partial sums, combined pairwise); with
/// the vector kernels when the weights are `float_weights`.
template <class Weight>
[[nodiscard]] double weight_sum(Weight& weight, std::size_t begin, std::size_t end) {
  if constexpr (requires { weight.sum(begin, end); }) {
    return weight.sum(begin, end);
  } else {
    return simd::weight_sum([&](std::size_t i) { return weight(begin + i); }, end - begin);
  }
}

/// The block sums `draw_weighted` scans and their total, Σ weight(i) over [0, n) as the sequential
/// sum of the block sums. The first `kept` block sums are stored (every block of a vocabulary of
/// up to 65536 weights, GPT-2's 50257 included), so that a draw after the total reads them
/// instead of summing its blocks a second time; the draw sums any later block again, to the same
/// bits. (On the stack: 8 KiB, no allocation.)
struct block_totals {
  static constexpr std::size_t kept = 1024;
  double total = 0.0;
  std::size_t stored = 0;         ///< sums[0, stored) hold blocks 0, 1, ...
  std::array<double, kept> sums;  ///< (only [0, stored) is written)
};

/// The `block_totals` of weight(i) over [0, n): every block's `weight_sum`, added in order.
template <class Weight>
[[nodiscard]] block_totals sum_blocks(Weight& weight, std::size_t n) {
  block_totals t;
  if constexpr (requires { weight.sum_blocks(n, sample_block, t.sums.data(), block_totals::kept); }) {
    t.total = weight.sum_blocks(n, sample_block, t.sums.data(), block_totals::kept);  // the same bits, vectorised
    t.stored = std::min((n + sample_block - 1) / sample_block, block_totals::kept);
    return t;
  }
  for (std::size_t b = 0; b < n; b += sample_block) {
    const double block = weight_sum(weight, b, std::min(n, b + sample_block));
    if (t.stored < block_totals::kept) t.sums[t.stored++] = block;
    t.total += block;
  }
  return t;
}

/// The index whose cumulative weight first exceeds u·total (u ~ U[0, 1)), `t` the weights'
/// `sum_blocks(weight, n)`: an inverse-CDF draw in double over non-negative weights. Blocked:
/// the scan adds whole blocks (the sums that make up `t.total`, so the search covers exactly
/// [0, total)) and walks one block element by element; only indices with positive weight can be
/// returned. Where rounding leaves u·total in a gap the walk does not close (a ~1e-16 event, as
/// with any floating-point inverse CDF), the last positive index of the block — or, past the last
/// block, of all — is returned.
template <class Weight, std::uniform_random_bit_generator Rng>
[[nodiscard]] token draw_weighted(Weight& weight, std::size_t n, const block_totals& t, Rng& rng) {
  const double u = uniform_01(rng) * t.total;
  double cum = 0.0;
  for (std::size_t b = 0, k = 0; b < n; b += sample_block, ++k) {
    const std::size_t end = std::min(n, b + sample_block);
    const double block = k < t.stored ? t.sums[k] : weight_sum(weight, b, end);
    if (u < cum + block) {
      double c = cum;
      std::size_t last_positive = b;
      for (std::size_t i = b; i < end; ++i) {
        const double wi = weight(i);
        if (wi > 0.0) {
          c += wi;
          last_positive = i;
          if (u < c) return static_cast<token>(i);
        }
      }
      return static_cast<token>(last_positive);  // the block has a positive weight: u < cum + block
    }
    cum += block;
  }
  for (std::size_t i = n; i-- > 0;) {
    if (weight(i) > 0.0) return static_cast<token>(i);
  }
  return token{-1};  // unreachable: a positive total means a positive weight
}

/// `draw_weighted` over weights whose total must be positive and finite: a NaN, an infinity, or
/// no positive weight throws `specsample::error` naming the total.
template <class Weight, std::uniform_random_bit_generator Rng>
[[nodiscard]] token draw_checked(Weight& weight, std::size_t n, Rng& rng) {
  const block_totals t = sum_blocks(weight, n);
  if (!(t.total > 0.0 && std::isfinite(t.total))) {
    throw error(fmt::format("sample_categorical: the {} weights sum to {}; they must be finite and "
                            "non-negative, with at least one positive",
                            n, t.total));
  }
  return draw_weighted(weight, n, t, rng);
}

/// `sample_categorical` without its check of every weight, for weights the library computed
/// itself (warped and residual distributions); still throws when their sum is not positive and
/// finite.
template <class Derived, std::uniform_random_bit_generator Rng>
[[nodiscard]] token draw_categorical(const Eigen::DenseBase<Derived>& w, Rng& rng) {
  const auto n = static_cast<std::size_t>(w.size());
  if (const float* data = contiguous_floats(w)) {
    float_weights weight{data};
    return draw_checked(weight, n, rng);
  }
  auto weight = [&w](std::size_t i) { return static_cast<double>(w(static_cast<Eigen::Index>(i))); };
  return draw_checked(weight, n, rng);
}

}  // namespace detail

/// Draws an index from the unnormalised weights `w` (inverse CDF in double, blocked:
/// `detail::draw_weighted`). Only indices with positive weight can be drawn. Throws
/// `specsample::error` on a negative weight, naming it and its index (logits passed where
/// probabilities belong, say), and when the sum is not positive and finite (a NaN or an infinity
/// among the weights, no positive weight, an empty `w`).
template <class Derived, std::uniform_random_bit_generator Rng>
[[nodiscard]] token sample_categorical(const Eigen::DenseBase<Derived>& w, Rng& rng) {
  if (w.size() > 0 && w.minCoeff() < 0) {  // (the indexed minCoeff is not vectorised: ~9x slower)
    Eigen::Index at = 0;
    const auto least = w.minCoeff(&at);
    throw error(fmt::format("sample_categorical: weight {} at index {}; weights must be non-negative", least, at));
  }
  return detail::draw_categorical(w, rng);  // (a NaN makes the sum NaN: draw_checked names it)
}

}  // namespace specsample
