// kernel-align backends: the registry as a table (registry.hpp).
#include <cstdio>
#include <string>

#include "commands.hpp"
#include "kernel_align/registry.hpp"
#include "kernel_align/runtime.hpp"

namespace kernel_align::cli {
namespace {

void run_backends(const Args&) {
  std::printf("%-8s %-16s %-3s %-10s %-11s %s\n", "platform", "op", "#", "backend", "available",
              "isa paths / why not");
  for (const RegistryRow& row : registry_table()) {
    if (row.backends.empty()) {
      std::printf("%-8s %-16s %-3s %-10s %-11s %s\n", platform_name(row.platform),
                  op_type_name(row.op), "-", "-", "no",
                  "no backend for this platform in this build");
      continue;
    }
    int rank = 0;
    for (const BackendStatus& b : row.backends) {
      std::printf("%-8s %-16s %-3d %-10s %-11s %s\n", rank == 0 ? platform_name(row.platform) : "",
                  rank == 0 ? op_type_name(row.op) : "", rank + 1, b.name.c_str(),
                  b.available ? "yes" : "no",
                  b.available ? b.isa_paths.c_str() : b.unavailable_reason.c_str());
      ++rank;
    }
  }
  std::printf("\n");
  for (const RegistryRow& row : registry_table()) {
    if (row.platform != Platform::Cpu || row.op != OpType::QkRmsNorm) continue;
    for (const BackendStatus& b : row.backends) {
      std::printf("%s: fingerprint %s; supports %s\n", b.name.c_str(), b.fingerprint.c_str(),
                  b.supports.c_str());
    }
  }
  const std::string forced = backend_override();
  std::printf(
      "\nfirst choice: %s; strict: %s; isa in use: %s; threads: %d\n"
      "(--backend NAME or KERNEL_ALIGN_BACKEND forces a backend, KERNEL_ALIGN_STRICT=1 "
      "forbids fallbacks)\n",
      forced.empty() ? "the first available backend in each list" : forced.c_str(),
      strict() ? "on (a fallback is an error)"
               : "off (a fallback is counted, traced and warned about)",
      isa_name(isa()), num_threads());
}

}  // namespace

Command backends_command() {
  return {"backends",
          "",
          "the backend registry: for each platform and op the backends in priority order, "
          "whether each can run here and why not",
          {},
          run_backends};
}

}  // namespace kernel_align::cli
