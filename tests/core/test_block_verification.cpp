// Block verification (Sun et al. 2025): exact like token-wise, identical to it at temperature 0
// and for K = 1, and never fewer accepted tokens per round. Each exactness check also runs a
// broken variant built from a pitfall others hit, which the same statistic must reject.

#include <specsample/drafters/ngram.hpp>
#include <specsample/sampling/loop.hpp>
#include <specsample/toy.hpp>
#include <specsample/testing/distribution.hpp>

#include <catch2/catch.hpp>

#include "../support/broken_verifiers.hpp"
#include "../support/fit.hpp"

#include <random>
#include <vector>

using namespace specsample;

namespace {

using specsample::test::fail_threshold;
using specsample::test::pass_threshold;

// A configurable copy of block_verifier with one defect switched on.
struct broken_block_verifier {
  bool stop_at_first_failure = false;  // τ = the last i before the first η_i >= h_i
  bool skip_clip = false;              // w_i = w_{i-1} p/q without min(1, ·)
  bool residual_weight_ahead = false;  // residual weighted by w_{τ+1} instead of w_τ
  bool lowest_success = false;         // τ = the smallest i with η_i < h_i, not the largest
  bool unweighted_residual = false;    // residual norm(max(0, p - q)): the weight w_τ left out
  bool last_test_everywhere = false;   // h_i = min(1, w_i) (the last position's test) at every i

  template <class Rng>
  verify_result operator()(std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q,
                           const Eigen::Ref<const Eigen::MatrixXf>& p, Rng& rng) const {
    const auto k = static_cast<Eigen::Index>(drafts.size());
    double w = 1.0, w_tau = 1.0;
    Eigen::Index tau = 0;
    std::vector<double> ws{1.0};
    for (Eigen::Index i = 1; i <= k; ++i) {
      const token x = drafts[static_cast<std::size_t>(i - 1)];
      w = w * double(p(x, i - 1)) / double(q(x, i - 1));
      if (!skip_clip) w = std::min(1.0, w);
      ws.push_back(std::min(1.0, w));
      double h = std::min(1.0, w);
      if (i < k && !last_test_everywhere) {
        double z = 0.0, den = 0.0;
        for (Eigen::Index t = 0; t < p.rows(); ++t) {
          const double d = w * double(p(t, i)) - double(q(t, i));
          if (d > 0.0) z += d;
          else den -= d;
        }
        h = den > 0.0 ? z / den : 1.0;
      }
      if (uniform_01(rng) < h) {
        tau = i;
        w_tau = std::min(1.0, w);
        if (lowest_success) break;
      } else if (stop_at_first_failure) {
        break;
      }
    }
    if (tau == k) return {static_cast<std::size_t>(k), sample_categorical(p.col(k), rng), true};
    if (residual_weight_ahead) w_tau = ws[static_cast<std::size_t>(tau) + 1];
    if (unweighted_residual) w_tau = 1.0;
    return {static_cast<std::size_t>(tau), sample_residual(p.col(tau), q.col(tau), rng, w_tau), false};
  }
};

template <class Verifier>
testing::fit_result fit(toy::markov& draft, toy::markov& target, std::size_t k, std::size_t length,
                        const sampling_params& sampling, Verifier v,
                        std::size_t samples = 100'000) {
  speculative_params params;
  params.max_new_tokens = length;
  params.draft_length = k;
  params.sampling = sampling;
  std::mt19937_64 rng(2025);
  return testing::speculative_fit(draft, target, std::vector<token>{0}, params, samples, rng, v);
}

template <class Broken>
void check_exact_and_broken(toy::markov draft, toy::markov target, std::size_t k, std::size_t length,
                            const sampling_params& sampling, Broken broken,
                            std::size_t samples = 100'000) {
  const auto good = fit(draft, target, k, length, sampling, block_verifier{}, samples);
  INFO("block:  X2 = " << good.statistic << ", dof = " << good.dof << ", p = " << good.p_value);
  CHECK(good.impossible == 0);
  CHECK(good.p_value > pass_threshold);
  // The copy with no defect switched on passes too, so the broken variant fails by its defect.
  const auto copy = fit(draft, target, k, length, sampling, broken_block_verifier{}, samples);
  INFO("copy:   X2 = " << copy.statistic << ", dof = " << copy.dof << ", p = " << copy.p_value);
  CHECK(copy.impossible == 0);
  CHECK(copy.p_value > pass_threshold);
  const auto bad = fit(draft, target, k, length, sampling, broken, samples);
  INFO("broken: X2 = " << bad.statistic << ", dof = " << bad.dof << ", p = " << bad.p_value);
  CHECK(bad.p_value < fail_threshold);
}

}  // namespace

TEST_CASE("block verification matches the target's exact distribution for every draft length",
          "[block][exactness]") {
  struct cell { std::size_t k, vocab, length; };
  for (const cell c : {cell{1, 4, 4}, cell{2, 4, 4}, cell{3, 4, 4}, cell{5, 3, 6}, cell{8, 3, 9}}) {
    DYNAMIC_SECTION("K = " << c.k) {
      auto target = toy::markov::random(c.vocab, 2, 7, 0.8f);
      auto draft = toy::markov::similar_to(target, 0.3, 99, 0.8f);
      // Stopping at the first failure is only wrong when there is a later position to select. At
      // K = 3 the broken variant selects the lowest passing position instead of the highest:
      // block_verifier scans from position K down and stops at its first success, and this is that
      // scan run the wrong way.
      // At K = 5 it takes the last position's test, min(1, w_i), at every position, where block
      // verification's h_i before K is a ratio of residual masses.
      const broken_block_verifier broken = c.k == 1   ? broken_block_verifier{.residual_weight_ahead = true}
                                           : c.k == 3 ? broken_block_verifier{.lowest_success = true}
                                           : c.k == 5 ? broken_block_verifier{.last_test_everywhere = true}
                                                      : broken_block_verifier{.stop_at_first_failure = true};
      check_exact_and_broken(draft, target, c.k, c.length, {}, broken);
    }
  }
}

TEST_CASE("block verification weights the correction's residual by the selected position's weight",
          "[block][exactness]") {
  // After position τ the correction comes from norm(max(0, w_τ p − q)). Drawing it from
  // norm(max(0, p − q)), the weight left out, shows only where the residual has several positive
  // entries whose shares the weight changes: six tokens and an unrelated draft (w_τ well below 1,
  // the residual wide). In most cells above the two residuals hardly differ (at V = 3 mostly one
  // positive entry), and no broken variant there leaves the weight out.
  auto target = toy::markov::random(6, 1, 7, 0.8f);
  auto draft = toy::markov::similar_to(target, 0.0, 99, 0.8f);
  check_exact_and_broken(draft, target, 3, 4, {}, broken_block_verifier{.unweighted_residual = true});
}

TEST_CASE("block verification is exact across temperatures and filters", "[block][exactness]") {
  auto target = toy::markov::random(5, 1, 17, 0.8f);
  auto draft = toy::markov::similar_to(target, 0.4, 18, 0.8f);
  const broken_block_verifier unclipped{.skip_clip = true};
  SECTION("T = 0.5") { check_exact_and_broken(draft, target, 3, 4, {.temperature = 0.5f}, unclipped); }
  SECTION("T = 2") { check_exact_and_broken(draft, target, 3, 4, {.temperature = 2.0f}, unclipped); }
  SECTION("top-k = 2") { check_exact_and_broken(draft, target, 3, 4, {.top_k = 2}, unclipped); }
  SECTION("top-p = 0.7") { check_exact_and_broken(draft, target, 3, 4, {.top_p = 0.7f}, unclipped); }
  SECTION("min-p = 0.2") { check_exact_and_broken(draft, target, 3, 4, {.min_p = 0.2f}, unclipped); }
}

TEST_CASE("block verification is exact with drafts that put zero mass where the target has mass and the reverse",
          "[block][exactness][zeros]") {
  auto target = toy::markov::random(4, 1, 5, 0.8f);
  Eigen::MatrixXf d = target.transitions();
  d.row(0).setZero();
  // Full sample size in every build: these defects shift little mass here.
  check_exact_and_broken(toy::markov(d, 1), target, 3, 4, {}, broken_block_verifier{.stop_at_first_failure = true},
                         100'000);
  Eigen::MatrixXf t = target.transitions();
  t.row(3).setZero();
  Eigen::MatrixXf d2 = Eigen::MatrixXf::Constant(4, 5, 0.1f);
  d2.row(3).setConstant(0.7f);
  check_exact_and_broken(toy::markov(d2, 1), toy::markov(t, 1), 3, 4, {},
                         broken_block_verifier{.stop_at_first_failure = true}, 100'000);
}

TEST_CASE("block verification equals token-wise at temperature 0, token for token", "[block][greedy]") {
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    auto target = toy::markov::random(8, 2, seed, 0.5f);
    auto draft = toy::markov::similar_to(target, 0.5, seed + 50, 0.5f);
    speculative_params params;
    params.max_new_tokens = 40;
    params.draft_length = 4;
    params.sampling.temperature = 0.0f;
    std::mt19937_64 rng(seed);
    const auto tokenwise = speculative_sample(draft, target, std::vector<token>{1}, params, rng);
    params.verify = verification::block;
    const auto block = speculative_sample(draft, target, std::vector<token>{1}, params, rng);
    CHECK(block.tokens == tokenwise.tokens);
    CHECK(block.stats.accepted_histogram == tokenwise.stats.accepted_histogram);
  }
}

TEST_CASE("with one draft token block verification accepts exactly as token-wise does", "[block]") {
  // K = 1: h_1 = w_1 = min(1, p/q), the residual has weight w_0 = 1.
  Eigen::MatrixXf q(3, 1), p(3, 2);
  q << 0.6f, 0.3f, 0.1f;
  p << 0.2f, 0.5f, 0.5f, 0.3f, 0.3f, 0.2f;  // (row by row: the columns (0.2, 0.5, 0.3), (0.5, 0.3, 0.2))
  const token x = 0;
  std::mt19937_64 a(9), b(9);
  int accepted_block = 0, accepted_token = 0;
  for (int i = 0; i < 20000; ++i) {
    accepted_block += static_cast<int>(block_verifier{}(std::span<const token>(&x, 1), q, p, a).accepted);
    accepted_token += static_cast<int>(tokenwise_verifier{}(std::span<const token>(&x, 1), q, p, b).accepted);
  }
  CHECK(accepted_block == accepted_token);  // same uniforms, same rule: identical decisions
  CHECK(std::abs(accepted_block / 20000.0 - 0.2 / 0.6) < 0.015);
}

TEST_CASE("block verification accepts at least as many tokens per round as token-wise", "[block]") {
  auto target = toy::markov::random(6, 1, 31, 0.6f);
  auto draft = toy::markov::similar_to(target, 0.5, 32, 0.6f);
  speculative_params params;
  params.max_new_tokens = 200;
  params.draft_length = 4;
  std::mt19937_64 rng(4);
  double tokenwise_accepted = 0, block_accepted = 0, rounds_t = 0, rounds_b = 0;
  for (int i = 0; i < 300; ++i) {
    params.verify = verification::token_wise;
    const auto t = speculative_sample(draft, target, std::vector<token>{0}, params, rng);
    params.verify = verification::block;
    const auto b = speculative_sample(draft, target, std::vector<token>{0}, params, rng);
    tokenwise_accepted += double(t.stats.tokens);
    rounds_t += double(t.stats.rounds);
    block_accepted += double(b.stats.tokens);
    rounds_b += double(b.stats.rounds);
  }
  const double per_round_t = tokenwise_accepted / rounds_t, per_round_b = block_accepted / rounds_b;
  INFO("tokens per round: token-wise " << per_round_t << ", block " << per_round_b);
  CHECK(per_round_b > per_round_t);
}

TEST_CASE("block verification refuses more drafts than max_draft_length", "[block][errors]") {
  constexpr Eigen::Index k = max_draft_length + 1;
  const Eigen::MatrixXf q = Eigen::MatrixXf::Constant(2, k, 0.5f), p = Eigen::MatrixXf::Constant(2, k + 1, 0.5f);
  const std::vector<token> drafts(static_cast<std::size_t>(k), 0);
  std::mt19937_64 rng(1);
  REQUIRE_THROWS_WITH(block_verifier{}(drafts, q, p, rng),
                      Catch::Matchers::Contains("257 drafts; at most max_draft_length = 256"));
  // and exactly max_draft_length is verified (every draft has p = q: all accepted, then the bonus)
  const auto r = block_verifier{}(std::span(drafts).first(max_draft_length), q, p, rng);
  REQUIRE(r.accepted == max_draft_length);
  REQUIRE(r.bonus);
}

TEST_CASE("the verification rules' command-line names round-trip", "[block][params]") {
  for (const verification v : {verification::token_wise, verification::block}) {
    REQUIRE(verification_from_name(verification_name(v)) == v);
  }
  STATIC_REQUIRE(verification_from_name("block") == verification::block);
  REQUIRE(std::string_view(verification_name(verification::token_wise)) == "tokenwise");
  REQUIRE(!verification_from_name("token-wise"));
  REQUIRE(!verification_from_name(""));
  REQUIRE(verification_option("--verify", "block") == verification::block);
  REQUIRE_THROWS_WITH(verification_option("--verify", "blok"),
                      Catch::Matchers::Contains("--verify must be tokenwise or block, got 'blok'"));
}

TEST_CASE("leniency below 1 is validated and drifts toward the draft", "[leniency]") {
  auto target = toy::markov::random(4, 1, 41, 0.8f);
  auto draft = toy::markov::similar_to(target, 0.2, 42, 0.8f);
  speculative_params params;
  params.max_new_tokens = 3;
  params.draft_length = 2;
  std::mt19937_64 rng(1);
  using Catch::Matchers::Contains;
  params.leniency = 0.0;
  CHECK_THROWS_WITH(speculative_sample(draft, target, std::vector<token>{0}, params, rng), Contains("leniency"));
  params.leniency = 0.5;
  params.verify = verification::block;
  CHECK_THROWS_WITH(speculative_sample(draft, target, std::vector<token>{0}, params, rng),
                    Contains("token-wise verification only"));
  // b = 0.5 is lossy: the chi-square test must reject it against the exact target distribution.
  const auto lossy = fit(draft, target, 2, 3, {}, tokenwise_verifier{.leniency = 0.5});
  CHECK(lossy.p_value < fail_threshold);
  const auto exact = fit(draft, target, 2, 3, {}, tokenwise_verifier{.leniency = 1.0});
  CHECK(exact.p_value > pass_threshold);
  // Without a verifier, speculative_fit checks the rule params name, leniency included.
  params.verify = verification::token_wise;
  const auto from_params = test::fit_drafter(draft, target, {0}, params, testing::verifier_from_params{});
  CHECK(from_params.p_value < fail_threshold);
  params.leniency = 1.0;
  const auto exact_params = test::fit_drafter(draft, target, {0}, params, testing::verifier_from_params{});
  CHECK(exact_params.p_value > pass_threshold);
}

TEST_CASE("the exactness fit sees a 5% bias in the acceptance test", "[leniency][exactness]") {
  // How close to exact a broken sampler can come and still fail an exactness fit: with leniency b
  // a draft passes with probability min(1, p / (b·q)), so b = 0.95 accepts ~5% too often where
  // p < q. 100 000 samples see it only narrowly (X2 = 138 on 62 dof, where p = 1e-6 needs 130),
  // 400 000 clearly (X2 = 281 on 63 dof, p ~ 3e-29; the exact rule 54, p = 0.78).
  auto target = toy::markov::random(4, 1, 41, 0.8f);
  auto draft = toy::markov::similar_to(target, 0.6, 42, 0.8f);
  constexpr std::size_t samples = 400'000;
  for (const double b : {0.9, 0.95}) {
    const auto f = fit(draft, target, 2, 3, {}, tokenwise_verifier{.leniency = b}, samples);
    INFO("leniency " << b << ": X2 = " << f.statistic << ", dof = " << f.dof << ", p = " << f.p_value);
    CHECK(f.p_value < fail_threshold);
  }
  const auto exact = fit(draft, target, 2, 3, {}, tokenwise_verifier{}, samples);
  INFO("exact: X2 = " << exact.statistic << ", dof = " << exact.dof << ", p = " << exact.p_value);
  CHECK(exact.p_value > pass_threshold);
}

TEST_CASE("block verification stays exact with an early-stopping and with an adaptive draft length",
          "[block][drafters][exactness]") {
  test::draft_length_pair pair;
  auto& params = pair.params;
  SECTION("p_min = 0.5") { params.draft_min_probability = 0.5f; }
  SECTION("adaptive draft length") {
    params.adaptive_draft_length = true;
    params.max_new_tokens = test::draft_length_pair::adaptive_length;  // where the schedule's cap binds
  }
  model_drafter<toy::markov> d(pair.draft, params.sampling, params.draft_min_probability);
  test::check_exact_and_broken(d, pair.target, {0}, params, block_verifier{},
                               broken_block_verifier{.stop_at_first_failure = true});
}

TEST_CASE("output that stops at EOS is exact for token-wise and block verification", "[eos][block][exactness]") {
  // EOS = 1 is likely under this target, so it often lands inside an accepted run; the fit
  // compares the EOS-truncated sequences over (V + 1)^L (tests/support/fit.hpp).
  auto target = toy::markov::random(4, 2, 8, 0.8f);
  auto draft_model = toy::markov::similar_to(target, 0.3, 9, 0.8f);
  speculative_params params;
  params.max_new_tokens = 4;
  params.draft_length = 3;
  params.eos = 1;
  model_drafter<toy::markov> d(draft_model, params.sampling);
  SECTION("token-wise") {
    test::check_exact_and_broken(d, target, {0}, params, tokenwise_verifier{}, test::resample_from_target{});
  }
  SECTION("block") {
    test::check_exact_and_broken(d, target, {0}, params, block_verifier{},
                                 broken_block_verifier{.stop_at_first_failure = true});
  }
  // A prompt that is EOS (how a generation starts from nothing) does not stop it: the search for
  // EOS starts at the new tokens (one that started at the prompt would emit one token each time,
  // every sample impossible).
  SECTION("a prompt of EOS, token-wise") {
    test::check_exact_and_broken(d, target, {1}, params, tokenwise_verifier{}, test::resample_from_target{});
  }
  SECTION("a prompt of EOS, block") {
    test::check_exact_and_broken(d, target, {1}, params, block_verifier{},
                                 broken_block_verifier{.stop_at_first_failure = true});
  }
}
