#pragma once
/// @file concepts.hpp
/// The token type and the `language_model` concept every model plugs into.

#include <Eigen/Core>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>

namespace specsample {

/// A token id. Valid ids of a model are `[0, vocab_size())`.
using token = std::int32_t;

/// Whether `x` is a valid id in a vocabulary of `vocab` tokens: 0 <= x < vocab.
[[nodiscard]] constexpr bool in_vocabulary(token x, std::size_t vocab) noexcept {
  return x >= 0 && static_cast<std::size_t>(x) < vocab;
}

namespace detail {

// Each requirement of `language_model` is its own small concept so that entry points can
// static_assert them one by one with a readable sentence.

template <class M>
concept has_vocab_size = requires(const M& cm) {
  { cm.vocab_size() } -> std::convertible_to<std::size_t>;
};

template <class M>
concept has_context_size = requires(const M& cm) {
  { cm.size() } -> std::convertible_to<std::size_t>;
};

// The Eigen type (or array) an object is, or derives from (declared only: for deduction below).
template <class D>
D eigen_type_of(const Eigen::EigenBase<D>&);
template <class D>
D array_type_of(const Eigen::ArrayBase<D>&);

// Logits an `append` may return: convertible to Eigen::MatrixXf and, when they are (or derive from)
// an Eigen type, of float scalars and no array: Eigen declares conversions from a double matrix
// and from an array that fail only when instantiated, so `convertible_to` alone would accept
// Eigen::MatrixXd and Eigen::ArrayXXf. (Sparse and triangular float types convert, and pass.)
template <class R, class T = std::remove_cvref_t<R>>
concept float_logits =
    std::convertible_to<R, Eigen::MatrixXf> &&
    (!requires(const T& v) { eigen_type_of(v); } ||
     (requires(const T& v) { requires std::same_as<typename decltype(eigen_type_of(v))::Scalar, float>; } &&
      !requires(const T& v) { array_type_of(v); }));

template <class M>
concept has_append = requires(M& m, std::span<const token> t) {
  { m.append(t) } -> float_logits;
};

template <class M>
concept has_truncate = requires(M& m, std::size_t n) { m.truncate(n); };

template <class M>
concept has_max_size = requires(const M& cm) {
  { cm.max_size() } -> std::convertible_to<std::size_t>;
};

template <class M>
concept has_append_last = requires(M& m, std::span<const token> t, std::size_t n) {
  { m.append(t, n) } -> float_logits;
};

}  // namespace detail

/// A causal language model with an internal context (a KV cache, or just a token list).
///
/// A type `M` models `language_model` when, for `M& m`, `const M& cm`,
/// `std::span<const token> t` and `std::size_t n`:
///  1. `cm.vocab_size()` returns the vocabulary size V (convertible to `std::size_t`);
///  2. `cm.size()` returns the number of tokens currently in the context;
///  3. `m.append(t)` appends `t` to the context and returns float logits (convertible to
///     `Eigen::MatrixXf`; if an Eigen type, a matrix of `float`) of shape (V, t.size()): column j holds the next-token logits after
///     `t[0..j]` given the earlier context (log-probabilities up to a constant per column;
///     -inf is a zero probability);
///  4. `m.truncate(n)` keeps the first `n` tokens of the context (n <= size()).
///
/// Optionally, `cm.max_size()` returns the longest context the model accepts; the sampling loops
/// then check up front that the prompt and `max_new_tokens` fit. Optionally, `m.append(t, n)`
/// appends `t` like `m.append(t)` and returns only the last `n` columns, (V, n); the loops then
/// ask only for the logits they read (none for a prompt's prefill, one when a draft catches up).
/// Optionally, a member type `M::clock` (a std::chrono clock) times the model's calls instead of
/// std::chrono::steady_clock; a draft and its target share it. See docs/models.md.
template <class M>
concept language_model = detail::has_vocab_size<M> && detail::has_context_size<M> &&
                         detail::has_append<M> && detail::has_truncate<M>;

/// The longest context `m` accepts: `m.max_size()` when the model (or drafter: a model drafter
/// forwards its model's) provides it, else unbounded.
template <class M>
[[nodiscard]] std::size_t max_context(const M& m) {
  if constexpr (detail::has_max_size<M>) {
    return static_cast<std::size_t>(m.max_size());
  } else {
    return std::numeric_limits<std::size_t>::max();
  }
}

}  // namespace specsample

/// Checks `language_model` requirement by requirement with one readable message each (a const
/// model first: its non-const members would read as missing); used by the fallback overloads of
/// `speculative_sample` and `autoregressive_sample` (sampling/loop.hpp).
#define SPECSAMPLE_CHECK_MODEL(M_, role)                                                         \
  static_assert(!::std::is_const_v<M_>, role " must be a non-const model: append and truncate "     \
                                           "change its context");                                \
  SPECSAMPLE_CHECK_MODEL_MEMBERS(::std::remove_const_t<M_>, role)

#define SPECSAMPLE_CHECK_MODEL_MEMBERS(M, role)                                                  \
  static_assert(::specsample::detail::has_vocab_size<M>,                                         \
                role " must provide `vocab_size() const` returning the vocabulary size");        \
  static_assert(::specsample::detail::has_context_size<M>,                                       \
                role " must provide `size() const` returning the number of tokens in context"); \
  static_assert(::specsample::detail::has_append<M>,                                             \
                role " must provide append(span<const token>) returning vocab x n float logits " \
                     "(convertible to Eigen::MatrixXf; an Eigen matrix of float, not of double, "  \
                     "not an array)");                                                            \
  static_assert(::specsample::detail::has_truncate<M>,                                           \
                role " must provide truncate(size_t) keeping the first n tokens of context")
