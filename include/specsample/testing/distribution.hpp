#pragma once
/// @file distribution.hpp
/// Tools to prove a sampler exact: the exact distribution of every output sequence of a model,
/// a histogram of sampled sequences, and a χ² goodness-of-fit test of one against the other.

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

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

namespace specsample::testing {

/// The longest sequence `exact_sequence_distribution` enumerates (it recurses once per token; with
/// V >= 2 the cell cap already stops it at 23).
inline constexpr std::size_t max_sequence_length = 64;

/// The most cells a table of sequences (V^L for V tokens and length L) may have.
inline constexpr std::size_t max_table_cells = 10'000'000;

namespace detail {

// V^L, the cells of a table of `length`-token sequences over `vocab` tokens, refused by `who`
// unless vocab >= 1, length in 1..max_sequence_length and V^L <= max_table_cells.
inline std::size_t table_cells(std::size_t vocab, std::size_t length, const char* who) {
  if (vocab == 0) throw error(fmt::format("{}: the vocabulary is empty", who));
  if (length == 0 || length > max_sequence_length) {
    throw error(fmt::format("{}: length must be in 1..{}, got {}", who, max_sequence_length, length));
  }
  std::size_t cells = 1;
  for (std::size_t i = 0; i < length; ++i) {
    if (cells > max_table_cells / vocab) {
      throw error(fmt::format("{}: {}^{} sequences are too many to enumerate (at most {} cells)", who, vocab, length,
                              max_table_cells));
    }
    cells *= vocab;
  }
  return cells;
}

// Appends `t` to `model` and warps the logits of its last token into `dist`, with the loops'
// checks of the model's side of the contract (logits shape, size).
template <language_model M>
void append_and_warp(M& model, std::span<const token> t, logit_warper& warp, Eigen::VectorXf& dist) {
  specsample::detail::forward(model, t, 1, static_cast<std::size_t>(dist.size()), "model",
                              [&](const auto& logits) { warp(logits.col(0), dist); });
}

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
    append_and_warp(model, std::span<const token>(&t, 1), warp, next);
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

/// The exact probability of every sequence of `length` tokens that sampling from `model` after
/// `prompt` with warping `sampling` can produce, as an L-dimensional (V, ..., V) table
/// (entry [x0, ..., x(L-1)] = P(x0 ... x(L-1))). Enumerates every prefix with positive probability
/// using the model's own append / truncate, so it works for any `language_model`; cost is up to
/// V^(L-1) model calls and a V^L table (at most `max_table_cells`), meant for tiny vocabularies:
/// a top-k or top-p warping does not shrink the table. Checks the prompt's ids, that the model
/// holds prompt + L - 1 tokens (`max_context`) and the shape of the logits it returns, as the
/// sampling loops do. Leaves `model` holding `prompt`.
template <language_model M>
[[nodiscard]] xt::xarray<double> exact_sequence_distribution(M& model, std::span<const token> prompt,
                                                            std::size_t length, const sampling_params& sampling) {
  if (prompt.empty()) throw error("exact_sequence_distribution: the prompt must not be empty");
  const std::size_t v = specsample::detail::vocabulary_of(model, "model");
  detail::table_cells(v, length, "exact_sequence_distribution");
  specsample::detail::check_prompt(prompt, v);
  specsample::detail::check_fits(model, "model", prompt.size(), length);
  xt::xarray<double> table = xt::zeros<double>(std::vector<std::size_t>(length, v));
  logit_warper warp(sampling, v);
  model.truncate(0);
  Eigen::VectorXf first(static_cast<Eigen::Index>(v));
  detail::append_and_warp(model, prompt, warp, first);
  detail::enumerate(model, warp, first, 0, length, 0, 1.0, table);
  return table;
}

/// Counts of sampled sequences in the same (V, ..., V) layout as `exact_sequence_distribution`.
class sequence_histogram {
 public:
  /// @throws error unless vocab >= 1, length in 1..max_sequence_length and vocab^length <=
  /// max_table_cells.
  sequence_histogram(std::size_t vocab, std::size_t length)
      : vocab_(vocab), length_(length), counts_(zeros(vocab, length)) {}

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
  static xt::xarray<double> zeros(std::size_t vocab, std::size_t length) {
    detail::table_cells(vocab, length, "sequence_histogram");
    return xt::zeros<double>(std::vector<std::size_t>(length, vocab));
  }

  std::size_t vocab_;
  std::size_t length_;
  xt::xarray<double> counts_;
  std::size_t samples_ = 0;
};

/// The outcome of a goodness-of-fit test.
struct fit_result {
  double statistic = 0.0;      ///< Pearson's X² = Σ (O − E)² / E over the bins
  std::size_t dof = 0;         ///< bins - 1
  double p_value = 1.0;        ///< P(χ²(dof) >= X²); 0 when a sample has probability zero
  std::size_t bins = 0;        ///< cells with E >= min_expected, plus one pooled bin of the rest
  std::size_t impossible = 0;  ///< samples that fell in cells of probability zero
};

/// Pearson's χ² test of `observed` counts against `expected` probabilities (same shape; the
/// probabilities sum to 1). Cells with an expected count below `min_expected` are pooled into one
/// bin, and that bin, when its own expected count is still below it, into the smallest other bin,
/// so the χ² approximation holds. (Pearson's statistic rather than the G-test's: with many cells
/// of expected count 5–20, G rejects a true hypothesis several times as often as the test's
/// level says.) Any sample in a zero-probability cell makes the p-value 0.
/// @throws error on mismatched shapes, expected values that are not probabilities summing to 1,
/// observed values that are not counts, no samples, a `min_expected` that is not positive, or too
/// few samples for two bins while the expected distribution has two or more outcomes (the test
/// would pass whatever was observed: the message says how many samples it needs).
inline fit_result chi_square_test(const xt::xarray<double>& observed, const xt::xarray<double>& expected,
                                  double min_expected = 5.0) {
  if (observed.shape() != expected.shape()) throw error("chi_square_test: observed and expected shapes differ");
  if (!(min_expected > 0.0) || !std::isfinite(min_expected)) {
    throw error(fmt::format("chi_square_test: min_expected must be finite and > 0, got {}", min_expected));
  }
  double n = 0.0;
  double total = 0.0;
  double largest = 0.0;  // the largest expected probability
  std::size_t outcomes = 0;  // cells of positive probability
  for (std::size_t i = 0; i < observed.size(); ++i) {
    const double o = observed.flat(i);
    const double e = expected.flat(i);
    if (!(o >= 0.0) || !std::isfinite(o) || o != std::floor(o)) {
      throw error(fmt::format("chi_square_test: observed count {} at cell {} is not a count", o, i));
    }
    if (!(e >= 0.0) || !std::isfinite(e)) {
      throw error(fmt::format("chi_square_test: expected probability {} at cell {} is not a probability", e, i));
    }
    n += o;
    total += e;
    largest = std::max(largest, e);
    outcomes += e > 0.0 ? 1 : 0;
  }
  if (std::fabs(total - 1.0) > 1e-6) {
    throw error(fmt::format("chi_square_test: the expected probabilities sum to {}, not 1", total));
  }
  if (n == 0.0) throw error("chi_square_test: no samples");
  fit_result r;
  double x2 = 0.0;
  double pooled_o = 0.0, pooled_e = 0.0;
  double smallest_o = 0.0, smallest_e = std::numeric_limits<double>::infinity();  // the smallest bin
  const auto term = [](double o, double e) { return (o - e) * (o - e) / e; };
  for (std::size_t i = 0; i < observed.size(); ++i) {
    const double o = observed.flat(i);
    const double e = expected.flat(i) * n;
    if (expected.flat(i) == 0.0) {
      r.impossible += static_cast<std::size_t>(o);
    } else if (e < min_expected) {
      pooled_o += o;
      pooled_e += e;
    } else {
      x2 += term(o, e);
      ++r.bins;
      if (e < smallest_e) {
        smallest_o = o;
        smallest_e = e;
      }
    }
  }
  if (pooled_e > 0.0) {
    if (pooled_e >= min_expected || r.bins == 0) {
      x2 += term(pooled_o, pooled_e);
      ++r.bins;
    } else {  // too small a bin of its own: merged into the smallest one
      x2 += term(smallest_o + pooled_o, smallest_e + pooled_e) - term(smallest_o, smallest_e);
    }
  }
  if (r.impossible > 0) {
    r.statistic = std::numeric_limits<double>::infinity();
    r.p_value = 0.0;
    r.dof = r.bins > 0 ? r.bins - 1 : 0;
    return r;
  }
  if (outcomes >= 2 && r.bins < 2) {
    const double needed = std::ceil(min_expected / std::min(largest, 1.0 - largest));
    throw error(fmt::format("chi_square_test: {} samples are too few to test {} possible outcomes: no two bins reach "
                            "an expected count of {}, so any sample would pass; it needs at least {} samples",
                            n, outcomes, min_expected, needed));
  }
  r.statistic = x2;
  r.dof = r.bins - 1;
  r.p_value = r.dof == 0 ? 1.0 : detail::gamma_q(0.5 * static_cast<double>(r.dof), 0.5 * x2);
  return r;
}

/// The target's exact distribution of what generation emits when it stops right after `eos`:
/// `full` (from `exact_sequence_distribution`, (V, ..., V) over L tokens) mapped to (V + 1)^L by
/// cutting every sequence after its first EOS and filling the rest with the marker V ("absent").
[[nodiscard]] inline xt::xarray<double> eos_truncated_distribution(const xt::xarray<double>& full, std::size_t vocab,
                                                                   std::size_t length, token eos) {
  const auto& shape = full.shape();
  if (full.dimension() != length || std::any_of(shape.begin(), shape.end(), [&](auto d) { return d != vocab; })) {
    throw error(fmt::format("eos_truncated_distribution: the table is not of {} tokens over a vocabulary of {}",
                            length, vocab));
  }
  if (!in_vocabulary(eos, vocab)) {
    throw error(fmt::format("eos_truncated_distribution: EOS id {} is out of range for a vocabulary of {}", eos,
                            vocab));
  }
  detail::table_cells(vocab + 1, length, "eos_truncated_distribution");
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
/// (with `verifier`; by default the rule `params` name, lossy leniency included) and tests them
/// against it (`chi_square_test`). `draft` is a model or
/// any `drafter` (n-gram, a `model_drafter` with early stopping, ...). With `params.eos` set,
/// generation stops right after the first EOS, so both sides are compared over (V + 1)^L, every
/// position after an EOS holding an "absent" marker (`eos_truncated_distribution`): a sampler
/// that emitted a token after an EOS lands in a cell of probability zero. Cost: up to V^(L-1)
/// model calls and a V^L table (at most `max_table_cells`; top-k does not shrink it) plus `samples`
/// generations, so keep the vocabulary and length small: toy models, or a model of your own over a
/// small vocabulary.
template <class Draft, language_model Target, std::uniform_random_bit_generator Rng,
          class Verifier = verifier_from_params>
  requires(language_model<Draft> || drafter<Draft>)
[[nodiscard]] fit_result speculative_fit(Draft& draft, Target& target, std::span<const token> prompt,
                                         const speculative_params& params, std::size_t samples, Rng& rng,
                                         Verifier verifier = {}) {
  if (samples == 0) throw error("speculative_fit: samples must be >= 1");
  const std::size_t L = params.max_new_tokens, V = specsample::detail::vocabulary_of(target, "target");
  // The loop's own checks, before the enumeration rather than after it.
  specsample::detail::check_vocabularies(static_cast<std::size_t>(draft.vocab_size()), V);
  validate(params, V);
  specsample::detail::check_prompt(prompt, V);
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
  return chi_square_test(hist.counts(), exact);
}

/// The total variation distance between two distributions of the same shape.
inline double total_variation(const xt::xarray<double>& a, const xt::xarray<double>& b) {
  if (a.shape() != b.shape()) throw error("total_variation: shapes differ");
  double tv = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) tv += std::fabs(a.flat(i) - b.flat(i));
  return 0.5 * tv;
}

}  // namespace specsample::testing
