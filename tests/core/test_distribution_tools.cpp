#include <specsample/specsample.hpp>
#include <specsample/testing/distribution.hpp>

#include <catch2/catch.hpp>

#include <xtensor/xview.hpp>
#include <xtensor/xreducer.hpp>

#include <cstddef>
#include <random>
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

TEST_CASE("the exactness tools refuse sizes they cannot enumerate or test", "[testing][errors]") {
  using Catch::Matchers::Contains;
  auto m = toy::markov::random(3, 1, 2);
  const std::vector<token> prompt{1};
  CHECK_THROWS_WITH(testing::exact_sequence_distribution(m, prompt, 0, {}), Contains("length must be in 1..64"));
  // A length in range whose V^L exceeds the 1e7 cap is refused by the cap; a huge one by the
  // range check, before any counting.
  CHECK_THROWS_WITH(testing::exact_sequence_distribution(m, prompt, 20, {}), Contains("too many to enumerate"));
  CHECK_THROWS_WITH(testing::exact_sequence_distribution(m, prompt, std::size_t(-1), {}),
                    Contains("length must be in 1..64"));
  // One token: any length is one sequence, but the enumeration recurses per token.
  auto one = toy::markov::random(1, 0, 2);
  CHECK(testing::exact_sequence_distribution(one, std::vector<token>{0}, 64, {}).size() == 1);
  CHECK_THROWS_WITH(testing::exact_sequence_distribution(one, std::vector<token>{0}, 40'000, {}),
                    Contains("length must be in 1..64"));
  // No samples would be a vacuous PASS.
  auto draft = toy::markov::random(3, 1, 3);
  speculative_params params;
  params.max_new_tokens = 2;
  std::mt19937_64 rng(1);
  CHECK_THROWS_WITH(testing::speculative_fit(draft, m, prompt, params, 0, rng), Contains("samples must be >= 1"));
}

TEST_CASE("the G-test accepts a fair sample and rejects a biased one", "[testing]") {
  xt::xarray<double> expected = {0.5, 0.3, 0.2};
  xt::xarray<double> fair = {5020.0, 2990.0, 1990.0};
  xt::xarray<double> biased = {5400.0, 2800.0, 1800.0};
  CHECK(testing::g_test(fair, expected).p_value > 0.5);
  CHECK(testing::g_test(biased, expected).p_value < 1e-6);
  xt::xarray<double> impossible = {1.0, 0.0, 0.0};
  xt::xarray<double> zero_first = {0.0, 0.5, 0.5};
  CHECK(testing::g_test(impossible, zero_first).p_value == 0.0);
}

TEST_CASE("the chi-square survival function matches known quantiles", "[testing]") {
  CHECK(testing::detail::gamma_q(0.5, 3.841458820694124 / 2) == Approx(0.05).epsilon(1e-6));   // dof 1
  CHECK(testing::detail::gamma_q(5.0, 23.209251158954356 / 2) == Approx(0.01).epsilon(1e-6));  // dof 10
  CHECK(testing::detail::gamma_q(50.0, 149.44925277903887 / 2) == Approx(0.001).epsilon(1e-5));  // dof 100
}
