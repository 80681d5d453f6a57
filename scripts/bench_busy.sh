#!/usr/bin/env bash
# A busy machine: `headlab train` on its defaults with one other CPU-bound process running
# (a shared server, a laptop with a browser), against --threads 1 under the same load, and the
# same two on a quiet machine. Alternated rounds in one run; wall seconds, medians.
# Usage: bash scripts/bench_busy.sh [ROUNDS] [TRAIN_FLAGS...]   (default 3 rounds, --steps 200)
# Extra environment for headlab (e.g. OMP_WAIT_POLICY=active) can be given as HL_ENV="A=1 B=2".
set -euo pipefail
HL=$(realpath "$(dirname "$0")/../build/headlab")
rounds=${1:-3}; shift || true
flags=("$@")
[ ${#flags[@]} -eq 0 ] && flags=(--steps 200)
W=$(mktemp -d)
load_pid=""
cleanup() { [ -n "$load_pid" ] && kill "$load_pid" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
wall() {  # wall seconds of one headlab train run
  local t0; t0=$(date +%s.%N)
  env -u OPENBLAS_CORETYPE ${HL_ENV:-} "$HL" train --quiet "${flags[@]}" "$@" --out "$W/r$RANDOM$RANDOM" >/dev/null 2>&1
  python3 -c "print(round($(date +%s.%N) - $t0, 3))"
}
declare -a qd q1 bd b1
for r in $(seq 1 "$rounds"); do
  qd+=("$(wall)"); q1+=("$(wall --threads 1)")
  python3 -c "while True: pass" & load_pid=$!
  sleep 0.5
  bd+=("$(wall)"); b1+=("$(wall --threads 1)")
  kill "$load_pid"; wait "$load_pid" 2>/dev/null || true; load_pid=""
  echo "round $r: quiet ${qd[-1]} / ${q1[-1]} s, busy ${bd[-1]} / ${b1[-1]} s (default / --threads 1)" >&2
done
python3 - "${qd[*]}" "${q1[*]}" "${bd[*]}" "${b1[*]}" "$(nproc)" <<'PY'
import statistics as st, sys
qd, q1, bd, b1 = ([float(x) for x in v.split()] for v in sys.argv[1:5])
m = st.median
print(f"machine              default (s)  --threads 1 (s)  default / --threads 1")
print(f"quiet                {m(qd):>11.2f}  {m(q1):>15.2f}  {m(qd)/m(q1):>21.2f}")
print(f"one busy process     {m(bd):>11.2f}  {m(b1):>15.2f}  {m(bd)/m(b1):>21.2f}")
print(f"({len(qd)} rounds alternated, {sys.argv[5]} cores; medians of wall time)")
PY
