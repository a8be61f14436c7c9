#pragma once
// Test sizing under sanitizers. The suite runs twice: an optimised build with every statistic at
// full size, and an ASan + UBSan build (-O1) that runs the same code paths to catch memory and UB
// errors. Sample counts and model generations are scaled down there (the release build keeps the
// statistical power); a scaled test still asserts everything it asserts in the release build.

#include <cstddef>

namespace specsample::test {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool sanitized = true;
#else
inline constexpr bool sanitized = false;
#endif

/// `n` in the release build, n / 4 under sanitizers.
constexpr std::size_t samples(std::size_t n) { return sanitized ? n / 4 : n; }

}  // namespace specsample::test
