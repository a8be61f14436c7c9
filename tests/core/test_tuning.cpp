#include <specsample/drafters/fallback.hpp>
#include <specsample/drafters/ngram.hpp>
#include <specsample/sampling/tuning.hpp>
#include <specsample/toy.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>

using namespace specsample;

namespace {
// A toy model whose context holds at most `limit` tokens.
struct bounded_markov : toy::markov {
  bounded_markov(toy::markov m, std::size_t limit) : toy::markov(std::move(m)), limit(limit) {}
  std::size_t limit;
  std::size_t max_size() const { return limit; }
};

// A toy model that records the size of every `append` call.
struct recording_markov : toy::markov {
  explicit recording_markov(toy::markov m) : toy::markov(std::move(m)) {}
  std::vector<std::size_t> calls;
  Eigen::MatrixXf append(std::span<const token> t) {
    calls.push_back(t.size());
    return toy::markov::append(t);
  }
};

// Simulated time: what the calls of the models below cost, and nothing else. The library times a
// model's calls on the model's `clock` (docs/models.md, item 7), so the tuning functions measure
// these costs exactly, whatever else the machine runs: no sleeps, no margins for late wake-ups.
struct simulated_clock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<simulated_clock>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept { return time_point(elapsed); }
  static inline duration elapsed{0};
};

// A toy model whose every `append` call also costs `delay` of simulated time once a context holds
// `from` tokens: a call that costs the same for one token or several (a model bound by reading its
// weights), and one whose cost can change with the context, so that calls timed at a short
// context mislead.
struct slow_markov : toy::markov {
  using clock = simulated_clock;
  slow_markov(toy::markov m, std::chrono::microseconds delay, std::size_t from = 0)
      : toy::markov(std::move(m)), delay(delay), from(from) {}
  std::chrono::microseconds delay;
  std::size_t from;
  Eigen::MatrixXf append(std::span<const token> t) {
    if (size() + t.size() >= from) simulated_clock::elapsed += delay;
    return toy::markov::append(t);
  }
};
}  // namespace

TEST_CASE("the performance model matches its closed form", "[tuning]") {
  // (1 - a^(K+1)) / ((1 - a)(cK + 1))
  for (const double a : {0.3, 0.64, 0.9}) {
    for (const std::size_t k : {1u, 4u, 8u}) {
      const double closed = (1 - std::pow(a, double(k) + 1)) / ((1 - a) * (0.075 * double(k) + 1));
      CHECK(predicted_speedup(a, 0.075, k) == Approx(closed));
    }
  }
  // The reference figures: alpha 0.637 (greedy) with c = 0.075 predicts 1.90 at K = 4.
  CHECK(predicted_speedup(0.637, 0.075, 4) == Approx(1.90).margin(0.01));
  const std::vector<double> a(8, 0.637);
  CHECK(best_draft_length(a, 0.075, 8) == 4);
  const std::vector<double> perfect(8, 1.0);
  CHECK(best_draft_length(perfect, 0.0, 8) == 8);
  const std::vector<double> hopeless(8, 0.0);
  CHECK(best_draft_length(hopeless, 0.1, 8) == 1);
  // A compute-bound target whose (K+1)-token call costs 1 + 0.4 K: shorter drafts win.
  std::vector<double> verify{1.0};
  for (int k = 1; k <= 8; ++k) verify.push_back(1.0 + 0.4 * k);
  CHECK(best_draft_length(a, 0.075, 8, verify) < 4);
  CHECK(predicted_speedup(a, 0.075, 4, verify) == Approx(expected_tokens_per_round(a, 4) / (0.3 + 2.6)));
  // A negative or non-finite cost is refused, not turned into a negative or NaN speedup.
  using Catch::Matchers::Contains;
  for (const double c : {-1.0, std::nan(""), HUGE_VAL}) {
    CHECK_THROWS_WITH(predicted_speedup(0.6, c, 4), Contains("cost ratio c must be finite and >= 0"));
  }
  // So is an acceptance rate outside [0, 1], at K = 0 too, where no position reads it (it returned 1).
  for (const double alpha : {-0.1, 1.5, std::nan("")}) {
    for (const std::size_t k : {0u, 4u}) {
      CHECK_THROWS_WITH(predicted_speedup(alpha, 0.1, k), Contains("acceptance rate α must be in [0, 1], got"));
    }
  }
  // Costs measured up to K = 3 say nothing of K = 4..8: refused, not taken as free (best K was 6).
  const std::vector<double> short_verify(verify.begin(), verify.begin() + 4);
  CHECK_THROWS_WITH(predicted_speedup(a, 0.075, 4, short_verify),
                    "predicted_speedup: verify_cost holds the costs of K = 0..3, not of K = 4");
  CHECK_THROWS_WITH(best_draft_length(a, 0.075, 8, short_verify),
                    "predicted_speedup: verify_cost holds the costs of K = 0..3, not of K = 4");
  CHECK(best_draft_length(a, 0.075, 3, short_verify) == best_draft_length(a, 0.075, 3, verify));
  verify[4] = 0.0;
  CHECK_THROWS_WITH(predicted_speedup(a, 0.075, 4, verify), Contains("verification cost v[4]"));
  // best_draft_length checks its inputs even when there is no choice to make (k_max = 1).
  CHECK_THROWS_WITH(best_draft_length(a, std::nan(""), 1), Contains("cost ratio c must be finite and >= 0"));
  CHECK_THROWS_WITH(best_draft_length(a, 0.075, 0), Contains("k_max must be >= 1"));
  // An acceptance rate outside [0, 1] is refused wherever it is read (past the end: the last rate).
  for (const double bad : {-0.1, 1.5, std::nan("")}) {
    std::vector<double> rates(3, 0.6);
    rates[2] = bad;
    CHECK(expected_tokens_per_round(rates, 2) == Approx(1 + 0.6 + 0.36));
    CHECK_THROWS_WITH(expected_tokens_per_round(rates, 3), Contains("draft position 2 must be in [0, 1]"));
    CHECK_THROWS_WITH(best_draft_length(rates, 0.075, 5), Contains("draft position 2 must be in [0, 1]"));
  }
}

TEST_CASE("position acceptance counts each position only when it was reached", "[tuning]") {
  position_acceptance pa(3);
  const std::vector<draft_event> round1{{1, 0.5f, 0.5f, true}, {2, 0.5f, 0.1f, false}, {3, 0.5f, 0.5f, false}};
  const std::vector<draft_event> round2{{1, 0.5f, 0.5f, true}, {2, 0.5f, 0.5f, true}, {3, 0.5f, 0.5f, true}};
  pa(round_event{0, round1, {}, false, false});
  pa(round_event{1, round2, {}, true, false});
  const auto r = pa.rates();
  CHECK(r[0] == 1.0);
  CHECK(r[1] == 0.5);
  CHECK(r[2] == 1.0);
  CHECK(pa.reached(2) == 1);
  CHECK(pa.accepted(1) == 1);
  CHECK(pa.accepted(2) == 1);
  CHECK_THROWS_WITH(pa.reached(3), "position_acceptance: position 3 is past the 3 positions tracked");
  CHECK_THROWS_WITH(pa.accepted(3), "position_acceptance: position 3 is past the 3 positions tracked");
}

TEST_CASE("calibration picks a longer draft for a better draft model", "[tuning]") {
  auto target = toy::markov::random(8, 1, 1, 0.3f);
  auto good = toy::markov::similar_to(target, 0.95, 2, 0.3f);
  auto poor = toy::markov::similar_to(target, 0.05, 3, 0.3f);
  const std::vector<token> prompt{0, 1};
  speculative_params params;
  std::mt19937_64 rng(1);
  const auto g = calibrate(good, target, prompt, params, rng, 8, 400, 0);  // (untimed: acceptance and K only)
  const auto p = calibrate(poor, target, prompt, params, rng, 8, 400);
  INFO("good: alpha0 " << g.acceptance[0] << " K " << g.best_k << "; poor: alpha0 " << p.acceptance[0] << " K "
                       << p.best_k);
  CHECK(g.acceptance[0] > p.acceptance[0]);
  CHECK(g.cost_ratio > 0.0);  // toy models cost about the same, so c is near 1 and K = 1 wins here
  CHECK(g.first_cost_ratio > 0.0);
  CHECK(g.best_k == best_draft_length(g.acceptance, g.cost_ratio, 8, g.round_cost()));
  CHECK(g.predicted == predicted_speedup(g.acceptance, g.cost_ratio, g.best_k, g.round_cost()));
  REQUIRE(g.verify_cost.size() == 9);
  CHECK(g.verify_cost[0] == 1.0);
  // A round's first draft call is charged at first_cost_ratio, the others at cost_ratio.
  const auto round = g.round_cost();
  REQUIRE(round.size() == 9);
  CHECK_THROWS_WITH(detail::cost_ratios(good, target, prompt, 8, 0),
                    "cost_ratios: reps must be >= 1 (every ratio is a median over reps rounds)");  // (all NaN)
  CHECK_THROWS_WITH(detail::cost_ratios(good, target, std::span<const token>(), 8),
                    "cost_ratios: the context must hold at least one token");
  {  // A model failing in a timed call is named by its role, as in the sampling loops.
    struct failing_markov : toy::markov {  // fails from its second append on (the first: the prefill)
      explicit failing_markov(toy::markov m) : toy::markov(std::move(m)) {}
      std::size_t appends = 0;
      Eigen::MatrixXf append(std::span<const token> t) {
        if (++appends > 1) throw error("the forward pass overflowed");
        return toy::markov::append(t);
      }
    };
    failing_markov bad_target(target), bad_draft(good);
    CHECK_THROWS_WITH(detail::cost_ratios(good, bad_target, prompt, 8), "target model: the forward pass overflowed");
    CHECK_THROWS_WITH(detail::cost_ratios(bad_draft, target, prompt, 8), "draft model: the forward pass overflowed");
  }
  for (const double bad : {std::nan(""), -1.0, std::numeric_limits<double>::infinity()}) {  // (a NaN read as 0)
    calibration b = g;
    b.first_cost_ratio = bad;
    CHECK_THROWS_WITH(b.round_cost(), fmt::format("calibration.first_cost_ratio must be finite and >= 0, got {}", bad));
    b = g;
    b.cost_ratio = bad;
    CHECK_THROWS_WITH(b.round_cost(), fmt::format("calibration.cost_ratio must be finite and >= 0, got {}", bad));
    CHECK_THROWS_AS(b.round_cost(), specsample::parameter_error);
  }
  CHECK(round[0] == 1.0);
  for (std::size_t k = 1; k < 9; ++k) {
    CHECK(g.cost_ratio * double(k) + round[k] ==
          Approx(std::max(g.first_cost_ratio, g.cost_ratio) + g.cost_ratio * double(k - 1) + g.verify_cost[k]));
  }
  // Timings, so only their sanity is a test (which is larger depends on the machine's load).
  for (const double v : g.verify_cost) CHECK((std::isfinite(v) && v > 0.0));
  // With a cheap draft (c = 0.05), the measured acceptance asks for a longer K from the good draft.
  CHECK(best_draft_length(g.acceptance, 0.05, 8) > best_draft_length(p.acceptance, 0.05, 8));
  // A draft that costs about what the target costs and is poorly accepted (~1.4 tokens per
  // round for ~2 calls' worth of time) cannot pay.
  CHECK(p.predicted <= 1.0);
  CHECK_FALSE(p.measured);  // a prediction that does not pay is not checked
  CHECK_FALSE(p.pays());
}

TEST_CASE("a calibration of models whose calls read 0 s on their clock takes verification at one token's "
          "cost",
          "[tuning]") {
  // Every call of both models costs no simulated time: the (K+1)-token call read 0 s and was
  // divided by the single token's floor of 1 ns, v = 0, which calibrate then refused in
  // predicted_speedup's words ("the verification cost v[1] must be finite and > 0").
  slow_markov target(toy::markov::random(8, 1, 1, 0.3f), std::chrono::microseconds(0));
  slow_markov draft(toy::markov::similar_to(target, 0.9, 2, 0.3f), std::chrono::microseconds(0));
  const std::vector<token> prompt{0, 1};
  speculative_params params;
  std::mt19937_64 rng(1);
  const auto cal = calibrate(draft, target, prompt, params, rng, 4, 100, 0);
  REQUIRE(cal.verify_cost.size() == 5);
  for (const double v : cal.verify_cost) CHECK(v == 1.0);
  CHECK(cal.cost_ratio == 0.0);
}

TEST_CASE("a calibration charges a round's first draft call apart", "[tuning]") {
  calibration c;
  c.cost_ratio = 0.08;
  c.first_cost_ratio = 0.2;  // the first draft call of a round follows a target call
  c.verify_cost = {1.0, 1.1, 1.2};
  const auto round = c.round_cost();
  REQUIRE(round.size() == 3);
  CHECK(round[0] == 1.0);  // K = 0: no draft call
  CHECK(round[1] == Approx(1.1 + 0.12));
  CHECK(round[2] == Approx(1.2 + 0.12));
  c.first_cost_ratio = 0.05;  // never charged below cost_ratio
  CHECK(c.round_cost() == c.verify_cost);
}

TEST_CASE("a calibration pays only when its best K is predicted to beat autoregressive decoding",
          "[tuning]") {
  // The bundled pair's acceptance on a CPU whose 2-token target call costs 1.7 single-token calls
  // (AVX2 kernels on this project's machine): no K pays.
  const std::vector<double> a(8, 0.62);
  std::vector<double> dear{1.0}, cheap{1.0};
  for (int k = 1; k <= 8; ++k) {
    dear.push_back(1.0 + 0.7 * k);
    cheap.push_back(1.0 + 0.1 * k);
  }
  for (const auto& [verify, pays] : {std::pair{&dear, false}, std::pair{&cheap, true}}) {
    calibration c;
    c.acceptance = a;
    c.cost_ratio = 0.08;
    c.verify_cost = *verify;
    c.best_k = best_draft_length(a, c.cost_ratio, 8, *verify);
    c.predicted = predicted_speedup(a, c.cost_ratio, c.best_k, *verify);
    INFO("best K " << c.best_k << ", predicted " << c.predicted);
    CHECK(c.pays() == pays);
  }
}

TEST_CASE("the loop times each model's calls on the model's clock", "[tuning]") {
  using namespace std::chrono_literals;
  // A 1 ms target and a 250 us draft equal to it, greedy, K = 4: every draft passes. The prompt's
  // prefill is one call of each model; then 20 tokens in four rounds of four draft calls (the
  // first catching the draft up on the last round's final draft and bonus token) and one 5-token
  // target call. All of it simulated time: the statistics come out exact.
  const auto markov = toy::markov::random(8, 1, 1, 0.3f);
  slow_markov target(markov, 1ms), draft(markov, 250us);
  speculative_params params;
  params.sampling.temperature = 0.0f;
  params.draft_length = 4;
  params.max_new_tokens = 20;
  const std::vector<token> prompt{0, 1, 2};
  std::mt19937_64 rng(1);
  const generation_stats spec = speculative_sample(draft, target, prompt, params, rng).stats;
  REQUIRE(spec.tokens == 20);
  CHECK(spec.target_calls == 4);
  CHECK(spec.draft_calls == 16);
  CHECK(spec.prefill_seconds == Approx(1.25e-3));
  CHECK(spec.target_seconds == Approx(4e-3));
  CHECK(spec.draft_seconds == Approx(4e-3));
  CHECK(spec.decode_seconds() == Approx(8e-3));
  CHECK(spec.overhead_seconds() == Approx(0.0).margin(1e-12));
  const generation_stats ar = autoregressive_sample(target, prompt, params, rng).stats;
  CHECK(ar.target_calls == 20);
  CHECK(ar.prefill_seconds == Approx(1e-3));
  CHECK(ar.target_seconds == Approx(20e-3));
  CHECK(ar.decode_seconds() == Approx(20e-3));
}

TEST_CASE("measure_speedup times speculation against autoregressive decoding in pairs", "[tuning]") {
  using namespace std::chrono_literals;
  // A target call costs 1 ms of simulated time whatever it holds. A free draft equal to the
  // target passes every draft at T = 0: 20 tokens in four 5-token target calls against twenty
  // single tokens, 5x at K = 4. A poor draft that costs as much as the target: rounds of four
  // draft calls and one target call that mostly keep one token, 20 tokens in 90 ms of calls.
  const auto markov = toy::markov::random(8, 1, 1, 0.3f);
  slow_markov target(markov, 1ms), free_copy(markov, 0us), poor(toy::markov::similar_to(markov, 0.05, 3, 0.3f), 1ms);
  speculative_params params;
  params.sampling.temperature = 0.0f;
  params.draft_length = 4;
  const std::vector<std::vector<token>> prompts{{0, 1}, {5}};
  std::mt19937_64 rng(3);
  const auto fast = measure_speedup(free_copy, target, std::span<const std::vector<token>>(prompts), params, rng, 3, 20);
  CHECK(fast.draft_length == 4);
  REQUIRE(fast.pairs.size() == 3);
  for (const auto& p : fast.pairs) CHECK(p.tokens == 20);
  INFO("free draft " << fast.speedup());
  CHECK(fast.speedup() == Approx(5.0));
  const auto slow = measure_speedup(poor, target, std::span<const std::vector<token>>(prompts), params, rng, 3, 20);
  INFO("dear, poor draft " << slow.speedup());
  CHECK(slow.speedup() == Approx(20.0 / 90.0));
  double ar = 0, spec = 0;
  for (const auto& p : fast.pairs) {
    ar += p.autoregressive_seconds;
    spec += p.speculative_seconds;
  }
  CHECK(fast.speedup() == ar / spec);
  CHECK(fast.median_ratio() == detail::median(fast.ratios()));
  CHECK(std::isnan(speedup_measurement{}.speedup()));
  CHECK(std::isnan(speedup_measurement{}.median_ratio()));
  // What it cannot measure, by name.
  using Catch::Matchers::Contains;
  const std::vector<std::vector<token>> none;
  CHECK_THROWS_WITH(measure_speedup(free_copy, target, std::span<const std::vector<token>>(none), params, rng),
                    Contains("measure_speedup: no prompts"));
  CHECK_THROWS_WITH(measure_speedup(free_copy, target, std::span<const std::vector<token>>(prompts), params, rng, 0),
                    Contains("pairs must be >= 1"));
  CHECK_THROWS_WITH(measure_speedup(free_copy, target, std::span<const std::vector<token>>(prompts), params, rng, 3, 1),
                    Contains("tokens must be >= 2"));
  bounded_markov small_target(markov, 4), small_draft(markov, 4);
  const std::vector<std::vector<token>> full{{0, 1, 2, 3}};  // room for one token: no round with a draft
  CHECK_THROWS_WITH(measure_speedup(small_draft, small_target, std::span<const std::vector<token>>(full), params, rng),
                    Contains("no prompt leaves the models' contexts room for two tokens"));
  const std::vector<std::vector<token>> empty_prompt{{0}, {}};
  CHECK_THROWS_WITH(measure_speedup(free_copy, target, std::span<const std::vector<token>>(empty_prompt), params, rng),
                    Contains("prompt is empty"));
  params.draft_length = 0;  // refused before anything is timed
  CHECK_THROWS_WITH(measure_speedup(free_copy, target, std::span<const std::vector<token>>(prompts), params, rng),
                    Contains("draft_length must be in 1.."));
}

TEST_CASE("calibration checks a prediction that pays by timing it, and pays only if both do", "[tuning]") {
  using namespace std::chrono_literals;
  const auto markov = toy::markov::random(8, 1, 1, 0.3f);
  speculative_params params;
  params.sampling.temperature = 0.0f;
  const std::vector<std::vector<token>> prompts{{0, 1}};
  {  // A free draft equal to a 1 ms target: predicted and measured well above 1.
    slow_markov target(markov, 1ms), draft(markov, 0us);
    std::mt19937_64 rng(1);
    const auto c = calibrate(draft, target, std::span<const std::vector<token>>(prompts), params, rng, 4, 24, 3);
    INFO("predicted " << c.predicted);
    CHECK(c.predicted == Approx(5.0));  // every draft passes at K = 4, the draft's calls free
    REQUIRE(c.measured);
    CHECK(c.measured->draft_length == c.best_k);
    CHECK(c.measured->pairs.size() == 3);
    INFO("measured " << c.measured->speedup());
    CHECK(c.measured->speedup() == Approx(4.8));  // 24 tokens in 4 target calls of 5 and one of 4
    CHECK(c.pays());
  }
  {  // The same draft turns dear past the prompt: timed at the prompt it looks free (predicted
     // > 1), inside the loop each draft call costs 3 ms against the target's 1 ms. The check
     // catches what the prediction missed.
    slow_markov target(markov, 1ms), draft(markov, 3ms, 3);
    std::mt19937_64 rng(1);
    const auto c = calibrate(draft, target, std::span<const std::vector<token>>(prompts), params, rng, 4, 24, 3);
    INFO("predicted " << c.predicted << " at K = " << c.best_k);
    CHECK(c.predicted > 1.0);
    REQUIRE(c.measured);
    INFO("measured " << c.measured->speedup());
    CHECK(c.measured->speedup() == Approx(24.0 / 59.0));  // 59 ms of calls for 24 tokens
    CHECK_FALSE(c.pays());
    // Without the check, the prediction alone decides; the caller's generator advances the same.
    std::mt19937_64 a(1), b(1);
    const auto unchecked = calibrate(draft, target, std::span<const std::vector<token>>(prompts), params, a, 4, 24, 0);
    CHECK_FALSE(unchecked.measured);
    CHECK(unchecked.pays());
    (void)calibrate(draft, target, std::span<const std::vector<token>>(prompts), params, b, 4, 24, 3);
    CHECK(a() == b());
  }
  // A prediction that does not pay is not checked.
  calibration c;
  c.predicted = 0.9;
  CHECK_FALSE(c.pays());
  c.predicted = 1.3;
  CHECK(c.pays());
  // Pooled, not the median of the pairs: two pairs at 1.25x and one at 0.5x over as many tokens
  // (median 1.25x) decode 96 tokens in 2.4 s speculatively against 2.0 s autoregressively.
  c.measured = speedup_measurement{2, {{32, 0.5, 0.4}, {32, 0.5, 1.0}, {32, 1.0, 0.8}}};
  CHECK(c.measured->median_ratio() == Approx(1.25));
  CHECK(c.measured->speedup() == Approx(2.0 / 2.2));
  CHECK_FALSE(c.pays());
  c.measured->pairs[1].speculative_seconds = 0.45;
  CHECK(c.measured->speedup() == Approx(2.0 / 1.65));
  CHECK(c.pays());
}

TEST_CASE("a calibration at a fixed K predicts that K, and check_prediction times it", "[tuning]") {
  using Catch::Matchers::Contains;
  calibration c;
  c.acceptance = {0.8, 0.7, 0.6};
  c.cost_ratio = 0.05;
  c.first_cost_ratio = 0.1;
  c.verify_cost = {1.0, 1.05, 1.1, 1.3};  // measured up to k_max = 3
  c.best_k = best_draft_length(c.acceptance, c.cost_ratio, 3, c.round_cost());
  c.predicted = predicted_speedup(c.acceptance, c.cost_ratio, c.best_k, c.round_cost());
  c.measured = speedup_measurement{c.best_k, {{16, 1.5, 1.0}}};
  for (std::size_t k = 1; k <= 3; ++k) {
    const calibration f = c.at(k);
    CHECK(f.best_k == k);
    CHECK(f.predicted == predicted_speedup(c.acceptance, c.cost_ratio, k, c.round_cost()));
    CHECK_FALSE(f.measured);  // it timed another K, or this one: either way not the caller's check
    CHECK(f.acceptance == c.acceptance);
    CHECK(f.verify_cost == c.verify_cost);
  }
  CHECK(c.at(c.best_k).predicted == c.predicted);
  CHECK(c.at(1).predicted != c.at(3).predicted);
  CHECK_THROWS_WITH(c.at(0), Contains("calibration::at: K = 0 is outside 1..3"));
  CHECK_THROWS_WITH(c.at(4), Contains("K = 4 is outside 1..3, the draft lengths whose verification cost the calibration covers"));
  CHECK_THROWS_WITH(calibration{}.at(1), Contains("calibration::at: the calibration measured no verification cost"));

  using namespace std::chrono_literals;
  const auto markov = toy::markov::random(8, 1, 1, 0.3f);
  slow_markov target(markov, 1ms), draft(markov, 0us);  // a free identical draft of a 1 ms target
  speculative_params params;
  params.sampling.temperature = 0.0f;  // (draft_length 4: the check times best_k, not this)
  const std::vector<std::vector<token>> prompts{{0, 1}};
  const auto span = std::span<const std::vector<token>>(prompts);
  std::mt19937_64 rng(1);
  const calibration cal = calibrate(draft, target, span, params, rng, 4, 24, 0);
  CHECK_FALSE(cal.measured);
  calibration two = cal.at(2);
  check_prediction(two, draft, target, span, params, rng, 3, 24);
  REQUIRE(two.measured);
  CHECK(two.measured->draft_length == 2);
  CHECK(two.measured->pairs.size() == 3);
  INFO("K = 2 measured " << two.measured->speedup());
  CHECK(two.measured->speedup() == Approx(3.0));  // 3 tokens per 1 ms target call
  CHECK(two.pays());
  // Any drafter, as the generation will run it: here prompt lookup first, the free draft where
  // it finds nothing (specsample-generate --prompt-lookup).
  drafters::fallback both(drafters::ngram(8, 4, 1), model_drafter(draft, params.draft_warping()));
  calibration looked_up = cal.at(2);
  check_prediction(looked_up, both, target, span, params, rng, 3, 24);
  REQUIRE(looked_up.measured);
  CHECK(looked_up.measured->draft_length == 2);
  INFO("K = 2 with prompt lookup first " << looked_up.measured->speedup());
  CHECK(looked_up.measured->speedup() == Approx(3.0));  // every round keeps 3 tokens, lookup's drafts too
  CHECK(both.first_rounds() > 0);  // lookup drafted rounds
  // A prediction that does not pay is not timed, and a measurement of before is cleared.
  two.predicted = 0.9;
  check_prediction(two, draft, target, span, params, rng, 3, 24);
  CHECK_FALSE(two.measured);
  // Refusals by name, whether it would time or not.
  CHECK_THROWS_WITH(check_prediction(two, draft, target, span, params, rng, 0, 24),
                    Contains("check_prediction: pairs must be >= 1"));
  CHECK_THROWS_WITH(check_prediction(two, draft, target, span, params, rng, 3, 1),
                    Contains("check_prediction: tokens must be >= 2"));
  two.predicted = 1.5;
  const std::vector<std::vector<token>> none;
  CHECK_THROWS_WITH(check_prediction(two, draft, target, std::span<const std::vector<token>>(none), params, rng),
                    Contains("check_prediction: no prompts"));
  // A prompt that leaves no room for two tokens: nothing to time, the prediction alone decides.
  bounded_markov small_target(markov, 4), small_draft(markov, 4);
  const std::vector<std::vector<token>> full{{0, 1, 2, 3}};
  check_prediction(two, small_draft, small_target, std::span<const std::vector<token>>(full), params, rng);
  CHECK_FALSE(two.measured);
  CHECK(two.pays());
}

TEST_CASE("the verification cost is timed at every K up to 8, then at powers of two, linear between",
          "[tuning]") {
  using V = std::vector<std::size_t>;
  CHECK(detail::verify_timing_lengths(0).empty());
  CHECK(detail::verify_timing_lengths(5) == V{1, 2, 3, 4, 5});
  CHECK(detail::verify_timing_lengths(40) == V{1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 40});
  CHECK(detail::verify_timing_lengths(64) == V{1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64});
  const auto markov = toy::markov::random(8, 1, 1, 0.3f);
  recording_markov draft(markov), target(markov);
  const std::vector<token> context{0, 1};
  const calibration m = detail::cost_ratios(draft, target, std::span<const token>(context), 40, 3);
  // The target's calls: single tokens, and the (K+1)-token verifications of the timed K only.
  std::vector<std::size_t> widths;
  for (const std::size_t n : target.calls) {
    if (n > 1 && std::find(widths.begin(), widths.end(), n) == widths.end()) widths.push_back(n);
  }
  std::sort(widths.begin(), widths.end());
  CHECK(widths == V{2, 3, 4, 5, 6, 7, 8, 9, 17, 33, 41});
  REQUIRE(m.verify_cost.size() == 41);
  for (const double v : m.verify_cost) CHECK((std::isfinite(v) && v > 0.0));
  const auto& v = m.verify_cost;
  CHECK(v[12] == Approx(v[8] + (v[16] - v[8]) * 4.0 / 8.0));
  CHECK(v[20] == Approx(v[16] + (v[32] - v[16]) * 4.0 / 16.0));
  CHECK(v[36] == Approx(v[32] + (v[40] - v[32]) * 4.0 / 8.0));
}

TEST_CASE("a calibration times verification at a prompt with room for it", "[tuning]") {
  // A first prompt that fills the context leaves no room for a verification call: the costs are
  // taken at the next prompt with room, so v[K] is timed, not read as 1 (free).
  struct recording_bounded : recording_markov {
    using recording_markov::recording_markov;
    std::size_t max_size() const { return 8; }
  };
  const auto markov = toy::markov::random(8, 1, 1, 0.3f);
  recording_bounded draft(markov), target(markov);
  speculative_params params;
  params.sampling.temperature = 0.0f;
  const std::vector<std::vector<token>> prompts{{0, 1, 2, 3, 4, 5, 6, 7}, {0, 1}, {2}};
  std::mt19937_64 rng(1);
  const calibration c = calibrate(draft, target, std::span<const std::vector<token>>(prompts), params, rng, 3, 4, 0);
  REQUIRE(c.verify_cost.size() == 4);
  // The full first prompt left its warm-up one token (the context of 8 holds prompt + new - 1).
  CHECK(c.warmup_lengths == std::vector<std::size_t>{1, 4, 4});
  // cost_ratios' calls, the last: per round two single tokens, then 2, 3 and 4 tokens.
  const std::vector<std::size_t> after_warmup(target.calls.end() - 15 * 5, target.calls.end());
  CHECK(std::count(after_warmup.begin(), after_warmup.end(), std::size_t{4}) == 15);  // v[3]: 4-token calls
  CHECK(std::count(after_warmup.begin(), after_warmup.end(), std::size_t{2}) == 15);
}

TEST_CASE("calibration over several prompts pools their acceptance", "[tuning]") {
  auto target = toy::markov::random(8, 1, 1, 0.3f);
  auto draft = toy::markov::similar_to(target, 0.7, 2, 0.3f);
  speculative_params params;
  const std::vector<std::vector<token>> prompts{{0, 1}, {5}, {2, 7, 3}};
  std::mt19937_64 a(9), b(9);
  const auto pooled = calibrate(draft, target, std::span<const std::vector<token>>(prompts), params, a, 4, 200, 0);
  // The same warm-ups by hand: one position_acceptance observer across the three generations.
  speculative_params warm = params;
  warm.draft_length = 4;
  warm.max_new_tokens = 200;
  position_acceptance by_hand(4);
  for (const auto& p : prompts) (void)speculative_sample(draft, target, p, warm, b, by_hand);
  REQUIRE(pooled.acceptance.size() == 4);
  REQUIRE(pooled.rounds_reached.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(pooled.acceptance[i] == by_hand.rates()[i]);
    CHECK(pooled.rounds_reached[i] == by_hand.reached(i));
  }
  CHECK((pooled.best_k >= 1 && pooled.best_k <= 4));
  // An EOS in the caller's parameters does not cut the warm-ups short (token 0 comes within a few
  // of the 200 tokens of each): the same positions, the same acceptance.
  speculative_params with_eos = params;
  with_eos.eos = 0;
  std::mt19937_64 c(9);
  const auto eos_pooled = calibrate(draft, target, std::span<const std::vector<token>>(prompts), with_eos, c, 4, 200, 0);
  CHECK(eos_pooled.acceptance == pooled.acceptance);
  const std::vector<std::vector<token>> none;
  CHECK_THROWS_WITH(calibrate(draft, target, std::span<const std::vector<token>>(none), params, a),
                    Catch::Contains("no prompts"));
  // No warm-up tokens would measure nothing and report it as acceptance 0.
  CHECK_THROWS_WITH(calibrate(draft, target, std::span<const std::vector<token>>(prompts), params, a, 4, 0),
                    Catch::Contains("calibrate: warmup_tokens must be >= 1"));
}

TEST_CASE("a calibration says which draft positions no warm-up round reached", "[tuning]") {
  // Greedy, the draft always proposes a token the target never picks: every round stops at its
  // first draft, so positions 2..4 are never reached and their rates are borrowed (0 from position 1).
  constexpr int V = 4;
  Eigen::MatrixXf p = Eigen::MatrixXf::Constant(V, V + 1, 0.1f), q = p;  // (column V: before the start)
  for (int j = 0; j <= V; ++j) {
    p((j + 1) % V, j) = 0.7f;
    q((j + 2) % V, j) = 0.7f;
  }
  toy::markov target(p, 1), draft(q, 1);
  speculative_params params;
  params.sampling.temperature = 0.0f;
  std::mt19937_64 rng(3);
  const std::vector<std::vector<token>> prompts{{0}};
  const auto cal = calibrate(draft, target, std::span<const std::vector<token>>(prompts), params, rng, 4, 40, 0);
  CHECK(cal.acceptance == std::vector<double>{0.0, 0.0, 0.0, 0.0});
  REQUIRE(cal.rounds_reached.size() == 4);
  // One round per token, each emitting the target's correction; the last, with room for that one
  // token only, drafts nothing.
  CHECK(cal.rounds_reached[0] == 39);
  CHECK(cal.rounds_reached[1] == 0);
  CHECK(cal.rounds_reached[2] == 0);
  CHECK(cal.rounds_reached[3] == 0);
}

TEST_CASE("the draft temperature scan finds the ratio at which a sharpened draft equals the target",
          "[tuning][draft_sampling]") {
  // q ∝ p^2 column by column: at R × T the draft's distribution is ∝ p^(2/R) when the target's is p
  // at T = 1, so R = 2 makes q = p and the acceptance 1; any other ratio accepts less.
  const auto target = toy::markov::random(5, 1, 31, 0.8f);
  Eigen::MatrixXf squared = target.transitions().array().square().matrix();
  for (Eigen::Index j = 0; j < squared.cols(); ++j) squared.col(j) /= squared.col(j).sum();
  toy::markov draft(squared, 1), t = target;
  speculative_params params;
  params.sampling.temperature = 1.0f;
  const std::vector<std::vector<token>> prompts{{0}, {3}};
  const std::vector<double> ratios{1.0, 1.5, 2.0, 2.5};
  std::mt19937_64 rng(3);
  const auto scan = scan_draft_temperature(draft, t, std::span<const std::vector<token>>(prompts), params,
                                           std::span<const double>(ratios), rng, 20);
  CHECK(scan.positions == 40);
  CHECK(scan.best_ratio() == 2.0);
  CHECK(scan.alpha[2] == Approx(1.0).margin(1e-5));
  CHECK(scan.alpha[0] < scan.alpha[1]);
  CHECK(scan.alpha[3] < scan.alpha[2]);
  const speculative_params tuned = scan.apply(params);
  REQUIRE(tuned.draft_sampling);
  CHECK(tuned.draft_sampling->temperature == 2.0f);
  CHECK(tuned.sampling.temperature == 1.0f);
  // At T = 0.5 the same ratio: q at 2 × 0.5 = 1 is p^2, the target's p at 0.5 is p^2 as well.
  params.sampling.temperature = 0.5f;
  const auto half = scan_draft_temperature(draft, t, std::span<const std::vector<token>>(prompts), params,
                                           std::span<const double>(ratios), rng, 20);
  CHECK(half.best_ratio() == 2.0);
  // Nonsense is refused by name.
  using Catch::Matchers::Contains;
  params.sampling.temperature = 0.0f;
  CHECK_THROWS_WITH(scan_draft_temperature(draft, t, std::span<const std::vector<token>>(prompts), params,
                                           std::span<const double>(ratios), rng, 20),
                    Contains("temperature must be > 0"));
  // A temperature that is no temperature is named as such (it read as a ratio's fault, or as 0's).
  for (const float nonsense : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    params.sampling.temperature = nonsense;
    CHECK_THROWS_WITH(scan_draft_temperature(draft, t, std::span<const std::vector<token>>(prompts), params,
                                             std::span<const double>(ratios), rng, 20),
                      Contains("speculative_params.sampling.temperature must be finite and >= 0"));
  }
  params.sampling.temperature = 1.0f;
  const std::vector<double> bad{1.0, 0.0};
  CHECK_THROWS_WITH(scan_draft_temperature(draft, t, std::span<const std::vector<token>>(prompts), params,
                                           std::span<const double>(bad), rng, 20),
                    Contains("ratio 0 must be finite and > 0"));
  const std::vector<double> huge{1.0, 1e300};  // finite as a double, not as the draft's float temperature
  CHECK_THROWS_WITH(scan_draft_temperature(draft, t, std::span<const std::vector<token>>(prompts), params,
                                           std::span<const double>(huge), rng, 20),
                    "scan_draft_temperature: ratio 1e+300 × the temperature 1 = 1e+300, the draft's temperature, is "
                    "not finite as a float");
  CHECK_THROWS_WITH(scan_draft_temperature(draft, t, std::span<const std::vector<token>>(), params,
                                           std::span<const double>(ratios), rng, 20),
                    Contains("no prompts"));
  auto other = toy::markov::random(4, 1, 5, 0.8f);
  CHECK_THROWS_WITH(scan_draft_temperature(other, t, std::span<const std::vector<token>>(prompts), params,
                                           std::span<const double>(ratios), rng, 20),
                    Contains("vocabularies differ"));
  // One object as both would score each text twice, the second time after its own end: refused,
  // as speculative_sample refuses it (it returned α well below the 1 of a model against itself).
  CHECK_THROWS_WITH(scan_draft_temperature(t, t, std::span<const std::vector<token>>(prompts), params,
                                           std::span<const double>(ratios), rng, 20),
                    Contains("scan_draft_temperature: the draft and the target are the same model object: each "
                             "scores the text from an empty context"));
  auto copy = t;  // a second instance is the way: a model against itself accepts everything
  const auto self = scan_draft_temperature(copy, t, std::span<const std::vector<token>>(prompts), params,
                                           std::span<const double>(ratios), rng, 20);
  CHECK(self.alpha[0] == Approx(1.0).margin(1e-5));
  CHECK_THROWS_WITH(draft_temperature_scan{}.best_ratio(), Contains("0 ratios and 0 alphas"));
  CHECK_THROWS_WITH((draft_temperature_scan{{1.0, 2.0}, {0.5}, 1}.best_ratio()), Contains("2 ratios and 1 alphas"));
}

TEST_CASE("warm-ups shorten to the room a prompt leaves in the models' contexts", "[tuning]") {
  // Contexts of 12 (draft) and 10 (target) tokens: after a 7-token prompt a warm-up has room for
  // 4 tokens, not the 64 asked for; a calibration or scan on it runs instead of reporting a
  // context overflow of a max_new_tokens the caller never set.
  const auto markov = toy::markov::random(6, 1, 3, 0.5f);
  bounded_markov target(markov, 10), draft(toy::markov::similar_to(markov, 0.5, 4, 0.5f), 12);
  speculative_params params;
  params.sampling.temperature = 1.0f;
  const std::vector<std::vector<token>> prompts{{0, 1, 2, 3, 4, 5, 0}, {1}};
  CHECK(detail::warmup_length(draft, target, 7, 64, "test") == 4);
  CHECK(detail::warmup_length(draft, target, 1, 64, "test") == 10);
  CHECK(detail::warmup_length(draft, target, 10, 64, "test") == 1);
  CHECK(detail::warmup_length(draft, target, 7, 3, "test") == 3);
  std::mt19937_64 rng(5);
  const auto cal = calibrate(draft, target, std::span<const std::vector<token>>(prompts), params, rng, 3, 64);
  CHECK((cal.best_k >= 1 && cal.best_k <= 3));
  // The timed check skips and shortens the same way: the first prompt gets 4 tokens, the second 10;
  // one with no room for two tokens is left out, not refused.
  const std::vector<std::vector<token>> with_full{std::vector<token>(10, 1), {0, 1, 2, 3, 4, 5, 0}, {1}};
  params.draft_length = 2;
  const auto m = measure_speedup(draft, target, std::span<const std::vector<token>>(with_full), params, rng, 3, 64);
  REQUIRE(m.pairs.size() == 3);
  for (const double r : m.ratios()) CHECK((std::isfinite(r) && r > 0.0));
  const std::vector<double> ratios{0.5, 1.0, 2.0};
  const auto scan = scan_draft_temperature(draft, target, std::span<const std::vector<token>>(prompts), params,
                                           std::span<const double>(ratios), rng, 64);
  CHECK(scan.positions == 4 + 10);
  // A prompt that alone overflows the smaller context is refused by name.
  const std::vector<std::vector<token>> too_long{std::vector<token>(11, 0)};
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(calibrate(draft, target, std::span<const std::vector<token>>(too_long), params, rng, 3, 64),
                    Contains("calibrate: a prompt of 11 tokens does not fit the models' context of 10 tokens"));
  CHECK_THROWS_WITH(scan_draft_temperature(draft, target, std::span<const std::vector<token>>(too_long), params,
                                           std::span<const double>(ratios), rng, 64),
                    Contains("scan_draft_temperature: a prompt of 11 tokens does not fit"));
  // A warm-up that drafts nothing measures nothing: refused, not reported as acceptance 0 (which
  // made -k auto fall back to autoregressive decoding). The full prompt leaves room for one token.
  const std::vector<std::vector<token>> full{std::vector<token>(10, 1)};
  CHECK_THROWS_WITH(calibrate(draft, target, std::span<const std::vector<token>>(full), params, rng, 3, 64),
                    Contains("calibrate: no warm-up round could draft a token") &&
                        Contains("no prompt leaves the models' contexts room for two new tokens"));
  CHECK_THROWS_WITH(calibrate(draft, target, std::span<const std::vector<token>>(prompts), params, rng, 3, 1),
                    Contains("warmup_tokens = 1 leaves no round with a draft"));
  // One prompt with room is enough: the full one beside it adds no round.
  const std::vector<std::vector<token>> one_with_room{std::vector<token>(10, 1), {1}};
  const auto some = calibrate(draft, target, std::span<const std::vector<token>>(one_with_room), params, rng, 3, 64, 0);
  CHECK(some.rounds_reached[0] > 0);
  // Rounds with room that a draft_min_probability stops before their first draft are a measurement:
  // this draft proposes nothing, which does not pay (no refusal).
  speculative_params picky = params;
  picky.draft_min_probability = 0.999f;
  const auto stopped = calibrate(draft, target, std::span<const std::vector<token>>(prompts), picky, rng, 3, 64, 0);
  CHECK(stopped.rounds_reached[0] == 0);
  CHECK(!(stopped.predicted > 1.0));
}

TEST_CASE("the tuning functions refuse what they cannot use, by name", "[tuning][errors]") {
  using Catch::Matchers::Contains;
  // Draft lengths past max_draft_length (the loops' limit): refused before any work (one used to
  // loop for ages, another to allocate).
  const std::vector<double> a{0.5};
  const std::size_t huge = std::numeric_limits<std::size_t>::max();
  CHECK_THROWS_WITH(expected_tokens_per_round(a, huge), Contains("expected_tokens_per_round: K = "));
  CHECK_THROWS_WITH(predicted_speedup(0.5, 0.1, huge), Contains("above max_draft_length = 256"));
  CHECK_THROWS_WITH(best_draft_length(a, 0.1, 1'000'000), Contains("best_draft_length: K = 1000000 is above"));
  CHECK(best_draft_length(a, 0.1, max_draft_length) >= 1);
  auto target = toy::markov::random(5, 1, 1, 0.5f), draft = toy::markov::random(5, 1, 2, 0.5f);
  speculative_params params;
  params.sampling.temperature = 1.0f;
  const std::vector<std::vector<token>> prompts{{0}};
  std::mt19937_64 rng(1);
  CHECK_THROWS_WITH(calibrate(draft, target, std::span<const std::vector<token>>(prompts), params, rng, huge),
                    Contains("calibrate: K = "));
  // A bad later prompt, or bad parameters, are named before any warm-up runs (the target records
  // every call); the warm-ups' own draft length (k_max) stands in for params.draft_length.
  {
    recording_markov recorded(target);
    const std::vector<std::vector<token>> empty_second{{0}, {}}, out_of_range{{0}, {1, 5}};
    CHECK_THROWS_WITH(calibrate(draft, recorded, std::span<const std::vector<token>>(empty_second), params, rng),
                      Contains("prompt is empty"));
    CHECK_THROWS_WITH(calibrate(draft, recorded, std::span<const std::vector<token>>(out_of_range), params, rng),
                      Contains("prompt token 5 at position 1 is out of range"));
    speculative_params bad = params;
    bad.sampling.top_p = 2.0f;
    CHECK_THROWS_WITH(calibrate(draft, recorded, std::span<const std::vector<token>>(prompts), bad, rng),
                      Contains("top_p"));
    CHECK(recorded.calls.empty());
    speculative_params no_k = params;
    no_k.draft_length = 0;
    CHECK_NOTHROW(calibrate(draft, recorded, std::span<const std::vector<token>>(prompts), no_k, rng, 2, 8, 0));
  }
  // SIZE_MAX tokens per warm-up or timed generation, on models without a context limit: those ignore
  // EOS, so each would never end (the cap to the context left made it SIZE_MAX - prompt + 1, which
  // the loop accepts, where it refuses SIZE_MAX itself).
  const std::string never_ends = "SIZE_MAX tokens to generate from each prompt caps nothing, and a timed generation "
                                 "ignores EOS: it would never end";
  CHECK_THROWS_WITH(calibrate(draft, target, std::span<const std::vector<token>>(prompts), params, rng, 4, huge, 0),
                    "calibrate: " + never_ends + "; give a number of tokens");
  CHECK_THROWS_WITH(measure_speedup(draft, target, std::span<const std::vector<token>>(prompts), params, rng, 1, huge),
                    Contains(never_ends));
  CHECK_THROWS_WITH(scan_draft_temperature(draft, target, std::span<const std::vector<token>>(prompts), params,
                                           std::span<const double>(std::vector<double>{1.0}), rng, huge),
                    Contains("scan_draft_temperature: " + never_ends));
  // The scan: no positions to average over; a model that returns fewer columns than it was given
  // tokens (which autoregressive decoding, reading only the last, cannot notice).
  const std::vector<double> ratios{0.8, 1.0, 1.2};
  CHECK_THROWS_WITH(scan_draft_temperature(draft, target, std::span<const std::vector<token>>(prompts), params,
                                           std::span<const double>(ratios), rng, 0),
                    Contains("tokens must be >= 1"));
  struct last_column_only : toy::markov {
    explicit last_column_only(toy::markov m) : toy::markov(std::move(m)) {}
    Eigen::MatrixXf append(std::span<const token> t) {
      const Eigen::MatrixXf l = toy::markov::append(t);
      return l.rightCols(std::min<Eigen::Index>(1, l.cols()));
    }
  };
  last_column_only short_target(target);
  CHECK_THROWS_WITH(scan_draft_temperature(draft, short_target, std::span<const std::vector<token>>(prompts), params,
                                           std::span<const double>(ratios), rng, 8),
                    Contains("target model returned logits of shape (5, 1) for 8 tokens; expected (5, 8)"));
}
