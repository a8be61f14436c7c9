#include <specsample/io/safetensors.hpp>
#include <specsample/models/gpt2/kernels.hpp>
#include <specsample/models/gpt2/weights.hpp>

#include <catch2/catch.hpp>

#include "../support/bitwise.hpp"
#include "../support/kernel_levels.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace k = specsample::gpt2::kernels;
namespace gpt2 = specsample::gpt2;
using specsample::gpt2::isa;
using specsample::test::bitwise_equal;
using specsample::test::kernel_levels;
using specsample::gpt2::thread_pool;
using specsample::gpt2::weight_format;

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

/// Values exactly representable in `f` (so the F32 reference sees the very same weights).
std::vector<float> rounded(std::vector<float> v, weight_format f) {
  for (float& x : v) {
    if (f == weight_format::f16) x = specsample::io::f16_to_float(specsample::io::float_to_f16(x));
    if (f == weight_format::bf16) x = specsample::io::bf16_to_float(specsample::io::float_to_bf16(x));
    if (f == weight_format::bf16_pairs) x = specsample::io::bf16_to_float(gpt2::simd::bf16_operand(x));
  }
  return v;
}

/// The matmul of `bf16_pairs` weights as vdpbf16ps defines it, on scalars: per output, for every
/// column pair, acc = fma(w[2k+1], x[2k+1], acc), then fma(w[2k], x[2k], acc), operands rounded by
/// bf16_operand (a missing last column of an odd C counts as 0), then + bias.
std::vector<float> bf16_dot_reference(const std::vector<float>& inp, const std::vector<float>& w,
                                      const std::vector<float>& bias, std::size_t T, std::size_t C,
                                      std::size_t OC) {
  const auto op = [](float v) { return specsample::io::bf16_to_float(gpt2::simd::bf16_operand(v)); };
  std::vector<float> out(T * OC);
  for (std::size_t t = 0; t < T; ++t) {
    for (std::size_t o = 0; o < OC; ++o) {
      float acc = 0.0f;
      for (std::size_t k = 0; k < C; k += 2) {
        const float x1 = k + 1 < C ? op(inp[t * C + k + 1]) : 0.0f, w1 = k + 1 < C ? op(w[o * C + k + 1]) : 0.0f;
        acc = std::fma(w1, x1, acc);
        acc = std::fma(op(w[o * C + k]), op(inp[t * C + k]), acc);
      }
      out[t * OC + o] = bias.empty() ? acc : acc + bias[o];
    }
  }
  return out;
}

}  // namespace

TEST_CASE("the kernel level is detected, capped and named", "[gpt2][kernels]") {
  REQUIRE(gpt2::simd::resolve(isa::generic) == isa::generic);
  REQUIRE(gpt2::simd::resolve(isa::best) == gpt2::simd::detected());
  REQUIRE(static_cast<int>(gpt2::simd::resolve(isa::avx512)) <=
          static_cast<int>(gpt2::simd::detected()));
  REQUIRE(std::string(gpt2::isa_name(isa::avx2)) == "avx2");
  INFO("detected: " << gpt2::isa_name(gpt2::simd::detected()));
  SUCCEED();
}

TEST_CASE("weight matrices pack rows and HF columns alike and convert exactly",
          "[gpt2][kernels]") {
  std::mt19937 rng(11);
  for (const weight_format f : {weight_format::f32, weight_format::f16, weight_format::bf16}) {
    for (const std::size_t rows : {1u, 13u, 64u, 130u}) {
      const std::size_t cols = 7;
      const auto v = rounded(random_vector(rows * cols, rng), f);
      const auto a = gpt2::weight_matrix::from_floats(f, rows, cols, v.data());
      REQUIRE(a.format() == f);
      REQUIRE(a.rows() == rows);
      REQUIRE(a.cols() == cols);
      REQUIRE(a.size() == rows * cols);
      REQUIRE(a.bytes() == (rows + 63) / 64 * 64 * cols * gpt2::format_bytes(f));
      REQUIRE(a.to_float() == v);
      // The same matrix given as HF Conv1D [in = cols, out = rows] (transposed storage).
      std::vector<float> t(rows * cols);
      for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t c = 0; c < cols; ++c) t[c * rows + r] = v[r * cols + c];
      }
      const auto raw = [&](const std::vector<float>& x) {
        std::vector<std::uint16_t> h(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) {
          h[i] = f == weight_format::f16 ? specsample::io::float_to_f16(x[i])
                                         : specsample::io::float_to_bf16(x[i]);
        }
        return h;
      };
      const auto b = f == weight_format::f32
                         ? gpt2::weight_matrix::from_columns(f, rows, cols, t.data())
                         : gpt2::weight_matrix::from_columns(f, rows, cols, raw(t).data());
      REQUIRE(b.to_float() == v);
      const gpt2::weight_matrix copy = b;
      REQUIRE(copy.to_float() == v);
    }
  }
}

TEST_CASE("bulk F16 conversions (F16C where the CPU has it) give the scalar conversions' bits",
          "[gpt2][kernels]") {
  namespace io = specsample::io;
  // Every F16 pattern up to float.
  std::vector<std::uint16_t> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  std::vector<float> up(all.size());
  gpt2::simd::convert(weight_format::f16, all.data(), 0, all.size(), up.data());
  for (std::size_t i = 0; i < all.size(); ++i) {
    const float ref = io::f16_to_float(all[i]);
    INFO("f16 pattern " << i);
    if (std::isnan(ref)) {
      REQUIRE(std::isnan(up[i]));  // (F16C quiets a signalling NaN: payload bits may differ)
    } else {
      REQUIRE(std::bit_cast<std::uint32_t>(up[i]) == std::bit_cast<std::uint32_t>(ref));
    }
  }
  // Floats down to F16 and BF16: every F16 value, the midpoints between neighbours (ties to even)
  // and one float either side of them, values that overflow, and random floats of every magnitude.
  std::vector<float> x;
  for (std::uint32_t h = 0; h < 0x7C00u; ++h) {
    for (const std::uint32_t sign : {0u, 0x8000u}) {
      const float a = io::f16_to_float(static_cast<std::uint16_t>(h | sign));
      const float b = io::f16_to_float(static_cast<std::uint16_t>((h + 1) | sign));
      const float mid = static_cast<float>((static_cast<double>(a) + b) / 2);  // exact in float
      x.insert(x.end(), {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 2 * mid)});
    }
  }
  std::mt19937 rng(5);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 200000; ++i) x.push_back(std::bit_cast<float>(bits(rng) & 0xFFFFFFFFu));
  x.insert(x.end(), {65504.0f, 65519.996f, 65520.0f, -65520.0f, 1e30f, std::numeric_limits<float>::infinity(),
                     -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min()});
  for (const weight_format f : {weight_format::f16, weight_format::bf16}) {
    std::vector<std::uint16_t> down(x.size());
    gpt2::simd::narrow(f, x.data(), x.size(), down.data());
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(x[i])) continue;
      const std::uint16_t ref = f == weight_format::f16 ? io::float_to_f16(x[i]) : io::float_to_bf16(x[i]);
      INFO("format " << static_cast<int>(f) << ", float bits " << std::bit_cast<std::uint32_t>(x[i]));
      REQUIRE(down[i] == ref);
    }
  }
}

TEST_CASE("weight_matrix::converted keeps or rounds every weight and refuses an F16 overflow",
          "[gpt2][kernels]") {
  using Catch::Contains;
  for (const weight_format f : {weight_format::f32, weight_format::f16, weight_format::bf16}) {
    const std::string name = gpt2::format_name(f);
    REQUIRE(gpt2::format_from_name(name) == f);
    std::string lower = name;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    REQUIRE(gpt2::format_from_name(lower) == f);
  }
  REQUIRE(gpt2::format_from_name("Bf16") == weight_format::bf16);  // any mix of cases
  REQUIRE(!gpt2::format_from_name("f8"));
  REQUIRE(!gpt2::format_from_name("bf1"));
  REQUIRE(!gpt2::format_from_name("BF16 pairs"));
  std::mt19937 rng(12);
  const std::size_t rows = 130, cols = 7;
  auto v = random_vector(rows * cols, rng);
  v[3] = 1e-9f;  // F16: subnormal range, rounds to 0
  v[70 * cols + 3] = 65519.0f;  // F16: rounds to 65504
  const auto f32 = gpt2::weight_matrix::from_floats(weight_format::f32, rows, cols, v.data());
  for (const weight_format f : {weight_format::f32, weight_format::f16, weight_format::bf16}) {
    const gpt2::weight_matrix c = f32.converted(f);
    REQUIRE(c.format() == f);
    REQUIRE(c.bytes() == gpt2::weight_matrix::packed_bytes(f, rows, cols));
    REQUIRE(c.to_float() == rounded(v, f));
    // The same as packing values stored in `f` in the first place, padding rows (zero) included.
    const auto direct = gpt2::weight_matrix::from_floats(f, rows, cols, v.data());
    REQUIRE(std::memcmp(c.data(), direct.data(), c.bytes()) == 0);
    // Back up to F32: exact.
    REQUIRE(c.converted(weight_format::f32).to_float() == rounded(v, f));
    // Into storage it is given.
    const auto storage = gpt2::allocate_weight_storage(c.bytes());
    REQUIRE(f32.converted(f, storage).data() == storage.get());
  }
  REQUIRE(f32.converted(weight_format::f16).at(70, 3) == 65504.0f);
  v[70 * cols + 3] = -65520.0f;  // rounds to -inf in F16: refused, and named
  const auto big = gpt2::weight_matrix::from_floats(weight_format::f32, rows, cols, v.data());
  REQUIRE_THROWS_WITH(big.converted(weight_format::f16),
                      Contains("weight (70, 3) = -65520 is outside the range of F16") &&
                          Contains("hold this matrix as F32 or BF16"));
  REQUIRE(big.converted(weight_format::bf16).at(70, 3) == -65536.0f);  // BF16's neighbour
}

TEST_CASE("layer_norm matches its reference twin, a row's result depending only on the row",
          "[gpt2][kernels]") {
  std::mt19937 rng(2);
  for (const isa level : kernel_levels()) {
    for (const std::size_t C : {1u, 7u, 8u, 16u, 37u, 64u, 100u, 384u}) {
      const std::size_t T = 5;
      auto inp = random_vector(T * C, rng, 3.0f);
      for (std::size_t c = 0; c < C; ++c) inp[c] += 100.0f;  // a row with a large mean
      const auto w = random_vector(C, rng);
      const auto b = random_vector(C, rng);
      std::vector<float> out(T * C), ref(T * C);
      k::layer_norm(out, inp, w, b, T, C, 1e-5f, level);
      k::layer_norm_reference(ref, inp, w, b, T, C, 1e-5f);
      INFO(gpt2::isa_name(level) << ", C = " << C);
      REQUIRE(max_rel_diff(out, ref) < 1e-4);
      for (std::size_t t = 0; t < T; ++t) {  // alone, the same bits
        std::vector<float> row(C);
        k::layer_norm(row, std::span<const float>(inp).subspan(t * C, C), w, b, 1, C, 1e-5f, level);
        REQUIRE(bitwise_equal(row.data(), out.data() + t * C, C));
      }
    }
  }
}

TEST_CASE("matmul matches its reference twin and is bitwise batch- and thread-invariant",
          "[gpt2][kernels]") {
  // For every kernel level this CPU has (the generic fallback included) and every weight format:
  // close to the double reference, and bitwise equal across thread counts and batch sizes.
  std::mt19937 rng(3);
  thread_pool pool2(2), pool3(3);
  for (const isa level : kernel_levels()) {
    for (const weight_format f : {weight_format::f32, weight_format::f16, weight_format::bf16, weight_format::bf16_pairs}) {
      for (const std::size_t C : {1u, 5u, 8u, 67u, 128u}) {
        for (const std::size_t OC : {1u, 13u, 64u, 100u, 200u}) {  // 200: panels for three threads
          for (const bool with_bias : {false, true}) {
            const std::size_t T = 14;  // the AVX2 level takes rows in groups of 12: two groups
            const auto inp = random_vector(T * C, rng);
            const auto w = rounded(random_vector(OC * C, rng, 0.2f), f);
            const auto packed = gpt2::weight_matrix::from_floats(f, OC, C, w.data());
            const auto bias = with_bias ? random_vector(OC, rng) : std::vector<float>{};
            std::vector<float> out(T * OC), ref(T * OC), out2(T * OC), out3(T * OC), row(OC);
            k::matmul(out, inp, packed.view(), bias, T, C, OC, nullptr, level);
            // (BF16 pairs multiply the activations rounded to BF16.)
            k::matmul_reference(ref, f == weight_format::bf16_pairs ? rounded(inp, f) : inp, w, bias, T, C, OC);
            INFO(gpt2::isa_name(level) << ", format " << static_cast<int>(f) << ", C = " << C
                                       << ", OC = " << OC << ", bias = " << with_bias);
            REQUIRE(max_rel_diff(out, ref) < 1e-5);
            k::matmul(out2, inp, packed.view(), bias, T, C, OC, &pool2, level);
            k::matmul(out3, inp, packed.view(), bias, T, C, OC, &pool3, level);
            REQUIRE(bitwise_equal(out.data(), out2.data(), out.size()));
            REQUIRE(bitwise_equal(out.data(), out3.data(), out.size()));
            for (std::size_t t = 0; t < T; ++t) {  // one row alone == the same row in the batch
              k::matmul(row, std::span<const float>(inp).subspan(t * C, C), packed.view(), bias, 1,
                        C, OC, &pool2, level);
              REQUIRE(bitwise_equal(row.data(), out.data() + t * OC, OC));
            }
            for (std::size_t T2 = 2; T2 < T; ++T2) {  // every batch size and offset
              const std::size_t t0 = T - T2;
              std::vector<float> part(T2 * OC);
              k::matmul(part, std::span<const float>(inp).subspan(t0 * C, T2 * C), packed.view(),
                        bias, T2, C, OC, nullptr, level);
              REQUIRE(bitwise_equal(part.data(), out.data() + t0 * OC, T2 * OC));
            }
            if (f == weight_format::f32) {  // the row-major span overload agrees bit for bit
              std::vector<float> viaspan(T * OC);
              k::matmul(viaspan, inp, std::span<const float>(w), bias, T, C, OC, nullptr, level);
              REQUIRE(bitwise_equal(viaspan.data(), out.data(), out.size()));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("matmul's fused GELU gives gelu of its outputs bit for bit, for every split", "[gpt2][kernels]") {
  // activation::gelu runs on each chunk's panels on the thread that computed them: the same bits as
  // gelu over the whole output afterwards, whatever the level, weight format (on AMX tiles too,
  // where the CPU has them), row count or thread count, a partial last panel included.
  std::mt19937 rng(12);
  thread_pool pool2(2), pool3(3);
  for (const isa level : kernel_levels()) {
    for (const weight_format f : {weight_format::f32, weight_format::bf16_pairs, weight_format::i8_quads}) {
      for (const bool tiles : {false, true}) {
        for (const std::size_t T : {1u, 5u, 17u}) {
          const std::size_t C = 64, OC = 200;
          const auto inp = random_vector(T * C, rng);
          const auto w = random_vector(OC * C, rng, 0.2f);
          const auto packed = gpt2::weight_matrix::from_floats(f, OC, C, w.data());
          gpt2::weight_view v = packed.view();
          v.tiles = tiles;
          const auto bias = random_vector(OC, rng);
          std::vector<float> want(T * OC);
          k::matmul(want, inp, v, bias, T, C, OC, nullptr, level);
          k::gelu(want, want, level);
          INFO(gpt2::isa_name(level) << ", format " << static_cast<int>(f) << ", tiles " << tiles << ", T = " << T);
          for (thread_pool* pool : {static_cast<thread_pool*>(nullptr), &pool2, &pool3}) {
            std::vector<float> out(T * OC);
            k::matmul(out, inp, v, bias, T, C, OC, pool, level, nullptr, k::activation::gelu);
            REQUIRE(bitwise_equal(out.data(), want.data(), out.size()));
          }
        }
      }
    }
  }
}

TEST_CASE("matmul of streamed weights (blocks shared by the tiles) gives the bits of whole panels",
          "[gpt2][kernels]") {
  // weight_view::streamed makes the AVX-512 kernels take more rows than one tile block by block,
  // each output's accumulator kept between blocks, in balanced tiles (7 rows: 4 + 3; 9: 5 + 4; 5
  // rows of emulated BF16 pairs, on CPUs without AVX512_BF16: 3 + 2): for every format, row count
  // (one and several groups of 12; whole-panel tiles of 1..6 rows, block tiles of 3..6), reduction
  // length (one and several 16 KiB blocks, a partial last one) and thread split, the same bits as
  // each panel taken whole (every other level ignores the flag).
  std::mt19937 rng(41);
  thread_pool pool2(2);
  for (const isa level : kernel_levels()) {
    for (const weight_format f : {weight_format::f32, weight_format::f16, weight_format::bf16, weight_format::bf16_pairs,
                                  weight_format::i8_quads}) {
      for (const std::size_t C : {5u, 67u, 300u, 1100u}) {
        const std::size_t OC = 100;
        const auto w = rounded(random_vector(OC * C, rng, 0.2f), f);
        const auto packed = gpt2::weight_matrix::from_floats(f, OC, C, w.data());
        gpt2::weight_view streamed = packed.view();
        streamed.streamed = true;
        const auto bias = random_vector(OC, rng);
        for (const std::size_t T : {1u, 5u, 6u, 7u, 8u, 9u, 10u, 11u, 12u, 13u, 19u, 26u}) {
          const auto inp = random_vector(T * C, rng);
          std::vector<float> whole(T * OC), blocks(T * OC);
          k::matmul(whole, inp, packed.view(), bias, T, C, OC, nullptr, level);
          k::matmul(blocks, inp, streamed, bias, T, C, OC, T % 2 == 0 ? &pool2 : nullptr, level);
          INFO(gpt2::isa_name(level) << ", format " << static_cast<int>(f) << ", C = " << C << ", T = " << T);
          REQUIRE(bitwise_equal(whole.data(), blocks.data(), whole.size()));
        }
      }
    }
  }
}

TEST_CASE("matmul over zero input columns gives the bias (or zeros) for every row count", "[gpt2][kernels]") {
  // K = 0: no step at all, so the accumulators must still start at zero (the AVX2 level's blocks
  // once left them unset for several rows).
  for (const isa level : kernel_levels()) {
    for (const weight_format f : {weight_format::f32, weight_format::f16, weight_format::bf16_pairs}) {
      const auto packed = gpt2::weight_matrix::from_floats(f, 3, 0, nullptr);
      for (const std::size_t T : {1u, 2u, 3u, 13u}) {
        for (const bool with_bias : {false, true}) {
          const std::vector<float> bias = with_bias ? std::vector<float>{1.0f, -2.0f, 3.5f} : std::vector<float>{};
          std::vector<float> out(T * 3, 42.0f);
          k::matmul(out, std::span<const float>{}, packed.view(), bias, T, 0, 3, nullptr, level);
          INFO(gpt2::isa_name(level) << ", format " << static_cast<int>(f) << ", T = " << T << ", bias = " << with_bias);
          for (std::size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == (with_bias ? bias[i % 3] : 0.0f));
        }
      }
    }
  }
}

TEST_CASE("BF16 pairs hold every weight as a BF16 operand, in column pairs, and refuse an overflow",
          "[gpt2][kernels]") {
  using Catch::Contains;
  std::mt19937 rng(31);
  for (const std::size_t cols : {1u, 7u, 8u}) {
    const std::size_t rows = 130;
    auto v = random_vector(rows * cols, rng);
    v[0] = 1e-39f;                 // subnormal F32: 0
    v[rows * cols - 1] = -3.3e38f;  // near BF16's largest finite value
    const auto f32 = gpt2::weight_matrix::from_floats(weight_format::f32, rows, cols, v.data());
    const gpt2::weight_matrix p = f32.converted(weight_format::bf16_pairs);
    INFO("cols = " << cols);
    REQUIRE(p.format() == weight_format::bf16_pairs);
    REQUIRE(p.bytes() == 3 * ((cols + 1) / 2 * 2) * 64 * 2);  // 3 panels of (cols rounded up to even) x 64
    REQUIRE(p.to_float() == rounded(v, weight_format::bf16_pairs));
    REQUIRE(p.at(0, 0) == 0.0f);
    // The layout: weights (o, 2k) and (o, 2k + 1) adjacent, the pairs of a panel's outputs contiguous.
    const auto* h = static_cast<const std::uint16_t*>(p.data());
    for (std::size_t o = 0; o < rows; ++o) {
      for (std::size_t c = 0; c < cols; ++c) {
        const std::size_t i = o / 64 * ((cols + 1) / 2 * 2) * 64 + c / 2 * 128 + o % 64 * 2 + c % 2;
        REQUIRE(h[i] == gpt2::simd::bf16_operand(v[o * cols + c]));
      }
    }
    // Through a BF16 matrix (a subnormal BF16 weight becomes 0 as well) to the same bits, and back out.
    REQUIRE(std::memcmp(gpt2::weight_matrix::from_floats(weight_format::bf16, rows, cols, v.data())
                            .converted(weight_format::bf16_pairs).data(),
                        p.data(), p.bytes()) == 0);
    auto v16 = v;
    v16.back() = 1.0f;  // (F16 has no -3.3e38)
    REQUIRE(gpt2::weight_matrix::from_floats(weight_format::f16, rows, cols, v16.data())
                .converted(weight_format::bf16_pairs)
                .to_float() == rounded(rounded(v16, weight_format::f16), weight_format::bf16_pairs));
    REQUIRE(p.converted(weight_format::f32).to_float() == rounded(v, weight_format::bf16_pairs));
    REQUIRE(p.converted(weight_format::bf16).to_float() == rounded(v, weight_format::bf16_pairs));
    REQUIRE(std::memcmp(p.converted(weight_format::bf16_pairs).data(), p.data(), p.bytes()) == 0);
    REQUIRE_THROWS_WITH(p.converted(weight_format::f16), Contains("is outside the range of F16"));
  }
  std::vector<float> big(64 * 3, 1.0f);
  big[70] = 3.4e38f;  // (1, 6) rounds to inf in BF16
  REQUIRE_THROWS_WITH(gpt2::weight_matrix::from_floats(weight_format::f32, 64, 3, big.data()).converted(weight_format::bf16_pairs),
                      Contains("weight (23, 1) = 3.4e+38 is outside the range of BF16 pairs (largest finite value "
                               "3.39e+38): multiply in F32 (matmul_precision F32)"));
}

TEST_CASE("BF16 operands: every level rounds as bf16_operand, for every kind of float", "[gpt2][kernels]") {
  std::vector<float> x = {0.0f, -0.0f, 1.0f, -1.5f, 1e-39f, -1e-40f, 0x1p-126f, 0x1.fffffcp-127f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::max(),
                          3.3895e38f, 1.00390625f, 1.01171875f, 1.0078125f};  // ties: to even, both ways
  std::mt19937 rng(32);
  for (int i = 0; i < 200000; ++i) x.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
  const std::size_t T = 3, C = x.size() / 3, ld = C + 5;
  std::vector<std::uint16_t> want(T * ld, 0);
  for (std::size_t t = 0; t < T; ++t) {
    for (std::size_t c = 0; c < C; ++c) want[t * ld + c] = gpt2::simd::bf16_operand(x[t * C + c]);
  }
  REQUIRE(gpt2::simd::bf16_operand(1e-39f) == 0);
  REQUIRE(gpt2::simd::bf16_operand(-1e-40f) == 0x8000);
  REQUIRE(gpt2::simd::bf16_operand(1.00390625f) == 0x3F80);  // halfway: to the even 1.0
  REQUIRE(gpt2::simd::bf16_operand(1.01171875f) == 0x3F82);  // halfway: to the even 1.015625
  REQUIRE(gpt2::simd::bf16_operand(0x1.fffffcp-127f) == 0);  // the largest subnormal
  for (const isa level : kernel_levels()) {
    std::vector<std::uint16_t> got(T * ld, 0xFFFF);
    gpt2::simd::bf16_operands(level, x.data(), C, T, C, got.data(), ld);
    INFO(gpt2::isa_name(level));
    REQUIRE(got == want);  // (padding zeroed)
  }
#if SPECSAMPLE_X86
  // The AVX-512 level converts with vcvtneps2bf16 where the CPU has AVX512_BF16; its integer
  // emulation is run directly as well.
  if (gpt2::simd::avx512_kernels && gpt2::simd::has_avx512_bf16()) {
    std::vector<std::uint16_t> got(x.size());
    gpt2::simd::bf16_operands_avx512(x.data(), x.size(), got.data());
    REQUIRE(std::equal(got.begin(), got.end(), x.begin(), [](std::uint16_t g, float v) {
      return g == gpt2::simd::bf16_operand(v);
    }));
  }
#endif
}

TEST_CASE("matmul of BF16 pairs gives vdpbf16ps's sums bit for bit on every level", "[gpt2][kernels]") {
  // The reference is vdpbf16ps's definition on scalars; the AVX-512 level runs vdpbf16ps itself
  // where the CPU has AVX512_BF16, and its emulation (F32 FMAs) is run directly as well.
  std::mt19937 rng(33);
  thread_pool pool2(2);
  for (const std::size_t C : {1u, 2u, 5u, 67u, 128u, 385u}) {
    for (const std::size_t OC : {1u, 13u, 64u, 130u}) {
      for (const std::size_t T : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 13u}) {  // every tile of 6 and of 4, and more
        auto inp = random_vector(T * C, rng, 3.0f);
        inp[0] = 1e-39f;  // a subnormal activation counts as 0
        const auto w = random_vector(OC * C, rng, 0.2f);
        const auto bias = random_vector(OC, rng);
        const auto packed = gpt2::weight_matrix::from_floats(weight_format::bf16_pairs, OC, C, w.data());
        for (const bool with_bias : {false, true}) {
          const std::vector<float> b = with_bias ? bias : std::vector<float>{};
          const std::vector<float> want = bf16_dot_reference(inp, w, b, T, C, OC);
          for (const isa level : kernel_levels()) {
            INFO(gpt2::isa_name(level) << ", C = " << C << ", OC = " << OC << ", T = " << T << ", bias = " << with_bias);
            std::vector<float> out(T * OC);
            k::matmul(out, inp, packed.view(), b, T, C, OC, level == isa::avx2 ? &pool2 : nullptr, level);
            REQUIRE(bitwise_equal(out.data(), want.data(), out.size()));
          }
#if SPECSAMPLE_X86
          if (gpt2::simd::avx512_kernels && gpt2::simd::has_avx512_bf16()) {
            INFO("the AVX-512 emulation, C = " << C << ", OC = " << OC << ", T = " << T << ", bias = " << with_bias);
            const std::size_t ld = gpt2::simd::packed_cols(weight_format::bf16_pairs, C);
            std::vector<std::uint16_t> xh(T * ld);
            gpt2::simd::bf16_operands(isa::generic, inp.data(), C, T, C, xh.data(), ld);
            std::vector<float> out(T * OC);
            const gpt2::simd::matmul_args a{out.data(), OC, inp.data(), C, T, C, OC, packed.data(),
                                            with_bias ? b.data() : nullptr, xh.data(), ld};
            gpt2::simd::matmul_avx512<weight_format::bf16_pairs>(a, 0, gpt2::simd::panels(OC));
            REQUIRE(bitwise_equal(out.data(), want.data(), out.size()));
            // Streamed weights: its tiles of 4 rows share blocks from 5 rows on (avx512_panels).
            gpt2::simd::matmul_args s = a;
            s.streamed = true;
            std::fill(out.begin(), out.end(), 0.0f);
            gpt2::simd::matmul_avx512<weight_format::bf16_pairs>(s, 0, gpt2::simd::panels(OC));
            REQUIRE(bitwise_equal(out.data(), want.data(), out.size()));
          }
#endif
        }
      }
    }
  }
}

namespace {
/// The INT8 quantisation of a row, written independently of the library: scale max |x| / 127, the
/// integers round-to-nearest-even (std::nearbyint in the default rounding mode) of x · 127 / max,
/// clamped to ±127; zeros for a row whose largest magnitude is below 2^-96, NaN for a row with a
/// NaN or an infinity.
struct quantised_row {
  float scale;
  std::vector<int> q;
};
quantised_row quantise(const float* x, std::size_t n) {
  float m = 0.0f;
  bool finite = true;
  for (std::size_t i = 0; i < n; ++i) {
    finite = finite && std::isfinite(x[i]);
    m = std::max(m, std::abs(x[i]));
  }
  quantised_row r{0.0f, std::vector<int>(n, 0)};
  if (!finite) {
    r.scale = std::numeric_limits<float>::quiet_NaN();
    return r;
  }
  if (m < 0x1p-96f) return r;
  const float inv = 127.0f / m;
  for (std::size_t i = 0; i < n; ++i) r.q[i] = static_cast<int>(std::nearbyint(std::clamp(x[i] * inv, -127.0f, 127.0f)));
  r.scale = m / 127.0f;
  return r;
}

/// The INT8 matmul on scalars: per output the exact integer dot product (int64), converted to
/// float, times (weight scale × row scale), + bias in one fused multiply-add.
std::vector<float> i8_reference(const std::vector<float>& inp, const std::vector<float>& w, const std::vector<float>& bias,
                                std::size_t T, std::size_t C, std::size_t OC) {
  std::vector<float> out(T * OC);
  for (std::size_t t = 0; t < T; ++t) {
    const quantised_row x = quantise(inp.data() + t * C, C);
    for (std::size_t o = 0; o < OC; ++o) {
      const quantised_row wr = quantise(w.data() + o * C, C);
      std::int64_t d = 0;
      for (std::size_t k = 0; k < C; ++k) d += static_cast<std::int64_t>(x.q[k]) * wr.q[k];
      const float scale = wr.scale * x.scale;
      out[t * OC + o] = bias.empty() ? static_cast<float>(d) * scale : std::fma(static_cast<float>(d), scale, bias[o]);
    }
  }
  return out;
}
}  // namespace

TEST_CASE("INT8 quads hold each output as integers times its own scale, and convert out exactly",
          "[gpt2][kernels]") {
  std::mt19937 rng(34);
  for (const std::size_t cols : {1u, 3u, 4u, 67u, 130u}) {
    const std::size_t rows = 70;
    auto v = random_vector(rows * cols, rng, 0.5f);
    for (std::size_t c = 0; c < cols; ++c) {
      v[3 * cols + c] = 0.0f;      // a zero output
      v[5 * cols + c] = 1e-30f;    // one whose largest weight is below 2^-96: zeros
      v[6 * cols + c] = 2.5f * static_cast<float>(c % 3);  // 0, 2.5, 5: 5 -> 127, 2.5 -> 63.5, a tie
    }
    v[7 * cols] = 127.0f;  // output 7: scale 1, the rest rounds to the nearest even integer
    if (cols > 2) v[7 * cols + 1] = 2.5f, v[7 * cols + 2] = -3.5f;
    const gpt2::weight_matrix q = gpt2::weight_matrix::from_floats(weight_format::f32, rows, cols, v.data())
                                      .converted(weight_format::i8_quads);
    REQUIRE(q.format() == weight_format::i8_quads);
    REQUIRE(q.bytes() == gpt2::simd::panels(rows) * ((cols + 3) / 4 * 4) * 64 + gpt2::simd::panels(rows) * 64 * 8);
    const gpt2::simd::i8_meta meta = gpt2::simd::i8_meta_of(q.data(), rows, cols);
    for (std::size_t o = 0; o < rows; ++o) {
      const quantised_row want = quantise(v.data() + o * cols, cols);
      INFO("cols " << cols << ", output " << o);
      REQUIRE(std::bit_cast<std::uint32_t>(meta.scale[o]) == std::bit_cast<std::uint32_t>(want.scale));
      REQUIRE(meta.sum[o] == std::accumulate(want.q.begin(), want.q.end(), 0));
      for (std::size_t c = 0; c < cols; ++c) {
        REQUIRE(q.at(o, c) == static_cast<float>(want.q[c]) * want.scale);
      }
    }
    if (cols > 2) {
      REQUIRE(q.at(7, 1) == 2.0f);   // 2.5: to the even 2
      REQUIRE(q.at(7, 2) == -4.0f);  // -3.5: to the even -4
    }
    REQUIRE(q.at(3, 0) == 0.0f);
    REQUIRE(q.at(5, 0) == 0.0f);
    // Out to every other format: each weight as `at` gives it; into INT8 quads again: the same bits.
    std::vector<float> values(rows * cols);
    for (std::size_t o = 0; o < rows; ++o) {
      for (std::size_t c = 0; c < cols; ++c) values[o * cols + c] = q.at(o, c);
    }
    REQUIRE(q.converted(weight_format::f32).to_float() == values);
    REQUIRE(q.converted(weight_format::bf16_pairs).to_float() == rounded(values, weight_format::bf16_pairs));
    // Quantising the quantised values again keeps every integer (the scales may move by an ulp).
    const auto again = gpt2::weight_matrix::from_floats(weight_format::i8_quads, rows, cols, values.data());
    const std::size_t n = gpt2::simd::panels(rows) * ((cols + 3) / 4 * 4) * 64;
    std::vector<float> ints(n), ints_again(n);
    gpt2::simd::convert(weight_format::i8_quads, q.data(), 0, n, ints.data());
    gpt2::simd::convert(weight_format::i8_quads, again.data(), 0, n, ints_again.data());
    REQUIRE(ints == ints_again);
    // From a BF16-pair matrix (another layout) the same as from its values in F32.
    const auto pairs = gpt2::weight_matrix::from_floats(weight_format::bf16_pairs, rows, cols, v.data());
    const auto via = gpt2::weight_matrix::from_floats(weight_format::f32, rows, cols, pairs.to_float().data());
    REQUIRE(std::memcmp(pairs.converted(weight_format::i8_quads).data(), via.converted(weight_format::i8_quads).data(),
                        q.bytes()) == 0);
  }
  const std::vector<float> wide(gpt2::simd::i8_max_cols + 1, 1.0f);
  REQUIRE_THROWS_WITH(gpt2::weight_matrix::from_floats(weight_format::f32, 1, wide.size(), wide.data())
                          .converted(weight_format::i8_quads),
                      "a matrix of 65537 input columns is too wide for INT8 (at most 65536: its integer sums would "
                      "overflow)");
}

TEST_CASE("INT8 operands: every level quantises each row as the reference, for every kind of row",
          "[gpt2][kernels]") {
  std::mt19937 rng(35);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<std::vector<float>> rows = {
      {127.0f, 2.5f, -3.5f, 0.5f, -0.5f, 1.5f, 126.5f, -126.5f},  // ties, both ways
      {0.0f, -0.0f, 0.0f},                                        // zero
      {1e-30f, -2e-30f, 3e-31f},                                  // below 2^-96: zeros
      {1.0f, nan, 2.0f},                                          // NaN: scale NaN, zeros
      {1.0f, -inf, 2.0f},
      {std::numeric_limits<float>::max(), -1.0f, 1e-45f},
      {0x1p-96f, -0x1p-97f},  // just at the threshold
  };
  for (const std::size_t n : {1u, 15u, 16u, 17u, 64u, 385u, 1536u}) rows.push_back(random_vector(n, rng, 3.0f));
  for (const std::vector<float>& x : rows) {
    const std::size_t K = x.size(), ld = gpt2::simd::packed_cols(weight_format::i8_quads, K) + 4;
    const quantised_row want = quantise(x.data(), K);
    for (const isa level : kernel_levels()) {
      INFO(gpt2::isa_name(level) << ", K = " << K << ", x[0] = " << x[0]);
      std::vector<std::uint8_t> got(2 * ld, 0xEE);
      float scales[2] = {-1.0f, -1.0f};
      std::vector<float> two(x);
      two.insert(two.end(), x.begin(), x.end());  // two rows: the second at its own offset
      gpt2::simd::i8_operands(level, two.data(), K, 2, K, got.data(), ld, scales);
      for (std::size_t t = 0; t < 2; ++t) {
        REQUIRE(std::bit_cast<std::uint32_t>(scales[t]) == std::bit_cast<std::uint32_t>(want.scale));
        for (std::size_t k = 0; k < ld; ++k) REQUIRE(got[t * ld + k] == (k < K ? want.q[k] + 128 : 128));
      }
    }
  }
}

TEST_CASE("matmul of INT8 quads gives the exact integer sums times the scales, bit for bit on every level",
          "[gpt2][kernels]") {
  // The reference is independent of the library (quantise, an int64 dot product, two products);
  // every level, tile of rows and thread split must give its bits. On an AVX-512 CPU with
  // AVX512_VNNI the AVX2 kernel (which AVX-512 CPUs without it run) is run directly as well.
  std::mt19937 rng(36);
  thread_pool pool2(2);
  for (const std::size_t C : {1u, 3u, 4u, 5u, 67u, 128u, 385u}) {
    for (const std::size_t OC : {1u, 13u, 64u, 130u}) {
      for (const std::size_t T : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 13u}) {
        auto inp = random_vector(T * C, rng, 3.0f);
        if (T > 2) std::fill_n(inp.begin() + static_cast<std::ptrdiff_t>(C), C, 0.0f);  // a zero row
        const auto w = random_vector(OC * C, rng, 0.2f);
        const auto bias = random_vector(OC, rng);
        const auto packed = gpt2::weight_matrix::from_floats(weight_format::i8_quads, OC, C, w.data());
        for (const bool with_bias : {false, true}) {
          const std::vector<float> b = with_bias ? bias : std::vector<float>{};
          const std::vector<float> want = i8_reference(inp, w, b, T, C, OC);
          for (const isa level : kernel_levels()) {
            INFO(gpt2::isa_name(level) << ", C = " << C << ", OC = " << OC << ", T = " << T << ", bias = " << with_bias);
            std::vector<float> out(T * OC);
            k::matmul(out, inp, packed.view(), b, T, C, OC, T % 2 == 0 ? &pool2 : nullptr, level);
            REQUIRE(bitwise_equal(out.data(), want.data(), out.size()));
          }
#if SPECSAMPLE_X86
          if (gpt2::simd::avx512_kernels && gpt2::simd::has_avx512_vnni()) {
            INFO("the AVX2 kernel on an AVX-512 CPU, C = " << C << ", OC = " << OC << ", T = " << T);
            const std::size_t ld = gpt2::simd::packed_cols(weight_format::i8_quads, C);
            std::vector<std::uint8_t> xq(T * ld);
            std::vector<float> xs(T), out(T * OC);
            gpt2::simd::i8_operands(isa::generic, inp.data(), C, T, C, xq.data(), ld, xs.data());
            gpt2::simd::matmul_args a{out.data(), OC, inp.data(), C, T, C, OC, packed.data(), with_bias ? b.data() : nullptr};
            a.xq = xq.data();
            a.ldxq = ld;
            a.xs = xs.data();
            gpt2::simd::matmul_avx2<weight_format::i8_quads>(a, 0, gpt2::simd::panels(OC));
            REQUIRE(bitwise_equal(out.data(), want.data(), out.size()));
          }
#endif
        }
      }
    }
  }
  // The widest matrix, at the extremes: the integer sums reach 255 · (−127) · 65536, within int32.
  {
    const std::size_t C = gpt2::simd::i8_max_cols;
    const std::vector<float> inp(C, 2.0f), w(C, -0.5f);
    const auto packed = gpt2::weight_matrix::from_floats(weight_format::i8_quads, 1, C, w.data());
    const std::vector<float> want = i8_reference(inp, w, {}, 1, C, 1);
    REQUIRE(want[0] == Approx(-1.0 * static_cast<double>(C)).epsilon(1e-6));  // Σ 2 · (−0.5)
    for (const isa level : kernel_levels()) {
      std::vector<float> out(1);
      k::matmul(out, inp, packed.view(), {}, 1, C, 1, nullptr, level);
      INFO(gpt2::isa_name(level));
      REQUIRE(bitwise_equal(out.data(), want.data(), 1));
    }
  }
  // A NaN in a row makes that row's outputs NaN (and no other's).
  std::vector<float> inp = random_vector(2 * 8, rng), w = random_vector(3 * 8, rng);
  inp[9] = std::numeric_limits<float>::quiet_NaN();
  const auto packed = gpt2::weight_matrix::from_floats(weight_format::i8_quads, 3, 8, w.data());
  for (const isa level : kernel_levels()) {
    std::vector<float> out(2 * 3);
    k::matmul(out, inp, packed.view(), {}, 2, 8, 3, nullptr, level);
    for (std::size_t o = 0; o < 3; ++o) {
      REQUIRE(std::isfinite(out[o]));
      REQUIRE(std::isnan(out[3 + o]));
    }
  }
}

TEST_CASE("matmuls on AMX tiles: INT8 the exact sums, BF16 near vdpbf16ps's and batch- and thread-invariant",
          "[gpt2][kernels][amx]") {
  // weight_view::tiles: where the CPU has AMX (simd::has_amx; tests/gpt2/kernel_levels.cpp says so
  // after the suite where it has not), the AVX-512 level runs BF16-pair and INT8 matmuls whose width
  // fits the tiles (32 / 64 columns) on them (INT8 from amx_int8_rows rows), rows in blocks of 16
  // (the last shorter). INT8: the
  // reference's bits (those of every level). BF16: its own sums, within 1e-5 of vdpbf16ps's (up to
  // K = 384), and the same bits for every row alone, every batch size at the first and the last
  // offset, and every thread split; a width
  // that does not fit takes the other kernels (vdpbf16ps's bits).
  REQUIRE(gpt2::simd::amx_fits(weight_format::bf16_pairs, 32));
  REQUIRE(gpt2::simd::amx_fits(weight_format::bf16_pairs, 1600));  // gpt2-xl
  REQUIRE_FALSE(gpt2::simd::amx_fits(weight_format::bf16_pairs, 48));
  REQUIRE_FALSE(gpt2::simd::amx_fits(weight_format::i8_quads, 96));
  REQUIRE(gpt2::simd::amx_fits(weight_format::i8_quads, 6400));
  REQUIRE_FALSE(gpt2::simd::amx_fits(weight_format::f32, 64));
  REQUIRE_FALSE(gpt2::simd::amx_fits(weight_format::i8_quads, 0));
  if (!gpt2::simd::has_amx()) {  // (reported by specsample_kernel_levels too)
    std::cout << "SKIPPED: AMX tile matmuls (this CPU or OS has no AMX)\n";
    return;
  }
  std::mt19937 rng(41);
  thread_pool pool2(2), pool3(3);
  std::size_t bf16_differs = 0;  // outputs whose tile sums are not vdpbf16ps's: the tiles ran
  for (const weight_format f : {weight_format::bf16_pairs, weight_format::i8_quads}) {
    for (const std::size_t C : {32u, 64u, 96u, 384u, 67u}) {
      for (const std::size_t OC : {13u, 64u, 130u}) {
        const std::size_t T = 35;  // two blocks of 16 and one of 3
        auto inp = random_vector(T * C, rng, 3.0f);
        const auto w = random_vector(OC * C, rng, 0.2f);
        const auto bias = random_vector(OC, rng);
        const auto packed = gpt2::weight_matrix::from_floats(f, OC, C, w.data());
        gpt2::weight_view v = packed.view();
        v.tiles = true;
        const std::vector<float> want = f == weight_format::i8_quads ? i8_reference(inp, w, bias, T, C, OC)
                                                                     : bf16_dot_reference(inp, w, bias, T, C, OC);
        std::vector<float> out(T * OC), out2(T * OC), out3(T * OC);
        INFO("format " << gpt2::format_name(f) << ", C = " << C << ", OC = " << OC);
        k::matmul(out, inp, v, bias, T, C, OC, nullptr, isa::avx512);
        if (f == weight_format::i8_quads || !gpt2::simd::amx_fits(f, C)) {
          REQUIRE(bitwise_equal(out.data(), want.data(), out.size()));
        } else {
          REQUIRE(max_rel_diff(out, want) < 1e-5);
          for (std::size_t i = 0; i < out.size(); ++i) bf16_differs += out[i] != want[i] ? 1 : 0;
        }
        k::matmul(out2, inp, v, bias, T, C, OC, &pool2, isa::avx512);
        k::matmul(out3, inp, v, bias, T, C, OC, &pool3, isa::avx512);
        REQUIRE(bitwise_equal(out.data(), out2.data(), out.size()));
        REQUIRE(bitwise_equal(out.data(), out3.data(), out.size()));
        for (std::size_t t = 0; t < T; ++t) {  // every row alone
          std::vector<float> row(OC);
          k::matmul(row, std::span<const float>(inp).subspan(t * C, C), v, bias, 1, C, OC, nullptr, isa::avx512);
          INFO("row " << t << " alone");
          REQUIRE(bitwise_equal(row.data(), out.data() + t * OC, OC));
        }
        for (std::size_t T2 = 2; T2 <= T; ++T2) {  // every batch size, at offset 0 and at the end
          for (const std::size_t t0 : {std::size_t{0}, T - T2}) {
            std::vector<float> part(T2 * OC);
            k::matmul(part, std::span<const float>(inp).subspan(t0 * C, T2 * C), v, bias, T2, C, OC,
                      T2 % 2 == 0 ? &pool2 : nullptr, isa::avx512);
            INFO("rows " << t0 << " .. " << t0 + T2 - 1);
            REQUIRE(bitwise_equal(part.data(), out.data() + t0 * OC, T2 * OC));
          }
        }
      }
    }
  }
  REQUIRE(bf16_differs > 0);
  // The widest INT8 matrix at the extremes (integer sums of 255 · (−127) · 65536) and a NaN row,
  // in a call of amx_int8_rows rows (INT8 takes the tiles from there).
  {
    const std::size_t C = gpt2::simd::i8_max_cols, T = gpt2::simd::amx_int8_rows;
    std::vector<float> inp(T * C, 2.0f), w(C, -0.5f);
    inp[C + 5] = std::numeric_limits<float>::quiet_NaN();
    const auto packed = gpt2::weight_matrix::from_floats(weight_format::i8_quads, 1, C, w.data());
    gpt2::weight_view v = packed.view();
    v.tiles = true;
    std::vector<float> out(T);
    k::matmul(out, inp, v, {}, T, C, 1, nullptr, isa::avx512);
    const std::vector<float> want = i8_reference(std::vector<float>(inp.begin(), inp.begin() + C), w, {}, 1, C, 1);
    REQUIRE(bitwise_equal(out.data(), want.data(), 1));
    REQUIRE(std::isnan(out[1]));
    REQUIRE(bitwise_equal(out.data() + 2, want.data(), 1));
  }
}

TEST_CASE("gelu matches its reference twin from -60 to 60", "[gpt2][kernels]") {
  std::vector<float> x;
  for (int i = -6000; i <= 6000; ++i) x.push_back(static_cast<float>(i) * 0.01f);
  std::vector<float> ref(x.size());
  k::gelu_reference(ref, x);
  for (const isa level : kernel_levels()) {
    INFO(gpt2::isa_name(level));
    std::vector<float> out(x.size());
    k::gelu(out, x, level);
    REQUIRE(max_rel_diff(out, ref) < 1e-6);
    REQUIRE(out[6000] == 0.0f);                       // gelu(0) = 0
    REQUIRE(std::abs(out[6100] - 0.841192f) < 1e-5);  // gelu_new(1)
    std::vector<float> in_place = x;
    k::gelu(in_place, in_place, level);
    REQUIRE(in_place == out);
    for (std::size_t n = 1; n <= 40; ++n) {  // an element's value does not depend on where it is
      std::vector<float> part(n);
      const std::size_t at = 5000 + 3 * n;
      k::gelu(part, std::span<const float>(x).subspan(at, n), level);
      REQUIRE(bitwise_equal(part.data(), out.data() + at, n));
    }
  }
}

TEST_CASE("softmax matches its reference twin and is stable for large inputs",
          "[gpt2][kernels]") {
  std::mt19937 rng(4);
  for (const isa level : kernel_levels()) {
    for (const std::size_t n : {1u, 2u, 9u, 17u, 100u, 1000u}) {
      auto x = random_vector(n, rng, 5.0f);
      x[0] += 1000.0f;  // would overflow exp without the max shift
      auto ref = x;
      k::softmax(x, level);
      k::softmax_reference(ref);
      INFO(gpt2::isa_name(level) << ", n = " << n);
      REQUIRE(max_rel_diff(x, ref) < 1e-6);
      double s = 0;
      for (const float v : x) s += v;
      REQUIRE(std::abs(s - 1.0) < 1e-5);
    }
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

  const std::size_t V = 11, P = 8, C = 7;  // (odd: BF16 pairs end in a half pair)
  const auto wte = random_vector(V * C, rng);
  const auto wpe = random_vector(P * C, rng);
  const std::vector<specsample::token> tokens = {3, 0, 10, 3};
  std::vector<float> out(tokens.size() * C), ref(tokens.size() * C);
  k::embed(out, tokens, wte, wpe, 2, C);
  k::embed_reference(ref, tokens, wte, wpe, 2, C);
  REQUIRE(out == ref);
  for (const weight_format f : {weight_format::f32, weight_format::f16, weight_format::bf16, weight_format::bf16_pairs}) {
    const auto w = rounded(wte, f);
    const auto packed = gpt2::weight_matrix::from_floats(f, V, C, w.data());
    k::embed(out, tokens, packed.view(), wpe, 2, C);
    k::embed_reference(ref, tokens, w, wpe, 2, C);
    REQUIRE(out == ref);
  }
}

TEST_CASE("the attention's prefetch walk gives every line of the next keys, then of the values, once",
          "[gpt2][kernels]") {
  namespace simd = specsample::gpt2::simd;
  constexpr std::uintptr_t line = simd::prefetch_stream::line;
  alignas(64) static float keys[1024], values[1024];
  const auto lines_of = [](const float* p, std::size_t n) {
    std::vector<std::uintptr_t> v;
    const auto begin = reinterpret_cast<std::uintptr_t>(p), end = begin + n * sizeof(float);
    for (std::uintptr_t at = begin & ~(line - 1); at < end; at += line) v.push_back(at);
    return v;
  };
  // Aligned and unaligned starts, ends inside a line and on one, empty ranges.
  using range = std::pair<std::size_t, std::size_t>;  // (offset in floats, floats)
  for (const auto& [a, b] : {std::pair{range{0, 64}, range{0, 64}}, std::pair{range{3, 100}, range{5, 37}},
                             std::pair{range{15, 1}, range{16, 16}}, std::pair{range{0, 0}, range{7, 300}},
                             std::pair{range{9, 200}, range{0, 0}}, std::pair{range{0, 0}, range{0, 0}}}) {
    CAPTURE(a.first, a.second, b.first, b.second);
    std::vector<std::uintptr_t> expected = lines_of(keys + a.first, a.second);
    const auto v = lines_of(values + b.first, b.second);
    expected.insert(expected.end(), v.begin(), v.end());
    auto walk = simd::prefetch_stream::of(keys + a.first, a.second * sizeof(float), values + b.first,
                                           b.second * sizeof(float));
    std::vector<std::uintptr_t> got;
    for (std::uintptr_t at = walk.advance(); at != 0; at = walk.advance()) {
      got.push_back(at);
      REQUIRE(got.size() <= expected.size());
    }
    CHECK(got == expected);
    CHECK(walk.advance() == 0);  // stays done
    walk.step();                 // and a step past the end prefetches nothing, touches nothing
    CHECK(walk.advance() == 0);
    // A step takes per_step lines of the same walk: max_lines_per_step unless paced.
    const auto fresh = simd::prefetch_stream::of(keys + a.first, a.second * sizeof(float), values + b.first,
                                                 b.second * sizeof(float));
    CHECK(fresh.lines() == expected.size());
    for (const std::size_t steps : {0u, 1u, 2u, 3u, 7u, 40u, 1000u}) {
      // Paced over `steps` steps: the fewest lines per step (1..4) that give every line in them.
      auto stepped = fresh.paced(steps);
      const std::size_t per_step = static_cast<std::size_t>(stepped.per_step);
      CAPTURE(steps, per_step);
      REQUIRE(per_step >= 1);
      REQUIRE(per_step <= static_cast<std::size_t>(simd::prefetch_stream::max_lines_per_step));
      if (steps == 0 || per_step * steps < expected.size()) {
        CHECK(per_step == static_cast<std::size_t>(simd::prefetch_stream::max_lines_per_step));  // cannot reach them all
      } else if (per_step > 1) {
        CHECK((per_step - 1) * steps < expected.size());  // and no fewer would
      }
      stepped.step();
      const std::size_t taken = std::min(per_step, expected.size());
      CHECK(stepped.advance() == (taken < expected.size() ? expected[taken] : 0));
    }
  }
  CHECK(simd::prefetch_stream{}.advance() == 0);  // the default walk (no next head) is empty
  CHECK(simd::prefetch_stream{}.lines() == 0);
}

TEST_CASE("attend_steps counts the steps of the attention's prefetch walk on every level", "[gpt2][kernels]") {
  // A walk of one line per step over more lines than any head here takes: after attend, the
  // walk has given exactly attend_steps lines (the pace of the next head's prefetch rests on it).
  namespace simd = specsample::gpt2::simd;
  std::mt19937 rng(11);
  const std::vector<float> lines(64 * 16 * 1024);
  const std::uintptr_t first_line = reinterpret_cast<std::uintptr_t>(lines.data()) & ~std::uintptr_t{63};
  for (const isa level : kernel_levels()) {
    for (const std::size_t HS : {4u, 20u, 64u, 72u, 136u}) {
      for (const std::size_t len0 : {1u, 15u, 16u, 63u, 141u}) {
        for (std::size_t nq = 1; nq <= simd::query_group; ++nq) {  // one tile, and up to three interleaved
          const std::size_t keys = len0 + nq - 1;
          const auto q = random_vector(nq * HS, rng), kb = random_vector(simd::key_cache_blocks(keys) * simd::key_block * HS, rng),
                     v = random_vector(keys * HS, rng);
          std::vector<float> att(nq * keys), out(nq * HS);
          auto walk = simd::prefetch_stream::of(lines.data(), lines.size() * sizeof(float), nullptr, 0);
          walk.per_step = 1;
          walk = simd::attend<weight_format::f32>(level, q.data(), HS, nq, kb.data(), v.data(), len0, HS, 1.0f,
                                                  att.data(), keys, out.data(), HS, walk);
          const std::size_t steps = simd::attend_steps(level, nq, len0, HS);
          INFO(gpt2::isa_name(level) << ", HS = " << HS << ", len0 = " << len0 << ", nq = " << nq);
          REQUIRE(steps < lines.size() * sizeof(float) / 64);
          CHECK(walk.advance() == first_line + 64 * steps);
        }
      }
    }
  }
}

// `attention` with a KV cache held in F (F32 or F16) against `attention_reference` reading the
// same stored values, on every level: it stores the new keys and values as `store_kv` does (bit
// for bit, on one thread and on two), and a multi-threaded run, the last n queries alone (n = 0:
// the store alone) and every query alone give the same bits.
template <weight_format F>
void check_attention(std::mt19937& rng) {
  for (const isa level : kernel_levels()) {
    for (const std::size_t NH : {1u, 4u}) {
      for (const std::size_t C : {16u, 40u, 136u}) {  // head sizes 16, 40, 136, 4, 10, 34
        // Contexts within one 16-key block and across several groups of 64 keys. The T queries
        // run as one group of tiles of 2, 5, 6 (= simd::query_tile), 3 + 4, 4 + 4, 5 + 6,
        // 4 + 4 + 5 and 5 + 6 + 6 queries, interleaved, and as two groups (19 = 9 + 10, 23 = 11 +
        // 12 queries, each two tiles: simd::query_group = 18); every query also runs alone below.
        using shape = std::tuple<std::size_t, std::size_t, std::size_t>;  // P, pos0, T
        std::vector<shape> shapes;
        for (const std::size_t T : {2u, 5u, 6u, 7u, 8u, 11u, 13u, 17u}) {
          shapes.insert(shapes.end(), {shape{24, 7, T}, shape{150, 127, T}});
        }
        shapes.insert(shapes.end(), {shape{150, 127, 19}, shape{150, 127, 23}});
        for (const auto& [P, pos0, T] : shapes) {
          const auto qkv = random_vector(T * 3 * C, rng, 2.0f);
          // Older positions: random keys and values (every layout slot, so also the unused ones).
          // (The size is a parameter: clang++ 14 cannot capture the structured binding P.)
          const auto held = [&rng](std::size_t n) {
            const auto v = random_vector(n, rng);
            std::vector<gpt2::weight_t<F>> h(v.size());
            if constexpr (F == weight_format::f32) {
              h = v;
            } else {
              gpt2::simd::narrow(F, v.data(), v.size(), h.data());
            }
            return h;
          };
          const auto k_old = held(k::kv_layer_size(P, C, NH)), v_old = held(k::kv_layer_size(P, C, NH));
          auto k_ref = k_old, v_ref = v_old;
          k::store_kv<F>(k_ref, v_ref, qkv, pos0, T, C, NH, P);
          const auto stored = [&](const std::vector<gpt2::weight_t<F>>& kc, const std::vector<gpt2::weight_t<F>>& vc) {
            return std::memcmp(kc.data(), k_ref.data(), kc.size() * sizeof kc[0]) == 0 &&
                   std::memcmp(vc.data(), v_ref.data(), vc.size() * sizeof vc[0]) == 0;
          };
          std::vector<float> out(T * C), ref(T * C), out2(T * C), one(C);
          std::vector<float> scratch(k::attention_scratch(P)), scratch2(2 * k::attention_scratch(P)),
              scratch3(3 * k::attention_scratch(P));
          auto kc = k_old, vc = v_old;
          k::attention<F>(out, qkv, kc, vc, scratch, pos0, T, T, C, NH, P, nullptr, level);
          k::attention_reference<F>(ref, qkv, k_ref, v_ref, pos0, T, C, NH, P);
          INFO(gpt2::format_name(F) << " cache, " << gpt2::isa_name(level) << ", NH = " << NH << ", C = " << C
                                    << ", pos0 = " << pos0 << ", T = " << T);
          REQUIRE(stored(kc, vc));
          REQUIRE(max_rel_diff(out, ref) < 1e-5);
          thread_pool pool(2);
          auto kc2 = k_old, vc2 = v_old;
          k::attention<F>(out2, qkv, kc2, vc2, scratch2, pos0, T, T, C, NH, P, &pool, level);
          REQUIRE(stored(kc2, vc2));
          REQUIRE(bitwise_equal(out.data(), out2.data(), out.size()));
          thread_pool pool3(3);  // a third thread: other splits of the (head, query group) tasks
          auto kc3 = k_old, vc3 = v_old;
          k::attention<F>(out2, qkv, kc3, vc3, scratch3, pos0, T, T, C, NH, P, &pool3, level);
          REQUIRE(stored(kc3, vc3));
          REQUIRE(bitwise_equal(out.data(), out2.data(), out.size()));
          for (const std::size_t n : {std::size_t{0}, std::size_t{1}, T / 2}) {  // the last n queries
            for (thread_pool* on : {static_cast<thread_pool*>(nullptr), &pool}) {
              INFO("n = " << n << (on != nullptr ? ", 2 threads" : ", 1 thread"));
              auto kn = k_old, vn = v_old;
              std::vector<float> last(n * C);
              k::attention<F>(last, qkv, kn, vn, scratch2, pos0, T, n, C, NH, P, on, level);
              REQUIRE(stored(kn, vn));
              REQUIRE(bitwise_equal(last.data(), out.data() + (T - n) * C, n * C));
            }
          }
          for (std::size_t t = 0; t < T; ++t) {
            k::attention<F>(one, std::span<const float>(qkv).subspan(t * 3 * C, 3 * C), kc, vc, scratch, pos0 + t,
                            1, 1, C, NH, P, nullptr, level);
            REQUIRE(bitwise_equal(one.data(), out.data() + t * C, C));
          }
        }
      }
    }
  }
}

TEST_CASE("attention over the KV cache matches its reference twin and is batch-invariant",
          "[gpt2][kernels]") {
  std::mt19937 rng(6);
  check_attention<weight_format::f32>(rng);
  check_attention<weight_format::f16>(rng);
}

TEST_CASE("an F16 KV cache holds each key and value rounded to nearest even", "[gpt2][kernels]") {
  // The stored values are the F32 cache's narrowed: keys in their transposed blocks, values in rows
  // (head sizes 20 and 300: the keys' narrowing runs in chunks of 256 channels).
  std::mt19937 rng(7);
  for (const auto& [C, NH] : {std::pair<std::size_t, std::size_t>{40, 2}, std::pair<std::size_t, std::size_t>{600, 2}}) {
    const std::size_t P = 40, pos0 = 3, T = 5;
    auto qkv = random_vector(T * 3 * C, rng, 3.0f);
    qkv[C] = 70000.0f;  // beyond F16's range: stored as +inf
    std::vector<float> k32(k::kv_layer_size(P, C, NH)), v32(k32.size());
    std::vector<std::uint16_t> k16(k32.size()), v16(k32.size());
    k::store_kv(k32, v32, qkv, pos0, T, C, NH, P);
    k::store_kv<weight_format::f16>(k16, v16, qkv, pos0, T, C, NH, P);
    INFO("C = " << C);
    for (std::size_t i = 0; i < k32.size(); ++i) {
      REQUIRE(k16[i] == specsample::io::float_to_f16(k32[i]));
      REQUIRE(v16[i] == specsample::io::float_to_f16(v32[i]));
    }
    REQUIRE(k16[gpt2::simd::key_offset(pos0, 0, C / NH)] == 0x7c00);  // head 0's key channel 0 at pos0
  }
}
