#include "memory.hpp"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "kernel_align/error.hpp"

namespace kernel_align::cli {
namespace {

std::string gib(std::uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

}  // namespace

std::optional<std::uint64_t> checked_product(std::initializer_list<std::uint64_t> factors) {
  std::uint64_t product = 1;
  for (const std::uint64_t f : factors) {
    if (__builtin_mul_overflow(product, f, &product)) return std::nullopt;
  }
  return product;
}

std::uint64_t available_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::uint64_t available_kib = 0;
  std::uint64_t swap_kib = 0;
  bool found = false;
  for (std::string line; std::getline(meminfo, line);) {
    std::istringstream fields(line);
    std::string key;
    std::uint64_t kib = 0;
    fields >> key >> kib;
    if (key == "MemAvailable:") {
      available_kib = kib;
      found = true;
    } else if (key == "SwapFree:") {
      swap_kib = kib;
    }
  }
  if (found) return (available_kib + swap_kib) * 1024;
  const long pages = ::sysconf(_SC_AVPHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0
             ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page)
             : UINT64_MAX;
}

void check_fits_in_memory(const std::string& flag, std::optional<std::uint64_t> bytes,
                          const std::string& what) {
  const std::uint64_t available = available_memory();
  if (bytes && *bytes <= available) return;
  throw Error(flag, "a size that fits in the available memory (" + gib(available) + ")",
              (bytes ? gib(*bytes) : std::string("more than 2^64 bytes")) + " for " + what);
}

}  // namespace kernel_align::cli
