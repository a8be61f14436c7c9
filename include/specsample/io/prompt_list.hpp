#pragma once
/// @file prompt_list.hpp
/// A list of prompts in a text file: one prompt per line, `\n` for a newline, `\t` for a tab and
/// `\\` for a backslash; lines starting with `#` and blank lines (empty, or only spaces and tabs)
/// are ignored; LF, CRLF or CR line ends, and a UTF-8 byte order mark at the start is skipped (the
/// format of benchmarks/prompts.txt, read by specsample-bench and by specsample-generate's
/// `--calibration-prompts`).

#include <specsample/error.hpp>
#include <specsample/io/mapped_file.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace specsample::io {

/// Reads the prompts of `path` (LF, CRLF or CR line ends); throws `specsample::error` naming the file
/// (and the line) when it cannot be read, an escape is unknown or dangling, or it holds no prompt.
[[nodiscard]] inline std::vector<std::string> read_prompt_list(const std::filesystem::path& path) {
  const std::string data = read_file(path);
  std::vector<std::string> prompts;
  detail::for_each_line(data, [&](std::size_t number, std::string_view line) {
    if (number == 1 && line.starts_with("\xEF\xBB\xBF")) line.remove_prefix(3);  // an editor's UTF-8 BOM
    if (line.find_first_not_of(" \t") == std::string_view::npos || line.front() == '#') return;
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
      else {
        throw error(fmt::format("{}:{}: unknown escape: a backslash before '{}' (the escapes are \\n, \\t and \\\\)",
                                path.string(), number, detail::quoted_char(line, i).first));
      }
    }
    prompts.push_back(std::move(p));
  });
  if (prompts.empty()) throw error(fmt::format("{}: no prompts", path.string()));
  return prompts;
}

}  // namespace specsample::io
