#pragma once
// Bitwise comparison of float results: batch invariance and the kernels' determinism are claims
// about bits, not values (a -0 against a 0, or two NaN payloads, must count as different).

#include <Eigen/Core>

#include <cstddef>
#include <cstring>

namespace specsample::test {

/// Whether the n floats at a and b have the same bits.
inline bool bitwise_equal(const float* a, const float* b, std::size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}

/// Whether two matrices have the same shape and the same bits (blocks compared column by column).
inline bool bitwise_equal(const Eigen::Ref<const Eigen::MatrixXf>& a, const Eigen::Ref<const Eigen::MatrixXf>& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return false;
  for (Eigen::Index j = 0; j < a.cols(); ++j) {
    if (!bitwise_equal(a.col(j).data(), b.col(j).data(), static_cast<std::size_t>(a.rows()))) return false;
  }
  return true;
}

}  // namespace specsample::test
