#include <specsample/models/gpt2/kernels.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace k = specsample::gpt2::kernels;
using specsample::gpt2::thread_pool;

namespace {

std::vector<float> random_vector(std::size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

/// max |a − b| / (1 + |b|) over all elements.
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]) / (1.0 + std::abs(b[i])));
  }
  return m;
}

bool bitwise_equal(const float* a, const float* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("the thread pool covers every index exactly once for any size", "[gpt2][kernels]") {
  for (std::size_t threads = 1; threads <= 4; ++threads) {
    thread_pool pool(threads);
    REQUIRE(pool.size() == threads);
    for (std::size_t n = 0; n <= 23; ++n) {
      std::vector<int> hits(n, 0);
      std::vector<int> worker_used(threads, 0);
      pool.parallel_for(n, [&](std::size_t b, std::size_t e, std::size_t w) {
        for (std::size_t i = b; i < e; ++i) ++hits[i];
        worker_used[w] = 1;
      });
      REQUIRE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
    }
  }
  thread_pool all(0);
  REQUIRE(all.size() >= 1);
}

TEST_CASE("dot and sum agree with the sequential double reference", "[gpt2][kernels]") {
  std::mt19937 rng(1);
  for (std::size_t n = 0; n <= 70; ++n) {
    const auto a = random_vector(n, rng);
    const auto b = random_vector(n, rng);
    const double ref = k::dot_reference(a.data(), b.data(), n);
    REQUIRE(std::abs(k::dot(a.data(), b.data(), n) - ref) <= 1e-5 * (1.0 + std::sqrt(double(n))));
    const std::vector<float> ones(n, 1.0f);
    REQUIRE(std::abs(k::sum(a.data(), n) - k::dot_reference(a.data(), ones.data(), n)) <=
            1e-5 * (1.0 + std::sqrt(double(n))));
  }
}

TEST_CASE("layer_norm matches its reference twin", "[gpt2][kernels]") {
  std::mt19937 rng(2);
  for (const std::size_t C : {1u, 7u, 16u, 37u, 384u}) {
    const std::size_t T = 5;
    auto inp = random_vector(T * C, rng, 3.0f);
    for (std::size_t c = 0; c < C; ++c) inp[c] += 100.0f;  // a row with a large mean
    const auto w = random_vector(C, rng);
    const auto b = random_vector(C, rng);
    std::vector<float> out(T * C), ref(T * C);
    k::layer_norm(out, inp, w, b, T, C, 1e-5f);
    k::layer_norm_reference(ref, inp, w, b, T, C, 1e-5f);
    INFO("C = " << C);
    REQUIRE(max_rel_diff(out, ref) < 1e-4);
  }
}

TEST_CASE("matmul matches its reference twin and is bitwise batch- and thread-invariant",
          "[gpt2][kernels]") {
  std::mt19937 rng(3);
  thread_pool pool2(2), pool3(3);
  for (const std::size_t C : {1u, 5u, 8u, 67u, 128u}) {
    for (const std::size_t OC : {1u, 13u, 64u}) {
      for (const bool with_bias : {false, true}) {
        const std::size_t T = 9;
        const auto inp = random_vector(T * C, rng);
        const auto w = random_vector(OC * C, rng, 0.2f);
        const auto bias = with_bias ? random_vector(OC, rng) : std::vector<float>{};
        std::vector<float> out(T * OC), ref(T * OC), out2(T * OC), out3(T * OC), row(OC);
        k::matmul(out, inp, w, bias, T, C, OC);
        k::matmul_reference(ref, inp, w, bias, T, C, OC);
        INFO("C = " << C << ", OC = " << OC << ", bias = " << with_bias);
        REQUIRE(max_rel_diff(out, ref) < 1e-5);
        k::matmul(out2, inp, w, bias, T, C, OC, &pool2);
        k::matmul(out3, inp, w, bias, T, C, OC, &pool3);
        REQUIRE(bitwise_equal(out.data(), out2.data(), out.size()));
        REQUIRE(bitwise_equal(out.data(), out3.data(), out.size()));
        for (std::size_t t = 0; t < T; ++t) {  // one row alone == the same row in the batch
          k::matmul(row, std::span<const float>(inp).subspan(t * C, C), w, bias, 1, C, OC, &pool2);
          REQUIRE(bitwise_equal(row.data(), out.data() + t * OC, OC));
        }
      }
    }
  }
}

TEST_CASE("gelu matches its reference twin from -60 to 60", "[gpt2][kernels]") {
  std::vector<float> x;
  for (int i = -6000; i <= 6000; ++i) x.push_back(static_cast<float>(i) * 0.01f);
  std::vector<float> out(x.size()), ref(x.size());
  k::gelu(out, x);
  k::gelu_reference(ref, x);
  REQUIRE(max_rel_diff(out, ref) < 1e-6);
  REQUIRE(out[6000] == 0.0f);                 // gelu(0) = 0
  REQUIRE(std::abs(out[6100] - 0.841192f) < 1e-5);  // gelu_new(1)
  std::vector<float> in_place = x;
  k::gelu(in_place, in_place);
  REQUIRE(in_place == out);
}

TEST_CASE("softmax matches its reference twin and is stable for large inputs",
          "[gpt2][kernels]") {
  std::mt19937 rng(4);
  for (const std::size_t n : {1u, 2u, 9u, 100u, 1000u}) {
    auto x = random_vector(n, rng, 5.0f);
    x[0] += 1000.0f;  // would overflow exp without the max shift
    auto ref = x;
    k::softmax(x);
    k::softmax_reference(ref);
    REQUIRE(max_rel_diff(x, ref) < 1e-6);
    double s = 0;
    for (const float v : x) s += v;
    REQUIRE(std::abs(s - 1.0) < 1e-5);
  }
}

TEST_CASE("residual_add and embed match their reference twins exactly", "[gpt2][kernels]") {
  std::mt19937 rng(5);
  const auto y = random_vector(37, rng);
  auto a = random_vector(37, rng);
  auto b = a;
  k::residual_add(a, y);
  k::residual_add_reference(b, y);
  REQUIRE(a == b);

  const std::size_t V = 11, P = 8, C = 6;
  const auto wte = random_vector(V * C, rng);
  const auto wpe = random_vector(P * C, rng);
  const std::vector<specsample::token> tokens = {3, 0, 10, 3};
  std::vector<float> out(tokens.size() * C), ref(tokens.size() * C);
  k::embed(out, tokens, wte, wpe, 2, C);
  k::embed_reference(ref, tokens, wte, wpe, 2, C);
  REQUIRE(out == ref);
}

TEST_CASE("attention over the KV cache matches its reference twin and is batch-invariant",
          "[gpt2][kernels]") {
  std::mt19937 rng(6);
  for (const std::size_t NH : {1u, 4u}) {
    const std::size_t C = 16, P = 24, pos0 = 7, T = 5;
    const auto qkv = random_vector(T * 3 * C, rng, 2.0f);
    auto k_cache = random_vector(P * C, rng);
    auto v_cache = random_vector(P * C, rng);
    for (std::size_t t = 0; t < T; ++t) {  // the new keys/values are in the cache already
      std::copy_n(qkv.begin() + static_cast<std::ptrdiff_t>(t * 3 * C + C), C,
                  k_cache.begin() + static_cast<std::ptrdiff_t>((pos0 + t) * C));
      std::copy_n(qkv.begin() + static_cast<std::ptrdiff_t>(t * 3 * C + 2 * C), C,
                  v_cache.begin() + static_cast<std::ptrdiff_t>((pos0 + t) * C));
    }
    std::vector<float> out(T * C), ref(T * C), out2(T * C), one(C);
    std::vector<float> scratch(P), scratch2(2 * P);
    k::attention(out, qkv, k_cache, v_cache, scratch, pos0, T, C, NH);
    k::attention_reference(ref, qkv, k_cache, v_cache, pos0, T, C, NH);
    INFO("NH = " << NH);
    REQUIRE(max_rel_diff(out, ref) < 1e-5);
    thread_pool pool(2);
    k::attention(out2, qkv, k_cache, v_cache, scratch2, pos0, T, C, NH, &pool);
    REQUIRE(bitwise_equal(out.data(), out2.data(), out.size()));
    for (std::size_t t = 0; t < T; ++t) {
      k::attention(one, std::span<const float>(qkv).subspan(t * 3 * C, 3 * C), k_cache, v_cache,
                   scratch, pos0 + t, 1, C, NH);
      REQUIRE(bitwise_equal(one.data(), out.data() + t * C, C));
    }
  }
}
