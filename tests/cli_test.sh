#!/usr/bin/env bash
# End-to-end checks of the headlab command: help, bad input (one clear message, non-zero
# exit, no output file), and checkpoints that survive kill -9.
# Usage: cli_test.sh path/to/headlab
set -u
HL=${1:?usage: cli_test.sh path/to/headlab}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
check() {  # check NAME EXPECTED_EXIT PATTERN -- command...
  local name=$1 want=$2 pattern=$3; shift 4
  "$@" >"$T/out" 2>"$T/err"; local rc=$?
  if { [ "$want" = nonzero ] && [ $rc -ne 0 ]; } || [ "$rc" = "$want" ]; then
    if grep -qE -- "$pattern" "$T/out" "$T/err"; then pass=$((pass+1)); echo "ok   $name"; return; fi
  fi
  fail=$((fail+1)); echo "FAIL $name (exit $rc)"; sed 's/^/     /' "$T/err" | head -5
}
small="--d-model 16 --layers 1 --heads 2 --d-ff 32 --length 4 --alphabet 5 --batch 8 --eval-size 16 --threads 1"

check "help lists subcommands" 0 "train.*grads|grads" -- "$HL" --help
check "train --help shows defaults" 0 "--d-model.*64" -- "$HL" train --help
check "train --help shows --resume" 0 "--resume" -- "$HL" train --help
check "unknown flag" nonzero "--bogus" -- "$HL" train --bogus
check "non-positive size" nonzero "d_model must be positive, got 0" -- "$HL" train --d-model 0 --out "$T/x"
check "heads must divide d_model" nonzero "n_heads 3 does not divide d_model 64" -- "$HL" train --heads 3 --out "$T/x"
check "kv-heads must divide heads" nonzero "n_kv_heads 3 must divide n_heads 4" -- "$HL" train --kv-heads 3 --out "$T/x"
check "bad choice" nonzero "norm" -- "$HL" train --norm middle
check "missing checkpoint" nonzero "/nonexistent.safetensors: cannot open" -- "$HL" grads --checkpoint /nonexistent.safetensors --out "$T/g.st"

# A small run to have a real checkpoint.
check "small run" 0 "token accuracy" -- "$HL" train $small --steps 30 --eval-every 10 --out "$T/run"
check "summary written" 0 "peak_rss_kb" -- cat "$T/run/summary.json"
check "metrics written" 0 '"step":30' -- cat "$T/run/metrics.jsonl"
head -c 100 "$T/run/model.safetensors" > "$T/trunc.safetensors"
check "truncated checkpoint" nonzero "trunc.safetensors: not a valid safetensors file" -- "$HL" grads --checkpoint "$T/trunc.safetensors" --out "$T/g1.st"
[ ! -e "$T/g1.st" ] && { pass=$((pass+1)); echo "ok   no output after a failure"; } || { fail=$((fail+1)); echo "FAIL output written after a failure"; }
printf '\x0e\x00\x00\x00\x00\x00\x00\x00{"a": [1, 2, 3' > "$T/bad.safetensors"
check "corrupt header" nonzero "header is not valid JSON" -- "$HL" attn --checkpoint "$T/bad.safetensors" --out "$T/a"
check "resume with other model" nonzero "--d-model 32 does not match the run being resumed \(16" -- "$HL" train --d-model 32 --steps 40 --resume --out "$T/run"
check "refuse to overwrite a run" nonzero "already holds a run" -- "$HL" train $small --steps 30 --out "$T/run"
check "resume to more steps" 0 "token accuracy" -- "$HL" train --steps 40 --resume --out "$T/run"
check "grads from task" 0 "wrote .* gradients" -- "$HL" grads --checkpoint "$T/run/model.safetensors" --batch-size 2 --out "$T/g.st"
check "attn with tokens" 0 "attn.safetensors" -- "$HL" attn --checkpoint "$T/run/model.safetensors" --tokens "6 1 2 3 4 7 1 2" --out "$T/attn"
check "attn rejects bad token" nonzero "id 99 outside the vocabulary" -- "$HL" attn --checkpoint "$T/run/model.safetensors" --tokens "6 99" --out "$T/attn2"

# kill -9 at arbitrary moments: the last checkpoint always loads, and --resume finishes.
"$HL" train $small --steps 100000 --checkpoint-every 1 --eval-every 1000 --quiet --out "$T/kill" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 300); do [ -f "$T/kill/checkpoint.safetensors" ] && break; sleep 0.1; done  # first checkpoint
ok=1
for i in 1 2 3 4 5 6; do
  sleep 0.$((RANDOM % 4 + 2))
  kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
  if [ -f "$T/kill/checkpoint.safetensors" ]; then
    "$HL" grads --checkpoint "$T/kill/checkpoint.safetensors" --batch-size 1 --out "$T/k.st" >/dev/null 2>"$T/kerr" || { ok=0; cat "$T/kerr"; }
  fi
  "$HL" train --resume --steps 100000 --quiet --out "$T/kill" >/dev/null 2>&1 &
  pid=$!
done
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
[ $ok = 1 ] && [ -f "$T/kill/checkpoint.safetensors" ] && { pass=$((pass+1)); echo "ok   checkpoint survives kill -9 (6 kills)"; } \
  || { fail=$((fail+1)); echo "FAIL checkpoint after kill -9"; }

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
