#pragma once
/// @file distribution.hpp
/// Tools to prove a sampler exact: the exact distribution of every output sequence of a model,
/// a histogram of sampled sequences, and a χ² goodness-of-fit test of one against the other.

#include <specsample/concepts.hpp>
#include <specsample/error.hpp>
#include <specsample/sampling/loop.hpp>
#include <specsample/sampling/params.hpp>
#include <specsample/sampling/random.hpp>
#include <specsample/sampling/verify.hpp>
#include <specsample/sampling/warp.hpp>

#include <Eigen/Core>
#include <fmt/format.h>
#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <span>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace specsample::testing {

/// The longest sequence the tools enumerate (they recurse once per token).
inline constexpr std::size_t max_sequence_length = 64;

/// The most sequences a table holds by default: a `sequence_table`'s entries (about 100 + 4 L
/// bytes each: 83 MB for 2^19 of 19 tokens, 328 MB for 2^20 of 64 measured), a dense table's V^L cells.
inline constexpr std::size_t max_sequences = 1'000'000;

namespace detail {
// Throws, naming `who`, unless length is in 1..max_sequence_length.
inline void check_length(std::size_t length, const char* who) {
  if (length == 0 || length > max_sequence_length) {
    throw error(fmt::format("{}: length must be in 1..{}, got {}", who, max_sequence_length, length));
  }
}
}  // namespace detail

/// Values over sequences of `length()` tokens, held sparsely (a sequence not held reads 0): the
/// exact probabilities `exact_sequences` returns, or the counts of sampled sequences.
class sequence_table {
 public:
  /// A table of at most `max_entries` sequences of `length` tokens.
  /// @throws error unless length is in 1..max_sequence_length.
  explicit sequence_table(std::size_t length, std::size_t max_entries = max_sequences)
      : length_(length), max_entries_(max_entries) {
    detail::check_length(length, "sequence_table");
  }

  [[nodiscard]] std::size_t length() const noexcept { return length_; }
  /// Sequences held.
  [[nodiscard]] std::size_t size() const noexcept { return values_.size(); }
  /// The value of `sequence`, 0 when not held.
  /// @throws error when `sequence` does not have `length()` tokens (as `add` does).
  [[nodiscard]] double operator[](std::span<const token> sequence) const {
    check_length_of(sequence);
    const auto it = values_.find(std::vector<token>(sequence.begin(), sequence.end()));
    return it == values_.end() ? 0.0 : it->second;
  }
  /// Adds `value` (a probability or a count: finite and >= 0) to the entry of `sequence` (of
  /// exactly `length()` tokens).
  /// @throws error on another length, a value that is not finite and >= 0, a new entry beyond
  /// the table's `max_entries`, or a sum past the largest double (the entry is left as it was).
  void add(std::span<const token> sequence, double value) {
    check_length_of(sequence);
    if (!(value >= 0.0 && value <= std::numeric_limits<double>::max())) {
      throw error(fmt::format("sequence_table: a value must be finite and >= 0 (a probability or a count), got {}",
                              value));
    }
    auto [it, added] = values_.try_emplace(std::vector<token>(sequence.begin(), sequence.end()), 0.0);
    if (added && values_.size() > max_entries_) {
      values_.erase(it);
      throw error(fmt::format("sequence_table: more than {} sequences of {} tokens", max_entries_, length_));
    }
    if (it->second + value > std::numeric_limits<double>::max()) {  // (the entry as it was)
      throw error(fmt::format("sequence_table: a sequence's value {} plus {} overflows a double", it->second, value));
    }
    it->second += value;
  }
  /// The entries, (sequence, value), in no particular order.
  [[nodiscard]] auto begin() const noexcept { return values_.begin(); }
  [[nodiscard]] auto end() const noexcept { return values_.end(); }

 private:
  void check_length_of(std::span<const token> sequence) const {
    if (sequence.size() != length_) {
      throw error(fmt::format("sequence_table: expected {} tokens, got {}", length_, sequence.size()));
    }
  }
  struct hash {
    std::size_t operator()(const std::vector<token>& s) const noexcept {
      std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the ids
      for (const token t : s) h = (h ^ static_cast<std::uint32_t>(t)) * 0x100000001b3ULL;
      return static_cast<std::size_t>(h);
    }
  };
  std::size_t length_;
  std::size_t max_entries_;
  std::unordered_map<std::vector<token>, double, hash> values_;
};

namespace detail {

// V^L, the cells of a dense table of `length`-token sequences over `vocab` tokens, refused by
// `who` unless vocab >= 1, length in 1..max_sequence_length and V^L <= max_sequences.
inline std::size_t table_cells(std::size_t vocab, std::size_t length, const char* who) {
  if (vocab == 0) throw error(fmt::format("{}: the vocabulary is empty", who));
  check_length(length, who);
  std::size_t cells = 1;
  for (std::size_t i = 0; i < length; ++i) {
    if (cells > max_sequences / vocab) {
      throw error(fmt::format("{}: {}^{} sequences are too many to enumerate (at most {} cells)", who, vocab, length,
                              max_sequences));
    }
    cells *= vocab;
  }
  return cells;
}

// Appends `t` to `model` and warps the logits of its last token into `dist`, with the loops'
// checks of the model's side of the contract (logits shape, size).
template <language_model M>
void append_and_warp(M& model, std::span<const token> t, logit_warper& warp, Eigen::VectorXf& dist) {
  specsample::detail::forward(model, t, 1, static_cast<std::size_t>(dist.size()), "enumerated",
                              [&](const auto& logits) { warp(logits.col(0), dist); });
}

// Adds a sequence the enumeration found (each one new) to `out`, refusing one beyond the cap with
// what keeps the sequences of a model of `vocab` tokens few: the largest top-k whose k^L sequences
// fit, or where only k = 1 would, the longest length that k = 2 allows (with a top-k of 2 where the
// vocabulary is larger).
inline void add_enumerated(sequence_table& out, std::span<const token> sequence, double p, Eigen::Index vocab) {
  if (out.size() >= max_sequences) {
    const std::size_t length = out.length();
    const auto fits = [](double k, std::size_t l) { return std::pow(k, static_cast<double>(l)) <= max_sequences; };
    std::size_t k = 1;
    while (fits(static_cast<double>(k + 1), length)) ++k;
    std::size_t longest = 1;
    while (fits(2.0, longest + 1)) ++longest;
    throw error(fmt::format(
        "exact_sequences: more than {} sequences of {} tokens have positive probability (testing::max_sequences); {}",
        max_sequences, length,
        k >= 2 ? fmt::format("a top-k of at most {} keeps them few ({}^{} at most), whatever the vocabulary of {}", k,
                             k, length, vocab)
           : vocab > 2 ? fmt::format("a top-k of 2 keeps them few at a length of at most {} (2^{})", longest, longest)
                       : fmt::format("a length of at most {} keeps them few (2^{})", longest, longest)));
  }
  out.add(sequence, p);
}

// The total the samplers draw a warped column's token against (`sample_categorical`: u times the
// float weights' double sum, summed by `specsample::detail::sum_blocks`), to the same bits. (A
// function of its own: its 8 KiB of block sums leave the stack before `enumerate` recurses.)
inline double sampler_total(const Eigen::VectorXf& dist) {
  specsample::detail::float_weights weights{dist.data()};
  return specsample::detail::sum_blocks(weights, static_cast<std::size_t>(dist.size())).total;
}

// Depth-first over the continuations of `prefix` with positive probability (`dist`: the warped
// distribution after it), adding each complete sequence to `out` — one whose probability underflows
// a double too (below 1e-308, as 40 tokens of a vocabulary of thousands come to without a filter),
// with 0: each path then ends in a sequence the cap counts, so the search stops at the cap, where
// skipping those paths made it endless (every call under them, no sequence found); with `eos`, a sequence ends at
// its first EOS, the rest filled with `absent`. A continuation's probability is its warped value
// over the column's total as the autoregressive sampler draws it (`sampler_total`), so a table
// sums to 1 within double rounding at any length (a float column's sum is 1 only within its
// rounding, ~6e-8, which 19 positions compounded past `chi_square_test`'s 1e-6).
template <language_model M>
void enumerate(M& model, logit_warper& warp, const Eigen::VectorXf& dist, std::vector<token>& prefix,
               std::size_t length, double prob, std::optional<token> eos, token absent, sequence_table& out) {
  Eigen::VectorXf next(dist.size());
  const double total = sampler_total(dist);  // positive and finite: the warper's check
  for (Eigen::Index x = 0; x < dist.size(); ++x) {
    if (dist(x) == 0.0f) continue;  // (impossible; a product that underflows still counts: see below)
    const double px = prob * (static_cast<double>(dist(x)) / total);
    const auto t = static_cast<token>(x);
    prefix.push_back(t);
    if (prefix.size() == length) {
      add_enumerated(out, prefix, px, dist.size());
    } else if (eos && t == *eos) {
      std::vector<token> ended = prefix;
      ended.resize(length, absent);
      add_enumerated(out, ended, px, dist.size());
    } else {
      append_and_warp(model, std::span<const token>(&t, 1), warp, next);
      enumerate(model, warp, next, prefix, length, px, eos, absent, out);
      specsample::detail::truncate_to(model, static_cast<std::size_t>(model.size()) - 1, "enumerated");
    }
    prefix.pop_back();
  }
}

// Regularised upper incomplete gamma Q(a, x) (Numerical Recipes gser / gcf).
inline double gamma_q(double a, double x) {
  if (x <= 0.0) return 1.0;
  if (std::isinf(x)) return 0.0;  // an overflowed X2 (a cell of tiny expected count): the fractions below give NaN
  const double log_prefix = -x + a * std::log(x) - std::lgamma(a);
  // Near x = a both the series and the continued fraction need O(sqrt(a)) terms (the series'
  // terms fall like exp(-n^2 / 2a)): a fixed cap of 10 000 stopped them early from a ~ 10^6 on
  // (dof 10^8 at X2 = dof gave 0.58 for ~0.5). Not converged within the cap is an error.
  const double cap = 1000.0 + 100.0 * std::sqrt(a);
  const auto not_converged = [&] {
    return error(fmt::format("chi_square_test: the p-value of {} degrees of freedom at X2 = {} did not converge",
                             2.0 * a, 2.0 * x));
  };
  if (x < a + 1.0) {  // series for P, then Q = 1 - P
    double term = 1.0 / a;
    double sum = term;
    for (double n = 1.0;; n += 1.0) {
      if (n > cap) throw not_converged();
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
  for (double i = 1.0;; i += 1.0) {
    if (i > cap) throw not_converged();
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
/// `prompt` with warping `sampling` can produce, for the sequences of positive probability only.
/// With `eos`, generation stops right after the first EOS: such a sequence is held cut there, its
/// remaining positions the marker V ("absent", one past the vocabulary), and what would follow the
/// EOS is not enumerated. Enumerates every prefix with positive probability using the model's own
/// append / truncate, so it works for any `language_model`: one model call per prefix that does not
/// end a sequence, which a top-k warping keeps few (top_k = 2 and L = 6: 63 calls and 64 sequences
/// whatever the vocabulary). Checks the prompt's ids, EOS, that the model holds prompt + L - 1
/// tokens (`max_context`) and the shape of the logits it returns, as the sampling loops do.
/// Leaves `model` holding `prompt` (also when it throws after appending the prompt).
/// @throws error on those, a length outside 1..max_sequence_length, or when more than
/// `max_sequences` sequences have positive probability (found as they are enumerated: after up to
/// one model call per sequence under a sparse warping, one per V of them without a filter).
template <language_model M>
[[nodiscard]] sequence_table exact_sequences(M& model, std::span<const token> prompt, std::size_t length,
                                             const sampling_params& sampling, std::optional<token> eos = std::nullopt) {
  if (prompt.empty()) throw error("exact_sequences: the prompt must not be empty");
  detail::check_length(length, "exact_sequences");
  sequence_table table(length);
  const std::size_t v = specsample::detail::vocabulary_of(model, "enumerated");
  if (eos && !in_vocabulary(*eos, v)) {
    throw error(fmt::format("exact_sequences: EOS id {} is out of range for a vocabulary of {}", *eos, v));
  }
  if (eos && v > static_cast<std::size_t>(std::numeric_limits<token>::max())) {
    throw error(fmt::format("exact_sequences: a vocabulary of {} leaves no id for the absent marker", v));
  }
  specsample::detail::check_prompt(prompt, v);
  specsample::detail::check_fits(model, "enumerated", prompt.size(), length);
  logit_warper warp(sampling, v, "enumerated");
  specsample::detail::truncate_to(model, 0, "enumerated");
  Eigen::VectorXf first(static_cast<Eigen::Index>(v));
  detail::append_and_warp(model, prompt, warp, first);
  std::vector<token> prefix;
  prefix.reserve(length);
  try {
    detail::enumerate(model, warp, first, prefix, length, 1.0, eos, static_cast<token>(v), table);
  } catch (...) {  // the cap, or the model's own error, mid-way: back to the prompt, as documented
    if (static_cast<std::size_t>(model.size()) > prompt.size()) model.truncate(prompt.size());
    throw;
  }
  return table;
}

/// `exact_sequences` as a dense L-dimensional (V, ..., V) table (entry [x0, ..., x(L-1)] =
/// P(x0 ... x(L-1))), for tiny vocabularies: V^L cells, at most `max_sequences`.
template <language_model M>
[[nodiscard]] xt::xarray<double> exact_sequence_distribution(M& model, std::span<const token> prompt,
                                                            std::size_t length, const sampling_params& sampling) {
  const std::size_t v = specsample::detail::vocabulary_of(model, "enumerated");
  detail::table_cells(v, length, "exact_sequence_distribution");
  const sequence_table sparse = exact_sequences(model, prompt, length, sampling);
  xt::xarray<double> table = xt::zeros<double>(std::vector<std::size_t>(length, v));
  for (const auto& [sequence, p] : sparse) {
    std::size_t index = 0;
    for (const token x : sequence) index = index * v + static_cast<std::size_t>(x);
    table.flat(index) = p;
  }
  return table;
}

/// Counts of sampled sequences in the same (V, ..., V) layout as `exact_sequence_distribution`.
class sequence_histogram {
 public:
  /// @throws error unless vocab >= 1, length in 1..max_sequence_length and vocab^length <=
  /// max_sequences.
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

/// The expected count below which `chi_square_test` pools an outcome with the others (Cochran's rule
/// of thumb: every bin's expected count at least 5).
inline constexpr double default_min_expected = 5.0;

/// The share of a test's level that `chi_square_test` spends on the pooled cells' own check (see
/// `fit_result::pooled_p_value`); the bins' χ² gets the rest.
inline constexpr double pooled_share = 1e-3;

/// The outcome of a goodness-of-fit test.
struct fit_result {
  double statistic = 0.0;      ///< Pearson's X² = Σ (O − E)² / E over the bins
  std::size_t dof = 0;         ///< bins - 1; 0 where one sequence is possible: only an impossible sample fails
  /// The test's p-value, to compare with a level alpha: 0 when a sample has probability zero;
  /// else, with no cell pooled, `bins_p_value`; with some pooled, the weighted Bonferroni
  /// combination of the two checks, min(1, bins_p_value / (1 − pooled_share), pooled_p_value /
  /// pooled_share), whose false-rejection rate stays within the level as far as the bins' χ²
  /// approximation does (its own excess stays: docs/algorithm.md, "Testing exactness").
  double p_value = 1.0;
  /// P(χ²(dof) >= X²), or with two bins the binomial's exact two-sided p-value; 1 with one bin.
  double bins_p_value = 1.0;
  /// The pooled cells' own check, where χ² cannot look (a pool of many tiny cells hides a few
  /// samples piled on one of them: 20 samples on a sequence of probability 1.9e-8 in 10^5 passed
  /// the χ² alone): the smallest exact binomial upper-tail probability P(count >= observed) over
  /// the pooled cells, times their number (Bonferroni); 1 with none pooled.
  double pooled_p_value = 1.0;
  std::size_t bins = 0;          ///< cells with E >= min_expected, and the pool of the rest when it
                                 ///< reaches min_expected (else merged into the smallest cell)
  std::size_t pooled_cells = 0;  ///< cells of positive probability with E < min_expected
  std::size_t impossible = 0;    ///< samples that fell in cells of probability zero
  double samples = 0.0;          ///< the samples tested, the impossible ones included
  /// What the samples' rounds did (`speculative_fit`): drafts proposed, and drafts rejected and
  /// replaced by a draw from the residual. With none rejected the check did not reach the
  /// residual (a verifier broken there passes too); with none drafted it tested the target's own
  /// sampling alone (a length of 1 leaves no round room to draft).
  std::size_t drafted = 0;
  std::size_t rejected = 0;
};

namespace detail {

// Whether `o` is a count of samples.
inline bool is_count(double o) noexcept { return o >= 0.0 && o <= 0x1p53 && o == std::floor(o); }

// The bins `pearson` makes of `outcomes` at n samples: those of expected count >= m, and the
// pool of the rest when it reaches m itself (or is all there is).
inline std::size_t bins_at(const std::vector<std::pair<double, double>>& outcomes, double n, double m) {
  std::size_t bins = 0;
  double pooled = 0.0;
  for (const auto& [o, p] : outcomes) {
    if (p * n < m) {
      pooled += p * n;
    } else {
      ++bins;
    }
  }
  return bins + (pooled >= m || (pooled > 0.0 && bins == 0) ? 1 : 0);
}

// Throws chi_square_test's refusal of `n` samples that are too few to test `outcomes` (two or more of
// positive probability, (count, probability) each): no two bins reach `min_expected`, so any
// sample would pass; the message names the samples needed.
inline void require_two_bins(const std::vector<std::pair<double, double>>& outcomes, double n, double min_expected) {
  if (outcomes.size() < 2 || bins_at(outcomes, n, min_expected) >= 2) return;
  double largest = 0.0;
  for (const auto& [o, p] : outcomes) largest = std::max(largest, p);
  // Two bins need the largest outcome and the rest each at min_expected; the rest summed, not
  // taken as 1 - largest (the probabilities sum to 1 only within rounding), and the count
  // confirmed to give two bins.
  double rest = 0.0;
  bool skipped = false;
  for (const auto& [o, p] : outcomes) {
    if (p == largest && !skipped) {
      skipped = true;
    } else {
      rest += p;
    }
  }
  const std::string what = fmt::format("chi_square_test: {} samples are too few to test {} possible outcomes: no two "
                                       "bins reach an expected count of {}, so any sample would pass",
                                       n, outcomes.size(), min_expected);
  double needed = std::ceil(min_expected / std::min(largest, rest));
  if (!std::isfinite(needed)) {  // (a subnormal probability, or a huge min_expected: it said "inf samples")
    throw error(fmt::format("{}; it would need more samples than a double holds: the expected count {} over {}, "
                            "the smaller of the most likely outcome's probability and the others' together",
                            what, min_expected, std::min(largest, rest)));
  }
  // Rounding can leave the pool just under min_expected there: grow n until two bins form, by a
  // sample and by a relative step above rounding (past 2^53 a double's n + 1 is n: it hung).
  while (bins_at(outcomes, needed, min_expected) < 2) needed = std::max(needed + 1.0, needed * (1.0 + 0x1p-40));
  throw error(fmt::format("{}; it needs at least {} samples", what, needed));
}

// The log probability of j successes in n trials of probability p, from its logs.
struct binomial_mass {
  double n, lp, lq, ln;
  binomial_mass(double trials, double p)
      : n(trials), lp(std::log(p)), lq(std::log1p(-p)), ln(std::lgamma(trials + 1.0)) {}
  [[nodiscard]] double log(double j) const {
    return ln - std::lgamma(j + 1.0) - std::lgamma(n - j + 1.0) + j * lp + (n - j) * lq;
  }
};

// Sums the binomial's mass from `from` by `step` up to `end`, as long as the terms still move the
// sum (outward from the mode, where they fall geometrically).
inline double binomial_tail(const binomial_mass& mass, double from, double step, double end) {
  double sum = 0.0;
  for (double j = from; step < 0 ? j >= end : j <= end; j += step) {
    const double term = std::exp(mass.log(j));
    sum += term;
    if (term <= sum * 1e-17) break;
  }
  return sum;
}

// The exact two-sided p-value of `k` successes in `n` trials of probability `p` in (0, 1): the
// probability of every count no more likely than k (within a relative 1e-7, as R's binom.test).
// The binomial's mass is unimodal, so the counts below and above its mode that are no more likely
// than k are found by bisection, and their tails summed outward from there until a term no longer
// moves the sum (the terms fall geometrically away from the mode).
inline double binomial_p_value(double k, double n, double p) {
  const binomial_mass mass(n, p);
  const auto log_mass = [&](double j) { return mass.log(j); };
  const double bound = log_mass(k) + std::log1p(1e-7);
  const double mode = std::min(n, std::floor((n + 1.0) * p));
  double sum = 0.0;
  // Below the mode the mass rises: the largest j <= mode no more likely than k, if any.
  if (log_mass(0.0) <= bound) {
    double lo = 0.0, hi = mode;  // log_mass(lo) <= bound; find the last such j below the rise
    while (hi - lo > 1.0) {
      const double mid = std::floor(0.5 * (lo + hi));
      (log_mass(mid) <= bound ? lo : hi) = mid;
    }
    if (log_mass(hi) <= bound) lo = hi;
    sum += binomial_tail(mass, lo, -1.0, 0.0);
  }
  // Above the mode it falls: the smallest j > mode no more likely than k, if any.
  if (mode < n && log_mass(n) <= bound) {
    double lo = mode, hi = n;  // log_mass(hi) <= bound
    while (hi - lo > 1.0) {
      const double mid = std::floor(0.5 * (lo + hi));
      (log_mass(mid) <= bound ? hi : lo) = mid;
    }
    sum += binomial_tail(mass, hi, 1.0, n);
  }
  return std::min(1.0, sum);
}

// P(X >= k) for X ~ Binomial(n, p), p in (0, 1): exact above the mean, summed from k up; 1 (an
// upper bound, so a p-value that stays valid) at or below it, where the tail is not small anyway.
inline double binomial_upper_tail(double k, double n, double p) {
  if (k <= n * p) return 1.0;
  return std::min(1.0, binomial_tail(binomial_mass(n, p), k, 1.0, n));
}

// Pearson's test over the outcomes of positive probability, (observed count, probability) each,
// the probabilities checked and summing to 1; `impossible`: samples outside them.
inline fit_result pearson(const std::vector<std::pair<double, double>>& outcomes, double impossible,
                          double min_expected) {
  if (!(min_expected > 0.0) || !std::isfinite(min_expected)) {
    throw error(fmt::format("chi_square_test: min_expected must be finite and > 0, got {}", min_expected));
  }
  double n = impossible, total = 0.0;
  for (const auto& [o, p] : outcomes) {
    n += o;
    total += p;
  }
  if (std::fabs(total - 1.0) > 1e-6) {
    throw error(fmt::format("chi_square_test: the expected probabilities sum to {}, not 1", total));
  }
  if (n == 0.0) throw error("chi_square_test: no samples");
  fit_result r;
  r.impossible = static_cast<std::size_t>(std::min(impossible, 0x1p63));
  r.samples = n;
  // The bins, (observed, expected) each: the outcomes of expected count >= min_expected, then the
  // pool of the rest, as a bin of its own or merged into the smallest. Each pooled cell's count
  // is also held against its own expectation: the least likely count among them, Bonferroni over
  // their number.
  std::vector<std::pair<double, double>> bins;
  double pooled_o = 0.0, pooled_e = 0.0, least_likely = 1.0;
  for (const auto& [o, p] : outcomes) {
    const double e = p * n;
    if (e < min_expected) {
      pooled_o += o;
      pooled_e += e;
      ++r.pooled_cells;
      if (o > 0.0) least_likely = std::min(least_likely, binomial_upper_tail(o, n, std::min(p, 1.0)));
    } else {
      bins.emplace_back(o, e);
    }
  }
  r.pooled_p_value = std::min(1.0, least_likely * static_cast<double>(r.pooled_cells));
  if (pooled_e > 0.0) {
    if (pooled_e >= min_expected || bins.empty()) {
      bins.emplace_back(pooled_o, pooled_e);
    } else {  // too small a bin of its own: merged into the smallest one (the first of equals)
      auto smallest = bins.begin();
      for (auto b = bins.begin(); b != bins.end(); ++b) {
        if (b->second < smallest->second) smallest = b;
      }
      smallest->first += pooled_o;
      smallest->second += pooled_e;
    }
  }
  r.bins = bins.size();
  r.dof = r.bins > 0 ? r.bins - 1 : 0;
  if (r.impossible > 0) {
    r.statistic = std::numeric_limits<double>::infinity();
    r.bins_p_value = 0.0;
    r.p_value = 0.0;
    return r;
  }
  if (r.bins < 2) require_two_bins(outcomes, n, min_expected);
  double x2 = 0.0;
  for (const auto& [o, e] : bins) x2 += (o - e) * (o - e) / e;
  r.statistic = x2;
  // Two bins are a binomial: its exact p-value, where χ²'s tail runs several times too heavy
  // (binomial_p_value); more bins, χ²'s. The binomial's probability is the first bin's share of
  // both bins' expected counts, not its own expected count over n: the probabilities may sum to
  // 1 ± 1e-6, and a first bin near 1 would take that error into the second's tiny one (or past 1).
  r.bins_p_value = r.dof == 0   ? 1.0
                   : r.dof == 1 ? binomial_p_value(bins[0].first, n, bins[0].second / (bins[0].second + bins[1].second))
                                : gamma_q(0.5 * static_cast<double>(r.dof), 0.5 * x2);
  r.p_value = r.pooled_cells == 0 ? r.bins_p_value
                                  : std::min({1.0, r.bins_p_value / (1.0 - pooled_share), r.pooled_p_value / pooled_share});
  return r;
}

}  // namespace detail

/// Pearson's χ² test of `observed` counts against `expected` probabilities (same shape; the
/// probabilities sum to 1). Cells with an expected count below `min_expected` are pooled into one
/// bin, and that bin, when its own expected count is still below it, into the smallest other bin,
/// so the χ² approximation holds. Two bins are a binomial, and their p-value is its exact two-sided
/// one (the probability of every count no more likely than the one observed, as R's binom.test):
/// χ²'s tail with one degree of freedom rejects {0.9, 0.1} at 50 samples 3.2 times as often as a
/// level of 1e-3 says and 17.5 times at 1e-6; the exact p-value 0.29 and 0.76 times. (Pearson's statistic rather than the G-test's: with many cells
/// of expected count 5–20, G rejects a true hypothesis several times as often as the test's
/// level says.) Each pooled cell is also checked for too many samples (`fit_result::pooled_p_value`),
/// which the pool's χ² cannot see. Any sample in a zero-probability cell makes the p-value 0.
/// @throws error on mismatched shapes, expected values that are not probabilities summing to 1,
/// observed values that are not counts, no samples, a `min_expected` that is not positive, or too
/// few samples for two bins while the expected distribution has two or more outcomes (the test
/// would pass whatever was observed: the message says how many samples it needs).
inline fit_result chi_square_test(const xt::xarray<double>& observed, const xt::xarray<double>& expected,
                                  double min_expected = default_min_expected) {
  if (observed.shape() != expected.shape()) throw error("chi_square_test: observed and expected shapes differ");
  std::vector<std::pair<double, double>> outcomes;
  double impossible = 0.0;
  for (std::size_t i = 0; i < observed.size(); ++i) {
    const double o = observed.flat(i);
    const double p = expected.flat(i);
    if (!detail::is_count(o)) {
      throw error(fmt::format("chi_square_test: observed count {} at cell {} is not a count", o, i));
    }
    if (!(p >= 0.0) || !std::isfinite(p)) {
      throw error(fmt::format("chi_square_test: expected probability {} at cell {} is not a probability", p, i));
    }
    if (p > 0.0) {
      outcomes.emplace_back(o, p);
    } else {
      impossible += o;
    }
  }
  return detail::pearson(outcomes, impossible, min_expected);
}

/// `chi_square_test` of sequence tables: `observed` counts against `expected` probabilities
/// (`exact_sequences`), over the sequences `expected` holds; an observed sequence it does not hold
/// has probability zero.
inline fit_result chi_square_test(const sequence_table& observed, const sequence_table& expected,
                                  double min_expected = default_min_expected) {
  if (observed.length() != expected.length()) {
    throw error(fmt::format("chi_square_test: observed sequences of {} tokens, expected of {}", observed.length(),
                            expected.length()));
  }
  std::vector<std::pair<double, double>> outcomes;
  outcomes.reserve(expected.size());
  double impossible = 0.0;  // the counts of sequences `expected` does not hold at a positive probability
  for (const auto& [sequence, o] : observed) {
    if (!detail::is_count(o)) throw error(fmt::format("chi_square_test: observed count {} is not a count", o));
    // Summed directly: the total less the possible ones' counts rounds once counts pass 2^53.
    if (!(expected[sequence] > 0.0)) impossible += o;
  }
  // In lexicographic order, the dense table's: the same sums, the same smallest bin on a tie.
  std::vector<std::pair<const std::vector<token>*, double>> entries;
  entries.reserve(expected.size());
  for (const auto& [sequence, p] : expected) entries.emplace_back(&sequence, p);
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return *a.first < *b.first; });
  for (const auto& [sequence, p] : entries) {
    if (!(p >= 0.0) || !std::isfinite(p)) {
      throw error(fmt::format("chi_square_test: expected probability {} is not a probability", p));
    }
    if (p == 0.0) continue;  // as a sequence not held: its samples are impossible
    outcomes.emplace_back(observed[*sequence], p);
  }
  return detail::pearson(outcomes, impossible, min_expected);
}

/// `speculative_fit`'s default verifier: the rule `params` name (`params.verify`, `params.leniency`),
/// as `speculative_sample` without a verifier uses.
struct verifier_from_params {};

namespace detail {

// One speculative generation as `speculative_fit` draws it, whole (its statistics too).
template <class Draft, class Target, class Rng, class Verifier>
[[nodiscard]] generation_result draw(Draft& draft, Target& target, std::span<const token> prompt,
                                     const speculative_params& params, Rng& rng, Verifier&& verifier) {
  no_observer none;
  if constexpr (std::is_same_v<std::remove_cvref_t<Verifier>, verifier_from_params>) {
    return speculative_sample(draft, target, prompt, params, rng, none);
  } else {
    return speculative_sample(draft, target, prompt, params, rng, none, verifier);
  }
}

}  // namespace detail

/// One speculative sample as `speculative_fit` draws it: `speculative_sample` with `verifier` (used
/// in place, as `speculative_sample` uses it), or, with the default `verifier_from_params`, the
/// rule `params` name. Its output tokens.
template <class Draft, language_model Target, std::uniform_random_bit_generator Rng,
          class Verifier = verifier_from_params>
  requires(language_model<Draft> || drafter<Draft>)
[[nodiscard]] std::vector<token> speculative_draw(Draft& draft, Target& target, std::span<const token> prompt,
                                                  const speculative_params& params, Rng& rng, Verifier&& verifier = {}) {
  return detail::draw(draft, target, prompt, params, rng, verifier).tokens;
}

/// The whole exactness check for one pair: enumerates the target's exact distribution over
/// sequences of `params.max_new_tokens` tokens after `prompt` (`exact_sequences`), draws `samples`
/// speculative samples (with `verifier`; by default the rule `params` name, lossy leniency
/// included; a verifier given is used in place for every sample, not copied, so state it keeps
/// persists across them, and a const one needs a const operator()) and tests them against it (`chi_square_test`). `draft` is a model or any `drafter`
/// (n-gram, a `model_drafter` with early stopping, ...). With `params.eos` set, generation stops
/// right after the first EOS, so both sides hold sequences cut there, every position after the EOS
/// holding the "absent" marker V: a sampler that emitted a token after an EOS lands on a sequence
/// of probability zero. Cost: a model call per prefix of positive probability (`exact_sequences`:
/// a large model needs a top-k warping to keep them few) plus `samples` generations; the samples
/// must be enough for the sequences' probabilities (too few to test are refused, as
/// `chi_square_test` refuses them, with the number needed, before any is drawn). `params.max_new_tokens` must be in
/// 1..max_sequence_length.
template <class Draft, language_model Target, std::uniform_random_bit_generator Rng,
          class Verifier = verifier_from_params>
  requires(language_model<Draft> || drafter<Draft>)
[[nodiscard]] fit_result speculative_fit(Draft& draft, Target& target, std::span<const token> prompt,
                                         const speculative_params& params, std::size_t samples, Rng& rng,
                                         Verifier&& verifier = {}) {
  if (samples == 0) throw error("speculative_fit: samples must be >= 1");
  if (params.max_new_tokens == 0 || params.max_new_tokens > max_sequence_length) {
    throw error(fmt::format("speculative_fit: params.max_new_tokens (the length of the sequences tested) must be in "
                            "1..{}, got {}",
                            max_sequence_length, params.max_new_tokens));
  }
  // The loop's own checks, before the enumeration rather than after it (with a verifier of the
  // caller's, of the parameters it runs with: its rule stands in for params.verify and leniency).
  constexpr bool own_rule = !std::is_same_v<std::remove_cvref_t<Verifier>, verifier_from_params>;
  const std::size_t V = specsample::detail::check_generation(
      draft, target, prompt, own_rule ? specsample::detail::for_custom_verifier(params) : params);
  const std::size_t L = params.max_new_tokens;
  const sequence_table exact = exact_sequences(target, prompt, L, params.sampling, params.eos);
  {  // Too few samples to test are refused now, not after drawing them.
    std::vector<std::pair<double, double>> outcomes;
    for (const auto& [sequence, p] : exact) {
      if (p > 0.0) outcomes.emplace_back(0.0, p);
    }
    detail::require_two_bins(outcomes, static_cast<double>(samples), default_min_expected);
  }
  sequence_table observed(L, samples);  // room for every sample: a broken sampler's spread fails, never throws
  std::size_t drafted = 0, rejected = 0;
  for (std::size_t i = 0; i < samples; ++i) {
    generation_result r = detail::draw(draft, target, prompt, params, rng, verifier);
    drafted += r.stats.drafted;
    rejected += r.stats.corrections;
    if (params.eos && r.tokens.size() < L) r.tokens.resize(L, static_cast<token>(V));  // (only EOS ends a run early)
    observed.add(r.tokens, 1.0);
  }
  fit_result fit = chi_square_test(observed, exact);
  fit.drafted = drafted;
  fit.rejected = rejected;
  return fit;
}

/// The total variation distance, over a test's bins, at which a sampler's distribution fails a
/// test like `fit` (its samples, bins and pooled cells) at level `alpha` about half the time, and
/// more often the farther it is: what a PASS can see. A PASS says no deviation this large or
/// larger was likely missed; smaller ones may pass. Over the same bins it falls as
/// 1 / sqrt(samples); more samples usually fill more bins, whose larger critical value makes it
/// fall more slowly.
///
/// Derivation: off by δ_i in bin i of probability p_i, Pearson's X² is about noncentral χ² with
/// dof degrees of freedom and noncentrality λ = n Σ δ_i² / p_i >= 4 n TV² (Cauchy–Schwarz: (Σ |δ_i|)²
/// <= Σ δ_i² / p_i · Σ p_i). The test rejects at least half the time once the median of that
/// χ² (Patnaik's approximation) reaches the critical value at alpha (its χ² share of it when cells
/// were pooled); the distance returned is sqrt(λ / 4n) for the λ that puts it there.
/// @throws error unless 0 < alpha < 1, the fit has samples, and it has two bins or more (with one,
/// only a sample of probability zero fails).
inline double detectable_distance(const fit_result& fit, double alpha) {
  if (!(alpha > 0.0 && alpha < 1.0)) {
    throw error(fmt::format("detectable_distance: alpha must be in (0, 1), got {}", alpha));
  }
  if (!(fit.samples > 0.0)) throw error("detectable_distance: the fit has no samples");
  if (fit.dof == 0) {
    throw error("detectable_distance: the fit has one bin, so it detects only samples of probability zero");
  }
  const double k = static_cast<double>(fit.dof);
  const double level = fit.pooled_cells > 0 ? alpha * (1.0 - pooled_share) : alpha;
  // The critical value: X² with P(χ²(k) >= X²) = level, by bisection.
  const auto survival = [&](double x2) { return detail::gamma_q(0.5 * k, 0.5 * x2); };
  double lo = 0.0, hi = k + 10.0;
  while (survival(hi) > level) hi *= 2.0;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (survival(mid) > level ? lo : hi) = mid;
  }
  const double critical = hi;
  // The noncentrality whose median reaches it: Patnaik's χ² of (k + λ)² / (k + 2λ) degrees of
  // freedom scaled by (k + 2λ) / (k + λ), with Wilson–Hilferty's median ν (1 − 2 / 9ν)³.
  const auto median = [&](double lambda) {
    const double nu = (k + lambda) * (k + lambda) / (k + 2.0 * lambda);
    const double m = 1.0 - 2.0 / (9.0 * nu);
    return (k + 2.0 * lambda) / (k + lambda) * nu * m * m * m;
  };
  lo = 0.0;
  hi = critical + 10.0;
  while (median(hi) < critical) hi *= 2.0;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (median(mid) < critical ? lo : hi) = mid;
  }
  return std::sqrt(hi / (4.0 * fit.samples));
}

/// The total variation distance between two distributions of the same shape.
/// @throws error on shapes that differ, or a value that is not finite and >= 0 (naming it and its
/// cell: a NaN made the distance NaN, which compares false with any bound).
inline double total_variation(const xt::xarray<double>& a, const xt::xarray<double>& b) {
  if (a.shape() != b.shape()) throw error("total_variation: shapes differ");
  double tv = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    for (const double x : {a.flat(i), b.flat(i)}) {
      if (!(x >= 0.0) || !std::isfinite(x)) {
        throw error(fmt::format("total_variation: value {} at cell {} is not a probability", x, i));
      }
    }
    tv += std::fabs(a.flat(i) - b.flat(i));
  }
  return 0.5 * tv;
}

}  // namespace specsample::testing
