#include <specsample/sampling/random.hpp>
#include <specsample/sampling/verify.hpp>
#include <specsample/testing/distribution.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace specsample;

namespace {
// Distribution of the first emitted token of a K = 1 round: draft x ~ q, then verify.
Eigen::VectorXd first_token_frequencies(const Eigen::VectorXf& q, const Eigen::VectorXf& p, int n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Eigen::MatrixXf qm = q;
  Eigen::MatrixXf pm(p.size(), 2);
  pm.col(0) = p;
  pm.col(1) = p;
  Eigen::VectorXd counts = Eigen::VectorXd::Zero(p.size());
  for (int i = 0; i < n; ++i) {
    const token x = sample_categorical(q, rng);
    const auto r = verify_tokenwise(std::span<const token>(&x, 1), qm, pm, rng);
    counts(r.accepted == 1 ? x : r.next) += 1.0;
  }
  return counts / n;
}
}  // namespace

TEST_CASE("uniform_01 stays in the half-open unit interval for 32- and 64-bit generators", "[random]") {
  std::mt19937 a(1);
  std::mt19937_64 b(1);
  std::minstd_rand c(1);  // range [1, 2^31 - 2]
  double lo = 1.0, hi = 0.0, sum = 0.0;
  for (int i = 0; i < 100000; ++i) {
    for (double u : {uniform_01(a), uniform_01(b), uniform_01(c)}) {
      lo = std::min(lo, u);
      hi = std::max(hi, u);
      sum += u;
    }
  }
  CHECK(lo >= 0.0);
  CHECK(hi < 1.0);
  CHECK(sum / 300000 == Approx(0.5).margin(0.005));
}

TEST_CASE("sample_categorical names weights it cannot draw from", "[random]") {
  std::mt19937_64 rng(4);
  Eigen::VectorXf w(5);
  w << 0.5f, 2.0f, -0.25f, 1.0f, 1.0f;  // logits where probabilities belong: the sum is positive
  CHECK_THROWS_WITH(sample_categorical(w, rng),
                    "sample_categorical: weight -0.25 at index 2; weights must be non-negative");
  const std::string rule = "; they must be finite and non-negative, with at least one positive";
  w << 0.5f, 2.0f, std::nanf(""), 1.0f, 1.0f;
  CHECK_THROWS_WITH(sample_categorical(w, rng), "sample_categorical: the 5 weights sum to nan" + rule);
  w << 0.5f, 2.0f, INFINITY, 1.0f, 1.0f;
  CHECK_THROWS_WITH(sample_categorical(w, rng), "sample_categorical: the 5 weights sum to inf" + rule);
  w.setZero();
  CHECK_THROWS_WITH(sample_categorical(w, rng), "sample_categorical: the 5 weights sum to 0" + rule);
  CHECK_THROWS_WITH(sample_categorical(Eigen::VectorXf(0), rng), "sample_categorical: the 0 weights sum to 0" + rule);
  // The same checks on an expression that is not contiguous floats (the generic path).
  Eigen::MatrixXf m = Eigen::MatrixXf::Ones(2, 3);
  m(0, 2) = -1.0f;
  REQUIRE_THROWS_WITH(sample_categorical(m.row(0), rng),
                      "sample_categorical: weight -1 at index 2; weights must be non-negative");
  m.row(0).setZero();
  REQUIRE_THROWS_WITH(sample_categorical(m.row(0), rng), Catch::Contains("sum to 0"));
}

TEST_CASE("sample_categorical draws in proportion to the weights and never a zero weight", "[random]") {
  Eigen::VectorXf w(5);
  w << 0.0f, 2.0f, 0.0f, 1.0f, 1.0f;  // unnormalised on purpose
  std::mt19937_64 rng(4);
  xt::xarray<double> counts = xt::zeros<double>({5});
  for (int i = 0; i < 100000; ++i) counts(static_cast<std::size_t>(sample_categorical(w, rng))) += 1.0;
  xt::xarray<double> expected = {0.0, 0.5, 0.0, 0.25, 0.25};
  const auto fit = testing::chi_square_test(counts, expected);
  CHECK(fit.impossible == 0);
  CHECK(fit.p_value > 1e-3);
  // The same test rejects a draw off by 5% in one weight (2.1 for 2): it can fail.
  Eigen::VectorXf off = w;
  off(1) = 2.1f;
  xt::xarray<double> broken = xt::zeros<double>({5});
  for (int i = 0; i < 100000; ++i) broken(static_cast<std::size_t>(sample_categorical(off, rng))) += 1.0;
  CHECK(testing::chi_square_test(broken, expected).p_value < 1e-6);
}

TEST_CASE("categorical and residual draws are exact across many blocks of the blocked inverse CDF",
          "[random][residual]") {
  // 300 weights = 5 blocks of detail::sample_block (64): one block all zero, sparse and dense ones,
  // so the block scan, the skip of an empty block and the walk inside a block all matter. (The
  // exactness tests' vocabularies of 3-6 fit in one block.)
  constexpr std::size_t V = 300;
  static_assert(V > 4 * detail::sample_block);
  std::mt19937 gen(21);
  std::exponential_distribution<float> e(1.0f);
  Eigen::VectorXf p(V), q(V);
  for (std::size_t i = 0; i < V; ++i) {
    const auto j = static_cast<Eigen::Index>(i);
    const bool empty_block = i >= 64 && i < 128;
    p(j) = empty_block || i % 7 == 3 ? 0.0f : e(gen);
    q(j) = i % 5 == 0 ? 0.0f : e(gen);
  }
  p /= p.sum();
  q /= q.sum();
  const auto draws = [](auto draw) {
    std::mt19937_64 rng(22);
    xt::xarray<double> counts = xt::zeros<double>({V});
    for (int n = 0; n < 200000; ++n) counts(static_cast<std::size_t>(draw(rng))) += 1.0;
    return counts;
  };
  xt::xarray<double> want_p = xt::zeros<double>({V}), want_r = xt::zeros<double>({V});
  double mass = 0.0;
  for (std::size_t i = 0; i < V; ++i) {
    const auto j = static_cast<Eigen::Index>(i);
    want_p(i) = p(j);
    want_r(i) = std::max(0.0, static_cast<double>(p(j)) - static_cast<double>(q(j)));
    mass += want_r(i);
  }
  want_r /= mass;
  const auto categorical = testing::chi_square_test(draws([&](auto& rng) { return sample_categorical(p, rng); }), want_p);
  INFO("categorical: X2 = " << categorical.statistic << ", dof = " << categorical.dof << ", p = " << categorical.p_value);
  CHECK(categorical.impossible == 0);
  CHECK(categorical.p_value > 1e-3);
  const auto residual = testing::chi_square_test(draws([&](auto& rng) { return sample_residual(p, q, rng); }), want_r);
  INFO("residual: X2 = " << residual.statistic << ", dof = " << residual.dof << ", p = " << residual.p_value);
  CHECK(residual.impossible == 0);
  CHECK(residual.p_value > 1e-3);

  // Broken variant: the right block, then a uniform pick among its positive weights (the walk
  // inside the block skipped). The same statistic must reject it.
  const auto broken = testing::chi_square_test(draws([&](auto& rng) {
    auto weight = [&](std::size_t i) { return static_cast<double>(p(static_cast<Eigen::Index>(i))); };
    const double u = uniform_01(rng) * detail::sum_blocks(weight, V).total;
    double cum = 0.0;
    for (std::size_t b = 0; b < V; b += detail::sample_block) {
      const std::size_t end = std::min(V, b + detail::sample_block);
      const double block = detail::weight_sum(weight, b, end);
      if (u < cum + block) {
        std::vector<token> positive;
        for (std::size_t i = b; i < end; ++i) {
          if (weight(i) > 0.0) positive.push_back(static_cast<token>(i));
        }
        return positive[std::uniform_int_distribution<std::size_t>(0, positive.size() - 1)(rng)];
      }
      cum += block;
    }
    return token{0};
  }), want_p);
  INFO("broken: X2 = " << broken.statistic << ", p = " << broken.p_value);
  CHECK(broken.p_value < 1e-6);

  // Block verification's residual, norm(max(0, w·p − q)) with w < 1, from contiguous columns (the
  // float path) and from strided rows (the per-entry path); the broken variant leaves the weight
  // out, and the same statistic must reject it.
  constexpr double w = 0.6;
  xt::xarray<double> want_w = xt::zeros<double>({V});
  double mass_w = 0.0;
  for (std::size_t i = 0; i < V; ++i) {
    const auto j = static_cast<Eigen::Index>(i);
    want_w(i) = std::max(0.0, w * static_cast<double>(p(j)) - static_cast<double>(q(j)));
    mass_w += want_w(i);
  }
  want_w /= mass_w;
  Eigen::MatrixXf rows(2, V);
  rows.row(0) = p.transpose();
  rows.row(1) = q.transpose();
  for (const bool strided : {false, true}) {
    const auto weighted = testing::chi_square_test(draws([&](auto& rng) {
      return strided ? sample_residual(rows.row(0), rows.row(1), rng, w) : sample_residual(p, q, rng, w);
    }), want_w);
    INFO((strided ? "strided" : "contiguous") << " residual, w = " << w << ": X2 = " << weighted.statistic
                                               << ", dof = " << weighted.dof << ", p = " << weighted.p_value);
    CHECK(weighted.impossible == 0);
    CHECK(weighted.p_value > 1e-3);
  }
  const auto unweighted = testing::chi_square_test(draws([&](auto& rng) { return sample_residual(p, q, rng); }), want_w);
  INFO("the weight left out: X2 = " << unweighted.statistic << ", p = " << unweighted.p_value);
  CHECK(unweighted.p_value < 1e-6);
}

TEST_CASE("a draw reads its stored block sums and sums any later block again, to the same token",
          "[random][residual]") {
  // sum_blocks stores the first block_totals::kept block sums (vocabularies up to 65536); beyond
  // them draw_weighted sums the blocks again. Both ways must give the same token for the same
  // uniform: below, one draw with everything it may store, one with nothing stored.
  for (const std::size_t V : {300u, 4096u, 70001u}) {
    std::mt19937 gen(static_cast<unsigned>(V));
    std::exponential_distribution<float> e(1.0f);
    std::vector<float> w(V);
    for (std::size_t i = 0; i < V; ++i) w[i] = i % 11 == 4 ? 0.0f : e(gen);
    detail::float_weights weight{w.data()};
    const detail::block_totals stored = detail::sum_blocks(weight, V);
    const std::size_t blocks = (V + detail::sample_block - 1) / detail::sample_block;
    INFO("V = " << V);
    REQUIRE(stored.stored == std::min(blocks, detail::block_totals::kept));
    double total = 0.0;  // the sequential sum of the blocks, as the scan adds them
    for (std::size_t b = 0; b < V; b += detail::sample_block) total += detail::weight_sum(weight, b, std::min(V, b + detail::sample_block));
    REQUIRE(stored.total == total);
    detail::block_totals none = stored;
    none.stored = 0;
    std::mt19937_64 a(7), b(7);
    for (int n = 0; n < 3000; ++n) REQUIRE(detail::draw_weighted(weight, V, stored, a) == detail::draw_weighted(weight, V, none, b));
  }
}

TEST_CASE("the block sums of float weights, in one vector loop, are the scalar per-block sums bit for bit on every "
          "instruction set",
          "[random][residual]") {
  for (const isa requested : {isa::generic, isa::avx2, isa::avx512}) {
    const isa level = simd::resolve(requested);
    for (const std::size_t V : {1u, 7u, 63u, 64u, 65u, 300u, 4096u, 70001u}) {
      std::mt19937 gen(static_cast<unsigned>(V) + 3);
      std::exponential_distribution<float> e(1.0f);
      std::vector<float> p(V), q(V);
      for (std::size_t i = 0; i < V; ++i) {
        p[i] = i % 11 == 4 ? 0.0f : e(gen);
        q[i] = i % 7 == 2 ? 0.0f : e(gen);
      }
      for (const bool residual : {false, true}) {
        INFO(isa_name(level) << ", V = " << V << (residual ? ", residual" : ", plain"));
        const double s = 0.8;
        detail::float_weights vector_path{p.data(), residual ? q.data() : nullptr, s, level};
        auto scalar_path = [&](std::size_t i) {
          return residual ? simd::residual_weight(static_cast<double>(p[i]), static_cast<double>(q[i]), s)
                          : static_cast<double>(p[i]);
        };
        const detail::block_totals got = detail::sum_blocks(vector_path, V);
        const detail::block_totals want = detail::sum_blocks(scalar_path, V);
        REQUIRE(got.stored == want.stored);
        CHECK(got.total == want.total);
        for (std::size_t k = 0; k < got.stored; ++k) REQUIRE(got.sums[k] == want.sums[k]);
      }
    }
  }
}

TEST_CASE("a rejected draft token is resampled from the residual", "[verify]") {
  // q puts 0.9 on token 0; p puts 0.2. The emitted token must follow p overall.
  Eigen::VectorXf q(3), p(3);
  q << 0.9f, 0.05f, 0.05f;
  p << 0.2f, 0.5f, 0.3f;
  const auto f = first_token_frequencies(q, p, 200000, 11);
  CHECK(f(0) == Approx(0.2).margin(0.005));
  CHECK(f(1) == Approx(0.5).margin(0.005));
  CHECK(f(2) == Approx(0.3).margin(0.005));
}

TEST_CASE("a draft token the target cannot produce is always rejected", "[verify]") {
  Eigen::MatrixXf q(3, 1), p(3, 2);
  q << 0.0f, 0.0f, 1.0f;
  p << 0.5f, 0.5f, 0.5f, 0.5f, 0.0f, 0.0f;
  std::mt19937_64 rng(1);
  const token x = 2;
  for (int i = 0; i < 1000; ++i) {
    const auto r = verify_tokenwise(std::span<const token>(&x, 1), q, p, rng);
    CHECK(r.accepted == 0);
    CHECK(r.next != 2);
    CHECK_FALSE(r.bonus);
  }
}

TEST_CASE("all drafts accepted yields a bonus token from the last target column", "[verify]") {
  Eigen::MatrixXf q = Eigen::MatrixXf::Constant(3, 2, 1.0f / 3), p(3, 3);
  p.col(0) = q.col(0);
  p.col(1) = q.col(1);
  p.col(2) << 0.0f, 0.0f, 1.0f;
  std::mt19937_64 rng(1);
  const std::vector<token> drafts{0, 1};
  const auto r = verify_tokenwise(drafts, q, p, rng);
  CHECK(r.accepted == 2);
  CHECK(r.bonus);
  CHECK(r.next == 2);
}

TEST_CASE("the residual of identical distributions falls back to p", "[verify][residual]") {
  Eigen::VectorXf p(3);
  p << 0.0f, 1.0f, 0.0f;
  std::mt19937_64 rng(1);
  CHECK(sample_residual(p, p, rng) == 1);
  Eigen::VectorXf q(3);
  q << 0.5f, 0.0f, 0.5f;
  Eigen::VectorXf p2(3);
  p2 << 0.25f, 0.5f, 0.25f;
  for (int i = 0; i < 100; ++i) CHECK(sample_residual(p2, q, rng) == 1);  // max(0, p - q) = e_1 * 0.5
  // The fallback draws from p, not its most probable token: a chi-square fit against p passes, and
  // the same statistic rejects uniform draws over p's support.
  Eigen::VectorXf wide(3);
  wide << 0.25f, 0.25f, 0.5f;
  const xt::xarray<double> expected = {0.25, 0.25, 0.5};
  xt::xarray<double> counts = xt::zeros<double>({3}), uniform = xt::zeros<double>({3});
  std::uniform_int_distribution<std::size_t> any(0, 2);
  for (int i = 0; i < 100000; ++i) {
    counts(static_cast<std::size_t>(sample_residual(wide, wide, rng))) += 1.0;
    uniform(any(rng)) += 1.0;
  }
  const auto fit = testing::chi_square_test(counts, expected);
  CHECK(fit.impossible == 0);
  CHECK(fit.p_value > 1e-3);
  CHECK(testing::chi_square_test(uniform, expected).p_value < 1e-6);
}

namespace {
// Draft token x verified by block verification or token-wise (verify_tokenwise), given q and p whole.
verify_result verify_one(bool block, token x, const Eigen::Ref<const Eigen::MatrixXf>& q,
                         const Eigen::Ref<const Eigen::MatrixXf>& p, std::mt19937_64& rng) {
  const std::span<const token> drafts(&x, 1);
  return block ? block_verifier{}(drafts, q, p, rng) : verify_tokenwise(drafts, q, p, rng);
}
}  // namespace

TEST_CASE("verify rejects inconsistent inputs", "[verify][errors]") {
  Eigen::MatrixXf q = Eigen::MatrixXf::Constant(3, 1, 1.0f / 3), p = Eigen::MatrixXf::Constant(3, 1, 1.0f / 3);
  std::mt19937_64 rng(1);
  const token x = 0;
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(verify_tokenwise(std::span<const token>(&x, 1), q, p, rng), Contains("p of shape (V, >=2)"));
  Eigen::MatrixXf p2 = Eigen::MatrixXf::Constant(3, 2, 1.0f / 3);
  const token y = 7;
  CHECK_THROWS_WITH(verify_tokenwise(std::span<const token>(&y, 1), q, p2, rng), Contains("out of range"));
  Eigen::MatrixXf q0 = Eigen::MatrixXf::Zero(3, 1);
  CHECK_THROWS_WITH(verify_tokenwise(std::span<const token>(&x, 1), q0, p2, rng),
                    Contains("has draft probability q = 0 (draft 0)"));
  // NaN where the verifiers read p or q, under either rule; a residual's weight outside (0, 1].
  Eigen::MatrixXf qn = q, pn = p2;
  qn(0, 0) = std::nanf("");
  pn(0, 0) = std::nanf("");
  for (const bool block : {false, true}) {
    const auto run = [&](const Eigen::MatrixXf& qq, const Eigen::MatrixXf& pp) {
      return verify_one(block, x, qq, pp, rng);
    };
    CHECK_THROWS_WITH(run(qn, p2), Contains("has draft probability q = nan (draft 0)"));
    CHECK_THROWS_WITH(run(q, pn), Contains("verify: p(0, 0) = nan; p must hold distributions"));
  }
  for (const double w : {0.0, -1.0, 1.5, std::nan("")}) {
    CHECK_THROWS_WITH(sample_residual(p2.col(0), q.col(0), rng, w), Contains("the weight of p must be in (0, 1]"));
  }
  // A verifier built directly is checked too: leniency 0 would accept every draft, NaN none.
  for (const double b : {0.0, -0.5, 1.5, std::nan("")}) {
    CHECK_THROWS_WITH((tokenwise_verifier{.leniency = b}(std::span<const token>(&x, 1), q, p2, rng)),
                      Contains("leniency must be in (0, 1]"));
  }
}

TEST_CASE("verify and sample_residual name a NaN, infinite or negative entry away from the drafts",
          "[verify][residual][errors]") {
  // Such an entry would count as 0 in the residual's and block verification's sums: a token drawn
  // from garbage. Every entry the rules may read is checked: q's first K columns, p's first K + 1.
  const Eigen::MatrixXf q = Eigen::MatrixXf::Constant(4, 1, 0.25f), p = Eigen::MatrixXf::Constant(4, 2, 0.25f);
  const token x = 0;
  const std::string rule = " must hold distributions (every entry finite and >= 0)";
  for (const bool block : {false, true}) {
    std::mt19937_64 rng(2);
    const auto run = [&](const Eigen::MatrixXf& qq, const Eigen::MatrixXf& pp) {
      return verify_one(block, x, qq, pp, rng);
    };
    Eigen::MatrixXf bad = p;
    bad(2, 0) = std::nanf("");
    CHECK_THROWS_WITH(run(q, bad), "verify: p(2, 0) = nan; p" + rule);
    bad = p;
    bad(3, 1) = INFINITY;  // the bonus column
    CHECK_THROWS_WITH(run(q, bad), "verify: p(3, 1) = inf; p" + rule);
    Eigen::MatrixXf badq = q;
    badq(1, 0) = -0.125f;
    CHECK_THROWS_WITH(run(badq, p), "verify: q(1, 0) = -0.125; q" + rule);
    // Columns past those the K drafts use are not read, so not checked.
    Eigen::MatrixXf wide_q(4, 2), wide_p(4, 3);
    wide_q << q, Eigen::VectorXf::Constant(4, std::nanf(""));
    wide_p << p, Eigen::VectorXf::Constant(4, -1.0f);
    CHECK_NOTHROW(run(wide_q, wide_p));
  }
  std::mt19937_64 rng(3);
  Eigen::VectorXf pv = p.col(0), qv = q.col(0);
  pv(2) = std::nanf("");
  CHECK_THROWS_WITH(sample_residual(pv, qv, rng), "sample_residual: p(2) = nan; p" + rule);
  pv = p.col(0);
  qv(3) = -INFINITY;
  CHECK_THROWS_WITH(sample_residual(pv, qv, rng), "sample_residual: q(3) = -inf; q" + rule);
  // Rows of a matrix as well as columns (any Eigen vector expression).
  Eigen::MatrixXf rows(2, 4);
  rows.row(0) = p.col(0).transpose();
  rows.row(1) = q.col(0).transpose();
  rows(1, 1) = std::nanf("");
  CHECK_THROWS_WITH(sample_residual(rows.row(0), rows.row(1), rng), "sample_residual: q(1) = nan; q" + rule);
  // Double vectors are checked as doubles: -1e-50 is negative, 1e300 finite.
  Eigen::VectorXd pd = p.col(0).cast<double>(), qd = q.col(0).cast<double>();
  pd(1) = -1e-50;
  CHECK_THROWS_WITH(sample_residual(pd, qd, rng), "sample_residual: p(1) = -1e-50; p" + rule);
  pd(1) = 0.25;
  qd(2) = 1e300;  // finite, so past the entries' check, and refused by the sum's
  CHECK_THROWS_WITH(sample_residual(pd, qd, rng), "sample_residual: q sums to 1e+300; q must hold distributions "
                                                  "(entries summing to 1 within 0.001)");
  // -0 and the smallest subnormal are inside [0, FLT_MAX].
  Eigen::VectorXf ps = p.col(0), qs = q.col(0);
  ps(0) = -0.0f;
  ps(1) = 0.5f;
  qs(3) = std::numeric_limits<float>::denorm_min();
  qs(2) = 0.5f;
  CHECK_NOTHROW(sample_residual(ps, qs, rng));
}

TEST_CASE("verify names a column of p or q that does not sum to 1", "[verify][errors]") {
  // Weights left unnormalised (or logits) pass the entry check; the rules would then read a q its
  // drafts were not drawn from, or a p that is not the target's, and the output would not be the
  // target's distribution.
  const Eigen::MatrixXf q = Eigen::MatrixXf::Constant(4, 1, 0.25f), p = Eigen::MatrixXf::Constant(4, 2, 0.25f);
  const token x = 0;
  const std::string rule = " must hold distributions (entries summing to 1 within 0.001)";
  for (const bool block : {false, true}) {
    std::mt19937_64 rng(2);
    const auto run = [&](const Eigen::MatrixXf& qq, const Eigen::MatrixXf& pp) {
      return verify_one(block, x, qq, pp, rng);
    };
    CHECK_THROWS_WITH(run(q, p * 2.0f), "verify: column 0 of p sums to 2; p" + rule);
    Eigen::MatrixXf bonus = p;
    bonus(3, 1) = 0.0f;  // the bonus column: 0.75
    CHECK_THROWS_WITH(run(q, bonus), "verify: column 1 of p sums to 0.75; p" + rule);
    CHECK_THROWS_WITH(run(q * 0.5f, p), "verify: column 0 of q sums to 0.5; q" + rule);
    // Within the tolerance either way, and the columns no draft uses are not read.
    Eigen::MatrixXf near_q = q, near_p = p;
    near_q(1, 0) += 0.0009f;
    near_p(2, 1) -= 0.0009f;
    CHECK_NOTHROW(run(near_q, near_p));
    near_q(1, 0) += 0.0002f;
    CHECK_THROWS_WITH(run(near_q, p), Catch::Matchers::Contains("verify: column 0 of q sums to 1.0011"));
    Eigen::MatrixXf wide_q(4, 2), wide_p(4, 3);
    wide_q << q, Eigen::VectorXf::Constant(4, 3.0f);
    wide_p << p, Eigen::VectorXf::Zero(4);
    CHECK_NOTHROW(run(wide_q, wide_p));
  }
}

TEST_CASE("the tolerance of a distribution's sum admits float softmaxes and grows with the vocabulary",
          "[verify][errors]") {
  CHECK(distribution_tolerance(4) == 1e-3);
  CHECK(distribution_tolerance(32768) == 1e-3);
  CHECK(distribution_tolerance(50257) == 50257.0 / (1 << 25));
  // At GPT-2's vocabulary, through the vector sum of every level: refused off by 0.002, accepted off
  // by 0.0012 (the tolerance is 0.0015), either way, in p and in q.
  const Eigen::Index v = 50257;
  const token x = 0;
  for (const float scale : {1.002f, 0.998f, 1.0012f, 0.9988f}) {
    INFO("scale " << scale);
    const Eigen::MatrixXf even = Eigen::MatrixXf::Constant(v, 2, 1.0f / static_cast<float>(v));
    const Eigen::MatrixXf off = even * scale;
    const bool refused = std::abs(scale - 1.0f) > 0.0015f;
    std::mt19937_64 rng(1);
    for (const bool block : {false, true}) {
      const auto run = [&](const Eigen::MatrixXf& q, const Eigen::MatrixXf& p) {
        return verify_one(block, x, q.leftCols(1), p, rng);
      };
      if (refused) {
        CHECK_THROWS_WITH(run(even, off), Catch::Matchers::StartsWith("verify: column 0 of p sums to 0.99") ||
                                              Catch::Matchers::StartsWith("verify: column 0 of p sums to 1.00"));
        CHECK_THROWS_WITH(run(off, even), Catch::Matchers::Contains("verify: column 0 of q sums to"));
      } else {
        CHECK_NOTHROW(run(even, off));
        CHECK_NOTHROW(run(off, even));
      }
    }
  }
  // Softmaxes normalised by a float running sum, over 2^20 entries: of N(0, 3) logits summed from
  // the largest down, and of 2^20 equal logits, exp(-0.725) each (the worst of 2000 such values we
  // tried: nearly n · 2^-26): accepted, though both are off by more than 1e-3.
  const Eigen::Index n = Eigen::Index{1} << 20;
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  Eigen::VectorXf spread(n);
  for (float& e : spread) e = std::exp(normal(gen));
  std::sort(spread.begin(), spread.end(), std::greater<>());
  for (const Eigen::VectorXf& w : {spread, Eigen::VectorXf(Eigen::VectorXf::Constant(n, std::exp(-0.725f)))}) {
    float total = 0.0f;
    for (const float e : w) total += e;
    const Eigen::VectorXf softmax = w / total;
    const double off = std::abs(softmax.cast<double>().sum() - 1.0);
    INFO("the float sum is off by " << off);
    CHECK(off > 1e-3);
    const Eigen::MatrixXf q = softmax, p = softmax.replicate(1, 2);
    std::mt19937_64 rng(1);
    CHECK_NOTHROW(verify_tokenwise(std::span<const token>(&x, 1), q, p, rng));
    CHECK_NOTHROW(sample_residual(softmax, softmax, rng));
  }
}

TEST_CASE("find_outside finds the first entry outside an interval, a NaN anywhere included, and sums the entries on "
          "every instruction set",
          "[verify][simd]") {
  std::mt19937 rng(29);
  std::exponential_distribution<float> e(1.0f);
  std::uniform_int_distribution<int> small(0, 255);
  constexpr float most = std::numeric_limits<float>::max();
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  for (const isa requested : {isa::generic, isa::avx2, isa::avx512}) {
    const isa level = simd::resolve(requested);
    for (const std::size_t n : {0u, 1u, 7u, 8u, 9u, 15u, 16u, 17u, 31u, 32u, 33u, 47u, 63u, 64u, 65u, 4096u, 50257u}) {
      INFO(isa_name(level) << ", n = " << n);
      // Whole numbers up to 255: every partial sum is exact in float (below 2^24), so the sum is
      // exact whatever the order: an entry dropped or added twice shows.
      std::vector<float> whole(n);
      double exact = 0.0;
      for (float& v : whole) exact += static_cast<double>(v = static_cast<float>(small(rng)));
      simd::outside_scan scan = simd::find_outside(level, whole.data(), n, 0.0f, most);
      CHECK(scan.first == n);
      CHECK(scan.sum == exact);
      // One entry of 2^20 at every position of the short vectors (every lane of both accumulators
      // and the tails), at a few of the long ones.
      for (std::size_t at = 0; at < n; at = n <= 65 ? at + 1 : at + n / 3 + 1) {
        std::vector<float> y(n, 0.0f);
        y[at] = 0x1p20f;
        scan = simd::find_outside(level, y.data(), n, 0.0f, most);
        CHECK(scan.first == n);
        CHECK(scan.sum == 0x1p20);
      }
      // Fractions: within the documented n · 2^-28 of the exact sum.
      std::vector<float> x(n);
      for (float& v : x) v = e(rng);
      exact = 0.0;
      for (const float v : x) exact += static_cast<double>(v);
      scan = simd::find_outside(level, x.data(), n, 0.0f, most);
      CHECK(std::abs(scan.sum - exact) <= static_cast<double>(n) * 0x1p-28 * exact);
      if (n > 1) {  // the bounds themselves are inside
        x[0] = 0.0f;
        x[n - 1] = most;
        CHECK(simd::find_outside(level, x.data(), n, 0.0f, most).first == n);
      }
      // one bad entry at the first, a middle and the last position (the vector tails included),
      // then a second bad entry after it: the first is found
      for (const std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
        if (n == 0) break;
        for (const float bad : {nan, -inf, inf, -0.5f, -std::numeric_limits<float>::denorm_min()}) {
          INFO("at " << at << ": " << bad);
          std::vector<float> y = x;
          y[at] = bad;
          if (at + 1 < n) y[n - 1] = nan;
          CHECK(simd::find_outside(level, y.data(), n, 0.0f, most).first == at);
        }
      }
    }
  }
}

TEST_CASE("the vector weight sums of draws and of block verification equal the scalar sums bit for bit on every "
          "instruction set",
          "[random][residual][simd]") {
  std::mt19937 gen(23);
  std::exponential_distribution<float> e(1.0f);
  for (const std::size_t n : {0u, 1u, 7u, 8u, 9u, 15u, 63u, 64u, 65u, 300u, 4096u, 4099u}) {
    std::vector<float> p(n), q(n);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = i % 7 == 3 ? 0.0f : e(gen) * 1e-3f;
      q[i] = i % 5 == 0 ? 0.0f : e(gen) * 1e-3f;
    }
    if (n > 2) p[1] = q[1] = std::numeric_limits<float>::denorm_min();  // a tie at the smallest float
    for (const double s : {1.0, 0.37, 1.0 / 3.0}) {
      const double dense = simd::weight_sum([&](std::size_t i) { return static_cast<double>(p[i]); }, n);
      // The definitions, each product rounded before the difference is (volatile: a build with
      // FMA enabled must not fuse the reference either).
      const auto excess = [&](std::size_t i) {
        const volatile double sp = s * static_cast<double>(p[i]);
        const double d = sp - static_cast<double>(q[i]);
        return d > 0.0 ? d : 0.0;
      };
      const auto shortfall = [&](std::size_t i) {
        const volatile double sp = s * static_cast<double>(p[i]);
        const double d = static_cast<double>(q[i]) - sp;
        return d > 0.0 ? d : 0.0;
      };
      const double above = simd::weight_sum(excess, n), below = simd::weight_sum(shortfall, n);
      for (const isa requested : {isa::generic, isa::avx2, isa::avx512}) {
        const isa level = simd::resolve(requested);
        INFO(isa_name(level) << ", n = " << n << ", s = " << s);
        CHECK(simd::weight_sum(level, simd::weight_kind::plain, p.data(), nullptr, s, n) == dense);
        CHECK(simd::weight_sum(level, simd::weight_kind::excess, p.data(), q.data(), s, n) == above);
        CHECK(simd::weight_sum(level, simd::weight_kind::shortfall, p.data(), q.data(), s, n) == below);
        const auto both = simd::excess_and_shortfall(level, p.data(), q.data(), s, n);  // one pass
        CHECK(both.excess == above);
        CHECK(both.shortfall == below);
      }
    }
  }
}

TEST_CASE("draws from contiguous and from strided weights are the same draws", "[random][residual]") {
  // A contiguous column takes the vector weight sums, a row of a column-major matrix (stride 2) the
  // scalar ones: with the same generator state they must pick the same tokens.
  constexpr Eigen::Index V = 1000;
  std::mt19937 gen(29);
  std::exponential_distribution<float> e(1.0f);
  Eigen::MatrixXf rows(2, V);
  for (Eigen::Index i = 0; i < V; ++i) {
    rows(0, i) = i % 9 == 4 ? 0.0f : e(gen);
    rows(1, i) = i % 4 == 1 ? 0.0f : e(gen);
  }
  rows.row(0) /= rows.row(0).sum();  // (distributions: sample_residual checks their sums)
  rows.row(1) /= rows.row(1).sum();
  const Eigen::VectorXf p = rows.row(0).transpose(), q = rows.row(1).transpose();
  REQUIRE(detail::contiguous_floats(p) != nullptr);
  REQUIRE(detail::contiguous_floats(rows.row(0)) == nullptr);
  REQUIRE(detail::contiguous_floats(p(Eigen::seq(0, 8, 2))) == nullptr);  // direct access, no data()
  // The totals the draws scan agree exactly (a draw alone would rarely show an ulp).
  for (const double s : {1.0, 0.8}) {
    detail::float_weights vector_path{p.data(), q.data(), s};
    auto scalar_path = [&](std::size_t i) {
      return simd::residual_weight(static_cast<double>(rows(0, static_cast<Eigen::Index>(i))),
                                   static_cast<double>(rows(1, static_cast<Eigen::Index>(i))), s);
    };
    CHECK(detail::sum_blocks(vector_path, V).total == detail::sum_blocks(scalar_path, V).total);
  }
  std::mt19937_64 a(31), b(31);
  for (int n = 0; n < 2000; ++n) {
    REQUIRE(sample_categorical(p, a) == sample_categorical(rows.row(0), b));
    REQUIRE(sample_residual(p, q, a) == sample_residual(rows.row(0), rows.row(1), b));
    REQUIRE(sample_residual(p, q, a, 0.8) == sample_residual(rows.row(0), rows.row(1), b, 0.8));
  }
  // A strided view with a run-time step still draws (the generic path): an index into the view.
  const token t = sample_categorical(p(Eigen::seq(0, 8, 2)), a);
  REQUIRE((t >= 0 && t < 5));
  CHECK(p(2 * t) > 0.0f);
}
