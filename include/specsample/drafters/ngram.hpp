#pragma once
/// @file ngram.hpp
/// Model-free drafting: prompt lookup / n-gram matching over the context.

#include <specsample/concepts.hpp>
#include <specsample/error.hpp>
#include <specsample/sampling/drafter.hpp>

#include <Eigen/Core>
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <span>

namespace specsample::drafters {

/// Proposes the continuation of the longest suffix match in the context (prompt + generated):
/// for n from `max_n` down to `min_n`, find the most recent earlier occurrence of the context's
/// last n tokens and propose the (up to k) tokens that followed it. Proposals are one-hot, so the
/// rejection rule stays exact: a draft x is accepted with probability p(x), and a rejection draws
/// from p with x removed. The copy may run into its own proposals (as LZ77 copies overlap), so a
/// periodic context yields full-length proposals. No model, no forward calls: it pays off on text
/// that repeats itself (rewrites, lists, code). A search costs O(max_n · context) per round.
class ngram {
 public:
  /// q holds one-hot distributions (detail::writes_distributions): the loop need not check it.
  using writes_distributions = ngram;

  /// The longest suffix looked up unless asked otherwise.
  static constexpr std::size_t default_max_n = 4;

  ngram(std::size_t vocab, std::size_t max_n = default_max_n, std::size_t min_n = 1)
      : vocab_(vocab), max_n_(max_n), min_n_(min_n) {
    if (vocab == 0) throw error("drafters::ngram: the vocabulary must not be empty");
    if (min_n == 0 || max_n < min_n) {
      throw error(fmt::format("drafters::ngram: need 1 <= min_n <= max_n, got min_n = {}, max_n = {}", min_n, max_n));
    }
  }

  /// Lookup of suffixes of `min_n` tokens up to `default_max_n`, or `min_n` alone when it is
  /// longer (the `--prompt-lookup N` of specsample-generate and distribution_check).
  [[nodiscard]] static ngram from_shortest(std::size_t vocab, std::size_t min_n) {
    return ngram(vocab, std::max(default_max_n, min_n), min_n);
  }

  [[nodiscard]] std::size_t vocab_size() const noexcept { return vocab_; }
  /// The shortest and the longest suffix looked up.
  [[nodiscard]] std::size_t min_n() const noexcept { return min_n_; }
  [[nodiscard]] std::size_t max_n() const noexcept { return max_n_; }
  /// Whether a context of `size` tokens can hold a match at all: a suffix of min_n tokens and an
  /// earlier occurrence of it need more than min_n (`match` looks up suffixes of at most size - 1).
  /// Beside `longest_drafting_context`, a program can refuse a lookup that would never propose.
  [[nodiscard]] bool can_match_in(std::size_t size) const noexcept { return size > min_n_; }

  void begin(std::span<const token>) {}

  template <class Rng>
  proposal propose(std::span<const token> ctx, std::size_t k, Eigen::Ref<Eigen::MatrixXf> q, std::span<token> out,
                   Rng&) {
    if (k == 0) return {};
    detail::check_propose_buffers("drafters::ngram", k, q.rows(), q.cols(), out.size(), vocab_);
    const std::size_t start = match(ctx);
    if (start == npos) return {};
    const std::size_t len = ctx.size();
    for (std::size_t i = 0; i < k; ++i) {
      const std::size_t at = start + i;  // in ctx + out: the copy may overlap its own output
      const token x = at < len ? ctx[at] : out[at - len];
      if (!in_vocabulary(x, vocab_)) {
        throw error(fmt::format("drafters::ngram: context token {} is out of range for vocabulary {}", x, vocab_));
      }
      out[i] = x;
      q.col(static_cast<Eigen::Index>(i)).setZero();
      q(x, static_cast<Eigen::Index>(i)) = 1.0f;
    }
    return {k, 0};
  }

  void sync(std::span<const token>) {}

  /// Where the proposed continuation starts in `ctx`, or `npos` when no suffix of length
  /// min_n..max_n occurs earlier.
  [[nodiscard]] std::size_t match(std::span<const token> ctx) const {
    const std::size_t len = ctx.size();
    for (std::size_t n = std::min(max_n_, len > 0 ? len - 1 : 0); n >= min_n_ && n > 0; --n) {
      const auto suffix = ctx.subspan(len - n, n);
      // Most recent earlier occurrence ending before the suffix itself.
      for (std::size_t end = len - 1; end >= n; --end) {
        if (std::equal(suffix.begin(), suffix.end(), ctx.begin() + static_cast<std::ptrdiff_t>(end - n))) return end;
      }
    }
    return npos;
  }

  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

 private:
  std::size_t vocab_;
  std::size_t max_n_;
  std::size_t min_n_;
};

static_assert(drafter<ngram>);

}  // namespace specsample::drafters
