#include "cases/parallel.hpp"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

namespace kernel_align::cases {

void split_over_cores(std::size_t n, std::size_t grain,
                      const std::function<void(std::size_t, std::size_t)>& fn) {
  const std::size_t cores = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t ranges = std::clamp<std::size_t>(n / std::max<std::size_t>(grain, 1), 1, cores);
  const auto begin_of = [&](std::size_t r) { return n / ranges * r + std::min(r, n % ranges); };
  std::vector<std::jthread> threads;
  threads.reserve(ranges - 1);
  for (std::size_t r = 1; r < ranges; ++r) {
    threads.emplace_back([&fn, b = begin_of(r), e = begin_of(r + 1)] { fn(b, e); });
  }
  fn(0, begin_of(1));
}

void zero_fill(std::span<std::byte> bytes) {
  split_over_cores(bytes.size(), kBytesPerThread, [&](std::size_t begin, std::size_t end) {
    if (end > begin) std::memset(bytes.data() + begin, 0, end - begin);  // never a null pointer
  });
}

}  // namespace kernel_align::cases
