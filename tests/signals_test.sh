#!/usr/bin/env bash
# Signals, child processes and a busy machine: a second signal of either kind ends a command at
# once; a terminal's Ctrl-C (SIGINT to the whole process group) while gnuplot draws reaches
# headlab alone, which ends gnuplot and exits 130 (or finishes with its PNG); a gnuplot that hangs
# is ended within its time limit and one that fails fails the command; the busy-machine rule is
# applied by commands other than train. Every command runs under a bound; the temporary
# directory is removed at the end.
# Usage: signals_test.sh path/to/headlab
HL_USAGE=signals_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/harness.sh"

# ---- fixture: a small trained copy model ---------------------------------------------------------
small="--d-model 16 --layers 2 --heads 2 --d-ff 32 --length 4 --alphabet 5 --batch 8 --eval-size 16 --threads 1"
timeout 60 "$HL" train $small --steps 20 --quiet --out "$T/run" >/dev/null 2>"$T/err" \
  || { bad "fixture: small train run" "$T/err"; echo "$pass passed, $fail failed"; exit 1; }
M="$T/run/model.safetensors"

# ---- a second signal of the other kind ends the command at once ----------------------------------
# After the first signal, train writes its checkpoint and summary, then draws its gradient atlas
# with a gnuplot that hangs (a child started after a stop runs to its end, up to its time limit):
# the second signal, of the other kind, must kill the process at once by its default action (a
# death by that signal, not an exit), whichever came first.
mkdir -p "$T/slow"
printf '#!/bin/sh\necho $$ >"%s"\nexec sleep 1000\n' "$T/slow.pid" >"$T/slow/gnuplot"
chmod +x "$T/slow/gnuplot"
for pair in "INT TERM" "TERM INT"; do
  set -- $pair
  r=$(PATH="$T/slow:$PATH" HEADLAB_PLOT_TIMEOUT=60 "$PY" - "$HL" "$1" "$2" "$T/second" $small <<'PYEOF'
import os, signal, subprocess, sys, time
hl, first, second, out, small = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
p = subprocess.Popen([hl, "train", *small, "--steps", "1000000", "--eval-every", "100000", "--log-grads", "10", "--quiet",
                      "--out", out + first], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(1.5)
if p.poll() is not None: print("finished early, exit", p.returncode); sys.exit()
p.send_signal(getattr(signal, "SIG" + first))
time.sleep(1.5)  # train has stopped and is drawing
p.send_signal(getattr(signal, "SIG" + second))
try: rc = p.wait(timeout=10)
except subprocess.TimeoutExpired: p.kill(); p.wait(); print("still running 10 s after the second signal"); sys.exit()
print("killed by SIG%s" % signal.Signals(-rc).name[3:] if rc < 0 else "exited %d" % rc)
PYEOF
)
  if [ "$r" = "killed by SIG$2" ]; then ok "SIG$1 then SIG$2: $r"; else bad "SIG$1 then SIG$2: $r (want killed by SIG$2)"; fi
  [ -s "$T/slow.pid" ] && kill -KILL "$(cat "$T/slow.pid")" 2>/dev/null; rm -f "$T/slow.pid"
done

# ---- a terminal's Ctrl-C while a command draws -----------------------------------------------------
# setsid makes headlab the leader of a group of its own, as a shell's job is; kill -INT -- -PGID is
# what the terminal sends on Ctrl-C. The signal lands at 20 points spread over a run, most while
# gnuplot draws; each run must end within 15 s with 130, or finish (0) with its PNG.
t0=$(date +%s%N)
timeout 60 "$HL" detect --checkpoint "$M" --examples 8 --threads 1 --out "$T/d0" >/dev/null 2>"$T/err"
d_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
[ -f "$T/d0/detect.png" ] || bad "detect draws detect.png (quiet run)" "$T/err"
problems=""
handled=0  # runs that headlab itself stopped (its message), not a signal before its handlers were set
for i in $(seq 20); do
  setsid "$HL" detect --checkpoint "$M" --examples 8 --threads 1 --out "$T/d$i" >/dev/null 2>"$T/ctrlc.err" &
  pid=$!
  sleep "$("$PY" -c "print($d_ms * $i / 21 / 1000)")"
  kill -INT -- -"$pid" 2>/dev/null
  for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL -- -"$pid" 2>/dev/null; wait "$pid" 2>/dev/null; problems+=" run $i: still running 15 s after Ctrl-C;"; continue
  fi
  wait "$pid"; r=$?
  [ "$r" = 130 ] && grep -q "stopped by SIGINT" "$T/ctrlc.err" && handled=$((handled + 1))
  if [ "$r" = 0 ] && [ ! -f "$T/d$i/detect.png" ]; then problems+=" run $i: exit 0 without detect.png ($(head -c 200 "$T/ctrlc.err"));"
  elif [ "$r" != 0 ] && [ "$r" != 130 ]; then problems+=" run $i: exit $r ($(head -c 200 "$T/ctrlc.err"));"; fi
done
[ "$handled" -ge 3 ] || problems+=" only $handled of 20 runs were stopped by headlab itself (want 3 or more);"
[ -z "$problems" ] && ok "Ctrl-C to the process group x20 during detect (${d_ms} ms a run, $handled stopped by headlab): 130 or a complete run" \
                   || bad "Ctrl-C to the process group during detect:$problems"

# ---- Ctrl-C during SAE training saves a state that --resume continues -------------------------------
sae_args=(sae --checkpoint "$M" --hook blocks.0.attn.hook_z --batch 32 --buffer 256 --sequences 8 --batches 2 --expansion 2 --k 4
          --threads 1 --log-every 1 --out "$T/sae_int")
setsid "$HL" "${sae_args[@]}" --steps 1000000 >"$T/sae.out" 2>"$T/sae.err" &
pid=$!
for _ in $(seq 300); do grep -q "^step" "$T/sae.out" 2>/dev/null && break; sleep 0.1; done  # training has begun
kill -INT -- -"$pid" 2>/dev/null
for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then kill -KILL -- -"$pid" 2>/dev/null; fi
wait "$pid"; r=$?
saved=$(sed -n 's/.*interrupted: .* at step \([0-9]*\); the state is in .*--resume$/\1/p' "$T/sae.err")
if [ "$r" = 130 ] && [ -n "$saved" ] && [ -f "$T/sae_int/sae_state.safetensors" ]; then
  ok "Ctrl-C during sae: exit 130, the state saved at step $saved"
  timeout 60 "$HL" "${sae_args[@]}" --steps $((saved + 3)) --resume >"$T/sae.out" 2>"$T/sae.err" \
    && grep -q "resumed at step $saved" "$T/sae.out" && [ -f "$T/sae_int/sae_weights.safetensors" ] \
    && ok "sae --resume goes on from step $saved to the end" || bad "sae --resume after Ctrl-C" "$T/sae.err"
else
  bad "Ctrl-C during sae: exit $r, saved step '$saved'" "$T/sae.err"
fi

# ---- a gnuplot that hangs, ignores SIGTERM, or fails ---------------------------------------------
mkdir -p "$T/hang" "$T/deaf" "$T/fails"
printf '#!/bin/sh\necho $$ >"%s"\nexec sleep 1000\n' "$T/hang.pid" >"$T/hang/gnuplot"
printf '#!/bin/sh\necho $$ >"%s"\ntrap "" TERM\nwhile :; do sleep 1; done\n' "$T/deaf.pid" >"$T/deaf/gnuplot"
printf '#!/bin/sh\necho "line 3: unknown terminal type" >&2\nexit 1\n' >"$T/fails/gnuplot"
chmod +x "$T/hang/gnuplot" "$T/deaf/gnuplot" "$T/fails/gnuplot"
for stub in hang deaf; do
  t0=$(date +%s%N)
  PATH="$T/$stub:$PATH" HEADLAB_PLOT_TIMEOUT=2 timeout -k 3 30 "$HL" detect --checkpoint "$M" --examples 8 --threads 1 \
    --out "$T/o_$stub" >/dev/null 2>"$T/err"; r=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  if [ "$r" = 1 ] && [ "$ms" -lt 15000 ] && grep -q "could not draw .*detect.png: gnuplot was still running after 2 s" "$T/err" \
     && [ -s "$T/$stub.pid" ] && ! kill -0 "$(cat "$T/$stub.pid")" 2>/dev/null; then
    ok "a gnuplot that $stub: ended after the 2 s limit, exit 1 naming detect.png (${ms} ms)"
  else bad "a gnuplot that $stub: exit $r after ${ms} ms (want 1 within 15 s, the PNG named, the stub gone)" "$T/err"; fi
  [ -s "$T/$stub.pid" ] && kill -KILL "$(cat "$T/$stub.pid")" 2>/dev/null
done
# every command that draws fails with the PNG named when gnuplot fails
for cmd in detect compose; do
  PATH="$T/fails:$PATH" timeout 60 "$HL" "$cmd" --checkpoint "$M" --examples 8 --threads 1 --out "$T/f_$cmd" >/dev/null 2>"$T/err"; r=$?
  want="headlab: error: could not draw $T/f_$cmd/$cmd.png: gnuplot failed (exit 1): line 3: unknown terminal type"
  if [ "$r" = 1 ] && [ "$(tail -1 "$T/err")" = "$want" ] && [ "$(grep -c "could not draw" "$T/err")" = 1 ]; then
    ok "$cmd with a failing gnuplot: exit 1, one line naming $cmd.png"
  else bad "$cmd with a failing gnuplot: exit $r (want 1 and one line naming $cmd.png)" "$T/err"; fi
done
PATH="$T/fails:$PATH" timeout 60 "$HL" edges --checkpoint "$M" --examples 8 --threads 1 --out "$T/f_edges" >/dev/null 2>"$T/err"; r=$?
if [ "$r" = 1 ] && grep -q "could not draw .*\.png: gnuplot failed" "$T/err"; then ok "edges with a failing gnuplot: exit 1 naming the PNG"
else bad "edges with a failing gnuplot: exit $r (want 1 naming the PNG)" "$T/err"; fi

# ---- L0's search for --target-heads starts where the data says, not at --lambda's smallest ------
# (from --lambda 1e-30 it quadrupled through 56 fine-tunings, two minutes on a larger model)
timeout 60 "$HL" prune --checkpoint "$M" --method l0 --lambda 1e-30 --target-heads 1 --l0-steps 5 --threads 1 --out "$T/l0" \
  >/dev/null 2>"$T/err"; r=$?
runs=$(grep -c "^  lambda" "$T/err")
if [ "$r" = 0 ] && [ "$runs" -le 12 ] && [ "$(($(wc -l <"$T/l0/l0.csv") - 1))" = "$runs" ]; then ok "prune l0 --lambda 1e-30: $runs fine-tunings"
else bad "prune l0 --lambda 1e-30: exit $r, $runs fine-tunings (want at most 12)" "$T/err"; fi

# ---- a signal to a command that writes a directory: 130/143, no directory, no hidden staging -------
# Each runs long enough (--examples 100000) to be signalled mid-work: dla at 3 s, in its intervals
# (which once ran to the end and wrote dla/ after the signal), the others at 1 s; each must stop
# within 5 s (patch once finished its pass over every example first: 9 s).
timeout 60 "$HL" train $small --steps 20 --seed 3 --quiet --out "$T/run_b" >/dev/null 2>"$T/err" || bad "fixture: a second run" "$T/err"
for cmd in edges dla patch compare; do
  for sig in INT TERM; do
    args=(--checkpoint "$M"); [ "$cmd" = compare ] && args=("$T/run" "$T/run_b")
    delay=1; [ "$cmd" = dla ] && delay=3
    r=$("$PY" - "$sig" "$delay" "$T/sig_$cmd" "$HL" "$cmd" "${args[@]}" --examples 100000 --threads 1 <<'PYEOF'
import os, signal, subprocess, sys, time
sig, delay, out, cmd = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4:]
p = subprocess.Popen(cmd + ["--out", out], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
# the delay counts from the command's first words (a slow start, as a sanitizer build's under
# load, is not mid-work: its signal handlers may not be in place yet); at most 10 s of waiting
import select
select.select([p.stderr], [], [], 10)
time.sleep(delay)
if p.poll() is not None: print("finished before the signal, exit", p.returncode); sys.exit()
t = time.time(); p.send_signal(getattr(signal, "SIG" + sig))
try: rc = p.wait(timeout=20)
except subprocess.TimeoutExpired: p.kill(); p.wait(); print("still running 20 s after the signal"); sys.exit()
p.stderr.close()
d, base = os.path.split(out)
left = [n for n in os.listdir(d) if n == base or n.startswith("." + base + ".partial")]
print("exit %d after %.1f s, left: %s" % (rc, time.time() - t, ",".join(left) or "nothing"))
PYEOF
)
    want=130; [ "$sig" = TERM ] && want=143
    secs=$(echo "$r" | sed -n 's/.* after \([0-9.]*\) s.*/\1/p')
    case "$r" in "exit $want after "*", left: nothing") quick=yes ;; *) quick=no ;; esac
    [ "$quick" = yes ] && "$PY" -c "import sys; sys.exit(float('$secs') >= 5)" && ok "$cmd SIG$sig mid-work: $r" \
      || bad "$cmd SIG$sig mid-work: $r (want exit $want within 5 s, nothing left)"
  done
done

# ---- batched passes in chunks: memory bounded, a signal answered between chunks ------------------
# patch's passes once took every example in one batch: 555 MB at --examples 20000 against 67 MB at
# 2000, and a SIGINT 1 s into --examples 60000 of a d_model 32 model was answered 11 s later.
peak() { "$PY" -c 'import resource,subprocess,sys
rc=subprocess.call(sys.argv[1:],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if rc == 0 else -rc)' "$@"; }
p2k=$(peak "$HL" patch --checkpoint "$M" --examples 2000 --threads 1 --out "$T/mem2k")
p20k=$(peak "$HL" patch --checkpoint "$M" --examples 20000 --threads 1 --out "$T/mem20k")
if [ "$p2k" -gt 0 ] && [ "$p20k" -gt 0 ] && [ $((p20k - p2k)) -lt 61440 ]; then ok "patch --examples 20000 peaks at ${p20k} KiB, 2000 at ${p2k} KiB (within 60 MiB)"
else bad "patch peak memory: ${p20k} KiB at --examples 20000 against ${p2k} KiB at 2000 (want within 60 MiB)"; fi
timeout 60 "$HL" train --d-model 32 --layers 2 --heads 2 --d-ff 64 --length 8 --alphabet 5 --batch 8 --eval-size 16 --threads 1 \
  --steps 5 --quiet --out "$T/run32" >/dev/null 2>"$T/err" || bad "fixture: a d_model 32 run" "$T/err"
r=$("$PY" - "$HL" "$T/run32/model.safetensors" "$T/sig_big" <<'PYEOF'
import os, signal, subprocess, sys, time
hl, m, out = sys.argv[1:]
p = subprocess.Popen([hl, "patch", "--checkpoint", m, "--examples", "60000", "--threads", "1", "--out", out],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(1)
t = time.time(); p.send_signal(signal.SIGINT)
try: rc = p.wait(timeout=30)
except subprocess.TimeoutExpired: p.kill(); p.wait(); rc = "none"
print(rc, "%.1f" % (time.time() - t), "dir" if os.path.exists(out) else "nodir")
PYEOF
)
set -- $r
if [ "$1" = 130 ] && "$PY" -c "import sys; sys.exit(float('$2') >= 3)" && [ "$3" = nodir ]; then ok "patch --examples 60000: SIGINT at 1 s answered in $2 s, exit 130, no directory"
else bad "patch --examples 60000 SIGINT at 1 s: exit $1 after $2 s, $3 (want 130 within 3 s, no directory)"; fi

# ---- the busy-machine rule, for commands other than train -----------------------------------------
# HEADLAB_TEST_IDLE_CORES stands in for /proc/stat's reading: one core left idle by others.
if [ "$(nproc)" -ge 2 ]; then
  for cmd in detect edges attn; do
    extra="--examples 8"; [ "$cmd" = attn ] && extra="--tokens 1,2,3"
    HEADLAB_TEST_IDLE_CORES=1 timeout 60 "$HL" $cmd --checkpoint "$M" $extra --out "$T/busy_$cmd" >/dev/null 2>"$T/err"; r=$?
    want="headlab: 1 of the $(nproc) cores is busy with other processes: running on 1 thread (--threads 2 to use them anyway)"
    [ "$(nproc)" -gt 2 ] && want="headlab: $(( $(nproc) - 1 )) of the $(nproc) cores are busy with other processes: running on 1 thread (--threads 2 to use them anyway)"
    if [ "$r" = 0 ] && grep -qxF "$want" "$T/err"; then ok "$cmd on a busy machine: runs on the idle core and says so"
    else bad "$cmd on a busy machine: exit $r, want the line: $want" "$T/err"; fi
    HEADLAB_TEST_IDLE_CORES=1 timeout 60 "$HL" $cmd --checkpoint "$M" $extra --threads 2 --out "$T/busy2_$cmd" >/dev/null 2>"$T/err"; r=$?
    if [ "$r" = 0 ] && ! grep -q "busy with other processes" "$T/err"; then ok "$cmd --threads 2 on a busy machine: obeyed, no notice"
    else bad "$cmd --threads 2 on a busy machine: exit $r or a notice" "$T/err"; fi
  done
else
  echo "skip the busy-machine cases (one core)"
fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
