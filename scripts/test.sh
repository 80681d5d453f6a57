#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test twice: a Release build, then an
# AddressSanitizer + UBSan build (memory pooling off so ASan sees every buffer).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)

echo "== Release build + tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure)

echo "== ASan + UBSan build + tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHEADLAB_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && \
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure)
