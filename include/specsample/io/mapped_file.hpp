#pragma once
/// @file mapped_file.hpp
/// A read-only POSIX memory map of a whole file (RAII, move-only), `read_file` and
/// `read_standard_input`: the library opens every file it reads through `detail::open_regular_file`
/// (standard input, open already, is read as it is).

#include <specsample/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace specsample::io {

/// Throws `specsample::error` unless `dir` is a directory (a symbolic link to one included):
/// "<dir>: no such directory", "<dir>: a file, not a directory" (with the directory holding that
/// file) or "<dir>: not a directory", then what was expected there (`expected`, e.g. "a Hugging
/// Face GPT-2 directory"), before a file in it is looked for.
inline void require_directory(const std::filesystem::path& dir, std::string_view expected) {
  struct ::stat st {};
  const bool found = ::stat(dir.c_str(), &st) == 0;
  const int e = found ? 0 : errno;
  const std::string shown = dir.empty() ? std::string("(an empty path)") : dir.string();
  if (!found && e != ENOTDIR) {
    throw error(fmt::format("{}: {}; expected {}", shown,
                            e == ENOENT ? std::string("no such directory") : std::string(std::strerror(e)), expected));
  }
  if (found && S_ISREG(st.st_mode)) {
    // A file of the directory given instead of the directory (model.safetensors, vocab.json):
    // name the directory that holds it, which is most likely what was meant.
    // (For a symbolic link, the directory of the file it leads to.)
    std::error_code ec;
    const std::filesystem::path target = std::filesystem::is_symlink(dir, ec) ? std::filesystem::canonical(dir, ec) : dir;
    const std::filesystem::path parent = (ec ? dir : target).parent_path();
    throw error(fmt::format("{}: a file, not a directory; expected {} (the file's own directory is {})", shown,
                            expected, parent.empty() ? std::string(".") : parent.string()));
  }
  if (!found || !S_ISDIR(st.st_mode)) throw error(fmt::format("{}: not a directory; expected {}", shown, expected));
}

namespace detail {

/// An open file descriptor, closed at scope exit.
struct file_descriptor {
  int fd = -1;
  file_descriptor() = default;
  file_descriptor(const file_descriptor&) = delete;
  file_descriptor& operator=(const file_descriptor&) = delete;
  ~file_descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

/// Opens `path` read-only into `f` and returns its size. Throws `specsample::error` naming the file
/// if it does not exist, cannot be opened or is not a regular file (a directory, a FIFO, a device:
/// the open does not block on them).
inline std::size_t open_regular_file(const std::filesystem::path& path, file_descriptor& f) {
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f.fd < 0) {
    const int e = errno;
    if (e == ENOENT) throw error(fmt::format("{}: file not found", path.string()));
    throw error(fmt::format("{}: cannot open file: {}", path.string(), std::strerror(e)));
  }
  struct ::stat st {};
  if (::fstat(f.fd, &st) != 0) {
    const int e = errno;  // (before path.string() may allocate)
    throw error(fmt::format("{}: cannot stat file: {}", path.string(), std::strerror(e)));
  }
  if (!S_ISREG(st.st_mode)) {
    throw error(fmt::format("{}: {}", path.string(),
                            S_ISDIR(st.st_mode) ? "is a directory, expected a file"
                                                : "not a regular file"));
  }
  return static_cast<std::size_t>(st.st_size);
}

}  // namespace detail

/// A whole file mapped read-only into memory. The bytes stay valid (at the same address) for the
/// lifetime of the object, including across moves. An empty file maps to an empty span.
class mapped_file {
 public:
  mapped_file() = default;

  /// Maps `path` read-only. Throws `specsample::error` naming the file if it does not exist,
  /// cannot be opened, is not a regular file (`detail::open_regular_file`) or cannot be mapped.
  [[nodiscard]] static mapped_file open(const std::filesystem::path& path) {
    mapped_file f;
    f.path_ = path;
    detail::file_descriptor fd;
    const std::size_t size = detail::open_regular_file(path, fd);
    if (size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        throw error(fmt::format("{}: cannot map file ({} bytes): {}", path.string(), size, std::strerror(e)));
      }
      f.data_ = static_cast<const std::byte*>(p);
      f.size_ = size;
    }
    return f;  // the mapping keeps its own reference to the file
  }

  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  mapped_file(mapped_file&& o) noexcept
      : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  mapped_file& operator=(mapped_file&& o) noexcept {
    if (this != &o) {
      unmap();
      path_ = std::move(o.path_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~mapped_file() { unmap(); }

  /// The mapped bytes.
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  /// The file size in bytes.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// The path the file was opened from.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  void unmap() noexcept {
    if (data_ != nullptr) {
      ::munmap(const_cast<std::byte*>(data_), size_);
      data_ = nullptr;
      size_ = 0;
    }
  }

  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// The largest file `read_file` reads (1 GiB): the text files it serves (config.json, vocab.json,
/// merges.txt, prompt lists) are megabytes at most; a larger one is a wrong path or a broken file,
/// and reading it would only exhaust memory.
inline constexpr std::size_t max_text_file_bytes = std::size_t{1} << 30;

namespace detail {

/// Everything left to read from the open descriptor `fd` (to its end: files under /proc report a
/// size of 0), `size` bytes expected; throws `specsample::error` naming `name` on a read error or
/// past `limit` bytes (`max_text_file_bytes` by default, below SIZE_MAX; a stream of no known
/// size, standard input say, is refused once limit + 1 bytes are read, its buffer never larger).
[[nodiscard]] inline std::string read_to_end(int fd, std::size_t size, const std::string& name,
                                             std::size_t limit = max_text_file_bytes) {
  const auto too_large = [&](std::size_t bytes) {
    return error(fmt::format("{}: {} bytes or more, larger than any text file this library reads (at most {})", name,
                             bytes, limit));
  };
  if (size > limit) throw too_large(size);
  // The buffer holds at most one byte past the limit: filled, that byte is refused.
  const std::size_t most = limit < std::numeric_limits<std::size_t>::max() ? limit + 1 : limit;
  std::string data(std::min(std::max<std::size_t>(size + 1, 4096), most), '\0');
  std::size_t n = 0;
  for (;;) {
    if (n == data.size()) {  // (a file that grew, or reports no size: a pipe, /proc)
      if (n > limit) throw too_large(n);
      data.resize(std::min(data.size() <= most / 2 ? 2 * data.size() : most, most));
    }
    const ::ssize_t got = ::read(fd, data.data() + n, data.size() - n);
    if (got == 0) break;
    if (got < 0) {
      const int e = errno;
      if (e == EINTR) continue;
      throw error(fmt::format("{}: read error: {}", name, std::strerror(e)));
    }
    n += static_cast<std::size_t>(got);
  }
  data.resize(n);
  return data;
}

}  // namespace detail

/// The whole of the regular file `path` as a string (read to its end: files under /proc report a
/// size of 0); throws `specsample::error` naming the file as `detail::open_regular_file` does, on
/// a read error, or for a file of more than `max_text_file_bytes`.
[[nodiscard]] inline std::string read_file(const std::filesystem::path& path) {
  detail::file_descriptor fd;
  const std::size_t size = detail::open_regular_file(path, fd);
  return detail::read_to_end(fd.fd, size, path.string());
}

/// The whole of standard input, read to its end (what a command line's "-" for a file names:
/// specsample-generate's `--prompt-file -`); throws `specsample::error` naming "standard input" on
/// a read error or past `max_text_file_bytes` (`… < /dev/zero` ends there, not in exhausted memory).
[[nodiscard]] inline std::string read_standard_input() { return detail::read_to_end(STDIN_FILENO, 0, "standard input"); }

namespace detail {

/// Length of the valid UTF-8 character starting at `s[i]` (RFC 3629: no overlongs, surrogates
/// or code points above U+10FFFF), or 0 if the bytes there are not a complete valid character.
inline std::size_t utf8_char_length(std::string_view s, std::size_t i) noexcept {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned c = b(i);
  const std::size_t left = s.size() - i;
  const auto cont = [&](std::size_t k) { return (b(k) & 0xC0U) == 0x80U; };
  if (c < 0x80U) return 1;
  if (c >= 0xC2U && c <= 0xDFU) return left >= 2 && cont(i + 1) ? 2 : 0;
  if (c >= 0xE0U && c <= 0xEFU) {
    if (left < 3 || !cont(i + 1) || !cont(i + 2)) return 0;
    if (c == 0xE0U && b(i + 1) < 0xA0U) return 0;   // overlong
    if (c == 0xEDU && b(i + 1) >= 0xA0U) return 0;  // surrogate
    return 3;
  }
  if (c >= 0xF0U && c <= 0xF4U) {
    if (left < 4 || !cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return 0;
    if (c == 0xF0U && b(i + 1) < 0x90U) return 0;   // overlong
    if (c == 0xF4U && b(i + 1) >= 0x90U) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

/// The byte offset of the first character of `s` that is not valid UTF-8 (see
/// `utf8_char_length`), or s.size() when every one is.
inline std::size_t first_invalid_utf8(std::string_view s) noexcept {
  for (std::size_t i = 0, len = 0; i < s.size(); i += len) {
    if ((len = utf8_char_length(s, i)) == 0) return i;
  }
  return s.size();
}

/// Whether `s` is valid UTF-8 (see `utf8_char_length`).
inline bool valid_utf8(std::string_view s) noexcept { return first_invalid_utf8(s) == s.size(); }

// The character of `text` at `i` as an error message quotes it (control bytes, DEL and bytes that
// are not UTF-8 as \xNN, a backslash as \\), and the number of bytes it takes in `text`.
inline std::pair<std::string, std::size_t> quoted_char(std::string_view text, std::size_t i) {
  const std::size_t len = utf8_char_length(text, i);
  const auto c = static_cast<unsigned char>(text[i]);
  if (len == 0 || c < 0x20U || c == 0x7FU) return {fmt::format("\\x{:02X}", c), 1};
  if (c == '\\') return {"\\\\", 1};
  return {std::string(text.substr(i, len)), len};
}

/// `text` as an error message quotes it: its first characters, at most `max_bytes` of quote (never
/// part of a character), then "..." and the whole length when it is longer; control bytes, DEL and
/// bytes that are not UTF-8 written \xNN and a backslash \\, so the quote is unambiguous UTF-8. A file's
/// wrong line or key can be megabytes long, or binary.
inline std::string excerpt(std::string_view text, std::size_t max_bytes = 80) {
  std::string out;
  std::size_t i = 0;
  while (i < text.size()) {
    auto [piece, len] = quoted_char(text, i);
    if (out.size() + piece.size() > max_bytes) break;
    out += piece;
    i += len;
  }
  if (i < text.size()) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

/// `excerpt` from the other end: the whole length and "..." when `text` is longer than the quote,
/// then its last characters, at most `max_bytes` of quote. For text whose end is what matters, such
/// as the token a parser stopped in: its offending byte is the last.
inline std::string excerpt_tail(std::string_view text, std::size_t max_bytes = 80) {
  // Every byte quotes as at least one byte, so the quote lies within the last max_bytes bytes. Cut
  // three bytes before them: a character cut there quotes its remaining continuation bytes alone,
  // but behind them lie at least max_bytes bytes, so those quotes are never taken.
  const std::size_t start = text.size() > max_bytes + 3 ? text.size() - max_bytes - 3 : 0;
  std::size_t i = start;
  std::vector<std::string> pieces;  // the quotes of the characters from start on, in order
  while (i < text.size()) {
    auto [piece, len] = quoted_char(text, i);
    pieces.push_back(std::move(piece));
    i += len;
  }
  std::size_t first = pieces.size(), bytes = 0;
  while (first > 0 && bytes + pieces[first - 1].size() <= max_bytes) bytes += pieces[--first].size();
  std::string out = start > 0 || first > 0 ? fmt::format("({} bytes) ...", text.size()) : std::string();
  for (std::size_t k = first; k < pieces.size(); ++k) out += pieces[k];
  return out;
}

/// Throws `specsample::error` naming `label` when the JSON `text` holds a NUL byte. JSON allows
/// none (not even inside a string), and nlohmann's parser takes one for the end of its input: it
/// would accept whatever follows it unread.
inline void check_no_nul(std::string_view text, std::string_view label) {
  if (const std::size_t at = text.find('\0'); at != std::string_view::npos) {
    throw error(fmt::format("{}: a NUL byte at offset {}: not JSON text", label, at));
  }
}

/// Calls `f(number, line)` for each line of `text` (numbered from 1; LF, CRLF or a lone CR ends a
/// line, as with Python's universal newlines; the ending not included; a last line without an
/// ending counts too).
template <class F>
void for_each_line(std::string_view text, F&& f) {
  std::size_t number = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t eol = text.find_first_of("\r\n", pos);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view line = text.substr(pos, eol - pos);
    pos = eol + (text.substr(eol).starts_with("\r\n") ? 2 : 1);
    f(++number, line);
  }
}

}  // namespace detail

}  // namespace specsample::io
