#pragma once
/// @file error.hpp
/// The one exception type the library throws, and `parameter_error`, its kind for a parameter out
/// of its domain.

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace specsample {

/// Thrown for every user-facing failure: bad parameters, bad model output, corrupt or truncated
/// files, mismatched vocabularies, context overflow. The message names the problem (and the file
/// or tensor when there is one).
class error : public std::runtime_error {
 public:
  explicit error(const std::string& what) : std::runtime_error(what) {}
  explicit error(const char* what) : std::runtime_error(what) {}
};

/// The `error` for a parameter out of its domain, as `validate` refuses a field of
/// `sampling_params` or `speculative_params` (a verifier its leniency, `gpt2::model` a field of its
/// `gpt2::options`, `model_drafter` its min_probability, `calibration` a cost): `what()` is `field()`
/// followed by `reason()`, e.g. "speculative_params.draft_length" and " must be in 1..256 (...),
/// got 0", so a program that sets the field from an option of its own can name the option instead.
class parameter_error final : public error {
 public:
  explicit parameter_error(std::string_view field, std::string_view reason)
      : error(std::string(field).append(reason)), field_size_(field.size()), size_(field.size() + reason.size()) {}
  /// The parameter, as the library names it ("speculative_params.sampling.top_p", say).
  [[nodiscard]] std::string_view field() const noexcept { return std::string_view(what(), field_size_); }
  /// What is wrong with it, starting with a space: the rest of `what()`.
  [[nodiscard]] std::string_view reason() const noexcept {
    return std::string_view(what() + field_size_, size_ - field_size_);
  }

 private:
  std::size_t field_size_, size_;  // (sizes, not C strings: a name may hold a NUL)
};

}  // namespace specsample
