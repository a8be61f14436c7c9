#pragma once
// Command-line and machine helpers shared by the benchmark programs (bench.cpp, leniency.cpp).

#include <specsample/error.hpp>

#include <fmt/format.h>

#include <charconv>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace specsample_bench {

[[noreturn]] inline void usage_error(const std::string& message) {
  throw specsample::error(message + " (see --help)");
}

template <class T>
T parse_number(std::string_view flag, std::string_view text) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) {
    usage_error(fmt::format("{} expects a number, got '{}'", flag, text));
  }
  return value;
}

/// A comma-separated list of numbers, e.g. "0,0.7,1"; at least one.
template <class T>
std::vector<T> parse_list(std::string_view flag, std::string_view list) {
  std::vector<T> values;
  while (!list.empty()) {
    const auto comma = list.find(',');
    values.push_back(parse_number<T>(flag, list.substr(0, comma)));
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
  }
  if (values.empty()) usage_error(fmt::format("{} needs at least one value", flag));
  return values;
}

/// The 1, 5 and 15 minute load averages from /proc/loadavg.
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return in ? a + " " + b + " " + c : "unknown";
}

/// Writes `text` to `dir / name`, creating `dir`.
inline void write_file(const std::filesystem::path& dir, const std::string& name, const std::string& text) {
  std::filesystem::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary);
  f << text;
  if (!f) throw specsample::error(fmt::format("{}: cannot write", (dir / name).string()));
}

/// main() of a benchmark program: runs `run`, reporting an exception as "`tool`: error: ..."
/// with exit status 2.
template <class Run>
int guarded_main(const char* tool, Run&& run) {
  try {
    return run();
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: error: {}\n", tool, e.what());
    return 2;
  }
}

}  // namespace specsample_bench
