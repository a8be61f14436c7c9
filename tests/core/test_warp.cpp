#include <specsample/sampling/warp.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

using namespace specsample;

namespace {
Eigen::VectorXf logits_of(std::initializer_list<double> probs) {
  Eigen::VectorXf l(static_cast<Eigen::Index>(probs.size()));
  Eigen::Index i = 0;
  for (double p : probs) l(i++) = p > 0 ? static_cast<float>(std::log(p)) : -std::numeric_limits<float>::infinity();
  return l;
}
void check_close(const Eigen::VectorXf& got, std::initializer_list<double> want) {
  REQUIRE(got.size() == static_cast<Eigen::Index>(want.size()));
  Eigen::Index i = 0;
  for (double w : want) {
    INFO("token " << i);
    CHECK(got(i) == Approx(w).margin(1e-6));
    ++i;
  }
}
}  // namespace

TEST_CASE("temperature 1 is the softmax of the logits", "[warp]") {
  check_close(warp(logits_of({0.1, 0.2, 0.3, 0.4}), {}), {0.1, 0.2, 0.3, 0.4});
}

TEST_CASE("temperature scales the logits before the softmax", "[warp]") {
  sampling_params s;
  s.temperature = 0.5f;  // p^2, renormalised
  check_close(warp(logits_of({0.1, 0.2, 0.3, 0.4}), s), {0.01 / 0.3, 0.04 / 0.3, 0.09 / 0.3, 0.16 / 0.3});
  s.temperature = 2.0f;  // sqrt(p), renormalised
  const double z = std::sqrt(0.1) + std::sqrt(0.2) + std::sqrt(0.3) + std::sqrt(0.4);
  check_close(warp(logits_of({0.1, 0.2, 0.3, 0.4}), s),
              {std::sqrt(0.1) / z, std::sqrt(0.2) / z, std::sqrt(0.3) / z, std::sqrt(0.4) / z});
}

TEST_CASE("temperature 0 is one-hot on the argmax with ties to the lower id", "[warp][greedy]") {
  sampling_params s;
  s.temperature = 0.0f;
  check_close(warp(logits_of({0.1, 0.4, 0.1, 0.4}), s), {0, 1, 0, 0});
}

TEST_CASE("a huge temperature warps as IEEE arithmetic says, with denormals-are-zero on too", "[warp]") {
  // T > 2^126: 1 / T is subnormal, which denormals-are-zero (-ffast-math's startup code, or a
  // caller's MXCSR) reads as 0: every token equally likely, and 0 * -inf a NaN. The warper divides
  // by T in double there.
  sampling_params s;
  s.temperature = 1e38f;
  REQUIRE(std::fpclassify(1.0f / s.temperature) == FP_SUBNORMAL);
  Eigen::VectorXf logits(3);
  logits << 0.0f, -3e38f, -1e38f;
  std::vector<double> expected(3);
  double z = 0.0;
  for (std::size_t i = 0; i < 3; ++i) {
    expected[i] = std::exp(static_cast<double>(logits(static_cast<Eigen::Index>(i))) / 1e38);
    z += expected[i];
  }
  Eigen::VectorXf with_inf = logits;
  with_inf(1) = -std::numeric_limits<float>::infinity();
  const auto check_both = [&] {
    const Eigen::VectorXf got = warp(logits, s);
    for (Eigen::Index i = 0; i < 3; ++i) CHECK(got(i) == Approx(expected[static_cast<std::size_t>(i)] / z).margin(1e-6));
    const Eigen::VectorXf cut = warp(with_inf, s);  // 0.705 / (0.705 + 0.259), 0, the rest
    CHECK(cut(1) == 0.0f);
    CHECK(cut(0) / cut(2) == Approx(std::exp(1.0)).epsilon(1e-5));
  };
  check_both();
#if defined(__x86_64__) || defined(__i386__)
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040U);  // flush-to-zero (bit 15) and denormals-are-zero (bit 6)
  volatile float t = s.temperature;
  const bool daz_reads_zero = 1.0f / t * 1.0f == 0.0f;  // the quotient does read as 0 now
  check_both();
  _mm_setcsr(csr);
  CHECK(daz_reads_zero);
#endif
}

TEST_CASE("a subnormal temperature is the T -> 0+ limit, not NaN", "[warp][greedy]") {
  // 1 / 1e-40f overflows float: the warper must not compute 0 * inf at the maximum.
  sampling_params tiny, greedy;
  tiny.temperature = 1e-40f;
  greedy.temperature = 0.0f;
  REQUIRE(std::isinf(1.0f / tiny.temperature));
  const Eigen::VectorXf logits = logits_of({0.1, 0.2, 0.4, 0.3});
  Eigen::VectorXf got;
  REQUIRE_NOTHROW(got = warp(logits, tiny));
  CHECK(got == warp(logits, greedy));
  check_close(got, {0, 0, 1, 0});
  tiny.temperature = std::numeric_limits<float>::denorm_min();
  REQUIRE_NOTHROW(got = warp(logits, tiny));
  CHECK(got == warp(logits, greedy));
  // Exactly tied maxima: the limit of the softmax is uniform over them, as for any small normal T.
  tiny.temperature = 1e-40f;
  check_close(warp(logits_of({0.1, 0.4, 0.1, 0.4}), tiny), {0, 0.5, 0, 0.5});
  tiny.temperature = 1e-30f;
  check_close(warp(logits_of({0.1, 0.4, 0.1, 0.4}), tiny), {0, 0.5, 0, 0.5});
  // The filters still apply after it, and -inf stays probability zero.
  tiny.temperature = 1e-40f;
  tiny.top_k = 1;
  check_close(warp(logits_of({0.1, 0.4, 0.1, 0.4}), tiny), {0, 1, 0, 0});
  tiny.top_k = 0;
  check_close(warp(logits_of({0.0, 0.5, 0.5, 0.0}), tiny), {0, 0.5, 0.5, 0});
  // Broken logits are still diagnosed precisely.
  Eigen::VectorXf bad = logits;
  bad(1) = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(warp(bad, tiny), Catch::Matchers::Contains("NaN at token id 1"));
}

TEST_CASE("top-k keeps the k most probable tokens, ties to the lower id", "[warp][top_k]") {
  sampling_params s;
  s.top_k = 2;
  check_close(warp(logits_of({0.1, 0.3, 0.3, 0.3}), s), {0, 0.5, 0.5, 0});
  s.top_k = 1;
  check_close(warp(logits_of({0.1, 0.2, 0.3, 0.4}), s), {0, 0, 0, 1});
  s.top_k = 10;  // larger than the vocabulary: no-op
  check_close(warp(logits_of({0.1, 0.2, 0.3, 0.4}), s), {0.1, 0.2, 0.3, 0.4});
}

TEST_CASE("top-p keeps the smallest most-probable set with mass >= top_p", "[warp][top_p]") {
  sampling_params s;
  s.top_p = 0.65f;  // 0.4 + 0.3 reaches it
  check_close(warp(logits_of({0.1, 0.2, 0.3, 0.4}), s), {0, 0, 0.3 / 0.7, 0.4 / 0.7});
  s.top_p = 0.75f;  // needs the third
  check_close(warp(logits_of({0.1, 0.2, 0.3, 0.4}), s), {0, 0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9});
  s.top_p = 0.1f;  // the top token alone
  check_close(warp(logits_of({0.1, 0.2, 0.3, 0.4}), s), {0, 0, 0, 1});
  s.top_p = 0.3f;  // tie at the boundary: the lower id wins
  check_close(warp(logits_of({0.1, 0.45, 0.45}), s), {0, 1, 0});
}

TEST_CASE("top-p after top-k: a prefix whose exact mass is top_p reaches it despite the renormalisation's "
          "rounding",
          "[warp][top_p]") {
  // Softmax {1, 1, 0} cut to two tokens renormalises them to 0.49999997 each (the float
  // reciprocal of their sum): their exact mass 0.5 still reaches top_p = 0.5 with the first alone,
  // as without the third token (where no renormalisation happens). Compared exactly: every
  // entry either 1 or 0.
  sampling_params s;
  s.top_k = 2;
  s.top_p = 0.5f;
  Eigen::VectorXf three(3), two(2);
  three << 1.0f, 1.0f, 0.0f;
  two << 1.0f, 1.0f;
  const Eigen::VectorXf p3 = warp(three, s), p2 = warp(two, s);
  CHECK(p3(0) == 1.0f);
  CHECK(p3(1) == 0.0f);
  CHECK(p3(2) == 0.0f);
  CHECK(p2(0) == 1.0f);
  CHECK(p2(1) == 0.0f);
}

TEST_CASE("top-p keeps 900 of 1000 equally probable tokens, the lower ids", "[warp][top_p]") {
  Eigen::VectorXf l = Eigen::VectorXf::Zero(1000);  // uniform: the nucleus needs 900 tokens
  sampling_params s;
  s.top_p = 0.9f;
  const Eigen::VectorXf p = warp(l, s);
  CHECK((p.array() > 0).count() == 900);
  CHECK(p(0) > 0);
  CHECK(p(899) > 0);
  CHECK(p(900) == 0);
  CHECK(p.sum() == Approx(1.0));
}

TEST_CASE("top-k and top-p keep exactly the prefix of a full sort on large vocabularies with ties and zeros",
          "[warp][top_k][top_p]") {
  // The warper orders only a candidate set (the tokens above a threshold); the reference sorts the
  // whole vocabulary by (probability, lower id) and takes the prefix, summing the mass in order.
  std::mt19937 rng(41);
  for (const std::size_t V : {4096u, 50257u}) {
    for (const float sigma : {0.0f, 0.5f, 3.0f, 12.0f}) {
      std::normal_distribution<float> n(0.0f, sigma);
      Eigen::VectorXf logits(static_cast<Eigen::Index>(V));
      for (Eigen::Index i = 0; i < logits.size(); ++i) {
        logits(i) = std::round(n(rng) * 4.0f) / 4.0f;  // quantised: many exact ties
        if (i % 11 == 5) logits(i) = -std::numeric_limits<float>::infinity();  // zero probabilities
      }
      const Eigen::VectorXf base = warp(logits, sampling_params{});
      std::vector<token> order(V);
      for (std::size_t i = 0; i < V; ++i) order[i] = static_cast<token>(i);
      std::sort(order.begin(), order.end(), [&](token a, token b) { return base(a) > base(b) || (base(a) == base(b) && a < b); });
      const auto check_prefix = [&](const Eigen::VectorXf& got, std::size_t keep) {
        std::vector<bool> kept(V, false);
        for (std::size_t j = 0; j < keep; ++j) kept[static_cast<std::size_t>(order[j])] = true;
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < V; ++i) wrong += (got(static_cast<Eigen::Index>(i)) > 0.0f) != (kept[i] && base(static_cast<Eigen::Index>(i)) > 0.0f);
        CHECK(wrong == 0);
        CHECK(got.cast<double>().sum() == Approx(1.0).epsilon(1e-5));
      };
      for (const int k : {1, 2, 50, 1000, static_cast<int>(V) - 1}) {
        INFO("V = " << V << ", sigma = " << sigma << ", top_k = " << k);
        sampling_params s;
        s.top_k = k;
        check_prefix(warp(logits, s), static_cast<std::size_t>(k));
      }
      for (const float top_p : {0.1f, 0.5f, 0.9f, 0.95f, 0.999f, 0.9999999f}) {
        INFO("V = " << V << ", sigma = " << sigma << ", top_p = " << top_p);
        double mass = 0.0;
        std::size_t keep = 0;
        const double reach = static_cast<double>(top_p) * (1.0 - 0x1p-22);  // (the warper's rounding allowance)
        while (keep < V && mass < reach) mass += static_cast<double>(base(order[keep++]));
        sampling_params s;
        s.top_p = top_p;
        check_prefix(warp(logits, s), keep);
      }
    }
  }
}

TEST_CASE("min-p keeps tokens with p >= min_p * max p", "[warp][min_p]") {
  sampling_params s;
  s.min_p = 0.45f;  // threshold 0.18
  check_close(warp(logits_of({0.1, 0.2, 0.3, 0.4}), s), {0, 0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9});
}

TEST_CASE("filters apply in the order temperature, top-k, top-p, min-p", "[warp]") {
  sampling_params s;
  s.top_k = 3;    // {0.2, 0.3, 0.4} -> {2/9, 3/9, 4/9}
  s.top_p = 0.6f; // 4/9 + 3/9 = 7/9 >= 0.6 -> {3/7, 4/7}
  s.min_p = 0.8f; // threshold 0.8 * 4/7: 3/7 < 3.2/7 -> {1}
  check_close(warp(logits_of({0.1, 0.2, 0.3, 0.4}), s), {0, 0, 0, 1});
  s.min_p = 0.7f; // threshold 2.8/7: keeps both
  check_close(warp(logits_of({0.1, 0.2, 0.3, 0.4}), s), {0, 0, 3.0 / 7, 4.0 / 7});
}

TEST_CASE("minus-infinity logits are zero probabilities while NaN, +inf and all -inf are errors", "[warp][errors]") {
  check_close(warp(logits_of({0.0, 0.5, 0.0, 0.5}), {}), {0, 0.5, 0, 0.5});
  const float inf = std::numeric_limits<float>::infinity();
  using Catch::Matchers::Contains;
  Eigen::VectorXf bad(3);
  bad << 0.0f, std::nanf(""), 1.0f;
  CHECK_THROWS_WITH(warp(bad, {}), Contains("NaN at token id 1"));
  bad << 0.0f, 1.0f, inf;
  CHECK_THROWS_WITH(warp(bad, {}), Contains("+inf at token id 2"));
  bad << -inf, -inf, -inf;
  CHECK_THROWS_WITH(warp(bad, {}), Contains("-inf for every token"));
  logit_warper w({}, 4);
  Eigen::VectorXf out(4);
  CHECK_THROWS_WITH(w(bad, out), Contains("got 3 logits for a vocabulary of 4"));
}

TEST_CASE("extreme temperatures stay finite", "[warp]") {
  sampling_params s;
  s.temperature = 1e-30f;
  check_close(warp(logits_of({0.1, 0.2, 0.3, 0.4}), s), {0, 0, 0, 1});
  s.temperature = 1e30f;
  check_close(warp(logits_of({0.1, 0.2, 0.3, 0.4}), s), {0.25, 0.25, 0.25, 0.25});
}

TEST_CASE("the vector softmax numerator, maximum, scaling and argmax agree with the scalar definitions on every "
          "instruction set",
          "[warp][simd]") {
  std::mt19937 rng(17);
  std::normal_distribution<float> logit(0.0f, 30.0f);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (const isa requested : {isa::generic, isa::avx2, isa::avx512}) {
    const isa level = simd::resolve(requested);
    for (const std::size_t n : {1u, 7u, 8u, 15u, 16u, 17u, 31u, 32u, 33u, 47u, 4096u, 50257u}) {
      std::vector<float> x(n);
      for (float& v : x) v = logit(rng);
      if (n > 3) x[2] = ninf;                   // a zero probability
      if (n > 9) x[n - 2] = x[n / 2] = 1000.0f;  // a tied maximum: the lower id wins
      INFO(isa_name(level) << ", n = " << n);
      const auto best = simd::argmax(level, x.data(), n);
      const auto want = std::max_element(x.begin(), x.end()) - x.begin();  // the first maximum
      REQUIRE(best == want);
      const float m = x[static_cast<std::size_t>(want)];
      REQUIRE(simd::max_value(level, x.data(), n) == m);
      std::vector<float> scaled = x;
      simd::scale(level, scaled.data(), n, 0.37f);
      for (std::size_t i = 0; i < n; ++i) REQUIRE(scaled[i] == x[i] * 0.37f);
      for (const float scale : {0.7f, 1.0f}) {  // 1: the kernels skip the multiply
        INFO("scale = " << scale);
        std::vector<float> e = x;
        const double total = simd::exp_shifted(level, e.data(), e.data(), n, m, scale);
        double ref_total = 0.0;
        for (std::size_t i = 0; i < n; ++i) {
          const float a = (x[i] - m) * scale;  // the argument as the kernels form it, in float
          const double ref = a < simd::exp_floor ? 0.0 : std::exp(static_cast<double>(a));
          ref_total += ref;
          INFO("i = " << i << ", x = " << x[i] << ", e = " << e[i] << ", reference " << ref);
          // within 1e-6 relative (the vector exp is ~1 ulp), and 0 only below the floor
          REQUIRE(std::abs(static_cast<double>(e[i]) - ref) <= 1e-6 * ref);
        }
        REQUIRE(total == Approx(ref_total).epsilon(1e-6));
        double stored = 0.0;  // the documented bound: within 2^-24 of the stored values' sum
        for (const float v : e) stored += static_cast<double>(v);
        REQUIRE(std::abs(total - stored) <= 0x1p-24 * stored);
        if (n > 3) REQUIRE(e[2] == 0.0f);  // -inf gives exactly 0
        std::vector<float> out(n, -1.0f);  // out of place: the same bits and total, x untouched
        const std::vector<float> before = x;
        REQUIRE(simd::exp_shifted(level, x.data(), out.data(), n, m, scale) == total);
        REQUIRE(std::memcmp(out.data(), e.data(), n * sizeof(float)) == 0);
        REQUIRE(x == before);
      }
    }
    std::vector<float> bad{1.0f, std::nanf(""), 2.0f};
    CHECK(simd::argmax(level, bad.data(), 3) == -1);
    for (const float scale : {1.0f, 0.7f}) {
      std::vector<float> y(3);
      CHECK(std::isnan(simd::exp_shifted(level, bad.data(), y.data(), 3, 2.0f, scale)));
    }
    std::vector<float> inf{1.0f, std::numeric_limits<float>::infinity()};
    CHECK(simd::argmax(level, inf.data(), 2) == -1);
    std::vector<float> none{ninf, ninf, ninf};
    CHECK(simd::argmax(level, none.data(), 3) == -1);
  }
}

TEST_CASE("max_scan finds the maximum and a NaN anywhere, and tells logits a softmax can normalise, on every "
          "instruction set",
          "[warp][simd]") {
  std::mt19937 rng(23);
  std::normal_distribution<float> logit(0.0f, 30.0f);
  const float ninf = -std::numeric_limits<float>::infinity(), inf = std::numeric_limits<float>::infinity();
  for (const isa requested : {isa::generic, isa::avx2, isa::avx512}) {
    const isa level = simd::resolve(requested);
    for (const std::size_t n : {1u, 7u, 8u, 15u, 16u, 17u, 31u, 32u, 33u, 47u, 4096u}) {
      INFO(isa_name(level) << ", n = " << n);
      std::vector<float> x(n);
      for (float& v : x) v = logit(rng);
      const simd::max_scan_result ok = simd::max_scan(level, x.data(), n);
      CHECK(ok.max == *std::max_element(x.begin(), x.end()));
      CHECK((!ok.nan && ok.finite()));
      // a NaN, a +inf, at the first, a middle and the last position (the vector tails included)
      for (const std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
        INFO("at " << at);
        std::vector<float> y = x;
        y[at] = std::nanf("");
        const simd::max_scan_result with_nan = simd::max_scan(level, y.data(), n);
        CHECK((with_nan.nan && !with_nan.finite()));
        y[at] = inf;
        const simd::max_scan_result with_inf = simd::max_scan(level, y.data(), n);
        CHECK((!with_inf.nan && with_inf.max == inf && !with_inf.finite()));
        CHECK((simd::argmax(level, y.data(), n) == -1));
      }
      const std::vector<float> none(n, ninf);
      const simd::max_scan_result empty = simd::max_scan(level, none.data(), n);
      CHECK((!empty.nan && empty.max == ninf && !empty.finite()));
    }
  }
}

TEST_CASE("magnitudes_below finds a NaN, an infinity or a magnitude at the bound anywhere, and passes every "
          "value below it, on every instruction set",
          "[simd]") {
  // gpt2::model::append's checks of the keys and values it stores (F16 caches: below 65520) and
  // of the logits it returns (finite: below +inf, the default).
  const float inf = std::numeric_limits<float>::infinity(), big = std::numeric_limits<float>::max();
  for (const isa requested : {isa::generic, isa::avx2, isa::avx512}) {
    const isa level = simd::resolve(requested);
    for (const float bound : {inf, 65520.0f}) {
      const float below = std::nextafter(bound, 0.0f);  // FLT_MAX, or F16's last value that rounds finite
      for (std::size_t n = 0; n <= 70; ++n) {
        INFO(isa_name(level) << ", bound " << bound << ", n = " << n);
        std::vector<float> x(n + 1, below);  // one past the end: never read
        x[n] = std::nanf("");
        for (std::size_t i = 0; i < n; i += 3) x[i] = -below;
        CHECK(simd::magnitudes_below(level, x.data(), n, bound));
        for (std::size_t at = 0; at < n; ++at) {
          for (const float bad : {std::nanf(""), -std::nanf(""), inf, -inf, bound, -bound}) {
            INFO("at " << at << ": " << bad);
            std::vector<float> y = x;
            y[at] = bad;
            CHECK_FALSE(simd::magnitudes_below(level, y.data(), n, bound));
          }
        }
      }
    }
    const std::vector<float> finite{0.0f, -0.0f, big, -big, std::numeric_limits<float>::denorm_min()};
    CHECK(simd::magnitudes_below(level, finite.data(), finite.size()));
  }
}

TEST_CASE("the vector search, tally and prefix cut of top-k / top-p agree with their definitions on every "
          "instruction set",
          "[warp][simd][top_k][top_p]") {
  std::mt19937 rng(43);
  std::exponential_distribution<float> e(1.0f);
  for (const isa requested : {isa::generic, isa::avx2, isa::avx512}) {
    const isa level = simd::resolve(requested);
    for (const std::size_t n : {1u, 15u, 16u, 17u, 33u, 1000u, 4099u}) {
      std::vector<float> x(n);
      for (std::size_t i = 0; i < n; ++i) x[i] = i % 7 == 2 ? 0.0f : std::round(e(rng) * 8.0f) / 8.0f;  // ties, zeros
      INFO(isa_name(level) << ", n = " << n);
      for (const float t : {-1.0f, 0.0f, 0.5f, 1.0f, 3.0f, 100.0f}) {
        const auto want = static_cast<std::size_t>(std::find_if(x.begin(), x.end(), [&](float v) { return v > t; }) - x.begin());
        REQUIRE(simd::find_greater(level, x.data(), n, t) == want);
      }
      const float t[] = {2.0f, 1.0f, 0.5f, 0.25f, 0.125f, 0.0f, -1.0f};
      std::size_t count[simd::tally_width];
      double mass[simd::tally_width];
      simd::tally_above(level, x.data(), n, t, std::size(t), count, mass);
      for (std::size_t j = 0; j < std::size(t); ++j) {
        std::size_t c = 0;
        double w = 0.0;
        for (const float v : x) {
          if (v > t[j]) {
            ++c;
            w += v;
          }
        }
        REQUIRE(count[j] == c);
        REQUIRE(mass[j] == Approx(w).epsilon(1e-6));
      }
      for (const std::size_t cut : {std::size_t{0}, n / 2, n - 1}) {
        const float p = x[cut];
        std::vector<float> y = x;
        simd::zero_after(level, y.data(), n, p, static_cast<std::uint32_t>(cut));
        for (std::size_t i = 0; i < n; ++i) {
          const bool keep = x[i] > p || (x[i] == p && i <= cut);
          REQUIRE(y[i] == (keep ? x[i] : 0.0f));
        }
      }
    }
  }
}
