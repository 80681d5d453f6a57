#!/usr/bin/env bash
# EAP-IG over every edge: headlab (`headlab edges --method eap-ig`) against the PyTorch script written
# the way hannamw/EAP-IG computes it (scripts/reference/eap_ig_torch.py), side by side in one run
# (not part of CI). Trains a 4-layer x 8-head d_model 64 model on the induction task, then
# alternates, ROUNDS times, `headlab edges --method eap-ig --ig-steps STEPS_IG` on ROWS prompts and
# the PyTorch script on the inputs headlab wrote (DIR/inputs.safetensors, the same rows and
# answers), and prints the medians, their ratio, the machine's load and how far apart the scores are.
#
# Times: headlab's EAP-IG is the method's own seconds (edges.json's method_seconds: the two cached
# runs and every step's forward and backward); the whole command (which also patches every edge
# exactly and writes its files) is printed beside it. PyTorch's is the script's own "seconds" (the
# same computation; no interpreter start-up, import or model loading). Both with THREADS threads,
# the same OpenBLAS kernels (CORE) and the environment of scripts/reference/torch_env.sh, whose
# OMP_WAIT_POLICY=PASSIVE both get: on a machine shared with other jobs, OpenMP threads that spin
# while they wait took headlab's EAP-IG from 5.8 s to 23.8 s (2 steps, load 15).
# Usage: scripts/bench_eap_ig.sh    (ROUNDS=3 THREADS=2 ROWS=100 STEPS_IG=5 STEPS=600 CORE=SkylakeX CHECKPOINT=)
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${SHARED:-$PWD/scripts/reference}
HEADLAB=${HEADLAB:-$PWD/build/headlab}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
ROWS=${ROWS:-100}
STEPS_IG=${STEPS_IG:-5}
STEPS=${STEPS:-600}
CORE=${CORE:-SkylakeX}
CHECKPOINT=${CHECKPOINT:-}   # a trained model to use instead of training one

[ -x "$HEADLAB" ] || bash scripts/build.sh >/dev/null
# shellcheck disable=SC1091
source "$SHARED/torch_env.sh"
if [ "$CORE" = unset ]; then unset OPENBLAS_CORETYPE; export HEADLAB_BLAS_CORE_CHOSEN=keep; else export OPENBLAS_CORETYPE=$CORE; fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ck=$CHECKPOINT
if [ -z "$ck" ]; then
  echo "training the model ($STEPS steps)" >&2
  "$HEADLAB" train --task induction --layers 4 --heads 8 --d-model 64 --d-ff 256 --steps "$STEPS" \
    --threads "$THREADS" --quiet --out "$out/run" >/dev/null
  ck=$out/run/model.safetensors
fi
load_before=$(cut -d' ' -f1 /proc/loadavg)
for r in $(seq "$ROUNDS"); do
  echo "round $r/$ROUNDS" >&2
  start=$EPOCHREALTIME
  OMP_NUM_THREADS="$THREADS" "$HEADLAB" edges --checkpoint "$ck" --task induction --rows "$ROWS" \
    --method eap-ig --ig-steps "$STEPS_IG" --threads "$THREADS" --out "$out/hl$r" >/dev/null
  echo "{\"start\": $start, \"end\": $EPOCHREALTIME}" >> "$out/headlab.jsonl"
  /usr/bin/python3 "$SHARED/eap_ig_torch.py" --checkpoint "$ck" --inputs "$out/hl$r/inputs.safetensors" \
    --steps "$STEPS_IG" --out "$out/pt$r.json" --threads "$THREADS"
done
load_after=$(cut -d' ' -f1 /proc/loadavg)
/usr/bin/python3 - "$out" "$ROUNDS" "${OPENBLAS_CORETYPE:-unset}" "$THREADS" "$load_before" "$load_after" "$(nproc)" <<'PY'
import json, os, statistics, subprocess, sys
sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
from safetensors_np import read_safetensors
d, rounds, core, threads, load0, load1, cores = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
cmd_s = [(lambda j: j["end"] - j["start"])(json.loads(l)) for l in open(f"{d}/headlab.jsonl") if l.strip()]
B, T = read_safetensors(f"{d}/hl1/inputs.safetensors")["clean"].shape
hl_s, pt_s, worst = [], [], 0.0
for r in range(1, rounds + 1):
    hl, pt = json.load(open(f"{d}/hl{r}/edges.json")), json.load(open(f"{d}/pt{r}.json"))
    hl_s.append(hl["method_seconds"])
    pt_s.append(pt["seconds"])
    names = lambda j: [(e["sender"], e["receiver"]) for e in j["edges"]]  # noqa: E731
    if names(hl) != names(pt):
        sys.exit(f"round {r}: headlab and PyTorch list different edges ({len(hl['edges'])} and {len(pt['edges'])})")
    scale = max(abs(e["eap-ig"]) for e in pt["edges"])
    worst = max([worst] + [abs(a["eap-ig"] - b["eap-ig"]) / scale for a, b in zip(hl["edges"], pt["edges"])])
cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
            if l.startswith("Model name")), "unknown CPU")
h, c, p = statistics.median(hl_s), statistics.median(cmd_s), statistics.median(pt_s)
print(f"{cpu}; {cores} cores, load {load0} before / {load1} after; {threads} threads; OPENBLAS_CORETYPE={core}; "
      f"{len(hl['edges'])} edges, {B} rows x {T} tokens, {pt['steps']} steps; medians of {rounds} rounds")
print(f"{'headlab eap-ig s':>17} {'(whole command s)':>18} {'PyTorch (EAP-IG-style) s':>25} {'speed-up':>9} "
      f"{'max |d score| / max |score|':>28}")
print(f"{h:17.3f} {c:18.3f} {p:25.3f} {p / h:8.1f}x {worst:28.2e}")
# each round's own ratio: on a shared machine the two sides of one round see the same load
print("speed-up per round: " + " ".join(f"{b / a:.1f}x" for a, b in zip(hl_s, pt_s)))
PY
