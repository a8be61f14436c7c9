#include <specsample/specsample.hpp>
#include <specsample/testing/distribution.hpp>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "../support/broken_verifiers.hpp"

#include <xtensor/xadapt.hpp>
#include <xtensor/xview.hpp>
#include <xtensor/xreducer.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

using namespace specsample;

TEST_CASE("the exact sequence distribution of a Markov chain is the product of its conditionals", "[testing]") {
  auto m = toy::markov::random(3, 1, 2);
  const std::vector<token> prompt{1};
  const auto table = testing::exact_sequence_distribution(m, prompt, 3, {});
  REQUIRE(table.dimension() == 3);
  CHECK(xt::sum(table)() == Approx(1.0));
  const Eigen::MatrixXf& t = m.transitions();  // column = state = last token
  for (std::size_t a = 0; a < 3; ++a)
    for (std::size_t b = 0; b < 3; ++b)
      for (std::size_t c = 0; c < 3; ++c) {
        const double want = double(t(Eigen::Index(a), 1)) * t(Eigen::Index(b), Eigen::Index(a)) * t(Eigen::Index(c), Eigen::Index(b));
        CHECK(table(a, b, c) == Approx(want).epsilon(1e-5));
      }
  // Marginalising the last position gives the length-2 table.
  const auto two = testing::exact_sequence_distribution(m, prompt, 2, {});
  CHECK(xt::allclose(xt::sum(table, {2}), two, 1e-6, 1e-9));
}

TEST_CASE("exact_sequences holds the sequences of positive probability: the dense table's, or cut at EOS",
          "[testing]") {
  auto m = toy::markov::random(3, 1, 2);
  const std::vector<token> prompt{1};
  const auto dense = testing::exact_sequence_distribution(m, prompt, 3, {});
  const auto sparse = testing::exact_sequences(m, prompt, 3, {});
  CHECK(sparse.length() == 3);
  std::size_t positive = 0;
  for (const double p : dense) positive += p > 0.0 ? 1 : 0;
  CHECK(sparse.size() == positive);
  double total = 0.0;
  for (const auto& [sequence, p] : sparse) {
    total += p;
    CHECK(p == dense(static_cast<std::size_t>(sequence[0]), static_cast<std::size_t>(sequence[1]),
                     static_cast<std::size_t>(sequence[2])));
  }
  CHECK(total == Approx(1.0));
  CHECK(sparse[std::vector<token>{0, 0, 0}] == dense(0, 0, 0));
  // With EOS = 2 a sequence ends at its first 2; the rest reads the marker 3, and its probability
  // is the dense table's sum over every continuation.
  const auto cut = testing::exact_sequences(m, prompt, 3, {}, token{2});
  double cut_total = 0.0;
  for (const auto& [sequence, p] : cut) {
    cut_total += p;
    const auto at = std::find(sequence.begin(), sequence.end(), token{2});
    if (at != sequence.end()) CHECK(std::all_of(at + 1, sequence.end(), [](token x) { return x == 3; }));
  }
  CHECK(cut_total == Approx(1.0));
  CHECK(cut[std::vector<token>{2, 3, 3}] == Approx(xt::sum(xt::view(dense, 2, xt::all(), xt::all()))()));
  CHECK(cut[std::vector<token>{0, 2, 3}] == Approx(xt::sum(xt::view(dense, 0, 2, xt::all()))()));
  CHECK(cut[std::vector<token>{2, 0, 0}] == 0.0);
  // The test over tables reads what the dense test reads over the same counts, to the last bit.
  // (Ten generators: the hash map's own order gives other last bits for about half of them.)
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    testing::sequence_histogram hist(3, 3);
    testing::sequence_table counts(3);
    std::mt19937_64 rng(seed);
    speculative_params params;
    params.max_new_tokens = 3;
    for (int i = 0; i < 2000; ++i) {
      const auto out = autoregressive_sample(m, prompt, params, rng).tokens;
      hist.add(out);
      counts.add(out, 1.0);
    }
    const auto dense_fit = testing::chi_square_test(hist.counts(), dense);
    const auto sparse_fit = testing::chi_square_test(counts, sparse);
    INFO("seed " << seed);
    CHECK(sparse_fit.statistic == dense_fit.statistic);
    CHECK(sparse_fit.bins == dense_fit.bins);
    CHECK(sparse_fit.p_value == dense_fit.p_value);
  }
}

TEST_CASE("exact_sequences sums to 1 within double rounding: each position's column over its own sum",
          "[testing]") {
  // A warped float column sums to 1 only within its rounding (~6e-8); multiplied over 19 positions
  // the table's total passed chi_square_test's 1e-6 and speculative_fit refused the library's own
  // table (76 of 2000 two-token unigram models). The autoregressive sampler draws the float
  // weights over their double sum: so does the table, in every sequence.
  std::size_t off = 0;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    auto m = toy::markov::random(2, 0, seed);
    const std::vector<token> prompt{0};
    const Eigen::VectorXf p = warp(m.append(prompt).col(0), sampling_params{});
    m.truncate(0);
    const double sum = p.cast<double>().sum();
    off += sum != 1.0 ? 1 : 0;
    const auto table = testing::exact_sequences(m, prompt, 8, {});
    double total = 0.0;
    for (const auto& [sequence, q] : table) total += q;
    INFO("seed " << seed << ", the column sums to 1 + " << sum - 1.0);
    CHECK(std::fabs(total - 1.0) < 1e-13);
    const std::vector<token> mixed{0, 1, 1, 0, 1, 0, 0, 1};
    double want = 1.0;
    for (const token t : mixed) want *= double(p(t)) / sum;
    CHECK(table[mixed] == Approx(want).epsilon(1e-14));
  }
  CHECK(off > 0);  // the models include columns whose float sum is not 1
}

TEST_CASE("exact_sequences enumerates a large vocabulary under top-k: one call per prefix", "[testing]") {
  // 50257 tokens, the logits favouring ids 7 and 11 after anything: top-k = 2 leaves two
  // continuations per prefix, so 8 sequences of 3 tokens and 1 + 2 + 4 model calls.
  std::size_t calls = 0;
  toy::callable_model big(50257, [&](std::span<const token>) {
    ++calls;
    Eigen::VectorXf logits = Eigen::VectorXf::Zero(50257);
    logits(7) = 2.0f;
    logits(11) = 1.0f;
    return logits;
  });
  sampling_params top2;
  top2.top_k = 2;
  const auto table = testing::exact_sequences(big, std::vector<token>{0}, 3, top2);
  CHECK(table.size() == 8);
  CHECK(calls == 7);
  const double p7 = 1.0 / (1.0 + std::exp(-1.0));
  CHECK(table[std::vector<token>{7, 7, 11}] == Approx(p7 * p7 * (1.0 - p7)));
  // Without the filter the sequences of positive probability are too many: refused, not enumerated
  // to the end (the cap of 1e6 entries is reached within 21 calls).
  calls = 0;
  CHECK_THROWS_WITH(testing::exact_sequences(big, std::vector<token>{0}, 3, {}),
                    "exact_sequences: more than 1000000 sequences of 3 tokens have positive probability "
                    "(testing::max_sequences); a top-k of at most 100 keeps them few (100^3 at most), whatever "
                    "the vocabulary of 50257");
  CHECK(calls <= 22);
}

TEST_CASE("exact_sequences keeps the sequences whose probability underflows a double, so the cap still counts them",
          "[testing]") {
  // Token 0 at e^-69 (~1e-30) of the other: ten of them in a sequence make its probability ~1e-300,
  // eleven underflow a double to 0. Skipping those paths lost sequences (and made an enumeration
  // without a filter endless: every call under such a path, none of its sequences counted against
  // the cap).
  std::size_t calls = 0;
  toy::callable_model m(2, [&](std::span<const token>) {
    ++calls;
    Eigen::VectorXf logits = Eigen::VectorXf::Zero(2);
    logits(0) = -69.0f;
    return logits;
  });
  const auto table = testing::exact_sequences(m, std::vector<token>{1}, 11, {});
  CHECK(table.size() == 2048);  // every sequence of 11 tokens is possible
  CHECK(calls == 2047);         // one per prefix of 0 to 10 tokens
  CHECK(table[std::vector<token>(11, 0)] == 0.0);
  std::vector<token> ten_zeros(11, 0);
  ten_zeros.back() = 1;
  CHECK(table[ten_zeros] > 0.0);
  double sum = 0.0;
  for (const auto& [sequence, p] : table) sum += p;
  CHECK(sum == Approx(1.0).epsilon(1e-12));
}

TEST_CASE("sequence tables add values per sequence and refuse another length", "[testing]") {
  using Catch::Matchers::Contains;
  testing::sequence_table t(2);
  t.add(std::vector<token>{1, 2}, 1.0);
  t.add(std::vector<token>{1, 2}, 2.0);
  t.add(std::vector<token>{2, 1}, 1.0);
  CHECK(t.size() == 2);
  CHECK(t[std::vector<token>{1, 2}] == 3.0);
  CHECK(t[std::vector<token>{0, 0}] == 0.0);
  CHECK_THROWS_WITH(t.add(std::vector<token>{1}, 1.0), Contains("expected 2 tokens, got 1"));
  const std::vector<token> three{1, 2, 0};
  CHECK_THROWS_WITH(t[three], Contains("expected 2 tokens, got 3"));  // (it read 0)
  for (const double bad : {std::nan(""), -1.0, std::numeric_limits<double>::infinity()}) {
    CHECK_THROWS_WITH(t.add(std::vector<token>{1, 2}, bad),
                      fmt::format("sequence_table: a value must be finite and >= 0 (a probability or a count), got {}",
                                  bad));
  }
  CHECK(t[std::vector<token>{1, 2}] == 3.0);  // (unchanged)
  // A sum that overflows is refused (it stored +inf, which chi_square_test refused later as "not a count").
  t.add(std::vector<token>{2, 2}, 1e308);
  CHECK_THROWS_WITH(t.add(std::vector<token>{2, 2}, 1e308),
                    fmt::format("sequence_table: a sequence's value {} plus {} overflows a double", 1e308, 1e308));
  CHECK(t[std::vector<token>{2, 2}] == 1e308);
  CHECK_THROWS_WITH(testing::sequence_table(0), Contains("length must be in 1..64"));
  testing::sequence_table two(1, 2);  // at most two entries
  two.add(std::vector<token>{5}, 1.0);
  two.add(std::vector<token>{6}, 1.0);
  two.add(std::vector<token>{5}, 1.0);  // not a new entry
  CHECK_THROWS_WITH(two.add(std::vector<token>{7}, 1.0), Contains("more than 2 sequences of 1 tokens"));
  CHECK(two.size() == 2);
  // The sparse test: a sequence the expected table does not hold has probability zero.
  testing::sequence_table expected(2);
  expected.add(std::vector<token>{1, 2}, 0.75);
  expected.add(std::vector<token>{2, 1}, 0.25);
  testing::sequence_table observed(2);
  observed.add(std::vector<token>{1, 2}, 30.0);
  observed.add(std::vector<token>{2, 1}, 10.0);
  const auto fit = testing::chi_square_test(observed, expected);
  CHECK(fit.bins == 2);
  CHECK(fit.statistic == Approx(0.0));
  observed.add(std::vector<token>{0, 0}, 1.0);
  const auto impossible = testing::chi_square_test(observed, expected);
  CHECK(impossible.impossible == 1);
  CHECK(impossible.p_value == 0.0);
  // An entry of probability 0 reads as one not held, as a zero cell of the dense test does.
  testing::sequence_table with_zero = expected;
  with_zero.add(std::vector<token>{0, 0}, 0.0);
  CHECK(testing::chi_square_test(observed, with_zero).impossible == 1);
  CHECK_THROWS_WITH(testing::chi_square_test(testing::sequence_table(3), expected),
                    Contains("observed sequences of 3 tokens, expected of 2"));
  {  // Impossible samples are counted as such, not as the total less the possible ones, which
     // rounds past 2^53 samples: one impossible sample beside 2^53 possible ones read 0 (p = 1),
     // and 2^53 + 1 possible ones -1 impossible ones (p = 0), as the dense test never did.
    testing::sequence_table many(2);
    many.add(std::vector<token>{1, 2}, 0x1p52);
    many.add(std::vector<token>{2, 1}, 0x1p52);
    many.add(std::vector<token>{0, 0}, 1.0);
    const auto fit_many = testing::chi_square_test(many, expected);
    CHECK(fit_many.impossible == 1);
    CHECK(fit_many.p_value == 0.0);
    const xt::xarray<double> dense_o = {0x1p52, 0x1p52, 1.0}, dense_e = {0.5, 0.5, 0.0};
    CHECK(testing::chi_square_test(dense_o, dense_e).impossible == 1);
    testing::sequence_table possible(2);
    possible.add(std::vector<token>{1, 2}, 0x1p53);
    possible.add(std::vector<token>{2, 1}, 1.0);
    CHECK(testing::chi_square_test(possible, expected).impossible == 0);
  }
  observed.add(std::vector<token>{1, 2}, 0.5);
  CHECK_THROWS_WITH(testing::chi_square_test(observed, expected), Contains("observed count 30.5 is not a count"));
}

TEST_CASE("the exactness tools refuse sizes they cannot enumerate or test", "[testing][errors]") {
  using Catch::Matchers::Contains;
  auto m = toy::markov::random(3, 1, 2);
  const std::vector<token> prompt{1};
  CHECK_THROWS_WITH(testing::exact_sequence_distribution(m, prompt, 0, {}), Contains("length must be in 1..64"));
  // A length in range whose V^L exceeds the 1e6 cap is refused by the cap; a huge one by the
  // range check, before any counting.
  CHECK_THROWS_WITH(testing::exact_sequence_distribution(m, prompt, 20, {}), Contains("too many to enumerate"));
  CHECK_THROWS_WITH(testing::exact_sequence_distribution(m, prompt, std::size_t(-1), {}),
                    Contains("length must be in 1..64"));
  // One token: any length is one sequence, but the enumeration recurses per token.
  auto one = toy::markov::random(1, 0, 2);
  CHECK(testing::exact_sequence_distribution(one, std::vector<token>{0}, 64, {}).size() == 1);
  CHECK_THROWS_WITH(testing::exact_sequence_distribution(one, std::vector<token>{0}, 40'000, {}),
                    Contains("length must be in 1..64"));
  // A histogram of as many cells is refused the same way (V^L wrapped around: a wild write).
  CHECK_THROWS_WITH(testing::sequence_histogram(4, 32), Contains("4^32 sequences are too many to enumerate"));
  CHECK_THROWS_WITH(testing::sequence_histogram(2, 64), Contains("too many to enumerate"));
  CHECK_THROWS_WITH(testing::sequence_histogram(4, 0), Contains("length must be in 1..64"));
  CHECK_THROWS_WITH(testing::sequence_histogram(0, 3), Contains("the vocabulary is empty"));
  CHECK_THROWS_WITH(testing::exact_sequences(m, prompt, 2, {}, token{3}), Contains("EOS id 3 is out of range"));
  for (const std::size_t length : {std::size_t{0}, std::size_t{65}}) {  // (named as its own, not the table's)
    CHECK_THROWS_WITH(testing::exact_sequences(m, prompt, length, {}),
                      fmt::format("exact_sequences: length must be in 1..64, got {}", length));
  }
  // No samples would be a vacuous PASS.
  auto draft = toy::markov::random(3, 1, 3);
  speculative_params params;
  params.max_new_tokens = 2;
  std::mt19937_64 rng(1);
  CHECK_THROWS_WITH(testing::speculative_fit(draft, m, prompt, params, 0, rng), Contains("samples must be >= 1"));
  for (const std::size_t length : {std::size_t{0}, std::size_t{65}}) {
    params.max_new_tokens = length;
    CHECK_THROWS_WITH(testing::speculative_fit(draft, m, prompt, params, 10, rng),
                      fmt::format("speculative_fit: params.max_new_tokens (the length of the sequences tested) must "
                                  "be in 1..64, got {}",
                                  length));
  }
  // Too few samples to test are refused after the enumeration, before any is drawn (a verifier
  // that counts its calls: none).
  params.max_new_tokens = 2;
  std::size_t verifications = 0;
  auto counting = [&](std::span<const token> d, const Eigen::Ref<const Eigen::MatrixXf>& q,
                      const Eigen::Ref<const Eigen::MatrixXf>& p, auto& gen) {
    ++verifications;
    return verify_tokenwise(d, q, p, gen);
  };
  CHECK_THROWS_WITH(testing::speculative_fit(draft, m, prompt, params, 2, rng, counting),
                    Contains("2 samples are too few to test 9 possible outcomes") && Contains("it needs at least"));
  CHECK(verifications == 0);
  CHECK(testing::speculative_fit(draft, m, prompt, params, 2000, rng, counting).bins >= 2);
  CHECK(verifications > 0);
}

TEST_CASE("speculative_draw draws as speculative_sample does, with the rule params name or a verifier given",
          "[testing]") {
  auto target = toy::markov::random(5, 1, 11);
  auto draft = toy::markov::random(5, 1, 12);
  const std::vector<token> prompt{1};
  speculative_params params;
  params.max_new_tokens = 6;
  params.draft_length = 3;
  std::size_t differ = 0;  // seeds where the two rules draw differently: the verifier is used
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    std::mt19937_64 a(seed), b(seed), c(seed), d(seed);
    const auto by_params = testing::speculative_draw(draft, target, prompt, params, a);
    CHECK(by_params == speculative_sample(draft, target, prompt, params, b).tokens);
    no_observer none;
    const auto by_verifier = testing::speculative_draw(draft, target, prompt, params, c, test::resample_from_target{});
    CHECK(by_verifier == speculative_sample(draft, target, prompt, params, d, none, test::resample_from_target{}).tokens);
    differ += by_params != by_verifier ? 1 : 0;
  }
  CHECK(differ > 0);
}

namespace {
// Token-wise verification that counts its rounds (the loop calls a derived verifier's operator()).
struct round_counting_verifier : tokenwise_verifier {
  std::size_t calls = 0;
  template <class Q, class P, class Rng>
  verify_result operator()(std::span<const token> drafts, const Q& q, const P& p, Rng& rng) {
    ++calls;
    return tokenwise_verifier::operator()(drafts, q, p, rng);
  }
};
}  // namespace

TEST_CASE("speculative_fit uses the verifier given in place for every sample, as speculative_sample does",
          "[testing]") {
  auto target = toy::markov::random(3, 1, 11);
  auto draft = toy::markov::random(3, 1, 12);
  const std::vector<token> prompt{1};
  speculative_params params;
  params.max_new_tokens = 2;
  params.draft_length = 1;
  round_counting_verifier verifier;
  std::mt19937_64 rng(3);
  (void)testing::speculative_fit(draft, target, prompt, params, 100, rng, verifier);
  CHECK(verifier.calls >= 100);  // at least one round per sample, each counted by this object (copies were)
  round_counting_verifier other;
  (void)testing::speculative_draw(draft, target, prompt, params, rng, other);
  CHECK(other.calls >= 1);
}

TEST_CASE("total_variation is half the L1 distance, and refuses what is not a distribution of one shape",
          "[testing]") {
  using Catch::Matchers::Contains;
  const xt::xarray<double> a = {0.5, 0.3, 0.2}, b = {0.2, 0.3, 0.5};
  CHECK(testing::total_variation(a, b) == Approx(0.3));
  CHECK(testing::total_variation(a, a) == 0.0);
  CHECK_THROWS_WITH(testing::total_variation(a, xt::xarray<double>{0.5, 0.5}), "total_variation: shapes differ");
  CHECK_THROWS_WITH(testing::total_variation(a, xt::xarray<double>{0.5, std::nan(""), 0.5}),
                    Contains("value nan at cell 1 is not a probability"));
  CHECK_THROWS_WITH(testing::total_variation(xt::xarray<double>{1.2, -0.2, 0.0}, a),
                    Contains("value -0.2 at cell 1 is not a probability"));
}

TEST_CASE("the chi-square test accepts a fair sample and rejects a biased one", "[testing]") {
  xt::xarray<double> expected = {0.5, 0.3, 0.2};
  xt::xarray<double> fair = {5020.0, 2990.0, 1990.0};
  xt::xarray<double> biased = {5400.0, 2800.0, 1800.0};
  CHECK(testing::chi_square_test(fair, expected).p_value > 0.5);
  CHECK(testing::chi_square_test(biased, expected).p_value < 1e-6);
  xt::xarray<double> impossible = {1.0, 0.0, 0.0};
  xt::xarray<double> zero_first = {0.0, 0.5, 0.5};
  CHECK(testing::chi_square_test(impossible, zero_first).p_value == 0.0);
  // An X2 that overflows (a cell of tiny expected count, allowed by a tiny min_expected) is p = 0,
  // not a continued fraction of NaNs that "did not converge".
  const auto overflowed = testing::chi_square_test(xt::xarray<double>{0.0, 1e10}, {1.0, 1e-300}, 1e-300);
  CHECK(std::isinf(overflowed.statistic));
  CHECK(overflowed.p_value == 0.0);
}

TEST_CASE("the chi-square test refuses what is not counts against probabilities, and too few samples",
          "[testing][errors]") {
  using Catch::Matchers::Contains;
  const xt::xarray<double> expected = {0.5, 0.3, 0.2};
  const auto test = [&](xt::xarray<double> observed, xt::xarray<double> e = {0.5, 0.3, 0.2}, double min = 5.0) {
    return testing::chi_square_test(observed, e, min);
  };
  CHECK_THROWS_WITH(test({9000.0, 1000.0, 500.0}, {5000.0, 3000.0, 2000.0}), Contains("sum to 10000, not 1"));
  CHECK_THROWS_WITH(test({9000.0, 1000.0, 500.0}, {1.0, 0.6, 0.4}), Contains("sum to 2, not 1"));
  CHECK_THROWS_WITH(test({1.0, 1.0, 1.0}, {0.5, NAN, 0.5}), Contains("expected probability nan at cell 1"));
  CHECK_THROWS_WITH(test({1.0, 1.0, 1.0}, {1.2, -0.2, 0.0}), Contains("expected probability -0.2 at cell 1"));
  CHECK_THROWS_WITH(test({10.0, -1.0, 3.0}), Contains("observed count -1 at cell 1 is not a count"));
  CHECK_THROWS_WITH(test({10.0, 0.5, 3.0}), Contains("observed count 0.5 at cell 1 is not a count"));
  CHECK_THROWS_WITH(test({0.0, 0.0, 0.0}), Contains("no samples"));
  for (const double bad : {0.0, -1.0, double(NAN), double(INFINITY)}) {
    CHECK_THROWS_WITH(test({10.0, 5.0, 3.0}, expected, bad), Contains("min_expected must be finite and > 0"));
  }
  CHECK_THROWS_WITH(test({1.0, 1.0}), Contains("shapes differ"));
  // Too few samples for two bins of expected count 5: every sample would pass, a broken sampler's
  // too (4 samples, all in the least likely cell). 10 samples: the largest cell reaches 5, the
  // rest (5) is a bin of its own.
  CHECK_THROWS_WITH(test({0.0, 0.0, 4.0}), Contains("4 samples are too few to test 3 possible outcomes") &&
                                               Contains("at least 10 samples"));
  CHECK_THROWS_WITH(test({9.0, 0.0, 0.0}), Contains("at least 10 samples"));
  const auto ten = test({10.0, 0.0, 0.0});
  CHECK(ten.bins == 2);
  CHECK(ten.p_value < 0.01);
  CHECK_THROWS_WITH(test({9000.0, 1000.0, 0.0}, expected, 1e9), Contains("too few"));
  // A count no double holds is said so (it read "at least inf samples").
  CHECK_THROWS_WITH(test({50.0, 0.0}, {1.0, 4.9e-324}),
                    Contains("it would need more samples than a double holds: the expected count 5 over 5e-324"));
  CHECK_THROWS_WITH(test({50.0, 50.0}, {0.5, 0.5}, std::numeric_limits<double>::max()),
                    Contains("it would need more samples than a double holds"));
  // The count named is one that gives two bins, from the outcomes' own sums (they total 1 only
  // within rounding): 10 samples of {0.5, 0.4999995} leave the second at 4.999995.
  CHECK_THROWS_WITH(test({10.0, 0.0}, {0.5, 0.4999995}), Contains("at least 11 samples"));
  CHECK(test({6.0, 5.0}, {0.5, 0.4999995}).bins == 2);
  CHECK_THROWS_WITH(test({4.0, 0.0}, {1.0000004, 1e-9}), Contains("at least 5000000000 samples"));
  CHECK_THROWS_WITH(test({1e20, 1.0, 1.0}), Contains("observed count 1e+20 at cell 0 is not a count"));
  // Counts past 2^53, where n + 1 is n in a double and rounding leaves the pool just under
  // min_expected: the search for the count still ends (it looped forever on these).
  CHECK_THROWS_WITH(test({1.0, 0.0, 0.0}, {1.0, 8.392966488316272e-20, 3.839393349205562e-19}),
                    Contains("too few") && Contains("it needs at least 1.") && Contains("e+19 samples"));
  CHECK_THROWS_WITH(test({1.0, 2.0, 0.0, 0.0},
                         {0.3666382643672871, 0.516758726705948, 0.04064866152548963, 0.0759543474012752}, 3.679e20),
                    Contains("too few") && Contains("e+20 samples"));
  // One possible outcome (greedy): nothing to pool, nothing to refuse.
  const auto greedy = test({7.0, 0.0, 0.0}, {1.0, 0.0, 0.0});
  CHECK(greedy.dof == 0);
  CHECK(greedy.p_value == 1.0);
  CHECK(test({7.0, 1.0, 0.0}, {1.0, 0.0, 0.0}).p_value == 0.0);
  // A pooled bin of expected count 5 or more stands on its own; below 5 it is merged into the
  // smallest bin: {0.6, 0.38, 0.02} at 100 samples is 60 and 38 + 2 (X² = 0 for 60, 36, 4, where
  // the unmerged cells would read (36 - 38)² / 38 + (4 - 2)² / 2 > 2).
  const auto own = test({90.0, 4.0, 3.0, 3.0}, {0.9, 0.04, 0.03, 0.03});  // 90 and 4 + 3 + 3
  CHECK(own.bins == 2);
  CHECK(own.statistic == Approx(0.0));
  const auto merged = test({60.0, 36.0, 4.0}, {0.6, 0.38, 0.02});
  CHECK(merged.bins == 2);
  CHECK(merged.statistic == Approx(0.0).margin(1e-12));
}

namespace {
// A model that breaks the contract: `append` returns `columns` logit columns whatever it is given.
// It would read out of bounds at an id outside its vocabulary; it throws a logic_error instead,
// which the tests expect never to reach.
struct faulty_model {
  Eigen::Index columns = 1;
  std::size_t good_calls = std::size_t(-1);  // calls before it returns no columns
  std::size_t held = 0;
  [[nodiscard]] std::size_t vocab_size() const { return 4; }
  [[nodiscard]] std::size_t size() const { return held; }
  Eigen::MatrixXf append(std::span<const token> t) {
    for (const token x : t) {
      if (x < 0 || x >= 4) throw std::logic_error("read out of bounds");
    }
    held += t.size();
    return Eigen::MatrixXf::Zero(4, good_calls-- == 0 ? 0 : columns);
  }
  void truncate(std::size_t n) { held = std::min(held, n); }
};
}  // namespace

TEST_CASE("the exact distribution checks the model and the prompt as the sampling loops do", "[testing][errors]") {
  using Catch::Matchers::Contains;
  faulty_model none{.columns = 0};
  CHECK_THROWS_WITH(testing::exact_sequence_distribution(none, std::vector<token>{0}, 2, {}),
                    Contains("enumerated model returned logits of shape (4, 0) for 1 tokens; expected (4, 1)"));
  faulty_model one;  // one column for a 2-token prompt: the loops take the last n of what it returns
  CHECK_THROWS_WITH(testing::exact_sequence_distribution(one, std::vector<token>{0, 1}, 2, {}),
                    Contains("enumerated model returned logits of shape (4, 1) for 2 tokens; expected (4, 2)"));
  CHECK_THROWS_WITH(testing::exact_sequence_distribution(one, std::vector<token>{4000}, 2, {}),
                    Contains("prompt token 4000 at position 0 is out of range for a vocabulary of 4 tokens"));
  // A model failing mid-enumeration is left holding the prompt, as after a success.
  faulty_model late{.good_calls = 3};
  CHECK_THROWS_WITH(testing::exact_sequences(late, std::vector<token>{0}, 3, {}),
                    Contains("enumerated model returned logits of shape (4, 0) for 1 tokens"));
  CHECK(late.size() == 1);
  // speculative_fit refuses a mismatched pair before it enumerates anything.
  auto target = toy::markov::random(3, 1, 2);
  auto draft = toy::markov::random(4, 1, 3);
  speculative_params params;
  params.max_new_tokens = 2;
  std::mt19937_64 rng(1);
  CHECK_THROWS_WITH(testing::speculative_fit(draft, target, std::vector<token>{1}, params, 10, rng),
                    Contains("draft and target vocabularies differ"));
  // ... and a draft whose context cannot hold the generation (the loop would refuse it at the
  // first sample, after the whole enumeration).
  struct short_markov : toy::markov {
    [[nodiscard]] std::size_t max_size() const { return 1; }
  };
  short_markov short_draft{toy::markov::random(3, 1, 3)};
  params.max_new_tokens = 3;  // a draft model holds prompt + max_new_tokens - 2 = 2 tokens at most
  CHECK_THROWS_WITH(testing::speculative_fit(short_draft, target, std::vector<token>{1}, params, 10, rng),
                    Contains("context overflow") && Contains("the draft model holds at most 1"));
  CHECK(target.size() == 0);  // never appended to: refused before the enumeration
}

TEST_CASE("the chi-square survival function matches known quantiles", "[testing]") {
  CHECK(testing::detail::gamma_q(0.5, 3.841458820694124 / 2) == Approx(0.05).epsilon(1e-6));   // dof 1
  CHECK(testing::detail::gamma_q(5.0, 23.209251158954356 / 2) == Approx(0.01).epsilon(1e-6));  // dof 10
  CHECK(testing::detail::gamma_q(50.0, 149.44925277903887 / 2) == Approx(0.001).epsilon(1e-5));  // dof 100
  // Huge dof (a table of 10^8 cells): the Wilson-Hilferty approximation, whose error falls as
  // 1/dof, is the reference. A fixed cap on the iterations gave 0.58 for ~0.5 at dof = 10^8.
  for (const double dof : {1e6, 1e8, 1e9}) {
    for (const double z : {-2.0, 0.0, 1.0, 3.0}) {  // X2 = dof + z·sqrt(2 dof)
      const double x2 = dof + z * std::sqrt(2.0 * dof);
      const double h = 2.0 / (9.0 * dof);
      const double w = (std::cbrt(x2 / dof) - 1.0 + h) / std::sqrt(h);
      const double wilson_hilferty = 0.5 * std::erfc(w / std::sqrt(2.0));
      INFO("dof " << dof << ", z " << z);
      CHECK(testing::detail::gamma_q(dof / 2, x2 / 2) == Approx(wilson_hilferty).margin(1e-4));
    }
  }
}

TEST_CASE("a test of two bins takes the binomial's exact p-value, whose level holds where chi-square's does not",
          "[testing]") {
  // {0.9, 0.1} at 50 samples: the references are R's binom.test two-sided p-values (every count no
  // more likely than the one observed), computed with exact integers (Python's math.comb).
  const auto two = [](double rare) {
    return testing::chi_square_test(xt::xarray<double>{50.0 - rare, rare}, xt::xarray<double>{0.9, 0.1});
  };
  for (const auto& [rare, want] : {std::pair{0.0, 0.008373696343230036}, std::pair{5.0, 1.0},
                                    std::pair{10.0, 0.029691710911911612}, std::pair{12.0, 0.0032199211359099167},
                                    std::pair{15.0, 7.383868610314855e-05}, std::pair{20.0, 2.36859935818419e-08}}) {
    INFO(rare << " of 50 in the cell of 0.1");
    CHECK(two(rare).dof == 1);
    CHECK(two(rare).p_value == Approx(want).epsilon(1e-9));
  }
  // The level: the probability that a correct sampler's 50 samples read p <= alpha is at most
  // alpha (0.29 and 0.76 of it); by chi-square's tail on the same bins it was 3.2 and 17.5 times alpha.
  for (const double alpha : {1e-3, 1e-6}) {
    double exact = 0.0, asymptotic = 0.0;
    for (double k = 0.0; k <= 50.0; k += 1.0) {
      const double mass = std::exp(std::lgamma(51.0) - std::lgamma(k + 1.0) - std::lgamma(51.0 - k) +
                                   k * std::log(0.1) + (50.0 - k) * std::log(0.9));
      const auto fit = two(k);
      if (fit.p_value <= alpha) exact += mass;
      if (std::erfc(std::sqrt(fit.statistic / 2.0)) <= alpha) asymptotic += mass;  // χ²(1)'s tail
    }
    INFO("alpha " << alpha << ": exact " << exact << ", chi-square " << asymptotic);
    CHECK(exact <= alpha);
    CHECK(asymptotic > 3.0 * alpha);
  }
  // Many samples: 270 of 1000 at 0.3 (binom.test: 0.03843892964748352); the mode reads 1, and a
  // count far in the tail a tiny p-value, quickly at 10^7 samples.
  CHECK(testing::chi_square_test(xt::xarray<double>{730.0, 270.0}, xt::xarray<double>{0.7, 0.3}).p_value ==
        Approx(0.03843892964748352).epsilon(1e-9));
  CHECK(testing::chi_square_test(xt::xarray<double>{5e6, 5e6}, xt::xarray<double>{0.5, 0.5}).p_value ==
        Approx(1.0).epsilon(1e-9));
  const auto far = testing::chi_square_test(xt::xarray<double>{4.99e6, 5.01e6}, xt::xarray<double>{0.5, 0.5});
  CHECK(far.p_value > 0.0);
  CHECK(far.p_value < 1e-9);
}

TEST_CASE("a test of two bins takes the binomial's probability from both bins, whatever their order", "[testing]") {
  // Probabilities summing to 1 + 1e-7 (accepted: within 1e-6): the first bin's own expected count
  // over n put that error into the second bin's probability, 2e-7, and a perfect fit read p ~ 1e-18
  // in this order, 1 in the other.
  const double n = 1e9;
  const auto fit = testing::chi_square_test(xt::xarray<double>{n - 200.0, 200.0}, xt::xarray<double>{1.0 - 1e-7, 2e-7});
  const auto swapped = testing::chi_square_test(xt::xarray<double>{200.0, n - 200.0}, xt::xarray<double>{2e-7, 1.0 - 1e-7});
  CHECK(fit.dof == 1);
  CHECK(fit.p_value > 0.9);
  CHECK(swapped.p_value == Approx(fit.p_value).epsilon(1e-6));
  // A first bin at probability 1 or just above it (within the sum's tolerance) gave p = 0 for
  // every count: log1p of -1 or less.
  CHECK(testing::chi_square_test(xt::xarray<double>{1e8 - 10.0, 10.0}, xt::xarray<double>{1.0, 1e-7}).p_value > 0.5);
  CHECK(testing::chi_square_test(xt::xarray<double>{2e7 - 8.0, 8.0}, xt::xarray<double>{1.0000005, 4e-7}).p_value > 0.5);
}

TEST_CASE("speculative_fit reports what its samples drafted and rejected", "[testing]") {
  // A check that rejected nothing never reached the residual, one that drafted nothing tested the
  // target alone: the fit says so (distribution_check prints it beside its verdict).
  const auto target = toy::markov::random(3, 1, 4);
  const std::vector<token> prompt{1};
  speculative_params params;
  params.sampling.temperature = 1.0f;
  params.draft_length = 2;
  params.max_new_tokens = 3;
  std::mt19937_64 rng(2);
  auto t = target;
  auto far = toy::markov::random(3, 1, 9);
  const auto some = testing::speculative_fit(far, t, prompt, params, 4000, rng);
  CHECK(some.drafted > 0);
  CHECK(some.rejected > 0);
  CHECK(some.rejected <= some.drafted);
  auto same = target;
  const auto none_rejected = testing::speculative_fit(same, t, prompt, params, 4000, rng);
  CHECK(none_rejected.drafted > 0);
  CHECK(none_rejected.rejected == 0);
  params.max_new_tokens = 1;
  const auto none_drafted = testing::speculative_fit(far, t, prompt, params, 4000, rng);
  CHECK(none_drafted.drafted == 0);
  CHECK(none_drafted.rejected == 0);
}

namespace {
// `samples` draws from `probabilities` (a fixed seed), counted per cell.
xt::xarray<double> multinomial(const std::vector<double>& probabilities, int samples, std::mt19937_64& rng) {
  std::discrete_distribution<std::size_t> draw(probabilities.begin(), probabilities.end());
  xt::xarray<double> counts = xt::zeros<double>({probabilities.size()});
  for (int i = 0; i < samples; ++i) counts(draw(rng)) += 1.0;
  return counts;
}
}  // namespace

TEST_CASE("the pooled cells' own check catches samples piled on a rare sequence, which the bins' chi-square misses",
          "[testing]") {
  // Two likely cells, 100 of expected count 4 each (pooled: 400 together) and one of 1.9e-8 at
  // 10^5 samples: 20 samples moved onto the rarest add (20)² / 400 = 1 to X² and passed it.
  std::vector<double> p(103, 4e-5);
  p[102] = 1.9e-8;
  p[0] = p[1] = 0.5 * (1.0 - 100 * 4e-5 - 1.9e-8);
  xt::xarray<double> expected = xt::adapt(p, {p.size()});
  xt::xarray<double> observed = xt::zeros<double>({p.size()});
  for (std::size_t i = 2; i < 102; ++i) observed(i) = 4.0;
  observed(0) = observed(1) = 0.5 * (1e5 - 400.0);
  const auto fair = testing::chi_square_test(observed, expected);
  CHECK(fair.pooled_cells == 101);
  CHECK(fair.samples == 1e5);
  CHECK(fair.pooled_p_value == 1.0);  // no cell above its expectation
  CHECK(fair.p_value > 0.5);
  observed(0) -= 20.0;
  observed(102) = 20.0;
  const auto piled = testing::chi_square_test(observed, expected);
  INFO("piled: X2 = " << piled.statistic << ", bins p = " << piled.bins_p_value << ", pooled p = "
                      << piled.pooled_p_value << ", p = " << piled.p_value);
  CHECK(piled.bins_p_value > 0.1);  // the χ² alone passes it
  CHECK(piled.pooled_p_value < 1e-60);
  CHECK(piled.p_value < 1e-60);
  CHECK(piled.p_value == Approx(piled.pooled_p_value / testing::pooled_share));
  // One sample too many on a cell of expected count 4 is no evidence: 5 of 4 is likely.
  observed(102) = 0.0;
  observed(2) += 1.0;
  observed(0) += 19.0;
  CHECK(testing::chi_square_test(observed, expected).pooled_p_value == 1.0);
  // Without pooled cells the p-value is the bins' own.
  const auto unpooled = testing::chi_square_test(xt::xarray<double>{730.0, 270.0}, xt::xarray<double>{0.7, 0.3});
  CHECK(unpooled.pooled_cells == 0);
  CHECK(unpooled.p_value == unpooled.bins_p_value);
  // The exact binomial upper tail: P(X >= 3) for Binomial(10, 0.1) is 0.07019082639999998.
  CHECK(testing::detail::binomial_upper_tail(3.0, 10.0, 0.1) == Approx(0.07019082639999998).epsilon(1e-12));
  CHECK(testing::detail::binomial_upper_tail(1.0, 10.0, 0.1) == 1.0);  // at or below the mean: not small
}

TEST_CASE("the pooled cells' check keeps its level: Bonferroni over the pooled cells", "[testing]") {
  // 2000 fits of a correct sampler's 2000 samples over 2 likely cells and 200 of expected count 1:
  // the pooled check alone reads <= 0.05 in at most about 5% of them (without the factor of its
  // 200 cells, the least likely of 200 counts read below 0.05 in nearly every fit).
  std::vector<double> p(202, 5e-4);
  p[0] = p[1] = 0.5 * (1.0 - 200 * 5e-4);
  const xt::xarray<double> expected = xt::adapt(p, {p.size()});
  std::mt19937_64 rng(11);
  int low = 0, rejected = 0;
  constexpr int fits = 2000;
  for (int i = 0; i < fits; ++i) {
    const auto fit = testing::chi_square_test(multinomial(p, 2000, rng), expected);
    REQUIRE(fit.pooled_cells == 200);
    if (fit.pooled_p_value <= 0.05) ++low;
    if (fit.p_value <= 0.01) ++rejected;
  }
  INFO(low << " of " << fits << " fits with the pooled check <= 0.05, " << rejected << " with p <= 0.01");
  CHECK(low <= 0.06 * fits);
  CHECK(rejected <= 0.02 * fits);  // the combined test at 0.01: the χ² share, about 1%
}

TEST_CASE("detectable_distance: a sampler that far off fails about half the time, twice as far almost always",
          "[testing]") {
  // Ten equal cells, 1000 samples, alpha 1e-3: a sampler moving d / 5 from each of five cells to
  // each of the others is off by total variation d, and its noncentrality 4 n d² is the bound's
  // (equality in Cauchy–Schwarz), so its rejection rate is the function's 50% there.
  const std::vector<double> uniform(10, 0.1);
  const xt::xarray<double> expected = xt::adapt(uniform, {uniform.size()});
  std::mt19937_64 rng(5);
  const double alpha = 1e-3;
  const double d = testing::detectable_distance(testing::chi_square_test(multinomial(uniform, 1000, rng), expected),
                                                alpha);
  INFO("detectable distance " << d);
  CHECK(d == Approx(0.07).margin(0.01));  // the critical value 27.9 at 9 dof, λ ≈ 20.0: sqrt(20.0 / 4000)
  const auto rate = [&](double tv) {
    std::vector<double> off(10);
    for (std::size_t i = 0; i < 10; ++i) off[i] = 0.1 + (i < 5 ? -tv : tv) / 5.0;
    int rejected = 0;
    for (int i = 0; i < 400; ++i) rejected += testing::chi_square_test(multinomial(off, 1000, rng), expected).p_value <= alpha;
    return rejected / 400.0;
  };
  const double at = rate(d), twice = rate(2.0 * d), half = rate(0.5 * d);
  INFO("rejected: " << half << " at d / 2, " << at << " at d, " << twice << " at 2 d");
  CHECK(at > 0.35);
  CHECK(at < 0.65);
  CHECK(twice > 0.95);
  CHECK(half < 0.1);
  // Over the same bins it falls as 1 / sqrt(samples); more bins at the same samples raise it (a
  // larger critical value): 40 equal cells at 1000 samples see less than 10 do.
  auto many = testing::chi_square_test(multinomial(uniform, 1000, rng), expected);
  many.samples = 4000.0;
  CHECK(testing::detectable_distance(many, alpha) == Approx(d / 2.0).epsilon(1e-9));
  const std::vector<double> forty(40, 0.025);
  const double d40 = testing::detectable_distance(
      testing::chi_square_test(multinomial(forty, 1000, rng), xt::adapt(forty, {forty.size()})), alpha);
  INFO("40 cells: " << d40);
  CHECK(d40 > 1.2 * d);
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(testing::detectable_distance(many, 0.0), Contains("alpha must be in (0, 1), got 0"));
  CHECK_THROWS_WITH(testing::detectable_distance(many, 1.0), Contains("alpha must be in (0, 1)"));
  const auto one = testing::chi_square_test(xt::xarray<double>{7.0, 0.0}, xt::xarray<double>{1.0, 0.0});
  CHECK_THROWS_WITH(testing::detectable_distance(one, alpha), Contains("one bin"));
  CHECK_THROWS_WITH(testing::detectable_distance(testing::fit_result{}, alpha), Contains("no samples"));
}
