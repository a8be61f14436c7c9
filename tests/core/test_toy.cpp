#include <specsample/specsample.hpp>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

using namespace specsample;

TEST_CASE("a Markov model returns the log of its transition column for each appended token", "[toy][markov]") {
  auto m = toy::markov::random(4, 2, 1);
  const std::vector<token> t{1, 3, 0};
  const Eigen::MatrixXf logits = m.append(t);
  REQUIRE(logits.rows() == 4);
  REQUIRE(logits.cols() == 3);
  for (Eigen::Index j = 0; j < 3; ++j) {
    const Eigen::VectorXf p = m.next_probabilities(std::span<const token>(t).first(static_cast<std::size_t>(j) + 1));
    CHECK((logits.col(j).array().exp() - p.array()).abs().maxCoeff() < 1e-6f);
    CHECK(p.sum() == Approx(1.0));
  }
  CHECK(m.size() == 3);
  m.truncate(1);
  CHECK(m.size() == 1);
  CHECK_THROWS_AS(m.truncate(2), error);
  CHECK_THROWS_WITH(m.append(std::vector<token>{4}), Catch::Matchers::Contains("token 4 is out of range"));
  // Its transition column is read for a context too: checked the same (it read out of bounds).
  for (const token bad : {4, -1000000}) {
    CHECK_THROWS_WITH(m.next_probabilities(std::vector<token>{0, bad}),
                      Catch::Matchers::Contains("toy::markov::next_probabilities: token " + std::to_string(bad) +
                                                " is out of range"));
  }
}

TEST_CASE("an order-2 model depends on exactly the last two tokens", "[toy][markov]") {
  auto m = toy::markov::random(3, 2, 5);
  const std::vector<token> a{0, 1, 2}, b{2, 1, 2};
  CHECK(m.next_probabilities(a) == m.next_probabilities(b));
  const std::vector<token> c{0, 0, 2};
  CHECK(m.next_probabilities(a) != m.next_probabilities(c));
}

TEST_CASE("similar_to dials the distance to the base model", "[toy][markov]") {
  auto base = toy::markov::random(5, 1, 1);
  CHECK(toy::markov::similar_to(base, 1.0, 2).transitions().isApprox(base.transitions()));
  const double far = (toy::markov::similar_to(base, 0.0, 2).transitions() - base.transitions()).cwiseAbs().sum();
  const double near = (toy::markov::similar_to(base, 0.8, 2).transitions() - base.transitions()).cwiseAbs().sum();
  CHECK(near < far);
  CHECK_THROWS_AS(toy::markov::similar_to(base, 1.5, 2), error);
}

TEST_CASE("a corpus bigram model counts transitions with add-k smoothing", "[toy][markov]") {
  const std::vector<token> corpus{0, 1, 0, 1, 0, 2};
  auto m = toy::markov::from_corpus(corpus, 3, 1, 0.5);
  // after 0: counts {0, 2, 1} + 0.5 -> {0.5, 2.5, 1.5} / 4.5
  const std::vector<token> ctx{0};
  const Eigen::VectorXf p = m.next_probabilities(ctx);
  CHECK(p(0) == Approx(0.5 / 4.5));
  CHECK(p(1) == Approx(2.5 / 4.5));
  CHECK(p(2) == Approx(1.5 / 4.5));
  CHECK_THROWS_WITH(toy::markov::from_corpus(std::vector<token>{0, 3}, 3, 1, 1.0), Catch::Matchers::Contains("corpus"));
}

TEST_CASE("transition tables with the wrong shape or no mass are refused", "[toy][markov][errors]") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(toy::markov(Eigen::MatrixXf::Ones(3, 3), 1), Contains("needs 4 columns"));
  Eigen::MatrixXf t = Eigen::MatrixXf::Ones(3, 4);
  t.col(2).setZero();
  CHECK_THROWS_WITH(toy::markov(t, 1), Contains("column 2"));
  CHECK_THROWS_WITH(toy::markov::random(5000, 3, 1), Contains("too large"));
  // Order 0 too: a huge vocab (or one whose + 1 wraps) is refused, not filled or divided by zero.
  for (const std::size_t v : {std::size_t{3'000'000'000}, std::numeric_limits<std::size_t>::max()}) {
    CHECK_THROWS_WITH(toy::markov::random(v, 0, 1), Contains("too large"));
    CHECK_THROWS_WITH(toy::markov::random(v, 1, 1), Contains("too large"));
  }
}

TEST_CASE("columns whose float sum overflows are normalised, not zeroed, and nonsense arguments are named",
          "[toy][markov][errors]") {
  using Catch::Matchers::Contains;
  constexpr float big = 3e38f;  // two of them sum past FLT_MAX
  Eigen::MatrixXf t = Eigen::MatrixXf::Ones(3, 4);
  t.col(0) << big, big, 1.0f;  // the state after token 0
  const toy::markov m(t, 1);
  const Eigen::VectorXf p = m.next_probabilities(std::vector<token>{0});
  CHECK(p(0) == Approx(0.5));
  CHECK(p(1) == Approx(0.5));
  CHECK(p(2) > 0.0f);  // 1 / 6e38, a subnormal float: the transition stays possible
  CHECK(p.sum() == Approx(1.0));
  // A Dirichlet concentration at FLT_MAX draws entries near FLT_MAX: nearly uniform columns.
  const auto flat = toy::markov::random(3, 1, 1, std::numeric_limits<float>::max());
  CHECK(flat.next_probabilities(std::vector<token>{1}).isApproxToConstant(1.0f / 3.0f, 1e-4f));
  CHECK_THROWS_WITH(toy::markov::random(3, 1, 1, std::numeric_limits<float>::infinity()),
                    Contains("concentration must be finite and > 0, got inf"));
  CHECK_THROWS_WITH(toy::markov::random(3, 1, 1, std::numeric_limits<float>::quiet_NaN()),
                    Contains("concentration must be finite and > 0"));
  for (const double add_k : {std::numeric_limits<double>::infinity(), 1e300, -1.0}) {
    CHECK_THROWS_WITH(toy::markov::from_corpus(std::vector<token>{0, 1}, 3, 1, add_k),
                      Contains("add_k must be in [0, "));
  }
  // A positive add_k that rounds to float 0 would leave unseen transitions impossible: refused.
  CHECK_THROWS_WITH(toy::markov::from_corpus(std::vector<token>{0, 1}, 3, 1, 1e-50),
                    Contains("add_k 1e-50 is below the smallest float"));
  const auto tiny = toy::markov::from_corpus(std::vector<token>{0, 1}, 3, 1, std::numeric_limits<float>::denorm_min());
  CHECK(tiny.next_probabilities(std::vector<token>{0})(2) > 0.0f);  // unseen, still possible
  const auto smooth = toy::markov::from_corpus(std::vector<token>{0, 1}, 3, 1, std::numeric_limits<float>::max());
  CHECK(smooth.next_probabilities(std::vector<token>{0}).isApproxToConstant(1.0f / 3.0f, 1e-4f));
}

TEST_CASE("the callable adapter calls the function with the context so far", "[toy][callable]") {
  auto f = [](std::span<const token> ctx) {
    Eigen::VectorXf l = Eigen::VectorXf::Zero(3);
    l(static_cast<Eigen::Index>(ctx.size() % 3)) = 5.0f;
    return l;
  };
  toy::callable_model m(3, f);
  static_assert(language_model<decltype(m)>);
  const Eigen::MatrixXf logits = m.append(std::vector<token>{0, 0});
  CHECK(logits(1, 0) == 5.0f);
  CHECK(logits(2, 1) == 5.0f);
  std::mt19937 rng(1);
  speculative_params p;
  p.max_new_tokens = 4;
  p.sampling.temperature = 0.0f;
  m.truncate(0);
  CHECK(autoregressive_sample(m, std::vector<token>{0}, p, rng).tokens == std::vector<token>{1, 2, 0, 1});

  toy::callable_model bad(3, [](std::span<const token>) { return Eigen::VectorXf(Eigen::VectorXf::Zero(2)); });
  CHECK_THROWS_WITH(bad.append(std::vector<token>{0}), Catch::Matchers::Contains("returned 2 × 1 logits"));
}

TEST_CASE("the callable adapter checks the shape of what the callable returns", "[toy][callable][errors]") {
  // A matrix of other columns than one is refused, naming its shape (assigned to a vector, it
  // asserted in Eigen, or without assertions was taken as garbage); a row of V logits serves as a
  // column.
  for (const auto& [rows, cols] : {std::pair{3, 3}, std::pair{2, 2}, std::pair{3, 0}}) {
    toy::callable_model m(3, [rows = rows, cols = cols](std::span<const token>) { return Eigen::MatrixXf::Zero(rows, cols).eval(); });
    CHECK_THROWS_WITH(m.append(std::vector<token>{0}),
                      Catch::Matchers::Contains(fmt::format("returned {} × {} logits for a vocabulary of 3", rows, cols)));
    CHECK(m.size() == 0);
  }
  toy::callable_model row(3, [](std::span<const token>) {
    Eigen::MatrixXf l(1, 3);
    l << 1.0f, 2.0f, 3.0f;
    return l;
  });
  const Eigen::MatrixXf logits = row.append(std::vector<token>{0});
  CHECK(logits.rows() == 3);
  CHECK(logits.cols() == 1);
  CHECK(logits(2, 0) == 3.0f);
}

TEST_CASE("a failed append leaves the callable adapter's context unchanged", "[toy][callable][errors]") {
  using Catch::Matchers::Contains;
  std::size_t calls = 0;
  std::size_t throw_at = 0;      // context length at which the callable throws (0 = never)
  std::size_t short_at = 0;      // context length at which it returns too few logits (0 = never)
  auto f = [&](std::span<const token> ctx) {
    ++calls;
    if (ctx.size() == throw_at) throw std::runtime_error("model failed");
    return Eigen::VectorXf(Eigen::VectorXf::Zero(ctx.size() == short_at ? 2 : 3));
  };
  toy::callable_model m(3, f);
  (void)m.append(std::vector<token>{0, 1});
  const std::vector<token> before{0, 1};
  const auto context = [&m] { return std::vector<token>(m.context().begin(), m.context().end()); };
  calls = 0;

  // An out-of-range id anywhere in the batch: rejected before the callable runs or the context grows.
  CHECK_THROWS_WITH(m.append(std::vector<token>{2, 3}), Contains("token 3 at position 1") && Contains("out of range"));
  CHECK_THROWS_WITH(m.append(std::vector<token>{-1, 0}), Contains("token -1 at position 0"));
  CHECK(calls == 0);
  CHECK(context() == before);

  // The callable throws on the second token of the batch: the first is rolled back too.
  throw_at = 4;
  CHECK_THROWS_WITH(m.append(std::vector<token>{2, 2}), Contains("model failed"));
  CHECK(calls == 2);
  CHECK(context() == before);
  throw_at = 0;

  // The callable returns the wrong length on the third token: rolled back as well.
  short_at = 5;
  CHECK_THROWS_WITH(m.append(std::vector<token>{2, 0, 1}), Contains("returned 2 × 1 logits"));
  CHECK(context() == before);
  short_at = 0;

  // Still usable afterwards.
  CHECK(m.append(std::vector<token>{2, 0, 1}).cols() == 3);
  CHECK(context() == std::vector<token>{0, 1, 2, 0, 1});
}
