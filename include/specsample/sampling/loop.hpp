#pragma once
/// @file loop.hpp
/// The generation loops: `speculative_sample` and `autoregressive_sample`.

#include <specsample/concepts.hpp>
#include <specsample/error.hpp>
#include <specsample/sampling/params.hpp>
#include <specsample/sampling/random.hpp>
#include <specsample/sampling/stats.hpp>
#include <specsample/sampling/verify.hpp>
#include <specsample/sampling/warp.hpp>

#include <Eigen/Core>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace specsample {
namespace detail {

using clock = std::chrono::steady_clock;

inline double seconds_since(clock::time_point t0) {
  return std::chrono::duration<double>(clock::now() - t0).count();
}

inline void check_prompt(std::span<const token> prompt, std::size_t vocab) {
  if (prompt.empty()) {
    throw error("prompt is empty: generation needs at least one token to condition on "
                "(use the tokenizer's <|endoftext|> id to start from nothing)");
  }
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || static_cast<std::size_t>(prompt[i]) >= vocab) {
      throw error(fmt::format("prompt token {} at position {} is out of range for a vocabulary of {} tokens",
                              prompt[i], i, vocab));
    }
  }
}

// The models hold every token but the last one emitted, so the longest context a model sees is
// prompt + max_new_tokens - 1 tokens.
template <class M>
void check_fits(const M& m, const char* role, std::size_t prompt, std::size_t max_new) {
  const std::size_t limit = max_context(m);
  const std::size_t needed = prompt + max_new - 1;  // prompt >= 1 (checked before)
  if (needed > limit) {
    throw error(fmt::format("context overflow: a prompt of {} tokens plus max_new_tokens = {} needs a "
                            "context of {} tokens, but the {} model holds at most {}",
                            prompt, max_new, needed, role, limit));
  }
}

// Calls m.append(t) and hands the (V, t.size()) logits to `use`, after checking that the model
// kept its side of the contract (shape, and size() growing by t.size()).
template <class M, class F>
void forward(M& m, std::span<const token> t, std::size_t vocab, const char* role, F&& use) {
  const auto before = static_cast<std::size_t>(m.size());
  auto&& out = m.append(t);
  const auto after = static_cast<std::size_t>(m.size());
  if (after != before + t.size()) {
    throw error(fmt::format("{} model reports size() = {} after appending {} tokens to a context of {}",
                            role, after, t.size(), before));
  }
  auto checked = [&](const auto& logits) {
    if (static_cast<std::size_t>(logits.rows()) != vocab ||
        static_cast<std::size_t>(logits.cols()) != t.size()) {
      throw error(fmt::format("{} model returned logits of shape ({}, {}) for {} tokens; expected ({}, {})",
                              role, logits.rows(), logits.cols(), t.size(), vocab, t.size()));
    }
    use(logits);
  };
  using R = std::remove_cvref_t<decltype(out)>;
  if constexpr (std::is_base_of_v<Eigen::DenseBase<R>, R>) {
    checked(out);  // Eigen matrices, maps and expressions are used in place
  } else {
    const Eigen::MatrixXf converted = out;
    checked(converted);
  }
}

// The tokens of `ctx[0, end)` that `m` does not hold yet.
template <class M>
std::span<const token> missing(const M& m, const std::vector<token>& ctx, std::size_t end, const char* role) {
  const auto held = static_cast<std::size_t>(m.size());
  if (held >= end) {
    throw error(fmt::format("{} model reports size() = {} but the loop expected at most {} tokens in its context",
                            role, held, end - 1));
  }
  return std::span<const token>(ctx).subspan(held, end - held);
}

template <class M>
void prefill(M& m, const std::vector<token>& ctx, std::size_t vocab, const char* role) {
  m.truncate(0);
  if (ctx.size() > 1) forward(m, std::span<const token>(ctx).first(ctx.size() - 1), vocab, role, [](const auto&) {});
}

// Stands in for the draft in autoregressive sampling.
struct no_draft {};

// The one loop. With Draft = no_draft it is autoregressive sampling: every round verifies zero
// drafts, so its single token is drawn from p directly.
template <class Draft, class Target, class Rng, class Observer, class Verifier>
generation_result generate(Draft& draft, Target& target, std::span<const token> prompt,
                           const speculative_params& params, Rng& rng, Observer& observer, Verifier& verify) {
  const auto t_start = clock::now();
  constexpr bool has_draft = !std::is_same_v<Draft, no_draft>;
  const auto vocab = static_cast<std::size_t>(target.vocab_size());
  if constexpr (has_draft) {
    if (static_cast<std::size_t>(draft.vocab_size()) != vocab) {
      throw error(fmt::format("draft and target vocabularies differ: the draft has {} tokens, the target has {}",
                              draft.vocab_size(), vocab));
    }
    validate(params, vocab);
  } else {
    speculative_params checked = params;
    checked.draft_length = 1;  // ignored without a draft
    validate(checked, vocab);
  }
  check_prompt(prompt, vocab);
  check_fits(target, "target", prompt.size(), params.max_new_tokens);
  if constexpr (has_draft) check_fits(draft, "draft", prompt.size(), params.max_new_tokens);

  const std::size_t max_k = has_draft ? params.draft_length : 0;
  const auto max_new = params.max_new_tokens;
  logit_warper warp(params.sampling, vocab);
  generation_result result;
  generation_stats& stats = result.stats;
  stats.accepted_histogram.assign(max_k + 1, 0);
  result.tokens.reserve(max_new);
  std::vector<token> ctx;
  ctx.reserve(prompt.size() + max_new + max_k + 1);
  ctx.assign(prompt.begin(), prompt.end());
  const auto v = static_cast<Eigen::Index>(vocab);
  Eigen::MatrixXf q(v, static_cast<Eigen::Index>(max_k));      // q: (V, K) draft distributions
  Eigen::MatrixXf p(v, static_cast<Eigen::Index>(max_k) + 1);  // p: (V, K+1) target distributions
  std::vector<draft_event> events;
  events.reserve(max_k);

  {
    const auto t0 = clock::now();
    prefill(target, ctx, vocab, "target");
    if constexpr (has_draft) prefill(draft, ctx, vocab, "draft");
    stats.prefill_seconds = seconds_since(t0);
  }

  while (result.tokens.size() < max_new) {
    const std::size_t remaining = max_new - result.tokens.size();
    const std::size_t k = std::min(max_k, remaining - 1);  // never draft past max_new_tokens
    const std::size_t len = ctx.size();

    // Draft k tokens one at a time; each call first catches the draft up on what it lacks.
    if constexpr (has_draft) {
      for (std::size_t i = 0; i < k; ++i) {
        const auto t0 = clock::now();
        forward(draft, missing(draft, ctx, len + i, "draft"), vocab, "draft", [&](const auto& logits) {
          warp(logits.col(logits.cols() - 1), q.col(static_cast<Eigen::Index>(i)));
        });
        stats.draft_seconds += seconds_since(t0);
        ++stats.draft_calls;
        ctx.push_back(sample_categorical(q.col(static_cast<Eigen::Index>(i)), rng));
      }
    }

    // Score [last, d_0 .. d_{k-1}] with the target in one call: k + 1 columns.
    {
      const auto t0 = clock::now();
      forward(target, missing(target, ctx, len + k, "target"), vocab, "target", [&](const auto& logits) {
        const Eigen::Index first = logits.cols() - static_cast<Eigen::Index>(k) - 1;
        for (Eigen::Index j = 0; j <= static_cast<Eigen::Index>(k); ++j) warp(logits.col(first + j), p.col(j));
      });
      stats.target_seconds += seconds_since(t0);
      ++stats.target_calls;
    }

    const auto drafts = std::span<const token>(ctx).subspan(len, k);
    const auto ki = static_cast<Eigen::Index>(k);
    const verify_result outcome = verify(drafts, q.leftCols(ki), p.leftCols(ki + 1), rng);
    if (outcome.accepted > k || outcome.next < 0 || static_cast<std::size_t>(outcome.next) >= vocab) {
      throw error(fmt::format("verifier returned {} accepted of {} drafts and next token {}",
                              outcome.accepted, k, outcome.next));
    }
    if constexpr (!std::is_same_v<std::remove_cvref_t<Observer>, no_observer>) {
      events.clear();
      for (std::size_t i = 0; i < k; ++i) {
        const auto ii = static_cast<Eigen::Index>(i);
        events.push_back({drafts[i], q(drafts[i], ii), p(drafts[i], ii), i < outcome.accepted});
      }
    }
    ctx.resize(len + outcome.accepted);
    ctx.push_back(outcome.next);

    // Stop right after EOS, even inside an accepted run.
    bool hit_eos = false;
    if (params.eos) {
      const auto it = std::find(ctx.begin() + static_cast<std::ptrdiff_t>(len), ctx.end(), *params.eos);
      if (it != ctx.end()) {
        ctx.erase(it + 1, ctx.end());
        hit_eos = true;
      }
    }
    const std::size_t emitted = ctx.size() - len;
    const std::size_t accepted = std::min(outcome.accepted, emitted);
    const bool last_emitted = emitted == outcome.accepted + 1;
    ++stats.rounds;
    stats.drafted += k;
    stats.accepted += accepted;
    stats.accepted_histogram[accepted] += 1;
    if (last_emitted) ++(outcome.bonus ? stats.bonus : stats.corrections);
    stats.tokens += emitted;
    result.tokens.insert(result.tokens.end(), ctx.begin() + static_cast<std::ptrdiff_t>(len), ctx.end());

    // Restore the invariant: every model holds a prefix of ctx, the target all but the last token.
    target.truncate(ctx.size() - 1);
    if constexpr (has_draft) {
      if (static_cast<std::size_t>(draft.size()) > ctx.size() - 1) draft.truncate(ctx.size() - 1);
    }

    if constexpr (!std::is_same_v<std::remove_cvref_t<Observer>, no_observer>) {
      observer(round_event{stats.rounds - 1, std::span<const draft_event>(events),
                           std::span<const token>(ctx).subspan(len), outcome.bonus && last_emitted, hit_eos});
    }
    if (hit_eos) break;
  }
  stats.total_seconds = seconds_since(t_start);
  return result;
}

}  // namespace detail

/// Speculative sampling: `draft` proposes up to `params.draft_length` tokens per round, `target`
/// scores them in one call, `verifier` decides (token-wise rejection sampling by default).
///
/// The returned tokens are distributed exactly as `autoregressive_sample(target, ...)` with the
/// same `params.sampling` (identical tokens at temperature 0). Both models are reset to the prompt
/// first; on return each holds a prefix of prompt + tokens (the target: all but the last token),
/// so a follow-up call continues correctly. Throws `specsample::error` on bad parameters, an empty
/// or out-of-range prompt, mismatched vocabularies, context overflow, or a model that breaks its
/// contract (wrong logits shape, NaN / +inf logits).
///
/// @param observer called with a `round_event` after every round (tracing, streaming).
/// @param verifier customisation point: `verify_result(span<const token> drafts, q, p, Rng&)`;
///        this overload ignores `params.verify` and `params.leniency`.
template <language_model Draft, language_model Target, std::uniform_random_bit_generator Rng,
          class Observer, class Verifier>
generation_result speculative_sample(Draft& draft, Target& target, std::span<const token> prompt,
                                     const speculative_params& params, Rng& rng, Observer&& observer,
                                     Verifier&& verifier) {
  return detail::generate(draft, target, prompt, params, rng, observer, verifier);
}

/// Speculative sampling with the verification rule `params.verify` (token-wise by default),
/// reporting each round to `observer`.
template <language_model Draft, language_model Target, std::uniform_random_bit_generator Rng, class Observer>
generation_result speculative_sample(Draft& draft, Target& target, std::span<const token> prompt,
                                     const speculative_params& params, Rng& rng, Observer&& observer) {
  if (params.verify == verification::block) {
    block_verifier verifier;
    return detail::generate(draft, target, prompt, params, rng, observer, verifier);
  }
  tokenwise_verifier verifier{params.leniency};
  return detail::generate(draft, target, prompt, params, rng, observer, verifier);
}

/// Speculative sampling with the verification rule `params.verify` (token-wise by default).
template <language_model Draft, language_model Target, std::uniform_random_bit_generator Rng>
generation_result speculative_sample(Draft& draft, Target& target, std::span<const token> prompt,
                                     const speculative_params& params, Rng& rng) {
  return speculative_sample(draft, target, prompt, params, rng, no_observer{});
}

/// Plain autoregressive sampling from `target` with the same warping: the reference distribution
/// speculative sampling reproduces. `params.draft_length` is ignored.
template <language_model Target, std::uniform_random_bit_generator Rng, class Observer>
generation_result autoregressive_sample(Target& target, std::span<const token> prompt,
                                        const speculative_params& params, Rng& rng, Observer&& observer) {
  tokenwise_verifier verifier;
  detail::no_draft none;
  return detail::generate(none, target, prompt, params, rng, observer, verifier);
}

/// Plain autoregressive sampling from `target`; see above.
template <language_model Target, std::uniform_random_bit_generator Rng>
generation_result autoregressive_sample(Target& target, std::span<const token> prompt,
                                        const speculative_params& params, Rng& rng) {
  return autoregressive_sample(target, prompt, params, rng, no_observer{});
}

/// Readable diagnostics for a type that is not a `language_model`: one static_assert per missing
/// requirement instead of a page of unsatisfied constraints.
template <class Draft, class Target, class Rng, class... Rest>
  requires(!language_model<Draft> || !language_model<Target>)
generation_result speculative_sample(Draft&, Target&, std::span<const token>, const speculative_params&, Rng&,
                                     Rest&&...) {
  SPECSAMPLE_CHECK_MODEL(Draft, "Draft");
  SPECSAMPLE_CHECK_MODEL(Target, "Target");
  return {};
}

}  // namespace specsample
