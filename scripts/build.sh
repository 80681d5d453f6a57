#!/usr/bin/env bash
# Configures and builds the Release tree in build/ (after installing dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
# Installs the command (/usr/local/bin/headlab) and the Python package where Debian's python3
# looks (/usr/local/lib/python3.X/dist-packages), so `import headlab` works from any folder.
if [ "$(id -u)" -eq 0 ]; then
  cmake --install build
else
  echo "build.sh: not root, so not installing; the build is in build/ (sudo cmake --install build installs it," \
       "or use PYTHONPATH=$PWD/build/python and ./build/headlab)"
fi
