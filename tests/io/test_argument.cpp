#include <specsample/io/argument.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <optional>
#include <random>
#include <string>
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

namespace {
// The whole table of the optimal string alignment distance: the reference for the banded one.
std::size_t full_edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}
}  // namespace

TEST_CASE("the edit distance computes only the band its bound needs, and agrees with the whole table",
          "[io][argument]") {
  using specsample::io::detail::edit_distance;
  std::mt19937 rng(3);
  const auto random_string = [&] {
    std::string s(rng() % 9, 'a');
    for (char& c : s) c = static_cast<char>('a' + rng() % 3);  // three letters: many near pairs
    return s;
  };
  for (int i = 0; i < 20000; ++i) {
    const std::string a = random_string(), b = random_string();
    const std::size_t bound = rng() % 4;
    INFO("'" << a << "' / '" << b << "', bound " << bound);
    REQUIRE(edit_distance(a, b, bound) == std::min(full_edit_distance(a, b), bound + 1));
  }
  // A bound beyond both lengths is the exact distance (bound + 1 and the band's edge cannot wrap).
  CHECK(edit_distance("kitten", "sitting", std::numeric_limits<std::size_t>::max()) == 3);
  CHECK(edit_distance("", "abc", std::numeric_limits<std::size_t>::max() - 1) == 3);
  CHECK(edit_distance("ab", "ba", 7) == 1);
  // Two long flags: the band, not a 200 000² table (which took seconds at -O2).
  const std::string flag = "--" + std::string(200'000, 'x') + "yz";
  std::string typed = flag;
  std::swap(typed[typed.size() - 1], typed[typed.size() - 2]);
  CHECK(did_you_mean(typed, flag) == " (did you mean " + flag + "?)");
  CHECK(did_you_mean(typed + "abc", flag) == "");
}

TEST_CASE("did_you_mean offers the two nearest long options when they tie", "[io][argument]") {
  CHECK(did_you_mean("--top-x", "--top-k N, --top-p P") == " (did you mean --top-k or --top-p?)");
  CHECK(did_you_mean("--top-k", "--top-k N, --top-p P") == "");  // a known flag is no typo
}

namespace {
// Runs a command line through an argument_reader, each flag handled by `handle`; the flags read, in order.
template <class Handle>
std::vector<std::string> read_all(std::vector<const char*> argv, Handle handle) {
  argv.insert(argv.begin(), "tool");
  std::vector<std::string> flags;
  for (specsample::io::argument_reader args(static_cast<int>(argv.size()), argv.data()); args.next();) {
    flags.emplace_back(args.flag());
    handle(args);
  }
  return flags;
}
}  // namespace

TEST_CASE("argument_reader reads a flag's value attached after '=' or following it", "[io][argument]") {
  std::vector<std::string> values;
  const auto take = [&](specsample::io::argument_reader& args) {
    if (args.flag() != "--stream") values.emplace_back(args.value());
  };
  CHECK(read_all({"--prompt", "-x", "--temperature=0.7", "--stream", "-k", "3", "--prompt=a=b", "--prompt=--x",
                  "--seed", "--", "--top-k", "-1"},
                 take) ==
        std::vector<std::string>{"--prompt", "--temperature", "--stream", "-k", "--prompt", "--prompt", "--seed",
                                 "--top-k"});
  // "-x", "--" and "-1" are values; a value that begins with "--" is attached.
  CHECK(values == std::vector<std::string>{"-x", "0.7", "3", "a=b", "--x", "--", "-1"});

  // Read once: a second value() is the same value, not the next argument.
  values.clear();
  read_all({"--a", "1", "--b"}, [&](auto& args) {
    if (args.flag() == "--a") {
      values.emplace_back(args.value());
      values.emplace_back(args.value());
    }
  });
  CHECK(values == std::vector<std::string>{"1", "1"});
  CHECK(read_all({}, take).empty());
}

TEST_CASE("argument_reader refuses a missing value, an unread attached one and an empty path", "[io][argument]") {
  const auto take = [](specsample::io::argument_reader& args) {
    if (args.flag() != "--stream" && args.flag() != "--help") static_cast<void>(args.value());
    if (args.flag() == "--help") args.refuse_value();
    if (args.flag() == "--out") static_cast<void>(args.path_value());
  };
  CHECK_THROWS_WITH(read_all({"--seed", "1", "--top-k"}, take), "--top-k needs a value");
  // A flag whose value was forgotten does not swallow the flag after it.
  CHECK_THROWS_WITH(read_all({"--out", "--stream", "x"}, take),
                    "--out needs a value, got the flag --stream (a value that begins with \"--\" is attached with "
                    "'=': --out=--stream)");
  CHECK_THROWS_WITH(read_all({"--seed", "--top-k=3"}, take), Catch::StartsWith("--seed needs a value, got the flag --top-k=3"));
  CHECK_THROWS_WITH(read_all({"--stream=yes", "--seed", "1"}, take), "--stream takes no value, got 'yes'");
  CHECK_THROWS_WITH(read_all({"--seed", "1", "--stream="}, take), "--stream takes no value, got ''");  // the last flag too
  CHECK_THROWS_WITH(read_all({"--help=x"}, take), "--help takes no value, got 'x'");
  CHECK_THROWS_WITH(read_all({"--out", ""}, take), "--out needs a path, got an empty string");
  CHECK_THROWS_WITH(read_all({"--out="}, take), "--out needs a path, got an empty string");
  CHECK_NOTHROW(read_all({"--seed=", "--stream"}, take));  // an empty value, read: the flag's to judge
}

TEST_CASE("argument_reader reads numbers and lists naming the flag", "[io][argument]") {
  std::size_t n = 0;
  std::vector<double> ts;
  const auto take = [&](specsample::io::argument_reader& args) {
    if (args.flag() == "-n") n = args.number<std::size_t>(1);
    if (args.flag() == "--temperatures") ts = args.list<double>();
  };
  read_all({"-n", "64", "--temperatures=0,0.7,1"}, take);
  CHECK(n == 64);
  CHECK(ts == std::vector<double>{0.0, 0.7, 1.0});
  CHECK_THROWS_WITH(read_all({"-n", "0"}, take), "-n expects an integer >= 1, got '0'");
  CHECK_THROWS_WITH(read_all({"--temperatures", "1,,0.5"}, take), "--temperatures expects a number, got ''");
  CHECK_THROWS_WITH(read_all({"--temperatures="}, take), "--temperatures needs at least one value");
}
