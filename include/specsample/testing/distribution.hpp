#pragma once
/// @file distribution.hpp
/// Tools to prove a sampler exact: the exact distribution of every output sequence of a model,
/// a histogram of sampled sequences, and a G-test of one against the other.

#include <specsample/concepts.hpp>
#include <specsample/error.hpp>
#include <specsample/sampling/loop.hpp>
#include <specsample/sampling/params.hpp>
#include <specsample/sampling/verify.hpp>
#include <specsample/sampling/warp.hpp>

#include <Eigen/Core>
#include <fmt/format.h>
#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

namespace specsample::testing {

namespace detail {

template <language_model M>
void enumerate(M& model, logit_warper& warp, const Eigen::VectorXf& dist, std::size_t depth, std::size_t length,
               std::size_t index, double prob, xt::xarray<double>& table) {
  const auto v = static_cast<std::size_t>(dist.size());
  Eigen::VectorXf next(dist.size());
  for (std::size_t x = 0; x < v; ++x) {
    const double px = prob * static_cast<double>(dist(static_cast<Eigen::Index>(x)));
    if (px == 0.0) continue;
    const std::size_t child = index * v + x;
    if (depth + 1 == length) {
      table.flat(child) += px;
      continue;
    }
    const token t = static_cast<token>(x);
    Eigen::MatrixXf logits = model.append(std::span<const token>(&t, 1));
    warp(logits.col(0), next);
    enumerate(model, warp, next, depth + 1, length, child, px, table);
    model.truncate(model.size() - 1);
  }
}

// Regularised upper incomplete gamma Q(a, x) (Numerical Recipes gser / gcf).
inline double gamma_q(double a, double x) {
  if (x <= 0.0) return 1.0;
  const double log_prefix = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1.0) {  // series for P, then Q = 1 - P
    double term = 1.0 / a;
    double sum = term;
    for (int n = 1; n < 10000; ++n) {
      term *= x / (a + n);
      sum += term;
      if (std::fabs(term) < std::fabs(sum) * 1e-15) break;
    }
    return std::max(0.0, 1.0 - sum * std::exp(log_prefix));
  }
  // Lentz continued fraction for Q
  constexpr double tiny = 1e-300;
  double b = x + 1.0 - a;
  double c = 1.0 / tiny;
  double d = 1.0 / b;
  double h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < 1e-15) break;
  }
  return std::exp(log_prefix) * h;
}

}  // namespace detail

/// The longest sequence `exact_sequence_distribution` enumerates (it recurses once per token; with
/// V >= 2 the 1e7-sequence cap already stops it at 23).
inline constexpr std::size_t max_sequence_length = 64;

/// The exact probability of every sequence of `length` tokens that sampling from `model` after
/// `prompt` with warping `sampling` can produce, as an L-dimensional (V, ..., V) table
/// (entry [x0, ..., x(L-1)] = P(x0 ... x(L-1))). Enumerates every prefix with positive probability
/// using the model's own append / truncate, so it works for any `language_model`; cost is
/// O(V^L) model calls, meant for tiny vocabularies. Leaves `model` holding `prompt`.
template <language_model M>
[[nodiscard]] xt::xarray<double> exact_sequence_distribution(M& model, std::span<const token> prompt,
                                                            std::size_t length, const sampling_params& sampling) {
  if (prompt.empty()) throw error("exact_sequence_distribution: the prompt must not be empty");
  if (length == 0 || length > max_sequence_length) {
    throw error(fmt::format("exact_sequence_distribution: length must be in 1..{}, got {}", max_sequence_length,
                            length));
  }
  const auto v = static_cast<std::size_t>(model.vocab_size());
  double cells = 1.0;
  for (std::size_t i = 0; i < length; ++i) cells *= static_cast<double>(v);
  if (cells > 1e7) {
    throw error(fmt::format("exact_sequence_distribution: {}^{} sequences are too many to enumerate", v, length));
  }
  xt::xarray<double> table = xt::zeros<double>(std::vector<std::size_t>(length, v));
  logit_warper warp(sampling, v);
  model.truncate(0);
  Eigen::MatrixXf logits = model.append(prompt);
  Eigen::VectorXf first(static_cast<Eigen::Index>(v));
  warp(logits.col(logits.cols() - 1), first);
  detail::enumerate(model, warp, first, 0, length, 0, 1.0, table);
  return table;
}

/// Counts of sampled sequences in the same (V, ..., V) layout as `exact_sequence_distribution`.
class sequence_histogram {
 public:
  sequence_histogram(std::size_t vocab, std::size_t length)
      : vocab_(vocab), length_(length), counts_(xt::zeros<double>(std::vector<std::size_t>(length, vocab))) {}

  /// Adds one sample; it must hold exactly `length` in-range tokens.
  void add(std::span<const token> sequence) {
    if (sequence.size() != length_) {
      throw error(fmt::format("sequence_histogram: expected {} tokens, got {}", length_, sequence.size()));
    }
    std::size_t index = 0;
    for (const token x : sequence) {
      if (!in_vocabulary(x, vocab_)) {
        throw error(fmt::format("sequence_histogram: token {} out of range for vocabulary {}", x, vocab_));
      }
      index = index * vocab_ + static_cast<std::size_t>(x);
    }
    counts_.flat(index) += 1.0;
    ++samples_;
  }

  [[nodiscard]] const xt::xarray<double>& counts() const noexcept { return counts_; }
  [[nodiscard]] std::size_t samples() const noexcept { return samples_; }

 private:
  std::size_t vocab_;
  std::size_t length_;
  xt::xarray<double> counts_;
  std::size_t samples_ = 0;
};

/// The outcome of a goodness-of-fit test.
struct fit_result {
  double statistic = 0.0;    ///< G = 2 Σ O ln(O / E) over the bins
  std::size_t dof = 0;       ///< bins - 1
  double p_value = 1.0;      ///< P(χ²(dof) >= G); 0 when a sample has probability zero
  std::size_t bins = 0;      ///< cells with E >= min_expected, plus one pooled bin of the rest
  std::size_t impossible = 0;  ///< samples that fell in cells of probability zero
};

/// G-test of `observed` counts against `expected` probabilities (same shape). Cells with expected
/// count below `min_expected` are pooled into one bin so the χ² approximation holds. Any sample
/// in a zero-probability cell makes the p-value 0.
inline fit_result g_test(const xt::xarray<double>& observed, const xt::xarray<double>& expected,
                         double min_expected = 5.0) {
  if (observed.shape() != expected.shape()) throw error("g_test: observed and expected shapes differ");
  double n = 0.0;
  for (const double o : observed) n += o;
  fit_result r;
  double pooled_o = 0.0;
  double pooled_e = 0.0;
  std::size_t bins = 0;
  double g = 0.0;
  auto term = [](double o, double e) { return o > 0.0 ? o * std::log(o / e) : 0.0; };
  for (std::size_t i = 0; i < observed.size(); ++i) {
    const double o = observed.flat(i);
    const double e = expected.flat(i) * n;
    if (expected.flat(i) <= 0.0) {
      r.impossible += static_cast<std::size_t>(o);
      continue;
    }
    if (e < min_expected) {
      pooled_o += o;
      pooled_e += e;
      continue;
    }
    g += term(o, e);
    ++bins;
  }
  if (pooled_e > 0.0) {
    g += term(pooled_o, pooled_e);
    ++bins;
  }
  r.statistic = 2.0 * g;
  r.bins = bins;
  r.dof = bins > 0 ? bins - 1 : 0;
  if (r.impossible > 0) {
    r.statistic = std::numeric_limits<double>::infinity();
    r.p_value = 0.0;
  } else {
    r.p_value = r.dof == 0 ? 1.0 : detail::gamma_q(0.5 * static_cast<double>(r.dof), 0.5 * r.statistic);
  }
  return r;
}

/// The target's exact distribution of what generation emits when it stops right after `eos`:
/// `full` (from `exact_sequence_distribution`, (V, ..., V) over L tokens) mapped to (V + 1)^L by
/// cutting every sequence after its first EOS and filling the rest with the marker V ("absent").
[[nodiscard]] inline xt::xarray<double> eos_truncated_distribution(const xt::xarray<double>& full, std::size_t vocab,
                                                                   std::size_t length, token eos) {
  xt::xarray<double> table = xt::zeros<double>(std::vector<std::size_t>(length, vocab + 1));
  std::vector<token> s(length);
  for (std::size_t index = 0; index < full.size(); ++index) {
    for (std::size_t i = length, rest = index; i-- > 0; rest /= vocab) s[i] = static_cast<token>(rest % vocab);
    std::size_t key = 0;
    bool ended = false;
    for (const token x : s) {
      key = key * (vocab + 1) + (ended ? vocab : static_cast<std::size_t>(x));
      ended = ended || x == eos;
    }
    table.flat(key) += full.flat(index);
  }
  return table;
}

/// `speculative_fit`'s default verifier: the rule `params` name (`params.verify`, `params.leniency`),
/// as `speculative_sample` without a verifier uses.
struct verifier_from_params {};

/// The whole exactness check for one pair: enumerates the target's exact distribution over
/// sequences of `params.max_new_tokens` tokens after `prompt`, draws `samples` speculative samples
/// (with `verifier`; by default the rule `params` name, lossy leniency included) and G-tests them
/// against it. `draft` is a model or
/// any `drafter` (n-gram, a `model_drafter` with early stopping, ...). With `params.eos` set,
/// generation stops right after the first EOS, so both sides are compared over (V + 1)^L, every
/// position after an EOS holding an "absent" marker (`eos_truncated_distribution`): a sampler
/// that emitted a token after an EOS lands in a cell of probability zero. Cost: V^L model calls
/// plus `samples` generations, so keep the vocabulary and length small (or restrict a large model
/// with top-k).
template <class Draft, language_model Target, std::uniform_random_bit_generator Rng,
          class Verifier = verifier_from_params>
  requires(language_model<Draft> || drafter<Draft>)
[[nodiscard]] fit_result speculative_fit(Draft& draft, Target& target, std::span<const token> prompt,
                                         const speculative_params& params, std::size_t samples, Rng& rng,
                                         Verifier verifier = {}) {
  if (samples == 0) throw error("speculative_fit: samples must be >= 1");
  const std::size_t L = params.max_new_tokens, V = static_cast<std::size_t>(target.vocab_size());
  const auto full = exact_sequence_distribution(target, prompt, L, params.sampling);
  const auto exact = params.eos ? eos_truncated_distribution(full, V, L, *params.eos) : full;
  sequence_histogram hist(params.eos ? V + 1 : V, L);
  no_observer none;
  for (std::size_t i = 0; i < samples; ++i) {
    std::vector<token> out;
    if constexpr (std::is_same_v<Verifier, verifier_from_params>) {
      out = speculative_sample(draft, target, prompt, params, rng, none).tokens;
    } else if constexpr (language_model<Draft>) {
      out = speculative_sample(draft, target, prompt, params, rng, none, verifier).tokens;
    } else {
      out = specsample::detail::generate(draft, target, prompt, params, rng, none, verifier).tokens;
    }
    if (params.eos && out.size() < L) out.resize(L, static_cast<token>(V));  // (only EOS ends a run early)
    hist.add(out);
  }
  return g_test(hist.counts(), exact);
}

/// The total variation distance between two distributions of the same shape.
inline double total_variation(const xt::xarray<double>& a, const xt::xarray<double>& b) {
  if (a.shape() != b.shape()) throw error("total_variation: shapes differ");
  double tv = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) tv += std::fabs(a.flat(i) - b.flat(i));
  return 0.5 * tv;
}

}  // namespace specsample::testing
