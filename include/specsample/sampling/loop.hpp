#pragma once
/// @file loop.hpp
/// The generation loops: `speculative_sample` and `autoregressive_sample`.

#include <specsample/concepts.hpp>
#include <specsample/detail/simd.hpp>
#include <specsample/error.hpp>
#include <specsample/sampling/drafter.hpp>
#include <specsample/sampling/params.hpp>
#include <specsample/sampling/random.hpp>
#include <specsample/sampling/stats.hpp>
#include <specsample/sampling/verify.hpp>
#include <specsample/sampling/warp.hpp>

#include <Eigen/Core>
#include <fmt/format.h>

#include <algorithm>
#include <bitset>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace specsample {

/// The most new tokens (`max_new_tokens`) a model that holds at most `limit` positions can take
/// after a prompt of `prompt` >= 1 tokens: the target holds every token but the last one emitted, so
/// prompt + max_new_tokens - 1 <= limit (a draft model holds one fewer); 0 when the prompt alone
/// does not fit. What the generation
/// entry points check (a context overflow is an error naming both numbers); a program can check it
/// first and name its own option.
[[nodiscard]] constexpr std::size_t max_new_tokens_within(std::size_t limit, std::size_t prompt) noexcept {
  const std::size_t held = prompt > 0 ? prompt - 1 : 0;
  return held > limit ? 0 : limit - held;
}

/// The same for a draft model of `limit` positions, which never holds the generation's last two
/// tokens: prompt + max_new_tokens - 2 <= limit (and the prompt but its last token after the
/// prefill); 0 when the prompt alone does not fit. A pair's most is the smaller of this and the
/// target's `max_new_tokens_within`.
[[nodiscard]] constexpr std::size_t draft_max_new_tokens_within(std::size_t limit, std::size_t prompt) noexcept {
  const std::size_t held = prompt > 0 ? prompt - 1 : 0;
  if (held > limit) return 0;
  const std::size_t room = limit - held;
  return room == std::numeric_limits<std::size_t>::max() ? room : room + 1;
}

/// The longest context a drafter is asked to propose from when `max_new_tokens` follow a prompt of
/// `prompt` tokens: a round drafts only while two new tokens or more remain (a draft never reaches
/// past max_new_tokens), so from at most prompt + max_new_tokens - 2 tokens; 0 when no round drafts
/// (max_new_tokens < 2). With `drafters::ngram::can_match_in`, a program can refuse a lookup that
/// could never propose in this generation.
[[nodiscard]] constexpr std::size_t longest_drafting_context(std::size_t prompt, std::size_t max_new_tokens) noexcept {
  if (max_new_tokens < 2) return 0;
  const std::size_t more = max_new_tokens - 2;
  return more > std::numeric_limits<std::size_t>::max() - prompt ? std::numeric_limits<std::size_t>::max()
                                                                 : prompt + more;
}

/// Which model's context bounds a generation's prompt and `max_new_tokens`, of a target of
/// `target_limit` positions and draft models of `draft_limits` (`binding_context`).
struct context_binding {
  std::size_t holds = 0;             ///< the binding model's positions (its `max_context`)
  std::optional<std::size_t> draft;  ///< the index in draft_limits of the draft that binds; empty: the target
  /// The longest prompt that leaves room for one new token: `holds` for the target, one more for a
  /// draft model (it never holds the generation's last two tokens).
  [[nodiscard]] std::size_t longest_prompt() const noexcept { return draft ? holds + 1 : holds; }
  /// The most new tokens after a prompt of `prompt` tokens: `max_new_tokens_within` or
  /// `draft_max_new_tokens_within` of the binding model (0: the prompt alone does not fit).
  [[nodiscard]] std::size_t new_tokens_within(std::size_t prompt) const noexcept {
    return draft ? draft_max_new_tokens_within(holds, prompt) : max_new_tokens_within(holds, prompt);
  }
};

/// The model whose context binds: the one that leaves the fewest new tokens after any prompt (the
/// shortest longest prompt), the target on a tie, else the first such draft. For programs that
/// check a prompt and a length before generating and name their own options and models.
[[nodiscard]] inline context_binding binding_context(std::size_t target_limit,
                                                     std::span<const std::size_t> draft_limits) noexcept {
  context_binding b{target_limit, {}};
  for (std::size_t d = 0; d < draft_limits.size(); ++d) {
    const std::size_t longest = b.longest_prompt();
    if (draft_limits[d] < longest && draft_limits[d] + 1 < longest) b = {draft_limits[d], d};  // (cannot wrap)
  }
  return b;
}

namespace detail {

inline void check_prompt(std::span<const token> prompt, std::size_t vocab) {
  if (prompt.empty()) {
    throw error("prompt is empty: generation needs at least one token to condition on "
                "(use the tokenizer's <|endoftext|> id to start from nothing)");
  }
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    if (!in_vocabulary(prompt[i], vocab)) {
      throw error(fmt::format("prompt token {} at position {} is out of range for a vocabulary of {} tokens",
                              prompt[i], i, vocab));
    }
  }
}

// The target holds every token but the last one emitted, so the longest context it sees is
// prompt + max_new_tokens - 1 tokens; a drafter's model never holds the last two either (no round
// drafts the generation's last token, and a round's last draft is never fed back), so it sees at
// most prompt + max_new_tokens - 2, and prompt - 1 after its prefill. `unfed`: 1 for the target,
// 2 for a draft. Computed without wrapping: an empty prompt (reported by check_prompt, which the
// entry points call first) or a huge max_new_tokens cannot slip through. A model without a limit
// takes any max_new_tokens (SIZE_MAX: stop at EOS only).
template <class M>
void check_fits(const M& m, const char* role, std::size_t prompt, std::size_t max_new, std::size_t unfed = 1) {
  if (prompt == 0 && max_new == 0) return;  // nothing is ever appended
  const std::size_t limit = max_context(m);
  if (limit == std::numeric_limits<std::size_t>::max()) return;  // unbounded
  // needed = prompt - 1 + fed = held + more, the new tokens fed being max_new - (unfed - 1) (none
  // for fewer), compared so that it cannot wrap either (held <= limit first: max_new_tokens_within's
  // limit - held).
  const std::size_t fed = max_new > unfed - 1 ? max_new - (unfed - 1) : 0;
  const std::size_t held = prompt > 0 ? prompt - 1 : (fed > 0 ? fed - 1 : 0);
  const std::size_t more = prompt > 0 ? fed : 0;
  if (held > limit || more > limit - held) {
    const bool wraps = more > std::numeric_limits<std::size_t>::max() - held;
    const std::string needed = wraps ? fmt::format("more than {}", std::numeric_limits<std::size_t>::max())
                                     : fmt::format("{}", held + more);
    throw error(fmt::format("context overflow: a prompt of {} tokens plus max_new_tokens = {} needs a "
                            "context of {} tokens ({}), but the {} model holds at most {}",
                            prompt, max_new, needed,
                            unfed == 1 ? "the last new token is never fed to a model"
                                       : "a draft model is never fed the last two new tokens",
                            role, limit));
  }
}

// A draft's tokens index the target's vocabulary: the two sizes must agree.
inline void check_vocabularies(std::size_t draft, std::size_t target) {
  if (draft != target) {
    throw error(fmt::format("draft and target vocabularies differ: the draft has {} tokens, the target has {}", draft,
                            target));
  }
}

// The loop keeps the draft and the target at different lengths, so one model object cannot be both
// (`who` prefixes the message, `why` says why for a caller other than the loop).
template <class Draft, class Target>
void check_distinct(const Draft& draft, const Target& target, std::string_view who = "",
                    std::string_view why = "the loop keeps them at different context lengths") {
  if (static_cast<const void*>(std::addressof(draft)) == static_cast<const void*>(std::addressof(target))) {
    throw error(fmt::format("{}the draft and the target are the same model object: {}; pass a second instance as the "
                            "draft (e.g. the checkpoint loaded twice)", who, why));
  }
}

// Tokens the loop reserves room for up front: the whole generation when the target's context bounds
// it, up to bounded_reserve_limit (a context that long is one in name only), else up to
// reserve_limit (max_new_tokens may be a mere cap for EOS, even SIZE_MAX).
inline constexpr std::size_t reserve_limit = std::size_t{1} << 16;
inline constexpr std::size_t bounded_reserve_limit = std::size_t{1} << 24;

// Stands in for the drafter in autoregressive sampling.
struct no_draft {};

// The checks a generation makes before it starts, of the parameters, the prompt and the models
// (the drafter: any drafter or language model, or no_draft); returns the target's vocabulary size.
// Also run by testing::speculative_fit before its enumeration.
template <class Drafter, class Target>
std::size_t check_generation(const Drafter& drafter, const Target& target, std::span<const token> prompt,
                             const speculative_params& params) {
  constexpr bool has_draft = !std::is_same_v<Drafter, no_draft>;
  const std::size_t vocab = vocabulary_of(target, "target");
  if constexpr (has_draft) {
    check_vocabularies(static_cast<std::size_t>(drafter.vocab_size()), vocab);
    validate(params, vocab);
  } else {
    speculative_params checked = params;
    checked.draft_length = 1;  // ignored without a draft
    validate(checked, vocab);
  }
  check_prompt(prompt, vocab);
  check_fits(target, "target", prompt.size(), params.max_new_tokens);
  if constexpr (has_draft) check_fits(drafter, "draft", prompt.size(), params.max_new_tokens, 2);
  // SIZE_MAX means "stop at EOS only": with no EOS nothing would stop it (a target with a context
  // limit was refused by check_fits already).
  if (params.max_new_tokens == std::numeric_limits<std::size_t>::max() && !params.eos) {
    throw parameter_error("speculative_params.max_new_tokens",
                          " = SIZE_MAX caps nothing (stop at EOS only), but eos is not set and the target has no "
                          "context limit: the generation would never end");
  }
  return vocab;
}

// Throws when a verifier's result is out of range: more accepted drafts than k, a next token
// outside the vocabulary, or a bonus flag that contradicts the count (the statistics and the
// observer trust it).
inline void check_outcome_range(const verify_result& r, std::size_t k, std::size_t vocab) {
  if (r.accepted > k || !in_vocabulary(r.next, vocab)) {
    throw error(fmt::format("verifier returned {} accepted of {} drafts and next token {}", r.accepted, k, r.next));
  }
  if (r.bonus != (r.accepted == k)) {
    throw error(fmt::format("verifier returned {} accepted of {} drafts with bonus = {}: the next token is the "
                            "bonus exactly when every draft passed",
                            r.accepted, k, r.bonus));
  }
}

// The target's warped distributions of one round as a verifier's `decide` reads them (see
// detail::dense_columns): column j of `p` is warped from column j of `logits` on first use, so the
// columns no decision reaches cost no exponentials. Bitwise the columns a whole warp would give.
//
// Only the columns whose contexts the target can reach get the target's distribution: column j
// when no draft before it has warped target probability 0 (a -inf logit, as a grammar mask
// writes, or a token the warping cuts: top-k, top-p, min-p, T = 0) or is EOS (`eos`, which ends
// the output). Autoregressive sampling never asks the target about the contexts after such a
// draft, and its logits there may be anything (all -inf for a mask that allows nothing after a
// forbidden token or after EOS): those columns are neither warped nor checked, and read as the
// uniform distribution, a placeholder. An exact verifier decides nothing from them that reaches
// the output: it never accepts a draft of probability 0, and the output ends at EOS. Finding the
// columns reachable warps the columns before them, which a verifier reading in order has already.
template <class Logits>
class lazy_columns {
 public:
  lazy_columns(const Logits& logits, std::span<const token> drafts, std::optional<token> eos, logit_warper& warp,
               Eigen::MatrixXf& p)
      : logits_(logits), drafts_(drafts), eos_(eos), warp_(warp), p_(p) {}

  [[nodiscard]] Eigen::Index rows() const noexcept { return logits_.rows(); }
  [[nodiscard]] Eigen::Index cols() const noexcept { return logits_.cols(); }
  [[nodiscard]] auto col(Eigen::Index j) const {
    const auto u = static_cast<std::size_t>(j);
    if (!warped_[u] && !placeholder_[u]) {
      if (reachable(u)) {
        warp_(logits_.col(j), p_.col(j));
        warped_.set(u);
      } else {
        p_.col(j).setConstant(1.0f / static_cast<float>(rows()));
        placeholder_.set(u);
      }
    }
    return std::as_const(p_).col(j);
  }
  [[nodiscard]] float operator()(token x, Eigen::Index j) const { return col(j)(x); }
  /// The columns warped so far (placeholders not included).
  [[nodiscard]] const std::bitset<max_draft_length + 1>& warped() const noexcept { return warped_; }

  /// Whether column j's context is reachable (see the class); warps the columns before it that
  /// decide it.
  [[nodiscard]] bool reachable(std::size_t j) const {
    while (j >= reach_ && !closed_) {
      const std::size_t i = reach_ - 1;  // the last column known reachable: its draft decides the next
      const token d = drafts_[i];
      if ((eos_ && d == *eos_) || col(static_cast<Eigen::Index>(i))(d) == 0.0f) {
        closed_ = true;
      } else {
        ++reach_;
      }
    }
    return j < reach_;
  }

  /// Checks the reachable columns not warped as a warp would (NaN, +inf, or no finite logit: the
  /// warper's error), in one pass of `simd::max_scan` each instead of a softmax: a model's broken
  /// logits are an error whichever columns the random numbers lead the verifier to.
  void check_unwarped() const {
    for (Eigen::Index j = 0; j < cols(); ++j) {
      const auto u = static_cast<std::size_t>(j);
      if (placeholder_[u]) return;  // and every later column: unreachable
      if (warped_[u]) continue;
      const float* x = contiguous_floats(logits_.col(j));
      if (x != nullptr && simd::max_scan(level_, x, static_cast<std::size_t>(rows())).finite()) continue;
      if (!reachable(u)) return;
      (void)col(j);  // throws the warper's error
    }
  }

  /// Throws when a verifier's `r` (its counts already checked in range) accepts a draft the target
  /// gives probability 0, or returns a next token of probability 0 in its column: no exact rule
  /// does either, and the output would hold a token the target never samples there. Reads only
  /// columns an exact verifier has read.
  void check_outcome(const verify_result& r) const {
    for (std::size_t i = 0; i < r.accepted; ++i) {
      if (!reachable(i)) return;  // after an accepted EOS: the output ends there
      if (col(static_cast<Eigen::Index>(i))(drafts_[i]) == 0.0f) {
        throw error(fmt::format("verifier accepted draft {} (token {}), which the target gives probability 0",
                                i, drafts_[i]));
      }
    }
    if (reachable(r.accepted) && col(static_cast<Eigen::Index>(r.accepted))(r.next) == 0.0f) {
      throw error(fmt::format("verifier returned next token {} after {} accepted drafts, which the target gives "
                              "probability 0 there",
                              r.next, r.accepted));
    }
  }

 private:
  const Logits& logits_;
  std::span<const token> drafts_;
  std::optional<token> eos_;
  logit_warper& warp_;
  Eigen::MatrixXf& p_;
  mutable std::bitset<max_draft_length + 1> warped_, placeholder_;
  mutable std::size_t reach_ = 1;  // columns [0, reach_) are reachable (column 0 always)
  mutable bool closed_ = false;    // and none after them
  isa level_ = simd::detected();
};

// A model drafter's model and the target on one clock (`check_clocks`), and so every model
// drafter inside a drafter made of two (`drafters::fallback`: its first() and second()): a
// function of the types alone, so that the loop's instantiations for each verifier share one
// diagnostic.
template <class Drafter, class Target>
constexpr void check_drafter_clock() {
  if constexpr (requires(Drafter& d) { d.model(); }) {
    check_clocks<decltype(std::declval<Drafter&>().model()), Target>();
  } else if constexpr (requires(Drafter& d) {
                         d.first();
                         d.second();
                       }) {
    check_drafter_clock<std::remove_reference_t<decltype(std::declval<Drafter&>().first())>, Target>();
    check_drafter_clock<std::remove_reference_t<decltype(std::declval<Drafter&>().second())>, Target>();
  }
}

// The one loop. With Drafter = no_draft it is autoregressive sampling: every round verifies zero
// drafts, so its single token is drawn from p directly.
template <class Drafter, class Target, class Rng, class Observer, class Verifier>
generation_result generate(Drafter& drafter, Target& target, std::span<const token> prompt,
                           const speculative_params& params, Rng& rng, Observer& observer, Verifier& verify) {
  check_drafter_clock<Drafter, Target>();
  using clock = model_clock_t<Target>;
  const auto t_start = clock::now();
  constexpr bool has_draft = !std::is_same_v<Drafter, no_draft>;
  const std::size_t vocab = check_generation(drafter, target, prompt, params);

  const std::size_t max_k = has_draft ? params.draft_length : 0;
  const auto max_new = params.max_new_tokens;
  logit_warper warp(params.sampling, vocab, "target");
  generation_result result;
  generation_stats& stats = result.stats;
  stats.accepted_histogram.assign(max_k + 1, 0);
  // Room for the whole generation, so that rounds allocate nothing: in a bounded context it fits
  // (check_fits) and is reserved whole (up to bounded_reserve_limit); a model without a limit and a
  // huge max_new_tokens (stopped by EOS) gets reserve_limit to start, and the vectors grow past it.
  const bool bounded = max_context(target) != std::numeric_limits<std::size_t>::max();
  const std::size_t expected = std::min(max_new, bounded ? bounded_reserve_limit : reserve_limit);
  result.tokens.reserve(expected);
  std::vector<token> ctx;
  ctx.reserve(prompt.size() + expected + max_k + 1);
  ctx.assign(prompt.begin(), prompt.end());
  const auto v = static_cast<Eigen::Index>(vocab);
  Eigen::MatrixXf q(v, static_cast<Eigen::Index>(max_k));      // q: (V, K) draft distributions
  Eigen::MatrixXf p(v, static_cast<Eigen::Index>(max_k) + 1);  // p: (V, K+1) target distributions
  std::vector<token> drafts(max_k);
  std::vector<draft_event> events;
  events.reserve(max_k);
  std::size_t k_cap = max_k;  // the adaptive schedule's current draft length

  {
    const auto t0 = clock::now();
    prefill(target, ctx, vocab, "target");
    if constexpr (has_draft) drafter.begin(ctx);
    stats.prefill_seconds = seconds_since<clock>(t0);
  }

  while (result.tokens.size() < max_new) {
    const std::size_t remaining = max_new - result.tokens.size();
    std::size_t k = std::min(k_cap, remaining - 1);  // never draft past max_new_tokens
    const std::size_t len = ctx.size();

    if constexpr (has_draft) {
      if (k > 0) {
        const proposal made = drafter.propose(std::span<const token>(ctx), k, q.leftCols(static_cast<Eigen::Index>(k)),
                                              std::span<token>(drafts).first(k), rng);
        stats.draft_seconds += made.forward_seconds;
        stats.draft_calls += made.forward_calls;
        if (made.tokens > k) throw error(fmt::format("drafter proposed {} tokens when asked for {}", made.tokens, k));
        k = made.tokens;
        for (std::size_t i = 0; i < k; ++i) {  // before the target sees them
          if (!in_vocabulary(drafts[i], vocab)) {
            throw error(fmt::format("drafter proposed token {} (draft {} of {}), out of range for a vocabulary of "
                                    "{} tokens",
                                    drafts[i], i, k, vocab));
          }
        }
        if (params.eos) {  // the output would end at an EOS drafted: the round's drafts end there too
          const auto first = std::find(drafts.begin(), drafts.begin() + static_cast<std::ptrdiff_t>(k), *params.eos);
          k = std::min(k, static_cast<std::size_t>(first - drafts.begin()) + 1);
        }
        if constexpr (!writes_distributions<std::remove_cvref_t<Drafter>>) {  // a drafter of the caller's
          // Each column normalised by its sum, taken in double: within the tolerance, a q off 1 by
          // s - 1 would bias the output by about that much of the mass, concentrated on the tokens
          // the residual feeds, while the drafts were drawn in proportion to q.
          for (std::size_t i = 0; i < k; ++i) {
            const auto col = static_cast<Eigen::Index>(i);
            if (const double sum = check_distribution(q.col(col), col, "drafter", "q"); sum != 1.0) {
              q.col(col) *= static_cast<float>(1.0 / sum);
            }
          }
        }
        ctx.insert(ctx.end(), drafts.begin(), drafts.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }

    // Score [last, d_0 .. d_{k-1}] with the target in one call: k + 1 columns, p_0 .. p_k, warped
    // as the verifier reads them (a verifier tagged `decides_columns`), else all before it is called.
    const auto proposed = std::span<const token>(ctx).subspan(len, k);
    const auto ki = static_cast<Eigen::Index>(k);
    verify_result outcome;
    std::bitset<max_draft_length + 1> scored;  // the columns of p computed this round
    {
      const auto input = missing(target, ctx, len + k, "target");
      if (input.size() < k + 1) {  // it would return fewer than the k + 1 columns scored below
        throw error(fmt::format("target model reports size() = {} after drafting but the loop expected at most {} "
                                "(does the drafter share the target's model object?)",
                                static_cast<std::size_t>(target.size()), len - 1));
      }
      stats.target_seconds += forward(target, input, k + 1, vocab, "target", [&](const auto& logits) {
        const lazy_columns<std::remove_cvref_t<decltype(logits)>> p_lazy(logits, proposed, params.eos, warp, p);
        if constexpr (decides_columns<std::remove_cvref_t<Verifier>>) {
          outcome = verify.decide(proposed, q.leftCols(ki), p_lazy, rng);
        } else {  // every column, in order: the reachable ones warped, the rest placeholders
          for (Eigen::Index j = 0; j <= ki; ++j) (void)p_lazy.col(j);
          outcome = verify(proposed, q.leftCols(ki), p.leftCols(ki + 1), rng);
        }
        scored = p_lazy.warped();
        check_outcome_range(outcome, k, vocab);
        p_lazy.check_outcome(outcome);
        p_lazy.check_unwarped();
      });
      ++stats.target_calls;
    }
    if constexpr (!std::is_same_v<std::remove_cvref_t<Observer>, no_observer>) {
      events.clear();
      for (std::size_t i = 0; i < k; ++i) {
        const auto ii = static_cast<Eigen::Index>(i);
        const float pi = scored[i] ? p(proposed[i], ii) : std::numeric_limits<float>::quiet_NaN();
        events.push_back({proposed[i], q(proposed[i], ii), pi, i < outcome.accepted});
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
    truncate_to(target, ctx.size() - 1, "target");
    if constexpr (has_draft) drafter.sync(std::span<const token>(ctx));
    // Adaptive draft length (transformers' heuristic): +2 after a fully accepted round, -1 after a
    // rejection. It depends only on past rounds, so sampling stays exact.
    if (params.adaptive_draft_length && k > 0) {
      k_cap = outcome.accepted == k ? std::min(max_k, k_cap + 2) : std::max<std::size_t>(1, k_cap - 1);
    }

    if constexpr (!std::is_same_v<std::remove_cvref_t<Observer>, no_observer>) {
      observer(round_event{stats.rounds - 1, std::span<const draft_event>(events),
                           std::span<const token>(ctx).subspan(len), outcome.bonus && last_emitted, hit_eos});
    }
    if (hit_eos) break;
  }
  stats.total_seconds = seconds_since<clock>(t_start);
  return result;
}

// The verifier `params` selects.
template <class Drafter, class Target, class Rng, class Observer>
generation_result generate_with(Drafter& drafter, Target& target, std::span<const token> prompt,
                                const speculative_params& params, Rng& rng, Observer& observer) {
  return with_verifier(params, [&](auto verifier) {
    return generate(drafter, target, prompt, params, rng, observer, verifier);
  });
}

// The model drafter of `speculative_sample(draft, target, ...)`, after the checks that need the
// draft model itself (the parameters first: a bad `draft_sampling` is named as such, not by the
// drafter's warper).
template <class Draft, class Target>
model_drafter<Draft> drafter_for(Draft& draft, const Target& target, std::span<const token> prompt,
                                 const speculative_params& params) {
  const std::size_t vocab = vocabulary_of(target, "target");
  validate(params, vocab);
  check_prompt(prompt, vocab);  // before the fit: names an empty prompt
  check_distinct(draft, target);
  return model_drafter<Draft>(draft, params.draft_warping(), params.draft_min_probability, params.eos);
}

// The parameters a custom verifier runs with: its own rule stands in for params.verify and
// params.leniency, which are then neither checked nor read.
inline speculative_params for_custom_verifier(speculative_params params) {
  params.verify = verification::token_wise;
  params.leniency = 1.0;
  return params;
}

}  // namespace detail

/// Speculative sampling: `draft` proposes up to `params.draft_length` tokens per round, `target`
/// scores them in one call, `verifier` decides (token-wise rejection sampling by default).
///
/// The returned tokens are distributed exactly as `autoregressive_sample(target, ...)` with the
/// same `params.sampling` (identical tokens at temperature 0), whatever the draft's warping
/// (`params.draft_warping()`: `params.draft_sampling`, by default `params.sampling`). Both models
/// are reset to the prompt first; on return each holds a prefix of prompt + tokens (the target:
/// all but the last token), so a follow-up call continues correctly. Throws `specsample::error`
/// on bad parameters, an empty or out-of-range prompt, mismatched vocabularies, context overflow,
/// `draft` and `target` being one object (pass a second instance), or a model, drafter or verifier
/// that breaks its contract (wrong logits shape, NaN / +inf logits, a verify_result out of range).
/// After an exception (these, or one a model throws) the models' contexts are unspecified — the
/// next call resets them, so the objects stay usable — and the tokens of the rounds the observer
/// has already seen are not returned.
///
/// @param observer called with a `round_event` after every round (tracing, streaming).
/// @param verifier customisation point: `verify_result(span<const token> drafts, q, p, Rng&)`,
///        called with every target column warped whose context the target can reach (the others
///        the uniform distribution: `detail::lazy_columns`); a verifier that, as the built-in ones, names
///        itself as `decides_columns` and has their `decide(drafts, q, columns, rng)` is called
///        through `decide`, each column warped when it first reads it. This overload ignores
///        `params.verify` and `params.leniency` (neither is checked).
template <language_model Draft, language_model Target, std::uniform_random_bit_generator Rng,
          class Observer, class Verifier>
generation_result speculative_sample(Draft& draft, Target& target, std::span<const token> prompt,
                                     const speculative_params& params, Rng& rng, Observer&& observer,
                                     Verifier&& verifier) {
  const speculative_params own = detail::for_custom_verifier(params);
  auto drafter = detail::drafter_for(draft, target, prompt, own);
  return detail::generate(drafter, target, prompt, own, rng, observer, verifier);
}

/// Speculative sampling with the verification rule `params.verify` (token-wise by default),
/// reporting each round to `observer`.
template <language_model Draft, language_model Target, std::uniform_random_bit_generator Rng, class Observer>
generation_result speculative_sample(Draft& draft, Target& target, std::span<const token> prompt,
                                     const speculative_params& params, Rng& rng, Observer&& observer) {
  auto drafter = detail::drafter_for(draft, target, prompt, params);
  return detail::generate_with(drafter, target, prompt, params, rng, observer);
}

/// Speculative sampling with the verification rule `params.verify` (token-wise by default).
template <language_model Draft, language_model Target, std::uniform_random_bit_generator Rng>
generation_result speculative_sample(Draft& draft, Target& target, std::span<const token> prompt,
                                     const speculative_params& params, Rng& rng) {
  return speculative_sample(draft, target, prompt, params, rng, no_observer{});
}

/// Speculative sampling with a model-free (or any custom) `drafter`, e.g.
/// `drafters::ngram`: exact for any drafter that honours the `drafter` contract.
template <drafter Drafter, language_model Target, std::uniform_random_bit_generator Rng, class Observer = no_observer>
  requires(!language_model<Drafter>)
generation_result speculative_sample(Drafter& drafter, Target& target, std::span<const token> prompt,
                                     const speculative_params& params, Rng& rng, Observer&& observer = {}) {
  return detail::generate_with(drafter, target, prompt, params, rng, observer);
}

/// Speculative sampling with a `drafter` and a custom `verifier`, as the model overload above
/// takes one (`params.verify` and `params.leniency` ignored, neither checked).
template <drafter Drafter, language_model Target, std::uniform_random_bit_generator Rng, class Observer,
          class Verifier>
  requires(!language_model<Drafter>)
generation_result speculative_sample(Drafter& drafter, Target& target, std::span<const token> prompt,
                                     const speculative_params& params, Rng& rng, Observer&& observer,
                                     Verifier&& verifier) {
  return detail::generate(drafter, target, prompt, detail::for_custom_verifier(params), rng, observer, verifier);
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

#define SPECSAMPLE_CHECK_RNG(Rng)                                                                  \
  static_assert(::std::uniform_random_bit_generator<::std::remove_reference_t<Rng>>,                \
                "Rng must be a non-const uniform random bit generator (std::uniform_random_bit_"     \
                "generator), e.g. std::mt19937_64")

/// Readable diagnostics for arguments that match no overload above: a draft that is neither a
/// `language_model` nor a `drafter` (checked against the drafter's requirements when it has any
/// of its members, else the model's), a target that is no `language_model`, or an Rng that is no
/// uniform random bit generator — one static_assert per missing requirement instead of a page of
/// unsatisfied constraints.
template <class Draft, class Target, class Rng, class... Rest>
  requires((!language_model<Draft> && !drafter<Draft>) || !language_model<Target> ||
           !std::uniform_random_bit_generator<Rng>)
generation_result speculative_sample(Draft&, Target&, std::span<const token>, const speculative_params&, Rng&,
                                     Rest&&...) {
  if constexpr (!language_model<Draft> && !drafter<Draft>) {
    if constexpr (detail::drafter_like<std::remove_const_t<Draft>>) {
      SPECSAMPLE_CHECK_DRAFTER(Draft, "Draft");
    } else {
      SPECSAMPLE_CHECK_MODEL(Draft, "Draft");
    }
  }
  SPECSAMPLE_CHECK_MODEL(Target, "Target");
  SPECSAMPLE_CHECK_RNG(Rng);
  return {};
}

/// Readable diagnostics for `autoregressive_sample`'s arguments, as for `speculative_sample`'s.
template <class Target, class Rng, class... Rest>
  requires(!language_model<Target> || !std::uniform_random_bit_generator<Rng>)
generation_result autoregressive_sample(Target&, std::span<const token>, const speculative_params&, Rng&, Rest&&...) {
  SPECSAMPLE_CHECK_MODEL(Target, "Target");
  SPECSAMPLE_CHECK_RNG(Rng);
  return {};
}

namespace detail {
template <class>
inline constexpr bool always_false = false;
}  // namespace detail

#define SPECSAMPLE_CHECK_PROMPT_AND_RNG(Prompt, Rng)                                                 \
  static_assert(::std::convertible_to<Prompt, ::std::span<const ::specsample::token>>,                \
                "the prompt must convert to std::span<const specsample::token>: a std::vector, array " \
                "or span of specsample::token (int)");                                                 \
  static_assert(::std::is_lvalue_reference_v<Rng>,                                                    \
                "pass the random generator as a variable: the loop draws from it and leaves it "       \
                "advanced, which a temporary would lose")
#define SPECSAMPLE_BRACED_PROMPT_MESSAGE                                                              \
  "a braced list is no prompt (std::span takes none before C++26): put the ids in a "                \
  "std::vector<specsample::token>"

/// Readable diagnostics for the prompt and the generator, which the overloads above take as a
/// span of tokens and an lvalue: a prompt of another type, a generator passed as a temporary
/// (both otherwise a page of candidates whose first complaint is about the draft), and a braced
/// list of ids as the prompt.
template <class Draft, class Target, class Prompt, class Rng, class... Rest>
  requires(!std::convertible_to<Prompt, std::span<const token>> || !std::is_lvalue_reference_v<Rng>)
generation_result speculative_sample(Draft&, Target&, Prompt&&, const speculative_params&, Rng&&, Rest&&...) {
  SPECSAMPLE_CHECK_PROMPT_AND_RNG(Prompt, Rng);
  return {};
}
template <class Draft, class Target, class Rng, class... Rest>
generation_result speculative_sample(Draft&, Target&, std::initializer_list<token>, const speculative_params&, Rng&&,
                                     Rest&&...) {
  static_assert(detail::always_false<Rng>, SPECSAMPLE_BRACED_PROMPT_MESSAGE);
  return {};
}
template <class Target, class Prompt, class Rng, class... Rest>
  requires(!std::convertible_to<Prompt, std::span<const token>> || !std::is_lvalue_reference_v<Rng>)
generation_result autoregressive_sample(Target&, Prompt&&, const speculative_params&, Rng&&, Rest&&...) {
  SPECSAMPLE_CHECK_PROMPT_AND_RNG(Prompt, Rng);
  return {};
}
template <class Target, class Rng, class... Rest>
generation_result autoregressive_sample(Target&, std::initializer_list<token>, const speculative_params&, Rng&&,
                                        Rest&&...) {
  static_assert(detail::always_false<Rng>, SPECSAMPLE_BRACED_PROMPT_MESSAGE);
  return {};
}

}  // namespace specsample
