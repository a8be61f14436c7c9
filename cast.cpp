#include <specsample/testing/distribution.hpp>
#include <cstdio>
int main() {
  xt::xarray<double> e = {0.5, 0.5, 0.0};
  xt::xarray<double> o = {10.0, 10.0, 1e20};
  auto r = specsample::testing::chi_square_test(o, e);
  std::printf("impossible = %zu, p = %g\n", r.impossible, r.p_value);
}
