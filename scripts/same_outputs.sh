#!/usr/bin/env bash
# Runs a small version of every study with one binary into one directory, so that two builds can
# be compared file by file: scripts/same_outputs.sh BIN DIR for each, then
# scripts/same_outputs.py DIR_A DIR_B (which leaves out wall-clock and memory figures).
set -euo pipefail
bin=$(realpath "$1"); out=$2
rm -rf "$out"; mkdir -p "$out"; cd "$out"
export OMP_NUM_THREADS=2
q="--quiet"
"$bin" train --steps 120 --threads 2 --out train >/dev/null
"$bin" ablate --head-counts 1 2 --seeds 2 --steps 60 --eval-size 100 --threads 2 --out ablate $q >/dev/null
"$bin" prune --base-heads 4 --train-steps 80 --eval-size 100 --random-seeds 1 --threads 2 --out prune $q >/dev/null
# a rerun reads the base model and the curves back
"$bin" prune --base-heads 4 --train-steps 80 --eval-size 100 --random-seeds 1 --threads 2 --out prune $q >/dev/null
"$bin" prune --method l0 --checkpoint prune/base/model.safetensors --l0-steps 20 --eval-size 100 --threads 2 --out prune_l0 $q >/dev/null
"$bin" prune --method l0 --checkpoint prune/base/model.safetensors --target-heads 5 --l0-steps 20 --eval-size 100 --threads 2 --out prune_l0t $q >/dev/null
"$bin" train --task induction --layers 2 --steps 150 --threads 2 --out ind >/dev/null
"$bin" detect --checkpoint ind/model.safetensors --examples 20 --threads 2 --out detect >/dev/null
"$bin" patch --checkpoint ind/model.safetensors --examples 8 --threads 2 --out patch >/dev/null
"$bin" compose --checkpoint ind/model.safetensors --examples 20 --threads 2 --out compose >/dev/null
"$bin" grads --checkpoint train/model.safetensors --threads 2 --out grads.safetensors >/dev/null
"$bin" attn --checkpoint train/model.safetensors --threads 2 --out attn >/dev/null
"$bin" view train --threads 2 --out view.html >/dev/null
echo "wrote $out"
