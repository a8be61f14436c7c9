#include <specsample/io/json.hpp>
#include <specsample/io/safetensors.hpp>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <unistd.h>

namespace io = specsample::io;
namespace fs = std::filesystem;

namespace {

/// A fresh temporary directory removed at scope exit.
struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& tag) {
    path = fs::temp_directory_path() / fmt::format("specsample-{}-{}", tag, ::getpid());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
};

/// Bytes of a file with the given header text (not padded) followed by `data_bytes` bytes 0..255.
std::vector<std::byte> raw_file(const std::string& header, std::size_t data_bytes) {
  std::vector<std::byte> out(8 + header.size() + data_bytes);
  const std::uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  for (std::size_t i = 0; i < data_bytes; ++i) {
    out[8 + header.size() + i] = static_cast<std::byte>(i & 0xffu);
  }
  return out;
}

/// The message thrown when reading `bytes`, or "" when it loads.
std::string error_of(std::vector<std::byte> bytes) {
  try {
    (void)io::safetensors_file::from_bytes(std::move(bytes), "bad.safetensors");
  } catch (const specsample::error& e) {
    return e.what();
  }
  return "";
}

std::vector<io::tensor_data> sample_tensors() {
  const std::vector<float> f = {1.0f, -2.5f, 0.125f, 3.0e-6f, 65504.0f, -0.0f};
  const std::vector<std::int32_t> i32 = {1, -2, 2147483647, -2147483647 - 1};
  const std::vector<std::int64_t> i64 = {5, -6, std::numeric_limits<std::int64_t>::max()};
  const std::vector<float> scalar = {42.0f};
  std::vector<io::tensor_data> ts;
  ts.push_back(io::make_tensor("a.f32", {2, 3}, f, io::dtype::f32));
  ts.push_back(io::make_tensor("b.f16", {3, 2}, f, io::dtype::f16));
  ts.push_back(io::make_tensor("c.bf16", {6}, f, io::dtype::bf16));
  ts.push_back(io::make_tensor("d.i32", {4}, i32));
  ts.push_back(io::make_tensor("e.i64", {3, 1}, i64));
  ts.push_back(io::make_tensor("f.scalar", {}, scalar));
  ts.push_back(io::make_tensor("g.empty", {0, 4}, std::span<const float>{}));
  return ts;
}

/// Reads every tensor of `f` fully (the fuzz test's "all views readable").
double touch_all(const io::safetensors_file& f) {
  double acc = 0;
  for (const io::tensor_view& t : f.tensors()) {
    if (io::is_floating(t.dtype)) {
      for (const float v : io::to_float_vector(t)) acc += std::isfinite(v) ? v : 1.0;
    } else {
      for (const std::int64_t v : io::to_int64_vector(t)) acc += static_cast<double>(v & 0xff);
    }
  }
  return acc;
}

}  // namespace

TEST_CASE("a written file reads back every dtype, shape and the metadata", "[io][safetensors]") {
  temp_dir dir("io-roundtrip");
  const fs::path path = dir.path / "t.safetensors";
  io::write_safetensors(path, sample_tensors(), {{"format", "pt"}, {"who", "test"}});

  // The file (streamed tensor by tensor) is byte for byte what serialize_safetensors lays out.
  {
    const std::vector<std::byte> expected = io::serialize_safetensors(sample_tensors(), {{"format", "pt"}, {"who", "test"}});
    std::ifstream in(path, std::ios::binary);
    const std::vector<char> got{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    REQUIRE(got.size() == expected.size());
    REQUIRE(std::memcmp(got.data(), expected.data(), got.size()) == 0);
  }

  const io::safetensors_file f = io::safetensors_file::open(path);
  REQUIRE(f.path() == path);
  REQUIRE(f.tensors().size() == 7);
  REQUIRE(f.metadata().at("format") == "pt");
  REQUIRE(f.metadata().at("who") == "test");
  REQUIRE(f.contains("a.f32"));
  REQUIRE_FALSE(f.contains("a"));
  REQUIRE(f.find("zzz") == nullptr);
  // at() names a missing tensor; a caller's name is quoted escaped and cut, as a file's names are.
  REQUIRE_THROWS_WITH(f.at("zzz"), Catch::Matchers::Contains("missing tensor 'zzz'"));
  try {
    (void)f.at("\x1b[2J" + std::string(100000, 'n'));
    FAIL("at() of a missing tensor must throw");
  } catch (const specsample::error& e) {
    const std::string_view what = e.what();
    REQUIRE(what.size() < path.string().size() + 200);
    REQUIRE(what.find('\x1b') == std::string_view::npos);
  }

  const io::tensor_view& a = f.at("a.f32");
  REQUIRE(a.dtype == io::dtype::f32);
  REQUIRE(a.shape == std::vector<std::size_t>{2, 3});
  REQUIRE(a.numel() == 6);
  REQUIRE(a.bytes().size() == 24);
  const std::vector<float> expected = {1.0f, -2.5f, 0.125f, 3.0e-6f, 65504.0f, -0.0f};
  REQUIRE(io::to_float_vector(a) == expected);

  // F16 and BF16 store rounded values: compare with the converters' round trip.
  const auto b = io::to_float_vector(f.at("b.f16"));
  const auto c = io::to_float_vector(f.at("c.bf16"));
  for (std::size_t i = 0; i < expected.size(); ++i) {
    REQUIRE(b[i] == io::f16_to_float(io::float_to_f16(expected[i])));
    REQUIRE(c[i] == io::bf16_to_float(io::float_to_bf16(expected[i])));
  }
  REQUIRE(b[0] == 1.0f);
  REQUIRE(b[4] == 65504.0f);
  REQUIRE(std::signbit(b[5]));

  REQUIRE(io::to_int32_vector(f.at("d.i32")) ==
          std::vector<std::int32_t>{1, -2, 2147483647, -2147483647 - 1});
  REQUIRE(io::to_int64_vector(f.at("d.i32")) ==
          std::vector<std::int64_t>{1, -2, 2147483647, -2147483647 - 1});
  REQUIRE(io::to_int64_vector(f.at("e.i64")) ==
          std::vector<std::int64_t>{5, -6, std::numeric_limits<std::int64_t>::max()});
  REQUIRE_THROWS_WITH(io::to_int32_vector(f.at("e.i64")), Catch::Contains("does not fit in int32"));

  const io::tensor_view& s = f.at("f.scalar");
  REQUIRE(s.shape.empty());
  REQUIRE(s.numel() == 1);
  REQUIRE(io::to_float_vector(s) == std::vector<float>{42.0f});
  REQUIRE(f.at("g.empty").numel() == 0);
  REQUIRE(io::to_float_vector(f.at("g.empty")).empty());

  // Conversion into a caller buffer.
  std::vector<float> buf(6);
  io::to_float(f.at("b.f16"), buf);
  REQUIRE(buf == b);
  std::vector<float> wrong(5);
  REQUIRE_THROWS_WITH(io::to_float(f.at("b.f16"), wrong), Catch::Contains("holds 5 floats"));
  REQUIRE_THROWS_WITH(io::to_float_vector(f.at("d.i32")),
                      Catch::Contains("expected a floating-point dtype"));
  REQUIRE_THROWS_WITH(io::to_int64_vector(f.at("a.f32")),
                      Catch::Contains("expected an integer dtype"));
  REQUIRE_THROWS_WITH(f.at("nope"), Catch::Contains("missing tensor 'nope'") &&
                                        Catch::Contains("t.safetensors"));

  // Moving the file keeps views valid (the mapping does not move).
  io::safetensors_file moved = io::safetensors_file::open(path);
  const std::byte* before = moved.at("a.f32").data.data();
  io::safetensors_file other = std::move(moved);
  REQUIRE(other.at("a.f32").data.data() == before);
  REQUIRE(io::to_float_vector(other.at("a.f32")) == expected);

  // One file as a checkpoint (the sharded form: tests/gpt2, "a sharded checkpoint"): the same
  // tensors in the same order, each from that file, and views valid across a move.
  io::safetensors_checkpoint one(std::move(other));
  REQUIRE(one.path() == path);
  REQUIRE(one.files().size() == 1);
  REQUIRE(one.tensors().size() == 7);
  REQUIRE(std::is_sorted(one.tensors().begin(), one.tensors().end(),
                         [](const io::tensor_view* x, const io::tensor_view* y) { return x->name < y->name; }));
  REQUIRE(one.find("zzz") == nullptr);
  const io::safetensors_checkpoint moved_one = std::move(one);
  REQUIRE(moved_one.find("a.f32")->data.data() == before);
  REQUIRE(moved_one.path_of(*moved_one.find("a.f32")) == path);
  REQUIRE(io::safetensors_checkpoint::open(path).contains("b.f16"));
  static_assert(!std::is_copy_constructible_v<io::safetensors_checkpoint>);
}

TEST_CASE("f16 and bf16 conversions are exact, including subnormals, infinities and nan",
          "[io][safetensors]") {
  REQUIRE(io::f16_to_float(0x0000) == 0.0f);
  REQUIRE(std::signbit(io::f16_to_float(0x8000)));
  REQUIRE(io::f16_to_float(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  REQUIRE(io::f16_to_float(0x03ff) == 1023.0f * std::ldexp(1.0f, -24));
  REQUIRE(io::f16_to_float(0x8001) == -std::ldexp(1.0f, -24));
  REQUIRE(io::f16_to_float(0x0400) == std::ldexp(1.0f, -14));  // smallest normal
  REQUIRE(io::f16_to_float(0x3c00) == 1.0f);
  REQUIRE(io::f16_to_float(0x3555) == 0.333251953125f);
  REQUIRE(io::f16_to_float(0xc000) == -2.0f);
  REQUIRE(io::f16_to_float(0x7bff) == 65504.0f);
  REQUIRE(io::f16_to_float(0x7c00) == std::numeric_limits<float>::infinity());
  REQUIRE(io::f16_to_float(0xfc00) == -std::numeric_limits<float>::infinity());
  REQUIRE(std::isnan(io::f16_to_float(0x7e00)));
  REQUIRE(std::isnan(io::f16_to_float(0x7c01)));

  // Every non-NaN half survives half -> float -> half.
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto hv = static_cast<std::uint16_t>(h);
    const float f = io::f16_to_float(hv);
    if (std::isnan(f)) {
      REQUIRE(std::isnan(io::f16_to_float(io::float_to_f16(f))));
    } else {
      REQUIRE(io::float_to_f16(f) == hv);
    }
  }
  // Round to nearest, ties to even.
  REQUIRE(io::float_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  REQUIRE(io::float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  REQUIRE(io::float_to_f16(65519.0f) == 0x7bff);
  REQUIRE(io::float_to_f16(65520.0f) == 0x7c00);
  REQUIRE(io::float_to_f16(std::ldexp(1.0f, -25)) == 0x0000);  // tie -> even (zero)
  REQUIRE(io::float_to_f16(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 ulp -> 2

  REQUIRE(io::bf16_to_float(0x3f80) == 1.0f);
  REQUIRE(io::bf16_to_float(0xc040) == -3.0f);
  REQUIRE(io::bf16_to_float(0x7f80) == std::numeric_limits<float>::infinity());
  REQUIRE(io::bf16_to_float(0x0001) == std::ldexp(1.0f, -133));  // bf16 subnormal
  REQUIRE(std::isnan(io::bf16_to_float(0x7fc0)));
  REQUIRE(io::float_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);      // tie -> even
  REQUIRE(io::float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);  // tie -> even (up)
  REQUIRE(std::isnan(io::bf16_to_float(io::float_to_bf16(std::nanf("")))));
}

TEST_CASE("tensors at unaligned offsets read correctly", "[io][safetensors]") {
  // An odd header length puts the data section, and so every tensor, at odd addresses.
  const std::string header =
      R"({"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[2,10]},)"
      R"("c":{"dtype":"I64","shape":[1],"data_offsets":[10,18]},)"
      R"("d":{"dtype":"BF16","shape":[1],"data_offsets":[18,20]}})";
  const std::string pad = (8 + header.size()) % 2 == 0 ? " " : "";
  std::vector<std::byte> bytes = raw_file(header + pad, 20);
  const std::size_t base = 8 + header.size() + pad.size();
  REQUIRE(base % 2 == 1);
  const std::uint16_t one_h = 0x3c00;
  const float b[2] = {1.5f, -7.25f};
  const std::int64_t c = -123456789012345;
  const std::uint16_t d = 0x4040;  // bf16 3.0
  std::memcpy(bytes.data() + base, &one_h, 2);
  std::memcpy(bytes.data() + base + 2, b, 8);
  std::memcpy(bytes.data() + base + 10, &c, 8);
  std::memcpy(bytes.data() + base + 18, &d, 2);
  const auto f = io::safetensors_file::from_bytes(bytes);
  REQUIRE(io::to_float_vector(f.at("a")) == std::vector<float>{1.0f});
  REQUIRE(io::to_float_vector(f.at("b")) == std::vector<float>{1.5f, -7.25f});
  REQUIRE(io::to_int64_vector(f.at("c")) == std::vector<std::int64_t>{c});
  REQUIRE(io::to_float_vector(f.at("d")) == std::vector<float>{3.0f});
}

TEST_CASE("every kind of malformed file is rejected with a message naming file and problem",
          "[io][safetensors]") {
  using Catch::Contains;
  const auto entry = [](const std::string& name, const std::string& dt, const std::string& shape,
                        const std::string& offsets) {
    return fmt::format(R"("{}":{{"dtype":"{}","shape":{},"data_offsets":{}}})", name, dt, shape,
                       offsets);
  };
  const auto file = [&](const std::string& body, std::size_t data = 16) {
    return raw_file("{" + body + "}", data);
  };

  SECTION("a file shorter than the length field") {
    const std::vector<std::byte> tiny(5, std::byte{0});
    REQUIRE_THAT(error_of(tiny), Contains("bad.safetensors") && Contains("too small"));
    REQUIRE_THAT(error_of({}), Contains("too small"));
  }
  SECTION("a header length beyond the end of the file") {
    auto bytes = file(entry("a", "F32", "[4]", "[0,16]"));
    const std::uint64_t n = bytes.size();  // 8 bytes too long
    std::memcpy(bytes.data(), &n, 8);
    REQUIRE_THAT(error_of(bytes), Contains("header length") && Contains("exceeds the file size"));
    const std::uint64_t huge = ~std::uint64_t{0};
    std::memcpy(bytes.data(), &huge, 8);
    REQUIRE_THAT(error_of(bytes), Contains("exceeds the file size"));
  }
  SECTION("a header longer than the reference reader's cap, in a file that holds it") {
    // A sparse file: the length field and then zeros up to the header's end, mapped, not read.
    temp_dir dir("header-cap");
    const fs::path path = dir.path / "long-header.safetensors";
    const std::uint64_t n = io::detail::max_header_bytes + 1;
    {
      std::ofstream f(path, std::ios::binary);
      f.write(reinterpret_cast<const char*>(&n), 8);
      REQUIRE(f.good());
    }
    fs::resize_file(path, 8 + n);
    try {
      (void)io::safetensors_file::open(path);
      FAIL("a header of " << n << " bytes was read");
    } catch (const specsample::error& e) {
      REQUIRE_THAT(e.what(), Contains("header length 100000001 exceeds the limit of 100000000 bytes"));
    }
  }
  SECTION("a header that is not JSON") {
    REQUIRE_THAT(error_of(raw_file("{\"a\": [1, 2", 0)), Contains("not valid JSON"));
    REQUIRE_THAT(error_of(raw_file("", 0)), Contains("not valid JSON"));
    REQUIRE_THAT(error_of(raw_file("{\"a\xff\":1}", 0)), Contains("not valid JSON"));
    // A NUL byte ends nlohmann's input: the valid header before it must not hide what follows.
    using namespace std::string_literals;
    REQUIRE_THAT(error_of(raw_file("{\"__metadata__\":{}}\0\xff garbage {{"s, 0)),
                 Contains("bad.safetensors") && Contains("a NUL byte at offset 19"));
    REQUIRE_THAT(error_of(raw_file("{\"__metadata__\":{}}\0"s, 0)), Contains("a NUL byte at offset 19"));
  }
  SECTION("a header that is JSON but not an object") {
    REQUIRE_THAT(error_of(raw_file("[1,2,3]", 0)), Contains("not a JSON object"));
  }
  SECTION("a header that does not begin with '{' (JSON parsers skip a byte order mark and whitespace)") {
    REQUIRE_THAT(error_of(raw_file("\xEF\xBB\xBF{}", 0)),
                 Contains("bad.safetensors: header has 3 bytes before its opening '{' (a UTF-8 byte order mark)"));
    REQUIRE_THAT(error_of(raw_file(" \n{}", 0)), Contains("header has 2 bytes before its opening '{' (whitespace)"));
    REQUIRE(error_of(raw_file("{}  ", 0)).empty());  // (writers pad the header with spaces after it)
  }
  SECTION("absurdly nested JSON") {
    REQUIRE_THAT(error_of(raw_file("{\"a\":" + std::string(1000, '[') + std::string(1000, ']') + "}", 0)),
                 Contains("nested deeper"));
  }
  SECTION("an entry that is not an object or lacks a field") {
    REQUIRE_THAT(error_of(file(R"("a":[1])")), Contains("tensor 'a'") && Contains("not a JSON object"));
    REQUIRE_THAT(error_of(file(R"("a":{"dtype":"F32","shape":[4]})")),
                 Contains("must have \"dtype\", \"shape\" and \"data_offsets\""));
    REQUIRE_THAT(error_of(file(R"("a":{"dtype":1,"shape":[4],"data_offsets":[0,16]})")),
                 Contains("\"dtype\" is not a string"));
    REQUIRE_THAT(error_of(file(R"("a":{"dtype":"F32","shape":4,"data_offsets":[0,16]})")),
                 Contains("\"shape\" is not an array"));
    REQUIRE_THAT(error_of(file(R"("a":{"dtype":"F32","shape":[4],"data_offsets":[0]})")),
                 Contains("\"data_offsets\" is not an array [begin, end]"));
    REQUIRE_THAT(error_of(file(R"("a":{"dtype":"F32","shape":[4],"data_offsets":[0,"16"]})")),
                 Contains("[0,\"16\"]: the end is not a non-negative integer"));
  }
  SECTION("an unknown dtype is named") {
    REQUIRE_THAT(error_of(file(entry("a", "F128", "[1]", "[0,16]"))),
                 Contains("unknown dtype 'F128'") && Contains("tensor 'a'"));
    REQUIRE_THAT(error_of(file(entry("a", "F4", "[32]", "[0,16]"))), Contains("unknown dtype 'F4'"));  // (packed)
    REQUIRE_THAT(error_of(file(entry("a", "f32", "[4]", "[0,16]"))), Contains("unknown dtype 'f32'"));
  }
  SECTION("every byte-sized dtype of the format is read, its size checked, and refused by name where converted") {
    // Older transformers saved GPT-2's causal-mask buffer as U8, later ones as BOOL: a tensor a
    // model does not use may be of any dtype (the whole file was refused).
    for (const auto& [dt, size] : std::vector<std::pair<std::string, std::size_t>>{
             {"F64", 8}, {"I8", 1}, {"I16", 2}, {"U8", 1}, {"U16", 2}, {"U32", 4}, {"U64", 8}, {"BOOL", 1},
             {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1}}) {
      CAPTURE(dt);
      const std::string n = std::to_string(16 / size);
      const auto f = io::safetensors_file::from_bytes(file(entry("a", dt, "[" + n + "]", "[0,16]")), "any.safetensors");
      const io::tensor_view& t = f.at("a");
      CHECK(io::dtype_name(t.dtype) == dt);
      CHECK(io::dtype_size(t.dtype) == size);
      CHECK(t.numel() == 16 / size);
      CHECK_THROWS_WITH(io::to_float_vector(t), Contains("has dtype " + dt + ", expected a floating-point dtype"));
      CHECK_THROWS_WITH(io::to_int64_vector(t), Contains("has dtype " + dt + ", expected an integer dtype"));
      // Its bytes must still match its shape.
      REQUIRE_THAT(error_of(file(entry("a", dt, "[" + std::to_string(16 / size + 1) + "]", "[0,16]"))),
                   Contains("tensor 'a'"));
    }
  }
  SECTION("shape entries that are not non-negative integers") {
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[-4]", "[0,16]"))),
                 Contains("shape entry -4 is not a non-negative integer"));
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[2.5]", "[0,16]"))),
                 Contains("not a non-negative integer"));
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[\"4\"]", "[0,16]"))),
                 Contains("not a non-negative integer"));
    // An integer of 2^64 or more (which the JSON parser holds as a float) is too large, not a
    // non-integer; likewise in data_offsets, which say which of the two is at fault.
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[18446744073709551616]", "[0,16]"))),
                 Contains("shape entry 1.8446744073709552e+19 is too large (2^64 or more)"));
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[4]", "[0,18446744073709551616]"))),
                 Contains("\"data_offsets\" [0,1.8446744073709552e+19]: the end is too large (2^64 or more)"));
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[4]", "[-1,16]"))),
                 Contains("\"data_offsets\" [-1,16]: the begin is not a non-negative integer"));
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[4]", "[0,1.6e1]"))),
                 Contains("the end is not a non-negative integer"));
  }
  SECTION("a shape whose element or byte count overflows") {
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[4294967296,4294967296]", "[0,16]"))),
                 Contains("overflows the element count"));
    REQUIRE_THAT(error_of(file(entry("a", "I64", "[4611686018427387904]", "[0,16]"))),
                 Contains("overflows the byte size"));
  }
  SECTION("a byte size that disagrees with dtype x shape") {
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[3]", "[0,16]"))),
                 Contains("hold 16 bytes but dtype F32 with shape [3] needs 12 bytes"));
  }
  SECTION("offsets outside the data section or reversed") {
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[4]", "[8,24]"))),
                 Contains("outside the data section"));
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[0]", "[8,4]"))), Contains("begin > end"));
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[4]", "[0,18446744073709551615]"))),
                 Contains("outside the data section"));
  }
  SECTION("overlapping tensors") {
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[3]", "[0,12]") + "," +
                               entry("b", "F32", "[2]", "[8,16]"))),
                 Contains("tensors 'a' [0, 12] and 'b' [8, 16] overlap"));
  }
  SECTION("an empty tensor lies where the one before it ends, not inside it") {
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[3]", "[0,12]") + "," + entry("e", "F32", "[0]", "[4,4]"), 12)),
                 Contains("empty tensor 'e' at data offset 4 lies inside tensor 'a' [0, 12]"));
    for (const char* at : {"[0,0]", "[12,12]"}) {  // before the first tensor, after the last
      REQUIRE(error_of(file(entry("a", "F32", "[3]", "[0,12]") + "," + entry("e", "F32", "[0]", at), 12)).empty());
    }
    REQUIRE(error_of(file(entry("a", "F32", "[1]", "[0,4]") + "," + entry("e", "F32", "[0]", "[4,4]") + "," +
                          entry("f", "F32", "[0]", "[4,4]") + "," + entry("b", "F32", "[2]", "[4,12]"), 12))
                .empty());
  }
  SECTION("holes in the data section (the format requires it fully indexed)") {
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[8,12]"))),
                 Contains("4 unindexed bytes before tensor 'b'"));
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[1]", "[4,8]"))), Contains("unindexed bytes before tensor 'a'"));
    // Bytes appended after the last tensor (how a file is made to be two formats at once).
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[4]", "[0,16]"), 20)),
                 Contains("4 unindexed bytes after the last tensor (data section of 20 bytes, tensors cover 16)"));
  }
  SECTION("duplicate tensor names (JSON parsers silently keep the last)") {
    REQUIRE_THAT(error_of(file(entry("a", "F32", "[2]", "[0,8]") + "," +
                               entry("a", "F32", "[2]", "[8,16]"))),
                 Contains("duplicate key 'a'"));
    REQUIRE_THAT(error_of(file(R"("a":{"dtype":"F32","dtype":"F32","shape":[4],"data_offsets":[0,16]})")),
                 Contains("duplicate key 'dtype'"));
  }
  SECTION("metadata that is not a string map") {
    REQUIRE_THAT(error_of(file(R"("__metadata__":{"k":1})")),
                 Contains("__metadata__ entry 'k' is not a string"));
    REQUIRE_THAT(error_of(file(R"("__metadata__":[])")), Contains("__metadata__ is not a JSON object"));
  }
  SECTION("a missing file, a directory, a device") {
    REQUIRE_THROWS_WITH(io::safetensors_file::open("/nonexistent/dir/x.safetensors"),
                        Contains("/nonexistent/dir/x.safetensors") && Contains("file not found"));
    REQUIRE_THROWS_WITH(io::safetensors_file::open(fs::temp_directory_path()),
                        Contains("is a directory, expected a file"));
    REQUIRE_THROWS_WITH(io::safetensors_file::open("/dev/null"), Contains("not a regular file"));
  }
  SECTION("the writer refuses inconsistent tensors") {
    std::vector<io::tensor_data> ts = sample_tensors();
    ts[0].data.pop_back();
    REQUIRE_THROWS_WITH(io::serialize_safetensors(ts), Contains("'a.f32' has 23 bytes"));
    ts = sample_tensors();
    ts[1].name = ts[0].name;
    REQUIRE_THROWS_WITH(io::serialize_safetensors(ts), Contains("duplicate"));
    // A shape whose byte count wraps (2^62 x 4 F32 elements: 2^66 bytes, 0 mod 2^64) was written,
    // and the reader refused the file.
    const std::vector<io::tensor_data> wraps{io::make_tensor("a", {std::size_t{1} << 62, 4}, std::span<const float>{})};
    REQUIRE_THROWS_WITH(io::serialize_safetensors(wraps),
                        "write_safetensors: tensor 'a' of dtype F32 with shape [4611686018427387904, 4] overflows the "
                        "byte count");
    // ... counted as the reader counts: [2^62, 2, 0] holds no element, written and read back.
    const std::vector<io::tensor_data> empty{io::make_tensor("e", {std::size_t{1} << 62, 2, 0}, std::span<const float>{})};
    const std::vector<std::byte> bytes = io::serialize_safetensors(empty);
    temp_dir empty_dir("io-empty-shape");
    io::write_safetensors(empty_dir.path / "e.safetensors", empty);
    const auto back = io::safetensors_file::open(empty_dir.path / "e.safetensors");
    REQUIRE(back.at("e").shape == std::vector<std::size_t>{std::size_t{1} << 62, 2, 0});
    REQUIRE(bytes.size() == fs::file_size(empty_dir.path / "e.safetensors"));
    // JSON text is UTF-8: a name or a metadata string that is not threw nlohmann's type_error.
    const std::vector<float> one{1.0f};
    const std::vector<io::tensor_data> bad_name{io::make_tensor("w\xff", {1}, one)};
    REQUIRE_THROWS_WITH(io::serialize_safetensors(bad_name), "write_safetensors: tensor name 'w\\xFF' is not UTF-8");
    const std::vector<io::tensor_data> good{io::make_tensor("w", {1}, one)};
    REQUIRE_THROWS_WITH(io::serialize_safetensors(good, {{"k", "\xfe"}}),
                        "write_safetensors: metadata entry 'k' = '\\xFE' is not UTF-8");
    // write_safetensors checks before it opens the file: nothing is written.
    temp_dir dir("io-refused");
    REQUIRE_THROWS_WITH(io::write_safetensors(dir.path / "x.safetensors", ts), Contains("duplicate"));
    REQUIRE_FALSE(fs::exists(dir.path / "x.safetensors"));
    // Nor a header the reader would refuse (it wrote files no reader could open): 10^8 bytes of
    // metadata.
    const std::map<std::string, std::string, std::less<>> huge{{"note", std::string(100'000'000, 'a')}};
    REQUIRE_THROWS_WITH(io::write_safetensors(dir.path / "x.safetensors", sample_tensors(), huge),
                        Contains("write_safetensors: the header of ") && Contains(" tensors would be 1000") &&
                            Contains("bytes, more than the 100000000 bytes readers accept"));
    REQUIRE_FALSE(fs::exists(dir.path / "x.safetensors"));
    // A write that cannot finish (/dev/full's "disk" is always full) leaves the earlier file whole
    // and no temporary behind.
    if (fs::exists("/dev/full")) {
      io::write_safetensors(dir.path / "y.safetensors", sample_tensors());
      const auto before = fs::file_size(dir.path / "y.safetensors");
      fs::create_symlink("/dev/full", dir.path / "y.safetensors.tmp");
      REQUIRE_THROWS_WITH(io::write_safetensors(dir.path / "y.safetensors", sample_tensors()),
                          Contains("y.safetensors: write failed"));
      REQUIRE(fs::file_size(dir.path / "y.safetensors") == before);
      REQUIRE_FALSE(fs::exists(fs::symlink_status(dir.path / "y.safetensors.tmp")));
    } else {
      std::cout << "SKIPPED: a write to a full disk (no /dev/full here)\n";
    }
  }
  SECTION("a well-formed minimal file still loads") {
    REQUIRE(error_of(file(entry("a", "F32", "[4]", "[0,16]"))).empty());
    REQUIRE(error_of(raw_file("{}", 0)).empty());
  }
}

TEST_CASE("error messages quote long text by its head or its end, whole characters only", "[io][json]") {
  using specsample::io::detail::excerpt;
  using specsample::io::detail::excerpt_tail;
  CHECK(excerpt("abc", 3) == "abc");
  CHECK(excerpt("abcd", 3) == "abc... (4 bytes)");
  CHECK(excerpt_tail("abc", 3) == "abc");
  CHECK(excerpt_tail("abcd", 3) == "(4 bytes) ...bcd");
  CHECK(excerpt_tail("", 3).empty());
  // "é" is two bytes: never half of one; control and non-UTF-8 bytes as \xNN, a backslash doubled.
  CHECK(excerpt_tail("x\xC3\xA9\xC3\xA9", 3) == "(5 bytes) ...\xC3\xA9");
  CHECK(excerpt_tail("x\xC3\xA9\xC3\xA9", 4) == "(5 bytes) ...\xC3\xA9\xC3\xA9");
  CHECK(excerpt_tail("ab\x01\\", 6) == "(4 bytes) ...\\x01\\\\");
  CHECK(excerpt_tail(std::string("a\xFF"), 8) == "a\\xFF");
  // Against quoting every character of the whole text and taking from its end: random texts of
  // ASCII, control bytes, 2- to 4-byte characters, stray continuation bytes and invalid bytes.
  const std::vector<std::string> atoms = {"a", "\\", "\x01", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80",
                                          "\x82", "\xFF", "\xE2\x82"};
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    const std::size_t n = rng() % 60;
    for (std::size_t k = 0; k < n; ++k) text += atoms[rng() % atoms.size()];
    const std::size_t max_bytes = 1 + rng() % 40;
    std::vector<std::string> quotes;
    for (std::size_t i = 0; i < text.size();) {
      auto [q, len] = specsample::io::detail::quoted_char(text, i);
      quotes.push_back(q);
      i += len;
    }
    std::size_t first = quotes.size(), bytes = 0;
    while (first > 0 && bytes + quotes[first - 1].size() <= max_bytes) bytes += quotes[--first].size();
    std::string expected = first > 0 ? fmt::format("({} bytes) ...", text.size()) : "";
    for (std::size_t k = first; k < quotes.size(); ++k) expected += quotes[k];
    INFO("trial " << trial);
    REQUIRE(excerpt_tail(text, max_bytes) == expected);
  }
}

TEST_CASE("strict JSON parsing builds what nlohmann's parser builds, in linear time", "[io][json]") {
  using Catch::Matchers::Contains;
  using specsample::io::detail::parse_json_strict;
  constexpr std::size_t bound = io::detail::max_header_values;
  for (const std::string text : {R"({"a":[1,2,{"b":null,"c":[true,false,1.5,-3,"x"]}],"d":{},"e":[]})",
                                 R"([1,[2,[3,{"k":18446744073709551615}]]])", "3", R"("s")", "null",
                                 R"({"a":{"b":1},"c":{"b":1}})"}) {
    INFO(text);
    CHECK(parse_json_strict(text, "f", "header", bound) == nlohmann::json::parse(text));
  }
  CHECK_THROWS_WITH(parse_json_strict(R"({"a":{"b":1,"b":2}})", "f", "config", bound),
                    Contains("f: duplicate key 'b' in the config"));
  CHECK_THROWS_WITH(parse_json_strict("[1,2] x", "f", "header", bound), Contains("f: header is not valid JSON"));
  // A long bad token is quoted in part, not whole.
  const std::string long_token = "[" + std::string(100000, '7') + "x]";
  std::string message;
  try {
    (void)parse_json_strict(long_token, "f", "header", bound);
  } catch (const specsample::error& e) {
    message = e.what();
  }
  CHECK_THAT(message, Contains("f: header is not valid JSON") && Contains("bytes)"));
  CHECK(message.size() < 400);
  // The token the parser stopped in is quoted by its end, where its offending byte is (nlohmann
  // writes the LF <U+000A>: the token is the quote, 100 000 bytes and those 8).
  message.clear();
  try {
    (void)parse_json_strict("[\"" + std::string(100000, 'a') + "\n\"]", "f", "header", bound);
  } catch (const specsample::error& e) {
    message = e.what();
  }
  CHECK_THAT(message, Contains("line 2, column 0") && Contains("control character U+000A") &&
                          Contains("last read: '(100009 bytes) ...aaaa") && Contains("aaaa<U+000A>'"));
  CHECK(message.size() < 400);
  // A token that spells nlohmann's marker itself is still quoted whole, and what the parser
  // expected after it is kept.
  for (const auto& [text, quoted] : {std::pair<std::string, std::string>{"[\"; last read: 'x\n\"]",
                                                                         "last read: '\"; last read: 'x<U+000A>'"},
                                     {"[1,2] x", "last read: '2] x'; expected end of input"}}) {
    message.clear();
    try {
      (void)parse_json_strict(text, "f", "header", bound);
    } catch (const specsample::error& e) {
      message = e.what();
    }
    CHECK_THAT(message, Contains(quoted));
  }
  // Many sibling objects: linear (nlohmann's callback parser, which this replaced, rescanned the
  // members at every closing child: 40 000 took 19 s, so 100 000 would take minutes).
  std::string many = "{";
  for (int i = 0; i < 100000; ++i) many += fmt::format("{}\"k{}\":{{}}", i == 0 ? "" : ",", i);
  many += "}";
  const nlohmann::json j = parse_json_strict(many, "f", "header", bound);
  CHECK(j.size() == 100000);
  CHECK(j.at("k99999").is_object());
}

TEST_CASE("strict JSON parsing refuses more values than its caller's bound, before it reads on", "[io][json]") {
  using Catch::Contains;
  using specsample::io::detail::parse_json_strict;
  // Every scalar, object and array counts, keys do not: 5 values.
  const std::string text = R"({"a":[1,"x"],"b":{}})";
  CHECK(parse_json_strict(text, "f", "header", 5) == nlohmann::json::parse(text));
  CHECK_THROWS_WITH(parse_json_strict(text, "f", "header", 4),
                    "f: header holds more than 4 JSON values, the limit that keeps a crafted file from taking "
                    "gigabytes of memory to parse");
  CHECK(parse_json_strict("[null,true,2.5,-3]", "f", "config", 5).size() == 4);
  CHECK_THROWS_WITH(parse_json_strict("[null,true,2.5,-3]", "f", "config", 4),
                    Contains("f: config holds more than 4 JSON values"));
  // Refused at the value past the bound: nothing after it is read (its parse error would be next).
  CHECK_THROWS_WITH(parse_json_strict("[0,0,0,0 x", "f", "header", 3), Contains("f: header holds more than 3 JSON"));
}

TEST_CASE("a header of more JSON values than max_header_values is refused, one of as many loads",
          "[io][safetensors]") {
  // A tensor entry's unread key holding zeros (32 million `{}` there took 3 GB to parse): 9 values
  // besides them (the header, the entry, its dtype, shape and offsets, their 3 numbers, the key's array).
  const auto with_zeros = [](std::size_t zeros) {
    std::string header = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":[)";
    header.reserve(header.size() + 2 * zeros + 3);
    for (std::size_t i = 0; i < zeros; ++i) header += i == 0 ? "0" : ",0";
    header += "]}}";
    return raw_file(header, 16);
  };
  constexpr std::size_t bound = io::detail::max_header_values;
  REQUIRE(error_of(with_zeros(bound - 9)).empty());
  REQUIRE(error_of(with_zeros(bound - 8)) ==
          fmt::format("bad.safetensors: header holds more than {} JSON values, the limit that keeps a crafted file "
                      "from taking gigabytes of memory to parse",
                      bound));
}

TEST_CASE("names and values from a file are quoted escaped and cut short in messages", "[io][safetensors]") {
  using Catch::Contains;
  const auto printable = [](const std::string& m) {
    return std::none_of(m.begin(), m.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20U || c == 0x7F; });
  };
  // An escaped NUL (JSON's \u0000) cut what() short of the problem; ESC and CR reached the terminal.
  for (const auto& [header, data, message] : std::vector<std::tuple<std::string, std::size_t, std::string>>{
           {R"({"a\u0000b":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4,
            "bad.safetensors: tensor 'a\\x00b': unknown dtype 'F33' (known: F32, "},
           {R"({"\u001b[2K\r":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8,
            "bad.safetensors: 4 unindexed bytes before tensor '\\x1B[2K\\x0D' at data offset 0"},
           {R"({"a\u0000":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],)"
            R"("data_offsets":[4,8]}})",
            8, "bad.safetensors: tensors 'a\\x00' [0, 8] and 'b' [4, 8] overlap"},
           {R"({"\u007f":{"dtype":"\u001b","shape":[1],"data_offsets":[0,4]}})", 4,
            "bad.safetensors: tensor '\\x7F': unknown dtype '\\x1B' (known: "},
           {R"({"__metadata__":{"k\r\u0000":1}})", 0,
            "bad.safetensors: __metadata__ entry 'k\\x0D\\x00' is not a string (metadata maps strings to strings)"}}) {
    const std::string m = error_of(raw_file(header, data));
    INFO(m);
    CHECK_THAT(m, Contains(message));
    CHECK(printable(m));
  }
  // A megabyte of name, dtype, key, shape or offsets made a message of a megabyte.
  const std::string mb(1'000'000, 'n'), mb_quoted = "\"" + mb + "\"";
  const std::string zeros = fmt::format("{}", fmt::join(std::vector<int>(300'000, 0), ","));
  using case_parts = std::tuple<std::string, std::size_t, std::vector<std::string>>;  // header, data, message parts
  for (const auto& [header, data, messages] : std::vector<case_parts>{
           {R"({")" + mb + R"(":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4,
            {"bad.safetensors: tensor 'nnnn", "nnn... (1000000 bytes)': unknown dtype 'F33'"}},
           {R"({"a":{"dtype":)" + mb_quoted + R"(,"shape":[1],"data_offsets":[0,4]}})", 4,
            {"tensor 'a': unknown dtype 'nnnn", "nnn... (1000000 bytes)' (known: F32, "}},
           {R"({"__metadata__":{)" + mb_quoted + ":1}}", 0,
            {"__metadata__ entry 'nnnn", "(1000000 bytes)' is not a string"}},
           {R"({"a":{"dtype":"F32","shape":[)" + mb_quoted + R"(],"data_offsets":[0,4]}})", 4,
            {"tensor 'a': shape entry \"nnnn", "(1000002 bytes) is not a non-negative integer"}},
           {R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,)" + zeros + R"(],"data_offsets":[0,4]}})", 4,
            {"tensor 'a': shape [4294967296,4294967296,0,0,", "(600023 bytes) overflows the element count"}},
           {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[)" + mb_quoted + R"(,4]}})", 4,
            {"tensor 'a': \"data_offsets\" [\"nnnn", "(1000006 bytes): the begin is not a non-negative integer"}},
           {R"({"a":{"dtype":"F32","shape":[)" + zeros + R"(],"data_offsets":[0,4]}})", 4,
            {"tensor 'a': data_offsets [0, 4] hold 4 bytes but dtype F32 with shape [0, 0, 0,",
             "(900000 bytes) needs 0 bytes"}}}) {
    const std::string m = error_of(raw_file(header, data));
    INFO(m.substr(0, 600));
    for (const std::string& part : messages) CHECK_THAT(m, Contains(part));
    CHECK(m.size() < 400);
  }
  // The conversions quote a tensor's name too.
  const auto f = io::safetensors_file::from_bytes(
      raw_file(R"({"\u001b)" + mb + R"(":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4));
  for (const auto& convert : std::vector<std::function<void(const io::tensor_view&)>>{
           [](const io::tensor_view& t) { (void)io::to_float_vector(t); },
           [](const io::tensor_view& t) { (void)io::to_int32_vector(t); }}) {
    std::string m;
    try {
      convert(f.tensors()[0]);
    } catch (const specsample::error& e) {
      m = e.what();
    }
    CHECK_THAT(m, Contains("tensor '\\x1Bnnnn") && Contains("(1000001 bytes)' has dtype U8, expected"));
    CHECK(printable(m));
    CHECK(m.size() < 400);
  }
}

TEST_CASE("thousands of truncated and mutated files either load or throw, never crash",
          "[io][safetensors][fuzz]") {
  const std::vector<std::byte> valid =
      io::serialize_safetensors(sample_tensors(), {{"format", "pt"}});
  std::uint64_t header_len = 0;
  std::memcpy(&header_len, valid.data(), 8);
  const std::size_t header_end = 8 + static_cast<std::size_t>(header_len);
  REQUIRE(io::safetensors_file::from_bytes(valid).tensors().size() == 7);

  std::mt19937_64 rng(20240229);
  const auto uniform = [&](std::size_t lo, std::size_t hi) {  // inclusive
    return std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
  };
  const std::string interesting = "\"{}[],:-0123456789.eE \\";

  std::vector<std::vector<std::byte>> variants;
  for (std::size_t len = 0; len < valid.size(); ++len) {  // every truncation
    variants.emplace_back(valid.begin(), valid.begin() + static_cast<std::ptrdiff_t>(len));
  }
  for (int delta = -40; delta <= 40; ++delta) {  // header length off by a little
    auto v = valid;
    const std::uint64_t n = header_len + static_cast<std::uint64_t>(static_cast<std::int64_t>(delta));
    std::memcpy(v.data(), &n, 8);
    variants.push_back(std::move(v));
  }
  for (int i = 0; i < 4000; ++i) {
    auto v = valid;
    const std::size_t edits = uniform(1, 4);
    for (std::size_t e = 0; e < edits; ++e) {
      const std::size_t where = uniform(0, 99);
      std::size_t pos = 0;
      if (where < 15) {
        pos = uniform(0, 7);  // the length field
      } else if (where < 90) {
        pos = uniform(8, header_end - 1);  // the JSON
      } else {
        pos = uniform(header_end, v.size() - 1);  // the data
      }
      const std::size_t how = uniform(0, 3);
      if (how == 0) {
        v[pos] = static_cast<std::byte>(uniform(0, 255));
      } else if (how == 1) {
        v[pos] = static_cast<std::byte>(interesting[uniform(0, interesting.size() - 1)]);
      } else if (how == 2) {
        v[pos] ^= static_cast<std::byte>(1u << uniform(0, 7));
      } else if (pos >= 8 && pos < header_end) {
        // A digit becomes another digit: shapes and offsets go subtly wrong.
        v[pos] = static_cast<std::byte>('0' + uniform(0, 9));
      }
    }
    if (uniform(0, 9) == 0) v.resize(uniform(0, v.size()));
    variants.push_back(std::move(v));
  }

  temp_dir dir("io-fuzz");
  std::size_t loaded = 0;
  std::size_t rejected = 0;
  double checksum = 0;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    try {
      if (i % 64 == 0) {  // also through the mmap path
        const fs::path p = dir.path / "v.safetensors";
        {
          std::ofstream out(p, std::ios::binary | std::ios::trunc);
          out.write(reinterpret_cast<const char*>(variants[i].data()),
                    static_cast<std::streamsize>(variants[i].size()));
        }
        checksum += touch_all(io::safetensors_file::open(p));
      } else {
        checksum += touch_all(io::safetensors_file::from_bytes(variants[i], "fuzz"));
      }
      ++loaded;
    } catch (const specsample::error&) {
      ++rejected;
    }
  }
  INFO("loaded " << loaded << ", rejected " << rejected << ", checksum " << checksum);
  REQUIRE(loaded + rejected == variants.size());
  REQUIRE(variants.size() > 4000);
  REQUIRE(loaded > 100);
  REQUIRE(rejected > 1000);
}

TEST_CASE("read_file refuses a file larger than any text file, naming it, before reading it", "[io]") {
  // A sparse file: no disk and no memory is spent on it (the read would have allocated 1 GiB).
  temp_dir dir("read-file");
  const fs::path big = dir.path / "vocab.json";
  { std::ofstream(big) << "{}"; }
  fs::resize_file(big, io::max_text_file_bytes + 1);
  using Catch::Contains;
  REQUIRE_THROWS_WITH(io::read_file(big), Contains(big.string()) && Contains("1073741825 bytes") &&
                                              Contains("larger than any text file this library reads"));
  fs::resize_file(big, 2);
  REQUIRE(io::read_file(big) == "{}");
}

TEST_CASE("a stream of no known size is read to its end, and refused once a byte past the limit is read", "[io]") {
  // A pipe (standard input's kind of stream): its size is unknown until its end.
  const auto read_pipe = [](std::size_t bytes, std::size_t limit) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const std::string text(bytes, 'x');  // (less than a pipe's 64 KiB buffer: written at once)
    REQUIRE(::write(fds[1], text.data(), text.size()) == static_cast<::ssize_t>(text.size()));
    ::close(fds[1]);
    struct closer {
      int fd;
      ~closer() { ::close(fd); }
    } in{fds[0]};
    return io::detail::read_to_end(in.fd, 0, "standard input", limit);
  };
  REQUIRE(read_pipe(5000, 5000).size() == 5000);
  REQUIRE(read_pipe(0, 5000).empty());
  using Catch::Contains;
  REQUIRE_THROWS_WITH(read_pipe(6000, 5000), Contains("standard input: 5001 bytes or more") && Contains("(at most 5000)"));
  REQUIRE_THROWS_WITH(read_pipe(3000, 2000), Contains("standard input: 2001 bytes or more"));  // limit below 4096
  REQUIRE(read_pipe(2000, 2000).size() == 2000);
}
