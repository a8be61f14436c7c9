#pragma once
/// @file warp.hpp
/// Logits -> warped probability vector: temperature, top-k, top-p, min-p.

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
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace specsample {

/// Turns one column of logits into the warped probability vector used for sampling and for
/// verification. Holds the scratch it needs, so calls allocate nothing.
///
/// Steps (docs/algorithm.md): softmax(logits / T) (the exponentials with the vector exp of the best
/// instruction set this CPU has, the same one for every call: a probability below 2^-126 times
/// the most probable token's is 0); keep the top_k most probable; keep the smallest
/// most-probable prefix with mass >= top_p (within 2^-22 of top_p: the rounding of a float
/// renormalisation); keep p >= min_p * max p; renormalise after each step.
/// Ties are ordered by the lower token id. T = 0 gives the one-hot argmax (lowest id on ties).
/// Every T > 0 is softmax(logits / T) as written, however small: a subnormal T (whose reciprocal
/// overflows float) is divided in double, so as T -> 0+ the result tends to the greedy one-hot
/// (uniform over exactly tied maxima, which only T = 0 breaks by lowest id) instead of NaN.
/// The differences x - max are taken in float before the division by T: logits more than
/// FLT_MAX (3.4e38) below the maximum get probability 0 even where T > 1 would bring them back
/// into range (no real model's logits come near).
/// Logits may be -inf (probability zero); NaN, +inf, or a column that is entirely -inf throw.
class logit_warper {
 public:
  /// @param vocab the length of every logits column this warper will see.
  /// @param model  whose logits these are ("target", "draft"), named in the errors; none by default.
  logit_warper(const sampling_params& params, std::size_t vocab, const char* model = nullptr)
      : params_(params), vocab_(vocab), model_(model) {
    validate(params_);
    if (vocab == 0) throw error("logit_warper: vocabulary size must be positive");
    if (params_.top_k > 0 || params_.top_p < 1.0f) {
      if (vocab > std::size_t{0xFFFFFFFFu}) {
        throw error(fmt::format("logit_warper: top-k / top-p support vocabularies below 2^32 tokens, got {}", vocab));
      }
      best_.resize(vocab);  // (sized once: the dense collection writes every token's key)
    }
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
    // The logits as contiguous floats: read in place, or (`logits` may be any expression) copied
    // into probs first.
    const float* x = detail::contiguous_floats(logits);
    if (x == nullptr) {
      probs = logits;
      x = probs.data();
    }
    if (params_.temperature == 0.0f) {
      const std::ptrdiff_t best = simd::argmax(isa_, x, vocab_);
      if (best < 0) diagnose(logits);
      probs.setZero();
      probs(static_cast<Eigen::Index>(best)) = 1.0f;
      return;
    }
    const float m = simd::max_value(isa_, x, vocab_);
    const float inv_t = 1.0f / params_.temperature;
    double total = 0.0;
    if (std::isnormal(inv_t)) {
      total = simd::exp_shifted(isa_, x, probs.data(), vocab_, m, inv_t);  // NaN if a logit is NaN
    } else {
      // T < 2^-128 (subnormal): 1/T overflows float and the maximum would become 0 * inf = NaN.
      // T > 2^126: 1/T is subnormal, which denormals-are-zero (-ffast-math's startup code, or a
      // caller's MXCSR) reads as 0, every token then equally likely. Divide by T in double, where
      // every such quotient is finite and normal: the same softmax(logits / T).
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
      normalise(probs, simd::weight_sum(isa_, simd::weight_kind::plain, probs.data(), nullptr, 1.0, n));
    }
  }

 private:
  template <class Derived>
  [[noreturn]] void diagnose(const Eigen::MatrixBase<Derived>& logits) const {
    const std::string whose = model_ != nullptr ? fmt::format("{} model's logits", model_) : std::string("logits");
    bool any_finite = false;
    for (Eigen::Index i = 0; i < logits.size(); ++i) {
      const float x = logits(i);
      if (std::isnan(x)) throw error(fmt::format("{} contain NaN at token id {}", whose, i));
      if (x == std::numeric_limits<float>::infinity()) {
        throw error(fmt::format("{} contain +inf at token id {} (only -inf, probability zero, is allowed)", whose, i));
      }
      any_finite = any_finite || std::isfinite(x);
    }
    if (!any_finite) throw error(fmt::format("{} are -inf for every token: the distribution has no mass", whose));
    throw error(fmt::format("{} could not be normalised", whose));  // unreachable with IEEE floats
  }

  void normalise(Eigen::Ref<Eigen::VectorXf> probs, double total) const {
    simd::scale(isa_, probs.data(), static_cast<std::size_t>(probs.size()), static_cast<float>(1.0 / total));
  }

  // Tokens ordered by probability, more probable first and the lower id first among equals: the
  // key (bits of p, ~id) orders like that as an unsigned integer, because the bit patterns of
  // non-negative floats order like their values.
  [[nodiscard]] static std::uint64_t key(float p, std::size_t id) noexcept {
    std::uint32_t bits = 0;
    if (p > 0.0f) std::memcpy(&bits, &p, sizeof bits);
    return (std::uint64_t{bits} << 32) | (0xFFFFFFFFu - static_cast<std::uint32_t>(id));
  }
  [[nodiscard]] static float probability(std::uint64_t key) noexcept {
    const auto bits = static_cast<std::uint32_t>(key >> 32);
    float p = 0.0f;
    std::memcpy(&p, &bits, sizeof p);
    return p;
  }

  // Candidate sets. The tokens with p > t for a threshold t are a prefix of the order above, so a
  // prefix that decides top-k or top-p lies inside the first such set that is large (k tokens) or
  // heavy (top_p of the mass) enough. The thresholds are max p · 2^-j for j = 1..16, then
  // coarser, then 0 (every positive token); `simd::tally_above` counts and weighs the sets of
  // tally_width thresholds in one vector pass, and only the chosen set is searched.
  static constexpr int threshold_exponents[] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12,
                                                13, 14, 15, 16, 20, 24, 32, 48, 64, 96, 128};
  static constexpr std::size_t thresholds = std::size(threshold_exponents) + 1;  // + the final 0

  // Threshold number j (0 .. thresholds-1) for a distribution whose largest probability is m.
  [[nodiscard]] static float threshold(float m, std::size_t j) noexcept {
    return j + 1 < thresholds ? std::ldexp(m, -threshold_exponents[j]) : 0.0f;
  }

  // A candidate set: the index of its threshold and its number of tokens.
  struct candidate_set {
    std::size_t j, count;
  };

  // The first threshold from `from` on whose set has at least `count` tokens (by_count) or at least
  // `mass` of probability (else), or {thresholds, vocab_} when none has.
  [[nodiscard]] candidate_set first_threshold(const float* p, float m, std::size_t from, bool by_count,
                                              std::size_t count, double mass) const {
    for (std::size_t j0 = from; j0 < thresholds; j0 += simd::tally_width) {
      const std::size_t nt = std::min(simd::tally_width, thresholds - j0);
      float t[simd::tally_width];
      std::size_t c[simd::tally_width];
      double w[simd::tally_width];
      for (std::size_t j = 0; j < nt; ++j) t[j] = threshold(m, j0 + j);
      simd::tally_above(isa_, p, vocab_, t, nt, c, w);
      for (std::size_t j = 0; j < nt; ++j) {
        if (by_count ? c[j] >= count : w[j] >= mass) return {j0 + j, c[j]};
      }
    }
    return {thresholds, vocab_};
  }

  // The keys of the tokens with p > t, unordered, into the front of best_ (vocab_ keys long: one
  // per token at most); returns their end. `count` is their number by the tally. A sparse set by
  // the vector search, which skips to each one; a dense one (over a quarter of the vocabulary: a
  // flat distribution's), where a search per token would cost more, by testing every token without
  // a branch (every key written, the count advanced by the test).
  [[nodiscard]] std::vector<std::uint64_t>::iterator collect_above(const float* p, float t, std::size_t count) {
    std::size_t n = 0;
    if (4 * count <= vocab_) {
      for (std::size_t i = 0; (i += simd::find_greater(isa_, p + i, vocab_ - i, t)) < vocab_; ++i) {
        best_[n++] = key(p[i], i);
      }
    } else {
      for (std::size_t i = 0; i < vocab_; ++i) {
        best_[n] = key(p[i], i);
        n += p[i] > t ? 1 : 0;
      }
    }
    return best_.begin() + static_cast<std::ptrdiff_t>(n);
  }

  void keep_top_k(Eigen::Ref<Eigen::VectorXf> probs) {
    const auto k = static_cast<std::size_t>(params_.top_k);
    const float* p = probs.data();
    const float m = simd::max_value(isa_, p, vocab_);
    const candidate_set s = first_threshold(p, m, 0, true, k, 0.0);
    if (s.j == thresholds) return;  // fewer than k tokens have p > 0: top-k keeps them all
    const auto end = collect_above(p, threshold(m, s.j), s.count);
    std::nth_element(best_.begin(), best_.begin() + static_cast<std::ptrdiff_t>(k - 1), end, std::greater<>());
    keep_down_to(probs, best_[k - 1]);
  }

  // The smallest most-probable prefix with mass >= top_p (`top_p_last`), where a mass short of
  // top_p by at most 2^-22 of it reaches it: more than the float renormalisation before this step
  // (≤ 2^-23 per entry) may take from a prefix whose exact mass is top_p. Softmax {1, 1, 0} cut to
  // top_k = 2 leaves two tokens of 0.49999997 (scaled by the float reciprocal of their sum), whose
  // exact mass 0.5 reaches top_p = 0.5 with the first of them alone, as without a third token.
  void keep_top_p(Eigen::Ref<Eigen::VectorXf> probs) {
    const double target = static_cast<double>(params_.top_p) * (1.0 - 0x1p-22);
    const float* p = probs.data();
    const float m = simd::max_value(isa_, p, vocab_);
    // The masses from tally_above are approximate, so a set may turn out too light (its prefix
    // sum stays under top_p: the next heavy-looking set is tried) or none may look heavy enough
    // (then the last set, every positive token, decides).
    for (candidate_set s = first_threshold(p, m, 0, false, 0, target);;
         s = first_threshold(p, m, s.j + 1, false, 0, target)) {
      if (s.j == thresholds) s = {thresholds - 1, vocab_};  // (every positive token: assume dense)
      if (const std::optional<std::uint64_t> last = top_p_last(collect_above(p, threshold(m, s.j), s.count), target)) {
        keep_down_to(probs, *last);
        return;
      }
      if (s.j == thresholds - 1) break;
    }
    // Every positive token together stays just under top_p by rounding: keep everything.
  }

  // The key of the last token of the smallest prefix of [best_.begin(), end), in key order, whose
  // mass reaches `target`; none when all of it stays under. Selected, not sorted, in linear time on
  // average: a large set is first narrowed to the keys of one bin of probabilities (the float's
  // exponent and top 3 mantissa bits: a factor of 2^(1/8)) by the bins' masses; then each step
  // splits the undecided keys at their median (nth_element) and, when the upper half's mass stays
  // under what is still missing, keeps it whole and goes on in the lower half, else in the upper
  // one; only the last few dozen keys are sorted. (A sort of the flat distribution of a high
  // temperature, ~44 000 of 50257 tokens in the set, cost ~3 ms per column.) Masses are summed in
  // double, bin by bin and chunk by chunk: once a step has found the cut inside [lo, hi), sums
  // of the same keys in another order that fall an ulp short keep all of it.
  [[nodiscard]] std::optional<std::uint64_t> top_p_last(std::vector<std::uint64_t>::iterator end, double target) {
    auto lo = best_.begin(), hi = end;  // undecided; every key ordered before them is kept
    double kept = 0.0;                  // their mass, under target
    bool reached = false;                        // a step found [lo, hi) to reach target
    if (hi - lo > 256) {
      constexpr auto bin = [](std::uint64_t k) noexcept { return static_cast<std::size_t>(k >> 52); };  // < 2048
      std::array<double, 2048> mass{};
      for (auto it = lo; it != hi; ++it) mass[bin(*it)] += static_cast<double>(probability(*it));
      std::size_t b = mass.size();
      while (b > 0 && kept + mass[b - 1] < target) kept += mass[--b];
      if (b == 0) return std::nullopt;
      const std::size_t cut = b - 1;  // the bin that reaches target
      hi = std::partition(lo, hi, [&](std::uint64_t k) { return bin(k) == cut; });  // (the keys above it: kept)
      reached = true;
    }
    while (hi - lo > 32) {
      const auto mid = lo + (hi - lo) / 2;
      std::nth_element(lo, mid, hi, std::greater<>());  // [lo, mid] the larger keys
      double upper = 0.0;
      for (auto it = lo; it <= mid; ++it) upper += static_cast<double>(probability(*it));
      if (kept + upper >= target) {
        hi = mid + 1;
        reached = true;
      } else {
        kept += upper;
        lo = mid + 1;
      }
    }
    std::sort(lo, hi, std::greater<>());
    for (auto it = lo; it != hi; ++it) {
      kept += static_cast<double>(probability(*it));
      if (kept >= target) return *it;
    }
    if (reached) return *(hi - 1);  // (non-empty: a bin holding the cut has keys, so has [lo, mid])
    return std::nullopt;
  }

  // Zeroes every token ordered after `last` (the key of the last token kept), then renormalises.
  void keep_down_to(Eigen::Ref<Eigen::VectorXf> probs, std::uint64_t last) {
    simd::zero_after(isa_, probs.data(), vocab_, probability(last), 0xFFFFFFFFu - static_cast<std::uint32_t>(last));
    normalise(probs, simd::weight_sum(isa_, simd::weight_kind::plain, probs.data(), nullptr, 1.0, vocab_));
  }

  sampling_params params_;
  std::size_t vocab_;
  const char* model_ = nullptr;     // named in the errors, when set
  isa isa_ = simd::detected();      // the vector kernels (exp, max, sums, search)
  std::vector<std::uint64_t> best_;  // scratch of top-k / top-p (vocab_ keys): the most probable tokens
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
