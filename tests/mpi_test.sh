#!/usr/bin/env bash
# headlab under mpirun (2 ranks on this machine): a sweep shared among the ranks writes the
# same tables as one process; data-parallel training equals one process on the same global
# batch (to 1e-5) and is reproducible bit for bit; -np 1 equals no MPI; resume; a dead rank
# ends the job; commands that run in one process refuse.
# Usage: mpi_test.sh path/to/headlab
set -u
HL=$(realpath "${1:?usage: mpi_test.sh path/to/headlab}")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cd "$T" || exit 1
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
pass=0; fail=0
ok() { pass=$((pass+1)); echo "ok   $1"; }
bad() { fail=$((fail+1)); echo "FAIL $1"; [ -n "${2:-}" ] && sed 's/^/     /' "$2" | tail -8; }

# The results of a run without its wall-clock fields (tokens_per_s, wall_s, train_s, time_rel).
results() {
  python3 - "$1" <<'EOF'
import csv, json, sys
path = sys.argv[1]
clock = {"tokens_per_s", "wall_s", "train_s", "time_rel", "train_s_mean"}
if path.endswith(".jsonl"):
    for line in open(path):
        print(json.dumps({k: v for k, v in json.loads(line).items() if k not in clock}, sort_keys=True))
elif path.endswith(".csv"):
    for row in csv.DictReader(open(path)):
        print(",".join(f"{k}={v}" for k, v in row.items() if k not in clock))
else:
    def strip(x):
        if isinstance(x, dict): return {k: strip(v) for k, v in x.items() if k not in clock}
        if isinstance(x, list): return [strip(v) for v in x]
        return x
    print(json.dumps(strip(json.load(open(path))), sort_keys=True))
EOF
}
same_results() {  # same_results NAME FILE_A FILE_B (both must exist and hold results)
  if [ ! -s "$2" ] || [ ! -s "$3" ]; then bad "$1 (missing or empty: $2 / $3)"; return; fi
  if cmp -s <(results "$2") <(results "$3"); then ok "$1"; else bad "$1"; diff <(results "$2") <(results "$3") | head -6; fi
}

# constant lr after 5 warmup steps: a run resumed with more --steps follows the same schedule
small="--d-model 32 --layers 2 --heads 4 --d-ff 64 --batch 32 --eval-size 200 --eval-every 10 --threads 1 --quiet --schedule constant --warmup 5"

# ---- sweeps: ranks take runs as they become free; tables equal the single-process sweep's
"$HL" ablate --quick --threads 1 --quiet --out one >one.log 2>&1 || bad "1-process ablate --quick" one.log
"${MPIRUN[@]}" -np 2 "$HL" ablate --quick --threads 1 --quiet --out two >two.log 2>&1 || bad "2-rank ablate --quick" two.log
grep -q "2 ranks take the runs" two.log && ok "2-rank ablate says it shares the runs" || bad "2-rank ablate message" two.log
for f in ablation.csv ablation_runs.csv ablation.json; do same_results "2-rank ablate --quick: $f as one process" "one/$f" "two/$f"; done
for d in one/runs/*; do same_results "2-rank ablate: $(basename "$d") metrics as one process" "$d/metrics.jsonl" "two/runs/$(basename "$d")/metrics.jsonl"; done
# rerun with another number of ranks: every run is finished and read back
"${MPIRUN[@]}" -np 2 "$HL" ablate --quick --threads 1 --out one >rerun.log 2>&1 && [ "$(grep -c "already done" rerun.log)" = 5 ] \
  && ok "rerun of a finished sweep under 2 ranks reads all 5 runs back" || bad "rerun under 2 ranks" rerun.log
# an interrupted sweep: remove two finished runs, rerun under 2 ranks: only they are trained again
rm -rf one/runs/H4-seed0 one/runs/H16-seed0
"${MPIRUN[@]}" -np 2 "$HL" ablate --quick --threads 1 --out one >resume.log 2>&1 || bad "2-rank sweep resume" resume.log
[ "$(grep -c "already done" resume.log)" = 3 ] && ok "2-rank sweep resume trains only the 2 missing runs" || bad "2-rank sweep resume counts" resume.log
same_results "resumed sweep table as before" one/ablation.csv two/ablation.csv

# ---- data-parallel training
"$HL" train $small --steps 30 --out alone >alone.log 2>&1 || bad "1-process train" alone.log
"${MPIRUN[@]}" -np 1 "$HL" train $small --steps 30 --out np1 >np1.log 2>&1 || bad "1-rank train" np1.log
same_results "-np 1 metrics equal the run without MPI" alone/metrics.jsonl np1/metrics.jsonl
cmp -s alone/model.safetensors np1/model.safetensors && ok "-np 1 weights equal the run without MPI bit for bit" || bad "-np 1 weights differ"
"${MPIRUN[@]}" -np 2 "$HL" train $small --steps 30 --out dp1 >dp1.log 2>&1 || bad "2-rank train" dp1.log
"${MPIRUN[@]}" -np 2 "$HL" train $small --steps 30 --out dp2 >dp2.log 2>&1 || bad "2-rank train again" dp2.log
grep -q "data-parallel over 2 ranks: 16 of the 32 sequences" dp1.log && ok "2-rank train says how the batch is split" || bad "2-rank train message" dp1.log
same_results "two 2-rank runs: identical metrics" dp1/metrics.jsonl dp2/metrics.jsonl
python3 -c "import json,sys; sys.exit(0 if [json.load(open(f))['ranks'] for f in sys.argv[1:]] == [2, 1] else 1)" \
  dp1/summary.json alone/summary.json && ok "summary.json records the ranks (2 and 1)" || bad "ranks in summary.json"
cmp -s dp1/model.safetensors dp2/model.safetensors && ok "two 2-rank runs: identical weights" || bad "two 2-rank runs: weights differ"
python3 - alone/metrics.jsonl dp1/metrics.jsonl <<'EOF' && ok "2-rank metrics equal one process on the same global batch to 1e-5" || bad "2-rank vs one process"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [x["step"] for x in a] == [x["step"] for x in b], "different eval steps"
worst = 0.0
for x, y in zip(a, b):
    for k in ("loss", "token_acc", "exact_match", "lr"):
        rel = abs(x[k] - y[k]) / max(abs(x[k]), 1e-30)
        worst = max(worst, rel)
        assert rel <= 1e-5, f"step {x['step']} {k}: {x[k]} vs {y[k]} (relative {rel:.2e})"
print(f"     largest relative difference {worst:.2e}")
EOF
# resume with the same number of ranks continues bit for bit
"${MPIRUN[@]}" -np 2 "$HL" train $small --steps 20 --checkpoint-every 10 --out dpr >dpr.log 2>&1 || bad "2-rank train to 20" dpr.log
"${MPIRUN[@]}" -np 2 "$HL" train --resume --steps 30 --quiet --out dpr >dpr2.log 2>&1 || bad "2-rank resume" dpr2.log
# (the first part ended at step 20, so its last line has the greedy exact match an end of run adds)
tail -1 dp1/metrics.jsonl >dp1.last.jsonl; tail -1 dpr/metrics.jsonl >dpr.last.jsonl
same_results "2-rank resume: final metrics equal the uninterrupted 2-rank run" dp1.last.jsonl dpr.last.jsonl
cmp -s dp1/model.safetensors dpr/model.safetensors && ok "2-rank resume: identical weights" || bad "2-rank resume: weights differ"
# --bind-to none: each rank may use both cores, so the 1 comes from sharing them, not from binding
grep -q ", 1 threads ->" <("${MPIRUN[@]}" --bind-to none -np 2 "$HL" train --d-model 16 --layers 1 --heads 2 --d-ff 16 --batch 4 --eval-size 8 --steps 1 --out thr 2>&1) \
  && ok "under mpirun -np 2 each rank takes 1 of the 2 cores by default" || bad "threads per rank"

# dropout: masks come from (seed, step, rank), so a resumed run draws the same ones
"${MPIRUN[@]}" -np 2 "$HL" train $small --dropout 0.1 --steps 30 --out do1 >do1.log 2>&1 || bad "2-rank train with dropout" do1.log
"${MPIRUN[@]}" -np 2 "$HL" train $small --dropout 0.1 --steps 20 --checkpoint-every 10 --out do2 >do2.log 2>&1 || bad "2-rank dropout to 20" do2.log
"${MPIRUN[@]}" -np 2 "$HL" train --resume --steps 30 --quiet --out do2 >do3.log 2>&1 || bad "2-rank dropout resume" do3.log
cmp -s do1/model.safetensors do2/model.safetensors && ok "2-rank dropout run resumes bit for bit" || bad "2-rank dropout resume differs"

# ---- Ctrl-C: every rank stops at the same step, rank 0 writes the checkpoint and an unfinished summary
"${MPIRUN[@]}" -np 2 "$HL" train $small --steps 1000000 --checkpoint-every 100000 --out cc >cc.log 2>&1 &
mp=$!
for _ in $(seq 1 300); do grep -q '"step":20' cc/metrics.jsonl 2>/dev/null && break; sleep 0.1; done
kill -INT $mp
for _ in $(seq 1 300); do kill -0 $mp 2>/dev/null || break; sleep 0.1; done
if kill -0 $mp 2>/dev/null; then bad "2-rank train still running 30 s after Ctrl-C" cc.log; pkill -9 -P $mp; kill -9 $mp; fi
wait $mp
grep -q "interrupted: stopped at step .*continue with: mpirun -np 2 headlab train --resume" cc.log \
  && python3 -c "import json,sys; s=json.load(open('cc/summary.json')); sys.exit(0 if s['finished'] is False and s['steps'] > 0 else 1)" \
  && "$HL" grads --checkpoint cc/checkpoint.safetensors --task copy --batch-size 4 --out cc.grads.safetensors >/dev/null 2>&1 \
  && ok "Ctrl-C under 2 ranks: one stop step, checkpoint and unfinished summary written" || bad "Ctrl-C under 2 ranks" cc.log

# ---- a rank that dies ends the job (non-zero, within 30 s), and the last checkpoint loads
"${MPIRUN[@]}" -np 2 "$HL" train $small --steps 100000 --checkpoint-every 5 --out dead >dead.log 2>&1 &
mp=$!
for _ in $(seq 1 300); do [ -e dead/checkpoint.safetensors ] && break; sleep 0.1; done
victim=""
for p in $(pgrep -P $mp); do tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && victim=$p; done
if [ -z "$victim" ]; then bad "found rank 1 to kill" dead.log; kill -9 $mp; else
  kill -9 "$victim"; start=$(date +%s)
  for _ in $(seq 1 300); do kill -0 $mp 2>/dev/null || break; sleep 0.1; done
  if kill -0 $mp 2>/dev/null; then bad "job still running 30 s after rank 1 died" dead.log; pkill -9 -P $mp; kill -9 $mp
  else
    wait $mp; rc=$?; took=$(( $(date +%s) - start ))
    [ $rc -ne 0 ] && ok "rank 1 killed: mpirun exits $rc after ${took} s" || bad "rank 1 killed but exit 0" dead.log
  fi
fi
"$HL" grads --checkpoint dead/checkpoint.safetensors --task copy --batch-size 4 --out dead.grads.safetensors >g.log 2>&1 \
  && ok "the last checkpoint of the killed job loads" || bad "checkpoint after a dead rank" g.log
ckpt_step=$(python3 -c "
import json, struct, sys
f = open('dead/checkpoint.safetensors', 'rb'); n = struct.unpack('<Q', f.read(8))[0]
print(json.loads(json.loads(f.read(n))['__metadata__']['train_state'])['step'])")
"${MPIRUN[@]}" -np 2 "$HL" train --resume --steps $((ckpt_step + 5)) --quiet --out dead >dead2.log 2>&1 \
  && grep -q "\"step\":$((ckpt_step + 5))" dead/metrics.jsonl && ok "the killed job resumes from step $ckpt_step with 2 ranks" \
  || bad "resume after a dead rank" dead2.log

# ---- commands that run in one process refuse under several ranks, once
"${MPIRUN[@]}" -np 2 "$HL" prune --out p >p.log 2>&1
[ $? -ne 0 ] && [ "$(grep -c "headlab prune runs in one process" p.log)" = 1 ] && [ ! -e p ] \
  && ok "prune under 2 ranks refuses with one message" || bad "prune under 2 ranks" p.log
# a mistyped flag: every rank parses it, rank 0 alone says so
"${MPIRUN[@]}" -np 2 "$HL" train --stpes 5 --out typo >typo.log 2>&1
[ $? -ne 0 ] && [ "$(grep -c "stpes" typo.log)" = 1 ] && [ ! -e typo ] \
  && ok "a flag typo under 2 ranks gets one message" || bad "flag typo under 2 ranks" typo.log

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
