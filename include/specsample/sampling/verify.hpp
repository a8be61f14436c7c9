#pragma once
/// @file verify.hpp
/// Token-wise verification of K drafted tokens, and residual sampling.
///
/// Notation (Leviathan et al.): p is the target's warped distribution, q the draft's. DeepMind's
/// paper (Chen et al.) writes them the other way round; see docs/algorithm.md.

#include <specsample/concepts.hpp>
#include <specsample/detail/simd.hpp>
#include <specsample/error.hpp>
#include <specsample/sampling/params.hpp>
#include <specsample/sampling/random.hpp>

#include <Eigen/Core>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

namespace specsample {

/// Residual masses at or below this are treated as empty (see `sample_residual`).
inline constexpr double residual_mass_epsilon = 1e-12;

/// How far from 1 the sum of an n-entry distribution the caller hands the library may be: each
/// column a drafter of the caller's writes into q (the sampling loop checks them), the columns of
/// p and q a verifier is given whole, and `sample_residual`'s p and q. max(1e-3, n · 2^-25):
/// twice the largest error of a softmax normalised by a float running sum that we measured (about
/// n · 2^-26: n equal entries, a uniform distribution, or nearly equal ones summed smallest
/// first; 2^20 entries of a softmax of N(0, 3) logits summed largest first are off by n · 2^-28),
/// so such a q passes, while weights left unnormalised, logits, a softmax over the wrong axis or
/// a top-p cut not renormalised are refused (0.99 at V = 128256: the tolerance is 0.0038). A sum
/// rounded the worst possible way, (n - 1) · 2^-24, is twice the tolerance: normalise by a sum
/// taken in double to be safe. A q that does not sum to 1 is not the distribution its drafts were
/// drawn from, and the output would not be the target's: the sampling loop divides each column a
/// drafter of the caller's writes by its sum; the verifiers and `sample_residual` use the p and q
/// they are given as they are, off by up to the tolerance.
[[nodiscard]] constexpr double distribution_tolerance(std::size_t n) noexcept {
  return std::max(1e-3, static_cast<double>(n) * 0x1p-25);
}

namespace detail {
// Every entry of the vector v finite and >= 0, and their sum within
// `distribution_tolerance(v.size())` of 1; otherwise throws `specsample::error` naming the first entry
// that is not, "`who`: `name`(i) = value" ("`name`(i, column)" for a column >= 0 of a matrix),
// or the sum. Returns the sum. (A float vector's sum comes from `simd::find_outside`'s float lanes, within
// n · 2^-28 relative, 1/8 of the tolerance: whether a sum that close to its edge passes may
// depend on the instruction set.)
template <class Derived>
double check_distribution(const Eigen::MatrixBase<Derived>& v, Eigen::Index column, const char* who, const char* name) {
  using scalar = typename Derived::Scalar;  // (compared in its own type: a double p stays a double)
  constexpr scalar most = std::numeric_limits<scalar>::max();
  const auto n = static_cast<std::size_t>(v.size());
  std::size_t at = n;
  double sum = 0.0;
  if (const float* x = contiguous_floats(v)) {  // one vector pass for both
    const simd::outside_scan scan = simd::find_outside(simd::detected(), x, n, 0.0f, std::numeric_limits<float>::max());
    at = scan.first;
    sum = scan.sum;
  } else {
    for (std::size_t i = 0; i < n && at == n; ++i) {
      const scalar e = v(static_cast<Eigen::Index>(i));
      if (!(e >= scalar(0) && e <= most)) at = i;
      sum += static_cast<double>(e);
    }
  }
  if (at < n) {
    const std::string where = column < 0 ? fmt::format("{}", at) : fmt::format("{}, {}", at, column);
    throw error(fmt::format("{}: {}({}) = {}; {} must hold distributions (every entry finite and >= 0)", who, name,
                            where, v(static_cast<Eigen::Index>(at)), name));
  }
  if (const double tolerance = distribution_tolerance(n); !(std::abs(sum - 1.0) <= tolerance)) {
    const std::string what = column < 0 ? fmt::format("{}", name) : fmt::format("column {} of {}", column, name);
    throw error(fmt::format("{}: {} sums to {:.7g}; {} must hold distributions (entries summing to 1 within {:.3g})", who,
                            what, sum, name, tolerance));
  }
  return sum;
}

// sample_residual without its checks of p and q (distributions the library computed itself).
template <class P, class Q, std::uniform_random_bit_generator Rng>
[[nodiscard]] token draw_residual(const Eigen::MatrixBase<P>& p, const Eigen::MatrixBase<Q>& q, Rng& rng,
                                  double weight = 1.0) {
  const auto n = static_cast<std::size_t>(p.size());
  const auto draw = [&](auto& residual) {
    const block_totals sums = sum_blocks(residual, n);  // sums.total: the residual mass
    if (!(sums.total > residual_mass_epsilon)) return draw_categorical(p, rng);
    return draw_weighted(residual, n, sums, rng);
  };
  const float* pd = contiguous_floats(p);
  const float* qd = contiguous_floats(q);
  if (pd != nullptr && qd != nullptr) {
    float_weights residual{pd, qd, weight};
    return draw(residual);
  }
  auto residual = [&](std::size_t i) {
    const auto j = static_cast<Eigen::Index>(i);
    return simd::residual_weight(static_cast<double>(p(j)), static_cast<double>(q(j)), weight);
  };
  return draw(residual);
}
}  // namespace detail

/// Draws from norm(max(0, w·p - q)), computed in double (w = 1: the token-wise residual).
///
/// After a rejection the residual mass equals the total variation distance between p and q and is
/// positive in exact arithmetic. Float rounding of two almost identical distributions can leave it
/// at (or near) zero; then, and only then, the token is drawn from p instead (the documented
/// fallback: the probability of reaching it is itself below the rounding error).
///
/// Throws `specsample::error` when p and q differ in length, when an entry of either is NaN,
/// infinite or negative (naming it) or either does not sum to 1 (`distribution_tolerance`), and
/// when the weight is outside (0, 1].
template <class P, class Q, std::uniform_random_bit_generator Rng>
[[nodiscard]] token sample_residual(const Eigen::MatrixBase<P>& p, const Eigen::MatrixBase<Q>& q, Rng& rng,
                                    double weight = 1.0) {
  if (p.size() != q.size()) {
    throw error(fmt::format("sample_residual: p has {} entries, q has {}", p.size(), q.size()));
  }
  if (!(weight > 0.0 && weight <= 1.0)) {
    throw error(fmt::format("sample_residual: the weight of p must be in (0, 1], got {}", weight));
  }
  detail::check_distribution(p, -1, "sample_residual", "p");
  detail::check_distribution(q, -1, "sample_residual", "q");
  return detail::draw_residual(p, q, rng, weight);
}

/// The outcome of verifying one block of drafts.
struct verify_result {
  std::size_t accepted = 0;  ///< n: drafts[0..n) are accepted.
  token next = 0;            ///< the token emitted after them (a correction, or the bonus).
  bool bonus = false;        ///< true when all drafts were accepted and `next` was drawn from p_K.
};

namespace detail {
// Shapes (q: (V, >= K), p: (V, >= K+1)), token range, and q(x) > 0 for every draft; throws
// `specsample::error` otherwise.
inline void check_drafts(std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q, Eigen::Index p_rows,
                         Eigen::Index p_cols) {
  const auto k = static_cast<Eigen::Index>(drafts.size());
  if (q.cols() < k || p_cols < k + 1 || q.rows() != p_rows) {
    throw error(fmt::format("verify: {} drafts need q of shape (V, >={}) and p of shape (V, >={}); "
                            "got q ({}, {}) and p ({}, {})",
                            k, k, k + 1, q.rows(), q.cols(), p_rows, p_cols));
  }
  for (Eigen::Index i = 0; i < k; ++i) {
    const token x = drafts[static_cast<std::size_t>(i)];
    if (!in_vocabulary(x, static_cast<std::size_t>(p_rows))) {
      throw error(fmt::format("verify: draft token {} is out of range for a vocabulary of {}", x, p_rows));
    }
    if (!(q(x, i) > 0.0f)) {
      throw error(fmt::format("verify: draft token {} has draft probability q = {} (draft {}): it cannot have "
                              "been drawn from q",
                              x, q(x, i), i));
    }
  }
}

// check_drafts, then every entry the rules may read: q's first K columns and p's first K + 1 (a p
// and q given whole, not warped by the loop). A NaN, an infinity or a negative entry away from the
// drafts would otherwise count as 0 in a residual's or block verification's sums.
inline void check_verify_inputs(std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q,
                                const Eigen::Ref<const Eigen::MatrixXf>& p) {
  check_drafts(drafts, q, p.rows(), p.cols());
  const auto k = static_cast<Eigen::Index>(drafts.size());
  for (Eigen::Index j = 0; j < k; ++j) check_distribution(q.col(j), j, "verify", "q");
  for (Eigen::Index j = 0; j <= k; ++j) check_distribution(p.col(j), j, "verify", "p");
}

// V reads the target's distributions through `decide` (see tokenwise_verifier::decide) because V
// itself says so: `V::decides_columns` names V. A class derived from a built-in verifier, which may
// override its operator(), does not inherit the opt-in and is called through operator().
template <class V>
concept decides_columns = std::is_same_v<typename V::decides_columns, V>;

// The target's distributions as a verifier's `decide` reads them, from a matrix given whole:
// p(x, j) and p.col(j) (a contiguous column), p.rows(), p.cols(). The loop passes instead columns
// it warps from the logits on first use (detail::lazy_columns, loop.hpp).
struct dense_columns {
  const Eigen::Ref<const Eigen::MatrixXf>& p;

  [[nodiscard]] Eigen::Index rows() const noexcept { return p.rows(); }
  [[nodiscard]] Eigen::Index cols() const noexcept { return p.cols(); }
  [[nodiscard]] auto col(Eigen::Index j) const { return p.col(j); }
  [[nodiscard]] float operator()(token x, Eigen::Index j) const { return p(x, j); }
};
}  // namespace detail

/// Token-wise verification (Leviathan et al. 2022, Algorithm 1; Chen et al. 2023).
///
/// @param drafts the K drafted tokens; drafts[i] was drawn from q.col(i).
/// @param q      (V, >= K) warped draft distributions; column i conditions on drafts[0..i).
/// @param p      (V, >= K+1) warped target distributions; column i conditions on drafts[0..i).
/// For i = 0..K-1: accept drafts[i] iff p_i(x) >= q_i(x) or u < p_i(x) / q_i(x), u ~ U[0,1) in
/// double; at the first rejection emit x ~ norm(max(0, p_i - q_i)) and stop. If all K are
/// accepted emit the bonus x ~ p_K. The emitted sequence is distributed exactly as sampling from p.
/// Throws `specsample::error` on shapes that do not fit K, a draft outside the vocabulary or with
/// q(x) = 0, a NaN, infinite or negative entry in q's first K columns or p's first K + 1 (naming
/// the first), and such a column whose sum is off 1 by more than `distribution_tolerance(V)`,
/// before it draws a random number.
struct tokenwise_verifier {
  /// 1 = exact. Below 1 the uniform is drawn from U[0, leniency): lossy, see speculative_params.
  double leniency = 1.0;
  /// The sampling loop calls `decide` (detail::decides_columns).
  using decides_columns = tokenwise_verifier;

  template <std::uniform_random_bit_generator Rng>
  verify_result operator()(std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q,
                           const Eigen::Ref<const Eigen::MatrixXf>& p, Rng& rng) const {
    detail::check_verify_inputs(drafts, q, p);
    detail::dense_columns columns{p};
    return decide(drafts, q, columns, rng);
  }

  /// The same decision, reading p through `p` (`p(x, i)`, `p.col(i)`, `p.rows()`, `p.cols()`; see
  /// `detail::dense_columns`): column i only once drafts 0..i-1 are accepted, so the sampling loop
  /// warps no target column past the first rejection. Trusts p to hold distributions (finite,
  /// >= 0, summing to 1), as the loop's warped columns do; `operator()` checks a p given whole.
  template <class Columns, std::uniform_random_bit_generator Rng>
  verify_result decide(std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q, const Columns& p,
                       Rng& rng) const {
    detail::check_drafts(drafts, q, p.rows(), p.cols());
    detail::check_leniency(leniency, "tokenwise_verifier.leniency");
    const auto k = static_cast<Eigen::Index>(drafts.size());
    for (Eigen::Index i = 0; i < k; ++i) {
      const token x = drafts[static_cast<std::size_t>(i)];
      const double qx = q(x, i);
      const double px = p(x, i);
      if (px >= qx || uniform_01(rng) * leniency < px / qx) continue;
      return {static_cast<std::size_t>(i), detail::draw_residual(p.col(i), q.col(i), rng), false};
    }
    return {static_cast<std::size_t>(k), detail::draw_categorical(p.col(k), rng), true};
  }
};

/// Block verification (Sun, Mendlovic, Leviathan et al., "Block Verification Accelerates
/// Speculative Decoding", ICLR 2025, arXiv 2403.10444, Algorithm 2): decides the accepted prefix
/// of the whole block jointly. Exact, and never accepts fewer tokens in expectation than
/// token-wise verification. With 1-based positions i = 1..K (column i-1 of q and p scores x_i):
///
///   w_0 = 1;  w_i = min(1, w_{i-1} · p_{i-1}(x_i) / q_{i-1}(x_i))          (clipped every step)
///   h_i = Z_i / Σ_x max(q_i(x) - w_i p_i(x), 0)  for i < K, with Z_i = Σ_x max(w_i p_i(x) - q_i(x), 0)
///         (1 when the denominator is 0; it equals Z_i + 1 - w_i, computed without cancellation)
///   h_K = w_K
///   τ   = the largest i with η_i < h_i, η_i ~ U[0,1) independent (0 if none)
///
/// Emits x_1..x_τ, then the bonus from p_K if τ = K, else a token from
/// norm(max(w_τ p_τ - q_τ, 0)). Needs the draft's full distributions q (not a top-k). The η_i
/// are drawn from i = K down, stopping at the first η_i < h_i: that i is τ whatever the η below
/// it are (τ is the largest success), and as the η_i are independent, leaving those undrawn (and
/// their h_i, the vocabulary sums, uncomputed) changes no probability. At most
/// `max_draft_length` drafts per call. Checks its inputs as `tokenwise_verifier` does.
struct block_verifier {
  /// The sampling loop calls `decide` (detail::decides_columns).
  using decides_columns = block_verifier;

  template <std::uniform_random_bit_generator Rng>
  verify_result operator()(std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q,
                           const Eigen::Ref<const Eigen::MatrixXf>& p, Rng& rng) const {
    check_length(drafts.size());
    detail::check_verify_inputs(drafts, q, p);
    detail::dense_columns columns{p};
    return decide(drafts, q, columns, rng);
  }

  /// The same decision, reading p through `p` (as `tokenwise_verifier::decide`): the weights w_i
  /// read columns 0, 1, … up to the first draft whose weight is 0 (all K when none is), the scan
  /// the columns from the last positive weight's down to τ, the last draw column τ or, for the
  /// bonus, K; the sampling loop warps no other target column. Trusts p to hold distributions.
  template <class Columns, std::uniform_random_bit_generator Rng>
  verify_result decide(std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q, const Columns& p,
                       Rng& rng) const {
    const std::size_t k = drafts.size();
    check_length(k);
    detail::check_drafts(drafts, q, p.rows(), p.cols());
    // w[i - 1] = w_i for i = 1..n, n the last position with w_i > 0 (every later w_j and h_j is 0:
    // no later position can be selected).
    std::array<double, max_draft_length> w;
    std::size_t n = 0;
    for (double wi = 1.0; n < k; ++n) {
      const token x = drafts[n];
      const auto col = static_cast<Eigen::Index>(n);
      wi = std::min(1.0, wi * static_cast<double>(p(x, col)) / static_cast<double>(q(x, col)));
      if (wi == 0.0) break;
      w[n] = wi;
    }
    const isa level = simd::detected();
    const auto rows = static_cast<std::size_t>(p.rows());
    std::size_t tau = n;
    for (; tau > 0; --tau) {
      double h = w[tau - 1];
      if (tau < k) {  // Σ max(0, w·p − q) and Σ max(0, q − w·p) over the vocabulary, in one vector pass
        const auto col = static_cast<Eigen::Index>(tau);
        const auto [z, denominator] = simd::excess_and_shortfall(level, p.col(col).data(), q.col(col).data(), h, rows);
        h = denominator > 0.0 ? z / denominator : 1.0;
      }
      if (uniform_01(rng) < h) break;
    }
    if (tau == k) return {k, detail::draw_categorical(p.col(static_cast<Eigen::Index>(k)), rng), true};
    const auto col = static_cast<Eigen::Index>(tau);
    return {tau, detail::draw_residual(p.col(col), q.col(col), rng, tau > 0 ? w[tau - 1] : 1.0), false};
  }

 private:
  static void check_length(std::size_t k) {
    if (k > max_draft_length) {
      throw error(fmt::format("block_verifier: {} drafts; at most max_draft_length = {} per call", k, max_draft_length));
    }
  }
};

/// Token-wise verification as a free function; see `tokenwise_verifier`.
template <std::uniform_random_bit_generator Rng>
verify_result verify_tokenwise(std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q,
                               const Eigen::Ref<const Eigen::MatrixXf>& p, Rng& rng) {
  return tokenwise_verifier{}(drafts, q, p, rng);
}

/// Calls `f` with the verifier `params` selects, as the sampling loops verify with it:
/// `block_verifier{}` for `verification::block`, else `tokenwise_verifier{params.leniency}`; returns
/// what `f` returns (the same type for both).
template <class F>
decltype(auto) with_verifier(const speculative_params& params, F&& f) {
  if (params.verify == verification::block) return std::forward<F>(f)(block_verifier{});
  return std::forward<F>(f)(tokenwise_verifier{params.leniency});
}

}  // namespace specsample
