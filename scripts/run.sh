#!/usr/bin/env bash
# The main job: install, build, train the default model on the copy task, and draw its
# attention maps. Extra arguments go to `headlab train` (e.g. --steps 1000 --heads 8).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
out="runs/copy-$(date +%Y%m%d-%H%M%S)"
./build/headlab train --out "$out" "$@"
./build/headlab attn --checkpoint "$out/model.safetensors" --out "$out/attn"
echo "results in $out (model.safetensors, metrics.jsonl, summary.json, attn/attn.png)"
