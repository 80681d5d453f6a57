#!/usr/bin/env bash
# headlab edges vs the PyTorch reference written as a TransformerLens user writes it
# (scripts/reference/edge_patching_tl.py: one hooked forward per edge), measured side by side in
# one run (not part of CI). Trains a 4-layer x 8-head d_model 64 model on the induction task for a
# few hundred steps (a briefly trained model has effects worth patching), then alternates, ROUNDS
# times, `headlab edges` on ROWS prompts of 32 tokens and the PyTorch script on the inputs headlab
# wrote (DIR/inputs.safetensors), and prints the medians, their ratio and how far apart the two
# sets of numbers are.
#
# headlab's time is the command's wall time (start-up and writing included); PyTorch's is the
# script's own "seconds" (the computation alone: no interpreter start-up, import or model
# loading), so the ratio does not favour headlab. Both run with the same OpenBLAS kernels
# (CORE, as in scripts/bench_vs_pytorch.sh) and THREADS threads; PyTorch under
# scripts/reference/torch_env.sh.
# Usage: scripts/bench_edges.sh    (ROUNDS=3 THREADS=2 ROWS=100 STEPS=600 D_FF=256 CORE=SkylakeX)
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${SHARED:-$PWD/scripts/reference}
HEADLAB=${HEADLAB:-$PWD/build/headlab}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
ROWS=${ROWS:-100}
STEPS=${STEPS:-600}
D_FF=${D_FF:-256}   # 0: attention-only (no MLP receivers)
CORE=${CORE:-SkylakeX}

[ -x "$HEADLAB" ] || bash scripts/build.sh >/dev/null
# (the help read whole first: grep -q stopping early would fail the pipe under pipefail)
commands=$("$HEADLAB" --help)
if ! grep -qE '^\s+edges\s' <<< "$commands"; then
  echo "bench_edges.sh: $HEADLAB has no edges command" >&2
  exit 1
fi
# shellcheck disable=SC1091
source "$SHARED/torch_env.sh"
if [ "$CORE" = unset ]; then unset OPENBLAS_CORETYPE; export HEADLAB_BLAS_CORE_CHOSEN=keep; else export OPENBLAS_CORETYPE=$CORE; fi
HL_THREADS=()
edges_help=$("$HEADLAB" edges --help)
if grep -q -- "--threads" <<< "$edges_help"; then HL_THREADS=(--threads "$THREADS"); fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "training the model ($STEPS steps)" >&2
"$HEADLAB" train --task induction --layers 4 --heads 8 --d-model 64 --d-ff "$D_FF" --steps "$STEPS" \
  --threads "$THREADS" --quiet --out "$out/run" >/dev/null
ck=$out/run/model.safetensors
for r in $(seq "$ROUNDS"); do
  echo "round $r/$ROUNDS" >&2
  start=$EPOCHREALTIME
  env -u OMP_WAIT_POLICY OMP_NUM_THREADS="$THREADS" "$HEADLAB" edges --checkpoint "$ck" --task induction \
    --rows "$ROWS" --out "$out/hl$r" "${HL_THREADS[@]}" >/dev/null
  echo "{\"start\": $start, \"end\": $EPOCHREALTIME}" >> "$out/headlab.jsonl"
  /usr/bin/python3 "$SHARED/edge_patching_tl.py" --checkpoint "$ck" --inputs "$out/hl$r/inputs.safetensors" \
    --out "$out/pt$r.json" --threads "$THREADS" >/dev/null
done
/usr/bin/python3 - "$out" "$ROUNDS" "${OPENBLAS_CORETYPE:-unset}" "$THREADS" <<'PY'
import json, os, statistics, subprocess, sys
sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
from safetensors_np import read_safetensors
d, rounds, core, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
hl_s = [(lambda j: j["end"] - j["start"])(json.loads(l)) for l in open(f"{d}/headlab.jsonl") if l.strip()]
B, T = read_safetensors(f"{d}/hl1/inputs.safetensors")["clean"].shape
pt_s, exact_diff, attr_diff = [], 0.0, 0.0
for r in range(1, rounds + 1):
    hl, pt = json.load(open(f"{d}/hl{r}/edges.json")), json.load(open(f"{d}/pt{r}.json"))
    pt_s.append(pt["seconds"])
    names = lambda j: [(e["sender"], e["receiver"]) for e in j["edges"]]  # noqa: E731
    if names(hl) != names(pt):
        sys.exit(f"round {r}: headlab and PyTorch list different edges ({len(hl['edges'])} and {len(pt['edges'])})")
    scale = max(abs(e["exact"]) for e in pt["edges"])
    exact_diff = max([exact_diff] + [abs(a["exact"] - b["exact"]) / scale for a, b in zip(hl["edges"], pt["edges"])])
    attr_diff = max([attr_diff] + [abs(a["attribution"] - b["attribution"]) / scale for a, b in zip(hl["edges"], pt["edges"])])
cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
            if l.startswith("Model name")), "unknown CPU")
h, p = statistics.median(hl_s), statistics.median(pt_s)
print(f"{cpu}; {threads} threads; OPENBLAS_CORETYPE={core}; {len(hl['edges'])} edges, {B} rows x {T} tokens; "
      f"medians of {rounds} rounds")
print(f"{'headlab edges s':>16} {'PyTorch (TL-style) s':>21} {'speed-up':>9} {'max |d exact| / max |exact|':>28} {'max |d attribution| / max |exact|':>34}")
print(f"{h:16.3f} {p:21.3f} {p / h:8.1f}x {exact_diff:28.2e} {attr_diff:34.2e}")
PY
