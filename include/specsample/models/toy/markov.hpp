#pragma once
/// @file markov.hpp
/// A Markov (n-gram) toy language model with an explicit transition table.

#include <specsample/concepts.hpp>
#include <specsample/error.hpp>

#include <Eigen/Core>
#include <fmt/format.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

namespace specsample::toy {

/// An order-n Markov model: the next-token distribution depends on the last n tokens only.
///
/// The table is column-stochastic, shape (V, S) with S = (V+1)^n states: the state of a context is
/// its last n tokens read as digits in base V+1, least significant = most recent, where the digit
/// V stands for "before the start" (contexts shorter than n). `append` returns log-probabilities,
/// so zero-probability transitions are -inf logits. Satisfies `specsample::language_model`.
class markov {
 public:
  /// @param transitions (V, (V+1)^order) table; every column non-negative with positive sum
  ///        (columns are normalised here).
  markov(Eigen::MatrixXf transitions, std::size_t order) : table_(std::move(transitions)), order_(order) {
    const auto v = static_cast<std::size_t>(table_.rows());
    if (v == 0) throw error("toy::markov: the vocabulary must not be empty");
    if (static_cast<std::size_t>(table_.cols()) != state_count(v, order)) {
      throw error(fmt::format("toy::markov: a table for vocab {} and order {} needs {} columns, got {}", v, order,
                              state_count(v, order), table_.cols()));
    }
    for (Eigen::Index s = 0; s < table_.cols(); ++s) {
      const double sum = table_.col(s).template cast<double>().sum();
      if (!(table_.col(s).array() >= 0.0f).all() || !(sum > 0.0) || !std::isfinite(sum)) {
        throw error(fmt::format("toy::markov: column {} of the transition table is not a distribution", s));
      }
      divide_column(table_, s, sum);
    }
    log_table_ = table_.array().log().matrix();
  }

  /// The most entries a transition table holds (vocab × (vocab + 1)^order): larger ones are refused.
  static constexpr std::size_t max_table_entries = std::size_t{1} << 26;

  /// Random transitions: each column ~ Dirichlet(concentration) (small = peaked).
  static markov random(std::size_t vocab, std::size_t order, std::uint64_t seed, float concentration = 1.0f) {
    std::mt19937_64 rng(seed);
    return markov(random_table(vocab, order, concentration, rng), order);
  }

  /// A model whose transitions are `similarity * base + (1 - similarity) * random`: 1 reproduces
  /// `base`, 0 is unrelated. Useful to dial the acceptance rate of a draft.
  static markov similar_to(const markov& base, double similarity, std::uint64_t seed, float concentration = 1.0f) {
    if (!(similarity >= 0.0 && similarity <= 1.0)) {
      throw error(fmt::format("toy::markov::similar_to: similarity must be in [0, 1], got {}", similarity));
    }
    std::mt19937_64 rng(seed);
    const auto s = static_cast<float>(similarity);
    Eigen::MatrixXf mix = s * base.table_ + (1.0f - s) * random_table(base.vocab_size(), base.order_, concentration, rng);
    return markov(std::move(mix), base.order_);
  }

  /// Counts n-grams of `corpus` with add-k smoothing (k > 0 keeps every transition possible).
  static markov from_corpus(std::span<const token> corpus, std::size_t vocab, std::size_t order, double add_k) {
    if (!(add_k >= 0.0 && add_k <= std::numeric_limits<float>::max())) {  // (a float count, finite)
      throw error(fmt::format("toy::markov::from_corpus: add_k must be in [0, {}] (a float count), got {}",
                              std::numeric_limits<float>::max(), add_k));
    }
    // A k that rounds to float 0 would act as 0, leaving unseen transitions impossible.
    if (add_k > 0.0 && static_cast<float>(add_k) == 0.0f) {
      constexpr float smallest = std::numeric_limits<float>::denorm_min();
      throw error(fmt::format("toy::markov::from_corpus: add_k {} is below the smallest float ({}): as a float "
                              "count it is 0; give 0, or at least {}", add_k, smallest, smallest));
    }
    Eigen::MatrixXf counts = Eigen::MatrixXf::Constant(static_cast<Eigen::Index>(vocab),
                                                       static_cast<Eigen::Index>(state_count(vocab, order)),
                                                       static_cast<float>(add_k));
    for (std::size_t i = 0; i < corpus.size(); ++i) {
      check_token(corpus[i], vocab, "corpus");
      counts(corpus[i], static_cast<Eigen::Index>(state_of(corpus.first(i), vocab, order))) += 1.0f;
    }
    for (Eigen::Index s = 0; s < counts.cols(); ++s) {
      if (counts.col(s).sum() == 0.0f) counts.col(s).setOnes();  // unseen state with add_k = 0: uniform
    }
    return markov(std::move(counts), order);
  }

  [[nodiscard]] std::size_t vocab_size() const noexcept { return static_cast<std::size_t>(table_.rows()); }
  [[nodiscard]] std::size_t size() const noexcept { return context_.size(); }
  [[nodiscard]] std::size_t order() const noexcept { return order_; }
  [[nodiscard]] std::span<const token> context() const noexcept { return context_; }
  /// The (V, S) column-stochastic transition table.
  [[nodiscard]] const Eigen::MatrixXf& transitions() const noexcept { return table_; }

  /// Next-token probabilities after `context`. Throws `specsample::error` for a token out of
  /// the vocabulary.
  [[nodiscard]] Eigen::VectorXf next_probabilities(std::span<const token> context) const {
    for (const token x : context) check_token(x, vocab_size(), "toy::markov::next_probabilities");
    return table_.col(static_cast<Eigen::Index>(state_of(context, vocab_size(), order_)));
  }

  /// Appends `t`; column j = log p(· | context, t[0..j]).
  Eigen::MatrixXf append(std::span<const token> t) {
    for (const token x : t) check_token(x, vocab_size(), "toy::markov::append");
    Eigen::MatrixXf out(table_.rows(), static_cast<Eigen::Index>(t.size()));
    for (std::size_t j = 0; j < t.size(); ++j) {
      context_.push_back(t[j]);
      out.col(static_cast<Eigen::Index>(j)) =
          log_table_.col(static_cast<Eigen::Index>(state_of(context_, vocab_size(), order_)));
    }
    return out;
  }

  void truncate(std::size_t n) {
    if (n > context_.size()) {
      throw error(fmt::format("toy::markov::truncate({}) beyond a context of {} tokens", n, context_.size()));
    }
    context_.resize(n);
  }

 private:
  // Contexts of the (V, states) table; it holds at most 2^26 floats (256 MB; 512 MB with the log
  // table), which also keeps every token id an int32 and no product of sizes wrapping.
  static std::size_t state_count(std::size_t vocab, std::size_t order) {
    constexpr std::size_t max_cells = max_table_entries;
    const auto too_large = [&] {
      return error(fmt::format("toy::markov: vocab {} with order {} needs a table too large to store densely "
                               "(more than {} entries)",
                               vocab, order, max_cells));
    };
    if (vocab > max_cells) throw too_large();
    std::size_t s = 1;
    for (std::size_t i = 0; i < order; ++i) {
      if (s > max_cells / (vocab + 1)) throw too_large();
      s *= vocab + 1;
    }
    if (vocab * s > max_cells) throw too_large();
    return s;
  }

  static std::size_t state_of(std::span<const token> context, std::size_t vocab, std::size_t order) {
    std::size_t state = 0;
    std::size_t scale = 1;
    for (std::size_t j = 0; j < order; ++j) {
      const std::size_t digit = j < context.size() ? static_cast<std::size_t>(context[context.size() - 1 - j]) : vocab;
      state += digit * scale;
      scale *= vocab + 1;
    }
    return state;
  }

  static void check_token(token x, std::size_t vocab, const char* where) {
    if (!in_vocabulary(x, vocab)) {
      throw error(fmt::format("{}: token {} is out of range for a vocabulary of {} tokens", where, x, vocab));
    }
  }

  static Eigen::MatrixXf random_table(std::size_t vocab, std::size_t order, float concentration, std::mt19937_64& rng) {
    if (!(concentration > 0.0f) || !std::isfinite(concentration)) {
      throw error(fmt::format("toy::markov: concentration must be finite and > 0, got {}", concentration));
    }
    std::gamma_distribution<float> gamma(concentration, 1.0f);
    Eigen::MatrixXf t(static_cast<Eigen::Index>(vocab), static_cast<Eigen::Index>(state_count(vocab, order)));
    for (Eigen::Index s = 0; s < t.cols(); ++s) {
      for (Eigen::Index i = 0; i < t.rows(); ++i) t(i, s) = gamma(rng) + 1e-6f;
      const float sum = t.col(s).sum();
      divide_column(t, s, std::isfinite(sum) ? sum : t.col(s).cast<double>().sum());
    }
    return t;
  }

  // Divides column s of t by `sum`, its entries' positive, finite sum: in float where the sum is a
  // float, else in double (finite entries whose sum passes FLT_MAX, which a float division would
  // turn into zeros).
  static void divide_column(Eigen::MatrixXf& t, Eigen::Index s, double sum) {
    if (sum <= static_cast<double>(std::numeric_limits<float>::max())) {
      t.col(s) /= static_cast<float>(sum);
    } else {
      t.col(s) = (t.col(s).cast<double>() / sum).cast<float>();
    }
  }

  Eigen::MatrixXf table_;      // (V, S) probabilities
  Eigen::MatrixXf log_table_;  // (V, S) log-probabilities (-inf for zeros)
  std::size_t order_;
  std::vector<token> context_;
};

}  // namespace specsample::toy
