#!/usr/bin/env bash
# Hostile input for the headlab command: files that lie about their size, special files, signals,
# shell metacharacters, out-of-range requests and messages that leaked library internals. Every
# command runs under `timeout` (a crash or a hang is a failure, never a stuck test), in a
# temporary directory that is removed at the end.
# Usage: hostile_test.sh path/to/headlab
HL_USAGE=hostile_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/harness.sh"

# run SECS cmd...: runs cmd under timeout (TERM, then KILL 3 s later); sets rc and ms (wall),
# stdout in $T/out, stderr in $T/err. A timed-out command has rc 124 (or 137 if TERM was ignored).
run() {
  local secs=$1; shift
  local s; s=$(date +%s%N)
  timeout -k 3 "$secs" "$@" >"$T/out" 2>"$T/err"; rc=$?
  ms=$(( ($(date +%s%N) - s) / 1000000 ))
}
# verdict of the last run for a refusal: "" when it is a clean refusal (exit 1..127, not a timeout)
refusal_problem() {
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then echo "timed out (exit $rc after ${ms} ms)"
  elif [ "$rc" = 0 ]; then echo "accepted (exit 0)"
  elif [ "$rc" -ge 128 ]; then echo "killed by signal $((rc - 128)) (exit $rc)"
  fi
}
# refused NAME SECS MUST NOT -- cmd...: cmd must exit 1..127 within SECS, its output must match
# every extended regex of MUST (separated by ';;', case-insensitive) and none of NOT (if given).
refused() {
  local name=$1 secs=$2 must=$3 not=$4; shift 5
  run "$secs" "$@"
  local why; why=$(refusal_problem)
  if [ -z "$why" ]; then
    local IFS=';' re; local -; set -f   # the regexes are not globs
    for re in ${must//;;/;}; do
      [ -z "$re" ] && continue
      grep -qiE -- "$re" "$T/out" "$T/err" || { why="message lacks /$re/"; break; }
    done
  fi
  if [ -z "$why" ] && [ -n "$not" ] && grep -qiE -- "$not" "$T/out" "$T/err"; then why="message contains /$not/"; fi
  if [ -z "$why" ]; then ok "$name (exit $rc, ${ms} ms)"; else bad "$name: $why" "$T/err"; fi
}
# succeeds NAME SECS -- cmd...: exit 0 within SECS
succeeds() {
  local name=$1 secs=$2; shift 3
  run "$secs" "$@"
  if [ "$rc" = 0 ]; then ok "$name (${ms} ms)"; else bad "$name: exit $rc after ${ms} ms" "$T/err"; fi
}

small="--d-model 16 --layers 1 --heads 2 --d-ff 32 --length 4 --alphabet 5 --batch 8 --eval-size 16 --threads 1"
tiny="--d-model 16 --layers 1 --heads 2 --d-ff 32 --batch 4 --threads 1 --quiet"

# tokens_refused NAME MUST NOT FILE: `train --task tokens --data $T/FILE` is refused (see refused)
tokens_refused() {
  refused "$1" 20 "$2" "$3" -- "$HL" train --task tokens --data "$T/$4" $tiny --steps 2 --out "$T/o_${4%%.*}"
}

# ---- fixtures: a small trained copy model, a text model, token files ---------------------------
run 60 "$HL" train $small --steps 30 --eval-every 10 --quiet --out "$T/run"
[ "$rc" = 0 ] || { bad "fixture: small train run (exit $rc)" "$T/err"; echo "$pass passed, $fail failed"; exit 1; }
M="$T/run/model.safetensors"
for i in $(seq 60); do printf 'the quick brown fox jumps over the lazy dog. '; done > "$T/lm.txt"
run 60 "$HL" train --task text --data "$T/lm.txt" --length 8 $tiny --eval-size 16 --steps 5 --out "$T/lm"
[ "$rc" = 0 ] || bad "fixture: text run (exit $rc)" "$T/err"

"$PY" - "$T" <<'PY'
import json, random, struct, sys
T = sys.argv[1]
def npy(path, descr, shape, body=b"\0" * 64):  # a .npy whose header says `shape`, whatever the body
    h = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
    open(path, "wb").write(b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h.encode() + body)
def st(path, tensors):  # safetensors: name -> (dtype, shape, bytes)
    h, off, body = {}, 0, b""
    for n, (dt, shape, data) in tensors.items():
        h[n] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data); body += data
    hb = json.dumps(h).encode(); hb += b" " * ((8 - len(hb) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + body)
def i32(v): return struct.pack("<%di" % len(v), *v)
r = random.Random(0); N, L = 40, 8
ids = [r.randrange(10) for _ in range(N * L)]
npy(T + "/huge.npy", "<i4", "(%d, %d)" % (2**40, 2**40))
npy(T + "/wide.npy", "<i4", "(1, %d)" % 2**62)
npy(T + "/negshape.npy", "<i4", "(-5, 16)", i32([1] * 80))
npy(T + "/ids.npy", "<i4", "(%d, %d)" % (N, L), i32(ids))
st(T + "/maskzero.safetensors", {"input_ids": ("I32", [N, L], i32(ids)), "loss_mask": ("I32", [N, L], i32([0] * (N * L)))})
st(T + "/minusone.safetensors", {"input_ids": ("I32", [N, L], i32(ids)), "targets": ("I32", [N, L], i32([-1] * (N * L)))})
st(T + "/onecolumn.safetensors", {"input_ids": ("I32", [N, 1], i32(ids[:N]))})
st(T + "/maxid.safetensors", {"input_ids": ("I32", [20, 4], i32([1, 2, 3, 2**31 - 1] * 20))})
st(T + "/id24.safetensors", {"input_ids": ("I32", [20, 4], i32([1, 2, 3, 2**24] * 20))})
st(T + "/emptypattern.safetensors", {"pattern": ("F32", [0, 0], b"")})
PY

# ---- crashes: a .npy header declaring (2^40, 2^40) -------------------------------------------
tokens_refused "npy header (2^40, 2^40): refused naming the file" 'huge\.npy' "" huge.npy

# ---- hangs -------------------------------------------------------------------------------------
refused "prune --method l0 --lambda 0 --target-heads 1: refused naming --lambda" 10 '--lambda' "" -- \
  "$HL" prune --checkpoint "$M" --method l0 --lambda 0 --target-heads 1 --l0-steps 5 --quiet --out "$T/o_l0"

mkfifo "$T/qq_named"; mkdir "$T/datadir"; truncate -s 200G "$T/sparse.txt"
special='regular file|not a file|directory|fifo|pipe|device|special'
refused "--data FIFO: refused quickly as not a regular file" 8 "qq_named;;$special" "" -- \
  "$HL" train --task text --data "$T/qq_named" $tiny --steps 2 --out "$T/o_fifo"
refused "--data /dev/zero: refused quickly as not a regular file" 8 "/dev/zero;;$special" "" -- \
  "$HL" train --task text --data /dev/zero $tiny --steps 2 --out "$T/o_zero"
refused "--data DIRECTORY: refused as not a regular file" 8 "datadir;;$special" "" -- \
  "$HL" train --task text --data "$T/datadir" $tiny --steps 2 --out "$T/o_dir"
refused "--data sparse 200 GB file: refused quickly naming memory" 8 "sparse\.txt;;memory" "" -- \
  "$HL" train --task text --data "$T/sparse.txt" $tiny --steps 2 --out "$T/o_sparse"
rm -f "$T/sparse.txt"

cores=$(nproc)
run 60 "$HL" train ${small% --threads 1} --steps 10 --threads 1024 --out "$T/threads"
nwarn=$(grep -c -- '--threads' "$T/err")
tsum=$(grep -o '"threads": *[0-9]*' "$T/threads/summary.json" 2>/dev/null | grep -o '[0-9]*$' | sort -n | tail -1)
if [ "$rc" = 0 ] && [ "$nwarn" = 1 ] && grep -- '--threads' "$T/err" | grep -qw -- "$cores" \
   && [ -n "$tsum" ] && [ "$tsum" -le "$cores" ]; then ok "--threads 1024: one warning naming --threads and $cores cores, summary records $tsum"
else bad "--threads 1024: exit $rc, $nwarn warning lines naming --threads (want 1, with $cores), summary threads '${tsum:-none}'" "$T/err"; fi

if command -v mpirun >/dev/null 2>&1; then
  MPIRUN=(env ASAN_OPTIONS=detect_leaks=0 mpirun --allow-run-as-root --oversubscribe)  # Open MPI's own allocations
  mpi() {  # mpi NAME MUST -- flags of rank 0 :: flags of rank 1
    local name=$1 must=$2; shift 3
    local a=() b=() side=a
    for x in "$@"; do if [ "$x" = "::" ]; then side=b; elif [ $side = a ]; then a+=("$x"); else b+=("$x"); fi; done
    rm -rf "$T/mp"
    refused "$name" 30 "$must" "" -- "${MPIRUN[@]}" -np 1 "$HL" train $small --quiet "${a[@]}" --out "$T/mp" : \
      -np 1 "$HL" train $small --quiet "${b[@]}" --out "$T/mp"
  }
  mpi "mpirun: ranks with different --steps refused naming --steps" \
    '--steps|steps.*(rank|differ|disagree|mismatch|same)|(rank|differ|disagree|mismatch|same).*steps' -- --steps 20 :: --steps 30
  mpi "mpirun: ranks with different --seed refused naming --seed" \
    '--seed|seed.*(rank|differ|disagree|mismatch|same)|(rank|differ|disagree|mismatch|same).*seed' -- --steps 20 --seed 1 :: --steps 20 --seed 2
  mpi "mpirun: a bad flag on rank 1 ends the job naming the flag" '--bogus-flag' -- --steps 20 :: --steps 20 --bogus-flag
else
  echo "skip MPI cases (no mpirun)"
fi

# ---- signals: detect and patch stop on SIGTERM (143) and SIGINT (130); train on SIGINT (130) -------
signal_case() {  # signal_case NAME SIG WANT_RC OUTDIR -- cmd...
  local name=$1 sig=$2 want=$3 dir=$4; shift 5
  "$@" >"$T/sig.out" 2>"$T/sig.err" &
  local pid=$! i
  sleep 1
  if ! kill -0 $pid 2>/dev/null; then wait $pid; bad "$name: finished before the signal (exit $?); make it longer" "$T/sig.err"; return; fi
  kill -"$sig" $pid
  for i in $(seq 50); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  if kill -0 $pid 2>/dev/null; then kill -9 $pid; wait $pid 2>/dev/null; bad "$name: still running 5 s after SIG$sig" "$T/sig.err"; return; fi
  wait $pid; local r=$?
  if [ "$r" = "$want" ]; then ok "$name (exit $r)"; else bad "$name: exit $r, want $want" "$T/sig.err"; fi
}
signal_case "detect: SIGTERM -> exit 143" TERM 143 x -- "$HL" detect --checkpoint "$M" --examples 60000 --out "$T/sd1"
signal_case "detect: SIGINT -> exit 130" INT 130 x -- "$HL" detect --checkpoint "$M" --examples 60000 --out "$T/sd2"
signal_case "patch: SIGTERM -> exit 143" TERM 143 x -- "$HL" patch --checkpoint "$M" --examples 40000 --out "$T/sp1"
signal_case "patch: SIGINT -> exit 130" INT 130 x -- "$HL" patch --checkpoint "$M" --examples 40000 --out "$T/sp2"
# edges: a 4 x 4 model, so that most of the run is the per-receiver loop (interruptible between
# batches) rather than the clean and corrupted passes over every row (single operations)
run 60 "$HL" train --d-model 16 --layers 4 --heads 4 --d-ff 32 --length 4 --alphabet 5 --batch 8 --eval-size 16 --threads 1 --steps 2 --quiet --out "$T/run4"
signal_case "edges: SIGTERM -> exit 143" TERM 143 x -- "$HL" edges --checkpoint "$T/run4/model.safetensors" --examples 8000 --out "$T/se1"
signal_case "train: SIGINT mid-run -> exit 130" INT 130 x -- "$HL" train $small --steps 100000 --eval-every 1000 --quiet --out "$T/st"
[ -f "$T/st/checkpoint.safetensors" ] && ok "train: checkpoint present after SIGINT" || bad "train: no checkpoint after SIGINT"

# ---- shell: nothing from TMPDIR or token text reaches a shell ------------------------------------
mkdir -p "$T/cwd1/x;touch PWNED;#"
(cd "$T/cwd1" && TMPDIR='x;touch PWNED;#' run 60 "$HL" detect --checkpoint "$M" --examples 8 --out det; echo "$rc" >"$T/cwd1.rc")
if [ -z "$(find "$T/cwd1" -name PWNED)" ] && [ "$(cat "$T/cwd1.rc")" -lt 128 ]; then ok "TMPDIR='x;touch PWNED;#' detect: no PWNED"
else bad "TMPDIR='x;touch PWNED;#' detect: PWNED created (or crash, exit $(cat "$T/cwd1.rc"))" "$T/err"; fi
mkdir -p "$T/cwd2"
(cd "$T/cwd2" && run 60 "$HL" attn --checkpoint "$T/lm/model.safetensors" --tokens "96 62 96" --out at; echo "$rc" >"$T/cwd2.rc")
stray=$(cd "$T/cwd2" && ls -A | grep -vx at)
if [ "$(cat "$T/cwd2.rc")" = 0 ] && [ -z "$stray" ]; then ok "attn --tokens '96 62 96' (bytes \`>\`): no stray files"
else bad "attn --tokens '96 62 96': exit $(cat "$T/cwd2.rc"), stray files: $(printf '%q ' $stray)" "$T/err"; fi

# ---- bounds --------------------------------------------------------------------------------------
# (no cap for a sanitizer build: its shadow memory needs the address space)
grep -qa __asan_init "$HL" && export CAP=0 || export CAP=1
# a model with 65-token rows (the 9-token model above might fit 10^6 examples in memory); the old
# code just starts working, so its address space is capped at 8 GB to spare the machine
run 60 "$HL" train --d-model 64 --layers 2 --heads 4 --d-ff 128 --length 32 --batch 4 --eval-size 16 --steps 2 --threads 1 --quiet --out "$T/big"
[ "$rc" = 0 ] || bad "fixture: 65-token model (exit $rc)" "$T/err"
# patch runs its passes in chunks of rows: 10^6 examples need a few hundred MiB, not hundreds of
# GiB, so it is not refused; under the same cap it works and stops on a signal, writing nothing
signal_case "patch --examples 1000000: chunked, runs under the cap; SIGTERM -> exit 143" TERM 143 x -- \
  bash -c '[ "$CAP" = 1 ] && ulimit -v 8000000; exec "$@"' capped "$HL" patch --checkpoint "$T/big/model.safetensors" --examples 1000000 --out "$T/o_patch"
[ ! -e "$T/o_patch" ] && ok "patch --examples 1000000 stopped: no directory" || bad "patch --examples 1000000 stopped: left $T/o_patch"
refused "edges --examples 1000000: refused before work with a memory estimate" 10 '--examples;;[0-9] ?[KMGTPE]i?B' "" -- \
  bash -c '[ "$CAP" = 1 ] && ulimit -v 8000000; exec "$@"' capped "$HL" edges --checkpoint "$T/big/model.safetensors" --examples 1000000 --out "$T/o_edges"
refused "knockout --kind resample --examples 1000000: refused before work with a memory estimate" 10 '--examples;;[0-9] ?[KMGTPE]i?B' "" -- \
  bash -c '[ "$CAP" = 1 ] && ulimit -v 8000000; exec "$@"' capped "$HL" knockout --checkpoint "$T/big/model.safetensors" --hook blocks.0.attn.hook_pattern --kind resample --examples 1000000 --out "$T/o_knockout"
refused "bench with a huge --config: refused with a memory estimate" 10 '--config;;[0-9] ?[KMGTPE]i?B' 'bad_alloc|child failed' -- \
  "$HL" bench --config 65536,1024,4,1048576,100000,100000 --steps 1 --warmup 0 --threads 1

# ---- zero targets --------------------------------------------------------------------------------
tokens_refused "tokens with an all-zero loss_mask: refused naming the file" 'maskzero\.safetensors;;target|count|loss' "" maskzero.safetensors
tokens_refused "tokens with every target -1: refused naming the file" 'minusone\.safetensors;;target|count|loss' "" minusone.safetensors
tokens_refused "tokens with T = 1: refused naming the file" 'onecolumn\.safetensors' "" onecolumn.safetensors

# ---- files ---------------------------------------------------------------------------------------
cp -r "$T/run" "$T/aaa"          # a train run directory
run 60 "$HL" prune --checkpoint "$M" --random-seeds 1 --quiet --out "$T/bbb"   # a prune directory
[ "$rc" = 0 ] || bad "fixture: prune directory (exit $rc)" "$T/err"
refused "prune --out TRAINRUN: refused naming the directory and that it holds a train run" 60 \
  'aaa.*train|train.*aaa' "" -- "$HL" prune --checkpoint "$M" --random-seeds 1 --quiet --out "$T/aaa"
refused "train --out PRUNEDIR: refused naming the directory and that it holds pruning results" 60 \
  'bbb.*prun|prun.*bbb' "" -- "$HL" train $small --steps 5 --out "$T/bbb"
refused "train --mlp swiglu --activation relu: refused naming both flags (the gate is silu)" 20 \
  '--mlp swiglu;;--activation relu;;silu' "" -- "$HL" train $small --mlp swiglu --activation relu --steps 2 --out "$T/o_swiglu"
run 60 "$HL" prune --checkpoint "$M" --method l0 --target-heads 100 --quiet --out "$T/o_target"
if [ "$rc" -ge 1 ] && [ "$rc" -lt 124 ] && grep -q -- '--target-heads' "$T/err" && [ ! -e "$T/o_target/prune_settings.json" ]; then
  ok "refused prune --target-heads 100 (2 heads) leaves no prune_settings.json"
else bad "refused prune --target-heads 100: exit $rc, left: $(ls "$T/o_target" 2>/dev/null | tr '\n' ' ')" "$T/err"; fi

mkdir -p "$T/dirA" "$T/dirB"; cp "$T/ids.npy" "$T/dirA/ids.npy"
(cd "$T/dirA" && run 60 "$HL" train --task tokens --data ids.npy $tiny --eval-size 16 --steps 5 --out ../tokrun; echo "$rc" >"$T/dirA.rc")
[ "$(cat "$T/dirA.rc")" = 0 ] || bad "fixture: tokens run with a relative --data" "$T/err"
(cd "$T/dirB" && run 60 "$HL" attn --checkpoint ../tokrun/model.safetensors --out at; echo "$rc $ms" >"$T/dirB.rc"; cp "$T/err" "$T/dirB.err")
read -r r m <"$T/dirB.rc"; [ "$r" = 0 ] && ok "attn from another directory on a relative --data tokens run" || bad "attn from another directory: exit $r" "$T/dirB.err"
(cd "$T/dirB" && run 60 "$HL" view ../tokrun; echo "$rc" >"$T/dirB.rc"; cp "$T/err" "$T/dirB.err")
[ "$(cat "$T/dirB.rc")" = 0 ] && ok "view from another directory on a relative --data tokens run" || bad "view from another directory: exit $(cat "$T/dirB.rc")" "$T/dirB.err"

# ---- messages: no library internals, the file/flag named ----------------------------------------
run 60 "$HL" train $small --steps 10 --log-grads 5 --quiet --out "$T/ga"
printf 'step,layer,head,matrix,grad_norm,weight_norm\nxx,0,0,W_Q,1,1\n' >"$T/ga/grad_atlas.csv"
run 60 "$HL" train --resume --steps 20 --log-grads 5 --quiet --out "$T/ga"
if grep -qE 'stoll|stoi|stod' "$T/err"; then bad "corrupt grad_atlas.csv on resume: message says $(grep -oE 'stoll|stoi|stod' "$T/err" | head -1)" "$T/err"
elif [ "$rc" -ge 128 ] || { [ "$rc" != 0 ] && ! grep -q 'grad_atlas.csv' "$T/err"; }; then bad "corrupt grad_atlas.csv on resume: exit $rc without naming the file" "$T/err"
else ok "corrupt grad_atlas.csv on resume: no stoll (exit $rc)"; fi
tokens_refused "npy shape (1, 2^62): named, no std::vector max_size" 'wide\.npy' 'max_size|std::' wide.npy
tokens_refused "token id 2^31-1: refused naming the file, no negative vocab_size" 'maxid\.safetensors|2147483647' 'vocab_size must be positive|-2147483648' maxid.safetensors
tokens_refused "token id 2^24: refused naming the id or vocabulary, not held-out batches" 'id24\.safetensors|16777216|alphabet|vocab' 'held-out batches' id24.safetensors
tokens_refused "npy shape (-5, 16): refused naming the file" 'negshape\.npy' "" negshape.npy
refused "detect --pattern with a (0,0) tensor: refused" 20 'emptypattern\.safetensors|--pattern|pattern' "" -- \
  "$HL" detect --checkpoint "$M" --examples 4 --pattern "$T/emptypattern.safetensors" --out "$T/o_pat"
nonutf=$'\xff\xfe'
cp -r "$T/run" "$T/r$nonutf"
run 60 "$HL" view "$T/r$nonutf"
if grep -q 'json.exception' "$T/err" || [ "$rc" -ge 124 ]; then bad "view of a non-UTF-8 run path: exit $rc" "$T/err"; else ok "view of a non-UTF-8 run path: no json.exception (exit $rc)"; fi
run 60 "$HL" prune --checkpoint "$T/r$nonutf/model.safetensors" --random-seeds 1 --quiet --out "$T/p$nonutf"
if grep -q 'json.exception' "$T/err" || [ "$rc" -ge 124 ]; then bad "prune of a checkpoint under a non-UTF-8 path: exit $rc" "$T/err"; else ok "prune of a checkpoint under a non-UTF-8 path: no json.exception (exit $rc)"; fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
