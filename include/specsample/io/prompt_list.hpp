#pragma once
/// @file prompt_list.hpp
/// A list of prompts in a text file: one prompt per line, `\n` for a newline, `\t` for a tab and
/// `\\` for a backslash; lines starting with `#` and blank lines (empty, or only spaces and tabs)
/// are ignored; LF, CRLF or CR line ends, and a UTF-8 byte order mark at the start is skipped (the
/// format of benchmarks/prompts.txt, read by specsample-bench and by specsample-generate's
/// `--calibration-prompts`). The file must be UTF-8 text (`check_prompt_text`, which also checks a
/// whole-file prompt): UTF-16 or UTF-32, a NUL byte or bytes that are not UTF-8 are refused.

#include <specsample/error.hpp>
#include <specsample/io/mapped_file.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace specsample::io {

/// Checks that `bytes`, the whole of a prompt file (`label` names it in messages: its path, or
/// "standard input"), is UTF-8 text, and returns it without the UTF-8 byte order mark an editor may
/// put at its start (EF BB BF; one later is text), a view of the same bytes. Nothing else is read:
/// escapes, comments and blank lines are `read_prompt_list`'s, which calls this first; a whole-file
/// prompt (specsample-generate's `--prompt-file`) is the text returned, as it is. Throws
/// `specsample::error` naming `label` when the text
/// - starts with the byte order mark of UTF-16 or UTF-32 (FF FE, FE FF, FF FE 00 00, 00 00 FE FF):
///   "p.txt: looks like UTF-16 LE text (it starts with the byte order mark FF FE); save it as UTF-8";
/// - holds a NUL byte (UTF-16 or UTF-32 without a byte order mark, or no text at all): "p.txt:3: not
///   UTF-8 text: a NUL byte at byte offset 11 (UTF-16 or UTF-32 without a byte order mark?); save it
///   as UTF-8";
/// - is not valid UTF-8 (strict RFC 3629, as `detail::utf8_char_length`: Latin-1 or Windows-1252
///   text, a character cut short): "p.txt:2: not UTF-8 text: byte 0xE9 at byte offset 12 begins no
///   valid character; save it as UTF-8".
/// Lines are numbered from 1 as `read_prompt_list` numbers them (LF, CRLF or CR ends), byte offsets
/// from 0 at the start of `bytes` (a UTF-8 byte order mark counted). The byte-level tokenizer would
/// encode any bytes, but a prompt file is text: another encoding's bytes would become tokens the
/// model never saw for that text. (Raw bytes can still be encoded: `bpe_tokenizer::encode`.)
[[nodiscard]] inline std::string_view check_prompt_text(std::string_view bytes, std::string_view label) {
  struct byte_order_mark {
    std::string_view bytes, hex, encoding;
  };
  static constexpr byte_order_mark wide[] = {  // (UTF-32 LE before UTF-16 LE, whose mark begins it)
      {std::string_view("\xFF\xFE\0\0", 4), "FF FE 00 00", "UTF-32 LE"},
      {std::string_view("\0\0\xFE\xFF", 4), "00 00 FE FF", "UTF-32 BE"},
      {"\xFF\xFE", "FF FE", "UTF-16 LE"},
      {"\xFE\xFF", "FE FF", "UTF-16 BE"}};
  for (const auto& m : wide) {
    if (bytes.starts_with(m.bytes)) {
      throw error(fmt::format("{}: looks like {} text (it starts with the byte order mark {}); save it as UTF-8",
                              label, m.encoding, m.hex));
    }
  }
  const auto line_of = [&](std::size_t at) {  // the line holding the byte at `at` (not a line end)
    std::size_t found = 0;
    detail::for_each_line(bytes, [&](std::size_t number, std::string_view line) {
      if (found == 0 && at < static_cast<std::size_t>(line.data() - bytes.data()) + line.size()) found = number;
    });
    return found;
  };
  if (const std::size_t at = bytes.find('\0'); at != std::string_view::npos) {
    throw error(fmt::format("{}:{}: not UTF-8 text: a NUL byte at byte offset {} (UTF-16 or UTF-32 without a byte "
                            "order mark?); save it as UTF-8",
                            label, line_of(at), at));
  }
  if (const std::size_t i = detail::first_invalid_utf8(bytes); i < bytes.size()) {
    throw error(fmt::format("{}:{}: not UTF-8 text: byte 0x{:02X} at byte offset {} begins no valid character; "
                            "save it as UTF-8",
                            label, line_of(i), static_cast<unsigned char>(bytes[i]), i));
  }
  if (bytes.starts_with("\xEF\xBB\xBF")) bytes.remove_prefix(3);
  return bytes;
}

/// `text` when it is UTF-8 (as `check_prompt_text` reads a file) and not empty — the prompt a flag
/// gave on the command line; else throws `specsample::error` naming the flag: "--prompt: not UTF-8
/// text: byte 0xFF at byte offset 2 begins no valid character (is the terminal set to another
/// encoding?)", "--prompt is empty: a prompt needs at least one character". The tools check a
/// prompt given as an argument as they check one read from a file, before they load a model.
[[nodiscard]] inline std::string_view check_prompt_argument(std::string_view text, std::string_view flag) {
  if (text.empty()) throw error(fmt::format("{} is empty: a prompt needs at least one character", flag));
  if (const std::size_t i = detail::first_invalid_utf8(text); i < text.size()) {
    throw error(fmt::format("{}: not UTF-8 text: byte 0x{:02X} at byte offset {} begins no valid character (is the "
                            "terminal set to another encoding?)",
                            flag, static_cast<unsigned char>(text[i]), i));
  }
  return text;
}

/// Reads the prompts of `path` (LF, CRLF or CR line ends); throws `specsample::error` naming the file
/// (and the line) when it cannot be read, is not UTF-8 text (`check_prompt_text`), an escape is
/// unknown or dangling, or it holds no prompt.
[[nodiscard]] inline std::vector<std::string> read_prompt_list(const std::filesystem::path& path) {
  const std::string data = read_file(path);
  std::vector<std::string> prompts;
  detail::for_each_line(check_prompt_text(data, path.string()), [&](std::size_t number, std::string_view line) {
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
