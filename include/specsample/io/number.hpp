#pragma once
/// @file number.hpp
/// A number given on a command line, read whole or refused naming its flag (the parser of
/// specsample-generate, specsample-bench, specsample-leniency, specsample-random-gpt2 and
/// distribution_check).

#include <specsample/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <concepts>
#include <limits>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

namespace specsample::io {

namespace detail {

// Whether `text`, a decimal number std::from_chars reads whole (out of a type's range: it sizes
// the error), is at least 1 in magnitude, by the decimal exponent of its first nonzero digit,
// counted exactly: its integer digits after any leading zeros, less one, or else minus the
// fraction's leading zeros and one, plus the exponent written ("01" and 5000 zeros: 5000; "1",
// 10000 zeros and "e-5000": 5000; "0.001e5": 2). That exponent is at least 0 exactly when the
// magnitude is at least 1.
[[nodiscard]] inline bool magnitude_at_least_1(std::string_view text) {
  if (text.starts_with('-')) text.remove_prefix(1);
  const std::size_t e = std::min(text.find_first_of("eE"), text.size());
  const std::string_view mantissa = text.substr(0, e);
  const std::size_t point = std::min(mantissa.find('.'), mantissa.size());
  const std::string_view integer = mantissa.substr(0, point);
  const std::string_view fraction = mantissa.substr(std::min(point + 1, mantissa.size()));
  long long exponent = 0;  // of the first nonzero digit, before the written one
  if (const std::size_t lead = integer.find_first_not_of('0'); lead != std::string_view::npos) {
    exponent = static_cast<long long>(integer.size() - lead) - 1;
  } else if (const std::size_t first = fraction.find_first_not_of('0'); first != std::string_view::npos) {
    exponent = -static_cast<long long>(first) - 1;
  } else {
    return false;  // 0 (which from_chars reads without an error)
  }
  if (e < text.size()) {
    // The written exponent, held within +-2^62 (no text is that long: the sum cannot overflow,
    // and its sign is the true one).
    constexpr long long limit = 1LL << 62;
    std::string_view digits = text.substr(e + 1);
    const bool negative = digits.starts_with('-');
    if (digits.starts_with('-') || digits.starts_with('+')) digits.remove_prefix(1);
    long long written = 0;
    if (std::from_chars(digits.data(), digits.data() + digits.size(), written).ec != std::errc{}) written = limit;
    written = std::min(written, limit);
    exponent += negative ? -written : written;
  }
  return exponent >= 0;
}

}  // namespace detail

/// `text`, the value of `flag`, as a T (an integer or floating-point type), read with
/// std::from_chars: the whole text, in T's range. Throws `specsample::error` naming the flag
/// otherwise: "--samples expects an integer >= 0, got '-5'", "--top-k expects a number from
/// -2147483648 to 2147483647, got '99999999999'", "--temperature expects a number of magnitude at
/// most 3.4028235e+38, got '1e39'", "--temperature expects a number that is 0 or rounds to a
/// magnitude of at least 1e-45, got '1e-50'". (What a flag's domain is beyond T's range is the
/// caller's to check.)
template <class T>
[[nodiscard]] T parse_number(std::string_view flag, std::string_view text) {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, char> &&
                    !std::is_same_v<T, signed char> && !std::is_same_v<T, unsigned char> && !std::is_same_v<T, char8_t> &&
                    !std::is_same_v<T, char16_t> && !std::is_same_v<T, char32_t> && !std::is_same_v<T, wchar_t>,
                "a number type, not a character type");
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range && end == text.data() + text.size()) {
    if constexpr (std::is_floating_point_v<T>) {  // too large, or too small but not 0
      if (detail::magnitude_at_least_1(text)) {
        throw error(fmt::format("{} expects a number of magnitude at most {}, got '{}'", flag,
                                std::numeric_limits<T>::max(), text));
      }
      throw error(fmt::format("{} expects a number that is 0 or rounds to a magnitude of at least {}, got '{}'", flag,
                              std::numeric_limits<T>::denorm_min(), text));
    } else {
      throw error(fmt::format("{} expects a number from {} to {}, got '{}'", flag, std::numeric_limits<T>::lowest(),
                              std::numeric_limits<T>::max(), text));
    }
  }
  if (ec != std::errc{} || end != text.data() + text.size()) {
    throw error(fmt::format("{} expects {}, got '{}'", flag,
                            std::is_floating_point_v<T> ? "a number" : std::is_signed_v<T> ? "an integer" : "an integer >= 0",
                            text));
  }
  return value;
}

/// `parse_number` of an integer that must be at least `least` (a count of 1 or more, say): one
/// message for every text below it or no integer at all, "-n expects an integer >= 1, got '0'"
/// (also for "-1", which an unsigned T cannot hold); "... expects an integer from 1 to 65535, got
/// '70000'" above T's range.
template <std::integral T>
[[nodiscard]] T parse_number(std::string_view flag, std::string_view text, T least) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  const bool whole = end == text.data() + text.size();
  if (ec == std::errc{} && whole && value >= least) return value;
  if (ec == std::errc::result_out_of_range && whole && !text.starts_with('-')) {
    throw error(fmt::format("{} expects an integer from {} to {}, got '{}'", flag, least, std::numeric_limits<T>::max(),
                            text));
  }
  throw error(fmt::format("{} expects an integer >= {}, got '{}'", flag, least, text));
}

/// A comma-separated list of `parse_number`s, at least one ("0,0.7,1"): every item a number, so
/// "1,,0.5" and a trailing "0.5," are refused like an empty list ("--temperatures needs at least
/// one value").
template <class T>
[[nodiscard]] std::vector<T> parse_list(std::string_view flag, std::string_view list) {
  if (list.empty()) throw error(fmt::format("{} needs at least one value", flag));
  std::vector<T> values;
  for (;;) {
    const std::size_t comma = list.find(',');
    values.push_back(parse_number<T>(flag, list.substr(0, comma)));
    if (comma == std::string_view::npos) return values;
    list = list.substr(comma + 1);
  }
}

}  // namespace specsample::io
