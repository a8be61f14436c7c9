// Statistical proof of exactness: for toy models with tiny vocabularies, the exact probability of
// every output sequence is enumerated, >= 100k speculative samples are drawn with a fixed seed, and
// a chi-square test compares the two. Every scenario also runs a deliberately broken verifier and requires
// the same statistic to reject it: a test that cannot fail proves nothing.

#include <specsample/specsample.hpp>
#include <specsample/testing/distribution.hpp>

#include <catch2/catch.hpp>

#include "../support/broken_verifiers.hpp"
#include "../support/fit.hpp"
#include "../support/last_columns_model.hpp"

#include <algorithm>
#include <random>
#include <string>

using namespace specsample;

namespace {


using namespace specsample::test;  // the broken verifiers

struct scenario {
  toy::markov target;
  toy::markov draft;
  sampling_params sampling{};
  std::size_t draft_length = 2;
  std::size_t length = 3;
  std::size_t samples = 100'000;
};

template <class Verifier>
testing::fit_result run(scenario& s, Verifier verifier, std::uint64_t seed) {
  speculative_params params;
  params.max_new_tokens = s.length;
  params.draft_length = s.draft_length;
  params.sampling = s.sampling;
  std::mt19937_64 rng(seed);
  return testing::speculative_fit(s.draft, s.target, std::vector<token>{0}, params, s.samples, rng, verifier);
}

// The exact sampler passes, the named broken variant is rejected by the same statistic.
template <class Broken>
void check_exact_and_broken(scenario s, Broken broken) {
  const auto good = run(s, tokenwise_verifier{}, 12345);
  INFO("exact:  X2 = " << good.statistic << ", dof = " << good.dof << ", p = " << good.p_value);
  CHECK(good.impossible == 0);
  CHECK(good.p_value > pass_threshold);
  const auto bad = run(s, broken, 12345);
  INFO("broken: X2 = " << bad.statistic << ", dof = " << bad.dof << ", p = " << bad.p_value);
  CHECK(bad.p_value < fail_threshold);
}

toy::markov target_model(std::size_t vocab, std::size_t order = 1, std::uint64_t seed = 7) {
  return toy::markov::random(vocab, order, seed, 0.8f);
}

}  // namespace

TEST_CASE("speculative output matches the target's exact distribution for every draft length",
          "[exactness][draft_length]") {
  // (K, vocab, length): the generated length covers at least one full round of K drafts + bonus.
  struct cell { std::size_t k, vocab, length; };
  for (const cell c : {cell{1, 4, 4}, cell{2, 4, 4}, cell{3, 4, 4}, cell{5, 3, 6}, cell{8, 3, 9}}) {
    DYNAMIC_SECTION("K = " << c.k) {
      auto target = target_model(c.vocab, 2);  // order 2: conditionals depend on two tokens of context
      auto draft = toy::markov::similar_to(target, 0.3, 99, 0.8f);
      scenario s{target, draft, {}, c.k, c.length, c.k == 8 ? 200'000u : 100'000u};
      check_exact_and_broken(s, resample_from_target{});
    }
  }
}

TEST_CASE("speculative output is exact at temperatures 0.5, 1 and 2", "[exactness][temperature]") {
  for (const float t : {0.5f, 1.0f, 2.0f}) {
    DYNAMIC_SECTION("T = " << t) {
      auto target = target_model(4);
      scenario s{target, toy::markov::similar_to(target, 0.4, 5, 0.8f), {}, 2, 3};
      s.sampling.temperature = t;
      check_exact_and_broken(s, accept_with_target_probability{});
    }
  }
}

TEST_CASE("speculative output is exact under top-k, top-p and min-p filtering", "[exactness][filters]") {
  auto target = target_model(5);
  auto draft = toy::markov::similar_to(target, 0.3, 11, 0.8f);
  SECTION("top-k = 2") {
    scenario s{target, draft, {}, 3, 4};
    s.sampling.top_k = 2;
    check_exact_and_broken(s, resample_from_target{});
  }
  SECTION("top-p = 0.7") {
    scenario s{target, draft, {}, 3, 4};
    s.sampling.top_p = 0.7f;
    check_exact_and_broken(s, resample_from_target{});
  }
  SECTION("min-p = 0.2") {
    scenario s{target, draft, {}, 3, 4};
    s.sampling.min_p = 0.2f;
    check_exact_and_broken(s, resample_from_target{});
  }
}

TEST_CASE("a draft identical to the target is exact and accepts everything", "[exactness][draft]") {
  auto target = target_model(4, 2);
  scenario s{target, target, {}, 3, 4};
  // Residual and acceptance ratio never matter here; an off-by-one bonus column does.
  check_exact_and_broken(s, bonus_from_previous_column{});
}

TEST_CASE("a draft far from the target is exact", "[exactness][draft]") {
  auto target = target_model(4);
  scenario s{target, toy::markov::random(4, 1, 4242, 0.3f), {}, 3, 4};
  check_exact_and_broken(s, resample_from_target{});
}

TEST_CASE("a draft with zero mass where the target has mass is exact", "[exactness][draft][zeros]") {
  // The draft never proposes token 0 or 1; only the residual can produce them.
  auto target = target_model(4);
  Eigen::MatrixXf d = target.transitions();
  d.row(0).setZero();
  d.row(1).setZero();
  scenario s{target, toy::markov(d, 1), {}, 2, 3};
  check_exact_and_broken(s, resample_from_target{});
}

TEST_CASE("a draft with mass where the target has none is exact", "[exactness][draft][zeros]") {
  // The target never produces token 3; the draft proposes it often and must always be rejected.
  Eigen::MatrixXf t = target_model(4).transitions();
  t.row(3).setZero();
  toy::markov target(t, 1);
  Eigen::MatrixXf d = Eigen::MatrixXf::Constant(4, 5, 0.1f);
  d.row(3).setConstant(0.7f);
  scenario s{target, toy::markov(d, 1), {}, 2, 3};
  check_exact_and_broken(s, resample_from_target{});
}

TEST_CASE("the exactness test also holds for a vocabulary of 6", "[exactness][draft_length]") {
  // K = 3 over 4 tokens: a full round and its bonus (longer drafts: the cells K = 5 and 8 above).
  auto target = target_model(6);
  scenario s{target, toy::markov::similar_to(target, 0.6, 3, 0.8f), {}, 3, 4};
  check_exact_and_broken(s, accept_with_target_probability{});
}

TEST_CASE("models with append(t, n), asked only for the columns the loop reads, stay exact",
          "[exactness][draft_length]") {
  // K = 3 over 6 tokens: rounds with every draft accepted make the draft catch up on two tokens.
  test::last_columns_model target{target_model(4, 2), {}};
  test::last_columns_model draft{toy::markov::similar_to(target.inner, 0.3, 99, 0.8f), {}};
  speculative_params params;
  params.max_new_tokens = 6;
  params.draft_length = 3;
  const std::vector<token> prompt{0};
  std::mt19937_64 rng(12345);
  const auto good = testing::speculative_fit(draft, target, prompt, params, 100'000, rng, tokenwise_verifier{});
  INFO("exact:  X2 = " << good.statistic << ", dof = " << good.dof << ", p = " << good.p_value);
  CHECK(good.impossible == 0);
  CHECK(good.p_value > pass_threshold);
  CHECK(std::count(draft.asked.begin(), draft.asked.end(), std::size_t{1}) > 0);
  rng.seed(12345);
  const auto bad = testing::speculative_fit(draft, target, prompt, params, 100'000, rng, resample_from_target{});
  INFO("broken: X2 = " << bad.statistic << ", dof = " << bad.dof << ", p = " << bad.p_value);
  CHECK(bad.p_value < fail_threshold);
}

TEST_CASE("autoregressive sampling matches the exact distribution it is the reference for", "[exactness][reference]") {
  auto target = target_model(4, 2);
  const std::vector<token> prompt{0};
  const sampling_params sampling{};
  const auto exact = testing::exact_sequence_distribution(target, prompt, 4, sampling);
  testing::sequence_histogram hist(4, 4);
  speculative_params params;
  params.max_new_tokens = 4;
  std::mt19937_64 rng(1);
  for (std::size_t i = 0; i < 100'000; ++i) hist.add(autoregressive_sample(target, prompt, params, rng).tokens);
  const auto fit = testing::chi_square_test(hist.counts(), exact);
  INFO("X2 = " << fit.statistic << ", dof = " << fit.dof << ", p = " << fit.p_value);
  CHECK(fit.p_value > pass_threshold);
  // The same check rejects a sampler that warps at T = 1.1 instead of 1: it can fail.
  testing::sequence_histogram warm(4, 4);
  params.sampling.temperature = 1.1f;
  for (std::size_t i = 0; i < 100'000; ++i) warm.add(autoregressive_sample(target, prompt, params, rng).tokens);
  const auto bad = testing::chi_square_test(warm.counts(), exact);
  INFO("T = 1.1: X2 = " << bad.statistic << ", dof = " << bad.dof << ", p = " << bad.p_value);
  CHECK(bad.p_value < fail_threshold);
}

namespace {

// Deliberately broken: draws each draft from the draft model's logits warped by `drawn`, but hands
// the verifier those logits warped by `reported` as q: a loop that drafted with
// `params.draft_sampling` and verified against `params.sampling`.
struct mislabelled_drafter {
  toy::markov* model;
  logit_warper drawn, reported;

  [[nodiscard]] std::size_t vocab_size() const { return model->vocab_size(); }
  void begin(std::span<const token> ctx) {
    model->truncate(0);
    if (ctx.size() > 1) (void)model->append(ctx.first(ctx.size() - 1));
  }
  template <class Rng>
  proposal propose(std::span<const token> ctx, std::size_t k, Eigen::Ref<Eigen::MatrixXf> q, std::span<token> out,
                   Rng& rng) {
    for (std::size_t i = 0; i < k; ++i) {
      const auto input = i == 0 ? ctx.subspan(model->size()) : std::span<const token>(&out[i - 1], 1);
      const Eigen::MatrixXf logits = model->append(input);
      const auto col = static_cast<Eigen::Index>(i);
      drawn(logits.col(logits.cols() - 1), q.col(col));
      out[i] = specsample::detail::draw_categorical(q.col(col), rng);
      reported(logits.col(logits.cols() - 1), q.col(col));
    }
    return {k, k, 0.0};
  }
  void sync(std::span<const token> ctx) {
    if (model->size() > ctx.size() - 1) model->truncate(ctx.size() - 1);
  }
};

}  // namespace

TEST_CASE("a draft with its own warping (draft_sampling) is exact", "[exactness][draft_sampling]") {
  test::draft_length_pair pair;  // K = 3, 4 new tokens
  // (References, not a structured binding: Clang 14 cannot capture one in a lambda.)
  auto &target = pair.target, &draft = pair.draft;
  auto& params = pair.params;
  const std::vector<token> prompt{0};
  params.sampling.temperature = 0.8f;
  // A hotter draft, cut to its 3 most probable tokens: another q than the target's warping gives;
  // and a greedy draft under the sampling target, every proposal one-hot (q = 1).
  for (const auto& [name, drafted] : {std::pair{"T = 1.6, top-k 3", sampling_params{.temperature = 1.6f, .top_k = 3}},
                                      std::pair{"greedy", sampling_params{.temperature = 0.0f}}}) {
    params.draft_sampling = drafted;
    // The loop's own drafter (speculative_sample with a draft model), the rule params name.
    for (const verification rule : {verification::token_wise, verification::block}) {
      DYNAMIC_SECTION("a draft at " << name << ", " << (rule == verification::block ? "block" : "token-wise")
                                    << " verification") {
        params.verify = rule;
        std::mt19937_64 rng(2024);
        const auto good = testing::speculative_fit(draft, target, prompt, params, 100'000, rng);
        INFO("exact:  X2 = " << good.statistic << ", dof = " << good.dof << ", p = " << good.p_value);
        CHECK(good.impossible == 0);
        CHECK(good.p_value > pass_threshold);
        // Broken: the drafts drawn with draft_sampling, q reported with sampling.
        mislabelled_drafter broken{&draft, logit_warper(params.draft_warping(), 4), logit_warper(params.sampling, 4)};
        const auto bad = test::fit_drafter(broken, target, prompt, params, testing::verifier_from_params{});
        INFO("broken: X2 = " << bad.statistic << ", dof = " << bad.dof << ", p = " << bad.p_value);
        CHECK(bad.p_value < fail_threshold);
      }
    }
  }
}

TEST_CASE("draft_sampling is what the draft samples from, and is validated", "[draft_sampling]") {
  test::draft_length_pair pair;  // K = 3, 4 new tokens
  // (References, not a structured binding: Clang 14 cannot capture one in a lambda.)
  auto &target = pair.target, &draft = pair.draft;
  auto& params = pair.params;
  const std::vector<token> prompt{0};
  params.max_new_tokens = 12;
  std::mt19937_64 rng(5);
  // {drafts, drafts with q = 1} of one generation, from the loop's events.
  const auto one_hot_drafts = [&] {
    std::pair<std::size_t, std::size_t> n{0, 0};
    (void)speculative_sample(draft, target, prompt, params, rng, [&](const round_event& e) {
      for (const auto& d : e.drafts) {
        ++n.first;
        n.second += d.q == 1.0f ? 1 : 0;
      }
    });
    return n;
  };
  // A greedy draft under a sampling target: every proposal has q = 1.
  params.draft_sampling = sampling_params{.temperature = 0.0f};
  const auto greedy = one_hot_drafts();
  CHECK(greedy.first > 0);
  CHECK(greedy.second == greedy.first);
  // Without it the draft samples at the target's temperature (1): not every q is 1.
  params.draft_sampling.reset();
  const auto sampled = one_hot_drafts();
  CHECK(sampled.second < sampled.first);
  // A greedy target gives the autoregressive tokens whatever the draft samples from, under
  // either rule.
  params.sampling.temperature = 0.0f;
  params.draft_sampling = sampling_params{.temperature = 2.0f, .top_p = 0.9f};
  for (const verification rule : {verification::token_wise, verification::block}) {
    params.verify = rule;
    for (std::uint64_t seed = 0; seed < 20; ++seed) {
      std::mt19937_64 r1(seed), r2(seed);
      CHECK(speculative_sample(draft, target, prompt, params, r1).tokens ==
            autoregressive_sample(target, prompt, params, r2).tokens);
    }
  }
  // Out-of-domain draft warping is named as such, before anything runs.
  using Catch::Matchers::Contains;
  params.draft_sampling = sampling_params{.top_p = 0.0f};
  CHECK_THROWS_WITH(speculative_sample(draft, target, prompt, params, rng),
                    Contains("speculative_params.draft_sampling.top_p must be in (0, 1]"));
  params.draft_sampling = sampling_params{.temperature = -1.0f};
  CHECK_THROWS_WITH(speculative_sample(draft, target, prompt, params, rng),
                    Contains("speculative_params.draft_sampling.temperature must be finite and >= 0"));
}
