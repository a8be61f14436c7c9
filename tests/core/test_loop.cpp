#include <specsample/specsample.hpp>
#include <specsample/testing/distribution.hpp>

#include <catch2/catch.hpp>

#include "../support/last_columns_model.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace specsample;

namespace {

speculative_params make_params(std::size_t n, std::size_t k, float temperature = 1.0f) {
  speculative_params p;
  p.max_new_tokens = n;
  p.draft_length = k;
  p.sampling.temperature = temperature;
  return p;
}

void check_stats_consistent(const generation_result& r, std::size_t k) {
  const auto& s = r.stats;
  CHECK(s.tokens == r.tokens.size());
  CHECK(s.accepted <= s.drafted);
  CHECK(s.tokens == s.accepted + s.corrections + s.bonus);
  CHECK(s.accepted_histogram.size() == k + 1);
  CHECK(std::accumulate(s.accepted_histogram.begin(), s.accepted_histogram.end(), std::size_t{0}) == s.rounds);
  std::size_t weighted = 0;
  for (std::size_t n = 0; n < s.accepted_histogram.size(); ++n) weighted += n * s.accepted_histogram[n];
  CHECK(weighted == s.accepted);
  CHECK(s.target_calls == s.rounds);
  CHECK(s.draft_calls == s.drafted);
  CHECK(s.acceptance_rate() >= 0.0);
  CHECK(s.acceptance_rate() <= 1.0);
  // The timings nest: prefill and decode make up the call, the models' time lies inside decode.
  CHECK(s.prefill_seconds >= 0.0);
  CHECK(s.prefill_seconds <= s.total_seconds);
  CHECK(s.draft_seconds >= 0.0);
  CHECK(s.target_seconds >= 0.0);
  CHECK(s.draft_seconds + s.target_seconds <= s.decode_seconds());
}

// A model that records nothing but delegates, to count calls; also lets tests break the contract.
struct wrong_shape_model {
  std::size_t n = 0;
  std::size_t vocab_size() const { return 4; }
  std::size_t size() const { return n; }
  Eigen::MatrixXf append(std::span<const token> t) {
    n += t.size();
    return Eigen::MatrixXf::Zero(3, static_cast<Eigen::Index>(t.size()));  // one row short
  }
  void truncate(std::size_t m) { n = m; }
};

struct fixed_logits_model {
  Eigen::VectorXf logits;
  std::size_t n = 0;
  std::size_t vocab_size() const { return static_cast<std::size_t>(logits.size()); }
  std::size_t size() const { return n; }
  Eigen::MatrixXf append(std::span<const token> t) {
    n += t.size();
    return logits.replicate(1, static_cast<Eigen::Index>(t.size()));
  }
  void truncate(std::size_t m) { n = m; }
};

struct bounded_model : toy::markov {
  using toy::markov::markov;
  explicit bounded_model(toy::markov m) : toy::markov(std::move(m)) {}
  std::size_t max_size() const { return 8; }
};

}  // namespace

TEST_CASE("greedy speculative output equals greedy autoregressive output token for token", "[loop][greedy]") {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    auto target = toy::markov::random(8, 2, seed, 0.5f);
    auto draft = toy::markov::similar_to(target, 0.5, seed + 100, 0.5f);
    const std::vector<token> prompt{static_cast<token>(seed % 8), 3};
    for (const std::size_t k : {1u, 2u, 4u, 7u}) {
      std::mt19937_64 rng_a(seed), rng_b(seed + 1);
      const auto params = make_params(40, k, 0.0f);
      const auto spec = speculative_sample(draft, target, prompt, params, rng_a);
      const auto ar = autoregressive_sample(target, prompt, params, rng_b);
      REQUIRE(spec.tokens == ar.tokens);
      check_stats_consistent(spec, k);
    }
  }
}

TEST_CASE("greedy decoding breaks ties by the lower token id", "[loop][greedy]") {
  fixed_logits_model m{Eigen::VectorXf::Constant(5, 1.0f)};
  m.logits(3) = 2.0f;
  m.logits(4) = 2.0f;
  std::mt19937 rng(1);
  const std::vector<token> prompt{0};
  const auto r = autoregressive_sample(m, prompt, make_params(3, 1, 0.0f), rng);
  CHECK(r.tokens == std::vector<token>{3, 3, 3});
}

TEST_CASE("exactly max_new_tokens tokens are emitted", "[loop][length]") {
  auto target = toy::markov::random(5, 1, 3);
  auto draft = toy::markov::similar_to(target, 0.7, 4);
  const std::vector<token> prompt{1, 2, 3};
  std::mt19937_64 rng(9);
  for (std::size_t n : {0u, 1u, 2u, 3u, 5u, 17u, 64u}) {
    for (std::size_t k : {1u, 3u, 8u}) {
      const auto r = speculative_sample(draft, target, prompt, make_params(n, k), rng);
      CHECK(r.tokens.size() == n);
      check_stats_consistent(r, k);
    }
    CHECK(autoregressive_sample(target, prompt, make_params(n, 1), rng).tokens.size() == n);
  }
}

TEST_CASE("generation stops right after emitting EOS, even inside an accepted run", "[loop][eos]") {
  // Identical draft and target accept every draft, so EOS often lands inside an accepted run.
  auto target = toy::markov::random(4, 1, 21);
  auto draft = target;  // a copy: one object cannot be both (see the aliasing test below)
  std::mt19937_64 rng(5);
  auto params = make_params(50, 6);
  params.eos = 2;
  std::size_t stopped = 0;
  for (int i = 0; i < 200; ++i) {
    const auto r = speculative_sample(draft, target, std::vector<token>{0}, params, rng);
    const auto first = std::find(r.tokens.begin(), r.tokens.end(), 2);
    if (first != r.tokens.end()) {
      CHECK(first + 1 == r.tokens.end());
      ++stopped;
    } else {
      CHECK(r.tokens.size() == 50);
    }
    check_stats_consistent(r, 6);
    // The models hold the context minus its last token, ready to continue.
    CHECK(target.size() == r.tokens.size());
  }
  CHECK(stopped > 50);  // most runs hit EOS (119 of 200 with this seed)
  const auto ar = autoregressive_sample(target, std::vector<token>{0}, params, rng);
  CHECK((ar.tokens.size() == 50 || ar.tokens.back() == 2));
}

TEST_CASE("a round's drafts end at the first EOS drafted, and an accepted EOS ends the output",
          "[loop][eos][observer]") {
  // Identical models accept every draft: an EOS drafted is accepted, and the drafts the drafter
  // proposed after it are neither verified nor counted (the output would end at the EOS).
  auto target = toy::markov::random(4, 1, 21);
  auto draft = target;
  std::mt19937_64 rng(5);
  auto params = make_params(50, 6);
  params.eos = 2;
  std::size_t cut_rounds = 0;
  for (int i = 0; i < 100; ++i) {
    std::size_t emitted_accepted = 0;
    position_acceptance positions(6);
    const auto r = speculative_sample(draft, target, std::vector<token>{0}, params, rng, [&](const round_event& e) {
      positions(e);
      std::size_t accepted = 0;
      for (const auto& d : e.drafts) accepted += d.accepted ? 1 : 0;
      CHECK(accepted == e.drafts.size());  // identical models: every draft passes
      for (std::size_t j = 0; j + 1 < e.drafts.size(); ++j) CHECK(e.drafts[j].id != 2);  // EOS only last
      if (e.eos && e.emitted.size() <= accepted) {  // the EOS was the last draft, accepted
        CHECK(e.emitted.back() == 2);
        CHECK_FALSE(e.bonus);
        ++cut_rounds;
      }
      emitted_accepted += std::min(accepted, e.emitted.size());
    });
    CHECK(r.stats.accepted == emitted_accepted);  // the statistics count only what was emitted
    CHECK(positions.reached(0) == r.stats.rounds);
    CHECK(positions.accepted(0) == positions.reached(0));  // the verifier's decisions, EOS or not
  }
  CHECK(cut_rounds > 10);
}

TEST_CASE("after a call the models hold a prefix of the context and generation can continue", "[loop][state]") {
  auto target = toy::markov::random(6, 2, 8, 0.5f);
  auto draft = toy::markov::similar_to(target, 0.5, 9, 0.5f);
  std::vector<token> prompt{1, 2};
  std::mt19937_64 rng(3);
  const auto params = make_params(30, 4, 0.0f);
  const auto first = speculative_sample(draft, target, prompt, params, rng);
  std::vector<token> full = prompt;
  full.insert(full.end(), first.tokens.begin(), first.tokens.end());
  REQUIRE(target.size() == full.size() - 1);
  CHECK(std::equal(target.context().begin(), target.context().end(), full.begin()));
  REQUIRE(draft.size() <= full.size() - 1);
  CHECK(std::equal(draft.context().begin(), draft.context().end(), full.begin()));
  // Continuing from the full context greedily = one greedy run of double length.
  const auto second = speculative_sample(draft, target, full, params, rng);
  const auto whole = autoregressive_sample(target, prompt, make_params(60, 1, 0.0f), rng);
  std::vector<token> joined = first.tokens;
  joined.insert(joined.end(), second.tokens.begin(), second.tokens.end());
  CHECK(joined == whole.tokens);
}

TEST_CASE("the observer sees every round with drafts, probabilities and emitted tokens", "[loop][observer]") {
  auto target = toy::markov::random(5, 1, 31);
  auto draft = toy::markov::similar_to(target, 0.5, 32);
  std::mt19937_64 rng(2);
  std::vector<token> streamed;
  std::size_t rounds = 0;
  const auto r = speculative_sample(draft, target, std::vector<token>{0}, make_params(25, 3), rng,
                                    [&](const round_event& e) {
                                      CHECK(e.round == rounds++);
                                      std::size_t accepted = 0;
                                      bool rejected = false;
                                      for (const auto& d : e.drafts) {
                                        CHECK(d.q > 0.0f);
                                        // p of drafts token-wise verification tested; a discarded
                                        // draft's target column is never warped
                                        if (rejected) {
                                          CHECK(std::isnan(d.p));
                                        } else {
                                          CHECK((d.p >= 0.0f && d.p <= 1.0f));
                                        }
                                        rejected = rejected || !d.accepted;
                                        if (d.accepted) ++accepted;
                                      }
                                      CHECK(e.emitted.size() == accepted + 1);
                                      CHECK(e.bonus == (accepted == e.drafts.size()));
                                      streamed.insert(streamed.end(), e.emitted.begin(), e.emitted.end());
                                    });
  CHECK(streamed == r.tokens);
  CHECK(rounds == r.stats.rounds);
}

TEST_CASE("bad parameters and inputs are reported with a specsample::error naming the problem", "[loop][errors]") {
  auto target = toy::markov::random(5, 1, 1);
  auto draft = toy::markov::random(5, 1, 2);
  const std::vector<token> prompt{0};
  std::mt19937_64 rng(1);
  using Catch::Matchers::Contains;

  auto other = toy::markov::random(6, 1, 3);
  CHECK_THROWS_WITH(speculative_sample(other, target, prompt, make_params(4, 2), rng),
                    Contains("draft has 6 tokens") && Contains("target has 5"));
  CHECK_THROWS_WITH(speculative_sample(draft, target, prompt, make_params(4, 0), rng), Contains("draft_length"));
  CHECK(speculative_sample(draft, target, prompt, make_params(4, max_draft_length), rng).tokens.size() == 4);
  for (const std::size_t k : {max_draft_length + 1, std::numeric_limits<std::size_t>::max()}) {
    CHECK_THROWS_WITH(speculative_sample(draft, target, prompt, make_params(4, k), rng),
                      Contains("draft_length must be in 1..256") && Contains(std::to_string(k)));
  }
  // A parameter out of its domain is a parameter_error: the field, and what is wrong with it.
  try {
    validate(make_params(4, 0), 5);
    FAIL("draft_length 0 was accepted");
  } catch (const parameter_error& e) {
    CHECK(e.field() == "speculative_params.draft_length");
    CHECK(e.reason() == " must be in 1..256 (the draft proposes K tokens per round), got 0");
    CHECK(std::string(e.what()) == std::string(e.field()) + std::string(e.reason()));
  }
  // Every field validate refuses, so.
  const auto refused_field = [](const speculative_params& bad) -> std::string {
    try {
      validate(bad, 5);
    } catch (const parameter_error& e) {
      CHECK(std::string(e.what()) == std::string(e.field()) + std::string(e.reason()));
      return std::string(e.field());
    }
    return "(accepted)";
  };
  const auto with = [](auto change) {
    speculative_params p = make_params(4, 2);
    change(p);
    return p;
  };
  const std::pair<speculative_params, std::string> cases[] = {
      {with([](auto& p) { p.sampling.temperature = -1.0f; }), "speculative_params.sampling.temperature"},
      {with([](auto& p) { p.sampling.top_k = -1; }), "speculative_params.sampling.top_k"},
      {with([](auto& p) { p.sampling.top_p = 0.0f; }), "speculative_params.sampling.top_p"},
      {with([](auto& p) { p.sampling.min_p = 1.0f; }), "speculative_params.sampling.min_p"},
      {with([](auto& p) { p.draft_sampling = p.sampling, p.draft_sampling->top_p = 2.0f; }),
       "speculative_params.draft_sampling.top_p"},
      {with([](auto& p) { p.draft_min_probability = 1.0f; }), "speculative_params.draft_min_probability"},
      {with([](auto& p) { p.verify = static_cast<verification>(2); }), "speculative_params.verify"},
      {with([](auto& p) { p.leniency = 0.0; }), "speculative_params.leniency"},
      {with([](auto& p) { p.leniency = 0.5, p.verify = verification::block; }), "speculative_params.leniency"},
      {with([](auto& p) { p.eos = 5; }), "speculative_params.eos"}};
  for (const auto& [bad, field] : cases) CHECK(refused_field(bad) == field);
  const Eigen::MatrixXf half = Eigen::MatrixXf::Constant(2, 2, 0.5f);
  CHECK_THROWS_AS(tokenwise_verifier{0.0}(std::vector<token>{0}, half, half, rng), parameter_error);
  CHECK_THROWS_WITH(speculative_sample(draft, target, prompt, make_params(4, 2, -1.0f), rng), Contains("temperature"));
  CHECK_THROWS_WITH(autoregressive_sample(target, prompt, make_params(4, 2, std::nanf("")), rng),
                    Contains("temperature"));
  auto p = make_params(4, 2);
  p.sampling.top_p = 0.0f;
  CHECK_THROWS_WITH(speculative_sample(draft, target, prompt, p, rng), Contains("top_p"));
  p.sampling.top_p = 1.5f;
  CHECK_THROWS_WITH(speculative_sample(draft, target, prompt, p, rng), Contains("top_p"));
  p = make_params(4, 2);
  p.sampling.min_p = 1.0f;
  CHECK_THROWS_WITH(speculative_sample(draft, target, prompt, p, rng), Contains("min_p"));
  p.sampling.min_p = -0.1f;
  CHECK_THROWS_WITH(speculative_sample(draft, target, prompt, p, rng), Contains("min_p"));
  p = make_params(4, 2);
  p.sampling.top_k = -1;
  CHECK_THROWS_WITH(speculative_sample(draft, target, prompt, p, rng), Contains("top_k"));
  p = make_params(4, 2);
  p.verify = static_cast<verification>(2);  // (an integer cast to it ran as block verification)
  CHECK_THROWS_WITH(speculative_sample(draft, target, prompt, p, rng),
                    "speculative_params.verify must be verification::token_wise or verification::block, not "
                    "verification(2)");
  p = make_params(4, 2);
  p.eos = 5;
  CHECK_THROWS_WITH(speculative_sample(draft, target, prompt, p, rng), Contains("eos"));
  CHECK_THROWS_WITH(autoregressive_sample(target, prompt, p, rng), Contains("eos"));
  CHECK_THROWS_WITH(speculative_sample(draft, target, std::vector<token>{}, make_params(4, 2), rng),
                    Contains("prompt is empty"));
  CHECK_THROWS_WITH(speculative_sample(draft, target, std::vector<token>{0, 5}, make_params(4, 2), rng),
                    Contains("prompt token 5 at position 1") && Contains("vocabulary of 5"));
  CHECK_THROWS_WITH(autoregressive_sample(target, std::vector<token>{-1}, make_params(4, 2), rng),
                    Contains("prompt token -1"));
}

TEST_CASE("a model that breaks its contract is reported, not trusted", "[loop][errors]") {
  std::mt19937_64 rng(1);
  using Catch::Matchers::Contains;
  const std::vector<token> prompt{0};
  wrong_shape_model bad;
  CHECK_THROWS_WITH(autoregressive_sample(bad, prompt, make_params(3, 1), rng),
                    Contains("logits of shape (3, 1)") && Contains("expected (4, 1)"));

  fixed_logits_model nan_model{Eigen::VectorXf::Zero(4)};
  nan_model.logits(2) = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(autoregressive_sample(nan_model, prompt, make_params(3, 1), rng), Contains("NaN at token id 2"));
  CHECK_THROWS_WITH(autoregressive_sample(nan_model, prompt, make_params(3, 1, 0.0f), rng), Contains("NaN"));

  fixed_logits_model inf_model{Eigen::VectorXf::Zero(4)};
  inf_model.logits(1) = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH(autoregressive_sample(inf_model, prompt, make_params(3, 1), rng), Contains("+inf at token id 1"));
  CHECK_THROWS_WITH(autoregressive_sample(inf_model, prompt, make_params(3, 1, 0.0f), rng), Contains("+inf"));

  fixed_logits_model dead{Eigen::VectorXf::Constant(4, -std::numeric_limits<float>::infinity())};
  CHECK_THROWS_WITH(autoregressive_sample(dead, prompt, make_params(3, 1), rng), Contains("-inf for every token"));
  CHECK_THROWS_WITH(autoregressive_sample(dead, prompt, make_params(3, 1, 0.0f), rng), Contains("-inf for every token"));

  // -inf alone is a legitimate zero probability.
  fixed_logits_model masked{Eigen::VectorXf::Constant(4, -std::numeric_limits<float>::infinity())};
  masked.logits(1) = 0.0f;
  CHECK(autoregressive_sample(masked, prompt, make_params(3, 1), rng).tokens == std::vector<token>{1, 1, 1});
}

TEST_CASE("a model whose truncate keeps other than n tokens is named, as target, as draft and when enumerated",
          "[loop][errors]") {
  struct keeps_everything : toy::markov {  // truncate does nothing
    explicit keeps_everything(toy::markov m) : toy::markov(std::move(m)) {}
    void truncate(std::size_t) {}
  };
  using Catch::Matchers::Contains;
  auto target = toy::markov::random(4, 1, 21);
  auto draft = toy::markov::similar_to(target, 0.5, 22);
  const std::vector<token> prompt{1};
  const auto params = make_params(30, 4);  // (rejections early in a round: the draft holds tokens to drop)
  std::mt19937_64 rng(5);
  keeps_everything bad_target(target), bad_draft(draft), enumerated(target);
  CHECK_THROWS_WITH(speculative_sample(draft, bad_target, prompt, params, rng),
                    Contains("target model reports size() = ") && Contains(" after truncate(") &&
                        Contains("truncate(n) must keep exactly the first n tokens of the context"));
  CHECK_THROWS_WITH(speculative_sample(bad_draft, target, prompt, params, rng),
                    Contains("draft model reports size() = ") && Contains(" after truncate("));
  CHECK_THROWS_WITH(testing::exact_sequences(enumerated, prompt, 3, {}),
                    Contains("enumerated model reports size() = 3 after truncate(2)"));
}

TEST_CASE("a model with append(t, n) is asked only for the logits the loop reads", "[loop]") {
  using test::last_columns_model;
  last_columns_model target{toy::markov::random(6, 1, 1), {}}, draft{toy::markov::random(6, 1, 2), {}};
  auto plain_target = toy::markov::random(6, 1, 1), plain_draft = toy::markov::random(6, 1, 2);
  const std::vector<token> prompt{0, 3, 1};
  for (const std::size_t k : {1u, 3u}) {
    target.asked.clear();
    draft.asked.clear();
    std::mt19937_64 a(5), b(5);
    const auto r = speculative_sample(draft, target, prompt, make_params(20, k), a);
    CHECK(r.tokens == speculative_sample(plain_draft, plain_target, prompt, make_params(20, k), b).tokens);
    REQUIRE(target.asked.size() == 1 + r.stats.target_calls);
    CHECK(target.asked[0] == 0);  // the prompt's prefill
    // Each round's drafts and one more (k shrinks near max_new_tokens).
    CHECK(std::all_of(target.asked.begin() + 1, target.asked.end(), [&](std::size_t n) { return n >= 1 && n <= k + 1; }));
    CHECK(std::accumulate(target.asked.begin(), target.asked.end(), std::size_t{0}) == r.stats.rounds + r.stats.drafted);
    REQUIRE(draft.asked.size() == 1 + r.stats.draft_calls);
    CHECK(draft.asked[0] == 0);
    CHECK(std::all_of(draft.asked.begin() + 1, draft.asked.end(), [](std::size_t n) { return n == 1; }));
  }
  std::mt19937_64 rng(1);
  target.extra = 1;  // a column more than asked for
  CHECK_THROWS_WITH(autoregressive_sample(target, prompt, make_params(3, 1), rng),
                    Catch::Matchers::Contains("logits of shape (6, 1) for 2 tokens") &&
                        Catch::Matchers::Contains("expected (6, 0)"));
}

namespace {
// A drafter of the caller's over a vocabulary of 4 that proposes token 0 everywhere but at draft 1
// (`second`), each from q = 1/4 everywhere but at row 3 of the last draft's column (`last_q`).
struct scripted_drafter {
  token second = 0;
  float last_q = 0.25f;
  std::size_t vocab_size() const { return 4; }
  void begin(std::span<const token>) {}
  void sync(std::span<const token>) {}
  proposal propose(std::span<const token>, std::size_t k, Eigen::Ref<Eigen::MatrixXf> q, std::span<token> out,
                   std::mt19937_64&) {
    q.setConstant(0.25f);
    q(3, static_cast<Eigen::Index>(k) - 1) = last_q;
    for (std::size_t i = 0; i < k; ++i) out[i] = i == 1 ? second : token{0};
    return {k, 0, 0.0};
  }
};
}  // namespace

TEST_CASE("a drafter's out-of-range token is reported before the target sees it", "[loop][errors]") {
  // The target counts what it is shown: nothing out of range may reach it.
  struct checking_target : toy::markov {
    explicit checking_target(toy::markov m) : toy::markov(std::move(m)) {}
    Eigen::MatrixXf append(std::span<const token> t) {
      for (const token x : t) REQUIRE(x < 4);
      return toy::markov::append(t);
    }
  };
  scripted_drafter drafter{.second = 1000000};  // a token the vocabulary does not have
  checking_target target(toy::markov::random(4, 1, 1));
  std::mt19937_64 rng(1);
  CHECK_THROWS_WITH(speculative_sample(drafter, target, std::vector<token>{0}, make_params(4, 3), rng),
                    Catch::Matchers::Contains("drafter proposed token 1000000 (draft 1 of 3)") &&
                        Catch::Matchers::Contains("vocabulary of 4"));
}

TEST_CASE("a drafter's q with a NaN, infinite or negative entry away from its drafts is reported before the "
          "target sees the round",
          "[loop][errors]") {
  // Such an entry would count as 0 in the residual's sums: a token drawn from garbage. The
  // library's drafters write the warper's distributions (or one-hot ones) and are not checked.
  static_assert(!detail::writes_distributions<scripted_drafter>);
  static_assert(detail::writes_distributions<model_drafter<toy::markov>>);
  static_assert(detail::writes_distributions<drafters::ngram>);
  static_assert(detail::writes_distributions<drafters::fallback<drafters::ngram, model_drafter<toy::markov>>>);
  static_assert(!detail::writes_distributions<drafters::fallback<drafters::ngram, scripted_drafter>>);
  struct counting_target : toy::markov {
    explicit counting_target(toy::markov m) : toy::markov(std::move(m)) {}
    int calls = 0;
    Eigen::MatrixXf append(std::span<const token> t) {
      ++calls;
      return toy::markov::append(t);
    }
  };
  const std::string rule = "; q must hold distributions (every entry finite and >= 0)";
  for (const float bad : {std::nanf(""), -0.25f, std::numeric_limits<float>::infinity()}) {
    scripted_drafter drafter{.last_q = bad};  // in the last draft's column, away from its token 0
    counting_target target(toy::markov::random(4, 1, 1));
    std::mt19937_64 rng(1);
    CHECK_THROWS_WITH(speculative_sample(drafter, target, std::vector<token>{0}, make_params(4, 3), rng),
                      fmt::format("drafter: q(3, 2) = {}", bad) + rule);
    CHECK(target.calls == 0);  // (a 1-token prompt's last token goes into the round's call, never made)
  }
  scripted_drafter fine;
  toy::markov target = toy::markov::random(4, 1, 1);
  std::mt19937_64 rng(2);
  CHECK_NOTHROW(speculative_sample(fine, target, std::vector<token>{0}, make_params(4, 3), rng));
}

TEST_CASE("a drafter's q column that does not sum to 1 is reported before the target sees the round",
          "[loop][errors]") {
  // Unnormalised weights pass the entry check, but the drafts were not drawn from them: the
  // output would not be the target's distribution.
  toy::markov model = toy::markov::random(4, 1, 1);
  for (const float last : {0.5f, 0.0f, 0.2485f}) {  // column 2 sums to 1.25, 0.75, 0.9985
    scripted_drafter drafter{.last_q = last};
    toy::markov target = model;
    std::mt19937_64 rng(1);
    CHECK_THROWS_WITH(speculative_sample(drafter, target, std::vector<token>{0}, make_params(4, 3), rng),
                      Catch::Matchers::StartsWith(fmt::format("drafter: column 2 of q sums to {:.7g}; q must hold "
                                                              "distributions (entries summing to 1 within 0.001)",
                                                              0.75 + static_cast<double>(last))));
    CHECK(target.size() == 0);  // never called
  }
  scripted_drafter near{.last_q = 0.2495f};  // 0.9995: within the tolerance
  toy::markov target = model;
  std::mt19937_64 rng(1);
  CHECK_NOTHROW(speculative_sample(near, target, std::vector<token>{0}, make_params(4, 3), rng));
}

TEST_CASE("a huge max_new_tokens with EOS generates up to the EOS", "[loop][eos]") {
  // A model without a context limit: max_new_tokens is only a cap, and room for it is not reserved.
  auto target = toy::markov::random(5, 1, 1);
  auto draft = toy::markov::random(5, 1, 2);
  std::mt19937_64 rng(3);
  for (const std::size_t n : {std::size_t{100'000'000'000}, std::numeric_limits<std::size_t>::max()}) {
    auto p = make_params(n, 3);
    p.eos = 4;
    for (const std::vector<token>& prompt : {std::vector<token>{0}, std::vector<token>{0, 1, 2}}) {
      const auto r = speculative_sample(draft, target, prompt, p, rng);
      REQUIRE(!r.tokens.empty());
      CHECK(r.tokens.back() == 4);
      CHECK(autoregressive_sample(target, prompt, p, rng).tokens.back() == 4);
    }
  }
}

TEST_CASE("a context that cannot hold the generation is refused up front", "[loop][errors][context]") {
  bounded_model target(toy::markov::random(4, 1, 1));
  bounded_model draft(toy::markov::random(4, 1, 2));
  std::mt19937_64 rng(1);
  using Catch::Matchers::Contains;
  using Catch::Matchers::Equals;
  // The models hold prompt + max_new_tokens - 1 tokens at most: 3 + 6 - 1 = 8 fits, 3 + 7 - 1 does not.
  const std::vector<token> prompt{0, 1, 2};
  CHECK(speculative_sample(draft, target, prompt, make_params(6, 4), rng).tokens.size() == 6);
  CHECK(target.size() <= 8);
  CHECK(max_new_tokens_within(8, 3) == 6);  // what a program can check first
  CHECK(max_new_tokens_within(8, 8) == 1);
  CHECK(max_new_tokens_within(8, 9) == 0);
  CHECK(draft_max_new_tokens_within(8, 3) == 7);  // a draft model holds one fewer: 3 + 7 - 2 = 8
  CHECK(draft_max_new_tokens_within(8, 9) == 1);  // (the prompt but its last token: 8, and no round drafts)
  CHECK(draft_max_new_tokens_within(8, 10) == 0);
  CHECK(draft_max_new_tokens_within(std::numeric_limits<std::size_t>::max(), 1) == std::numeric_limits<std::size_t>::max());
  // Which model binds: the one leaving the shortest longest prompt, the target on a tie.
  constexpr std::size_t unlimited = std::numeric_limits<std::size_t>::max();
  const std::vector<std::size_t> drafts{300, 64, 63 + 1, unlimited};
  const context_binding short_draft = binding_context(256, drafts);
  CHECK(short_draft.draft == std::optional<std::size_t>(1));  // (the first of the two of 64)
  CHECK(short_draft.holds == 64);
  CHECK(short_draft.longest_prompt() == 65);
  CHECK(short_draft.new_tokens_within(2) == 64);
  CHECK(short_draft.new_tokens_within(66) == 0);
  const std::vector<std::size_t> one_shorter{255};  // a draft of one position fewer leaves as long a prompt
  CHECK_FALSE(binding_context(256, one_shorter).draft);
  CHECK(binding_context(256, one_shorter).new_tokens_within(2) == 255);
  CHECK_FALSE(binding_context(256, {}).draft);
  CHECK(binding_context(0, one_shorter).holds == 0);  // (no wrap below a target of no positions)
  const std::vector<std::size_t> none{unlimited};
  CHECK_FALSE(binding_context(unlimited, none).draft);
  CHECK_THROWS_WITH(speculative_sample(draft, target, prompt, make_params(7, 4), rng),
                    Equals("context overflow: a prompt of 3 tokens plus max_new_tokens = 7 needs a context of 9 "
                           "tokens (the last new token is never fed to a model), but the target model holds at most 8"));
  toy::markov unbounded = toy::markov::random(4, 1, 2);
  CHECK_THROWS_WITH(speculative_sample(unbounded, target, prompt, make_params(7, 4), rng), Contains("target model"));
  // A drafter over a bounded model is held to its model's context too (it would append past it),
  // alone and inside a fallback behind a model-free drafter. A draft model never holds the last two
  // new tokens: 3 + 7 - 2 = 8 fits its 8, 3 + 8 - 2 does not.
  toy::markov unbounded_target = toy::markov::random(4, 1, 1);
  const auto params = make_params(8, 4);
  model_drafter<bounded_model> drafter(draft, params.draft_warping());
  CHECK(drafter.max_size() == 8);
  CHECK_THROWS_WITH(speculative_sample(drafter, unbounded_target, prompt, params, rng),
                    Equals("context overflow: a prompt of 3 tokens plus max_new_tokens = 8 needs a context of 9 "
                           "tokens (a draft model is never fed the last two new tokens), but the draft model holds at "
                           "most 8"));
  drafters::fallback both(drafters::ngram(4, 2), model_drafter<bounded_model>(draft, params.draft_warping()));
  CHECK(both.max_size() == 8);
  CHECK_THROWS_WITH(speculative_sample(both, unbounded_target, prompt, params, rng),
                    Contains("the draft model holds at most 8"));
  CHECK(speculative_sample(both, unbounded_target, prompt, make_params(7, 4), rng).tokens.size() == 7);
}

TEST_CASE("a draft model holds at most prompt + max_new_tokens - 2 tokens", "[loop][context]") {
  // The bound the up-front check holds a draft to, watched over many generations: every K, greedy
  // and sampled, through a plain model drafter and one behind prompt lookup.
  struct watched_model : toy::markov {
    explicit watched_model(toy::markov m) : toy::markov(std::move(m)) {}
    std::size_t most = 0;
    Eigen::MatrixXf append(std::span<const token> t) {
      Eigen::MatrixXf logits = toy::markov::append(t);
      most = std::max(most, size());
      return logits;
    }
  };
  const auto target = toy::markov::random(4, 1, 5);
  const std::vector<token> prompt{0, 1, 2};
  std::mt19937_64 rng(11);
  std::size_t most = 0;
  for (const std::size_t max_new : {1u, 2u, 3u, 7u, 20u}) {
    for (const std::size_t k : {1u, 2u, 4u, 8u}) {
      for (const float temperature : {0.0f, 1.0f}) {
        for (int run = 0; run < 20; ++run) {
          CAPTURE(max_new, k, temperature);
          const auto params = make_params(max_new, k, temperature);
          auto t = target;
          watched_model draft(toy::markov::similar_to(target, 0.8, 6));
          (void)speculative_sample(draft, t, prompt, params, rng);
          drafters::fallback both(drafters::ngram(4, 1), model_drafter<watched_model>(draft, params.draft_warping()));
          auto t2 = target;
          (void)speculative_sample(both, t2, prompt, params, rng);
          CHECK(draft.most <= prompt.size() + max_new - 2);  // (prompt - 1 for max_new_tokens = 1: no round drafts)
          most = std::max(most, draft.most);
        }
      }
    }
  }
  CHECK(most == prompt.size() + 20 - 2);  // reached
}

namespace {
// A drafter that proposes nothing and records the longest context it was asked to draft from.
struct recording_drafter {
  std::size_t vocab = 0, most = 0, calls = 0;
  [[nodiscard]] std::size_t vocab_size() const noexcept { return vocab; }
  void begin(std::span<const token>) {}
  template <class Rng>
  proposal propose(std::span<const token> ctx, std::size_t, Eigen::Ref<Eigen::MatrixXf>, std::span<token>, Rng&) {
    most = std::max(most, ctx.size());
    ++calls;
    return {};
  }
  void sync(std::span<const token>) {}
};
}  // namespace

TEST_CASE("a drafter is asked to propose from at most longest_drafting_context tokens, and from that many",
          "[loop][context]") {
  // Every round emits one token (no proposal), so the rounds start at every context from the prompt
  // on, and the last one that drafts shows the bound reached.
  const auto target = toy::markov::random(4, 1, 5);
  const std::vector<token> prompt{0, 1, 2};
  std::mt19937_64 rng(3);
  for (const std::size_t max_new : {1u, 2u, 3u, 9u}) {
    CAPTURE(max_new);
    recording_drafter d{target.vocab_size()};
    auto t = target;
    (void)speculative_sample(d, t, prompt, make_params(max_new, 4), rng);
    CHECK(d.calls == (max_new < 2 ? 0 : max_new - 1));
    CHECK(d.most == longest_drafting_context(prompt.size(), max_new));  // 0 where no round drafts
  }
  CHECK(longest_drafting_context(5, std::numeric_limits<std::size_t>::max()) == std::numeric_limits<std::size_t>::max());
}

TEST_CASE("one object as both draft and target is refused, not read out of bounds", "[loop][errors]") {
  using Catch::Matchers::Contains;
  auto model = toy::markov::random(4, 1, 21);
  std::mt19937_64 rng(5);
  CHECK_THROWS_WITH(speculative_sample(model, model, std::vector<token>{0}, make_params(8, 3), rng),
                    Contains("same model object"));
  // The same aliasing hidden inside a custom drafter is caught when the round is scored.
  model_drafter<toy::markov> shared(model, sampling_params{});
  CHECK_THROWS_WITH(speculative_sample(shared, model, std::vector<token>{0}, make_params(8, 3), rng),
                    Contains("does the drafter share the target's model object"));
  auto copy = model;
  CHECK(speculative_sample(copy, model, std::vector<token>{0}, make_params(8, 3), rng).tokens.size() == 8);
}

TEST_CASE("an empty prompt is named as such, before any context check", "[loop][errors][context]") {
  bounded_model target(toy::markov::random(4, 1, 1));
  bounded_model draft(toy::markov::random(4, 1, 2));
  std::mt19937_64 rng(1);
  using Catch::Matchers::Contains;
  const std::vector<token> empty;
  // prompt + max_new_tokens - 1 would wrap to SIZE_MAX here and read as a context overflow.
  for (const std::size_t max_new : {std::size_t{0}, std::size_t{1}, std::size_t{100}}) {
    CAPTURE(max_new);
    CHECK_THROWS_WITH(speculative_sample(draft, target, empty, make_params(max_new, 2), rng),
                      Contains("prompt is empty"));
    CHECK_THROWS_WITH(autoregressive_sample(target, empty, make_params(max_new, 2), rng),
                      Contains("prompt is empty"));
  }
  // A max_new_tokens whose sum with the prompt wraps is an overflow, not a fit.
  const std::vector<token> prompt{0, 1, 2};
  CHECK_THROWS_WITH(speculative_sample(draft, target, prompt, make_params(std::numeric_limits<std::size_t>::max(), 2), rng),
                    Contains("context overflow") && Contains("more than"));
}

TEST_CASE("max_new_tokens = SIZE_MAX without an EOS is refused where no context limit would stop it", "[loop][errors]") {
  // SIZE_MAX means "stop at EOS only": a target without max_size() and no eos would generate until
  // memory ran out. With an eos it runs (and stops there); a bounded target reports the overflow.
  const auto target = toy::markov::random(4, 1, 1), draft = toy::markov::random(4, 1, 2);
  std::mt19937_64 rng(1);
  const std::vector<token> prompt{0};
  auto params = make_params(std::numeric_limits<std::size_t>::max(), 2);
  using Catch::Matchers::Contains;
  auto t = target, d = draft;
  CHECK_THROWS_WITH(speculative_sample(d, t, prompt, params, rng),
                    Contains("speculative_params.max_new_tokens = SIZE_MAX caps nothing") && Contains("never end"));
  CHECK_THROWS_AS(autoregressive_sample(t, prompt, params, rng), parameter_error);
  params.eos = 3;
  const auto spec = speculative_sample(d, t, prompt, params, rng);
  REQUIRE(!spec.tokens.empty());
  CHECK(spec.tokens.back() == 3);
  CHECK(autoregressive_sample(t, prompt, params, rng).tokens.back() == 3);
  params.eos.reset();
  bounded_model bounded(target), bounded_draft(draft);
  CHECK_THROWS_WITH(speculative_sample(bounded_draft, bounded, prompt, params, rng), Contains("context overflow"));
}

TEST_CASE("a model reporting a vocabulary size of 0, a negative one or one past int32 ids is refused", "[loop][errors]") {
  struct odd_vocab : toy::markov {
    odd_vocab(toy::markov m, long long v) : toy::markov(std::move(m)), v(v) {}
    long long v;
    long long vocab_size() const { return v; }
  };
  using Catch::Matchers::Contains;
  const auto good = toy::markov::random(4, 1, 1);
  std::mt19937_64 rng(1);
  const std::vector<token> prompt{0};
  for (const long long v : {0LL, -1LL, (1LL << 31) + 1}) {
    odd_vocab odd(good, v);
    toy::markov other = good;
    INFO("vocab_size() = " << v);
    CHECK_THROWS_WITH(autoregressive_sample(odd, prompt, make_params(4, 2), rng),
                      Contains(fmt::format("target model reports vocab_size() = {}; it must be in 1..2147483648", v)));
    CHECK_THROWS_WITH(speculative_sample(odd, other, prompt, make_params(4, 2), rng),
                      Contains(fmt::format("draft model reports vocab_size() = {}", v)));
  }
}

namespace {
// A built-in verifier seen only through operator(): the loop warps every target column before
// calling it, as for any custom verifier.
template <class V>
struct whole_columns {
  V inner;
  template <class Rng>
  verify_result operator()(std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q,
                           const Eigen::Ref<const Eigen::MatrixXf>& p, Rng& rng) const {
    return inner(drafts, q, p, rng);
  }
};

// A class derived from a built-in verifier that overrides its operator(): it must be called.
struct counting_verifier : tokenwise_verifier {
  std::size_t* calls = nullptr;
  template <class Rng>
  verify_result operator()(std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q,
                           const Eigen::Ref<const Eigen::MatrixXf>& p, Rng& rng) const {
    ++*calls;
    return tokenwise_verifier::operator()(drafts, q, p, rng);
  }
};

// The wrapped model with NaN in the last column of every call that scores more than one token.
struct nan_last_column_model {
  toy::markov inner;
  std::size_t vocab_size() const { return inner.vocab_size(); }
  std::size_t size() const { return inner.size(); }
  Eigen::MatrixXf append(std::span<const token> t) {
    Eigen::MatrixXf logits = inner.append(t);
    if (t.size() > 1) logits(0, logits.cols() - 1) = std::numeric_limits<float>::quiet_NaN();
    return logits;
  }
  void truncate(std::size_t m) { inner.truncate(m); }
};
}  // namespace

TEST_CASE("broken logits name the model they came from", "[loop][errors]") {
  struct nan_model : toy::markov {  // a NaN for token 2 in every column
    explicit nan_model(toy::markov m) : toy::markov(std::move(m)) {}
    Eigen::MatrixXf append(std::span<const token> t) {
      Eigen::MatrixXf logits = toy::markov::append(t);
      logits.row(2).setConstant(std::numeric_limits<float>::quiet_NaN());
      return logits;
    }
  };
  using Catch::Matchers::StartsWith;
  const auto base = toy::markov::random(5, 1, 81);
  const std::vector<token> prompt{0, 1};
  std::mt19937_64 rng(1);
  toy::markov good = base, good_target = base;
  nan_model bad_target(base), bad_draft(base), alone(base);
  CHECK_THROWS_WITH(speculative_sample(good, bad_target, prompt, make_params(4, 2), rng),
                    StartsWith("target model's logits contain NaN at token id 2"));
  CHECK_THROWS_WITH(speculative_sample(bad_draft, good_target, prompt, make_params(4, 2), rng),
                    StartsWith("draft model's logits contain NaN at token id 2"));
  CHECK_THROWS_WITH(autoregressive_sample(alone, prompt, make_params(4, 2), rng),
                    StartsWith("target model's logits contain NaN at token id 2"));
}

TEST_CASE("an error a model's append throws names the model's role", "[loop][errors]") {
  // Two models of one type (two GPT-2 checkpoints, say): an overflowed forward pass must say
  // which of them failed. An error of a derived type passes through as it is (a parameter_error's
  // field names it; a model's own type is caught as such).
  struct failing_model : toy::markov {  // throws once its context would hold `at` tokens
    failing_model(toy::markov m, std::size_t fail_at) : toy::markov(std::move(m)), at(fail_at) {}
    std::size_t at;
    Eigen::MatrixXf append(std::span<const token> t) {
      if (size() + t.size() >= at) throw error("the forward pass overflowed");
      return toy::markov::append(t);
    }
  };
  const auto base = toy::markov::random(5, 1, 81);
  const std::vector<token> prompt{0, 1};
  std::mt19937_64 rng(1);
  toy::markov good = base, good_target = base;
  failing_model bad_target(base, 4), bad_draft(base, 4), alone(base, 4);
  CHECK_THROWS_WITH(speculative_sample(good, bad_target, prompt, make_params(4, 8), rng),
                    "target model: the forward pass overflowed");
  CHECK_THROWS_WITH(speculative_sample(bad_draft, good_target, prompt, make_params(4, 8), rng),
                    "draft model: the forward pass overflowed");
  CHECK_THROWS_WITH(autoregressive_sample(alone, prompt, make_params(4, 8), rng),
                    "target model: the forward pass overflowed");
  struct parameter_model : toy::markov {
    explicit parameter_model(toy::markov m) : toy::markov(std::move(m)) {}
    Eigen::MatrixXf append(std::span<const token>) { throw parameter_error("my_model.scale", " must be > 0"); }
  };
  parameter_model p(base);
  CHECK_THROWS_AS(autoregressive_sample(p, prompt, make_params(4, 8), rng), parameter_error);
  CHECK_THROWS_WITH(autoregressive_sample(p, prompt, make_params(4, 8), rng), "my_model.scale must be > 0");
  // So does an error of the model's own type: a handler of that type still catches it.
  struct model_error : error {
    using error::error;
  };
  struct own_error_model : toy::markov {
    explicit own_error_model(toy::markov m) : toy::markov(std::move(m)) {}
    Eigen::MatrixXf append(std::span<const token>) { throw model_error("out of memory on the device"); }
  };
  own_error_model own(base);
  CHECK_THROWS_AS(autoregressive_sample(own, prompt, make_params(4, 8), rng), model_error);
  CHECK_THROWS_WITH(autoregressive_sample(own, prompt, make_params(4, 8), rng), "out of memory on the device");
}

TEST_CASE("warping target columns as the verifier reads them decides exactly as warping them all",
          "[loop][verify]") {
  auto target = toy::markov::random(40, 2, 51);
  auto draft = toy::markov::similar_to(target, 0.6, 52);
  const std::vector<token> prompt{3, 7};
  struct variant {
    float temperature;
    int top_k;
    float top_p, min_p;
    bool eos, adaptive;
  };
  const variant variants[] = {{0.0f, 0, 1.0f, 0.0f, false, false}, {1.0f, 0, 1.0f, 0.0f, false, false},
                              {0.7f, 12, 1.0f, 0.0f, false, false}, {1.0f, 0, 0.8f, 0.0f, true, false},
                              {1.3f, 0, 1.0f, 0.05f, false, true}};
  for (const variant& v : variants) {
    for (const std::size_t k : {1u, 4u, 7u}) {
      auto params = make_params(60, k, v.temperature);
      params.sampling.top_k = v.top_k;
      params.sampling.top_p = v.top_p;
      params.sampling.min_p = v.min_p;
      if (v.eos) params.eos = 5;
      params.adaptive_draft_length = v.adaptive;
      std::size_t skipped_tokenwise = 0;
      for (std::uint64_t seed = 0; seed < 6; ++seed) {
        const auto compare = [&](auto lazy, auto whole) {
          std::mt19937_64 a(seed), b(seed);
          std::vector<draft_event> seen_lazy, seen_whole;
          std::size_t unscored = 0;
          const auto r1 = speculative_sample(draft, target, prompt, params, a, [&](const round_event& e) {
            seen_lazy.insert(seen_lazy.end(), e.drafts.begin(), e.drafts.end());
          }, lazy);
          const auto r2 = speculative_sample(draft, target, prompt, params, b, [&](const round_event& e) {
            seen_whole.insert(seen_whole.end(), e.drafts.begin(), e.drafts.end());
            // Every column warped for a verifier given them whole, but those after a draft the
            // warped target gives probability 0 (unreachable: the uniform placeholder).
            bool reachable = true;
            for (const draft_event& d : e.drafts) {
              CHECK(std::isnan(d.p) == !reachable);
              reachable = reachable && d.p > 0.0f;
            }
          }, whole);
          CHECK(r1.tokens == r2.tokens);
          CHECK(r1.stats.accepted_histogram == r2.stats.accepted_histogram);
          CHECK(r1.stats.drafted == r2.stats.drafted);
          CHECK(r1.stats.accepted == r2.stats.accepted);
          CHECK(r1.stats.corrections == r2.stats.corrections);
          CHECK(r1.stats.bonus == r2.stats.bonus);
          CHECK(a() == b());  // the same random numbers were drawn
          REQUIRE(seen_lazy.size() == seen_whole.size());
          for (std::size_t i = 0; i < seen_lazy.size(); ++i) {
            const draft_event& l = seen_lazy[i];
            const draft_event& w = seen_whole[i];
            CHECK((l.id == w.id && l.q == w.q && l.accepted == w.accepted));
            if (std::isnan(w.p)) {
              CHECK(std::isnan(l.p));  // unreachable: read by neither
            } else if (std::isnan(l.p)) {
              ++unscored;
            } else {
              CHECK(l.p == w.p);  // a scored column is the whole warp's, bit for bit
            }
          }
          return unscored;
        };
        INFO("T = " << v.temperature << ", top_k " << v.top_k << ", top_p " << v.top_p << ", min_p " << v.min_p
                    << ", K = " << k << ", seed " << seed);
        skipped_tokenwise += compare(tokenwise_verifier{}, whole_columns<tokenwise_verifier>{});
        (void)compare(block_verifier{}, whole_columns<block_verifier>{});
      }
      // Token-wise verification does skip reachable columns (at T = 0 a rejected draft has
      // probability 0: the columns after it are unreachable, read by neither).
      if (k > 1 && v.temperature > 0.0f) CHECK(skipped_tokenwise > 0);
    }
  }
}

TEST_CASE("a verifier derived from a built-in one is called through its own operator()", "[loop][verify]") {
  auto target = toy::markov::random(20, 1, 61);
  auto draft = toy::markov::similar_to(target, 0.5, 62);
  std::size_t calls = 0;
  counting_verifier v;
  v.calls = &calls;
  std::mt19937_64 rng(1);
  const auto r = speculative_sample(draft, target, std::vector<token>{0}, make_params(30, 3), rng, no_observer{}, v);
  CHECK(calls == r.stats.rounds);
}

TEST_CASE("a verifier whose bonus flag contradicts its count of accepted drafts is refused", "[loop][verify][errors]") {
  // The statistics (bonus against corrections) and the observer's round events take the flag as
  // given: a bonus after a rejection, or a correction after every draft passed, is a broken verifier.
  using Catch::Matchers::Contains;
  auto target = toy::markov::random(20, 1, 63);
  auto draft = toy::markov::similar_to(target, 0.5, 64);
  for (const bool reject : {true, false}) {
    INFO((reject ? "bonus after a rejection" : "no bonus after every draft passed"));
    const auto lying = [reject](std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>&,
                                const Eigen::Ref<const Eigen::MatrixXf>&, std::mt19937_64&) {
      return reject ? verify_result{0, 1, true} : verify_result{drafts.size(), 1, false};
    };
    std::mt19937_64 rng(1);
    CHECK_THROWS_WITH(speculative_sample(draft, target, std::vector<token>{0}, make_params(30, 3), rng, no_observer{},
                                         lying),
                      Contains(reject ? "verifier returned 0 accepted of 3 drafts with bonus = true"
                                      : "verifier returned 3 accepted of 3 drafts with bonus = false") &&
                          Contains("the bonus exactly when every draft passed"));
  }
}

TEST_CASE("NaN logits are an error in every target column, read by the verifier or not", "[loop][verify]") {
  // The one verification call (5 tokens: one round) carries a NaN in its last column, which a
  // round that rejects a draft before it never warps: the check of the unwarped columns must still
  // find it.
  using Catch::Matchers::Contains;
  auto inner = toy::markov::random(20, 1, 71);
  auto draft = toy::markov::similar_to(inner, 0.3, 72);
  for (const auto rule : {verification::token_wise, verification::block}) {
    for (std::uint64_t seed = 0; seed < 10; ++seed) {
      nan_last_column_model target{inner};
      auto params = make_params(5, 4);
      params.verify = rule;
      std::mt19937_64 rng(seed);
      CHECK_THROWS_WITH(speculative_sample(draft, target, std::vector<token>{0}, params, rng),
                        Contains("logits contain NaN at token id 0"));
    }
  }
}

namespace {

// A toy target over 4 tokens: `logits` in every context until `stop` appears in it (at position
// `from` or later), every logit `after` from then on: a grammar mask that allows nothing more.
toy::callable_model<std::function<Eigen::VectorXf(std::span<const token>)>> stopping_target(
    Eigen::Vector4f logits, token stop, float after, std::size_t from = 0) {
  return {4, [=](std::span<const token> ctx) {
            const auto seen = ctx.subspan(std::min(from, ctx.size()));
            Eigen::VectorXf l = logits;
            if (std::find(seen.begin(), seen.end(), stop) != seen.end()) l.setConstant(after);
            return l;
          }};
}

}  // namespace

TEST_CASE("a target that allows nothing after a token it never produces samples as autoregressive does",
          "[loop][verify][exactness]") {
  // A grammar mask's target: token 3 is -inf everywhere, and after a 3 no continuation is allowed
  // (every logit -inf), or the model's logits there are garbage (NaN). Autoregressive sampling
  // never goes there; a draft proposes 3 often, and the target scores the contexts after it in the
  // same call. Those columns are neither checked nor given to a verifier as distributions
  // (`detail::lazy_columns`): no error, and the output is exact. Before, every such round threw
  // "target model's logits are -inf for every token".
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  for (const float after_3 : {ninf, std::numeric_limits<float>::quiet_NaN()}) {
    INFO("logits after a 3: " << after_3);
    auto target = stopping_target({0.0f, 0.5f, 1.0f, ninf}, 3, after_3);
    toy::callable_model draft(4, [](std::span<const token>) { return Eigen::VectorXf::Zero(4).eval(); });
    const auto by_operator = [](std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q,
                                const Eigen::Ref<const Eigen::MatrixXf>& p, std::mt19937_64& rng) {
      return verify_tokenwise(drafts, q, p, rng);  // a verifier seen through operator() only
    };
    auto params = make_params(3, 2);
    const std::vector<token> prompt{0};
    for (const auto rule : {verification::token_wise, verification::block}) {
      params.verify = rule;
      std::mt19937_64 rng(7);
      const auto fit = testing::speculative_fit(draft, target, prompt, params, 100'000, rng,
                                                testing::verifier_from_params{});
      INFO("rule " << verification_name(rule) << ": X2 = " << fit.statistic << ", dof = " << fit.dof
                   << ", p = " << fit.p_value << ", drafted " << fit.drafted << ", rejected " << fit.rejected);
      CHECK(fit.impossible == 0);
      CHECK(fit.p_value > 1e-3);
      CHECK(fit.rejected > 10'000);  // the 3s, and more
    }
    std::mt19937_64 rng(8);
    const auto custom = testing::speculative_fit(draft, target, prompt, params, 100'000, rng, by_operator);
    INFO("verifier through operator(): X2 = " << custom.statistic << ", dof = " << custom.dof << ", p = "
                                               << custom.p_value);
    CHECK(custom.impossible == 0);
    CHECK(custom.p_value > 1e-3);
    // Longer generations, both rules: no error, no 3.
    params = make_params(40, 4);
    for (const auto rule : {verification::token_wise, verification::block}) {
      params.verify = rule;
      std::mt19937_64 gen(9);
      const auto r = speculative_sample(draft, target, prompt, params, gen);
      CHECK(r.tokens.size() == 40);
      CHECK(std::find(r.tokens.begin(), r.tokens.end(), token{3}) == r.tokens.end());
    }
  }
  // A NaN in a column the target can reach is still an error ("NaN logits are an error in every
  // target column" above).
}

TEST_CASE("a target that allows nothing after a token its warping cuts samples as autoregressive does",
          "[loop][verify][exactness]") {
  // Token 3's logit is finite but low: top-k 3, top-p 0.9, min-p 0.5 and T = 0 give it probability
  // 0, and after a 3 the target allows nothing. A draft sampling at plain T = 1 proposes 3 a
  // quarter of the time. The columns after it are unreachable (`detail::lazy_columns`): before,
  // every round that drafted a 3 threw "target model's logits are -inf for every token".
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  auto target = stopping_target({0.0f, 0.5f, 1.0f, -5.0f}, 3, ninf);
  toy::callable_model draft(4, [](std::span<const token>) { return Eigen::VectorXf::Zero(4).eval(); });
  const std::vector<token> prompt{0};
  for (int warping = 0; warping < 4; ++warping) {
    auto params = make_params(3, 2);
    params.draft_sampling = sampling_params{};
    const char* names[] = {"top_k 3", "top_p 0.9", "min_p 0.5", "T = 0"};
    INFO("target warping: " << names[warping]);
    if (warping == 0) params.sampling.top_k = 3;
    if (warping == 1) params.sampling.top_p = 0.9f;
    if (warping == 2) params.sampling.min_p = 0.5f;
    if (warping == 3) params.sampling.temperature = 0.0f;
    for (const auto rule : {verification::token_wise, verification::block}) {
      params.verify = rule;
      INFO("rule " << verification_name(rule));
      if (warping == 3) {  // one sequence: the same tokens as autoregressive sampling
        std::mt19937_64 a(5), b(5);
        auto long_params = params;
        long_params.max_new_tokens = 40;
        long_params.draft_length = 4;
        CHECK(speculative_sample(draft, target, prompt, long_params, a).tokens ==
              autoregressive_sample(target, prompt, long_params, b).tokens);
        continue;
      }
      std::mt19937_64 rng(11);
      const auto fit = testing::speculative_fit(draft, target, prompt, params, 30'000, rng);
      INFO("X2 = " << fit.statistic << ", dof = " << fit.dof << ", p = " << fit.p_value << ", rejected "
                   << fit.rejected);
      CHECK(fit.impossible == 0);
      CHECK(fit.p_value > 1e-3);
      CHECK(fit.rejected > 5'000);
    }
  }
}

TEST_CASE("a target that allows nothing after EOS samples as autoregressive does", "[loop][verify][exactness]") {
  // A finished grammar: after EOS (token 3) every logit is -inf. The output ends at EOS, so the
  // columns after a drafted EOS are unreachable; before, every round that drafted it threw.
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  auto target = stopping_target({0.0f, 0.5f, 1.0f, -0.5f}, 3, ninf, 1);  // (the prompt's own EOS aside)
  toy::callable_model draft(4, [](std::span<const token>) { return Eigen::VectorXf::Zero(4).eval(); });
  const std::vector<token> prompt{3};
  auto params = make_params(3, 2);
  params.eos = 3;
  const auto by_operator = [](std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q,
                              const Eigen::Ref<const Eigen::MatrixXf>& p, std::mt19937_64& rng) {
    return block_verifier{}(drafts, q, p, rng);  // a verifier seen through operator() only
  };
  for (const auto rule : {verification::token_wise, verification::block}) {
    params.verify = rule;
    std::mt19937_64 rng(12);
    const auto fit = testing::speculative_fit(draft, target, prompt, params, 30'000, rng);
    INFO("rule " << verification_name(rule) << ": X2 = " << fit.statistic << ", dof = " << fit.dof
                 << ", p = " << fit.p_value);
    CHECK(fit.impossible == 0);
    CHECK(fit.p_value > 1e-3);
  }
  std::mt19937_64 rng(13);
  const auto custom = testing::speculative_fit(draft, target, prompt, params, 30'000, rng, by_operator);
  INFO("verifier through operator(): X2 = " << custom.statistic << ", p = " << custom.p_value);
  CHECK(custom.impossible == 0);
  CHECK(custom.p_value > 1e-3);
}

TEST_CASE("a verifier that accepts a draft of probability 0, or returns a next token of probability 0, is refused",
          "[loop][verify][errors]") {
  // Token 3 is -inf everywhere; the contexts after a 3 are unreachable, given to a verifier seen
  // through operator() as the uniform distribution, which an exact rule never reads.
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  auto target = stopping_target({0.0f, 0.5f, 1.0f, ninf}, 3, ninf);
  toy::callable_model draft(4, [](std::span<const token> ctx) {
    Eigen::VectorXf l = Eigen::VectorXf::Constant(4, -std::numeric_limits<float>::infinity());
    l(ctx.size() == 1 ? 3 : 0) = 0.0f;  // the first draft is always 3
    return l;
  });
  const std::vector<token> prompt{0};
  const auto params = make_params(5, 2);
  const auto accept_all = [](std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>&,
                             const Eigen::Ref<const Eigen::MatrixXf>&, std::mt19937_64&) {
    return verify_result{drafts.size(), 0, true};
  };
  std::mt19937_64 rng(14);
  CHECK_THROWS_WITH(speculative_sample(draft, target, prompt, params, rng, no_observer{}, accept_all),
                    Catch::Contains("verifier accepted draft 0 (token 3), which the target gives probability 0"));
  const auto next_3 = [](std::span<const token>, const Eigen::Ref<const Eigen::MatrixXf>&,
                         const Eigen::Ref<const Eigen::MatrixXf>&, std::mt19937_64&) {
    return verify_result{0, 3, false};
  };
  CHECK_THROWS_WITH(speculative_sample(draft, target, prompt, params, rng, no_observer{}, next_3),
                    Catch::Contains("verifier returned next token 3 after 0 accepted drafts, which the target gives "
                                    "probability 0 there"));
  // The exact rule, through operator(), runs.
  const auto by_operator = [](std::span<const token> drafts, const Eigen::Ref<const Eigen::MatrixXf>& q,
                              const Eigen::Ref<const Eigen::MatrixXf>& p, std::mt19937_64& g) {
    return verify_tokenwise(drafts, q, p, g);
  };
  CHECK(speculative_sample(draft, target, prompt, params, rng, no_observer{}, by_operator).tokens.size() == 5);
}

namespace {

// A drafter of the caller's: draws its draft from qt = (0.9999, 0.0001) and reports q = qt × 0.9991,
// a sum within distribution_tolerance(2) = 1e-3 of 1.
struct scaled_q_drafter {
  [[nodiscard]] std::size_t vocab_size() const { return 2; }
  void begin(std::span<const token>) {}
  void sync(std::span<const token>) {}
  template <std::uniform_random_bit_generator Rng>
  proposal propose(std::span<const token>, std::size_t k, Eigen::Ref<Eigen::MatrixXf> q, std::span<token> out,
                   Rng& rng) {
    for (std::size_t i = 0; i < k; ++i) {
      out[i] = std::bernoulli_distribution(1e-4)(rng) ? 1 : 0;
      q.col(static_cast<Eigen::Index>(i)) << 0.9999f * 0.9991f, 1e-4f * 0.9991f;
    }
    return {k, 0, 0.0};
  }
};
static_assert(drafter<scaled_q_drafter>);

}  // namespace

TEST_CASE("a drafter's q within the tolerance of 1 is normalised before it is used", "[loop][drafters][exactness]") {
  // Target: token 1 with probability 0.002 first, then 0.5. Used as given, q = qt × 0.9991 makes
  // every rejection of a 0 resample a 1, and P(first token 1) = 1 - 0.998 / 0.9991 = 0.0011, not
  // 0.002: the loop now divides each column of a caller's drafter's q by its sum.
  toy::callable_model target(2, [](std::span<const token> ctx) {
    Eigen::VectorXf l(2);
    if (ctx.size() == 1) {
      l << 0.0f, std::log(0.002f / 0.998f);
    } else {
      l << 0.0f, 0.0f;
    }
    return l;
  });
  scaled_q_drafter drafter;
  const std::vector<token> prompt{0};
  const auto params = make_params(2, 1);
  std::mt19937_64 rng(15);
  const auto fit = testing::speculative_fit(drafter, target, prompt, params, 150'000, rng);
  INFO("X2 = " << fit.statistic << ", dof = " << fit.dof << ", p = " << fit.p_value);
  CHECK(fit.impossible == 0);
  CHECK(fit.p_value > 1e-3);
}
