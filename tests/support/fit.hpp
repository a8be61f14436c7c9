#pragma once
// The exactness check of a loop configuration (any drafter, any verifier, with or without EOS):
// `testing::speculative_fit` passes with the exact verifier and rejects a deliberately broken one.

#include <specsample/sampling/loop.hpp>
#include <specsample/testing/distribution.hpp>
#include <specsample/toy.hpp>

#include <catch2/catch.hpp>

#include "broken_verifiers.hpp"

#include <random>
#include <vector>

namespace specsample::test {

/// The toy pair of the draft-length exactness tests (p_min early stop, adaptive K): a 4-token
/// order-2 target, a draft at distance 0.4 from it, 4 new tokens with K = 3 — small enough for an
/// exact fit over every continuation. Each test sets its own draft-length rule on `params`; the
/// adaptive schedule's asks for more tokens (`adaptive_length`), as with K >= max_new_tokens - 1
/// every round drafts remaining - 1 tokens whatever the schedule says.
struct draft_length_pair {
  toy::markov target = toy::markov::random(4, 2, 3, 0.8f);
  toy::markov draft = toy::markov::similar_to(target, 0.4, 4, 0.5f);
  speculative_params params = [] {
    speculative_params p;
    p.max_new_tokens = 4;
    p.draft_length = 3;
    return p;
  }();
  /// A length at which the adaptive cap binds: after a rejection in the first round of 3 drafts
  /// the next round may draft 2 where 3 remain to be drafted.
  static constexpr std::size_t adaptive_length = 6;
};

/// `testing::speculative_fit` of `samples` generations (generator seeded 77).
template <class Drafter, class Verifier>
testing::fit_result fit_drafter(Drafter& drafter, toy::markov& target, const std::vector<token>& prompt,
                                const speculative_params& params, Verifier verifier,
                                std::size_t samples = 100'000) {
  std::mt19937_64 rng(77);
  return testing::speculative_fit(drafter, target, prompt, params, samples, rng, verifier);
}

/// With `verifier` the fit passes (no sample in a cell of probability zero, p above
/// pass_threshold); with the deliberately `broken` verifier the same statistic rejects it (p below
/// fail_threshold). Returns the exact fit, whose `drafted` and `rejected` say what its rounds did.
template <class Drafter, class Verifier, class Broken>
testing::fit_result check_exact_and_broken(Drafter& drafter, toy::markov& target, const std::vector<token>& prompt,
                            const speculative_params& params, Verifier verifier, Broken broken) {
  const auto good = fit_drafter(drafter, target, prompt, params, verifier);
  INFO("exact:  X2 = " << good.statistic << ", dof = " << good.dof << ", p = " << good.p_value);
  CHECK(good.impossible == 0);
  CHECK(good.p_value > pass_threshold);
  const auto bad = fit_drafter(drafter, target, prompt, params, broken);
  INFO("broken: X2 = " << bad.statistic << ", dof = " << bad.dof << ", p = " << bad.p_value);
  CHECK(bad.p_value < fail_threshold);
  return good;
}

}  // namespace specsample::test
