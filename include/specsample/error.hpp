#pragma once
/// @file error.hpp
/// The one exception type the library throws.

#include <stdexcept>
#include <string>

namespace specsample {

/// Thrown for every user-facing failure: bad parameters, bad model output, corrupt or truncated
/// files, mismatched vocabularies, context overflow. The message names the problem (and the file
/// or tensor when there is one).
class error : public std::runtime_error {
 public:
  explicit error(const std::string& what) : std::runtime_error(what) {}
  explicit error(const char* what) : std::runtime_error(what) {}
};

}  // namespace specsample
