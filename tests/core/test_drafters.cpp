// Drafters beyond a second model: n-gram prompt lookup, lookup falling back to a model, early
// stopping (p_min) and the adaptive draft length. Each is exact: chi-square tests against the target's
// exact distribution, with a broken counterpart the same statistic rejects, and greedy identity.

#include <specsample/drafters/fallback.hpp>
#include <specsample/drafters/ngram.hpp>
#include <specsample/sampling/loop.hpp>
#include <specsample/toy.hpp>
#include <specsample/testing/distribution.hpp>

#include <catch2/catch.hpp>

#include "../support/broken_verifiers.hpp"
#include "../support/fit.hpp"

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

using namespace specsample;

using namespace specsample::test;

static_assert(drafter<drafters::ngram>);
static_assert(drafter<model_drafter<toy::markov>>);
static_assert(!drafter<toy::markov>);

TEST_CASE("the n-gram drafter proposes the continuation of the longest earlier suffix match", "[drafters][ngram]") {
  // (from_shortest: suffixes of min_n up to the default 4, or min_n alone when longer)
  CHECK(drafters::ngram::from_shortest(10, 2).min_n() == 2);
  CHECK(drafters::ngram::from_shortest(10, 2).max_n() == drafters::ngram::default_max_n);
  CHECK(drafters::ngram::from_shortest(10, 6).max_n() == 6);
  drafters::ngram d(10, 3);
  Eigen::MatrixXf q(10, 4);
  std::vector<token> out(4);
  std::mt19937 rng(1);
  // ... 1 2 3 [4 5 6 7] ... 1 2 3 -> proposes 4 5 6 7
  const std::vector<token> ctx{9, 1, 2, 3, 4, 5, 6, 7, 8, 2, 3, 1, 2, 3};
  const proposal made = d.propose(ctx, 4, q, out, rng);
  REQUIRE(made.tokens == 4);
  CHECK(made.forward_calls == 0);
  CHECK(out == std::vector<token>{4, 5, 6, 7});
  CHECK(q.col(0).sum() == 1.0f);
  CHECK(q(4, 0) == 1.0f);
  // Only a 1-gram matches: the most recent earlier 8 is followed by 2 5 8, and the copy runs on
  // into its own output (2 5 8 2).
  const std::vector<token> ctx2{8, 2, 5, 8};
  REQUIRE(d.propose(ctx2, 4, q, out, rng).tokens == 4);
  CHECK(out == std::vector<token>{2, 5, 8, 2});
  // No match at all: no proposal.
  const std::vector<token> ctx3{1, 2, 3};
  CHECK(d.propose(ctx3, 4, q, out, rng).tokens == 0);
  CHECK_THROWS_AS(drafters::ngram(10, 1, 2), error);
}

TEST_CASE("can_match_in says whether a context of that size can hold a match at all", "[drafters][ngram]") {
  // The most repetitive context of each size: a match wherever can_match_in says one can be, and
  // none (whatever the tokens) where it says none can.
  for (const std::size_t min_n : {1u, 2u, 5u}) {
    const auto d = drafters::ngram::from_shortest(3, min_n);
    for (std::size_t size = 0; size <= min_n + 2; ++size) {
      CAPTURE(min_n, size);
      const std::vector<token> same(size, 1);
      CHECK(d.can_match_in(size) == (size > min_n));
      CHECK((d.match(same) != drafters::ngram::npos) == d.can_match_in(size));
    }
  }
}

TEST_CASE("a drafter called with buffers too small for its drafts says so, writing nothing", "[drafters]") {
  // The loops always size them; a direct call with one column of q for four drafts wrote past it.
  drafters::ngram d(3, 2, 1);
  std::mt19937 rng(1);
  const std::vector<token> ctx{1, 1};
  Eigen::MatrixXf narrow(3, 1), q(3, 4), tall(4, 4);
  std::vector<token> out(4), short_out(1);
  CHECK_THROWS_WITH(d.propose(ctx, 4, narrow, out, rng),
                    "drafters::ngram::propose: 4 drafts need q of shape (3, >= 4) and out of size >= 4; got (3, 1) and 4");
  CHECK_THROWS_WITH(d.propose(ctx, 4, q, short_out, rng),
                    "drafters::ngram::propose: 4 drafts need q of shape (3, >= 4) and out of size >= 4; got (3, 4) and 1");
  CHECK_THROWS_WITH(d.propose(ctx, 4, tall, out, rng),
                    "drafters::ngram::propose: 4 drafts need q of shape (3, >= 4) and out of size >= 4; got (4, 4) and 4");
  CHECK(out == std::vector<token>(4, 0));  // nothing written
  CHECK(d.propose(ctx, 0, narrow, short_out, rng).tokens == 0);  // no draft asked: no buffer needed
  CHECK(d.propose(ctx, 4, q, out, rng).tokens == 4);

  auto model = toy::markov::random(3, 1, 5);
  model_drafter<toy::markov> md(model, sampling_params{});
  md.begin(ctx);
  CHECK_THROWS_WITH(md.propose(ctx, 3, narrow, out, rng),
                    "model_drafter::propose: 3 drafts need q of shape (3, >= 3) and out of size >= 3; got (3, 1) and 4");
  CHECK_THROWS_WITH(md.propose(std::vector<token>{}, 2, q, out, rng),
                    "model_drafter::propose: the context is empty (a draft follows at least one token)");
  CHECK(md.propose(ctx, 3, q, out, rng).tokens == 3);
  // Its min_probability is a parameter in [0, 1) (1 would stop every round before its first draft).
  for (const float bad : {-0.1f, 1.0f, std::numeric_limits<float>::quiet_NaN()}) {
    CHECK_THROWS_WITH(model_drafter<toy::markov>(model, sampling_params{}, bad),
                      fmt::format("model_drafter.min_probability must be in [0, 1), got {}", bad));
    CHECK_THROWS_AS(model_drafter<toy::markov>(model, sampling_params{}, bad), parameter_error);
  }
}

TEST_CASE("n-gram drafting is exact on a self-repeating context", "[drafters][ngram][exactness]") {
  auto target = toy::markov::random(4, 1, 12, 0.7f);
  drafters::ngram d(4, 3);
  const std::vector<token> prompt{0, 1, 2, 0, 1, 2, 0, 1};  // repeats: the drafter always proposes
  speculative_params params;
  params.max_new_tokens = 4;
  params.draft_length = 3;
  const auto good = fit_drafter(d, target, prompt, params, tokenwise_verifier{});
  INFO("exact: X2 = " << good.statistic << ", p = " << good.p_value);
  CHECK(good.p_value > pass_threshold);
  const auto block = fit_drafter(d, target, prompt, params, block_verifier{});
  INFO("block: X2 = " << block.statistic << ", p = " << block.p_value);
  CHECK(block.p_value > pass_threshold);
  const auto bad = fit_drafter(d, target, prompt, params, resample_from_target{});
  INFO("broken: X2 = " << bad.statistic << ", p = " << bad.p_value);
  CHECK(bad.p_value < fail_threshold);
}

TEST_CASE("a custom verifier runs with a drafter as with a draft model, params.verify and leniency ignored",
          "[drafters][verify]") {
  // (Exactness through this overload: "n-gram drafting is exact ..." above, via speculative_fit.)
  auto target = toy::markov::random(4, 1, 12, 0.7f);
  auto draft_model = toy::markov::random(4, 1, 13, 0.7f);
  const std::vector<token> prompt{0, 1, 2, 0, 1, 2, 0, 1};
  speculative_params params;
  params.max_new_tokens = 12;
  params.draft_length = 3;
  params.verify = verification::block;
  params.leniency = 0.5;  // with block: a contradiction validate refuses, but a custom verifier ignores both
  REQUIRE_THROWS_WITH(validate(params, 4), "speculative_params.leniency applies to token-wise verification only");
  drafters::ngram d(4, 3);
  std::mt19937_64 a(5), b(5);
  const auto with_drafter = speculative_sample(d, target, prompt, params, a, no_observer{}, block_verifier{});
  REQUIRE(with_drafter.tokens.size() == 12);
  CHECK(with_drafter.stats.drafted > 0);
  const auto with_model = speculative_sample(draft_model, target, prompt, params, b, no_observer{}, tokenwise_verifier{});
  CHECK(with_model.tokens.size() == 12);
  // The rest of params is still checked.
  params.draft_length = 0;
  CHECK_THROWS_WITH(speculative_sample(d, target, prompt, params, a, no_observer{}, block_verifier{}),
                    Catch::Matchers::StartsWith("speculative_params.draft_length must be in 1.."));
}

TEST_CASE("n-gram drafting at temperature 0 equals greedy decoding and accepts repeated text", "[drafters][ngram]") {
  // A deterministic cycle 0 -> 1 -> 2 -> 0: the drafter predicts it perfectly after one period.
  Eigen::MatrixXf t = Eigen::MatrixXf::Constant(3, 4, 0.01f);
  t(1, 0) = t(2, 1) = t(0, 2) = t(0, 3) = 1.0f;
  toy::markov target(t, 1);
  drafters::ngram d(3);
  speculative_params params;
  params.max_new_tokens = 30;
  params.draft_length = 5;
  params.sampling.temperature = 0.0f;
  std::mt19937_64 rng(1);
  const std::vector<token> prompt{0, 1, 2};
  const auto spec = speculative_sample(d, target, prompt, params, rng);
  const auto ar = autoregressive_sample(target, prompt, params, rng);
  CHECK(spec.tokens == ar.tokens);
  CHECK(spec.stats.draft_calls == 0);
  CHECK(spec.stats.tokens_per_target_call() > 4.5);  // K + 1 = 6 once the cycle is in context
}

namespace {

/// A broken p_min: the draft is drawn first and dropped when its own probability falls below the
/// threshold, so the stop depends on the drawn token and the drafts that reach the verifier are
/// no longer distributed as q says (the exact rule decides on q alone, before drawing). Wraps a
/// model_drafter without a threshold; the model keeps the dropped drafts' inputs, which the loop's
/// `sync` cuts back as it cuts back rejected drafts.
struct stop_on_the_drawn_draft {
  model_drafter<toy::markov> inner;
  float min_probability;

  [[nodiscard]] std::size_t vocab_size() const { return inner.vocab_size(); }
  [[nodiscard]] std::size_t max_size() const { return inner.max_size(); }
  void begin(std::span<const token> ctx) { inner.begin(ctx); }
  void sync(std::span<const token> ctx) { inner.sync(ctx); }
  template <std::uniform_random_bit_generator Rng>
  proposal propose(std::span<const token> ctx, std::size_t k, Eigen::Ref<Eigen::MatrixXf> q, std::span<token> out,
                   Rng& rng) {
    proposal made = inner.propose(ctx, k, q, out, rng);
    for (std::size_t i = 0; i < made.tokens; ++i) {
      if (q(static_cast<Eigen::Index>(out[i]), static_cast<Eigen::Index>(i)) < min_probability) {
        made.tokens = i;
        break;
      }
    }
    return made;
  }
};
static_assert(drafter<stop_on_the_drawn_draft>);

}  // namespace

TEST_CASE("stopping the draft early below a probability threshold stays exact", "[drafters][p_min][exactness]") {
  draft_length_pair pair;
  auto& params = pair.params;
  params.draft_min_probability = 0.5f;
  model_drafter<toy::markov> d(pair.draft, params.sampling, params.draft_min_probability);
  check_exact_and_broken(d, pair.target, {0}, params, tokenwise_verifier{}, resample_from_target{});
  // The same statistic rejects the drafter that decides the stop on the drawn draft's own
  // probability, under either verification rule.
  stop_on_the_drawn_draft broken{model_drafter<toy::markov>(pair.draft, params.sampling), params.draft_min_probability};
  for (const verification rule : {verification::token_wise, verification::block}) {
    params.verify = rule;
    const auto bad = fit_drafter(broken, pair.target, {0}, params, testing::verifier_from_params{});
    INFO("broken drafter, rule " << static_cast<int>(rule) << ": X2 = " << bad.statistic << ", dof = " << bad.dof
                                 << ", p = " << bad.p_value);
    CHECK(bad.p_value < fail_threshold);
  }
  params.verify = verification::token_wise;
  // It does stop early: the exact fit drafted fewer tokens than the same fit without the threshold.
  const auto stopping = fit_drafter(d, pair.target, {0}, params, tokenwise_verifier{});
  params.draft_min_probability = 0.0f;
  model_drafter<toy::markov> unstopped(pair.draft, params.sampling);
  const auto full = fit_drafter(unstopped, pair.target, {0}, params, tokenwise_verifier{});
  INFO("drafted with p_min 0.5: " << stopping.drafted << ", without: " << full.drafted);
  CHECK(stopping.drafted < full.drafted);
}

namespace {

// Checks each round of a generation by a drafter that proposes every draft it is asked for against
// the adaptive schedule: the round drafts min(cap, remaining - 1), and the cap moves +2 after a
// fully accepted round (up to K), -1 after a rejection (down to 1). Counts the rounds where the
// cap bound (fewer drafts than the fixed schedule's) and the raises by 2 below K.
struct adaptive_schedule_check {
  std::size_t max_k, max_new;
  std::size_t cap = max_k, produced = 0, capped_rounds = 0, raised_by_2 = 0;
  void operator()(const round_event& e) {
    const std::size_t remaining = max_new - produced;
    CHECK(e.drafts.size() == std::min(cap, remaining - 1));
    if (e.drafts.size() < std::min(max_k, remaining - 1)) ++capped_rounds;
    if (!e.drafts.empty()) {
      const bool all = std::all_of(e.drafts.begin(), e.drafts.end(), [](const draft_event& d) { return d.accepted; });
      if (all && cap + 2 < max_k) ++raised_by_2;
      cap = all ? std::min(max_k, cap + 2) : std::max<std::size_t>(1, cap - 1);
    }
    produced += e.emitted.size();
  }
};

}  // namespace

TEST_CASE("the adaptive draft length stays exact and follows acceptance", "[drafters][adaptive][exactness]") {
  draft_length_pair pair;
  auto& params = pair.params;
  params.max_new_tokens = draft_length_pair::adaptive_length;
  params.adaptive_draft_length = true;
  model_drafter<toy::markov> d(pair.draft, params.sampling);
  const auto adaptive = check_exact_and_broken(d, pair.target, {0}, params, tokenwise_verifier{}, resample_from_target{});
  // The schedule acted inside the fit: it drafted fewer tokens than the fixed K with the same seed.
  params.adaptive_draft_length = false;
  const auto fixed = fit_drafter(d, pair.target, {0}, params, tokenwise_verifier{});
  INFO("drafted adaptive: " << adaptive.drafted << ", fixed: " << fixed.drafted);
  CHECK(adaptive.drafted < fixed.drafted);

  // Round by round it is the rule (sampled, 200 tokens with K = 8: room for the cap to climb by 2
  // from below, which K = 3 cannot tell from a reset to K), and greedy identity holds with it on.
  params.adaptive_draft_length = true;
  params.max_new_tokens = 200;
  params.draft_length = 8;
  adaptive_schedule_check schedule{params.draft_length, params.max_new_tokens};
  std::mt19937_64 rng(5);
  const auto sampled = speculative_sample(pair.draft, pair.target, std::vector<token>{0}, params, rng, schedule);
  CHECK(sampled.tokens.size() == 200);
  CHECK(schedule.produced == 200);
  CHECK(schedule.capped_rounds > 0);
  CHECK(schedule.raised_by_2 > 0);
  params.sampling.temperature = 0.0f;
  auto far = toy::markov::random(4, 2, 99, 0.8f);
  const auto spec = speculative_sample(far, pair.target, std::vector<token>{0}, params, rng);
  CHECK(spec.tokens == autoregressive_sample(pair.target, std::vector<token>{0}, params, rng).tokens);
}

static_assert(drafter<drafters::fallback<drafters::ngram, model_drafter<toy::markov>>>);

TEST_CASE("the fallback drafter proposes from its first drafter where it can, else from its second",
          "[drafters][fallback]") {
  auto target = toy::markov::random(10, 1, 21, 0.7f);
  auto draft = toy::markov::similar_to(target, 0.3, 22, 0.7f);
  sampling_params sampling;
  drafters::fallback d(drafters::ngram(10, 3, 2), model_drafter(draft, sampling));
  Eigen::MatrixXf q(10, 4);
  std::vector<token> out(4);
  std::mt19937_64 rng(3);
  const std::vector<token> prompt{5, 1, 2, 7, 1};
  d.begin(prompt);
  // No earlier 2-gram "7 1": the draft model proposes, catching up on the prompt's last token in
  // its first call, then one call per draft.
  const proposal by_model = d.propose(prompt, 4, q, out, rng);
  CHECK(by_model.tokens == 4);
  CHECK(by_model.forward_calls == 4);
  CHECK(draft.size() == prompt.size() + 3);
  CHECK((q.colwise().sum().array() - 1.0f).abs().maxCoeff() < 1e-5f);
  // "1 2" occurred before: prompt lookup proposes "7 1 2 7" (the copy runs into its own output),
  // one-hot, with no forward call.
  const std::vector<token> ctx{5, 1, 2, 7, 1, 2};
  d.sync(ctx);
  CHECK(draft.size() == ctx.size() - 1);
  const proposal by_lookup = d.propose(ctx, 4, q, out, rng);
  CHECK(by_lookup.tokens == 4);
  CHECK(by_lookup.forward_calls == 0);
  CHECK(out == std::vector<token>{7, 1, 2, 7});
  CHECK(q(7, 0) == 1.0f);
  CHECK(q.col(0).sum() == 1.0f);
  CHECK(d.first_rounds() == 1);
  CHECK(d.second_rounds() == 1);
  auto other = toy::markov::random(9, 1, 23, 0.7f);
  CHECK_THROWS_WITH(drafters::fallback(drafters::ngram(10), model_drafter(other, sampling)),
                    "drafters::fallback: the first drafter has a vocabulary of 10 tokens, the second 9");
}

namespace {
// A deliberately broken fallback: lookup's drafts are passed on with a uniform q (the
// distribution they were not drawn from), so the rejection rule corrects for the wrong q.
template <class D>
struct uniform_q_for_first {
  D& inner;
  [[nodiscard]] std::size_t vocab_size() const { return inner.vocab_size(); }
  void begin(std::span<const token> ctx) { inner.begin(ctx); }
  void sync(std::span<const token> ctx) { inner.sync(ctx); }
  template <class Rng>
  proposal propose(std::span<const token> ctx, std::size_t k, Eigen::Ref<Eigen::MatrixXf> q, std::span<token> out,
                   Rng& rng) {
    const std::size_t before = inner.first_rounds();
    const proposal made = inner.propose(ctx, k, q, out, rng);
    if (inner.first_rounds() != before) {
      q.leftCols(static_cast<Eigen::Index>(made.tokens)).setConstant(1.0f / static_cast<float>(vocab_size()));
    }
    return made;
  }
};
}  // namespace

TEST_CASE("prompt lookup, else a draft model, stays exact", "[drafters][fallback][exactness]") {
  auto target = toy::markov::random(4, 1, 12, 0.7f);
  auto draft = toy::markov::similar_to(target, 0.4, 13, 0.6f);
  speculative_params params;
  params.max_new_tokens = 4;
  params.draft_length = 3;
  // "0 1" recurs in the prompt, so the first round looks up; later rounds do or do not find their
  // 2-gram, so both drafters propose across the samples.
  const std::vector<token> prompt{0, 1, 3, 0, 1};
  drafters::fallback d(drafters::ngram(4, 3, 2), model_drafter(draft, params.sampling));
  check_exact_and_broken(d, target, prompt, params, tokenwise_verifier{}, resample_from_target{});
  const auto block = fit_drafter(d, target, prompt, params, block_verifier{});
  INFO("block: X2 = " << block.statistic << ", p = " << block.p_value);
  CHECK(block.p_value > pass_threshold);
  CHECK(d.first_rounds() > 10'000);
  CHECK(d.second_rounds() > 10'000);
  uniform_q_for_first<decltype(d)> broken{d};
  const auto bad = fit_drafter(broken, target, prompt, params, tokenwise_verifier{});
  INFO("lookup's drafts with a uniform q: X2 = " << bad.statistic << ", p = " << bad.p_value);
  CHECK(bad.p_value < fail_threshold);
}

TEST_CASE("prompt lookup, else a draft model, equals greedy decoding at temperature 0", "[drafters][fallback]") {
  auto target = toy::markov::random(6, 2, 31, 0.5f);
  auto draft = toy::markov::similar_to(target, 0.5, 32, 0.5f);
  speculative_params params;
  params.max_new_tokens = 60;
  params.draft_length = 4;
  params.sampling.temperature = 0.0f;
  drafters::fallback d(drafters::ngram(6, 3, 2), model_drafter(draft, params.sampling));
  std::mt19937_64 rng(4);
  const std::vector<token> prompt{0, 1, 2};
  const auto spec = speculative_sample(d, target, prompt, params, rng);
  CHECK(spec.tokens == autoregressive_sample(target, prompt, params, rng).tokens);
  CHECK(d.first_rounds() > 0);
  CHECK(d.second_rounds() > 0);
}
