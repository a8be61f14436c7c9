#pragma once
/// @file warp.hpp
/// Logits -> warped probability vector: temperature, top-k, top-p, min-p.

#include <specsample/concepts.hpp>
#include <specsample/detail/simd.hpp>
#include <specsample/error.hpp>
#include <specsample/sampling/params.hpp>

#include <Eigen/Core>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <vector>

namespace specsample {

/// Turns one column of logits into the warped probability vector used for sampling and for
/// verification. Holds the scratch it needs, so calls allocate nothing.
///
/// Steps (docs/algorithm.md): softmax(logits / T) (the exponentials with the vector exp of the best
/// instruction set this CPU has, the same one for every call: a probability below 2^-126 times
/// the most probable token's is 0); keep the top_k most probable; keep the smallest
/// most-probable prefix with mass >= top_p; keep p >= min_p * max p; renormalise after each step.
/// Ties are ordered by the lower token id. T = 0 gives the one-hot argmax (lowest id on ties).
/// Every T > 0 is softmax(logits / T) as written, however small: a subnormal T (whose reciprocal
/// overflows float) is divided in double, so as T -> 0+ the result tends to the greedy one-hot
/// (uniform over exactly tied maxima, which only T = 0 breaks by lowest id) instead of NaN.
/// Logits may be -inf (probability zero); NaN, +inf, or a column that is entirely -inf throw.
class logit_warper {
 public:
  /// @param vocab the length of every logits column this warper will see.
  logit_warper(const sampling_params& params, std::size_t vocab)
      : params_(params), vocab_(vocab), order_(vocab) {
    validate(params_);
    if (vocab == 0) throw error("logit_warper: vocabulary size must be positive");
  }

  [[nodiscard]] const sampling_params& params() const noexcept { return params_; }
  [[nodiscard]] std::size_t vocab_size() const noexcept { return vocab_; }

  /// Writes the warped distribution of `logits` (length vocab) into `probs` (length vocab).
  template <class Derived>
  void operator()(const Eigen::MatrixBase<Derived>& logits, Eigen::Ref<Eigen::VectorXf> probs) {
    const auto v = static_cast<Eigen::Index>(vocab_);
    if (logits.size() != v || probs.size() != v) {
      throw error(fmt::format("logit_warper: got {} logits for a vocabulary of {} tokens "
                              "(output vector has {})", logits.size(), vocab_, probs.size()));
    }
    if (params_.temperature == 0.0f) {
      probs = logits;
      const std::ptrdiff_t best = simd::argmax(isa_, probs.data(), vocab_);
      if (best < 0) diagnose(logits);
      probs.setZero();
      probs(static_cast<Eigen::Index>(best)) = 1.0f;
      return;
    }
    probs = logits;  // contiguous (`logits` may be any expression)
    const float m = simd::max_value(isa_, probs.data(), vocab_);
    const float inv_t = 1.0f / params_.temperature;
    double total = 0.0;
    if (std::isfinite(inv_t)) {
      total = simd::exp_shifted(isa_, probs.data(), vocab_, m, inv_t);  // NaN if a logit is NaN
    } else {
      // T < 2^-128 (subnormal): 1/T overflows float and the maximum would become 0 * inf = NaN.
      // Divide by T in double, where every such quotient is finite: the same softmax(logits / T).
      const double t = static_cast<double>(params_.temperature);
      for (Eigen::Index i = 0; i < v; ++i) {
        probs(i) = static_cast<float>(std::exp((static_cast<double>(logits(i)) - static_cast<double>(m)) / t));
      }
      total = probs.template cast<double>().sum();
    }
    if (!std::isfinite(m) || !(total > 0.0) || !std::isfinite(total)) {
      diagnose(logits);  // throws with the precise problem
    }
    normalise(probs, total);
    const auto n = static_cast<std::size_t>(v);
    if (params_.top_k > 0 && static_cast<std::size_t>(params_.top_k) < n) keep_top_k(probs);
    if (params_.top_p < 1.0f) keep_top_p(probs);
    if (params_.min_p > 0.0f) {
      const float threshold = params_.min_p * probs.maxCoeff();
      probs = (probs.array() >= threshold).select(probs, 0.0f);
      normalise(probs, probs.template cast<double>().sum());
    }
  }

 private:
  template <class Derived>
  [[noreturn]] static void diagnose(const Eigen::MatrixBase<Derived>& logits) {
    bool any_finite = false;
    for (Eigen::Index i = 0; i < logits.size(); ++i) {
      const float x = logits(i);
      if (std::isnan(x)) throw error(fmt::format("logits contain NaN at token {}", i));
      if (x == std::numeric_limits<float>::infinity()) {
        throw error(fmt::format("logits contain +inf at token {} (only -inf, probability zero, is allowed)", i));
      }
      any_finite = any_finite || std::isfinite(x);
    }
    if (!any_finite) throw error("logits are -inf for every token: the distribution has no mass");
    throw error("logits could not be normalised");  // unreachable with IEEE floats
  }

  void normalise(Eigen::Ref<Eigen::VectorXf> probs, double total) const {
    simd::scale(isa_, probs.data(), static_cast<std::size_t>(probs.size()), static_cast<float>(1.0 / total));
  }

  // Strict order: more probable first, lower id first among equals.
  auto by_probability(const Eigen::Ref<Eigen::VectorXf>& probs) const {
    return [&probs](token a, token b) {
      return probs(a) > probs(b) || (probs(a) == probs(b) && a < b);
    };
  }

  void keep_top_k(Eigen::Ref<Eigen::VectorXf> probs) {
    std::iota(order_.begin(), order_.end(), token{0});
    const auto k = static_cast<std::ptrdiff_t>(params_.top_k);
    std::nth_element(order_.begin(), order_.begin() + k - 1, order_.end(), by_probability(probs));
    zero_from(probs, static_cast<std::size_t>(k));
  }

  // The smallest most-probable prefix with mass >= top_p. Sorts a growing prefix (64, 256, ...)
  // instead of the whole vocabulary: the nucleus is usually small.
  void keep_top_p(Eigen::Ref<Eigen::VectorXf> probs) {
    std::iota(order_.begin(), order_.end(), token{0});
    const std::size_t n = order_.size();
    const double target = static_cast<double>(params_.top_p);
    for (std::size_t m = std::min<std::size_t>(n, 64);; m = std::min(n, 4 * m)) {
      std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(m), order_.end(),
                        by_probability(probs));
      double mass = 0.0;
      for (std::size_t j = 0; j < m; ++j) {
        mass += static_cast<double>(probs(order_[j]));
        if (mass >= target) {
          zero_from(probs, j + 1);
          return;
        }
      }
      if (m == n) return;  // rounding kept the total just under top_p: keep everything
    }
  }

  // Zeroes every token after the first `keep` entries of order_, then renormalises.
  void zero_from(Eigen::Ref<Eigen::VectorXf> probs, std::size_t keep) {
    for (std::size_t j = keep; j < order_.size(); ++j) probs(order_[j]) = 0.0f;
    normalise(probs, probs.template cast<double>().sum());
  }

  sampling_params params_;
  std::size_t vocab_;
  isa isa_ = simd::detected();  // the vector exp of the softmax
  std::vector<token> order_;  // scratch permutation of token ids
};

/// Convenience: the warped distribution of one logits vector (allocates; loops use logit_warper).
template <class Derived>
[[nodiscard]] Eigen::VectorXf warp(const Eigen::MatrixBase<Derived>& logits, const sampling_params& params) {
  logit_warper w(params, static_cast<std::size_t>(logits.size()));
  Eigen::VectorXf probs(logits.size());
  w(logits, probs);
  return probs;
}

}  // namespace specsample
