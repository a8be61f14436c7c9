#pragma once
/// @file drafter.hpp
/// The drafter concept (what proposes tokens in a round) and the adapter that makes any
/// `language_model` a drafter. Drafters need not be language models: see drafters/ngram.hpp.

#include <specsample/concepts.hpp>
#include <specsample/error.hpp>
#include <specsample/sampling/params.hpp>
#include <specsample/sampling/random.hpp>
#include <specsample/sampling/warp.hpp>

#include <Eigen/Core>
#include <fmt/format.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <typeinfo>
#include <type_traits>
#include <utility>
#include <vector>

namespace specsample {

/// What a drafter did in one `propose` call.
struct proposal {
  std::size_t tokens = 0;          ///< drafts written (<= the requested count; 0 is allowed)
  std::size_t forward_calls = 0;   ///< model forward calls spent (0 for model-free drafters)
  double forward_seconds = 0.0;    ///< wall time inside those calls (the model's `append` only)
};

namespace detail {
// Each requirement of `drafter` (beside `has_vocab_size`) as its own concept, so that a type that
// misses one is told which (SPECSAMPLE_CHECK_DRAFTER).
template <class D>
concept has_begin = requires(D& d, std::span<const token> ctx) { d.begin(ctx); };

// What D's propose(ctx, k, q, out, rng) returns (ill-formed without such a member).
template <class D>
using propose_result = decltype(std::declval<D&>().propose(std::declval<std::span<const token>>(), std::size_t{},
                                                           std::declval<Eigen::Ref<Eigen::MatrixXf>>(),
                                                           std::declval<std::span<token>>(),
                                                           std::declval<std::mt19937_64&>()));

template <class D>
concept has_propose = std::same_as<propose_result<D>, proposal>;

template <class D>
concept has_sync = requires(D& d, std::span<const token> ctx) { d.sync(ctx); };
}  // namespace detail

/// A source of draft tokens for `speculative_sample`.
///
/// A type `D` models `drafter` when, for `D& d`, `const D& cd`, the context
/// `std::span<const token> ctx` (prompt + emitted so far), a count `k`, `Eigen::Ref<Eigen::MatrixXf> q`
/// of shape (V, k) and `std::span<token> out` of size k, and a uniform random bit generator `rng`:
///  1. `cd.vocab_size()` returns V;
///  2. `d.begin(ctx)` prepares for a generation from prompt `ctx`;
///  3. `d.propose(ctx, k, q, out, rng)` writes n <= k drafts to out[0..n) and, in q.col(i), the full
///     distribution draft i was drawn from (one-hot for deterministic proposals; every entry
///     finite and >= 0, summing to 1 within `distribution_tolerance(V)`, which the loop checks,
///     one vector pass per column, for any drafter but the library's, and then divides by the
///     sum: the drafts drawn in proportion to q), conditioned on
///     ctx + out[0..i), and returns
///     `proposal{n, forward_calls, forward_seconds}` (the time inside model `append` calls;
///     whatever else the drafter does counts as the loop's own time). The choice of n and of the
///     drafts may depend on anything but the target's output for this round: that keeps sampling
///     exact;
///  4. `d.sync(ctx)` is told the context after each round (for KV-cache rollback and the like).
///
/// Optionally, `cd.max_size()` returns the longest context the drafter's model accepts; the loops
/// then check up front that the prompt and `max_new_tokens` fit it (`max_context`).
template <class D>
concept drafter = detail::has_vocab_size<D> && detail::has_begin<D> && detail::has_propose<D> && detail::has_sync<D>;

namespace detail {
// Whether D means to be a drafter (it has `begin`, `sync` or a `propose` taking the drafter's
// arguments, whatever it returns), so a type that is neither a drafter nor a model is diagnosed
// against the requirements it was written for.
template <class D>
concept drafter_like = has_begin<D> || has_sync<D> || requires { typename propose_result<D>; };
}  // namespace detail

namespace detail {

// D writes distributions into q by construction (a warper's output, or one-hot proposals)
// because D itself says so: `D::writes_distributions` names D — the library's drafters. The
// sampling loop checks every column of q written by any other drafter (finite entries >= 0,
// summing to 1: see distribution_tolerance). A class derived from a library drafter does not
// inherit the opt-in.
template <class D>
concept writes_distributions = std::is_same_v<typename D::writes_distributions, D>;

// The clock the library times a model's calls with (`generation_stats`, `cost_ratios`, and so
// `calibrate` and `measure_speedup`): the model's own `clock` type where it names one (a
// std::chrono clock), else std::chrono::steady_clock. A model can name a clock that waits for
// its device, or a test's model one that counts the time its calls simulate
// (tests/core/test_tuning.cpp).
template <class M>
struct model_clock {
  using type = std::chrono::steady_clock;
};
template <class M>
  requires requires { typename M::clock; }
struct model_clock<M> {
  using type = typename M::clock;
};
template <class M>
using model_clock_t = typename model_clock<std::remove_cvref_t<M>>::type;

// Two models whose times the library compares or adds (a draft and its target) must share a
// clock: one diagnostic per pair of clocks, wherever the pair meets (the loop's statistics,
// cost_ratios) and whichever models name them (the assertion is a function of the clocks alone).
template <class DraftClock, class TargetClock>
constexpr void check_same_clock() {
  static_assert(std::is_same_v<DraftClock, TargetClock>,
                "the draft and the target model time their calls on different clocks (a model's `clock` "
                "type): the library compares and adds their seconds");
}
template <class DraftModel, class Target>
constexpr void check_clocks() {
  check_same_clock<model_clock_t<DraftModel>, model_clock_t<Target>>();
}

template <class Clock>
double seconds_since(typename Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// m.vocab_size() as a size, checked: at least 1, and at most 2^31 (token ids are int32).
template <class M>
std::size_t vocabulary_of(const M& m, const char* role) {
  const auto v = m.vocab_size();
  constexpr std::uint64_t most = std::uint64_t{1} << 31;
  if (!(v > 0 && static_cast<std::uint64_t>(v) <= most)) {
    throw error(fmt::format("{} model reports vocab_size() = {}; it must be in 1..{}", role, v, most));
  }
  return static_cast<std::size_t>(v);
}

// call(), with a plain `specsample::error` it throws given the model's role first ("draft model:
// ..."): a program running two models of one type can tell which failed. An error of a derived
// type (a parameter_error, a model's own kind) passes unchanged, so a handler of that type still
// catches it.
template <class Call>
decltype(auto) naming_role(const char* role, Call&& call) {
  try {
    return call();
  } catch (const error& e) {
    if (typeid(e) != typeid(error)) throw;
    throw error(fmt::format("{} model: {}", role, e.what()));
  }
}

// Appends t to m and hands the (V, n) logits of its last n tokens to `use` (n <= t.size()): via
// m.append(t, n) when the model has it, else the last n columns of m.append(t). Checks first that
// the model kept its side of the contract (shape, and size() growing by t.size()). Returns the
// seconds spent in m.append alone (the forward pass; not the checks, not `use`), on the model's
// clock (`model_clock_t`). The append's
// errors name the role (`naming_role`: an overflowed forward pass, say).
template <class M, class F>
double forward(M& m, std::span<const token> t, std::size_t n, std::size_t vocab, const char* role, F&& use) {
  using clock = model_clock_t<M>;
  const auto before = static_cast<std::size_t>(m.size());
  const auto t0 = clock::now();
  auto&& out = naming_role(role, [&]() -> decltype(auto) {
    if constexpr (has_append_last<M>) {
      return m.append(t, n);
    } else {
      return m.append(t);
    }
  });
  const double seconds = seconds_since<clock>(t0);
  const auto after = static_cast<std::size_t>(m.size());
  if (after != before + t.size()) {
    throw error(fmt::format("{} model reports size() = {} after appending {} tokens to a context of {}",
                            role, after, t.size(), before));
  }
  const std::size_t cols = has_append_last<M> ? n : t.size();
  auto checked = [&](const auto& logits) {
    if (static_cast<std::size_t>(logits.rows()) != vocab || static_cast<std::size_t>(logits.cols()) != cols) {
      throw error(fmt::format("{} model returned logits of shape ({}, {}) for {} tokens; expected ({}, {})",
                              role, logits.rows(), logits.cols(), t.size(), vocab, cols));
    }
    use(logits.rightCols(static_cast<Eigen::Index>(n)));
  };
  using R = std::remove_cvref_t<decltype(out)>;
  if constexpr (std::is_base_of_v<Eigen::DenseBase<R>, R>) {
    checked(out);  // Eigen matrices, maps and expressions are used in place
  } else {
    const Eigen::MatrixXf converted = out;
    checked(converted);
  }
  return seconds;
}

// The tokens of ctx[0, end) that `m` does not hold yet.
template <class M>
std::span<const token> missing(const M& m, std::span<const token> ctx, std::size_t end, const char* role) {
  const auto held = static_cast<std::size_t>(m.size());
  if (held >= end) {
    throw error(fmt::format("{} model reports size() = {} but the loop expected at most {} tokens in its context",
                            role, held, end - 1));
  }
  return ctx.subspan(held, end - held);
}

// The buffers of a drafter's `propose` (k > 0): k drafts need q of one row per vocabulary token
// and at least k columns, and at least k slots of out. The loops always pass them so; a direct caller
// gets this error instead of writes past the buffers.
inline void check_propose_buffers(const char* drafter, std::size_t k, Eigen::Index q_rows, Eigen::Index q_cols,
                                  std::size_t out_size, std::size_t vocab) {
  if (static_cast<std::size_t>(q_rows) != vocab || static_cast<std::size_t>(q_cols) < k || out_size < k) {
    throw error(fmt::format("{}::propose: {} draft{} need{} q of shape ({}, >= {}) and out of size >= {}; got ({}, "
                            "{}) and {}",
                            drafter, k, k == 1 ? "" : "s", k == 1 ? "s" : "", vocab, k, k, q_rows, q_cols, out_size));
  }
}

// m.truncate(n), checked: the model must then hold exactly n tokens. (A truncate that kept more
// would surface later as a size() the loop does not expect, blamed on another cause.) A plain
// `error` it throws names the role, as `forward`'s do.
template <class M>
void truncate_to(M& m, std::size_t n, const char* role) {
  naming_role(role, [&] { m.truncate(n); });
  const auto held = static_cast<std::size_t>(m.size());
  if (held != n) {
    throw error(fmt::format("{} model reports size() = {} after truncate({}); truncate(n) must keep exactly the first n "
                            "tokens of the context",
                            role, held, n));
  }
}

// Resets `m` to hold all of ctx but its last token.
template <class M>
void prefill(M& m, std::span<const token> ctx, std::size_t vocab, const char* role) {
  truncate_to(m, 0, role);
  if (ctx.size() > 1) forward(m, ctx.first(ctx.size() - 1), 0, vocab, role, [](const auto&) {});
}

}  // namespace detail

/// Makes a `language_model` a drafter: samples each draft from the model's warped distribution,
/// one forward call per draft (the first call of a round also catches the model up on the
/// tokens it lacks). Optionally stops early when the draft's most probable token falls below
/// `min_probability` (llama.cpp's p_min), and after drafting `eos` (the output would end there;
/// the sampling loop cuts any drafter's proposal after its first EOS too, and passes
/// `speculative_params::eos` here): draft-side decisions, so sampling stays exact.
template <language_model M>
class model_drafter {
 public:
  /// q holds the warper's distributions (detail::writes_distributions): the loop need not check it.
  using writes_distributions = model_drafter;

  model_drafter(M& model, const sampling_params& sampling, float min_probability = 0.0f,
                std::optional<token> eos = std::nullopt)
      : model_(&model),
        warp_(sampling, detail::vocabulary_of(model, "draft"), "draft"),
        min_probability_(min_probability),
        eos_(eos) {
    if (!(min_probability >= 0.0f && min_probability < 1.0f)) {
      throw parameter_error("model_drafter.min_probability", fmt::format(" must be in [0, 1), got {}", min_probability));
    }
  }

  [[nodiscard]] std::size_t vocab_size() const { return static_cast<std::size_t>(model_->vocab_size()); }
  /// The model's `max_context`: the sampling loops check up front that a generation fits it.
  [[nodiscard]] std::size_t max_size() const { return max_context(*model_); }
  [[nodiscard]] M& model() noexcept { return *model_; }

  void begin(std::span<const token> ctx) { detail::prefill(*model_, ctx, vocab_size(), "draft"); }

  template <std::uniform_random_bit_generator Rng>
  proposal propose(std::span<const token> ctx, std::size_t k, Eigen::Ref<Eigen::MatrixXf> q, std::span<token> out,
                   Rng& rng) {
    if (k == 0) return {};
    detail::check_propose_buffers("model_drafter", k, q.rows(), q.cols(), out.size(), vocab_size());
    if (ctx.empty()) throw error("model_drafter::propose: the context is empty (a draft follows at least one token)");
    proposal made;
    for (std::size_t i = 0; i < k; ++i) {
      const auto col = static_cast<Eigen::Index>(i);
      const std::span<const token> input =
          i == 0 ? detail::missing(*model_, ctx, ctx.size(), "draft") : std::span<const token>(&out[i - 1], 1);
      made.forward_seconds += detail::forward(*model_, input, 1, vocab_size(), "draft", [&](const auto& logits) {
        warp_(logits.col(0), q.col(col));
      });
      ++made.forward_calls;
      if (min_probability_ > 0.0f && q.col(col).maxCoeff() < min_probability_) break;
      out[i] = detail::draw_categorical(q.col(col), rng);
      made.tokens = i + 1;
      if (eos_ && out[i] == *eos_) break;
    }
    return made;
  }

  void sync(std::span<const token> ctx) {
    if (static_cast<std::size_t>(model_->size()) > ctx.size() - 1) detail::truncate_to(*model_, ctx.size() - 1, "draft");
  }

 private:
  M* model_;
  logit_warper warp_;
  float min_probability_;
  std::optional<token> eos_;
};

}  // namespace specsample

/// Checks `drafter` requirement by requirement with one readable message each (a const drafter
/// first), as SPECSAMPLE_CHECK_MODEL does for models; used by `speculative_sample`'s fallback
/// overload (sampling/loop.hpp) for a type that means to be a drafter (`detail::drafter_like`).
#define SPECSAMPLE_CHECK_DRAFTER(D_, role)                                                              \
  static_assert(!::std::is_const_v<D_>, role " must be a non-const drafter: begin, propose and sync "   \
                                            "change its state");                                        \
  SPECSAMPLE_CHECK_DRAFTER_MEMBERS(::std::remove_const_t<D_>, role)

#define SPECSAMPLE_CHECK_DRAFTER_MEMBERS(D, role)                                                       \
  static_assert(::specsample::detail::has_vocab_size<D>,                                                \
                role " (a drafter) must provide `vocab_size() const` returning the vocabulary size");   \
  static_assert(::specsample::detail::has_begin<D>,                                                     \
                role " (a drafter) must provide begin(span<const token> ctx), called with the prompt"); \
  static_assert(::specsample::detail::has_propose<D>,                                                   \
                role " (a drafter) must provide propose(span<const token> ctx, size_t k, "              \
                     "Eigen::Ref<Eigen::MatrixXf> q, span<token> out, Rng& rng) returning "             \
                     "specsample::proposal, for any uniform random bit generator Rng");                 \
  static_assert(::specsample::detail::has_sync<D>,                                                      \
                role " (a drafter) must provide sync(span<const token> ctx), told the context after "   \
                     "each round")
