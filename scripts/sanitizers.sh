#!/usr/bin/env bash
# The C++ tests under clang 14's sanitizers (docs/reliability.md). Parts, both by default,
# or the ones named: scripts/sanitizers.sh [asan] [tsan].
#   asan  the whole suite with AddressSanitizer + UndefinedBehaviorSanitizer (asan
#         preset); scripts/test.sh runs it as its clang build.
#   tsan  the threaded tests (the thread pool, concurrent calls, the trace) with
#         ThreadSanitizer (tsan preset).
# Any report fails the run (-fno-sanitize-recover, halt_on_error). CUDA is off in both:
# its device code runs on the grid emulator, which the asan run includes.
set -euo pipefail
cd "$(dirname "$0")/.."
parts=("$@")
((${#parts[@]})) || parts=(asan tsan)
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"

run_asan() {
  cmake --preset asan >/dev/null
  cmake --build --preset asan
  ctest --preset asan -j"$(nproc)"
}

# ThreadSanitizer: only the binaries with threads, and their threaded tests.
run_tsan() {
  cmake --preset tsan >/dev/null
  cmake --build --preset tsan --target cpu_backend_test trace_test cpu_concurrency_test \
    tools_trace_diff_test kernel-align
  ctest --preset tsan -j"$(nproc)" \
    -R 'Concurrent|Invariance|ThreadCount|Threads|TraceFile|RuntimeControls|RuntimeEnvironment'
}

for part in "${parts[@]}"; do
  case $part in
    asan) run_asan ;;
    tsan) run_tsan ;;
    *) echo "sanitizers: unknown part '$part' (asan, tsan)" >&2; exit 2 ;;
  esac
done
