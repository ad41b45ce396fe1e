// Judging stored results against the fp64 oracle.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <vector>

#include "oracle/oracle.hpp"
#include "support/tensors.hpp"

namespace kernel_align::test {

// Every element of `out` (logical row-major order) within its oracle bound. An
// element where the oracle makes no claim (infinite bound) fails too: the test's
// inputs are meant to stay where the bound is proven.
inline ::testing::AssertionResult matches_oracle(const std::vector<oracle::Expected>& expected,
                                                 const ConstTensorView& out) {
  const std::vector<double> stored = logical_values(out);
  if (stored.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << stored.size() << " stored elements, " << expected.size() << " expected";
  }
  std::ostringstream failures;
  int failed = 0;
  for (std::size_t i = 0; i < stored.size(); ++i) {
    const oracle::Expected& e = expected[i];
    const bool claimed = !std::isfinite(e.value) || std::isfinite(e.bound);
    if (claimed && oracle::within(e, stored[i])) continue;
    if (failed++ < 8) {
      failures.precision(17);
      failures << "\n  element " << i << ": stored " << stored[i] << ", exact " << e.value
               << ", bound " << e.bound;
    }
  }
  if (failed == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << failed << " of " << stored.size()
                                       << " elements outside the oracle's bound" << failures.str();
}

}  // namespace kernel_align::test
