#pragma once
/// @file argument.hpp
/// One command-line argument as the tools' parsers read it (specsample-generate, specsample-bench,
/// specsample-leniency, specsample-random-gpt2 and distribution_check): `--name=value` is the flag
/// `--name` with its value attached, the same as `--name value`.

#include <cstddef>
#include <optional>
#include <string_view>

namespace specsample::io {

/// A command-line argument split at its first '=' when it is a long option (`--temperature=0.7`:
/// flag "--temperature", attached "0.7"; `--prompt=a=b`: "--prompt" and "a=b"; `--stream=`: an
/// empty value attached). Anything else — `--stream`, `-k`, `-k=3`, a value — is a flag of its
/// own with nothing attached.
struct argument {
  std::string_view flag;
  std::optional<std::string_view> attached;
};

[[nodiscard]] constexpr argument split_argument(std::string_view text) noexcept {
  if (text.size() > 2 && text.starts_with("--")) {
    const std::size_t eq = text.find('=');
    if (eq != std::string_view::npos && eq > 2) return {text.substr(0, eq), text.substr(eq + 1)};
  }
  return {text, std::nullopt};
}

}  // namespace specsample::io
