#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test: a Release build (under three OpenBLAS
# kernel sets), then an AddressSanitizer + UBSan build (memory pooling off so ASan sees every
# buffer).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)
# ccache keys its objects on paths relative to this checkout, so another clone of the same commit
# (CI's, after a run of this script here) compiles only what changed.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

echo "== Release build + tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >/dev/null
cmake --build build -j"$jobs"
# OpenBLAS picks its kernels by CPU (and this workplace may set OPENBLAS_CORETYPE), so float32
# sums round differently on Intel and AMD machines. Run the suite under several kernel sets so
# a tolerance that holds only for one of them fails here, not on the next machine.
# Tests labelled `once` (the tutorial notebooks, the command-line suites: processes, files and
# signals, not float32 sums) run under the first kernel set only.
only_once=()
for core in Haswell SkylakeX default; do
  echo "== Release tests, OpenBLAS kernels: $core"
  if [ "$core" = default ]; then
    (cd build && env -u OPENBLAS_CORETYPE ctest --output-on-failure "${only_once[@]}")
  else
    (cd build && OPENBLAS_CORETYPE=$core ctest --output-on-failure "${only_once[@]}")
  fi
  only_once=(-LE once)
done

echo "== ASan + UBSan build + tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHEADLAB_SANITIZE=ON "${launcher[@]}" >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && \
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure)
