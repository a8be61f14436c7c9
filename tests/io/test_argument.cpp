#include <specsample/io/argument.hpp>

#include <catch2/catch.hpp>

#include <optional>
#include <string_view>
#include <vector>

using specsample::io::argument;
using specsample::io::did_you_mean;
using specsample::io::flags_named_in;
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
  CHECK(specsample::io::unread_value_message(split_argument("--stream=yes")) == "--stream takes no value, got 'yes'");
}

TEST_CASE("did_you_mean names the long option within a few edits of an unknown one", "[io][argument]") {
  constexpr std::string_view help = "usage: tool [options]\n"
                                    "  --temperature T    sampling temperature\n"
                                    "  --top-k N, --top-p P   filters (not --top-q)\n"
                                    "  [--seed S] [--broken|--stream]\n"
                                    "  -n N               tokens (-n, not a long option)\n"
                                    "  x--notaflag, --9 ok\n";
  CHECK(flags_named_in(help) == std::vector<std::string_view>{"--temperature", "--top-k", "--top-p", "--top-q",
                                                              "--seed", "--broken", "--stream", "--9"});
  CHECK(did_you_mean("--tempreature", help) == " (did you mean --temperature?)");  // a transposition
  CHECK(did_you_mean("--temprature=0.7", help) == " (did you mean --temperature?)");  // the value is not compared
  CHECK(did_you_mean("--tmprture", help) == "");                                    // 3 edits: too far
  CHECK(did_you_mean("--sed", help) == " (did you mean --seed?)");                  // 1 edit of a short name
  CHECK(did_you_mean("--sd", help) == "");                                          // 2 edits of a short name
  CHECK(did_you_mean("--top-z", help) == "");                   // three at one edit: none named
  CHECK(did_you_mean("--brokn", help) == " (did you mean --broken?)");
  CHECK(did_you_mean("--streams", help) == " (did you mean --stream?)");
  CHECK(did_you_mean("-k", help) == "");                        // not a long option
  CHECK(did_you_mean("-n=64", help) == " (a short option takes its value after a space: -n 64)");
  CHECK(did_you_mean("-k=3", help) == "");                      // a short option the help does not name
  CHECK(did_you_mean("-x=3", "usage: t -xy") == "");            // "-x" only inside a word
  CHECK(did_you_mean("-n=4", "[-n|--max-new-tokens N] (-n) -n: x") == " (a short option takes its value after a space: -n 4)");
  CHECK(did_you_mean("-h=x", "  -h, --help  this text") == " (-h takes no value)");
  // One or two characters after "--": no edit allowed (--k is no typo of --kv), but the short
  // option of those characters is offered.
  CHECK(did_you_mean("--k", "  -k K, --kv F") == " (did you mean -k?)");
  CHECK(did_you_mean("--k", "  --kv F") == "");
  CHECK(did_you_mean("--cc", "  --c C") == "");
  CHECK(flags_named_in("-----\n --- x\n --a") == std::vector<std::string_view>{"--a"});  // no rule of dashes
  CHECK(did_you_mean("hello", help) == "");
  CHECK(did_you_mean("--", help) == "");
}

TEST_CASE("did_you_mean offers the two nearest long options when they tie", "[io][argument]") {
  CHECK(did_you_mean("--top-x", "--top-k N, --top-p P") == " (did you mean --top-k or --top-p?)");
  CHECK(did_you_mean("--top-k", "--top-k N, --top-p P") == "");  // a known flag is no typo
}
