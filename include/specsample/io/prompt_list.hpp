#pragma once
/// @file prompt_list.hpp
/// A list of prompts in a text file: one prompt per line, `\n` for a newline, `\t` for a tab and
/// `\\` for a backslash; lines starting with `#` and blank lines are ignored (the format of
/// benchmarks/prompts.txt, read by specsample-bench and by specsample-generate's
/// `--calibration-prompts`).

#include <specsample/error.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace specsample::io {

/// Reads the prompts of `path`; throws `specsample::error` naming the file (and the line) when it
/// cannot be read, an escape is unknown or dangling, or it holds no prompt.
[[nodiscard]] inline std::vector<std::string> read_prompt_list(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error(fmt::format("{}: cannot open the prompt file", path.string()));
  std::vector<std::string> prompts;
  std::string line;
  std::size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty() || line.front() == '#') continue;
    std::string p;
    for (std::size_t i = 0; i < line.size(); ++i) {
      if (line[i] != '\\') {
        p += line[i];
        continue;
      }
      if (i + 1 == line.size()) throw error(fmt::format("{}:{}: dangling backslash", path.string(), number));
      const char e = line[++i];
      if (e == 'n') p += '\n';
      else if (e == 't') p += '\t';
      else if (e == '\\') p += '\\';
      else throw error(fmt::format("{}:{}: unknown escape \\{}", path.string(), number, e));
    }
    prompts.push_back(std::move(p));
  }
  if (prompts.empty()) throw error(fmt::format("{}: no prompts", path.string()));
  return prompts;
}

}  // namespace specsample::io
