#pragma once
/// @file stats.hpp
/// Generation statistics, the per-round trace event, and the result type.

#include <specsample/concepts.hpp>

#include <cstddef>
#include <span>
#include <vector>

namespace specsample {

/// Counters and timings of one generation call. All counts describe the emitted output: when an
/// EOS cuts a round short, only the drafts actually emitted count as accepted, so
/// `tokens == accepted + corrections + bonus` always holds. The seconds are the models' clock's
/// (a model's `clock` type, which a draft model shares with its target; else
/// std::chrono::steady_clock: wall time).
struct generation_stats {
  std::size_t rounds = 0;        ///< verification rounds (autoregressive: one per token)
  std::size_t target_calls = 0;  ///< target forward calls after the prompt prefill
  std::size_t draft_calls = 0;   ///< draft forward calls after the prompt prefill
  std::size_t drafted = 0;       ///< tokens proposed by the draft
  std::size_t accepted = 0;      ///< drafted tokens accepted and emitted
  std::size_t corrections = 0;   ///< tokens drawn from the residual after a rejection
  std::size_t bonus = 0;         ///< tokens drawn from the target after all drafts passed
  std::size_t tokens = 0;        ///< tokens emitted
  /// accepted_histogram[n] = rounds in which exactly n drafts were accepted (size K+1).
  std::vector<std::size_t> accepted_histogram{};
  double prefill_seconds = 0.0;  ///< both models' prompt prefill
  double draft_seconds = 0.0;    ///< time inside the draft model's `append` calls (after prefill)
  double target_seconds = 0.0;   ///< time inside the target's `append` calls (after prefill)
  double total_seconds = 0.0;    ///< the whole call, prefill included

  /// accepted / drafted (0 when nothing was drafted).
  [[nodiscard]] double acceptance_rate() const noexcept {
    return drafted == 0 ? 0.0 : static_cast<double>(accepted) / static_cast<double>(drafted);
  }
  /// The per-token acceptance probability α, estimated from the rounds: accepted drafts over
  /// accepted + rejected ones (the maximum-likelihood estimate when each draft passes
  /// independently with probability α; rounds that end without a rejection are censored, as
  /// drafts after a rejection are never tested). 0 when nothing was tested.
  [[nodiscard]] double estimated_alpha() const noexcept {
    const std::size_t tested = accepted + corrections;
    return tested == 0 ? 0.0 : static_cast<double>(accepted) / static_cast<double>(tested);
  }
  /// tokens / target_calls: 1 for autoregressive decoding, up to K+1 for speculative.
  [[nodiscard]] double tokens_per_target_call() const noexcept {
    return target_calls == 0 ? 0.0 : static_cast<double>(tokens) / static_cast<double>(target_calls);
  }
  /// Wall time after the prompt prefill: the decode phase, which speculation speeds up (tokens
  /// per second and speedups are best measured over it; the prefill does not depend on K).
  [[nodiscard]] double decode_seconds() const noexcept { return total_seconds - prefill_seconds; }
  /// Time spent outside model forward passes: warping both models' logits, drafting work other
  /// than the draft model's `append` (sampling drafts, n-gram lookup), verification, sampling,
  /// bookkeeping.
  [[nodiscard]] double overhead_seconds() const noexcept {
    return decode_seconds() - draft_seconds - target_seconds;
  }
};

/// The result of `speculative_sample` / `autoregressive_sample`.
struct generation_result {
  std::vector<token> tokens;  ///< the new tokens only (the prompt is not repeated)
  generation_stats stats;
};

/// One drafted token as the verifier saw it.
struct draft_event {
  token id = 0;          ///< the drafted token
  float q = 0.0f;        ///< its draft probability q_i(id)
  /// Its target probability p_i(id); NaN when the round never computed p_i: the loop warps only
  /// the target columns the verifier reads, and token-wise verification discards the drafts after
  /// the first rejection untested (block verification reads every draft's up to the first whose
  /// p is 0); nor does it warp the columns after a draft of probability 0 (unreachable contexts,
  /// which a verifier seen through operator() gets as the uniform distribution).
  float p = 0.0f;
  /// The verifier accepted it. A round's drafts end at the first EOS drafted; an accepted EOS
  /// ends the output there (`round_event::emitted`), a bonus not emitted.
  bool accepted = false;
};

/// What an observer receives after each round (views valid during the call only).
struct round_event {
  std::size_t round = 0;                ///< 0-based round index
  std::span<const draft_event> drafts;  ///< empty for autoregressive rounds
  std::span<const token> emitted;       ///< tokens emitted this round, in order
  bool bonus = false;                   ///< the last emitted token is a bonus (all drafts accepted)
  bool eos = false;                     ///< the round ended the generation at EOS
};

/// The default observer: does nothing, costs nothing.
struct no_observer {
  void operator()(const round_event&) const noexcept {}
};

}  // namespace specsample
