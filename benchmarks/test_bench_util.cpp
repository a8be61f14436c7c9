// The benchmark programs' own helpers (bench_util.hpp) where a report's reading depends on them.
#include "bench_util.hpp"

#include <catch2/catch.hpp>

using specsample_bench::fmt_beside_goal;

TEST_CASE("fmt_beside_goal prints a figure that the goal's digits would round onto the goal with more digits") {
  // At the row's precision where it prints unlike the goal, or equals it.
  CHECK(fmt_beside_goal(72.18, 70.0, 1) == "72.2");
  CHECK(fmt_beside_goal(70.0, 70.0, 1) == "70.0");
  CHECK(fmt_beside_goal(1.2999, 1.3, 2) == "1.2999");
  CHECK(fmt_beside_goal(0.6512, 0.7, 1) == "0.65");  // (the caller passes percentages scaled: 65.12 of 70)
  // Just short of a ≥ goal, just past a ≤ goal: as many digits as tell them apart, not "70.0" / "1.30".
  CHECK(fmt_beside_goal(69.96, 70.0, 1) == "69.96");
  CHECK(fmt_beside_goal(1.30004, 1.3, 2) == "1.30004");
  CHECK(fmt_beside_goal(0.0800049, 0.08, 3) == "0.080005");
  // At most six more digits, however close.
  CHECK(fmt_beside_goal(1.8 - 1e-12, 1.8, 2) == "1.80000000");
}
