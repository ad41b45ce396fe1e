// split_over_cores and zero_fill: every index once, in ranges that join up in order.
#include "cases/parallel.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace kernel_align::cases {
namespace {

std::vector<std::pair<std::size_t, std::size_t>> ranges_of(std::size_t n, std::size_t grain) {
  std::mutex mutex;
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  split_over_cores(n, grain, [&](std::size_t begin, std::size_t end) {
    const std::lock_guard lock(mutex);
    ranges.emplace_back(begin, end);
  });
  std::sort(ranges.begin(), ranges.end());
  return ranges;
}

TEST(SplitOverCores, RangesCoverEveryIndexOnceAndRespectTheGrain) {
  const std::size_t cores = std::max(1u, std::thread::hardware_concurrency());
  for (const auto& [n, grain] : std::vector<std::pair<std::size_t, std::size_t>>{
           {0, 1}, {1, 1}, {7, 0}, {7, 3}, {100, 10}, {1000003, 1000}, {5, 100}}) {
    const auto ranges = ranges_of(n, grain);
    ASSERT_FALSE(ranges.empty()) << "n " << n;
    EXPECT_LE(ranges.size(), cores) << "n " << n;
    EXPECT_EQ(ranges.front().first, 0u) << "n " << n;
    EXPECT_EQ(ranges.back().second, n) << "n " << n;
    for (std::size_t r = 1; r < ranges.size(); ++r) {
      EXPECT_EQ(ranges[r].first, ranges[r - 1].second) << "n " << n << " range " << r;
    }
    if (ranges.size() > 1) {
      for (const auto& [begin, end] : ranges) EXPECT_GE(end - begin, grain) << "n " << n;
    }
  }
}

TEST(ZeroFill, ZeroesEveryByte) {
  std::vector<std::byte> bytes((std::size_t{3} << 20) + 5, std::byte{0xA5});
  zero_fill(bytes);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    ASSERT_EQ(bytes[i], std::byte{0}) << "byte " << i;
  }
  zero_fill({});  // no bytes, no pointer: nothing to do
}

}  // namespace
}  // namespace kernel_align::cases
