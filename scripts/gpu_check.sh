#!/usr/bin/env bash
# The GPU check (issue 12, part 5), prepared to be right the first time on a lent H200
# machine (nvcc 13.0, Python 3.12 with torch 2.11+cu130; nothing can be fetched there):
#
#   here:   scripts/gpu_check_prepare.sh            (fills .gpu/: debs and wheels)
#   there:  scripts/gpu_check.sh                    (device tool: carry [".gpu"]; writes
#                                                    its logs, JSON and CSV under $OUT)
#   here:   scripts/gpu_check.sh --dry-run          (every step on the CPU, no GPU needed:
#                                                    the build for sm_90, the tests, which
#                                                    skip, the benchmark on tiny shapes)
#
# Stages, each timed and its result in the summary table printed last:
#   1. build for sm_90 with that machine's nvcc and torch: the library, the CLI, the
#      on-device C++ tests and the torch extension (MPFR and GoogleTest from .gpu/debs
#      where the machine lacks them);
#   2. the on-device C++ tests: the whole matrix (every op, direction, dtype, mode,
#      pairing, layout, D, strided/unaligned/in-place views, rows across every launch
#      threshold) byte for byte against the CPU reference; batch invariance for batches
#      of 1 to 64; run-to-run determinism on a caller's stream; device-side trace digests;
#   3. the torch tests on CUDA: every op's bytes equal the CPU's, autograd,
#      torch.compile, the diffusers processor on a CUDA model (diffusers from .gpu/wheels);
#   4. the benchmark at the issue's shapes, bf16 and fp32 (bench/gpu_bench.py): time,
#      bandwidth, ratio to a same-run device-to-device copy, to eager PyTorch and
#      torch.compile of the same formulas, and to FlashInfer / Liger where they import.
# Budget: well under 8 minutes on an H200 (the build is most of it); each stage has a
# time limit so that the summary is always printed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

dry_run=0
[[ "${1:-}" == "--dry-run" ]] && dry_run=1
out="${OUT:-$root/out/gpu_check}"
mkdir -p "$out"
if ((dry_run)); then
  python="${KA_PYTHON:-$root/.venv/bin/python}"
  build="$root/build/gpu-dry"
else
  python="$(command -v python3)"
  build="$root/build/gpu"
fi
work="$build/run"
mkdir -p "$work"
jobs=$(nproc)

declare -a stage_names stage_results stage_seconds
# stage NAME LIMIT FUNCTION: runs the (exported) function in a shell of its own with a time
# limit, logging to $out/NAME.log.
stage() {
  local name=$1 limit=$2 fn=$3
  local start=$SECONDS
  echo "=== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" bash -o pipefail -c "$fn" > >(tee "$out/$name.log") 2>&1
  local status=$?
  local result=PASS
  # Nothing ran: gtest passed 0 tests, or pytest collected none (exit 5, a module skip).
  if ((status == 0)) && grep -q '^\[  PASSED  \] 0 tests' "$out/$name.log"; then
    result="SKIPPED"
  elif ((status == 5)) && grep -q 'skipped' "$out/$name.log"; then
    result="SKIPPED"
    status=0
  elif ((status == 124 || status == 137)); then
    result="TIMEOUT"
  elif ((status != 0)); then
    result="FAIL ($status)"
  fi
  stage_names+=("$name")
  stage_results+=("$result")
  stage_seconds+=($((SECONDS - start)))
  return $status
}

summary() {
  echo
  echo "=== gpu_check summary ($(date -u +%FT%TZ)); logs and results in $out"
  printf '%-12s %-14s %8s\n' stage result seconds
  for i in "${!stage_names[@]}"; do
    printf '%-12s %-14s %8s\n' "${stage_names[$i]}" "${stage_results[$i]}" "${stage_seconds[$i]}"
  done
  if [[ -f "$out/bench.log" ]]; then
    echo
    sed -n '/^op /,$p' "$out/bench.log"
  fi
}
trap summary EXIT

environment() {
  echo "dry run: $dry_run; python: $python"
  (command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv) || echo "nvidia-smi: none"
  nvcc --version | sed -n '$p'
  "$python" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'device', torch.cuda.is_available() and torch.cuda.get_device_name())"
  cmake --version | sed -n 1p
  command -v ninja >/dev/null && echo "ninja $(ninja --version)"
  g++ --version | sed -n 1p
  ldd --version | sed -n 1p
}

# MPFR, GMP and GoogleTest: the machine's own, or the carried Debian packages unpacked.
# Sets PREFIX_ARGS (CMake flags), LD_LIBRARY_PATH and SITE (carried wheels).
dependencies() {
  PREFIX_ARGS=""
  if [[ -n "${KA_GPU_USE_CARRIED:-}" ]] || ! { pkg-config --exists mpfr 2>/dev/null && [[ -f /usr/include/gtest/gtest.h ]]; }; then
    local debs="$root/.gpu/debs"
    if ! ls "$debs"/*.deb >/dev/null 2>&1; then
      echo "no system MPFR/GoogleTest and no $debs (run scripts/gpu_check_prepare.sh and carry .gpu)"
      return 1
    fi
    carried="$build/deps"
    rm -rf "$carried" && mkdir -p "$carried"
    for f in "$debs"/*.deb; do dpkg -x "$f" "$carried"; done
    PREFIX_ARGS="-DCMAKE_PREFIX_PATH=$carried/usr -DPKG_CONFIG_EXECUTABLE=/nonexistent"
    export LD_LIBRARY_PATH="$carried/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "using the carried packages in $carried"
  else
    echo "using the system's MPFR and GoogleTest"
  fi
  SITE="$build/site"
  if ls "$root"/.gpu/wheels/*.whl >/dev/null 2>&1 && ! "$python" -c "import diffusers" 2>/dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "$root"/.gpu/wheels/*.whl && echo "wheels installed in $SITE"
  fi
}

build_all() {
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DKERNEL_ALIGN_CUDA=ON -DKERNEL_ALIGN_WERROR=OFF \
    -DKERNEL_ALIGN_BUILD_BENCH=OFF -DKERNEL_ALIGN_BUILD_PYTHON=ON \
    -DPython_EXECUTABLE="$python" $PREFIX_ARGS &&
    cmake --build "$build" -j "$jobs" --target kernel-align cuda_device_test kernel_align_torch &&
    rm -rf "$work/pkg" && mkdir -p "$work/pkg" &&
    cp -r "$root/python/kernel_align" "$work/pkg/" &&
    cp "$build/python/libkernel_align_torch.so" "$work/pkg/kernel_align/" &&
    "$build/kernel-align" backends | sed -n '/^cuda/p'
}

device_tests() {
  "$build/tests/cuda/cuda_device_test" --gtest_brief=1 --gtest_output="json:$out/device_test.json"
}

torch_tests() {
  PYTHONPATH="$work/pkg:$SITE" "$python" -m pytest -q -p no:cacheprovider -rs \
    "$root/tests/python/test_cuda.py"
}

benchmark() {
  local args=(--json "$out/gpu_bench.json" --csv "$out/gpu_bench.csv")
  ((dry_run)) && args+=(--dry-run --shapes 1024x1024 --reps 3)
  PYTHONPATH="$work/pkg:$SITE" PYTHONUNBUFFERED=1 "$python" "$root/bench/gpu_bench.py" "${args[@]}"
}

dependencies > >(tee "$out/dependencies.log") 2>&1 || exit 1
export root out python build work jobs dry_run PREFIX_ARGS SITE LD_LIBRARY_PATH
export -f environment build_all device_tests torch_tests benchmark
stage environment 60 environment
stage build 300 build_all || exit 1
stage device 180 device_tests
stage torch 180 torch_tests
stage bench 300 benchmark
