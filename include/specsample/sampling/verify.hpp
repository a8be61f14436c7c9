#pragma once
/// @file verify.hpp
/// Token-wise verification of K drafted tokens, and residual sampling.
///
/// Notation (Leviathan et al.): p is the target's warped distribution, q the draft's. DeepMind's
/// paper (Chen et al.) writes them the other way round; see docs/algorithm.md.

#include <specsample/concepts.hpp>
#include <specsample/error.hpp>
#include <specsample/sampling/random.hpp>

#include <Eigen/Core>
#include <fmt/format.h>

#include <cstddef>
#include <span>

namespace specsample {

/// Residual masses at or below this are treated as empty (see `sample_residual`).
inline constexpr double residual_mass_epsilon = 1e-12;

/// Draws from norm(max(0, p - q)), computed in double.
///
/// After a rejection the residual mass equals the total variation distance between p and q and is
/// positive in exact arithmetic. Float rounding of two almost identical distributions can leave it
/// at (or near) zero; then, and only then, the token is drawn from p instead (the documented
/// fallback: the probability of reaching it is itself below the rounding error).
template <class P, class Q, std::uniform_random_bit_generator Rng>
[[nodiscard]] token sample_residual(const Eigen::MatrixBase<P>& p, const Eigen::MatrixBase<Q>& q, Rng& rng) {
  if (p.size() != q.size()) {
    throw error(fmt::format("sample_residual: p has {} entries, q has {}", p.size(), q.size()));
  }
  double mass = 0.0;
  for (Eigen::Index i = 0; i < p.size(); ++i) {
    const double r = static_cast<double>(p(i)) - static_cast<double>(q(i));
    if (r > 0.0) mass += r;
  }
  if (!(mass > residual_mass_epsilon)) return sample_categorical(p, rng);
  const double u = uniform_01(rng) * mass;
  double cum = 0.0;
  Eigen::Index last_positive = -1;
  for (Eigen::Index i = 0; i < p.size(); ++i) {
    const double r = static_cast<double>(p(i)) - static_cast<double>(q(i));
    if (r > 0.0) {
      cum += r;
      last_positive = i;
      if (u < cum) return static_cast<token>(i);
    }
  }
  return static_cast<token>(last_positive);
}

/// The outcome of verifying one block of drafts.
struct verify_result {
  std::size_t accepted = 0;  ///< n: drafts[0..n) are accepted.
  token next = 0;            ///< the token emitted after them (a correction, or the bonus).
  bool bonus = false;        ///< true when all drafts were accepted and `next` was drawn from p_K.
};

/// Token-wise verification (Leviathan et al. 2022, Algorithm 1; Chen et al. 2023).
///
/// @param drafts the K drafted tokens; drafts[i] was drawn from q.col(i).
/// @param q      (V, >= K) warped draft distributions; column i conditions on drafts[0..i).
/// @param p      (V, >= K+1) warped target distributions; column i conditions on drafts[0..i).
/// For i = 0..K-1: accept drafts[i] iff p_i(x) >= q_i(x) or u < p_i(x) / q_i(x), u ~ U[0,1) in
/// double; at the first rejection emit x ~ norm(max(0, p_i - q_i)) and stop. If all K are
/// accepted emit the bonus x ~ p_K. The emitted sequence is distributed exactly as sampling from p.
struct tokenwise_verifier {
  template <std::uniform_random_bit_generator Rng>
  verify_result operator()(std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q,
                           const Eigen::Ref<const Eigen::MatrixXf>& p, Rng& rng) const {
    const auto k = static_cast<Eigen::Index>(drafts.size());
    if (q.cols() < k || p.cols() < k + 1 || q.rows() != p.rows()) {
      throw error(fmt::format("verify: {} drafts need q of shape (V, >={}) and p of shape (V, >={}); "
                              "got q ({}, {}) and p ({}, {})",
                              k, k, k + 1, q.rows(), q.cols(), p.rows(), p.cols()));
    }
    for (Eigen::Index i = 0; i < k; ++i) {
      const token x = drafts[static_cast<std::size_t>(i)];
      if (x < 0 || x >= p.rows()) {
        throw error(fmt::format("verify: draft token {} is out of range for a vocabulary of {}", x, p.rows()));
      }
      const double qx = q(x, i);
      const double px = p(x, i);
      if (!(qx > 0.0)) {
        throw error(fmt::format("verify: draft token {} has zero draft probability: it cannot have "
                                "been drawn from q", x));
      }
      if (px >= qx || uniform_01(rng) < px / qx) continue;
      return {static_cast<std::size_t>(i), sample_residual(p.col(i), q.col(i), rng), false};
    }
    return {static_cast<std::size_t>(k), sample_categorical(p.col(k), rng), true};
  }
};

/// Token-wise verification as a free function; see `tokenwise_verifier`.
template <std::uniform_random_bit_generator Rng>
verify_result verify_tokenwise(std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q,
                               const Eigen::Ref<const Eigen::MatrixXf>& p, Rng& rng) {
  return tokenwise_verifier{}(drafts, q, p, rng);
}

}  // namespace specsample
