#include <specsample/io/argument.hpp>

#include <catch2/catch.hpp>

#include <optional>
#include <string_view>

using specsample::io::argument;
using specsample::io::split_argument;

namespace {
bool same(const argument& a, std::string_view flag, std::optional<std::string_view> attached) {
  return a.flag == flag && a.attached == attached;
}
}  // namespace

TEST_CASE("split_argument takes a long option's value after its first '='", "[io][argument]") {
  CHECK(same(split_argument("--temperature=0.7"), "--temperature", "0.7"));
  CHECK(same(split_argument("--prompt=a=b"), "--prompt", "a=b"));   // the first '=' only
  CHECK(same(split_argument("--prompt="), "--prompt", ""));          // an empty value, attached
  CHECK(same(split_argument("--stream"), "--stream", std::nullopt));
  // Not long options: whole, nothing attached.
  CHECK(same(split_argument("-k"), "-k", std::nullopt));
  CHECK(same(split_argument("-k=3"), "-k=3", std::nullopt));
  CHECK(same(split_argument("--"), "--", std::nullopt));
  CHECK(same(split_argument("--=x"), "--=x", std::nullopt));  // no name before the '='
  CHECK(same(split_argument("x=y"), "x=y", std::nullopt));    // a value, say --prompt's next argument
  CHECK(same(split_argument(""), "", std::nullopt));
  static_assert(split_argument("--n=1").flag == "--n");  // constexpr
}
