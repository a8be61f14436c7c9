#pragma once
/// @file argument.hpp
/// One command-line argument as the tools' parsers read it (specsample-generate, specsample-bench,
/// specsample-leniency, specsample-random-gpt2 and distribution_check): `--name=value` is the flag
/// `--name` with its value attached, the same as `--name value`; and for a long option none of them
/// knows, the ones of its help text within a few edits (`did_you_mean`). `argument_reader` walks a
/// command line flag by flag with those rules.

#include <specsample/error.hpp>
#include <specsample/io/number.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace specsample::io {

/// A tool's exit status `status` once its standard output is written; else 2, saying so on stderr
/// ("`tool`: error: cannot write to standard output[: the reason]"): output that a full disk or a
/// closed descriptor lost (a report, a verdict, the help) is a failure, not a success.
[[nodiscard]] inline int written(std::string_view tool, int status) {
  const bool flush_failed = std::fflush(stdout) != 0;  // (errno names a failure of this flush only)
  if (flush_failed || std::ferror(stdout) != 0) {
    fmt::print(stderr, "{}: error: cannot write to standard output{}\n", tool,
               flush_failed ? fmt::format(": {}", std::strerror(errno)) : std::string());
    return 2;
  }
  return status;
}

/// A command-line argument split at its first '=' when it is a long option (`--temperature=0.7`:
/// flag "--temperature", attached "0.7"; `--prompt=a=b`: "--prompt" and "a=b"; `--stream=`: an
/// empty value attached). Anything else — `--stream`, `-k`, `-k=3`, a value — is a flag of its
/// own with nothing attached.
struct argument {
  std::string_view flag;
  std::optional<std::string_view> attached;
};

/// The tools' refusal of `flag` (their --p-min, the library's draft_min_probability) beside a
/// one-hot draft warping (`sampling_params::one_hot`), where it would never stop a round.
[[nodiscard]] inline std::string p_min_with_one_hot_draft_message(std::string_view flag) {
  std::string m(flag);
  m.append(" stops a round when the draft's top probability falls below it, but the draft decodes greedily "
           "(--temperature 0, --draft-temperature 0 or --top-k 1): its top probability is always 1; give the "
           "draft a temperature above 0");
  return m;
}

/// The refusal of a value attached to a flag that reads none: "--stream takes no value, got 'yes'".
[[nodiscard]] inline std::string unread_value_message(const argument& a) {
  std::string m(a.flag);
  m.append(" takes no value, got '").append(a.attached.value_or("")).append("'");
  return m;
}

[[nodiscard]] constexpr argument split_argument(std::string_view text) noexcept {
  if (text.size() > 2 && text.starts_with("--")) {
    const std::size_t eq = text.find('=');
    if (eq != std::string_view::npos && eq > 2) return {text.substr(0, eq), text.substr(eq + 1)};
  }
  return {text, std::nullopt};
}

/// The tools' command lines, read flag by flag: a flag's value is the one attached after '='
/// (`split_argument`) or else the argument after it; every refusal is a `specsample::error` naming
/// the flag, for the tool to report as its usage error.
///
///     for (io::argument_reader args(argc, argv); args.next();) {
///       if (args.flag() == "--temperature") temperature = args.number<float>();
///       else if (args.flag() == "--top-k") top_k = args.number<int>(1);   // at least 1
///       else if (args.flag() == "--out") out = args.path_value();
///       else if (args.flag() == "--stream") stream = true;                 // "--stream=yes": refused
///       else throw specsample::error(...);
///     }
///
/// `next()` refuses a value attached to the flag before that did not read it ("--stream takes no
/// value, got 'yes'"); a flag acted on at once (`--help`, which exits) calls `refuse_value()`.
class argument_reader {
 public:
  argument_reader(int argc, const char* const* argv) noexcept : argc_(argc), argv_(argv) {}

  /// Steps to the next flag, after refusing a value attached to the one before that it did not
  /// read; false after the last.
  [[nodiscard]] bool next() {
    refuse_value();
    if (index_ + 1 >= argc_) return false;
    current_ = split_argument(argv_[++index_]);
    value_.reset();
    return true;
  }

  /// The flag as typed, without a value attached after '='.
  [[nodiscard]] std::string_view flag() const noexcept { return current_.flag; }

  /// The flag's value: the one attached after '=', else the next argument ("--top-k needs a value"
  /// at the end); read once, so a second call gives the same value. A next argument that reads as
  /// a long option is not taken as the value ("--target needs a value, got the flag --mode"): a
  /// flag whose value was forgotten would swallow the flag after it. A value that begins with "--"
  /// is attached: `--prompt=--- ROMEO ---`.
  [[nodiscard]] std::string_view value() {
    if (!value_) {
      if (current_.attached) {
        value_ = current_.attached;
      } else if (index_ + 1 < argc_) {
        const std::string_view next(argv_[index_ + 1]);
        if (next.size() > 2 && next.starts_with("--")) {
          throw error(fmt::format("{0} needs a value, got the flag {1} (a value that begins with \"--\" is attached "
                                  "with '=': {0}={1})",
                                  current_.flag, next));
        }
        value_ = next;
        ++index_;
      } else {
        throw error(fmt::format("{} needs a value", current_.flag));
      }
    }
    return *value_;
  }

  /// `value()` as a path, which must not be empty: an empty one would read as the current
  /// directory, or name no file at all ("--out needs a path, got an empty string").
  [[nodiscard]] std::filesystem::path path_value() {
    const std::string_view v = value();
    if (v.empty()) throw error(fmt::format("{} needs a path, got an empty string", current_.flag));
    return std::filesystem::path(v);
  }

  /// `value()` read whole as a T by `parse_number`, an integer's least value after it if given.
  template <class T, class... Least>
    requires(sizeof...(Least) <= 1)
  [[nodiscard]] T number(Least... least) {
    const std::string_view v = value();
    return parse_number<T>(current_.flag, v, static_cast<T>(least)...);
  }

  /// `value()` as a comma-separated list of numbers (`parse_list`).
  template <class T>
  [[nodiscard]] std::vector<T> list() {
    const std::string_view v = value();
    return parse_list<T>(current_.flag, v);
  }

  /// Refuses a value attached to the flag that it has not read: for a switch acted on before
  /// `next()` (`--help=x`, as `--help` exits).
  void refuse_value() const {
    if (current_.attached && !value_) throw error(unread_value_message(current_));
  }

 private:
  int argc_;
  const char* const* argv_;
  int index_ = 0;  // argv_[index_]: the last argument read (argv[0], the program, to begin with)
  argument current_{};
  std::optional<std::string_view> value_;  // the flag's value, once read
};

/// The long options ("--name") a help text names, in order, each once: every "--" that starts a
/// word (after a space, a tab, a newline, '[', '(' or '|', or at the start) and is followed by a
/// letter or digit, with the letters, digits and '-' after it (a rule of dashes is none).
[[nodiscard]] inline std::vector<std::string_view> flags_named_in(std::string_view help) {
  std::vector<std::string_view> flags;
  for (std::size_t at = help.find("--"); at != std::string_view::npos; at = help.find("--", at + 2)) {
    if (at > 0 && std::string_view(" \t\n[(|").find(help[at - 1]) == std::string_view::npos) continue;
    std::size_t end = at + 2;
    if (end == help.size() || std::isalnum(static_cast<unsigned char>(help[end])) == 0) continue;  // ("-----")
    while (end < help.size() && (std::isalnum(static_cast<unsigned char>(help[end])) != 0 || help[end] == '-')) ++end;
    const std::string_view flag = help.substr(at, end - at);
    if (std::find(flags.begin(), flags.end(), flag) == flags.end()) flags.push_back(flag);
  }
  return flags;
}

namespace detail {

// Optimal string alignment distance (Damerau–Levenshtein without repeated edits of a substring):
// insertions, deletions, substitutions and transpositions of adjacent characters cost 1 each;
// bound + 1 for any distance above `bound`. An alignment of cost <= bound never strays more than
// bound cells from the diagonal, so only that band is computed: O(max(|a|, |b|) × bound), where
// the whole table of two long strings took seconds. No distance exceeds max(|a|, |b|): a larger
// bound is that (so that bound + 1 and i + bound cannot wrap).
[[nodiscard]] inline std::size_t edit_distance(std::string_view a, std::string_view b, std::size_t bound) {
  bound = std::min(bound, std::max(a.size(), b.size()));
  const std::size_t far = bound + 1;
  if ((a.size() > b.size() ? a.size() - b.size() : b.size() - a.size()) > bound) return far;
  const std::size_t n = b.size();
  std::vector<std::size_t> before(n + 2, far), prev(n + 2, far), cur(n + 2, far);
  for (std::size_t j = 0; j <= std::min(n, bound); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    const std::size_t lo = i > bound ? i - bound : 1, hi = std::min(n, i + bound);
    // Column 0, or the cell left of the band, which an earlier row wrote (the cells right of the
    // band no row has written yet: far, as initialised).
    cur[lo - 1] = lo == 1 && i <= bound ? i : far;
    for (std::size_t j = lo; j <= hi; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      std::size_t d = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d = std::min(d, before[j - 2] + 1);
      cur[j] = std::min(d, far);
    }
    before.swap(prev);
    prev.swap(cur);
  }
  return std::min(prev[n], far);
}

}  // namespace detail

namespace detail {

// Whether `help` names the short option `flag` ("-n") as a word of its own: after a space, a tab, a
// newline, '[', '(' or '|', or at the start, and before a space, a tab, a newline, ',', ']', ')',
// '|', ':' or the end.
[[nodiscard]] inline bool names_short_option(std::string_view help, std::string_view flag) {
  for (std::size_t at = help.find(flag); at != std::string_view::npos; at = help.find(flag, at + 1)) {
    const bool starts = at == 0 || std::string_view(" \t\n[(|").find(help[at - 1]) != std::string_view::npos;
    const std::size_t end = at + flag.size();
    const bool ends = end == help.size() || std::string_view(" \t\n,])|:").find(help[end]) != std::string_view::npos;
    if (starts && ends) return true;
  }
  return false;
}

}  // namespace detail

/// " (did you mean --temperature?)" for an unknown long option `typed` within a few edits of one
/// that `help` names (`flags_named_in`): at most 1 edit for names of 3 or 4 characters after the
/// "--", 2 for longer ones (a transposition is one edit), none for 1 or 2 (against `--kv`, `--k`
/// is no typo of it but maybe of `-k`: a short option the help names is offered for `--` and its
/// one or two characters); the nearest, or the two nearest when they tie (" (did you mean --top-k
/// or --top-p?)"). Empty when none is that near, when `typed` is not a long option or is one
/// `help` names; the part of `typed` after a '=' is not compared. For a short option `help` names
/// given its value after '=', how it takes one: "-n=4" → " (a short option takes its value after a
/// space: -n 4)" (and for -h, the help's switch in every tool here: " (-h takes no value)").
[[nodiscard]] inline std::string did_you_mean(std::string_view typed, std::string_view help) {
  if (typed.size() > 3 && typed[0] == '-' && typed[1] != '-' && typed[2] == '=') {  // "-n=4"
    const std::string_view flag = typed.substr(0, 2);
    if (!detail::names_short_option(help, flag)) return {};
    if (flag == "-h") return " (-h takes no value)";
    std::string hint = " (a short option takes its value after a space: ";
    hint.append(flag).append(" ").append(typed.substr(3)).append(")");
    return hint;
  }
  typed = split_argument(typed).flag;
  if (typed.size() <= 2 || !typed.starts_with("--")) return {};
  const std::string_view name = typed.substr(2);
  if (name.size() <= 2) {  // "--k": the short option "-k", if the help names one
    std::string hint = " (did you mean -";  // (built by appends: GCC 12's -Wrestrict misreads "-" + name)
    hint.append(name);
    if (!detail::names_short_option(help, std::string_view(hint).substr(15))) return {};
    hint.append("?)");
    return hint;
  }
  const std::size_t limit = name.size() <= 4 ? 1 : 2;
  std::vector<std::string_view> nearest;
  std::size_t best = limit + 1;
  for (const std::string_view flag : flags_named_in(help)) {
    const std::size_t d = detail::edit_distance(name, flag.substr(2), limit);
    if (d == 0) return {};  // a flag the help names: no typo
    if (d > limit || d > best) continue;
    if (d < best) nearest.clear();
    best = d;
    nearest.push_back(flag);
  }
  if (nearest.empty() || nearest.size() > 2) return {};
  std::string hint = " (did you mean ";
  hint.append(nearest[0]);
  if (nearest.size() == 2) {
    hint.append(" or ");
    hint.append(nearest[1]);
  }
  hint.append("?)");
  return hint;
}

}  // namespace specsample::io
