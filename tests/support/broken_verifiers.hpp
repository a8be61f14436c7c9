#pragma once
// Deliberately broken verifiers and the thresholds of the exactness tests. Every statistical
// test runs the exact sampler (p-value must stay above pass_threshold) and one of these (p-value
// must fall below fail_threshold): a test that cannot fail proves nothing.

#include <specsample/sampling/random.hpp>
#include <specsample/sampling/verify.hpp>

#include <Eigen/Core>

#include <span>

namespace specsample::test {

inline constexpr double pass_threshold = 1e-3;
inline constexpr double fail_threshold = 1e-6;

// On rejection draws from p instead of norm(max(0, p - q)): over-weights tokens the draft favours.
struct resample_from_target {
  template <class Rng>
  verify_result operator()(std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q,
                           const Eigen::Ref<const Eigen::MatrixXf>& p, Rng& rng) const {
    const auto k = static_cast<Eigen::Index>(drafts.size());
    for (Eigen::Index i = 0; i < k; ++i) {
      const token x = drafts[static_cast<std::size_t>(i)];
      if (p(x, i) >= q(x, i) || uniform_01(rng) < double(p(x, i)) / double(q(x, i))) continue;
      return {static_cast<std::size_t>(i), sample_categorical(p.col(i), rng), false};
    }
    return {static_cast<std::size_t>(k), sample_categorical(p.col(k), rng), true};
  }
};

// Draws the bonus token from the wrong column (p_{K-1} instead of p_K): an off-by-one that only
// shows when every draft is accepted, so it is the one that draft == target can expose.
struct bonus_from_previous_column {
  template <class Rng>
  verify_result operator()(std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q,
                           const Eigen::Ref<const Eigen::MatrixXf>& p, Rng& rng) const {
    verify_result r = tokenwise_verifier{}(drafts, q, p, rng);
    if (r.bonus && !drafts.empty()) r.next = sample_categorical(p.col(static_cast<Eigen::Index>(drafts.size()) - 1), rng);
    return r;
  }
};

// Accepts with probability p(x) instead of min(1, p(x)/q(x)).
struct accept_with_target_probability {
  template <class Rng>
  verify_result operator()(std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q,
                           const Eigen::Ref<const Eigen::MatrixXf>& p, Rng& rng) const {
    const auto k = static_cast<Eigen::Index>(drafts.size());
    for (Eigen::Index i = 0; i < k; ++i) {
      const token x = drafts[static_cast<std::size_t>(i)];
      if (uniform_01(rng) < double(p(x, i))) continue;
      return {static_cast<std::size_t>(i), sample_residual(p.col(i), q.col(i), rng), false};
    }
    return {static_cast<std::size_t>(k), sample_categorical(p.col(k), rng), true};
  }
};

}  // namespace specsample::test
