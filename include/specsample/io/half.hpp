#pragma once
/// @file half.hpp
/// Scalar conversions between float and the 16-bit floating-point formats of checkpoints (IEEE
/// binary16 "F16" and bfloat16 "BF16"): the one definition the safetensors reader, the weight
/// packing and the GPT-2 kernels' scalar paths share.

#include <bit>
#include <cmath>
#include <cstdint>

namespace specsample::io {

/// IEEE binary16 -> float, exact (subnormals, ±inf and NaN included).
[[nodiscard]] inline float f16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t exp = (static_cast<std::uint32_t>(h) >> 10) & 0x1fu;
  const std::uint32_t mant = static_cast<std::uint32_t>(h) & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign != 0 ? -v : v;
  }
  if (exp == 31) {  // inf / NaN (payload kept)
    return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

/// bfloat16 -> float, exact.
[[nodiscard]] inline float bf16_to_float(std::uint16_t h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

/// float -> IEEE binary16 with round-to-nearest-even (overflow -> ±inf, NaN stays NaN).
[[nodiscard]] inline std::uint16_t float_to_f16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  std::uint32_t h = 0;
  if (absx > 0x7f800000u) {
    h = 0x7e00u | ((absx >> 13) & 0x3ffu);  // quiet NaN
  } else if (absx >= 0x477ff000u) {          // >= 65520 rounds to inf
    h = 0x7c00u;
  } else if (absx < 0x38800000u) {  // below 2^-14: subnormal half (or zero)
    const float scaled = std::bit_cast<float>(absx) * 0x1p24f;  // exact, < 1024
    h = static_cast<std::uint32_t>(std::nearbyint(scaled));     // ties to even (default mode)
  } else {
    const std::uint32_t mant = absx & 0x7fffffu;
    const std::uint32_t exp = (absx >> 23) - 112u;
    h = (exp << 10) | (mant >> 13);
    const std::uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0)) ++h;  // carry into exp is right
  }
  return static_cast<std::uint16_t>(sign | h);
}

/// float -> bfloat16 with round-to-nearest-even (NaN stays NaN).
[[nodiscard]] inline std::uint16_t float_to_bf16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace specsample::io
