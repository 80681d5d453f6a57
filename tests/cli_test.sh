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

check "help lists subcommands" 0 "^  grads +Loss, every parameter gradient" -- "$HL" --help
check "help lists every command" 0 "^  export +Write a headlab checkpoint" -- "$HL" --help
check "train --help shows defaults" 0 "--d-model.*64" -- "$HL" train --help
check "train --help shows --resume" 0 "--resume" -- "$HL" train --help
check "unknown flag" nonzero "--bogus" -- "$HL" train --bogus
check "non-positive size" nonzero "--d-model: value 0 is outside \[1, 65536\]" -- "$HL" train --d-model 0 --out "$T/x"
check "heads must divide d_model" nonzero "n_heads 3 does not divide d_model 64" -- "$HL" train --heads 3 --out "$T/x"
check "kv-heads must divide heads" nonzero "n_kv_heads 3 must divide n_heads 4" -- "$HL" train --kv-heads 3 --out "$T/x"
check "bad choice" nonzero "^--norm: middle not in \{pre,post\}" -- "$HL" train --norm middle
check "hooks lists the hook points" 0 "blocks.1.attn.hook_pattern +\(B, 2, T, T\)" -- "$HL" hooks --heads 2
check "view takes --text or --tokens, not both" nonzero "(--text excludes --tokens|--tokens excludes --text)" -- "$HL" view --checkpoint /nonexistent.safetensors --text hi --tokens "1 2"
check "view refuses an empty --text" nonzero "--text.*is empty" -- "$HL" view --checkpoint /nonexistent.safetensors --text ""
check "--tokenizer is for the text task" nonzero "task copy: --tokenizer is for --task text" -- "$HL" train --task copy --tokenizer "$T" --steps 1 --out "$T/x"
check "text refuses a directory without tokenizer files" nonzero "$T: no tokenizer files \(expected tokenizer.json, as Hugging Face writes it, vocab.json \+ merges.txt" -- "$HL" train --task text --data /usr/share/common-licenses/GPL-3 --tokenizer "$T" --steps 1 --out "$T/x"
mkdir -p "$T/unigram" && printf '{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}' > "$T/unigram/tokenizer.json"
check "text refuses a tokenizer.json of another model type" nonzero "$T/unigram/tokenizer.json: the model type \"Unigram\" is not supported" -- "$HL" train --task text --data /usr/share/common-licenses/GPL-3 --tokenizer "$T/unigram" --steps 1 --out "$T/x"
check "missing checkpoint" nonzero "/nonexistent.safetensors: cannot open" -- "$HL" grads --checkpoint /nonexistent.safetensors --out "$T/g.st"

# A small run to have a real checkpoint.
check "small run" 0 "token accuracy" -- "$HL" train $small --steps 30 --eval-every 10 --out "$T/run"
check "summary written" 0 "peak_rss_kb" -- cat "$T/run/summary.json"
check "metrics written" 0 '"step":30' -- cat "$T/run/metrics.jsonl"
# --init takes the architecture from the checkpoint (no model flags needed), refuses contradictions
check "init takes the checkpoint's model" 0 "d_model 16, d_head 8" -- "$HL" train --init "$T/run/model.safetensors" --length 4 --alphabet 5 --batch 8 --eval-size 16 --threads 1 --steps 2 --out "$T/init"
check "init refuses a contradicting flag" nonzero "--d-model 32 contradicts --init .*model.safetensors, whose model has d_model 16" -- "$HL" train --init "$T/run/model.safetensors" --d-model 32 --length 4 --alphabet 5 --out "$T/init2"
head -c 100 "$T/run/model.safetensors" > "$T/trunc.safetensors"
check "truncated checkpoint" nonzero "trunc.safetensors: not a valid safetensors file" -- "$HL" grads --checkpoint "$T/trunc.safetensors" --out "$T/g1.st"
[ ! -e "$T/g1.st" ] && { pass=$((pass+1)); echo "ok   no output after a failure"; } || { fail=$((fail+1)); echo "FAIL output written after a failure"; }
printf '\x0e\x00\x00\x00\x00\x00\x00\x00{"a": [1, 2, 3' > "$T/bad.safetensors"
check "corrupt header" nonzero "header is not valid JSON" -- "$HL" attn --checkpoint "$T/bad.safetensors" --out "$T/a"
check "resume with other model" nonzero "--d-model 32 does not match the run being resumed \(16" -- "$HL" train --d-model 32 --steps 40 --resume --out "$T/run"
check "refuse to overwrite a run" nonzero "already holds a run" -- "$HL" train $small --steps 30 --out "$T/run"
# headlab sae: an SAE on the small run's layer-0 hook_z (heads concatenated), SAELens's files out
sae_small="--steps 30 --batch 32 --buffer 256 --sequences 8 --batches 2 --expansion 2 --k 4 --threads 1"
check "sae trains on hook_z" 0 "explained variance" -- "$HL" sae --checkpoint "$T/run/model.safetensors" --hook blocks.0.attn.hook_z $sae_small --out "$T/sae"
check "sae writes SAELens's cfg.json" 0 '"architecture": "topk"' -- cat "$T/sae/cfg.json"
check "sae writes its metrics" 0 '"explained_variance"' -- cat "$T/sae/metrics.json"
check "sae refuses a missing hook" nonzero "the model has no hook point 'blocks.5.attn.hook_z'" -- "$HL" sae --checkpoint "$T/run/model.safetensors" --hook blocks.5.attn.hook_z $sae_small --out "$T/sae2"
check "sae estimates its memory first" nonzero "an SAE of 16777216 features \(--expansion 1048576\) on 1024-row batches \(--batch\): needs about" -- "$HL" sae --checkpoint "$T/run/model.safetensors" --hook blocks.0.attn.hook_z --expansion 1048576 --out "$T/sae2"
[ ! -e "$T/sae2" ] && { pass=$((pass+1)); echo "ok   sae wrote nothing when refused"; } || { fail=$((fail+1)); echo "FAIL sae wrote after a refusal"; }
check "sae reports the loss recovered" 0 '"loss_recovered"' -- cat "$T/sae/metrics.json"
check "sae refuses an --out holding a run" nonzero "holds an SAE run already: continue it with --resume" -- "$HL" sae --checkpoint "$T/run/model.safetensors" --hook blocks.0.attn.hook_z $sae_small --out "$T/sae"
# resume: 30 steps straight = 15 steps, then --resume to 30 (the same SAE, byte for byte)
sae_r="--checkpoint $T/run/model.safetensors --hook blocks.0.attn.hook_z --batch 32 --buffer 256 --sequences 8 --batches 2 --expansion 2 --k 4 --threads 1"
check "sae stops at a step" 0 "explained variance" -- "$HL" sae $sae_r --steps 15 --out "$T/sae_half"
check "sae resumes" 0 "resumed at step 15" -- "$HL" sae $sae_r --steps 30 --resume --out "$T/sae_half"
cmp -s "$T/sae/sae_weights.safetensors" "$T/sae_half/sae_weights.safetensors" && { pass=$((pass+1)); echo "ok   sae resumed = straight, byte for byte"; } || { fail=$((fail+1)); echo "FAIL sae resumed differs from the straight run"; }
check "sae resume refuses other settings" nonzero "cannot resume: lr is" -- "$HL" sae $sae_r --steps 30 --lr 0.01 --resume --out "$T/sae_half"
check "sae --resume needs a state" nonzero "holds no SAE state" -- "$HL" sae $sae_r --steps 30 --resume --out "$T/sae_none"
# a transcoder from the MLP's input to its output
check "sae trains a transcoder" 0 "topk transcoder on blocks.0.ln2.hook_normalized -> blocks.0.hook_mlp_out" -- "$HL" sae --checkpoint "$T/run/model.safetensors" --hook blocks.0.ln2.hook_normalized --hook-out blocks.0.hook_mlp_out $sae_small --out "$T/tc"
check "transcoder's cfg.json" 0 '"hook_name_out": "blocks.0.hook_mlp_out"' -- cat "$T/tc/cfg.json"
check "sae refuses a missing output hook" nonzero "the model has no hook point 'blocks.0.hook_mlp_outt'" -- "$HL" sae --checkpoint "$T/run/model.safetensors" --hook blocks.0.ln2.hook_normalized --hook-out blocks.0.hook_mlp_outt $sae_small --out "$T/tc2"
# headlab features: that SAE's features on the same checkpoint (the page, the tables, a match with itself)
check "features studies an SAE's features" 0 "wrote .*/feat/features.csv, features.html, presence.csv, match.csv" -- "$HL" features --sae "$T/sae" --checkpoint "$T/run/model.safetensors" --sequences 8 --batches 1 --top-features 3 --examples 2 --match "$T/sae" --threads 1 --out "$T/feat"
check "features writes the feature page" 0 '"head_fraction":\[' -- cat "$T/feat/features.html"
check "features matches an SAE with itself" 0 "^3,3,1" -- cat "$T/feat/match.csv"
check "features refuses a feature the SAE does not have" nonzero "--features \\(features of the SAE\\): 99 is outside 0..31" -- "$HL" features --sae "$T/sae" --checkpoint "$T/run/model.safetensors" --features 99 --out "$T/feat2"
[ ! -e "$T/feat2" ] && { pass=$((pass+1)); echo "ok   features wrote nothing when refused"; } || { fail=$((fail+1)); echo "FAIL features wrote after a refusal"; }
# features --run: the SAE at every snapshot and the final checkpoint; a snapshot of another run is refused
check "a run with snapshots" 0 "token accuracy" -- "$HL" train $small --steps 30 --eval-every 30 --snapshot-at 0,10 --out "$T/snaprun"
check "features over a run's snapshots" 0 "wrote .*/featrun/features.csv, features.html, presence.csv, over_training.csv" -- "$HL" features --sae "$T/sae" --checkpoint "$T/snaprun/checkpoint.safetensors" --run "$T/snaprun" --sequences 8 --batches 1 --top-features 2 --examples 2 --threads 1 --out "$T/featrun"
check "features over training: steps 0, 10 and the final 30" 0 "^0 10 30 $" -- bash -c "tail -n +2 '$T/featrun/over_training.csv' | cut -d, -f1 | uniq | tr '\\n' ' '"
check "another seed's run" 0 "token accuracy" -- "$HL" train $small --steps 10 --eval-every 10 --snapshot-at 10 --seed 7 --out "$T/seed7"
cp -r "$T/snaprun" "$T/mixrun" && cp "$T/seed7/snapshots/step_00000010.safetensors" "$T/mixrun/snapshots/"
check "features --run refuses a snapshot of another run" nonzero "step_00000010.safetensors: a snapshot of another run \\(.*seed" -- "$HL" features --sae "$T/sae" --checkpoint "$T/snaprun/checkpoint.safetensors" --run "$T/mixrun" --sequences 8 --batches 1 --threads 1 --out "$T/featmix"
[ ! -e "$T/featmix" ] && { pass=$((pass+1)); echo "ok   features wrote nothing when refused"; } || { fail=$((fail+1)); echo "FAIL features --run wrote after a refusal"; }
check "resume to more steps" 0 "token accuracy" -- "$HL" train --steps 40 --resume --out "$T/run"
check "grads from task" 0 "wrote .* gradients" -- "$HL" grads --checkpoint "$T/run/model.safetensors" --batch-size 2 --out "$T/g.st"
check "attn with tokens" 0 "attn.safetensors" -- "$HL" attn --checkpoint "$T/run/model.safetensors" --tokens "6 1 2 3 4 7 1 2" --out "$T/attn"
check "attn rejects bad token" nonzero "99 is outside 0..7" -- "$HL" attn --checkpoint "$T/run/model.safetensors" --tokens "6 99" --out "$T/attn2"

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

# ---- reliability: bad input never costs a result ----------------------------------------------
ok()   { pass=$((pass+1)); echo "ok   $1"; }
bad()  { fail=$((fail+1)); echo "FAIL $1"; }
# peak RSS (KiB) and wall seconds of a command, its exit code last: "rss secs rc"
measure() { python3 -c 'import resource,subprocess,sys,time
t=time.time(); rc=subprocess.call(sys.argv[1:],stdout=subprocess.DEVNULL,stderr=open(sys.argv[0] if False else "/dev/null","w"))
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, round(time.time()-t,3), rc)' "$@"; }

# Two writers of one run directory: the second is refused while the first holds it.
"$HL" train $small --steps 100000 --checkpoint-every 5 --eval-every 1000 --quiet --seed 7 --out "$T/conc" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 300); do [ -f "$T/conc/checkpoint.safetensors" ] && break; sleep 0.05; done
check "second train on a locked --out" nonzero "conc is in use by another headlab process \(pid $pid\)" -- "$HL" train $small --steps 30 --seed 8 --out "$T/conc"
# Ctrl-C: stops at a step boundary, writes checkpoint and summary, says how to resume (exit 130)
kill -INT $pid; wait $pid; rc=$?
if [ $rc = 130 ] && grep -q '"finished": false' "$T/conc/summary.json"; then ok "SIGINT stops at a step with checkpoint and summary"; else bad "SIGINT (exit $rc)"; fi
reached=$(python3 -c "import json; print(json.load(open('$T/conc/summary.json'))['steps'])")
check "resume after SIGINT" 0 "token accuracy" -- "$HL" train --resume --steps $((reached + 5)) --out "$T/conc"
check "resume refuses fewer steps than reached" nonzero "--steps 10 is below step $((reached + 5))" -- "$HL" train --resume --steps 10 --out "$T/conc"
"$HL" ablate --head-counts 1 --seeds 1 --steps 3000 --d-model 8 --d-ff 16 --eval-size 16 --threads 1 --quiet --out "$T/abc" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 300); do [ -f "$T/abc/.lock" ] && break; sleep 0.05; done
sleep 0.2
check "second ablate on a locked --out" nonzero "abc is in use by another headlab process" -- "$HL" ablate --head-counts 1 --seeds 1 --steps 30 --d-model 8 --d-ff 16 --eval-size 16 --out "$T/abc"
kill -9 $pid; wait $pid 2>/dev/null

# Corrupt checkpoints: a config claiming a huge model, NaN weights.
python3 - "$T" <<'PY'
import json, struct, sys
T = sys.argv[1]
d = open(T + "/run/model.safetensors", "rb").read()
n = struct.unpack("<Q", d[:8])[0]
def write(name, header, data):
    hb = json.dumps(header).encode(); hb += b" " * ((8 - len(hb) % 8) % 8)
    open(T + "/" + name, "wb").write(struct.pack("<Q", len(hb)) + hb + data)
for key, value, name in [("d_model", 4096, "huge_d"), ("n_layers", 48, "huge_l"), ("max_seq_len", 10**8, "huge_s"), ("vocab_size", 10**9, "huge_v")]:
    h = json.loads(d[8:8 + n]); cfg = json.loads(h["__metadata__"]["config"]); cfg[key] = value
    h["__metadata__"]["config"] = json.dumps(cfg); write(name + ".safetensors", h, d[8 + n:])
h = json.loads(d[8:8 + n]); off = 8 + n + h["blocks.0.attn.W_Q.weight"]["data_offsets"][0] + 12
b = bytearray(d); b[off:off + 4] = struct.pack("<f", float("nan")); open(T + "/nan.safetensors", "wb").write(bytes(b))
b = {"input_ids": {"dtype": "I64", "shape": [0, 5], "data_offsets": [0, 0]}, "targets": {"dtype": "I64", "shape": [0, 5], "data_offsets": [0, 0]}}
write("empty_batch.safetensors", b, b"")
PY
# Refused before anything is sized by the claimed config: within 50 MiB of what the binary takes
# to print its help (its libraries, and the sanitizer build's shadow memory, about 100 MiB; the
# smallest claimed model needs gigabytes) and 1 s.
read -r base_rss _ _ < <(measure "$HL" --help)
for f in huge_d huge_l huge_s huge_v; do
  for cmd in grads attn prune; do
    extra=""; [ $cmd = prune ] && extra="--out $T/pr_$f --quiet"; [ $cmd != prune ] && extra="--out $T/o_$f"
    read -r rss secs rc < <(measure "$HL" $cmd --checkpoint "$T/$f.safetensors" $extra)
    if [ "$rc" != 0 ] && [ "$rss" -lt $((base_rss + 51200)) ] && python3 -c "import sys; sys.exit(not $secs < 1.0)"; then ok "$cmd refuses $f config (${secs}s, ${rss} KiB)"
    else bad "$cmd on $f config: exit $rc, ${secs}s, ${rss} KiB"; fi
  done
done
check "huge config names the tensor" nonzero "tensor 'tok_emb.weight' has shape \(8,16\) but the config .* needs \(8,4096\)" -- "$HL" grads --checkpoint "$T/huge_d.safetensors" --out "$T/g2.st"
check "NaN weight rejected on load" nonzero "tensor 'blocks.0.attn.W_Q.weight' holds a non-finite value \(nan at element 3" -- "$HL" attn --checkpoint "$T/nan.safetensors" --out "$T/nanattn"
check "NaN weight rejected by prune" nonzero "holds a non-finite value" -- "$HL" prune --checkpoint "$T/nan.safetensors" --out "$T/nanprune" --quiet
check "empty batch rejected" nonzero "input_ids \(0,5\) holds no tokens" -- "$HL" grads --checkpoint "$T/run/model.safetensors" --batch "$T/empty_batch.safetensors" --out "$T/g3.st"
check "output over input refused" nonzero "--out .*model.safetensors is the same file as --checkpoint" -- "$HL" grads --checkpoint "$T/run/model.safetensors" --out "$T/run/../run/model.safetensors"
"$HL" grads --checkpoint "$T/run/model.safetensors" --batch-size 2 --out "$T/g4.st" >/dev/null 2>&1 && python3 -c "import sys; d=open('$T/run/model.safetensors','rb').read(8); sys.exit(0)" && ok "model intact after refused overwrite" || bad "model after refused overwrite"

# Non-finite: a diverging run stops, and every checkpoint it left has finite weights.
check "diverging run stops" 3 "not finite|is -?nan|is inf" -- "$HL" train $small --lr 100 --optimizer sgd --momentum 0 --clip 0 --warmup 0 --checkpoint-every 1 --steps 60 --out "$T/div"
check "its last checkpoint loads (finite weights)" 0 "wrote" -- "$HL" grads --checkpoint "$T/div/checkpoint.safetensors" --batch-size 2 --out "$T/g5.st"
"$HL" train $small --lr 100 --optimizer sgd --momentum 0 --clip 0 --warmup 0 --checkpoint-every 1 --steps 60 --skip-nonfinite --quiet --out "$T/div2" >/dev/null 2>&1
check "--skip-nonfinite never leaves a non-finite model" 0 "wrote" -- "$HL" grads --checkpoint "$T/div2/model.safetensors" --batch-size 2 --out "$T/g6.st"
if ! grep -q null "$T/div/metrics.jsonl" "$T/div2/metrics.jsonl"; then ok "no null (non-finite) metric written"; else bad "null in metrics"; fi

# Sizes and values: one clear line naming the flag, non-zero exit, nothing left behind.
while IFS='|' read -r want args; do
  check "bound: $args" nonzero "$want" -- "$HL" $args --out "$T/bounds"
  [ ! -e "$T/bounds" ] || { bad "bound: $args left $T/bounds behind"; rm -rf "$T/bounds"; }
done <<'EOF2'
--batch 100000000 of 33-token|train --batch 100000000
--length 100000|train --length 100000
--eval-size 2000000000|train --eval-size 2000000000
--d-model: value 1000000 is outside|train --d-model 1000000
--min-lr-ratio|train --min-lr-ratio -5
--clip: 'nan'|train --clip nan
--weight-decay: 'nan'|train --weight-decay nan
--momentum: 'nan'|train --momentum nan
--seed: value -1|train --seed -1
--dump-grads-at: value -5|train --dump-grads-at -5
--lr|train --lr 3e38
--save-fraction: value 5|prune --save-fraction 5
--step-fraction: 'nan'|prune --step-fraction nan
--min-per-layer: value -1|prune --min-per-layer -1
--finetune: value -5|prune --finetune -5
--head-counts: 2 is given twice|ablate --head-counts 2,2
EOF2
check "bad --config" nonzero "--config '16,1,2,32,4,8x': '8x' is not a whole number" -- "$HL" bench --config 16,1,2,32,4,8x
check "unknown config name" nonzero "unknown config 'Q': give S, M, L, S-llama, M-llama, V1, V4, V16, gpt2-small or six numbers" -- "$HL" bench --config Q
check "configs joined by a comma" nonzero "unknown config 'V1,V4'.*separated by spaces \(--config V1 V4\)" -- "$HL" bench --config V1,V4
check "custom config of five numbers" nonzero "--config '16,1,2,32,4': 5 numbers" -- "$HL" bench --config 16,1,2,32,4
check "bench --json into a missing directory, before any work" nonzero "$T/nodir/b.json: cannot write: no directory" -- "$HL" bench --config 16,1,2,32,4,8 --json "$T/nodir/b.json"
grep -q "headlab bench:" "$T/err" && { fail=$((fail+1)); echo "FAIL bench ran before refusing --json"; } || { pass=$((pass+1)); echo "ok   bench refuses --json before running"; }
check "bench on a task's batches says so, and the task's length" 0 "^16,1,2,32,4,8 \(T 33\) " -- "$HL" bench --config 16,1,2,32,4,8 --task varcopy --steps 2 --warmup 0 --threads 1 --json "$T/b.json"
cp "$T/out" "$T/bench.out"
check "bench names its data" 0 "^data: varcopy batches as training steps them \(T 33 and vocabulary 67" -- cat "$T/bench.out"
check "bench --json written" 0 '"task": "varcopy"' -- cat "$T/b.json"
check "bench on random tokens says so" 0 "^data: random tokens at every position" -- "$HL" bench --config 16,1,2,32,4,8 --steps 2 --warmup 0 --threads 1
check "bench config whose heads do not divide d_model" nonzero "--config '32,2,3,128,64,33': 3 heads do not divide d_model 32" -- "$HL" bench --config 32,2,3,128,64,33
check "bench --threads 0" nonzero "--threads: value 0 is outside \[1, 4096\]" -- "$HL" bench --threads 0
check "bench --task takes tasks that make their data" nonzero "--task: text reads a data file, which bench does not take; give one of copy, reverse, varcopy, induction" -- "$HL" bench --task text
check "bench --task unknown" nonzero "--task: unknown task 'foo'; give one of copy, reverse" -- "$HL" bench --task foo
check "bench --help lists the tasks" 0 "--task TEXT:\{copy,reverse,varcopy,induction\}" -- "$HL" bench --help
# bench --sae: an SAE training step on random activations
check "bench --sae of two numbers" nonzero "--sae '64,8': 2 numbers; give d_in,expansion,k" -- "$HL" bench --sae 64,8
check "bench --sae k above the features" nonzero "--sae '4,2,9': k 9 is more than the 8 features" -- "$HL" bench --sae 4,2,9
check "bench --sae times a step" 0 '"d_sae":32,.*"tokens_per_s":' -- "$HL" bench --sae 16,2,4 --sae-batch 64 --steps 2 --warmup 1 --threads 1
check "bench --sae-one-thread-below negative" nonzero "--sae-one-thread-below: value -1 is below 0" -- "$HL" bench --sae 16,2,4 --sae-one-thread-below -1
check "bench --sae-one-thread-below is reported" 0 '"one_thread_below":0.0,' -- "$HL" bench --sae 16,2,4 --sae-batch 64 --steps 1 --warmup 0 --threads 1 --sae-one-thread-below 0

# Language modelling has no answers: the train table shows loss and token accuracy, no exact match.
for i in $(seq 60); do printf 'the quick brown fox jumps over the lazy dog. '; done > "$T/lm.txt"
check "train on text" 0 "token accuracy" -- "$HL" train --task text --data "$T/lm.txt" --length 8 --d-model 16 --layers 1 --heads 2 --d-ff 32 --batch 8 --eval-size 16 --steps 5 --threads 1 --out "$T/lm"
grep -q "exact" "$T/out" "$T/err" && { fail=$((fail+1)); echo "FAIL text run shows an exact match"; } || { pass=$((pass+1)); echo "ok   text run shows no exact match"; }
cp "$T/out" "$T/lm.out"
check "train time in tenths of a second" 0 "train time +[0-9]+:[0-9]{2} \([0-9]+\.[0-9] s\)" -- cat "$T/lm.out"
check "grads --batch-size bound" nonzero "--batch-size 100000000: a forward and backward of that batch needs about" -- "$HL" grads --checkpoint "$T/run/model.safetensors" --batch-size 100000000 --out "$T/g7.st"
check "--tokens rejects a non-number" nonzero "'x' is not a whole number" -- "$HL" attn --checkpoint "$T/run/model.safetensors" --tokens "6 x 4 7" --out "$T/at1"
check "--tokens rejects wrap-around" nonzero "4294967299 is outside 0..7" -- "$HL" attn --checkpoint "$T/run/model.safetensors" --tokens "6 4294967299" --out "$T/at2"

# Reruns of sweeps with other settings are refused (or recomputed with --force).
ab="--head-counts 1 --seeds 1 --d-model 8 --d-ff 16 --eval-size 16 --eval-every 10 --threads 1 --quiet"
"$HL" ablate $ab --steps 20 --lr 0.01 --out "$T/ab" >/dev/null 2>&1
check "ablate rerun with other flags refused" nonzero "runs/H1-seed0 holds a run made with other settings \(lr is 0.01 in the existing run but 0.05 now\)" -- "$HL" ablate $ab --steps 20 --lr 0.05 --out "$T/ab"
check "ablate rerun with the same flags reuses" 0 "head-count ablation" -- "$HL" ablate $ab --steps 20 --lr 0.01 --out "$T/ab"
check "ablate --force recomputes" 0 "head-count ablation: task varcopy, 40 steps" -- "$HL" ablate $ab --steps 40 --lr 0.05 --force --out "$T/ab"
"$HL" prune --checkpoint "$T/run/model.safetensors" --random-seeds 1 --quiet --out "$T/pr" >/dev/null 2>&1
check "prune with another checkpoint refused" nonzero "pr holds pruning results made with other settings \(checkpoint" -- "$HL" prune --checkpoint "$T/kill/checkpoint.safetensors" --random-seeds 1 --quiet --out "$T/pr"
check "prune --out over its input refused" nonzero "is the same file as --checkpoint" -- "$HL" prune --checkpoint "$T/pr/pruned_model.safetensors" --quiet --out "$T/pr"

# A killed writer's temporary files are cleaned on the next run; a dead one's only.
touch "$T/run/.checkpoint.safetensors.tmp.999999999"
"$HL" train --resume --steps 41 --quiet --out "$T/run" >/dev/null 2>&1
[ ! -e "$T/run/.checkpoint.safetensors.tmp.999999999" ] && ok "stale temp file removed" || bad "stale temp file left"
# The metrics log is never written through a link (here to a device): refused before the run.
mkdir -p "$T/full" && ln -s /dev/full "$T/full/metrics.jsonl"
check "metrics log through a link refused" nonzero "metrics.jsonl: exists and is a symbolic link, not a regular file" -- "$HL" train $small --steps 20 --eval-every 5 --out "$T/full"

# What heads do: detect, patch, compose, prune --method l0 on the small run's model.
M="$T/run/model.safetensors"
check "detect writes its table" 0 "previous_token" -- "$HL" detect --checkpoint "$M" --examples 8 --out "$T/det"
# --precision bf16 (lib/bf16.h): studies say their results are approximate; a run keeps its precision;
# a CPU without AVX512_BF16 (oneDNN told to stop below it) is refused naming the instruction
check "detect in bf16 says results are approximate" 0 "^precision bf16: results are approximate" -- "$HL" detect --checkpoint "$M" --examples 8 --precision bf16 --out "$T/det16"
check "resume refuses another precision" nonzero "error: --precision .bf16. does not match the run being resumed" -- "$HL" train --precision bf16 --steps 40 --resume --out "$T/run"
check "bf16 refused without AVX512_BF16" nonzero "error: precision bf16 needs the CPU's AVX512_BF16 instructions \(vdpbf16ps" -- env DNNL_MAX_CPU_ISA=AVX512_CORE "$HL" train $small --precision bf16 --steps 2 --out "$T/bf16x"
check "studies refuse bf16 without AVX512_BF16" nonzero "error: precision bf16 needs the CPU's AVX512_BF16" -- env DNNL_MAX_CPU_ISA=AVX512_CORE "$HL" detect --checkpoint "$M" --examples 8 --precision bf16 --out "$T/det16x"
# bench's whole-step check of the per-shape rule: a bf16 step of a 16-wide model is float32's (no
# oneDNN call, so no allocation) unless --bf16-every-product (oneDNN allocates in each execute;
# null: a sanitizer build counts no allocations)
check "bench in bf16 leaves thin products in float32" 0 '"mallocs_per_step":(0|0\.0|null)[,}]' -- "$HL" bench --one 16,1,2,32,4,8 --precision bf16 --steps 2 --warmup 1 --threads 1
check "bench --bf16-every-product puts them in bf16" 0 '"mallocs_per_step":([1-9]|null)' -- "$HL" bench --one 16,1,2,32,4,8 --precision bf16 --bf16-every-product --steps 2 --warmup 1 --threads 1
check "detect CSV" 0 "^layer,head,previous_token,previous_token_ci95_lo,previous_token_ci95_hi,duplicate_token,duplicate_token_ci95_lo,duplicate_token_ci95_hi,induction,induction_ci95_lo,induction_ci95_hi$" -- cat "$T/det/detect.csv"
# The named study: one seed, shortened; the circuit forms, each seed gets its roles and a page; a rerun reads it back
check "study induction forms the circuit" 0 "formed in 1 of 1 seeds" -- "$HL" study induction --seeds 1 --steps 1000 --threads 2 --quiet --out "$T/study"
check "study writes detect, patch and compose per seed" 0 "^layer,head,exact,exact_ci95_lo,exact_ci95_hi,attribution$" -- cat "$T/study/seed-0/patch/patch_heads.csv"
check "study's page shows what the heads do" 0 '"roles_detect":\{"columns"' -- cat "$T/study/seed-0/view.html"
check "study rerun reads the seed back" 0 "seed 0 \(1/1\) already trained" -- "$HL" study induction --seeds 1 --steps 1000 --threads 2 --out "$T/study"
check "study refuses another task" nonzero "the induction study trains --task induction, got --task copy" -- "$HL" study induction --task copy --out "$T/study2"
check "detect probe longer than the model" nonzero "exceed the model's max_seq_len" -- "$HL" detect --checkpoint "$M" --length 1000 --out "$T/det2"
[ ! -e "$T/det2" ] && ok "no output directory after a refused detect" || bad "detect left a directory"
check "compose needs two layers" nonzero "composition needs at least 2 layers, the model has 1" -- "$HL" compose --checkpoint "$M" --out "$T/co"
check "patch" 0 "correlation of attribution with exact patching" -- "$HL" patch --checkpoint "$M" --examples 16 --out "$T/pa"
check "patch CSVs" 0 "^layer,position,exact,attribution" -- cat "$T/pa/patch_resid.csv"
# Direct logit attribution: the components' mean attributions plus the bias term are the mean logit.
check "dla writes its table" 0 "direct logit attribution of the answer token" -- "$HL" dla --checkpoint "$M" --examples 16 --out "$T/dla"
check "dla CSV" 0 "^component,layer,head,mean,ci95_lo,ci95_hi$" -- head -1 "$T/dla/dla.csv"
check "dla components sum to the logit" 0 "^sum ok L0H1 ok$" -- python3 -c '
import csv, sys
rows = {r["component"]: r for r in csv.DictReader(open(sys.argv[1]))}
parts = [float(r["mean"]) for k, r in rows.items() if k != "logit"]
logit = float(rows["logit"]["mean"])
# each mean is written with 9 significant digits; the identity holds to float32 rounding
ok = abs(sum(parts) - logit) <= 1e-5 * (1 + sum(abs(p) for p in parts))
h = rows["L0H1"]
print("sum", "ok" if ok else "BAD %r vs %r" % (sum(parts), logit), "L0H1",
      "ok" if float(h["ci95_lo"]) <= float(h["mean"]) <= float(h["ci95_hi"]) and h["layer"] == "0" and h["head"] == "1" else "BAD")
' "$T/dla/dla.csv"
check "dla JSON" 0 '"component": "ln_final_bias"' -- cat "$T/dla/dla.json"
check "dla --tokens: one sequence, no interval" 0 "^L0H1,0,1,[-0-9.e]+,nan,nan$" -- bash -c "\"$HL\" dla --checkpoint \"$M\" --tokens '1 2 3 1 2 3' --out \"$T/dlat\" >/dev/null && cat \"$T/dlat/dla.csv\""
check "dla --tokens outside the vocabulary" nonzero "--tokens \(ids of the vocabulary\): 99 is outside" -- "$HL" dla --checkpoint "$M" --tokens "1 99" --out "$T/dlat2"
# --tokens: one parser for every command: commas and/or spaces, the same line for a bad id
check "dla --tokens takes commas as attn does" 0 "^L0H1,0,1,[-0-9.e]+,nan,nan$" -- bash -c "\"$HL\" dla --checkpoint \"$M\" --tokens '1,2 3,1, 2 3' --out \"$T/dlat3\" >/dev/null && cat \"$T/dlat3/dla.csv\""
check "dla --tokens with none" nonzero "error: --tokens: no token ids given$" -- "$HL" dla --checkpoint "$M" --tokens " , " --out "$T/dlat4"
check "attn --tokens outside the vocabulary, dla's words" nonzero "--tokens \(ids of the vocabulary\): 99 is outside" -- "$HL" attn --checkpoint "$M" --tokens "1,99" --out "$T/attt"
"$HL" train $small --norm post --steps 2 --quiet --out "$T/postrun" >/dev/null 2>&1
check "dla refuses a post-norm model" nonzero "dla needs a pre-norm model: .* is post-norm" -- "$HL" dla --checkpoint "$T/postrun/model.safetensors" --out "$T/dlap"
[ ! -e "$T/dlap" ] && ok "no output directory after a refused dla" || bad "dla left a directory"
# Edges: every edge of the 1-layer model (6 q/k/v, mlp0 from embed and 2 heads, logits likewise), the files the spec names.
check "a run directory stands for its model" 0 "^L0H1,0,1," -- bash -c "\"$HL\" dla --checkpoint \"\$(dirname \"$M\")\" --examples 8 --out \"$T/dlarun\" >/dev/null && cat \"$T/dlarun/dla.csv\""
check "edges prints the top edges" 0 "correlation of attribution with exact over all edges" -- "$HL" edges --checkpoint "$M" --rows 16 --top 5 --out "$T/edges"
check "edges.csv has a row per edge" 0 "^12$" -- bash -c "tail -n +2 '$T/edges/edges.csv' | wc -l"
check "edges.csv header" 0 "^sender,receiver,exact,attribution,linearisation_error$" -- head -1 "$T/edges/edges.csv"
check "edges.json" 0 '"metric": "logit_difference"' -- cat "$T/edges/edges.json"
check "edges.png is a PNG" 0 "^PNG$" -- bash -c "head -c 4 '$T/edges/edges.png' | tail -c 3"
check "edges inputs" 0 '"answers":\{[^}]*"dtype":"I32","shape":\[[0-9]+,4\]' -- head -c 400 "$T/edges/inputs.safetensors"
check "edges path patching" 0 "activation patching of L0H1" -- "$HL" edges --checkpoint "$M" --rows 16 --path-from L0H1 --to mlp0,logits --out "$T/edges_p"
[ ! -e "$T/edges_p" ] && ok "path patching writes nothing" || bad "edges --path-from left a directory"
check "edges refuses an unknown receiver" nonzero "unknown receiver 'L0H1.z'" -- "$HL" edges --checkpoint "$M" --path-from embed --to L0H1.z --out "$T/edges_b"
check "edges --to needs --path-from" nonzero "--to needs --path-from" -- "$HL" edges --checkpoint "$M" --to logits --out "$T/edges_b"
check "edges refuses a bad flag" nonzero "--top: value 0 is below 1" -- "$HL" edges --checkpoint "$M" --top 0 --out "$T/edges_b"
check "edges --method eap-ig" 0 "eap-ig: rank correlation of \|score\| with \|exact\|" -- "$HL" edges --checkpoint "$M" --rows 16 --method eap-ig --ig-steps 2 --out "$T/edges_ig"
check "edges.csv has the method's column" 0 "^sender,receiver,exact,attribution,linearisation_error,eap-ig$" -- head -1 "$T/edges_ig/edges.csv"
check "edges --method all compares the methods" 0 "edge-pruning \(its circuit: 5 edges\)" -- "$HL" edges --checkpoint "$M" --rows 16 --method all --ig-steps 2 --prune-steps 20 --top 5 --out "$T/edges_all"
check "methods.csv: exact and five methods" 0 "^7$" -- bash -c "wc -l < '$T/edges_all/methods.csv'"
check "edges writes MIB's graph JSON" 0 '"a0.h1->logits":\{"score":[-0-9.e]+,"in_graph":(true|false)\}' -- cat "$T/edges_ig/mib_graph.json"
check "a method's MIB graph holds its top --top edges, MLP senders ranked with the rest" 0 "^5$" -- /usr/bin/python3 -c "import json; print(sum(e['in_graph'] for e in json.load(open('$T/edges_all/mib_eap-ig.json'))['edges'].values()))"
check "edges --method all writes one MIB graph per method" 0 "^mib_acdc.json mib_atp-star.json mib_attribution.json mib_eap-ig.json mib_edge-pruning.json mib_exact.json$" -- bash -c "cd '$T/edges_all' && echo mib_*.json"
check "faithfulness.png is a PNG" 0 "^PNG$" -- bash -c "head -c 4 '$T/edges_all/faithfulness.png' | tail -c 3"
# --sae: an SAE's features as nodes of patch and edges (docs/features.md)
check "patch --sae patches an SAE's features" 0 "activation patching of blocks\.0\.attn\.hook_z\.hook_sae_acts_post over feature" -- "$HL" patch --checkpoint "$M" --examples 16 --sae "$T/sae" --hook blocks.0.attn.hook_z.hook_sae_acts_post --axes feature --out "$T/pa_sae"
check "edges --sae: the SAE's error is a sender" 0 "^blocks\.0\.attn\.hook_z,L0z\.err,(mlp0|logits)," -- bash -c "'$HL' edges --checkpoint '$M' --rows 16 --sae '$T/sae' --top 1 --out '$T/edges_sae' >/dev/null && cat '$T/edges_sae/feature_edges.csv'"
check "patch --sae refuses a feature axis elsewhere" nonzero "patching: blocks\.0\.hook_resid_pre .* has no feature axis" -- "$HL" patch --checkpoint "$M" --examples 16 --sae "$T/sae" --hook blocks.0.hook_resid_pre --axes feature --out "$T/pa_sae2"
check "edges refuses an unknown method" nonzero "unknown method 'pruning' \(expected attribution, eap-ig, atp-star, acdc or edge-pruning\)" -- "$HL" edges --checkpoint "$M" --method pruning --out "$T/edges_b"
check "edges refuses --ig-steps 0 in the library's words" nonzero "eap-ig: steps 0 is outside 1\.\.1000" -- "$HL" edges --checkpoint "$M" --method eap-ig --ig-steps 0 --out "$T/edges_b"
check "edges --method atp-star" 0 "atp-star: rank correlation of \|score\| with \|exact\|" -- "$HL" edges --checkpoint "$M" --rows 16 --method atp-star --out "$T/edges_atp"
check "edges refuses --target-edges above the edge count" nonzero "edge pruning: target edges 100000 is outside 1\.\.[0-9]+ \(the model's edges, MLP senders included\)" -- "$HL" edges --checkpoint "$M" --method edge-pruning --target-edges 100000 --out "$T/edges_b"
check "edges refuses --prune-lr 0" nonzero "edge pruning: lr 0 is outside \(0, 10\]" -- "$HL" edges --checkpoint "$M" --method edge-pruning --prune-lr 0 --out "$T/edges_b"
check "edges refuses --acdc-threshold -1" nonzero "acdc: threshold -1 must be a number >= 0" -- "$HL" edges --checkpoint "$M" --method acdc --acdc-threshold -1 --out "$T/edges_b"
# qk: QK attribution of one head over the task's answers
check "qk prints the top pairs" 0 "score -?[0-9.]+ \(the model's, scaled, before any soft-cap\) = the sum of the pairs" -- "$HL" qk --checkpoint "$M" --head 0.1 --examples 16 --out "$T/qk"
check "qk.csv has every pair" 0 "^query_side,key_side,value$" -- head -1 "$T/qk/qk.csv"
check "qk.json holds the matrix" 0 '"key_rule": "source"' -- cat "$T/qk/qk.json"
check "qk.png is a PNG" 0 "^PNG$" -- bash -c "head -c 4 '$T/qk/qk.png' | tail -c 3"
check "qk refuses a head outside the model" nonzero "--head 0.9 \(head\): 9 is outside 0\.\.[0-9]+$" -- "$HL" qk --checkpoint "$M" --head 0.9 --out "$T/qk_b"
check "qk refuses a head without a dot" nonzero "--head 1: expected LAYER.HEAD, e.g. 1.6" -- "$HL" qk --checkpoint "$M" --head 1 --out "$T/qk_b"
[ ! -e "$T/qk_b" ] && ok "a refused qk writes nothing" || bad "qk left a directory"
check "edges refuses a post-norm model" nonzero "post-norm \(norm = post\)" -- "$HL" edges --checkpoint "$T/postrun/model.safetensors" --out "$T/edges_b"
[ ! -e "$T/edges_b" ] && ok "no output directory after a refused edges" || bad "edges left a directory"
check "hooks lists hook_scale" 0 "ln_final.hook_scale +\(B, T, 1\)" -- "$HL" hooks --heads 2
check "patch --hook over layer, head, pos" 0 "restored fraction" -- "$HL" patch --checkpoint "$M" --examples 16 --hook hook_k_input --axes layer,head,pos --out "$T/pg"
check "patch --hook CSV" 0 "^layer,head,pos,restored$" -- cat "$T/pg/patch_hook_k_input.csv"
check "patch --hook JSON" 0 '"axes": \[' -- cat "$T/pg/patch_hook_k_input.json"
check "patch --hook refuses an axis the hook lacks" nonzero "blocks.0.hook_resid_pre \([0-9]+,[0-9]+,16\) has no head axis" -- "$HL" patch --checkpoint "$M" --examples 16 --hook hook_resid_pre --axes layer,head --out "$T/pg2"
check "patch --axes needs --hook" nonzero "--axes needs --hook" -- "$HL" patch --checkpoint "$M" --axes layer,head --out "$T/pg3"
check "knockout" 0 "ablated - clean" -- "$HL" knockout --checkpoint "$M" --hook blocks.0.attn.hook_z --head 1 --kind mean --examples 32 --out "$T/ko"
check "knockout CSV" 0 "^example,counted_targets,clean_loss,ablated_loss,clean_acc,ablated_acc$" -- cat "$T/ko/knockout.csv"
check "knockout JSON" 0 '"kind": "mean"' -- cat "$T/ko/knockout.json"
check "knockout resample at some positions" 0 "resample ablation of blocks.0.hook_resid_pre at positions 2,3" -- "$HL" knockout --checkpoint "$M" --hook blocks.0.hook_resid_pre --kind resample --positions 2,3 --examples 16 --out "$T/ko2"
check "knockout unknown hook" nonzero "unknown hook point 'blocks.3.attn.hook_z'" -- "$HL" knockout --checkpoint "$M" --hook blocks.3.attn.hook_z --out "$T/ko3"
[ ! -e "$T/ko3" ] && ok "no output directory after a refused knockout" || bad "knockout left a directory"
check "knockout head out of range" nonzero "head 2 is outside 0..1" -- "$HL" knockout --checkpoint "$M" --hook blocks.0.attn.hook_z --head 2 --out "$T/ko4"
check "knockout bad positions" nonzero "--positions: 'x' is not a whole number" -- "$HL" knockout --checkpoint "$M" --hook blocks.0.attn.hook_z --positions 1,x --out "$T/ko5"
check "knockout --per-position is for mean" nonzero "--per-position applies to --kind mean" -- "$HL" knockout --checkpoint "$M" --hook blocks.0.attn.hook_z --per-position --out "$T/ko6"
check "prune --method l0" 0 "keeps [0-9]+ heads" -- "$HL" prune --checkpoint "$M" --method l0 --l0-steps 20 --quiet --out "$T/l0"
check "l0 model saved" 0 "head_gates|headlab-checkpoint" -- head -c 2000 "$T/l0/l0_model.safetensors"
check "bad lambda" nonzero "--lambda" -- "$HL" prune --checkpoint "$M" --method l0 --lambda -1 --out "$T/l0b"

# ---- heads matched across models, counterfactual forks, compare ---------------------------------
check "run with a snapshot" 0 "token accuracy" -- "$HL" train --d-model 16 --layers 2 --heads 2 --d-ff 32 --length 4 --alphabet 5 --batch 8 --eval-size 16 --threads 1 --steps 20 --eval-every 10 --snapshot-at 10 --out "$T/orig"
check "fork with a gated head" 0 "token accuracy" -- "$HL" train --fork "$T/orig" --at 10 --gate 1.0=0 --quiet --out "$T/gated"
check "the fork's settings keep the gate" 0 '"gate_heads": \[' -- cat "$T/gated/summary.json"
check "fork at a step without a snapshot" nonzero "has no snapshot at step 15; it has 10" -- "$HL" train --fork "$T/orig" --at 15 --out "$T/f2"
check "fork of a head out of range" nonzero "--freeze 0.2: head 2 is outside 0..1" -- "$HL" train --fork "$T/orig" --at 10 --freeze 0.2 --out "$T/f3"
check "fork with another model" nonzero "--d-model 32 does not match" -- "$HL" train --fork "$T/orig" --at 10 --d-model 32 --out "$T/f4"
check "interventions need a fork" nonzero "apply to a fork" -- "$HL" train $small --reinit 0.0 --out "$T/f5"
[ ! -e "$T/f3/checkpoint.safetensors" ] && ok "no checkpoint after a refused fork" || bad "a refused fork left a checkpoint"
check "match two runs by weights" 0 "mean similarity of the pairs" -- "$HL" match --checkpoint "$T/orig" --checkpoint "$T/gated" --by weights --examples 16 --out "$T/m"
check "match CSV" 0 "^layer_a,head_a,role_a,layer_b,head_b,role_b,similarity$" -- cat "$T/m/match.csv"
check "match needs two checkpoints" nonzero "give exactly two" -- "$HL" match --checkpoint "$T/orig" --out "$T/m2"
check "compare a run and its fork" 0 "heads' detector scores at the end" -- "$HL" compare "$T/orig" "$T/gated" --examples 16 --out "$T/c"
check "compare CSV" 0 "^step,loss_a,loss_b,token_acc_a,token_acc_b$" -- cat "$T/c/compare.csv"
check "compare prints each detector's threshold from random baselines" 0 "^  previous_token 0\.[0-9]{3}, duplicate_token 0\.[0-9]{3}, induction 0\.[0-9]{3}$" -- "$HL" compare "$T/orig" "$T/gated" --examples 16 --out "$T/c3"
check "compare.json holds the thresholds" 0 '"role_thresholds_from": "random baseline"' -- cat "$T/c3/compare.json"
check "compare --role-threshold sets one for all" 0 "^  previous_token 0\.300, duplicate_token 0\.300, induction 0\.300 \(--role-threshold\)$" -- "$HL" compare "$T/orig" "$T/gated" --examples 16 --role-threshold 0.3 --out "$T/c4"
check "view --compare: the page carries both runs' curves and heads" 0 '"compare":\{"a":"[^"]*orig","b":"[^"]*gated \(fork of' -- bash -c "\"$HL\" view \"$T/gated\" --compare \"$T/c\" --out \"$T/c/page.html\" >/dev/null && grep -o '\"compare\":{\"a\":\"[^\"]*\",\"b\":\"[^\"]*' \"$T/c/page.html\""
check "view --compare of a directory without compare's files" nonzero "--compare .*: no readable compare.json" -- "$HL" view "$T/gated" --compare "$T/orig" --out "$T/c/page2.html"
check "compare refuses a missing run" nonzero "nope: no such run directory" -- "$HL" compare "$T/orig" "$T/nope" --out "$T/c2"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
