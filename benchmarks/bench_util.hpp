#pragma once
// Command-line and machine helpers shared by the benchmark programs (bench.cpp, leniency.cpp).

#include <specsample/error.hpp>
#include <specsample/io/argument.hpp>
#include <specsample/io/number.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <unistd.h>

namespace specsample_bench {

[[noreturn]] inline void usage_error(const std::string& message) {
  throw specsample::error(message + " (see --help)");
}

/// `value` with `precision` decimals, or with as many more (at most 6) as it takes to tell it from
/// `goal` where the two would print alike: a figure beside a verdict never reads as its goal while
/// the verdict, which compares the unrounded values, says otherwise (0.6996 of a goal of 0.7 shows
/// "0.6996", not "0.700" beside "not met").
inline std::string fmt_beside_goal(double value, double goal, int precision) {
  for (int p = precision;; ++p) {
    std::string shown = fmt::format("{:.{}f}", value, p);
    if (value == goal || p == precision + 6 || shown != fmt::format("{:.{}f}", goal, p)) return shown;
  }
}

/// The 1, 5 and 15 minute load averages from /proc/loadavg.
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return in ? a + " " + b + " " + c : "unknown";
}

/// Time counters from /proc/stat ("cpuN" lines) and /proc/self/stat, in clock ticks: per CPU its
/// id, all time, time in processes (user, nice, system; guest time is inside user and nice) and
/// steal time (the virtual CPU ready to run while the hypervisor ran something else); and this
/// process's own CPU time. Empty (`ok()` false) where /proc is unreadable or not in that form.
struct cpu_ticks {
  std::vector<int> id;
  std::vector<unsigned long long> total, processes, steal;
  unsigned long long self = 0;
  [[nodiscard]] bool ok() const noexcept { return !id.empty(); }
};

namespace detail {
inline bool parse_ticks(std::string_view text, unsigned long long& value) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc{} && end == text.data() + text.size();
}
// The whitespace-separated fields of `line`.
inline std::vector<std::string_view> fields(std::string_view line) {
  std::vector<std::string_view> f;
  for (std::size_t i = 0; i < line.size();) {
    const std::size_t start = line.find_first_not_of(' ', i);
    if (start == std::string_view::npos) break;
    const std::size_t stop = std::min(line.find(' ', start), line.size());
    f.push_back(line.substr(start, stop - start));
    i = stop;
  }
  return f;
}
}  // namespace detail

inline cpu_ticks read_cpu_ticks() {
  cpu_ticks t;
  std::ifstream in("/proc/stat");
  std::string line;
  while (std::getline(in, line)) {
    const auto f = detail::fields(line);
    // "cpuN user nice system idle iowait irq softirq steal ..." (the "cpu" line is the sum)
    if (f.empty() || f[0].size() < 4 || f[0].substr(0, 3) != "cpu") continue;
    unsigned long long id = 0;
    if (!detail::parse_ticks(f[0].substr(3), id) || f.size() < 9) return {};
    unsigned long long v[8];
    for (std::size_t i = 0; i < 8; ++i) {
      if (!detail::parse_ticks(f[i + 1], v[i])) return {};
    }
    t.id.push_back(static_cast<int>(id));
    t.total.push_back(v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7]);
    t.processes.push_back(v[0] + v[1] + v[2]);
    t.steal.push_back(v[7]);
  }
  // /proc/self/stat: "pid (comm) state ..." with utime and stime fields 14 and 15, the 12th and
  // 13th after the last ')' (comm may hold spaces and parentheses).
  std::ifstream self("/proc/self/stat");
  if (!std::getline(self, line)) return {};
  const auto paren = line.rfind(')');
  if (paren == std::string::npos) return {};
  const auto f = detail::fields(std::string_view(line).substr(paren + 1));
  unsigned long long utime = 0, stime = 0;
  if (f.size() < 13 || !detail::parse_ticks(f[11], utime) || !detail::parse_ticks(f[12], stime)) return {};
  t.self = utime + stime;
  return t;
}

/// What else ran while a measurement did, from `read_cpu_ticks` before and after it: per CPU the
/// share of its time that was stolen, and the share of all CPUs' time that other processes of
/// this machine used. Counters that went backwards count as 0. `steal` is empty when either
/// snapshot is.
struct contention {
  std::vector<int> cpus;
  std::vector<double> steal;
  double others = 0.0;
  unsigned long long ticks = 0;  // all CPUs' ticks in the window: the figures' resolution
};

inline contention contention_between(const cpu_ticks& before, const cpu_ticks& after) {
  contention c;
  if (!before.ok() || before.id != after.id) return c;
  const auto delta = [](unsigned long long a, unsigned long long b) { return b > a ? b - a : 0ULL; };
  unsigned long long processes = 0;
  for (std::size_t i = 0; i < before.id.size(); ++i) {
    const auto all = delta(before.total[i], after.total[i]);
    c.ticks += all;
    processes += delta(before.processes[i], after.processes[i]);
    c.cpus.push_back(before.id[i]);
    c.steal.push_back(all == 0 ? 0.0 : static_cast<double>(delta(before.steal[i], after.steal[i])) /
                                           static_cast<double>(all));
  }
  const auto self = delta(before.self, after.self);
  c.others = c.ticks == 0 || processes <= self ? 0.0 : static_cast<double>(processes - self) / static_cast<double>(c.ticks);
  return c;
}

/// Creates `dir` if needed and checks that files can be written in it, throwing
/// `specsample::error` naming `flag` otherwise: called before a run, so that an output directory
/// that cannot be written fails in a second, not after hours of measurement.
inline void check_output_directory(const std::filesystem::path& dir, std::string_view flag) {
  std::error_code ec;
  if (std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec)) {
    ec = std::make_error_code(std::errc::not_a_directory);  // (standard libraries word create_directories' apart)
  } else {
    std::filesystem::create_directories(dir, ec);
  }
  // Creating a file there needs write and search permission.
  if (!ec && ::access(dir.c_str(), W_OK | X_OK) != 0) ec = std::error_code(errno, std::generic_category());
  if (ec) throw specsample::error(fmt::format("{} {}: cannot write there: {}", flag, dir.string(), ec.message()));
}

/// Writes `text` to `dir / name`, creating `dir`.
inline void write_file(const std::filesystem::path& dir, const std::string& name, const std::string& text) {
  std::filesystem::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary);
  f << text;
  f.close();  // (a full disk shows when the buffer is written)
  if (!f) throw specsample::error(fmt::format("{}: cannot write", (dir / name).string()));
}

/// main() of a benchmark program: runs `run`, reporting an exception as "`tool`: error: ..."
/// with exit status 2, as it does output that could not be written to stdout (a full disk, a
/// closed descriptor): a report that was lost is not a success.
template <class Run>
int guarded_main(const char* tool, Run&& run) {
  int status = 2;
  try {
    status = run();
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: error: {}\n", tool, e.what());
    return 2;
  }
  return specsample::io::written(tool, status);
}

}  // namespace specsample_bench
