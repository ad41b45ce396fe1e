// Runtime controls in tests: a guard that puts backend, ISA path and thread count
// back as they were, the paths this machine offers, and a configuration type that
// names itself in failure messages.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "kernel_align/registry.hpp"
#include "kernel_align/runtime.hpp"

namespace kernel_align::test {

// Saves the backend override, isa() and num_threads() and restores them when
// destroyed.
class RuntimeGuard {
 public:
  RuntimeGuard() : backend_(backend_override()), isa_(isa()), threads_(num_threads()) {}
  ~RuntimeGuard() {
    set_backend(backend_);
    set_isa(isa_);
    set_num_threads(threads_);
  }
  RuntimeGuard(const RuntimeGuard&) = delete;
  RuntimeGuard& operator=(const RuntimeGuard&) = delete;

 private:
  std::string backend_;
  Isa isa_;
  int threads_;
};

inline constexpr Isa kAllIsas[] = {Isa::Portable, Isa::Avx2, Isa::Avx512};
inline constexpr int kThreadCounts[] = {1, 2, 3, 7};

// Every path at or below best_isa(), lowest first.
inline std::vector<Isa> available_isas() {
  std::vector<Isa> isas;
  for (Isa i : kAllIsas) {
    if (i <= best_isa()) isas.push_back(i);
  }
  return isas;
}

// One way to run an op.
struct RunConfig {
  std::string backend = "reference";  // a registry name: "reference" or "simd"
  Isa isa = Isa::Portable;
  int threads = 1;

  static RunConfig reference() { return {"reference", Isa::Portable, 1}; }
  static RunConfig cpu(Isa i, int n) { return {"simd", i, n}; }

  // Makes this the process's configuration (the ISA and threads only matter for simd).
  void apply() const {
    set_backend(backend);
    if (backend == "simd") {
      set_isa(isa);
      set_num_threads(threads);
    }
  }
  std::string name() const {
    if (backend != "simd") return backend;
    return std::string("simd/") + isa_name(isa) + "/" + std::to_string(threads) + " threads";
  }
};

inline void PrintTo(const RunConfig& c, std::ostream* os) {
  *os << c.name();
}

// The Cpu configurations of path `isa` at every thread count of kThreadCounts.
inline std::vector<RunConfig> cpu_configs(Isa i) {
  std::vector<RunConfig> configs;
  for (int n : kThreadCounts) configs.push_back(RunConfig::cpu(i, n));
  return configs;
}

// Every available path at every thread count of kThreadCounts.
inline std::vector<RunConfig> all_cpu_configs() {
  std::vector<RunConfig> configs;
  for (Isa i : available_isas()) {
    for (const RunConfig& c : cpu_configs(i)) configs.push_back(c);
  }
  return configs;
}

}  // namespace kernel_align::test
