#!/usr/bin/env bash
# Silent wrong results, refusals and acceptance, messages: a resume or fork on a changed data
# file, a snapshot of another run under --run, NaN from an intervention, empty list flags, valid
# input that must work, and messages that must name the flag or file without library internals.
# Every command runs under `timeout` in a temporary directory removed at the end.
# Usage: hostile_results_test.sh path/to/headlab
HL_USAGE=hostile_results_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/harness.sh"
# run SECS cmd...: rc, stdout in $T/out, stderr in $T/err
run() { local secs=$1; shift; timeout -k 3 "$secs" "$@" >"$T/out" 2>"$T/err"; rc=$?; }
# refused NAME SECS MUST NOT -- cmd...: exit 1..123; the output matches every extended regex of
# MUST (';;'-separated, case-insensitive) and none of NOT (if given)
refused() {
  local name=$1 secs=$2 must=$3 not=$4; shift 5
  run "$secs" "$@"
  local why=""
  if [ "$rc" = 0 ] || [ "$rc" -ge 124 ]; then why="exit $rc"; fi
  if [ -z "$why" ]; then
    local IFS=';' re; local -; set -f
    for re in ${must//;;/;}; do
      [ -z "$re" ] && continue
      grep -qiE -- "$re" "$T/out" "$T/err" || { why="message lacks /$re/"; break; }
    done
  fi
  if [ -z "$why" ] && [ -n "$not" ] && grep -qiE -- "$not" "$T/out" "$T/err"; then why="message contains /$not/"; fi
  if [ -z "$why" ]; then ok "$name (exit $rc)"; else bad "$name: $why" "$T/err"; fi
}
succeeds() {
  local name=$1 secs=$2; shift 3
  run "$secs" "$@"
  if [ "$rc" = 0 ]; then ok "$name"; else bad "$name: exit $rc" "$T/err"; fi
}

tiny="--d-model 16 --layers 1 --heads 2 --d-ff 32 --batch 8 --eval-size 16 --threads 1 --quiet"
small="$tiny --length 4 --alphabet 5"

# ---- fixtures ---------------------------------------------------------------------------------------
run 60 "$HL" train $small --steps 10 --snapshot-at 0,5 --out "$T/run"
[ "$rc" = 0 ] || { bad "fixture: small run (exit $rc)" "$T/err"; echo "$pass passed, $fail failed"; exit 1; }
M="$T/run/model.safetensors"
"$PY" - "$T" <<'PY'
import random, struct, sys
T = sys.argv[1]
def npy(path, ids, n, l):
    h = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d, %d), }" % (n, l)
    h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
    open(path, "wb").write(b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h.encode() + struct.pack("<%di" % len(ids), *ids))
r = random.Random(0)
npy(T + "/ids.npy", [r.randrange(10) for _ in range(40 * 8)], 40, 8)
npy(T + "/ids_other.npy", [r.randrange(10) for _ in range(40 * 8)], 40, 8)  # same size, other tokens
PY

# ---- a resume or fork on a changed data file is refused, naming the file ------------------------------
cp "$T/ids.npy" "$T/data.npy"
run 60 "$HL" train --task tokens --data "$T/data.npy" $tiny --steps 4 --snapshot-at 2 --out "$T/tok"
[ "$rc" = 0 ] || bad "fixture: tokens run (exit $rc)" "$T/err"
succeeds "resume on the unchanged data file" 60 -- "$HL" train --resume --steps 6 --quiet --out "$T/tok"
cp "$T/ids_other.npy" "$T/data.npy"
refused "resume after the data file changed: refused naming it" 60 'data\.npy;;changed' "" -- \
  "$HL" train --resume --steps 8 --quiet --out "$T/tok"
refused "fork after the data file changed: refused naming it" 60 'data\.npy;;changed' "" -- \
  "$HL" train --fork "$T/tok" --at 2 --quiet --out "$T/tokfork"
if [ -e "$T/tokfork/checkpoint.safetensors" ]; then bad "refused fork left a checkpoint"; else ok "refused fork left no checkpoint"; fi

# ---- --run refuses a snapshot of another run ------------------------------------------------------
run 60 "$HL" train $small --steps 10 --snapshot-at 0,5 --seed 7 --out "$T/other"
[ "$rc" = 0 ] || bad "fixture: a run of another seed (exit $rc)" "$T/err"
cp -r "$T/run" "$T/mixed"
cp "$T/other/snapshots/step_00000005.safetensors" "$T/mixed/snapshots/step_00000005.safetensors"
refused "detect --run with another seed's snapshot: refused naming the file and the seed" 60 \
  'step_00000005;;seed;;another run' "" -- "$HL" detect --run "$T/mixed" --examples 4 --out "$T/o_mixed"
succeeds "detect --run on the run's own snapshots" 60 -- "$HL" detect --run "$T/run" --examples 4 --out "$T/o_run"

# ---- NaN from an intervention is an error naming it, not a metric --------------------------------
refused "knockout of ln1.hook_scale (NaN logits): refused naming the hook and non-finite logits" 60 \
  'blocks\.0\.ln1\.hook_scale;;non-finite' '' -- \
  "$HL" knockout --checkpoint "$M" --hook blocks.0.ln1.hook_scale --examples 8 --out "$T/o_ko"
if [ -e "$T/o_ko/knockout.json" ]; then bad "knockout with NaN logits wrote knockout.json"; else ok "knockout with NaN logits wrote no knockout.json"; fi

# ---- empty values of flags are refused naming the flag ---------------------------------------------
refused "edges --path-from '': refused naming the flag" 30 '--path-from;;empty' "" -- \
  "$HL" edges --checkpoint "$M" --examples 4 --path-from '' --out "$T/o_e1"
if [ -e "$T/o_e1" ]; then bad "edges --path-from '' wrote $T/o_e1"; else ok "edges --path-from '' wrote nothing"; fi
refused "edges --to '': refused naming the flag" 30 '--to;;empty' "" -- \
  "$HL" edges --checkpoint "$M" --examples 4 --path-from L0H0 --to '' --out "$T/o_e2"
refused "patch --axes '': refused naming the flag" 30 '--axes;;empty' "" -- \
  "$HL" patch --checkpoint "$M" --examples 4 --hook hook_z --axes '' --out "$T/o_p"
refused "knockout --positions ' ': refused naming the flag" 30 '--positions;;empty' "" -- \
  "$HL" knockout --checkpoint "$M" --hook blocks.0.attn.hook_z --positions ' ' --out "$T/o_k"
# empty items of comma lists (CLI11 would drop them), in each spelling; lists split by the command
refused "ablate --head-counts 1,,2: refused naming the flag" 30 '--head-counts;;empty item' "" -- \
  "$HL" ablate --head-counts 1,,2 --steps 1 --out "$T/o_hc"
refused "train --snapshot-at=0,5,: refused naming the flag" 30 '--snapshot-at;;empty item' "" -- \
  "$HL" train $small --steps 5 --snapshot-at=0,5, --out "$T/o_sa"
if [ -e "$T/o_hc" ] || [ -e "$T/o_sa" ]; then bad "empty list items: a directory was written"; else ok "empty list items: nothing written"; fi
refused "knockout --positions 1,,2: refused naming the flag" 30 '--positions' "" -- \
  "$HL" knockout --checkpoint "$M" --hook blocks.0.attn.hook_z --positions 1,,2 --out "$T/o_k2"

# ---- valid input is accepted ---------------------------------------------------------------------
for i in $(seq 40); do printf 'the quick brown fox jumps over the lazy dog. '; done > "$T/lm.txt"
run 60 "$HL" train --task text --data "$T/lm.txt" --length 8 $tiny --steps 3 --out "$T/lm"
[ "$rc" = 0 ] || bad "fixture: byte-level text run (exit $rc)" "$T/err"
run 60 "$HL" export "$T/lm" --out "$T/gpt2dir"
[ "$rc" = 0 ] || bad "fixture: export to a GPT-2 directory (exit $rc)" "$T/err"
succeeds "attn --checkpoint GPT2DIR --tokens (a vocabulary of no task)" 60 -- \
  "$HL" attn --checkpoint "$T/gpt2dir" --tokens '1 2 3 4' --out "$T/o_attn"
succeeds "prune --checkpoint RUNDIR" 120 -- "$HL" prune --checkpoint "$T/run" --random-seeds 1 --quiet --out "$T/o_prune"

# ---- messages ----------------------------------------------------------------------------------
cp -r "$T/run" "$T/broken"
"$PY" - "$T/broken/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); s["final"]["loss"] = None; json.dump(s, open(sys.argv[1], "w"))
PY
refused "compare of a run with a damaged summary: names the run, no --force, no json.exception" 60 \
  'broken' '--force|json\.exception' -- "$HL" compare "$T/run" "$T/broken" --out "$T/o_cmp"
refused "dla --text non-UTF-8: names --text, no advice to rename a file" 30 '--text;;utf-8' 'rename' -- \
  "$HL" dla --checkpoint "$M" --text $'ab\xffcd' --out "$T/o_dla"

# ---- memory: ulimit -v is the memory there is, so the estimate refuses before the work --------------
# (not for a sanitizer build: its shadow memory needs the address space a cap takes away)
if grep -qa __asan_init "$HL"; then CAP=0; else CAP=1; fi
if [ "$CAP" = 1 ]; then
run 60 bash -c "ulimit -v 600000; exec \"\$0\" \"\$@\"" "$HL" edges --checkpoint "$M" --examples 20000 --out "$T/o_mem"
if [ "$rc" -ge 1 ] && [ "$rc" -lt 124 ] && grep -qE -- '--examples' "$T/err" && grep -qE 'needs about [0-9.]+ [KMG]iB' "$T/err" &&
   ! grep -q 'bad_alloc' "$T/err"; then ok "edges under ulimit -v: refused with the estimate and --examples (exit $rc)"
else bad "edges under ulimit -v: exit $rc" "$T/err"; fi
fi

# ---- match: an estimate before the work, a refusal naming --examples when it does not fit ---------
run 5 "$HL" match --checkpoint "$M" --checkpoint "$M" --examples 1000000 --threads 1 --out "$T/o_match"
if grep -qE '^headlab match: about [0-9.]+ [KMG]iB of memory for 1000000 probe rows in about 125000 forward passes' "$T/err"
then ok "match --examples 1000000: the estimate comes first"; else bad "match --examples 1000000: no estimate (exit $rc)" "$T/err"; fi
if [ "$CAP" = 1 ]; then
run 30 bash -c "ulimit -v 600000; exec \"\$0\" \"\$@\"" "$HL" match --checkpoint "$M" --checkpoint "$M" --examples 1000000 --out "$T/o_match2"
if [ "$rc" -ge 1 ] && [ "$rc" -lt 124 ] && grep -qE -- 'match: 1000000 probe rows.*needs about [0-9.]+ [KMG]iB.*lower --examples' "$T/err" && [ ! -e "$T/o_match2" ]
then ok "match under ulimit -v: refused naming --examples (exit $rc)"; else bad "match under ulimit -v: exit $rc" "$T/err"; fi
fi
run 60 "$HL" compare "$T/run" "$T/run" --examples 20 --threads 1 --out "$T/o_cmp_est"
if [ "$rc" = 0 ] && grep -qE '^headlab compare: about [0-9.]+ [KMG]?i?B of memory for 20 probe rows per run in about 30 forward passes' "$T/err"
then ok "compare: the estimate comes first"; else bad "compare: no estimate (exit $rc)" "$T/err"; fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
