#pragma once
/// @file tuning.hpp
/// Choosing the draft length (and the draft) from measurements: the performance model,
/// per-position acceptance, the draft/target cost ratio, a short warm-up that measures both, and
/// a paired timing of speculation against autoregressive decoding that checks the choice; and the
/// draft's temperature, from its expected acceptance along the target's own text.

#include <specsample/concepts.hpp>
#include <specsample/error.hpp>
#include <specsample/sampling/drafter.hpp>
#include <specsample/sampling/loop.hpp>
#include <specsample/sampling/params.hpp>
#include <specsample/sampling/stats.hpp>
#include <specsample/sampling/warp.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace specsample {

namespace detail {
// A draft length of the performance model: at most `max_draft_length`, as the loops take.
inline void check_model_draft_length(std::size_t k, const char* who) {
  if (k > max_draft_length) {
    throw error(fmt::format("{}: K = {} is above max_draft_length = {}", who, k, max_draft_length));
  }
}

// The median of `v` (taken by value: it sorts); NaN for none.
[[nodiscard]] inline double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace detail

/// Expected tokens per round with K drafts when draft i passes with probability a[i] given that
/// drafts 0..i-1 passed: 1 + Σ_{j=1..K} Π_{i<j} a[i]. With a constant α this is
/// (1 - α^(K+1)) / (1 - α). Positions past the end of `acceptance` take its last rate (none: 0).
/// Throws `specsample::error` for a rate outside [0, 1] (NaN included) among the first K, or K
/// above `max_draft_length` (as every function of the performance model below).
[[nodiscard]] inline double expected_tokens_per_round(std::span<const double> acceptance, std::size_t k) {
  detail::check_model_draft_length(k, "expected_tokens_per_round");
  double expected = 1.0, reach = 1.0;
  for (std::size_t i = 0; i < k; ++i) {
    const double a = acceptance.empty() ? 0.0 : acceptance[std::min(i, acceptance.size() - 1)];
    if (!(a >= 0.0 && a <= 1.0)) {
      throw error(fmt::format("expected_tokens_per_round: the acceptance rate of draft position {} must be in "
                              "[0, 1], got {}", i, a));
    }
    reach *= a;
    expected += reach;
  }
  return expected;
}

/// The speedup with the measured cost of verification: expected tokens per round /
/// (c·K + v[K]), where v[K] = time of a (K+1)-token target call / time of a 1-token call (the
/// classic formula takes v = 1: "verifying K+1 positions costs one forward pass", true when a
/// forward pass is bound by reading the weights, not on a CPU whose batched matmul is
/// compute-bound). An empty `verify_cost` is the classic formula; one that does not reach K
/// (its size <= K) is an error, not a free verification.
[[nodiscard]] inline double predicted_speedup(std::span<const double> acceptance, double c, std::size_t k,
                                              std::span<const double> verify_cost) {
  if (!verify_cost.empty() && k >= verify_cost.size()) {
    throw error(fmt::format("predicted_speedup: verify_cost holds the costs of K = 0..{}, not of K = {}",
                            verify_cost.size() - 1, k));
  }
  const double v = verify_cost.empty() ? 1.0 : verify_cost[k];
  if (!(c >= 0.0 && c < std::numeric_limits<double>::infinity())) {
    throw error(fmt::format("predicted_speedup: the cost ratio c must be finite and >= 0, got {}", c));
  }
  if (!(v > 0.0 && v < std::numeric_limits<double>::infinity())) {
    throw error(fmt::format("predicted_speedup: the verification cost v[{}] must be finite and > 0, got {}", k, v));
  }
  return expected_tokens_per_round(acceptance, k) / (c * static_cast<double>(k) + v);
}

/// The speedup the performance model predicts: expected tokens per round / (c·K + 1), where c is
/// the cost of one draft call relative to one target call (Leviathan et al., Theorem 3.8).
[[nodiscard]] inline double predicted_speedup(std::span<const double> acceptance, double c, std::size_t k) {
  return predicted_speedup(acceptance, c, k, {});
}

/// The same with one acceptance probability α for every position: (1 - α^(K+1)) / ((1 - α)(cK + 1)).
/// α is checked at every K, K = 0 (which reads no position) included.
[[nodiscard]] inline double predicted_speedup(double alpha, double c, std::size_t k) {
  detail::check_model_draft_length(k, "predicted_speedup");
  if (!(alpha >= 0.0 && alpha <= 1.0)) {
    throw error(fmt::format("predicted_speedup: the acceptance rate α must be in [0, 1], got {}", alpha));
  }
  const std::vector<double> a(k, alpha);
  return predicted_speedup(std::span<const double>(a), c, k);
}

/// The K in [1, k_max] with the highest predicted speedup (the smaller K on ties); with
/// `verify_cost` (indexed by K, see above; it must reach k_max) the cost of the batched target
/// call is included. Throws `specsample::error` for k_max = 0 and for any input
/// `predicted_speedup` refuses.
[[nodiscard]] inline std::size_t best_draft_length(std::span<const double> acceptance, double c, std::size_t k_max,
                                                   std::span<const double> verify_cost = {}) {
  if (k_max == 0) throw error("best_draft_length: k_max must be >= 1");
  detail::check_model_draft_length(k_max, "best_draft_length");
  std::size_t best = 1;
  double best_speedup = predicted_speedup(acceptance, c, 1, verify_cost);  // (checks c, also for k_max = 1)
  for (std::size_t k = 2; k <= k_max; ++k) {
    const double s = predicted_speedup(acceptance, c, k, verify_cost);
    if (s > best_speedup + 1e-12) {
      best = k;
      best_speedup = s;
    }
  }
  return best;
}

/// Acceptance by draft position, accumulated from round events: rate(i) = P(draft i accepted |
/// drafts 0..i-1 accepted). Use it as an observer. It counts the verifier's decisions
/// (`draft_event::accepted`), an accepted EOS that ended the output included (a round's drafts end at it).
class position_acceptance {
 public:
  explicit position_acceptance(std::size_t k_max) : reached_(k_max, 0), accepted_(k_max, 0) {}
  void operator()(const round_event& e) {
    for (std::size_t i = 0; i < e.drafts.size() && i < reached_.size(); ++i) {
      ++reached_[i];
      if (!e.drafts[i].accepted) break;
      ++accepted_[i];
    }
  }
  /// Rates per position; a position never reached borrows the previous rate (or 0).
  [[nodiscard]] std::vector<double> rates() const {
    std::vector<double> r(reached_.size(), 0.0);
    for (std::size_t i = 0; i < r.size(); ++i) {
      r[i] = reached_[i] > 0 ? static_cast<double>(accepted_[i]) / static_cast<double>(reached_[i])
                             : (i > 0 ? r[i - 1] : 0.0);
    }
    return r;
  }
  /// Rounds that reached draft position i. Throws `specsample::error` for i >= the positions tracked.
  [[nodiscard]] std::size_t reached(std::size_t i) const {
    if (i >= reached_.size()) {
      throw error(fmt::format("position_acceptance: position {} is past the {} positions tracked", i, reached_.size()));
    }
    return reached_[i];
  }
  /// Rounds whose draft i was accepted. Throws `specsample::error` for i >= the positions tracked.
  [[nodiscard]] std::size_t accepted(std::size_t i) const {
    (void)reached(i);  // (the range check)
    return accepted_[i];
  }

 private:
  std::vector<std::size_t> reached_, accepted_;
};

/// What `measure_speedup` timed: speculative decoding at one draft length against autoregressive
/// decoding of the same prompts, in back-to-back pairs.
struct speedup_measurement {
  /// One pair: both sides decoded `tokens` tokens from the same prompt, back to back.
  struct pair {
    std::size_t tokens = 0;
    double autoregressive_seconds = 0.0;  ///< decode time (the prompt's prefill excluded, as the
    double speculative_seconds = 0.0;     ///< performance model excludes it)
    /// The pair's speedup: autoregressive over speculative decode time.
    [[nodiscard]] double ratio() const { return autoregressive_seconds / speculative_seconds; }
  };
  std::size_t draft_length = 0;  ///< K of the speculative side
  std::vector<pair> pairs;

  /// The measured speedup: the pooled throughput ratio, all pairs' autoregressive decode time over
  /// all their speculative decode time (both sides decode the same tokens). It is the estimate that
  /// the performance model's pooled acceptance and costs predict (`calibration::predicted`); a pair
  /// in a slow phase of a shared machine slows both its sides, so drift weighs the pairs rather
  /// than favouring one side. NaN for no pairs.
  [[nodiscard]] double speedup() const {
    double ar = 0.0, spec = 0.0;
    for (const pair& p : pairs) {
      ar += p.autoregressive_seconds;
      spec += p.speculative_seconds;
    }
    return pairs.empty() ? std::numeric_limits<double>::quiet_NaN() : ar / spec;
  }
  /// The pairs' ratios (`pair::ratio`), in the order they ran.
  [[nodiscard]] std::vector<double> ratios() const {
    std::vector<double> r;
    r.reserve(pairs.size());
    for (const pair& p : pairs) r.push_back(p.ratio());
    return r;
  }
  /// The median of the pairs' ratios: reads above `speedup()` where the gain varies from prompt to
  /// prompt (docs/benchmarks.md, "What the table says"). NaN for no pairs.
  [[nodiscard]] double median_ratio() const { return detail::median(ratios()); }
};

/// What a warm-up measured for one draft.
struct calibration {
  std::vector<double> acceptance;   ///< per draft position, see position_acceptance
  /// Per draft position: the warm-up rounds that reached it (`calibrate`). 0: no round did, and
  /// `acceptance` there is the position's before it (position_acceptance::rates).
  std::vector<std::size_t> rounds_reached;
  double cost_ratio = 0.0;          ///< c: single-token draft call / single-token target call
  double first_cost_ratio = 0.0;    ///< the same for a round's first draft call (after a target call)
  std::vector<double> verify_cost;  ///< [K] = (K+1)-token target call / 1-token call, K = 0..k_max (above 8
                                    ///< timed at powers of two and the largest K that fits, linear
                                    ///< between, repeated past it: `detail::cost_ratios`)
  std::vector<std::size_t> warmup_lengths;  ///< tokens the warm-up generated from each prompt (`calibrate`)
  std::size_t best_k = 1;           ///< argmax of the predicted speedup over K in [1, k_max] (`at`: the K fixed)
  double predicted = 1.0;           ///< the predicted speedup at best_k, round_cost included
  /// Speculation at best_k timed against autoregressive decoding (`measure_speedup`), when
  /// `calibrate` or `check_prediction` checked the prediction: they do where it pays, unless
  /// asked not to (check_pairs = 0) or no prompt leaves room for two tokens.
  std::optional<speedup_measurement> measured;

  /// [K] = what a round with K drafts costs besides K draft calls at cost_ratio, in single-token
  /// target calls: verify_cost[K] plus what its first draft call costs beyond cost_ratio ([0] = 1,
  /// no draft). best_k and predicted come from `best_draft_length` / `predicted_speedup` with it as
  /// their verify_cost, so that c·K + round_cost[K] = c_first + c·(K − 1) + verify_cost[K] where
  /// the first call costs more (a first call measured cheaper than cost_ratio adds nothing: the
  /// extra is clamped at 0, so the round is never predicted cheaper than K calls at cost_ratio).
  /// Throws `specsample::parameter_error` ("calibration.cost_ratio", say) when cost_ratio or
  /// first_cost_ratio is not finite and >= 0 (a NaN
  /// counted as no extra cost).
  [[nodiscard]] std::vector<double> round_cost() const {
    for (const auto& [value, name] : {std::pair{cost_ratio, "cost_ratio"}, std::pair{first_cost_ratio, "first_cost_ratio"}}) {
      if (!(value >= 0.0 && std::isfinite(value))) {
        throw parameter_error(fmt::format("calibration.{}", name), fmt::format(" must be finite and >= 0, got {}", value));
      }
    }
    std::vector<double> r = verify_cost;
    for (std::size_t k = 1; k < r.size(); ++k) r[k] += std::max(0.0, first_cost_ratio - cost_ratio);
    return r;
  }

  /// Whether speculating at best_k beats autoregressive decoding: predicted > 1 and, where the
  /// prediction was checked, a measured speedup > 1 as well. It may not: where a few-token target
  /// call costs much more than a single-token one (a CPU whose FMA units rather than its memory
  /// bound the batched call; docs/gpt2.md, "Speed") or the draft is dear or poor, no K pays —
  /// decode with `autoregressive_sample` then. The prediction leans optimistic
  /// (`detail::cost_ratios`), and near break-even its short timings mislead; the check is what
  /// catches a prediction above 1 that loses.
  [[nodiscard]] bool pays() const { return predicted > 1.0 && (!measured || measured->speedup() > 1.0); }

  /// This calibration at a draft length the caller fixed (as `specsample-generate -k N` does
  /// when it chooses among drafts): best_k = k, `predicted` at k (round_cost included),
  /// `measured` dropped (`check_prediction` times k). Throws
  /// `specsample::error` for k = 0 or a k that verify_cost does not cover (above the k_max of
  /// `calibrate`).
  [[nodiscard]] calibration at(std::size_t k) const {
    if (verify_cost.size() < 2) throw error("calibration::at: the calibration measured no verification cost");
    if (k == 0 || k >= verify_cost.size()) {
      throw error(fmt::format("calibration::at: K = {} is outside 1..{}, the draft lengths whose verification "
                              "cost the calibration covers", k, verify_cost.size() - 1));
    }
    calibration c = *this;
    c.best_k = k;
    c.predicted = predicted_speedup(acceptance, cost_ratio, k, round_cost());
    c.measured.reset();
    return c;
  }
};

namespace detail {

/// The draft lengths whose verification call `cost_ratios` times, ascending, for calls of up to
/// `k_last` + 1 tokens: every K up to 8, then the powers of two, and `k_last` itself.
[[nodiscard]] inline std::vector<std::size_t> verify_timing_lengths(std::size_t k_last) {
  std::vector<std::size_t> ks;
  for (std::size_t k = 1; k <= k_last; ++k) {
    if (k <= 8 || std::has_single_bit(k) || k == k_last) ks.push_back(k);
  }
  return ks;
}

/// The largest draft length up to `k_max` whose verification call fits `target` after a context
/// of `context` tokens, as `cost_ratios` times it: K + 1 tokens appended after all but the
/// context's last. 0 when none fits.
template <class Target>
[[nodiscard]] std::size_t widest_verification(const Target& target, std::size_t context, std::size_t k_max) {
  const std::size_t limit = max_context(target);
  return context > limit ? 0 : std::min(k_max, limit - context);
}

/// The cost ratios a calibration needs (its cost_ratio, first_cost_ratio and verify_cost; the
/// rest left default), measured after all but the last token of `context`, each over a
/// single-token target call: c (a draft call), c_first (a round's first draft call) and v[K] (a
/// (K+1)-token target call; v[0] = 1, K = 1..k_max, v repeating its last value where K+1 tokens
/// would not fit). v[K] is timed for every K up to 8 and, above that, at the powers of two and
/// the largest K that fits, linear in between (a batched call's cost grows about linearly in its
/// tokens; timing every K would cost ~K_max² / 2 tokens per round: docs/models.md). Each call
/// is timed where the loop it stands for makes it: the
/// single-token target call right after another (autoregressive decoding), c_first's draft call
/// right after a target call (which has pushed part of the draft out of the caches: at K = 1 every
/// draft call is such a call), c's right after a draft call (as a round's later drafts find it),
/// and every (K+1)-token target call right after a draft call (a speculative round; right after a
/// target call it finds more of its own weights in the caches: 2–3% cheaper on the bundled target).
/// Every ratio is the median of its per-round ratios over `reps` rounds, so drift of a shared
/// machine between rounds cancels instead of biasing one side. Inside the loop the verification
/// call still runs a few percent dearer (more data passes through the caches between calls), so
/// the predictions built on these costs lean optimistic. Throws `specsample::error` for an empty
/// context or reps = 0.
template <language_model Draft, language_model Target>
calibration cost_ratios(Draft& draft, Target& target, std::span<const token> context, std::size_t k_max,
                        std::size_t reps = 15) {
  detail::check_clocks<Draft, Target>();
  if (context.empty()) throw error("cost_ratios: the context must hold at least one token");
  if (reps == 0) throw error("cost_ratios: reps must be >= 1 (every ratio is a median over reps rounds)");
  const std::size_t keep = context.size() - 1;
  detail::prefill(draft, context, static_cast<std::size_t>(draft.vocab_size()), "draft");
  detail::prefill(target, context, static_cast<std::size_t>(target.vocab_size()), "target");
  const std::size_t k_fit = widest_verification(target, context.size(), k_max);
  const std::vector<std::size_t> ks = verify_timing_lengths(k_fit);
  const auto timed = [&](auto& m, std::size_t n, const char* role) {
    const std::vector<token> batch(n, context.back());
    using clock = detail::model_clock_t<decltype(m)>;
    const auto t0 = clock::now();
    (void)detail::naming_role(role, [&]() -> decltype(auto) { return m.append(batch); });
    const double s = detail::seconds_since<clock>(t0);
    detail::truncate_to(m, keep, role);
    return s;
  };
  // A target call can read 0 s (a toy model's, or a clock coarser than the call): every target
  // time counts as at least 1 ns, so two calls that both read 0 cost alike (v = 1), not v = 0.
  const auto timed_target = [&](std::size_t n) { return std::max(timed(target, n, "target"), 1e-9); };
  std::vector<double> c, first;                      // c, c_first
  std::vector<std::vector<double>> ratio(ks.size());  // [i]: (ks[i]+1)-token / 1-token call
  for (std::size_t r = 0; r < reps; ++r) {
    (void)timed(target, 1, "target");
    const double t1 = timed_target(1);
    first.push_back(timed(draft, 1, "draft") / t1);
    c.push_back(timed(draft, 1, "draft") / t1);
    for (std::size_t i = 0; i < ks.size(); ++i) {
      (void)timed(draft, 1, "draft");
      ratio[i].push_back(timed_target(ks[i] + 1) / t1);
    }
  }
  calibration m;
  m.cost_ratio = median(c);
  m.first_cost_ratio = median(first);
  m.verify_cost = {1.0};
  std::size_t above = 0;  // the first timed K >= k
  for (std::size_t k = 1; k <= k_max; ++k) {
    if (k > k_fit) {
      m.verify_cost.push_back(m.verify_cost.back());
      continue;
    }
    while (ks[above] < k) ++above;
    const double v = median(ratio[above]);
    if (ks[above] == k) {
      m.verify_cost.push_back(v);
    } else {  // between the timed ks[above - 1] (> 0: every K up to 8 is timed) and ks[above]
      const auto lo = static_cast<double>(ks[above - 1]), hi = static_cast<double>(ks[above]);
      const double v_lo = m.verify_cost[ks[above - 1]];
      m.verify_cost.push_back(v_lo + (v - v_lo) * (static_cast<double>(k) - lo) / (hi - lo));
    }
  }
  return m;
}

/// The checks a run over several prompts makes before it generates anything: the two models'
/// vocabularies, `params` as the runs use them, and every prompt.
template <class Draft, class Target>
void check_runs(const Draft& draft, const Target& target, std::span<const std::vector<token>> prompts,
                const speculative_params& params) {
  const std::size_t vocab = vocabulary_of(target, "target");
  check_vocabularies(vocabulary_of(draft, "draft"), vocab);
  validate(params, vocab);
  for (const std::vector<token>& prompt : prompts) check_prompt(prompt, vocab);
}

/// How many tokens a warm-up may generate after a prompt of `prompt` tokens: `wanted`, or fewer
/// where the smaller of the two models' contexts ends sooner (the loop's `check_fits`: prompt +
/// max_new_tokens − 1 positions). Throws `specsample::error` when the prompt alone overflows it, or
/// `wanted` is SIZE_MAX (the loop's "no cap": a warm-up ignores EOS, so on models without a context
/// limit it would never end; the cap below turned it into SIZE_MAX − prompt + 1, which the loop takes).
template <class Draft, class Target>
[[nodiscard]] std::size_t warmup_length(const Draft& draft, const Target& target, std::size_t prompt,
                                        std::size_t wanted, const char* who) {
  if (wanted == std::numeric_limits<std::size_t>::max()) {
    throw error(fmt::format("{}: SIZE_MAX tokens to generate from each prompt caps nothing, and a timed generation "
                            "ignores EOS: it would never end; give a number of tokens",
                            who));
  }
  const std::size_t limit = std::min(max_context(draft), max_context(target));
  if (prompt == 0) return wanted;  // (the entry points report the empty prompt)
  if (prompt > limit) {
    throw error(fmt::format("{}: a prompt of {} tokens does not fit the models' context of {} tokens", who, prompt,
                            limit));
  }
  return std::min(wanted, limit - prompt + 1);
}

// The prompts a paired timing can use and how many tokens each side decodes from each: up to
// `tokens`, fewer where a prompt leaves the models' contexts less room; a prompt with room for
// fewer than two (no round with a draft) is left out. Empty when none can be used.
template <class Draft, class Target>
[[nodiscard]] std::vector<std::pair<std::size_t, std::size_t>> timing_lengths(
    const Draft& draft, const Target& target, std::span<const std::vector<token>> prompts, std::size_t tokens,
    const char* who) {
  std::vector<std::pair<std::size_t, std::size_t>> usable;  // (prompt index, tokens)
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const std::size_t n = warmup_length(draft, target, prompts[i].size(), tokens, who);
    if (n >= 2) usable.emplace_back(i, n);
  }
  return usable;
}

}  // namespace detail

/// Times speculative decoding with `params` (its draft length, verification rule, adaptive
/// schedule, draft sampling) against autoregressive decoding with the same sampling parameters:
/// pair i decodes `tokens` tokens each way from the i-th of `prompts` (cyclically; fewer tokens
/// where a prompt leaves the models' contexts less room, and prompts that leave room for fewer
/// than two skipped; EOS ignored, so that both sides decode as many), the two sides in
/// alternating order, and records both decode times. It measures the
/// loop as it will run (acceptance on these texts, the calls' costs inside the loop, the time
/// outside the models), where `calibrate`'s prediction is built from calls timed apart. Timings:
/// each pair is noisy on a shared machine; `speedup()` pools them (throughput ratio). Throws
/// `specsample::error`, before timing anything, for no prompts, pairs = 0, tokens < 2 (a round
/// with a draft decodes two), parameters or prompts `speculative_sample` refuses (an empty prompt,
/// an out-of-range token, mismatched vocabularies, draft_length 0), a prompt that alone overflows
/// the models' context, or no prompt that leaves room for two tokens. `draft` is a draft model or
/// any `drafter` (`speculative_sample` takes either): a drafter times the loop as that drafter
/// will run it, e.g. `drafters::fallback` of prompt lookup and a draft model.
template <class Draft, language_model Target, std::uniform_random_bit_generator Rng>
  requires language_model<Draft> || drafter<Draft>
[[nodiscard]] speedup_measurement measure_speedup(Draft& draft, Target& target,
                                                  std::span<const std::vector<token>> prompts,
                                                  const speculative_params& params, Rng& rng, std::size_t pairs = 5,
                                                  std::size_t tokens = 64) {
  if (prompts.empty()) throw error("measure_speedup: no prompts");
  if (pairs == 0) throw error("measure_speedup: pairs must be >= 1");
  if (tokens < 2) {
    throw error(fmt::format("measure_speedup: tokens must be >= 2 (a round with a draft decodes two), got {}", tokens));
  }
  detail::check_runs(draft, target, prompts, params);
  const auto usable = detail::timing_lengths(draft, target, prompts, tokens, "measure_speedup");
  if (usable.empty()) throw error("measure_speedup: no prompt leaves the models' contexts room for two tokens");
  speculative_params run = params;
  run.eos.reset();
  speedup_measurement m{params.draft_length, {}};
  const auto seconds = [](const generation_result& g) {  // (a toy model's call can take 0 s)
    return std::max(g.stats.decode_seconds(), 1e-9);
  };
  for (std::size_t i = 0; i < pairs; ++i) {
    const auto& [index, length] = usable[i % usable.size()];
    const std::vector<token>& prompt = prompts[index];
    run.max_new_tokens = length;
    std::size_t ar_tokens = 0, spec_tokens = 0;
    const auto ar = [&] {
      const generation_result g = autoregressive_sample(target, prompt, run, rng);
      ar_tokens = g.stats.tokens;
      return seconds(g);
    };
    const auto spec = [&] {
      const generation_result g = speculative_sample(draft, target, prompt, run, rng);
      spec_tokens = g.stats.tokens;
      return seconds(g);
    };
    double t_ar = 0.0, t_spec = 0.0;
    if (i % 2 == 0) {
      t_ar = ar();
      t_spec = spec();
    } else {
      t_spec = spec();
      t_ar = ar();
    }
    // Both sides decode `length` tokens (EOS ignored, room checked): the pooled ratio needs it.
    assert(ar_tokens == length && spec_tokens == length);
    (void)spec_tokens;
    m.pairs.push_back({ar_tokens, t_ar, t_spec});
  }
  return m;
}

/// Checks a calibration's prediction by timing it: where `c.predicted` > 1, `measure_speedup` at
/// K = c.best_k (the caller's other parameters) over `pairs` pairs of `tokens` tokens fills
/// `c.measured`, and `c.pays()` then asks both to exceed 1; elsewhere, or where no prompt leaves
/// the models' contexts room for two tokens, `c.measured` is left empty (the prediction alone
/// decides). `calibrate` calls it at its best K; call it yourself for a K you fixed
/// (`calibration::at`), or to check several drafts' calibrations one by one in order of
/// prediction until one pays (as `specsample-generate --draft a,b` does). Throws
/// `specsample::error` for no prompts, pairs = 0 or tokens < 2, whether it times or not, and,
/// when it times, for what `measure_speedup` refuses. Like `measure_speedup` it times a draft model or any `drafter`: the
/// drafter the generation will use, e.g. prompt lookup falling back to the calibrated draft model
/// (the prediction then stands for the model alone; the check times both).
template <class Draft, language_model Target, std::uniform_random_bit_generator Rng>
  requires language_model<Draft> || drafter<Draft>
void check_prediction(calibration& c, Draft& draft, Target& target, std::span<const std::vector<token>> prompts,
                      const speculative_params& params, Rng& rng, std::size_t pairs = 5, std::size_t tokens = 64) {
  if (prompts.empty()) throw error("check_prediction: no prompts");
  if (pairs == 0) throw error("check_prediction: pairs must be >= 1");
  if (tokens < 2) {
    throw error(fmt::format("check_prediction: tokens must be >= 2 (a round with a draft decodes two), got {}", tokens));
  }
  c.measured.reset();
  if (!(c.predicted > 1.0) || detail::timing_lengths(draft, target, prompts, 2, "check_prediction").empty()) return;
  speculative_params at = params;
  at.draft_length = c.best_k;
  c.measured = measure_speedup(draft, target, prompts, at, rng, pairs, tokens);
}

/// Runs a short speculative generation with K = k_max from each of `prompts` (`warmup_tokens`
/// tokens each, fewer where a prompt leaves the models' contexts less room, none cut short by
/// `params.eos`; the caller's sampling parameters) to measure acceptance by position, pooled over
/// the prompts; times single-token calls of both models for c (a round's first draft call apart)
/// and the target's (K+1)-token calls for the verification cost (after the first prompt that
/// leaves the target's context room for a (k_max+1)-token call, else after the shortest; medians
/// of per-round ratios, see `detail::cost_ratios`), and picks the K that maximises the predicted
/// speedup. A few prompts give a steadier estimate than one: acceptance varies from one
/// text to the next. Where that prediction pays (> 1), it is checked (`check_prediction`):
/// `measure_speedup` at best_k over `check_pairs` pairs of `warmup_tokens` tokens (the caller's
/// parameters, K = best_k) fills `measured`, and `pays()` asks both to exceed 1. `check_pairs = 0`
/// skips the check (the prediction alone decides), as does a set of prompts none of which leaves
/// room for two tokens.
/// The check samples from an engine seeded by one draw of `rng`, taken whether it runs or not:
/// `rng` advances by the warm-up's draws and that one.
/// Throws `specsample::error` for k_max = 0 or above `max_draft_length`, warmup_tokens = 0, no
/// prompts, a prompt that does not fit the models, or a warm-up with no round that could draft
/// (warmup_tokens = 1, or no prompt leaving room for two new tokens): acceptance would read 0, not
/// "unmeasured". (A draft_min_probability that stops every round before its first draft is measured:
/// acceptance 0, a prediction that does not pay.)
template <language_model Draft, language_model Target, std::uniform_random_bit_generator Rng>
[[nodiscard]] calibration calibrate(Draft& draft, Target& target, std::span<const std::vector<token>> prompts,
                                    const speculative_params& params, Rng& rng, std::size_t k_max = 8,
                                    std::size_t warmup_tokens = 64, std::size_t check_pairs = 5) {
  if (k_max == 0) throw error("calibrate: k_max must be >= 1");
  if (warmup_tokens == 0) throw error("calibrate: warmup_tokens must be >= 1 (acceptance is measured on them)");
  detail::check_model_draft_length(k_max, "calibrate");
  if (prompts.empty()) throw error("calibrate: no prompts");
  speculative_params checked = params;
  checked.draft_length = k_max;  // (the warm-ups draft k_max)
  detail::check_runs(draft, target, prompts, checked);
  // Each prompt's warm-up length (up to warmup_tokens, fewer where the contexts leave less room),
  // all known before any warm-up runs. None of two tokens or more (no
  // round that could draft): rates() would read 0 at every position, "does not pay", for a draft
  // never measured. (Rounds a draft_min_probability stopped at their first draft are measured:
  // that draft proposes nothing there, and the prediction says so.)
  std::vector<std::size_t> lengths;
  lengths.reserve(prompts.size());
  for (const std::vector<token>& prompt : prompts) {
    lengths.push_back(detail::warmup_length(draft, target, prompt.size(), warmup_tokens, "calibrate"));
  }
  if (std::none_of(lengths.begin(), lengths.end(), [](std::size_t n) { return n >= 2; })) {
    throw error(fmt::format("calibrate: no warm-up round could draft a token, so there is no acceptance to measure: {}",
                            warmup_tokens < 2 ? "warmup_tokens = 1 leaves no round with a draft (a round that "
                                                "drafts one token decodes two)"
                                              : "no prompt leaves the models' contexts room for two new tokens (a "
                                                "round that drafts one token decodes two)"));
  }
  speculative_params warm = params;
  warm.draft_length = k_max;
  warm.adaptive_draft_length = false;
  warm.eos.reset();  // every warm-up as long as asked: positions are what acceptance is measured on
  position_acceptance positions(k_max);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    warm.max_new_tokens = lengths[i];
    (void)speculative_sample(draft, target, prompts[i], warm, rng, positions);
  }
  // The costs at the first prompt that leaves room for the widest verification call, else at one
  // that leaves the most, the shortest (a full first prompt would leave room for none: every v[K]
  // would read 1, free). max_element takes the first of the widest.
  const auto costed = std::max_element(prompts.begin(), prompts.end(), [&](const auto& a, const auto& b) {
    return detail::widest_verification(target, a.size(), k_max) < detail::widest_verification(target, b.size(), k_max);
  });
  calibration c = detail::cost_ratios(draft, target, std::span<const token>(*costed), k_max);
  c.acceptance = positions.rates();
  for (std::size_t i = 0; i < k_max; ++i) c.rounds_reached.push_back(positions.reached(i));
  c.warmup_lengths = std::move(lengths);
  const std::vector<double> round = c.round_cost();
  c.best_k = best_draft_length(c.acceptance, c.cost_ratio, k_max, round);
  c.predicted = predicted_speedup(c.acceptance, c.cost_ratio, c.best_k, round);
  std::mt19937_64 check_rng(rng());
  if (check_pairs > 0) {
    check_prediction(c, draft, target, prompts, params, check_rng, check_pairs, std::max<std::size_t>(warmup_tokens, 2));
  }
  return c;
}

/// `calibrate` on one prompt.
template <language_model Draft, language_model Target, std::uniform_random_bit_generator Rng>
[[nodiscard]] calibration calibrate(Draft& draft, Target& target, std::span<const token> prompt,
                                    const speculative_params& params, Rng& rng, std::size_t k_max = 8,
                                    std::size_t warmup_tokens = 64, std::size_t check_pairs = 5) {
  const std::vector<std::vector<token>> one{std::vector<token>(prompt.begin(), prompt.end())};
  return calibrate(draft, target, std::span<const std::vector<token>>(one), params, rng, k_max, warmup_tokens,
                   check_pairs);
}

/// What `scan_draft_temperature` measured: per ratio R, the expected acceptance α of a draft
/// sampled at R × the target's temperature.
struct draft_temperature_scan {
  std::vector<double> ratios;  ///< the ratios scanned, as given
  std::vector<double> alpha;   ///< alpha[i]: mean over the positions of Σ_x min(p(x), q_i(x))
  std::size_t positions = 0;   ///< target positions the means are over

  /// The ratio with the highest α (the first on ties). Throws `specsample::error` for a scan of
  /// no ratios, or with an α per ratio missing (a scan not made by `scan_draft_temperature`).
  [[nodiscard]] double best_ratio() const {
    if (ratios.empty() || alpha.size() != ratios.size()) {
      throw error(fmt::format("draft_temperature_scan::best_ratio: {} ratios and {} alphas; a scan has one alpha per "
                              "ratio, and at least one", ratios.size(), alpha.size()));
    }
    return ratios[static_cast<std::size_t>(std::max_element(alpha.begin(), alpha.end()) - alpha.begin())];
  }
  /// `params` with the draft at the best ratio: `draft_sampling` = `params.sampling` at
  /// best_ratio() × its temperature.
  [[nodiscard]] speculative_params apply(const speculative_params& params) const {
    return params.with_draft_temperature(static_cast<float>(params.sampling.temperature * best_ratio()));
  }
};

/// The expected acceptance of a draft sampled at R × the target's temperature, for each ratio R of
/// `ratios`: the target generates `tokens` tokens from each of `prompts` (with `params.sampling`,
/// autoregressively); both models then score each whole text in one call, and at every generated
/// position the scan sums min(p, q_R) over the vocabulary, q_R the draft's logits warped with
/// `params.sampling` at temperature R × T (its filters kept). That sum is the probability that a
/// token-wise verifier accepts the draft there (1 − TV(p, q_R)); its mean is the α the ratio gives.
/// A draft sharper than the target peaks above R = 1 (the bundled distilled draft at T = 1: 1.2;
/// docs/algorithm.md). Exact sampling does not depend on the choice (`draft_sampling`). Costs
/// one generation per prompt plus one call of each model per prompt; the models hold each
/// scored text afterwards. A prompt that leaves the models' contexts less room than `tokens` is
/// followed by fewer tokens. Throws `specsample::error` at temperature 0 (both models greedy: no
/// ratio matters), for no prompts or no ratios, a ratio that is not finite and > 0 (or whose product
/// with the temperature, the draft's, is not finite as a float), the same model
/// object as draft and target, or when a prompt alone does not fit either model.
template <language_model Draft, language_model Target, std::uniform_random_bit_generator Rng>
[[nodiscard]] draft_temperature_scan scan_draft_temperature(Draft& draft, Target& target,
                                                            std::span<const std::vector<token>> prompts,
                                                            const speculative_params& params,
                                                            std::span<const double> ratios, Rng& rng,
                                                            std::size_t tokens = 64) {
  validate(params.sampling, "speculative_params.sampling");  // (a NaN or infinite temperature, by its name)
  const float t = params.sampling.temperature;
  if (!(t > 0.0f)) throw error("scan_draft_temperature: the target's temperature must be > 0 (at 0 both models are greedy)");
  if (prompts.empty()) throw error("scan_draft_temperature: no prompts");
  if (ratios.empty()) throw error("scan_draft_temperature: no ratios");
  if (tokens == 0) throw error("scan_draft_temperature: tokens must be >= 1 (the positions the means are over)");
  for (const double r : ratios) {
    if (!(r > 0.0) || !std::isfinite(r)) throw error(fmt::format("scan_draft_temperature: ratio {} must be finite and > 0", r));
    if (!std::isfinite(static_cast<float>(t * r))) {  // (the draft's temperature is a float)
      throw error(fmt::format("scan_draft_temperature: ratio {} × the temperature {} = {:g}, the draft's temperature, "
                              "is not finite as a float",
                              r, t, t * r));
    }
  }
  detail::check_distinct(draft, target, "scan_draft_temperature: ",
                         "each scores the text from an empty context, one after the other");
  const std::size_t vocab = detail::vocabulary_of(target, "target");
  detail::check_vocabularies(detail::vocabulary_of(draft, "draft"), vocab);
  speculative_params gen = params;
  gen.eos.reset();  // every text as long as its room allows: positions are what the means are over
  logit_warper warp_p(params.sampling, vocab, "target");
  std::vector<logit_warper> warp_q;  // the draft's warping at each ratio, as `apply` would set it
  for (const double r : ratios) {
    warp_q.emplace_back(params.with_draft_temperature(static_cast<float>(t * r)).draft_warping(), vocab, "draft");
  }
  draft_temperature_scan scan{std::vector<double>(ratios.begin(), ratios.end()), std::vector<double>(ratios.size(), 0.0), 0};
  Eigen::VectorXf p(static_cast<Eigen::Index>(vocab)), q(static_cast<Eigen::Index>(vocab));
  std::vector<token> text;
  for (const std::vector<token>& prompt : prompts) {
    gen.max_new_tokens = detail::warmup_length(draft, target, prompt.size(), tokens, "scan_draft_temperature");
    const auto out = autoregressive_sample(target, prompt, gen, rng);
    text.assign(prompt.begin(), prompt.end());
    text.insert(text.end(), out.tokens.begin(), out.tokens.end());
    // Column j of a call on text[0, n - 1) conditions on text[0, j]: the generated positions are
    // its last out.tokens.size() columns (from prompt.size() - 1 on).
    const auto input = std::span<const token>(text).first(text.size() - 1);
    const std::size_t generated = out.tokens.size();
    detail::truncate_to(target, 0, "target");
    detail::truncate_to(draft, 0, "draft");
    Eigen::MatrixXf lp, lq;  // (V, generated): the last columns, checked like the loops check theirs
    (void)detail::forward(target, input, generated, vocab, "target", [&](const auto& l) { lp = l; });
    (void)detail::forward(draft, input, generated, vocab, "draft", [&](const auto& l) { lq = l; });
    for (Eigen::Index j = 0; j < static_cast<Eigen::Index>(generated); ++j) {
      warp_p(lp.col(j), p);
      for (std::size_t i = 0; i < warp_q.size(); ++i) {
        warp_q[i](lq.col(j), q);
        scan.alpha[i] += static_cast<double>(p.cwiseMin(q).sum());
      }
      ++scan.positions;
    }
  }
  for (double& a : scan.alpha) a /= static_cast<double>(scan.positions);
  return scan;
}

}  // namespace specsample
