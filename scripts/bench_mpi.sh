#!/usr/bin/env bash
# One machine, two ways to use its cores: 1 process x 2 threads against mpirun -np 2 x 1 thread,
# alternated in one run, for the training step of the default model (S: data-parallel, each
# rank 32 of the 64 sequences) and for a head-count sweep (ranks take whole runs).
# Usage: bash scripts/bench_mpi.sh [ROUNDS] [SWEEP_FLAGS...]   (default 3 rounds, the default sweep)
# OPENBLAS_CORETYPE is unset (headlab picks its kernels), as on a user's machine.
set -euo pipefail
HL=$(realpath "$(dirname "$0")/../build/headlab")
rounds=${1:-3}; shift || true
sweep=("$@")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
step_ms() {  # ms per training step from the final window's tokens/s (one eval, at the end)
  python3 -c "import json,sys; m=[json.loads(l) for l in open(sys.argv[1])][-1]; print(f'{64*33/m[\"tokens_per_s\"]*1000:.3f}')" "$1"
}
declare -a s1 s2 a1 a2
for r in $(seq 1 "$rounds"); do
  env -u OPENBLAS_CORETYPE "$HL" train --steps 400 --eval-every 400 --eval-size 64 --threads 2 --quiet --out "$W/s1-$r" >/dev/null 2>&1
  s1+=("$(step_ms "$W/s1-$r/metrics.jsonl")")
  env -u OPENBLAS_CORETYPE "${MPIRUN[@]}" -np 2 "$HL" train --steps 400 --eval-every 400 --eval-size 64 --threads 1 --quiet --out "$W/s2-$r" >/dev/null 2>&1
  s2+=("$(step_ms "$W/s2-$r/metrics.jsonl")")
  t0=$(date +%s.%N); env -u OPENBLAS_CORETYPE "$HL" ablate --threads 2 --quiet --out "$W/a1-$r" "${sweep[@]}" >/dev/null 2>&1
  a1+=("$(python3 -c "print(round($(date +%s.%N) - $t0, 2))")")
  t0=$(date +%s.%N); env -u OPENBLAS_CORETYPE "${MPIRUN[@]}" -np 2 "$HL" ablate --threads 1 --quiet --out "$W/a2-$r" "${sweep[@]}" >/dev/null 2>&1
  a2+=("$(python3 -c "print(round($(date +%s.%N) - $t0, 2))")")
  echo "round $r: S step ${s1[-1]} vs ${s2[-1]} ms, sweep ${a1[-1]} vs ${a2[-1]} s" >&2
done
python3 - "${s1[*]}" "${s2[*]}" "${a1[*]}" "${a2[*]}" <<'EOF'
import statistics as st, sys
s1, s2, a1, a2 = ([float(x) for x in v.split()] for v in sys.argv[1:5])
print("what                                  1 process x 2 threads  2 ranks x 1 thread  ranks / threads")
print(f"S training step, ms (median)            {st.median(s1):>20.2f}  {st.median(s2):>18.2f}  {st.median(s2)/st.median(s1):>14.2f}x")
print(f"sweep wall time, s (median)            {st.median(a1):>20.1f}  {st.median(a2):>18.1f}  {st.median(a2)/st.median(a1):>14.2f}x")
print(f"({len(s1)} rounds alternated; S step from tokens/s over 400 steps)")
EOF
