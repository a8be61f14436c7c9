#pragma once
/// @file json.hpp
/// Strict JSON parsing for the files the library reads (a safetensors header, config.json).

#include <specsample/error.hpp>
#include <specsample/io/mapped_file.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace specsample::io::detail {

inline constexpr std::size_t max_json_depth = 64;

/// nlohmann's parse error as our messages quote it: its text, in which the token the parser stopped
/// in ("...; last read: '<token>'", then what it expected, if anything) is quoted by its end
/// (`excerpt_tail`): the offending byte is its last, which a long token's head would hide.
inline std::string parse_error_message(const nlohmann::json::exception& ex, const std::string& last_token) {
  const std::string_view message = ex.what();
  constexpr std::string_view marker = "; last read: '";  // (the text before it is nlohmann's own)
  const std::size_t at = message.find(marker);
  const std::size_t token_at = at + marker.size(), token_end = token_at + last_token.size();
  if (at == std::string_view::npos || message.compare(token_at, last_token.size(), last_token) != 0 ||
      token_end >= message.size() || message[token_end] != '\'') {
    return excerpt(message, 240);
  }
  return fmt::format("{}; last read: '{}'{}", excerpt(message.substr(0, at), 240), excerpt_tail(last_token, 80),
                     excerpt(message.substr(token_end + 1), 120));
}

/// SAX handler of `parse_json_strict`: builds the document as nlohmann's own parser does, and
/// refuses a key twice in one object, nesting deeper than `max_json_depth` and more than
/// `max_values` values (every scalar, object and array counts; each checked before it is placed).
/// O(n log n) in an object's n members (a map lookup per key): nlohmann's parser with a
/// callback rescans an object's members each time one of its child objects closes, quadratic in
/// siblings (40 000 `"k":{}` members: 19 s), which a crafted header of 100 MB would turn into a hang.
class strict_json_builder : public nlohmann::json_sax<nlohmann::json> {
 public:
  strict_json_builder(std::string label, std::string what, std::size_t max_values)
      : label_(std::move(label)), what_(std::move(what)), max_values_(max_values) {}
  strict_json_builder(const strict_json_builder&) = delete;  // (open_ points into root)
  strict_json_builder& operator=(const strict_json_builder&) = delete;

  nlohmann::json root;

  bool null() override { return place(nullptr); }
  bool boolean(bool v) override { return place(v); }
  bool number_integer(number_integer_t v) override { return place(v); }
  bool number_unsigned(number_unsigned_t v) override { return place(v); }
  bool number_float(number_float_t v, const string_t&) override { return place(v); }
  bool string(string_t& v) override { return place(std::move(v)); }
  bool binary(binary_t& v) override { return place(nlohmann::json::binary(std::move(v))); }
  bool start_object(std::size_t) override { return open(nlohmann::json::object()); }
  bool key(string_t& k) override {
    if (open_.back()->contains(k)) {
      throw error(fmt::format("{}: duplicate key '{}' in the {} (JSON parsers keep one of the two silently)", label_,
                              excerpt(k), what_));
    }
    key_ = std::move(k);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(nlohmann::json::array()); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string& last_token, const nlohmann::json::exception& ex) override {
    throw error(fmt::format("{}: {} is not valid JSON: {}", label_, what_, parse_error_message(ex, last_token)));
  }

 private:
  // Puts `v` where the document stands: the root, the next element of the open array, or the
  // open object's member under the last key. Returns where it went. (A pointer into an array
  // stays valid: the array grows again only after that element has closed.)
  nlohmann::json* put(nlohmann::json v) {
    count();
    if (open_.empty()) {
      root = std::move(v);
      return &root;
    }
    nlohmann::json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    nlohmann::json& member = parent[key_];
    member = std::move(v);
    return &member;
  }
  bool place(nlohmann::json v) {
    (void)put(std::move(v));
    return true;
  }
  bool open(nlohmann::json container) {
    if (open_.size() == max_json_depth) {
      throw error(fmt::format("{}: {} JSON is nested deeper than {} levels", label_, what_, max_json_depth));
    }
    open_.push_back(put(std::move(container)));
    return true;
  }
  // One more value: refused past max_values_, before it is placed. The document costs tens of
  // bytes a value (a nlohmann value, a map node, an empty container's allocation): a few bytes of
  // text each, `{},` or `0,`, would make a file of 100 MB take gigabytes, and under a memory limit
  // the std::bad_alloc ended the process (nlohmann's destructor allocates as it unwinds).
  void count() {
    if (++values_ > max_values_) {
      throw error(fmt::format("{}: {} holds more than {} JSON values, the limit that keeps a crafted file from "
                              "taking gigabytes of memory to parse",
                              label_, what_, max_values_));
    }
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  std::string label_, what_;
  std::size_t max_values_;
  std::size_t values_ = 0;             // the values placed so far
  std::vector<nlohmann::json*> open_;  // the open objects and arrays, outermost first
  std::string key_;                    // the open object's key of the next member
};

/// Parses the JSON `text` of `label` (the file, first in every message; `what` names the text in
/// them: "header", "config"), refusing what nlohmann's parser would accept silently: a NUL byte
/// (its end of input: whatever follows would go unread), a key twice in one object at any depth
/// (it keeps one), and nesting deeper than `max_json_depth`; and more than `max_values` values
/// (every scalar, object and array counts), the bound its caller sets for its file, which keeps
/// the document's memory (tens of bytes a value) in proportion to what the file can hold. About
/// linear in the text (n log n in an object's n members). Throws `specsample::error`.
[[nodiscard]] inline nlohmann::json parse_json_strict(std::string_view text, const std::string& label,
                                                      std::string_view what, std::size_t max_values) {
  check_no_nul(text, label);
  strict_json_builder builder(label, std::string(what), max_values);
  if (!nlohmann::json::sax_parse(text.begin(), text.end(), &builder)) {  // (the builder's errors throw)
    throw error(fmt::format("{}: {} is not valid JSON", label, what));
  }
  return std::move(builder.root);
}

}  // namespace specsample::io::detail
