#pragma once
// G-tests of a whole speculative loop (any drafter, any verifier) against the target's exact
// distribution over the sequences of its first `max_new_tokens` tokens, by enumeration.

#include <specsample/sampling/loop.hpp>
#include <specsample/testing/distribution.hpp>
#include <specsample/toy.hpp>

#include <catch2/catch.hpp>

#include "broken_verifiers.hpp"

#include <random>
#include <vector>

namespace specsample::test {

/// Generates `samples` sequences with `drafter` + `verifier` and G-tests them. With `params.eos`
/// set, generation stops right after the first EOS, so the sequences have different lengths: both
/// sides are then compared over (V + 1)^L, every position after an EOS holding the marker V
/// ("absent"). The exact side truncates the target's fixed-length sequences at their first EOS;
/// a sampler that emitted anything after an EOS would land in a cell of probability zero.
template <class Drafter, class Verifier>
testing::fit_result fit_drafter(Drafter& drafter, toy::markov& target, const std::vector<token>& prompt,
                                const speculative_params& params, Verifier verifier,
                                std::size_t samples = 100'000) {
  const std::size_t L = params.max_new_tokens, V = target.vocab_size();
  speculative_params fixed = params;
  fixed.eos.reset();
  const auto full = testing::exact_sequence_distribution(target, prompt, L, fixed.sampling);
  const std::size_t cells = params.eos ? V + 1 : V;
  const auto padded = [&](std::vector<token> s) {  // truncated after the first EOS, then marked
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (params.eos && s[i] == *params.eos) {
        s.resize(i + 1);
        break;
      }
    }
    s.resize(L, static_cast<token>(V));
    return s;
  };
  xt::xarray<double> exact = xt::zeros<double>(std::vector<std::size_t>(L, cells));
  for (std::size_t index = 0; index < full.size(); ++index) {
    std::vector<token> s(L);
    for (std::size_t i = L, rest = index; i-- > 0; rest /= V) s[i] = static_cast<token>(rest % V);
    std::size_t key = 0;
    for (const token x : padded(s)) key = key * cells + static_cast<std::size_t>(x);
    exact.flat(key) += full.flat(index);
  }
  testing::sequence_histogram hist(cells, L);
  std::mt19937_64 rng(77);
  no_observer none;
  for (std::size_t i = 0; i < samples; ++i) {
    std::vector<token> out = detail::generate(drafter, target, prompt, params, rng, none, verifier).tokens;
    if (params.eos) {
      REQUIRE(out.size() <= L);
      for (std::size_t j = 0; j + 1 < out.size(); ++j) REQUIRE(out[j] != *params.eos);  // stops right after EOS
      out.resize(L, static_cast<token>(V));
    }
    hist.add(out);
  }
  return testing::g_test(hist.counts(), exact);
}

/// The exactness check of a loop configuration: with `verifier` the fit passes (no sample in a
/// cell of probability zero, p above pass_threshold); with the deliberately `broken` verifier the
/// same statistic rejects it (p below fail_threshold).
template <class Drafter, class Verifier, class Broken>
void check_exact_and_broken(Drafter& drafter, toy::markov& target, const std::vector<token>& prompt,
                            const speculative_params& params, Verifier verifier, Broken broken) {
  const auto good = fit_drafter(drafter, target, prompt, params, verifier);
  INFO("exact:  G = " << good.statistic << ", dof = " << good.dof << ", p = " << good.p_value);
  CHECK(good.impossible == 0);
  CHECK(good.p_value > pass_threshold);
  const auto bad = fit_drafter(drafter, target, prompt, params, broken);
  INFO("broken: G = " << bad.statistic << ", dof = " << bad.dof << ", p = " << bad.p_value);
  CHECK(bad.p_value < fail_threshold);
}

}  // namespace specsample::test
