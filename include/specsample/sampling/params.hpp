#pragma once
/// @file params.hpp
/// Sampling and speculation parameters, and their validation.

#include <specsample/concepts.hpp>
#include <specsample/error.hpp>

#include <fmt/format.h>

#include <cmath>
#include <cstddef>
#include <optional>
#include <string_view>

namespace specsample {

/// How logits become a probability vector (the target's `speculative_params::sampling`, by
/// default also the draft's: `speculative_params::draft_sampling`). Order: temperature, then
/// top-k, then top-p, then min-p, renormalising after each step; ties are broken by the lower
/// token id. The defaults switch every filter off.
struct sampling_params {
  float temperature = 1.0f;  ///< 0 = greedy (argmax, lowest id on ties); must be >= 0.
  int top_k = 0;             ///< keep the k most probable tokens; 0 = off; must be >= 0.
  float top_p = 1.0f;        ///< keep the smallest most-probable set with mass >= top_p (within 2^-22 of it); in (0, 1].
  float min_p = 0.0f;        ///< keep tokens with p >= min_p * max p; in [0, 1).

  /// Whether every distribution this warping makes is one-hot (temperature 0, or top_k = 1): its
  /// top probability is always 1, so a `draft_min_probability` under it stops no round.
  [[nodiscard]] constexpr bool one_hot() const noexcept { return temperature == 0.0f || top_k == 1; }
};

/// How a round's drafts are verified (both exact).
enum class verification {
  token_wise,  ///< Leviathan et al. / Chen et al.: accept each draft with min(1, p/q) in turn.
  block,       ///< Sun et al. 2025: decide the accepted prefix jointly; accepts at least as many in expectation.
};

/// "tokenwise" or "block": the names of the command-line tools' `--verify` values.
[[nodiscard]] constexpr const char* verification_name(verification v) noexcept {
  return v == verification::block ? "block" : "tokenwise";
}

/// The rule named "tokenwise" or "block"; nullopt for anything else.
[[nodiscard]] constexpr std::optional<verification> verification_from_name(std::string_view name) noexcept {
  if (name == "tokenwise") return verification::token_wise;
  if (name == "block") return verification::block;
  return std::nullopt;
}

/// The rule that the value of a command-line flag (`--verify`) names: "tokenwise" or "block".
/// Throws `specsample::error` naming the flag and what it accepts otherwise.
[[nodiscard]] inline verification verification_option(std::string_view flag, std::string_view value) {
  const auto rule = verification_from_name(value);
  if (!rule) throw error(fmt::format("{} must be tokenwise or block, got '{}'", flag, value));
  return *rule;
}

/// The largest draft length `validate` accepts. A round holds the target's distributions for
/// K + 1 positions (V × (K + 1) floats: 52 MB at K = 256 with GPT-2's 50257 tokens), and no draft
/// sees that many of its tokens accepted in a row.
inline constexpr std::size_t max_draft_length = 256;

/// Parameters of one generation call.
struct speculative_params {
  /// Emit exactly this many tokens unless `eos` comes first. SIZE_MAX: no cap, stop at `eos` only
  /// (refused without an `eos`: nothing would stop it). A finite cap is taken as given, however
  /// large: without an `eos` or a context limit, the generation runs until it is reached.
  std::size_t max_new_tokens = 128;
  std::size_t draft_length = 4;      ///< K: tokens the draft proposes per round; 1..max_draft_length.
  sampling_params sampling{};        ///< the target's warping: what the output is distributed as.
  /// How the draft's logits become the distribution q it samples its proposals from; empty (the
  /// default) = `sampling`. Any warping is exact, since verification divides by the q each draft
  /// was drawn from: it moves only the acceptance. A draft sharper than the target accepts more
  /// with a higher temperature (docs/algorithm.md, "The draft's own warping"). Honoured by
  /// `speculative_sample(draft model, ...)` and `calibrate`; a custom drafter carries its own
  /// warping (build a `model_drafter` with `draft_warping()`).
  std::optional<sampling_params> draft_sampling{};
  std::optional<token> eos{};        ///< stop right after emitting this token.
  verification verify = verification::token_wise;  ///< the verification rule.
  /// Stop drafting a round early when the draft model's most probable token has probability
  /// below this (llama.cpp's p_min) under `draft_warping()`; 0 = off. In [0, 1). Exact: a
  /// draft-side decision. Honoured by `speculative_sample(draft model, ...)`; a custom drafter
  /// carries its own (`model_drafter`'s third argument).
  float draft_min_probability = 0.0f;
  /// Adapt the draft length between rounds (transformers' heuristic): +2 after a fully accepted
  /// round, -1 after a rejection, within [1, draft_length]. Exact: it depends on past rounds only.
  bool adaptive_draft_length = false;
  /// LOSSY when below 1: token-wise acceptance draws its uniform from U[0, leniency), so more
  /// drafts pass and the output drifts toward the draft. 1 (the default) is exact. In (0, 1].
  double leniency = 1.0;

  /// The draft's warping: `draft_sampling` when set, else `sampling`.
  [[nodiscard]] const sampling_params& draft_warping() const noexcept {
    return draft_sampling ? *draft_sampling : sampling;
  }

  /// A copy whose draft samples at temperature `t` with the target's filters: `draft_sampling` =
  /// `sampling` at `t`.
  [[nodiscard]] speculative_params with_draft_temperature(float t) const {
    speculative_params p = *this;
    p.draft_sampling = sampling;
    p.draft_sampling->temperature = t;
    return p;
  }
};

namespace detail {
// Leniency is checked by `validate` and by `tokenwise_verifier`, which can be used alone.
inline void check_leniency(double leniency, const char* name) {
  if (!(leniency > 0.0 && leniency <= 1.0)) {  // 0 would accept every draft, NaN none
    throw parameter_error(name, fmt::format(" must be in (0, 1] (1 = exact), got {}", leniency));
  }
}
}  // namespace detail

/// Throws `specsample::parameter_error` naming the first parameter that is out of its domain, as
/// `name`.field (`speculative_params.draft_sampling.top_p`, say).
inline void validate(const sampling_params& s, std::string_view name = "sampling_params") {
  if (!(s.temperature >= 0.0f) || std::isinf(s.temperature)) {
    throw parameter_error(fmt::format("{}.temperature", name),
                          fmt::format(" must be finite and >= 0 (0 = greedy), got {}", s.temperature));
  }
  if (s.top_k < 0) {
    throw parameter_error(fmt::format("{}.top_k", name), fmt::format(" must be >= 0 (0 = off), got {}", s.top_k));
  }
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) {
    throw parameter_error(fmt::format("{}.top_p", name), fmt::format(" must be in (0, 1] (1 = off), got {}", s.top_p));
  }
  if (!(s.min_p >= 0.0f && s.min_p < 1.0f)) {
    throw parameter_error(fmt::format("{}.min_p", name), fmt::format(" must be in [0, 1) (0 = off), got {}", s.min_p));
  }
}

/// Throws `specsample::parameter_error` naming the first parameter that is out of its domain
/// (`field()`: "speculative_params.draft_length", say). `vocab` is the models' vocabulary size,
/// used to check `eos`.
inline void validate(const speculative_params& s, std::size_t vocab) {
  validate(s.sampling, "speculative_params.sampling");
  if (s.draft_sampling) validate(*s.draft_sampling, "speculative_params.draft_sampling");
  if (s.draft_length == 0 || s.draft_length > max_draft_length) {
    throw parameter_error("speculative_params.draft_length",
                          fmt::format(" must be in 1..{} (the draft proposes K tokens per round), got {}",
                                      max_draft_length, s.draft_length));
  }
  if (!(s.draft_min_probability >= 0.0f && s.draft_min_probability < 1.0f)) {
    throw parameter_error("speculative_params.draft_min_probability",
                          fmt::format(" must be in [0, 1) (0 = off), got {}", s.draft_min_probability));
  }
  if (s.verify != verification::token_wise && s.verify != verification::block) {
    throw parameter_error("speculative_params.verify",
                          fmt::format(" must be verification::token_wise or verification::block, not verification({})",
                                      static_cast<int>(s.verify)));
  }
  detail::check_leniency(s.leniency, "speculative_params.leniency");
  if (s.leniency != 1.0 && s.verify != verification::token_wise) {
    throw parameter_error("speculative_params.leniency", " applies to token-wise verification only");
  }
  if (s.eos && !in_vocabulary(*s.eos, vocab)) {
    throw parameter_error("speculative_params.eos",
                          fmt::format(" = {} is out of range for a vocabulary of {} tokens", *s.eos, vocab));
  }
}

}  // namespace specsample
