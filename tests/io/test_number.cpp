#include <specsample/io/number.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

using specsample::io::parse_number;

TEST_CASE("parse_number reads a whole number in its type's range, or names the flag", "[io][number]") {
  REQUIRE(parse_number<std::size_t>("-n", "128") == 128);
  REQUIRE(parse_number<int>("--top-k", "-3") == -3);
  REQUIRE(parse_number<double>("--temperature", "0.7") == 0.7);
  REQUIRE(parse_number<float>("--temperature", "0") == 0.0f);
  REQUIRE(parse_number<std::uint64_t>("--seed", "18446744073709551615") == 18446744073709551615u);
  // Not a number of the type, or not all of the text.
  REQUIRE_THROWS_WITH(parse_number<std::size_t>("--samples", "-5"), "--samples expects an integer >= 0, got '-5'");
  REQUIRE_THROWS_WITH(parse_number<int>("--top-k", "3.5"), "--top-k expects an integer, got '3.5'");
  REQUIRE_THROWS_WITH(parse_number<double>("--leniency", ""), "--leniency expects a number, got ''");
  REQUIRE_THROWS_WITH(parse_number<std::size_t>("-n", "12 "), "-n expects an integer >= 0, got '12 '");
  REQUIRE_THROWS_WITH(parse_number<double>("--top-p", "0x1p-3"), "--top-p expects a number, got '0x1p-3'");
  // Out of range: the range said.
  REQUIRE_THROWS_WITH(parse_number<int>("--top-k", "99999999999"),
                      "--top-k expects a number from -2147483648 to 2147483647, got '99999999999'");
  REQUIRE_THROWS_WITH(parse_number<std::uint64_t>("--seed", "99999999999999999999"),
                      "--seed expects a number from 0 to 18446744073709551615, got '99999999999999999999'");
  REQUIRE_THROWS_WITH(parse_number<float>("--temperature", "1e-50"),
                      "--temperature expects a number that is 0 or rounds to a magnitude of at least 1e-45, got '1e-50'");
  REQUIRE_THROWS_WITH(parse_number<float>("--temperature", "1e39"),
                      "--temperature expects a number of magnitude at most 3.4028235e+38, got '1e39'");
  REQUIRE_THROWS_WITH(parse_number<double>("--leniency", "-1e309"),
                      "--leniency expects a number of magnitude at most 1.7976931348623157e+308, got '-1e309'");
  REQUIRE_THROWS_WITH(parse_number<double>("--leniency", "1e-400"),
                      "--leniency expects a number that is 0 or rounds to a magnitude of at least 5e-324, got '1e-400'");
  REQUIRE(parse_number<float>("--temperature", "1e-45") == std::numeric_limits<float>::denorm_min());
  REQUIRE(parse_number<float>("--temperature", "8e-46") == std::numeric_limits<float>::denorm_min());  // (rounds up)
  // Which end, also beyond a long double's range (the text read by its exponent or its digits).
  REQUIRE_THROWS_WITH(parse_number<double>("--x", "1e-5000"),
                      "--x expects a number that is 0 or rounds to a magnitude of at least 5e-324, got '1e-5000'");
  REQUIRE_THROWS_WITH(parse_number<double>("--x", "-1E+5000"),
                      "--x expects a number of magnitude at most 1.7976931348623157e+308, got '-1E+5000'");
  const std::string huge = "1" + std::string(5000, '0'), tiny = "0." + std::string(5000, '0') + "1";
  REQUIRE_THROWS_WITH(parse_number<double>("--x", huge), Catch::Matchers::StartsWith("--x expects a number of magnitude at most"));
  REQUIRE_THROWS_WITH(parse_number<double>("--x", tiny), Catch::Matchers::StartsWith("--x expects a number that is 0"));
  // Which end however the text writes it: by its decimal exponent, counted exactly from the digits
  // (leading zeros not counted) and the exponent. Huge with leading zeros, or with a negative
  // exponent that leaves it huge (1e5000), was called too small; tiny with a positive exponent
  // (1e-5001), too large.
  const std::string zeros(5000, '0');
  const std::vector<std::string> huge_texts = {
      "01" + zeros,                        // 1e5000, a leading zero
      "1" + zeros + zeros + "e-5000",      // 1e5000, a negative exponent
      "-00" + zeros + "1" + zeros + ".5",  // -1.5e5000
      "0." + zeros.substr(1) + "1e10000",  // 1e5000, a fraction
      "0.1e+5000", "1e99999999999999999999999", "-0.00" + zeros + "7E99999999999999999999999"};
  for (const std::string& text : huge_texts) {
    INFO(text.substr(0, 40) << "... (" << text.size() << " bytes)");
    CHECK_THROWS_WITH(parse_number<double>("--x", text),
                      Catch::Matchers::StartsWith("--x expects a number of magnitude at most 1.797693134862315"));
    CHECK_THROWS_WITH(parse_number<long double>("--x", text),
                      Catch::Matchers::StartsWith("--x expects a number of magnitude at most"));
  }
  const std::vector<std::string> tiny_texts = {
      "0." + zeros + zeros + "1e5000",  // 1e-5001, a positive exponent
      "100e-5003", "-00.00" + zeros + "1", "1" + zeros + "e-10001", "1e-99999999999999999999999",
      "0.001E-99999999999999999999999", "9" + zeros + ".5e-99999999999999999999999"};
  for (const std::string& text : tiny_texts) {
    INFO(text.substr(0, 40) << "... (" << text.size() << " bytes)");
    CHECK_THROWS_WITH(parse_number<double>("--x", text),
                      Catch::Matchers::StartsWith("--x expects a number that is 0 or rounds to a magnitude of at least "
                                                  "5e-324"));
    CHECK_THROWS_WITH(parse_number<long double>("--x", text),
                      Catch::Matchers::StartsWith("--x expects a number that is 0 or rounds to a magnitude of at "
                                                  "least"));
  }
}

TEST_CASE("parse_number with a least value gives one message for every value below it", "[io][number]") {
  REQUIRE(parse_number<std::size_t>("-n", "1", 1) == 1);
  REQUIRE(parse_number<int>("--x", "-3", -3) == -3);
  // Below it, or no integer at all: the same sentence ("-1" too, which a size_t cannot hold).
  REQUIRE_THROWS_WITH(parse_number<std::size_t>("-n", "0", 1), "-n expects an integer >= 1, got '0'");
  REQUIRE_THROWS_WITH(parse_number<std::size_t>("-n", "-1", 1), "-n expects an integer >= 1, got '-1'");
  REQUIRE_THROWS_WITH(parse_number<std::size_t>("-n", "2.5", 1), "-n expects an integer >= 1, got '2.5'");
  REQUIRE_THROWS_WITH(parse_number<int>("--x", "-4", -3), "--x expects an integer >= -3, got '-4'");
  REQUIRE_THROWS_WITH(parse_number<int>("--x", "-99999999999", -3), "--x expects an integer >= -3, got '-99999999999'");
  // Above the type's range: the range from the least value.
  REQUIRE_THROWS_WITH(parse_number<std::uint16_t>("--port", "70000", std::uint16_t{1}),
                      "--port expects an integer from 1 to 65535, got '70000'");
}

TEST_CASE("parse_list reads comma-separated numbers, every item one", "[io][number]") {
  using specsample::io::parse_list;
  CHECK(parse_list<double>("--t", "0,0.7,1") == std::vector<double>{0.0, 0.7, 1.0});
  CHECK(parse_list<int>("--k", "3") == std::vector<int>{3});
  CHECK_THROWS_WITH(parse_list<double>("--t", ""), "--t needs at least one value");
  CHECK_THROWS_WITH(parse_list<double>("--t", "0.5,"), "--t expects a number, got ''");
  CHECK_THROWS_WITH(parse_list<double>("--t", ",0.5"), "--t expects a number, got ''");
  CHECK_THROWS_WITH(parse_list<int>("--k", "1,x"), "--k expects an integer, got 'x'");
}
