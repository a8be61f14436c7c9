#pragma once
// Test sizing under sanitizers. The suite runs twice: an optimised build and an ASan + UBSan build
// (-O1) that runs the same code paths to catch memory and UB errors. The statistical tests draw
// their full sample counts (>= 100k) in both builds; only the GPT-2 generation tests, whose
// kernels run about 20x slower under the sanitizers, check a subset there (`sanitized`).

namespace specsample::test {

// GCC defines __SANITIZE_ADDRESS__ under -fsanitize=address; Clang (the suite's sanitizer
// build) does not, and answers __has_feature(address_sanitizer) instead.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool sanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool sanitized = true;
#else
inline constexpr bool sanitized = false;
#endif
#else
inline constexpr bool sanitized = false;
#endif

}  // namespace specsample::test
