#pragma once
// Command-line and machine helpers shared by the benchmark programs (bench.cpp, leniency.cpp).

#include <specsample/error.hpp>

#include <fmt/format.h>

#include <charconv>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
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

/// Time counters from /proc/stat ("cpuN" lines) and /proc/self/stat, in clock ticks: per CPU all
/// time, busy time (all but idle and iowait) and steal time (the virtual CPU ready to run while
/// the hypervisor ran something else); and this process's own CPU time. Empty where /proc is
/// unreadable or /proc/stat has no steal column.
struct cpu_ticks {
  std::vector<unsigned long long> total, busy, steal;
  unsigned long long self = 0;
};

inline cpu_ticks read_cpu_ticks() {
  cpu_ticks t;
  std::ifstream in("/proc/stat");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || line[3] < '0' || line[3] > '9') continue;
    std::istringstream fields(line.substr(line.find(' ')));
    std::vector<unsigned long long> v;
    for (unsigned long long x = 0; fields >> x;) v.push_back(x);
    if (v.size() < 8) return {};  // user nice system idle iowait irq softirq steal ...
    unsigned long long sum = 0;
    for (std::size_t i = 0; i < 8; ++i) sum += v[i];  // guest time is already in user and nice
    t.total.push_back(sum);
    t.busy.push_back(sum - v[3] - v[4]);
    t.steal.push_back(v[7]);
  }
  // /proc/self/stat: "pid (comm) state ..." with utime and stime the 14th and 15th fields, the
  // 12th and 13th after the parenthesis (comm may hold spaces).
  std::ifstream self("/proc/self/stat");
  std::getline(self, line);
  const auto paren = line.rfind(')');
  if (paren == std::string::npos) return {};
  std::istringstream rest(line.substr(paren + 1));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 1; i <= 13 && rest >> field; ++i) {
    if (i == 12) utime = std::stoull(field);
    if (i == 13) stime = std::stoull(field);
  }
  t.self = utime + stime;
  return t;
}

/// What else ran while a measurement did, from `read_cpu_ticks` before and after it: per CPU the
/// share of its time that was stolen, and the share of all CPUs' time that other processes of
/// this machine used. Empty / 0 when either snapshot is empty.
struct contention {
  std::vector<double> steal;
  double others = 0.0;
};

inline contention contention_between(const cpu_ticks& before, const cpu_ticks& after) {
  contention c;
  if (before.total.empty() || before.total.size() != after.total.size()) return c;
  unsigned long long all = 0, busy = 0;
  for (std::size_t i = 0; i < before.total.size(); ++i) {
    const auto cpu_all = after.total[i] - before.total[i];
    all += cpu_all;
    busy += after.busy[i] - before.busy[i];
    c.steal.push_back(cpu_all == 0 ? 0.0
                                   : static_cast<double>(after.steal[i] - before.steal[i]) / static_cast<double>(cpu_all));
  }
  const auto self = after.self - before.self;
  c.others = all == 0 || busy <= self ? 0.0 : static_cast<double>(busy - self) / static_cast<double>(all);
  return c;
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
