#pragma once
/// @file json.hpp
/// Strict JSON parsing for the files the library reads (a safetensors header, config.json).

#include <specsample/error.hpp>
#include <specsample/io/mapped_file.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace specsample::io::detail {

inline constexpr int max_json_depth = 64;

/// Parses the JSON `text` of `label` (the file, first in every message; `what` names the text in
/// them: "header", "config"), refusing what nlohmann's parser would accept silently or at any
/// cost: a NUL byte (its end of input: whatever follows would go unread), a key twice in one
/// object at any depth (it keeps the last), and nesting deeper than `max_json_depth`. Throws
/// `specsample::error`.
[[nodiscard]] inline nlohmann::json parse_json_strict(std::string_view text, const std::string& label,
                                                      std::string_view what) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  int depth = 0;
  nlohmann::json::parser_callback_t cb = [&](int /*depth*/, nlohmann::json::parse_event_t ev,
                                             nlohmann::json& parsed) -> bool {
    using ev_t = nlohmann::json::parse_event_t;
    switch (ev) {
      case ev_t::object_start:
      case ev_t::array_start:
        if (++depth > max_json_depth) {
          throw error(fmt::format("{}: {} JSON is nested deeper than {} levels", label, what, max_json_depth));
        }
        if (ev == ev_t::object_start) keys.emplace_back();
        break;
      case ev_t::object_end:
        --depth;
        if (!keys.empty()) keys.pop_back();
        break;
      case ev_t::array_end:
        --depth;
        break;
      case ev_t::key:
        if (!keys.empty() && parsed.is_string()) {
          const auto& k = parsed.get_ref<const std::string&>();
          if (!keys.back().insert(k).second) {
            throw error(fmt::format("{}: duplicate key '{}' in the {} (JSON parsers keep one of the two silently)",
                                    label, k, what));
          }
        }
        break;
      case ev_t::value:
        break;
    }
    return true;
  };
  check_no_nul(text, label);
  try {
    return nlohmann::json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true);
  } catch (const nlohmann::json::exception& e) {
    throw error(fmt::format("{}: {} is not valid JSON: {}", label, what, e.what()));
  }
}

}  // namespace specsample::io::detail
