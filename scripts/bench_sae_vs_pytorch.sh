#!/usr/bin/env bash
# headlab's TopK SAE training step vs PyTorch's (scripts/reference/sae_torch.py, SAELens's loop),
# measured side by side in one run (not part of CI). Alternates `headlab bench --sae` and the
# PyTorch script for each size, ROUNDS times, and prints medians of tokens/s and the ratio.
# Both run on random normal activations, batch 4096 rows, k 32, the same thread count, and count
# a feature dead after DEAD_AFTER rows without firing (default one batch: AuxK runs from the
# second step on whenever a feature missed the last batch). PyTorch runs under
# scripts/reference/torch_env.sh; headlab under the same minus the passive OpenMP waiting, as in
# scripts/bench_vs_pytorch.sh (whose OPENBLAS_CORETYPE note applies: CORE, default SkylakeX).
# Each round's headlab / PyTorch ratio is printed beside the medians (the rounds are paired in
# time, so the ratio is steadier than either side's speed when other jobs share the cores).
# ONE_THREAD_BELOW=X: headlab's bound for running a small step on one thread (bench
# --sae-one-thread-below; default the library's, which applies only while OpenMP's threads spin).
# HEADLAB=path: the headlab binary to time (default ./build/headlab; another build, to compare).
# Usage: scripts/bench_sae_vs_pytorch.sh [D_IN,EXPANSION ...]
#        (default: 64,8 64,32 256,8 256,32 768,8 768,32)
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${SHARED:-$PWD/scripts/reference}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
CORE=${CORE:-SkylakeX}
BATCH=${BATCH:-4096}
K=${K:-32}
STEPS=${STEPS:-10}
WARMUP=${WARMUP:-3}
DEAD_AFTER=${DEAD_AFTER:-$BATCH}
sizes=("$@"); [ ${#sizes[@]} -gt 0 ] || sizes=(64,8 64,32 256,8 256,32 768,8 768,32)

if ! dpkg-query -W -f='${Status}' python3-torch 2>/dev/null | grep -q "install ok installed"; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch
fi
HEADLAB=${HEADLAB:-./build/headlab}
[ "$HEADLAB" != ./build/headlab ] || [ -x ./build/headlab ] || bash scripts/build.sh >/dev/null
[ -x "$HEADLAB" ] || { echo "HEADLAB=$HEADLAB: not an executable" >&2; exit 1; }
# shellcheck disable=SC1091
source "$SHARED/torch_env.sh"
if [ "$CORE" = unset ]; then unset OPENBLAS_CORETYPE; export HEADLAB_BLAS_CORE_CHOSEN=keep; else export OPENBLAS_CORETYPE=$CORE; fi
# HEADLAB_ENV=best (default): headlab with OpenMP's default (spinning) waiting; =same: under
# torch_env.sh's passive waiting too, the fairer choice when other jobs share the cores.
HL_ENV=(env -u OMP_WAIT_POLICY)
[ "${HEADLAB_ENV:-best}" = same ] && HL_ENV=(env)
HL_EXTRA=()
[ -n "${ONE_THREAD_BELOW:-}" ] && HL_EXTRA=(--sae-one-thread-below "$ONE_THREAD_BELOW")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for size in "${sizes[@]}"; do
  d_in=${size%,*} expansion=${size#*,}
  for r in $(seq "$ROUNDS"); do
    echo "round $r/$ROUNDS: d_in $d_in, expansion $expansion ($(uptime | sed 's/.*load/load/'))" >&2
    "${HL_ENV[@]}" "$HEADLAB" bench --sae "$d_in,$expansion,$K" --sae-batch "$BATCH" --sae-dead-after "$DEAD_AFTER" \
      --threads "$THREADS" --steps "$STEPS" --warmup "$WARMUP" "${HL_EXTRA[@]}" >> "$out/headlab.jsonl"
    /usr/bin/python3 "$SHARED/sae_torch.py" --d-in "$d_in" --expansion "$expansion" --k "$K" --batch "$BATCH" \
      --dead-after "$DEAD_AFTER" --threads "$THREADS" --steps "$STEPS" --warmup "$WARMUP" >> "$out/torch.jsonl"
  done
done
/usr/bin/python3 - "$out" "${OPENBLAS_CORETYPE:-unset}" "$THREADS" "$BATCH" "$K" "$(uptime | sed 's/.*load/load/')" "${HEADLAB_ENV:-best}" <<'PY'
import json, statistics, sys
d, core, threads, batch, k, load, env = sys.argv[1:8]
rows = lambda f: [json.loads(l) for l in open(f"{d}/{f}") if l.strip()]
hl, tt = rows("headlab.jsonl"), rows("torch.jsonl")
med = statistics.median
print(f"TopK SAE training step, batch {batch}, k {k}, {threads} threads, OPENBLAS_CORETYPE={core}; "
      f"headlab environment {env}; medians over rounds of per-run median steps; {load} at the end")
print(f"{'d_in':>5} {'exp':>4} {'d_sae':>6} {'headlab tok/s':>14} {'torch tok/s':>12} {'speed-up':>9} {'headlab ms':>11} {'torch ms':>9} {'allocs/step':>11}  per-round speed-ups")
for key in dict.fromkeys((r["d_in"], r["expansion"]) for r in hl):
    h = [r for r in hl if (r["d_in"], r["expansion"]) == key]
    t = [r for r in tt if (r["d_in"], r["expansion"]) == key]
    hm, tm = med([r["step_ms_median"] for r in h]), med([r["step_ms_median"] for r in t])
    allocs = max(r["mallocs_per_step"] for r in h) if h[0]["mallocs_per_step"] is not None else None
    print(f"{key[0]:5} {key[1]:4} {h[0]['d_sae']:6} {int(batch)/hm*1e3:14.0f} {int(batch)/tm*1e3:12.0f} {tm/hm:8.2f}x "
          f"{hm:11.1f} {tm:9.1f} {'-' if allocs is None else f'{allocs:.2f}':>11}  "
          + " ".join(f"{b['step_ms_median'] / a['step_ms_median']:.2f}" for a, b in zip(h, t)))
PY
