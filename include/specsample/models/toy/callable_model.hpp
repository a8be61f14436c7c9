#pragma once
/// @file callable_model.hpp
/// Turns any callable `logits(std::span<const token> context)` into a `language_model`.

#include <specsample/concepts.hpp>
#include <specsample/error.hpp>

#include <Eigen/Core>
#include <fmt/format.h>

#include <concepts>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace specsample::toy {

/// Wraps `F: (std::span<const token> context) -> logits` (anything assignable to an
/// `Eigen::MatrixXf`, holding a column or a row of `vocab` logits; another shape is an error) as a
/// `language_model`: the adapter keeps the token list, and `append` calls `f` once per appended
/// token with the whole context so far. No KV cache, so each call costs whatever `f` costs; good
/// for tests, prototypes and models with their own cache.
template <class F>
  requires std::invocable<F&, std::span<const token>>
class callable_model {
 public:
  callable_model(std::size_t vocab, F f) : vocab_(vocab), f_(std::move(f)) {
    if (vocab == 0) throw error("toy::callable_model: the vocabulary must not be empty");
  }

  [[nodiscard]] std::size_t vocab_size() const noexcept { return vocab_; }
  [[nodiscard]] std::size_t size() const noexcept { return context_.size(); }
  [[nodiscard]] std::span<const token> context() const noexcept { return context_; }

  /// Strong exception guarantee: every id is checked before anything changes, and if `f` throws
  /// or returns the wrong length the context is restored to what it was (the adapter cannot undo
  /// side effects `f` itself has).
  Eigen::MatrixXf append(std::span<const token> t) {
    for (std::size_t j = 0; j < t.size(); ++j) {
      if (!in_vocabulary(t[j], vocab_)) {
        throw error(fmt::format("toy::callable_model::append: token {} at position {} is out of range for a "
                                "vocabulary of {} tokens", t[j], j, vocab_));
      }
    }
    Eigen::MatrixXf out(static_cast<Eigen::Index>(vocab_), static_cast<Eigen::Index>(t.size()));
    const std::size_t before = context_.size();
    context_.reserve(before + t.size());  // may throw, changes nothing; the push_backs below cannot
    try {
      for (std::size_t j = 0; j < t.size(); ++j) {
        context_.push_back(t[j]);
        // Held as a matrix first: a vector's shape is checked, not assumed (assigning a (V, 3)
        // matrix to a vector asserts in Eigen, or without assertions keeps garbage).
        const Eigen::MatrixXf logits = f_(std::span<const token>(context_));
        const auto v = static_cast<Eigen::Index>(vocab_);
        if (logits.rows() == v && logits.cols() == 1) {
          out.col(static_cast<Eigen::Index>(j)) = logits.col(0);
        } else if (logits.rows() == 1 && logits.cols() == v) {
          out.col(static_cast<Eigen::Index>(j)) = logits.row(0).transpose();
        } else {
          throw error(fmt::format("toy::callable_model: the callable returned {} × {} logits for a vocabulary of {} "
                                  "(a vector of {} expected)",
                                  logits.rows(), logits.cols(), vocab_, vocab_));
        }
      }
    } catch (...) {
      context_.resize(before);  // shrinking: no-throw
      throw;
    }
    return out;
  }

  void truncate(std::size_t n) {
    if (n > context_.size()) {
      throw error(fmt::format("toy::callable_model::truncate({}) beyond a context of {} tokens", n, context_.size()));
    }
    context_.resize(n);
  }

 private:
  std::size_t vocab_;
  F f_;
  std::vector<token> context_;
};

}  // namespace specsample::toy
