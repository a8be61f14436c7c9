#pragma once
/// @file random.hpp
/// Uniform doubles and categorical draws from any `std::uniform_random_bit_generator`.

#include <specsample/concepts.hpp>

#include <Eigen/Core>

#include <cstdint>
#include <limits>
#include <random>

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

/// Draws an index from the unnormalised non-negative weights `w` (inverse CDF in double).
/// Only indices with positive weight can be drawn. Precondition: some weight is positive.
template <class Derived, std::uniform_random_bit_generator Rng>
[[nodiscard]] token sample_categorical(const Eigen::DenseBase<Derived>& w, Rng& rng) {
  double total = 0.0;
  for (Eigen::Index i = 0; i < w.size(); ++i) total += static_cast<double>(w(i));
  const double u = uniform_01(rng) * total;
  double cum = 0.0;
  Eigen::Index last_positive = -1;
  for (Eigen::Index i = 0; i < w.size(); ++i) {
    const double wi = static_cast<double>(w(i));
    if (wi > 0.0) {
      cum += wi;
      last_positive = i;
      if (u < cum) return static_cast<token>(i);
    }
  }
  return static_cast<token>(last_positive);  // u landed in the rounding gap at the top
}

}  // namespace specsample
