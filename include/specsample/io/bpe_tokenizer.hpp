#pragma once
/// @file bpe_tokenizer.hpp
/// GPT-2 byte-level BPE tokenizer (OpenAI `encoder.py`): `vocab.json` + `merges.txt`, the GPT-2
/// pre-tokenization regex run with PCRE2 (UTF + UCP), the `bytes_to_unicode` byte table, merges
/// applied lowest rank first. Encode/decode round-trips arbitrary byte strings, including invalid
/// UTF-8. See docs/tokenizer.md.

#include <specsample/concepts.hpp>
#include <specsample/error.hpp>
#include <specsample/io/json.hpp>
#include <specsample/io/mapped_file.hpp>

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <fmt/format.h>
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <bitset>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace specsample {

namespace detail {

using io::detail::excerpt;           // (mapped_file.hpp)
using io::detail::utf8_char_length;  // (mapped_file.hpp)
using io::detail::valid_utf8;        // (mapped_file.hpp)

/// GPT-2's pre-tokenization pattern, as in OpenAI's encoder.py:
///   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
/// with \s spelled out as what it matches in Python's `regex` module, the Unicode White_Space
/// characters: PCRE2's \s also takes U+180E MONGOLIAN VOWEL SEPARATOR (a format character).
inline constexpr std::string_view gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|)"
    R"( ?[^\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\p{L}\p{N}]+|)"
    R"([\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}]+)"
    R"((?![^\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}])|)"
    R"([\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}]+)";

/// Appends the UTF-8 encoding of code point `cp` (< 0x110000) to `out`.
inline void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80U) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800U) {
    out.push_back(static_cast<char>(0xC0U | (cp >> 6U)));
    out.push_back(static_cast<char>(0x80U | (cp & 0x3FU)));
  } else if (cp < 0x10000U) {
    out.push_back(static_cast<char>(0xE0U | (cp >> 12U)));
    out.push_back(static_cast<char>(0x80U | ((cp >> 6U) & 0x3FU)));
    out.push_back(static_cast<char>(0x80U | (cp & 0x3FU)));
  } else {
    out.push_back(static_cast<char>(0xF0U | (cp >> 18U)));
    out.push_back(static_cast<char>(0x80U | ((cp >> 12U) & 0x3FU)));
    out.push_back(static_cast<char>(0x80U | ((cp >> 6U) & 0x3FU)));
    out.push_back(static_cast<char>(0x80U | (cp & 0x3FU)));
  }
}


/// Length of the longest prefix of `s` that does not end inside a UTF-8 character which later
/// bytes could still complete. Invalid bytes count as complete (they can never become valid).
inline std::size_t utf8_complete_prefix(std::string_view s) noexcept {
  const std::size_t n = s.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0U) == 0x80U) continue;  // continuation byte: look further back
    std::size_t need = 0;
    if (c >= 0xC2U && c <= 0xDFU)
      need = 2;
    else if (c >= 0xE0U && c <= 0xEFU)
      need = 3;
    else if (c >= 0xF0U && c <= 0xF4U)
      need = 4;
    if (need == 0 || back >= need) return n;  // ASCII, invalid lead, or complete/overlong run
    if (back >= 2) {                          // the second byte restricts some leads
      const unsigned c1 = static_cast<unsigned char>(s[n - back + 1]);
      if ((c == 0xE0U && c1 < 0xA0U) || (c == 0xEDU && c1 >= 0xA0U) || (c == 0xF0U && c1 < 0x90U) ||
          (c == 0xF4U && c1 >= 0x90U)) {
        return n;  // can never become valid
      }
    }
    return n - back;
  }
  return n;
}

/// GPT-2's `bytes_to_unicode`: byte b is spelled in vocab.json as code point `table[b]`.
inline const std::array<std::uint32_t, 256>& byte_code_points() {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    std::uint32_t extra = 0;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable =
          (b >= 0x21U && b <= 0x7EU) || (b >= 0xA1U && b <= 0xACU) || (b >= 0xAEU && b <= 0xFFU);
      t[b] = printable ? b : 256U + extra++;
    }
    return t;
  }();
  return table;
}

/// Inverse of `byte_code_points`: code point -> byte, -1 where the code point is no byte symbol.
inline const std::array<int, 324>& code_point_bytes() {
  static const std::array<int, 324> table = [] {
    std::array<int, 324> t{};
    t.fill(-1);
    const auto& cps = byte_code_points();
    for (std::size_t b = 0; b < 256; ++b) t[cps[b]] = static_cast<int>(b);
    return t;
  }();
  return table;
}

/// The raw bytes a vocab.json spelling stands for, or nullopt if some character of it is not
/// one of the 256 byte symbols.
inline std::optional<std::string> spelling_to_bytes(std::string_view spelling) {
  std::string out;
  out.reserve(spelling.size());
  const auto& inverse = code_point_bytes();
  std::size_t i = 0;
  while (i < spelling.size()) {
    const std::size_t len = utf8_char_length(spelling, i);
    if (len == 0) return std::nullopt;
    const auto b = [&](std::size_t k) {
      return static_cast<std::uint32_t>(static_cast<unsigned char>(spelling[i + k]));
    };
    std::uint32_t cp = 0;
    if (len == 1)
      cp = b(0);
    else if (len == 2)
      cp = ((b(0) & 0x1FU) << 6U) | (b(1) & 0x3FU);
    else
      return std::nullopt;  // byte symbols are all below U+0800
    if (cp >= inverse.size() || inverse[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(inverse[cp]));
    i += len;
  }
  return out;
}

/// The compiled pre-tokenization pattern, compiled once per process (matching is thread-safe).
inline const pcre2_code* gpt2_regex() {
  struct code_deleter {
    void operator()(pcre2_code* c) const noexcept { pcre2_code_free(c); }
  };
  static const std::unique_ptr<pcre2_code, code_deleter> code = [] {
    int errcode = 0;
    PCRE2_SIZE erroffset = 0;
    pcre2_code* c =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(gpt2_pattern.data()), gpt2_pattern.size(),
                      PCRE2_UTF | PCRE2_UCP, &errcode, &erroffset, nullptr);
    if (c == nullptr) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(errcode, msg.data(), msg.size());
      throw error(
          fmt::format("bpe_tokenizer: PCRE2 cannot compile the GPT-2 pattern at offset {}: {}",
                      erroffset, reinterpret_cast<const char*>(msg.data())));
    }
    (void)pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // optional: the interpreter is the fallback
    return std::unique_ptr<pcre2_code, code_deleter>(c);
  }();
  return code.get();
}

/// Hash for heterogeneous (string_view) lookup in maps keyed by std::string.
struct string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

/// The most tokens a vocab.json may hold: 2^22, sixteen times the largest vocabularies in use
/// (~256 000). Each entry costs ~100 bytes while the file is read, over ten times its bytes in the
/// file: a crafted vocab.json of a gigabyte would otherwise take gigabytes before any id is checked.
inline constexpr std::size_t max_vocab_tokens = std::size_t{1} << 22;

/// SAX handler that reads vocab.json (a flat object `{"spelling": id, ...}`) without building a
/// DOM, rejecting anything else with a message naming the file, and more than `limit` entries as
/// soon as the next one starts.
class vocab_reader : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit vocab_reader(std::string file, std::size_t limit = max_vocab_tokens)
      : file_(std::move(file)), limit_(limit) {}

  std::vector<std::pair<std::string, std::int64_t>> entries;

  bool null() override { return scalar("null"); }
  bool boolean(bool) override { return scalar("a boolean"); }
  bool number_integer(number_integer_t v) override { return integer(v); }
  bool number_unsigned(number_unsigned_t v) override {
    if (depth_ == 0) return scalar("a number");
    if (v > static_cast<number_unsigned_t>(std::numeric_limits<std::int64_t>::max())) out_of_range(std::to_string(v));
    return integer(static_cast<std::int64_t>(v));
  }
  bool number_float(number_float_t, const string_t& s) override {
    // An integer literal past 64 bits comes here too (the parser holds it as a float): out of
    // range, like one past 2^63, not "not an integer".
    if (depth_ != 0 && !s.empty() && s.find_first_of(".eE") == string_t::npos) out_of_range(s);
    return scalar(s);
  }
  bool string(string_t&) override { return scalar("a string"); }
  bool binary(binary_t&) override { return scalar("binary data"); }
  bool start_object(std::size_t) override {
    if (depth_ == 0) {
      depth_ = 1;
      return true;
    }
    return scalar("an object");
  }
  bool key(string_t& k) override {
    if (entries.size() == limit_) {
      throw error(fmt::format("{}: more than {} tokens; a vocab this large is refused (max_vocab_tokens)", file_,
                              limit_));
    }
    if (!seen_.emplace(k, entries.size()).second) {
      throw error(fmt::format("{}: token \"{}\" appears twice", file_, excerpt(k)));
    }
    key_ = k;
    return true;
  }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return scalar("an array"); }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string& last_token, const nlohmann::detail::exception& ex) override {
    throw error(fmt::format("{}: not valid JSON: {}", file_, io::detail::parse_error_message(ex, last_token)));
  }

 private:
  // An integer id outside int64 (as the file spells it).
  [[noreturn]] void out_of_range(const std::string& id) const {
    throw error(fmt::format("{}: id {} of token \"{}\" is out of range: ids must be contiguous 0..n-1", file_,
                            excerpt(id), excerpt(key_)));
  }
  bool scalar(const std::string& what) {
    if (depth_ == 0) {
      throw error(fmt::format("{}: expected a JSON object mapping token strings to ids, got {}",
                              file_, excerpt(what)));
    }
    throw error(
        fmt::format("{}: id of token \"{}\" is {}, expected an integer", file_, excerpt(key_),
                    excerpt(what)));
  }
  bool integer(std::int64_t v) {
    if (depth_ == 0) return scalar("a number");
    entries.emplace_back(key_, v);
    return true;
  }

  std::string file_;
  std::size_t limit_;
  std::string key_;
  int depth_ = 0;
  std::unordered_map<std::string, std::size_t, string_hash, std::equal_to<>> seen_;
};

}  // namespace detail

/// A GPT-2 style byte-level BPE tokenizer loaded from `vocab.json` + `merges.txt`.
///
/// Special tokens are the vocab entries that are neither one of the 256 byte symbols nor the
/// result of a merge (for GPT-2 and the bundled Shakespeare models: just `<|endoftext|>`).
/// `encode` splits the text on their literal spelling first. All member functions are const and
/// thread-safe, so one instance serves every thread; a copy duplicates the tables (the GPT-2
/// tokenizer's: ~9 MB), so pass it by reference. A moved-from tokenizer is valid but
/// unspecified, as a moved-from standard container: assign to it or destroy it.
class bpe_tokenizer {
 public:
  /// Loads `dir/vocab.json` and `dir/merges.txt`.
  /// @throws error naming the directory when it is none, else the file (and line) when a file is
  /// missing or malformed.
  [[nodiscard]] static bpe_tokenizer load(const std::filesystem::path& dir) {
    io::require_directory(dir, "a tokenizer directory (vocab.json, merges.txt)");
    return load(dir / "vocab.json", dir / "merges.txt");
  }

  /// Loads a vocab.json / merges.txt pair from explicit paths.
  [[nodiscard]] static bpe_tokenizer load(const std::filesystem::path& vocab_json,
                                          const std::filesystem::path& merges_txt) {
    bpe_tokenizer t;
    t.load_vocab(vocab_json);
    t.load_merges(merges_txt);
    t.find_special_tokens(vocab_json, merges_txt);
    return t;
  }

  /// Number of tokens (ids are `[0, vocab_size())`).
  [[nodiscard]] std::size_t vocab_size() const noexcept { return spellings_.size(); }

  /// The most bytes one token stands for: a text of n bytes encodes to at least
  /// ceil(n / max_token_bytes()) tokens (a bound to refuse a prompt too long for a context before
  /// encoding it).
  [[nodiscard]] std::size_t max_token_bytes() const noexcept { return max_token_bytes_; }

  /// Number of merges read from merges.txt.
  [[nodiscard]] std::size_t merge_count() const noexcept { return merge_list_.size(); }

  /// Encodes text (any bytes; invalid UTF-8 is encoded byte-exactly), recognising special tokens.
  [[nodiscard]] std::vector<token> encode(std::string_view text) const {
    std::vector<token> out;
    out.reserve(text.size() / 3 + 1);
    encode_state st;
    std::size_t pos = 0;
    while (pos < text.size()) {
      const auto [at, best] = next_special(text, pos);
      if (at == std::string_view::npos) {
        encode_plain(text.substr(pos), out, st);
        break;
      }
      encode_plain(text.substr(pos, at - pos), out, st);
      out.push_back(specials_[best].second);
      pos = at + specials_[best].first.size();
    }
    return out;
  }

  /// Encodes text treating special-token spellings as ordinary text.
  [[nodiscard]] std::vector<token> encode_ordinary(std::string_view text) const {
    std::vector<token> out;
    out.reserve(text.size() / 3 + 1);
    encode_state st;
    encode_plain(text, out, st);
    return out;
  }

  /// The exact bytes of the tokens `ids`, concatenated.
  /// @throws error naming the id and the vocab size when an id is out of range.
  [[nodiscard]] std::string decode(std::span<const token> ids) const {
    std::string out;
    decode_append(ids, out);
    return out;
  }

  /// Appends the bytes of `ids` to `out` (see decode). On an exception (an id out of range) `out`
  /// is as it was.
  void decode_append(std::span<const token> ids, std::string& out) const {
    const std::size_t size = out.size();
    try {
      for (const token id : ids) out += bytes_[checked(id)];
    } catch (...) {
      out.resize(size);
      throw;
    }
  }

  /// The raw bytes of token `id` (what decode produces for it).
  [[nodiscard]] std::string id_to_bytes(token id) const { return bytes_[checked(id)]; }

  /// The spelling of token `id` in vocab.json (e.g. "Ġthe").
  [[nodiscard]] const std::string& id_to_token(token id) const { return spellings_[checked(id)]; }

  /// The id of the vocab.json spelling `spelling` (e.g. "Ġthe", "<|endoftext|>"), if any.
  [[nodiscard]] std::optional<token> token_to_id(std::string_view spelling) const {
    const auto it = ids_.find(spelling);
    if (it == ids_.end()) return std::nullopt;
    return it->second;
  }

  /// The id of the special token spelled `text` (e.g. "<|endoftext|>"), if it is one.
  [[nodiscard]] std::optional<token> special_token(std::string_view text) const {
    for (const auto& [spelling, id] : specials_) {
      if (spelling == text) return id;
    }
    return std::nullopt;
  }

  /// The ids of all special tokens, ascending.
  [[nodiscard]] std::vector<token> special_tokens() const {
    std::vector<token> ids;
    for (const auto& s : specials_) ids.push_back(s.second);
    std::sort(ids.begin(), ids.end());
    return ids;
  }

  /// Whether `id` is a special token.
  [[nodiscard]] bool is_special(token id) const {
    (void)checked(id);
    return std::any_of(specials_.begin(), specials_.end(),
                       [id](const auto& s) { return s.second == id; });
  }

  /// Whether the vocab has an `<|endoftext|>` special token.
  [[nodiscard]] bool has_eos() const noexcept { return eos_.has_value(); }

  /// The id of `<|endoftext|>` (50256 for GPT-2).
  /// @throws error when the vocab has none (check has_eos()).
  [[nodiscard]] token eos() const {
    if (!eos_) throw error("bpe_tokenizer: the vocab has no <|endoftext|> special token");
    return *eos_;
  }

  /// Identical vocab (same spelling for every id) and identical merges in the same order, hence
  /// identical special tokens and identical encode/decode.
  friend bool operator==(const bpe_tokenizer& a, const bpe_tokenizer& b) {
    return a.spellings_ == b.spellings_ && a.merge_list_ == b.merge_list_;
  }

 private:
  struct merge_info {
    std::int32_t rank;
    token result;
  };

  /// The earliest special token in `text` at or after `from`, the longest of those that start
  /// there: {its position, its index in specials_}, or {npos, 0}. One pass over the text: only
  /// where a special token's first byte occurs are the spellings (in byte order, special_order_)
  /// narrowed byte by byte (two binary searches each) to those the text goes on with: the text's
  /// length times at most the longest spelling times log2 of their number, not times their
  /// number. Where they all start with one byte (GPT-2's '<'), memchr skips to it.
  [[nodiscard]] std::pair<std::size_t, std::size_t> next_special(std::string_view text, std::size_t from) const {
    const std::uint32_t* order = special_order_.data();
    if (special_order_.empty()) return {std::string_view::npos, 0};
    for (std::size_t i = from; i < text.size(); ++i) {
      if (special_single_first_ >= 0) {
        const void* hit = std::memchr(text.data() + i, special_single_first_, text.size() - i);
        if (hit == nullptr) break;
        i = static_cast<std::size_t>(static_cast<const char*>(hit) - text.data());
      } else if (!special_first_[static_cast<unsigned char>(text[i])]) {
        continue;
      }
      std::size_t lo = 0, hi = special_order_.size(), found = specials_.size();
      for (std::size_t d = 0; lo < hi; ++d) {
        // [lo, hi): the spellings that begin with text[i, i + d), a complete one (at most one:
        // spellings are distinct) sorting first.
        if (specials_[order[lo]].first.size() == d) found = order[lo++];
        if (i + d == text.size() || lo == hi) break;
        const auto c = static_cast<unsigned char>(text[i + d]);
        const auto byte = [&](std::uint32_t k) { return static_cast<unsigned char>(specials_[k].first[d]); };
        lo = static_cast<std::size_t>(std::partition_point(order + lo, order + hi, [&](std::uint32_t k) { return byte(k) < c; }) - order);
        hi = static_cast<std::size_t>(std::partition_point(order + lo, order + hi, [&](std::uint32_t k) { return byte(k) <= c; }) - order);
      }
      if (found != specials_.size()) return {i, found};
    }
    return {std::string_view::npos, 0};
  }

  /// Scratch buffers reused across the words of one encode call, plus a per-call word cache.
  struct encode_state {
    std::vector<token> ids;
    std::vector<std::size_t> prev;
    std::vector<std::size_t> next;
    std::vector<std::pair<std::int32_t, std::size_t>> heap;
    std::vector<std::size_t> batch;
    std::unordered_map<std::string_view, std::pair<std::size_t, std::size_t>>
        cache;  // word -> ids in out
    pcre2_match_data* match = nullptr;
    encode_state() = default;
    encode_state(const encode_state&) = delete;
    encode_state& operator=(const encode_state&) = delete;
    ~encode_state() {
      if (match != nullptr) pcre2_match_data_free(match);
    }
  };

  static constexpr std::size_t cache_max_entries = 1U << 15U;
  static constexpr std::size_t cache_max_word = 64;

  bpe_tokenizer() = default;

  [[nodiscard]] std::size_t checked(token id) const {
    if (!in_vocabulary(id, spellings_.size())) {
      throw error(fmt::format("bpe_tokenizer: token id {} is out of range for vocab size {}", id,
                              spellings_.size()));
    }
    return static_cast<std::size_t>(id);
  }

  [[nodiscard]] const merge_info* find_merge(token a, token b) const {
    const auto key = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32U) |
                     static_cast<std::uint32_t>(b);
    const auto it = merges_.find(key);
    return it == merges_.end() ? nullptr : &it->second;
  }

  /// Encodes text without special tokens: BPEs each of its pre-tokens.
  void encode_plain(std::string_view text, std::vector<token>& out, encode_state& st) const {
    for_each_pretoken(text, st, [&](std::string_view word) { bpe_word(word, out, st); });
  }

  /// Calls `f` on each pre-token of `text`, in order: the text is split into valid-UTF-8 runs,
  /// pre-tokenized by the GPT-2 regex (every character belongs to some match), and runs of
  /// invalid bytes (one pre-token each).
  template <class F>
  void for_each_pretoken(std::string_view text, encode_state& st, F&& f) const {
    std::size_t i = 0;
    while (i < text.size()) {
      const std::size_t start = i;
      std::size_t len = 0;
      while (i < text.size() && (len = detail::utf8_char_length(text, i)) != 0) i += len;
      if (i > start) regex_pretokens(text.substr(start, i - start), st, f);
      const std::size_t bad = i;
      while (i < text.size() && detail::utf8_char_length(text, i) == 0) ++i;
      if (i > bad) f(text.substr(bad, i - bad));
    }
  }

  /// Runs the GPT-2 pattern over valid UTF-8 `text`, calling `f` on each match.
  template <class F>
  void regex_pretokens(std::string_view text, encode_state& st, F& f) const {
    const pcre2_code* code = detail::gpt2_regex();
    if (st.match == nullptr) {
      st.match = pcre2_match_data_create_from_pattern(code, nullptr);
      if (st.match == nullptr) throw error("bpe_tokenizer: out of memory for PCRE2 match data");
    }
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    std::size_t pos = 0;
    while (pos < text.size()) {
      const int rc =
          pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, st.match, nullptr);
      if (rc < 0) {
        if (rc == PCRE2_ERROR_NOMATCH) {  // unreachable for valid UTF-8; keep the bytes anyway
          f(text.substr(pos));
          return;
        }
        std::array<PCRE2_UCHAR, 256> msg{};
        pcre2_get_error_message(rc, msg.data(), msg.size());
        throw error(fmt::format("bpe_tokenizer: PCRE2 match failed at byte {}: {}", pos,
                                reinterpret_cast<const char*>(msg.data())));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.match);
      std::size_t begin = ov[0];
      std::size_t end = ov[1];
      if (begin > pos) f(text.substr(pos, begin - pos));                      // unreachable too
      if (end <= begin) end = begin + detail::utf8_char_length(text, begin);  // no empty matches
      f(text.substr(begin, end - begin));
      pos = end;
    }
  }

  /// Byte-pair-encodes one pre-token, exactly as encoder.py's `bpe`: repeatedly merge every
  /// occurrence (left to right) of the lowest-ranked adjacent pair. A min-heap keyed by
  /// (rank, position) makes it O(n log n); one rank is applied as a batch, so even a merges file
  /// whose merge creates a pair of lower rank behaves exactly like the reference.
  void bpe_word(std::string_view word, std::vector<token>& out, encode_state& st) const {
    const std::size_t n = word.size();
    if (n == 0) return;
    if (n == 1) {
      out.push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
      return;
    }
    const bool cacheable = n <= cache_max_word;
    if (cacheable) {
      if (const auto it = st.cache.find(word); it != st.cache.end()) {
        const auto [first, count] = it->second;
        for (std::size_t k = 0; k < count; ++k) out.push_back(out[first + k]);
        return;
      }
    }
    constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
    auto& ids = st.ids;
    auto& prev = st.prev;
    auto& next = st.next;
    auto& heap = st.heap;
    ids.resize(n);
    prev.resize(n);
    next.resize(n);
    heap.clear();
    for (std::size_t k = 0; k < n; ++k) {
      ids[k] = byte_ids_[static_cast<unsigned char>(word[k])];
      prev[k] = k == 0 ? none : k - 1;
      next[k] = k + 1 == n ? none : k + 1;
    }
    const auto greater = std::greater<>{};
    const auto push_pair = [&](std::size_t left) {
      if (left == none || next[left] == none) return;
      if (const merge_info* m = find_merge(ids[left], ids[next[left]])) {
        heap.emplace_back(m->rank, left);
        std::push_heap(heap.begin(), heap.end(), greater);
      }
    };
    for (std::size_t k = 0; k + 1 < n; ++k) push_pair(k);
    while (!heap.empty()) {
      const std::int32_t rank = heap.front().first;
      st.batch.clear();
      while (!heap.empty() && heap.front().first == rank) {  // popped in position order
        st.batch.push_back(heap.front().second);
        std::pop_heap(heap.begin(), heap.end(), greater);
        heap.pop_back();
      }
      for (const std::size_t left : st.batch) {
        const std::size_t right = next[left];
        if (ids[left] < 0 || right == none) continue;  // merged away, or now last
        const merge_info* m = find_merge(ids[left], ids[right]);
        if (m == nullptr || m->rank != rank) continue;  // stale entry
        ids[left] = m->result;
        ids[right] = -1;
        next[left] = next[right];
        if (next[right] != none) prev[next[right]] = left;
        push_pair(prev[left]);
        push_pair(left);
      }
    }
    const std::size_t first = out.size();
    for (std::size_t k = 0; k != none; k = next[k]) out.push_back(ids[k]);
    if (cacheable && st.cache.size() < cache_max_entries) {
      st.cache.emplace(word, std::pair{first, out.size() - first});
    }
  }

  void load_vocab(const std::filesystem::path& path) {
    const std::string file = path.string();
    const std::string data = io::read_file(path);
    io::detail::check_no_nul(data, file);
    detail::vocab_reader reader(file);
    nlohmann::json::sax_parse(data, &reader);
    auto& entries = reader.entries;
    const std::size_t n = entries.size();
    if (n == 0) throw error(fmt::format("{}: the vocab is empty", file));
    if (n > static_cast<std::size_t>(std::numeric_limits<token>::max())) {
      throw error(fmt::format("{}: {} tokens is too many", file, n));
    }
    spellings_.assign(n, std::string{});
    std::vector<bool> seen(n, false);
    std::size_t outside = n;  // the first entry whose id is outside 0..n-1 (n: none)
    for (std::size_t i = 0; i < n; ++i) {
      auto& [spelling, id] = entries[i];
      if (id < 0 || static_cast<std::uint64_t>(id) >= n) {
        if (outside == n) outside = i;
        continue;  // (named below with the id it leaves out)
      }
      const auto k = static_cast<std::size_t>(id);
      if (seen[k]) {
        throw error(fmt::format("{}: duplicate id {}: used by both \"{}\" and \"{}\"", file, id,
                                detail::excerpt(spellings_[k]), detail::excerpt(spelling)));
      }
      if (spelling.empty())
        throw error(fmt::format("{}: id {} has an empty token string", file, id));
      seen[k] = true;
      spellings_[k] = std::move(spelling);
    }
    if (outside != n) {  // n ids, none twice, one outside 0..n-1: one inside is missing
      const auto missing = static_cast<std::size_t>(std::find(seen.begin(), seen.end(), false) - seen.begin());
      throw error(fmt::format("{}: ids must be contiguous 0..n-1 for n = {} tokens, but no token has id {} and token "
                              "\"{}\" has id {}",
                              file, n, missing, detail::excerpt(entries[outside].first), entries[outside].second));
    }
    ids_.reserve(n);
    bytes_.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
      ids_.emplace(spellings_[k], static_cast<token>(k));
      auto raw = detail::spelling_to_bytes(spellings_[k]);
      bytes_[k] = raw ? std::move(*raw) : spellings_[k];  // not byte symbols: the literal text
      max_token_bytes_ = std::max(max_token_bytes_, bytes_[k].size());
    }
    const auto& cps = detail::byte_code_points();
    for (std::size_t b = 0; b < 256; ++b) {
      std::string symbol;
      detail::append_utf8(symbol, cps[b]);
      const auto id = token_to_id(symbol);
      if (!id) {
        throw error(
            fmt::format("{}: missing the byte symbol \"{}\" for byte 0x{:02X}: a byte-level "
                        "BPE vocab must contain all 256 byte symbols",
                        file, symbol, b));
      }
      byte_ids_[b] = *id;
    }
  }

  void load_merges(const std::filesystem::path& path) {
    const std::string file = path.string();
    const std::string data = io::read_file(path);
    // (a hint: at most a merge a line, and as many as the vocab's tokens; blank lines take none)
    merges_.reserve(std::min(static_cast<std::size_t>(std::count(data.begin(), data.end(), '\n')) + 1, spellings_.size()));
    io::detail::for_each_line(data, [&](std::size_t line_no, std::string_view line) {
      if (line_no == 1 && line.starts_with("\xEF\xBB\xBF")) line.remove_prefix(3);  // a UTF-8 BOM, as in vocab.json
      if (line_no == 1 && line.starts_with("#version")) return;
      std::vector<std::string_view> fields;
      std::size_t k = 0;
      while (k < line.size()) {
        while (k < line.size() && (line[k] == ' ' || line[k] == '\t')) ++k;
        const std::size_t start = k;
        while (k < line.size() && line[k] != ' ' && line[k] != '\t') ++k;
        if (k > start) fields.push_back(line.substr(start, k - start));
      }
      if (fields.empty()) return;  // an empty line, or one of blanks only (no merge in encoder.py's split() either)
      if (fields.size() != 2) {
        throw error(
            fmt::format("{}:{}: expected two symbols separated by a space, found {} in \"{}\"",
                        file, line_no, fields.size(), detail::excerpt(line)));
      }
      const auto a = token_to_id(fields[0]);
      const auto b = token_to_id(fields[1]);
      for (std::size_t f = 0; f < 2; ++f) {
        if (!(f == 0 ? a : b)) {
          throw error(fmt::format("{}:{}: merge symbol \"{}\" is not in the vocab", file, line_no,
                                  detail::excerpt(fields[f])));
        }
      }
      std::string joined(fields[0]);
      joined += fields[1];
      const auto result = token_to_id(joined);
      if (!result) {
        throw error(
            fmt::format("{}:{}: merge result \"{}\" is not in the vocab", file, line_no,
                        detail::excerpt(joined)));
      }
      const auto key = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(*a)) << 32U) |
                       static_cast<std::uint32_t>(*b);
      const auto rank = static_cast<std::int32_t>(merge_list_.size());
      if (!merges_.emplace(key, merge_info{rank, *result}).second) {
        throw error(
            fmt::format("{}:{}: duplicate merge \"{} {}\"", file, line_no, detail::excerpt(fields[0]),
                        detail::excerpt(fields[1])));
      }
      merge_list_.emplace_back(*a, *b);
    });
  }

  /// Special tokens: the entries that are neither byte symbols nor merge results. An entry whose
  /// bytes are one pre-token (text `encode` hands to the BPE whole), or not valid UTF-8 (a piece
  /// of a character: only merges make those), is an ordinary token that lost its merge —
  /// merges.txt cut short, or written for another vocab — and an error: as a special token it
  /// would be matched literally, and the text would encode differently (and slowly). Two special
  /// tokens of the same text (one spelled in byte symbols, "<|xĠ|>", one literally, "<|x |>") are
  /// an error of vocab.json: `encode` could produce only one of them.
  void find_special_tokens(const std::filesystem::path& vocab_json, const std::filesystem::path& merges_txt) {
    std::vector<bool> ordinary(spellings_.size(), false);
    for (const token b : byte_ids_) ordinary[static_cast<std::size_t>(b)] = true;
    for (const auto& [key, m] : merges_) ordinary[static_cast<std::size_t>(m.result)] = true;
    std::vector<std::size_t> orphans;
    encode_state st;
    for (std::size_t k = 0; k < spellings_.size(); ++k) {
      if (ordinary[k]) continue;
      std::size_t pieces = 0;
      for_each_pretoken(bytes_[k], st, [&](std::string_view) { ++pieces; });
      if (pieces == 1 || !detail::valid_utf8(bytes_[k])) {
        orphans.push_back(k);
      } else {
        specials_.emplace_back(bytes_[k], static_cast<token>(k));
      }
    }
    if (!orphans.empty()) {
      throw error(fmt::format(
          "{}: {} vocab token{} produced by no merge (first: id {} \"{}\"); only special tokens "
          "such as <|endoftext|> (UTF-8 text of more than one pre-token) may be; is merges.txt truncated or "
          "written for another vocab ({} merges for {} tokens)?",
          merges_txt.string(), orphans.size(), orphans.size() == 1 ? " is" : "s are", orphans[0],
          detail::excerpt(spellings_[orphans[0]]), merge_list_.size(), spellings_.size()));
    }
    std::unordered_map<std::string_view, token> by_text;  // (specials_ is in ascending id order)
    by_text.reserve(specials_.size());
    for (const auto& [text, id] : specials_) {
      const auto [it, fresh] = by_text.emplace(text, id);
      if (!fresh) {
        // (the spellings quoted shorter: three quotes of a wrong vocab's megabyte keys stay readable)
        const auto spelling = [&](token t) { return detail::excerpt(spellings_[static_cast<std::size_t>(t)], 40); };
        throw error(fmt::format("{}: special tokens {} \"{}\" and {} \"{}\" both stand for the text \"{}\": encode "
                                "could never produce one of them",
                                vocab_json.string(), it->second, spelling(it->second), id, spelling(id),
                                detail::excerpt(text)));
      }
    }
    special_order_.resize(specials_.size());
    for (std::size_t s = 0; s < specials_.size(); ++s) {
      special_order_[s] = static_cast<std::uint32_t>(s);
      special_first_.set(static_cast<unsigned char>(specials_[s].first[0]));
    }
    std::sort(special_order_.begin(), special_order_.end(),
              [&](std::uint32_t a, std::uint32_t b) { return specials_[a].first < specials_[b].first; });
    if (special_first_.count() == 1) special_single_first_ = static_cast<unsigned char>(specials_[0].first[0]);
    eos_ = special_token("<|endoftext|>");
  }

  std::vector<std::string> spellings_;  // id -> vocab.json spelling
  std::vector<std::string> bytes_;      // id -> raw bytes
  std::unordered_map<std::string, token, detail::string_hash, std::equal_to<>> ids_;
  std::array<token, 256> byte_ids_{};
  std::unordered_map<std::uint64_t, merge_info> merges_;  // (left id << 32 | right id) -> merge
  std::vector<std::pair<token, token>> merge_list_;       // rank -> (left id, right id)
  std::vector<std::pair<std::string, token>> specials_;   // literal text -> id, ascending ids
  std::vector<std::uint32_t> special_order_;             // indices of specials_ by text, byte order
  std::bitset<256> special_first_;                       // the bytes a special token's text starts with
  int special_single_first_ = -1;                        // that byte when it is one, else -1
  std::size_t max_token_bytes_ = 1;                      // the longest token's bytes
  std::optional<token> eos_;
};

/// Whether draft and target tokenizers are interchangeable: same vocab size, same spelling for
/// every id, same merges in the same order (hence the same special-token ids).
[[nodiscard]] inline bool same_vocabulary(const bpe_tokenizer& a, const bpe_tokenizer& b) {
  return a == b;
}

/// A sentence describing the first difference between two tokenizers (for error messages), or
/// nullopt when `same_vocabulary(a, b)`.
[[nodiscard]] inline std::optional<std::string> vocabulary_difference(const bpe_tokenizer& a,
                                                                      const bpe_tokenizer& b) {
  if (a.vocab_size() != b.vocab_size()) {
    return fmt::format("vocab sizes differ: {} vs {}", a.vocab_size(), b.vocab_size());
  }
  for (std::size_t k = 0; k < a.vocab_size(); ++k) {
    const auto id = static_cast<token>(k);
    if (a.id_to_token(id) != b.id_to_token(id)) {
      return fmt::format("token {} differs: \"{}\" vs \"{}\"", id, detail::excerpt(a.id_to_token(id)),
                         detail::excerpt(b.id_to_token(id)));
    }
  }
  if (a.merge_count() != b.merge_count()) {
    return fmt::format("merge counts differ: {} vs {}", a.merge_count(), b.merge_count());
  }
  if (!(a == b)) return std::string("the merges differ (same tokens, different merge order)");
  return std::nullopt;
}

/// Throws `specsample::error` unless a draft's tokenizer is the target's (`same_vocabulary`),
/// naming both (`draft_name`, `target_name`: their checkpoints, say) and the first difference:
/// the check a program runs before it drafts with one model for another.
inline void check_same_vocabulary(const bpe_tokenizer& draft, const bpe_tokenizer& target, std::string_view draft_name,
                                  std::string_view target_name) {
  if (const auto diff = vocabulary_difference(draft, target)) {
    throw error(fmt::format("the draft ({}) and target ({}) tokenizers differ: {}; speculative sampling needs "
                            "identical vocabularies",
                            draft_name, target_name, *diff));
  }
}

/// Throws `specsample::error` unless a model of `model_vocab` logits has the vocabulary of its
/// tokenizer `tok`, naming `name` (its checkpoint, say) and both sizes.
inline void check_model_vocabulary(std::size_t model_vocab, const bpe_tokenizer& tok, std::string_view name) {
  if (model_vocab != tok.vocab_size()) {
    throw error(fmt::format("{}: the model has {} tokens but its tokenizer has {}", name, model_vocab, tok.vocab_size()));
  }
}

/// Incremental detokenizer: feed tokens one at a time, get back the text that is complete so far.
///
/// Output never ends inside a UTF-8 character that later bytes could still complete; such a
/// trailing prefix is held back until the next token. Bytes that can never become valid UTF-8
/// are passed through as-is, so the concatenation of all `feed` results and `flush()` is exactly
/// `decode` of all tokens. The tokenizer must outlive the decoder.
class stream_decoder {
 public:
  explicit stream_decoder(const bpe_tokenizer& tokenizer) noexcept : tokenizer_(&tokenizer) {}
  /// A temporary tokenizer would not outlive the decoder.
  explicit stream_decoder(const bpe_tokenizer&&) = delete;

  /// Adds one token; returns the newly completed text (possibly empty).
  /// @throws error when `id` is out of range (the decoder is then unchanged).
  [[nodiscard]] std::string feed(token id) { return feed(std::span<const token>(&id, 1)); }

  /// Adds several tokens; returns the newly completed text (possibly empty).
  [[nodiscard]] std::string feed(std::span<const token> ids) {
    std::string added = tokenizer_->decode(ids);  // throws before touching the state
    pending_ += added;
    const std::size_t n = detail::utf8_complete_prefix(pending_);
    std::string out = pending_.substr(0, n);
    pending_.erase(0, n);
    return out;
  }

  /// Ends the stream: returns the held-back bytes (an incomplete UTF-8 character, raw, no U+FFFD)
  /// and resets the decoder.
  [[nodiscard]] std::string flush() { return std::exchange(pending_, std::string{}); }

  /// Number of bytes currently held back (at most 3).
  [[nodiscard]] std::size_t pending() const noexcept { return pending_.size(); }

 private:
  const bpe_tokenizer* tokenizer_;
  std::string pending_;
};

}  // namespace specsample
