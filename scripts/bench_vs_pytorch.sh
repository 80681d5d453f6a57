#!/usr/bin/env bash
# headlab vs PyTorch, measured side by side in one run (not part of CI).
# Alternates `headlab bench --one CFG` and scripts/reference/torch_step.py for each config,
# ROUNDS times, and prints medians and ratios. PyTorch runs under scripts/reference/torch_env.sh
# (passive OpenMP waiting, no malloc trimming), headlab under the same minus the passive waiting
# (HEADLAB_ENV, below).
#
# OPENBLAS_CORETYPE: Debian's OpenBLAS 0.3.21 does not recognise this CPU and falls back to its
# Prescott kernels when the variable is unset, for PyTorch as for headlab. Both run with the
# same kernels: CORE (default SkylakeX, the AVX-512 ones); CORE=unset runs with it unset.
# Usage: scripts/bench_vs_pytorch.sh [CONFIGS...]   (default: S M L V1 V4 V16; also S-llama,
# M-llama (the Llama-style block against scripts/reference/modern_lm.py's) and gpt2-small)
# BF16=1 also runs, in the same rounds, headlab --precision bf16 and PyTorch under
# torch.autocast("cpu", dtype=torch.bfloat16) (forward and loss), and prints a second table.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${SHARED:-$PWD/scripts/reference}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
CORE=${CORE:-SkylakeX}
BF16=${BF16:-0}
configs=("$@"); [ ${#configs[@]} -gt 0 ] || configs=(S M L V1 V4 V16)

if ! dpkg-query -W -f='${Status}' python3-torch 2>/dev/null | grep -q "install ok installed"; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch
fi
bash scripts/build.sh >/dev/null
# shellcheck disable=SC1091
source "$SHARED/torch_env.sh"
if [ "$CORE" = unset ]; then unset OPENBLAS_CORETYPE; export HEADLAB_BLAS_CORE_CHOSEN=keep; else export OPENBLAS_CORETYPE=$CORE; fi

# torch_env.sh makes OpenMP threads sleep between parallel regions (PyTorch's workers would
# otherwise fight OpenBLAS's); headlab, which runs ~100 short regions a step, loses 2-4 ms a step
# to the wake-ups on these hosts. HEADLAB_ENV=best (default) runs headlab with OpenMP's default
# waiting, each side in its best environment; HEADLAB_ENV=same runs headlab under torch_env.sh too.
HL_ENV=(env -u OMP_WAIT_POLICY)
[ "${HEADLAB_ENV:-best}" = same ] && HL_ENV=(env)
out=$(mktemp -d)
if [ "$BF16" = 1 ]; then  # the bf16 product's peak (2048^3, as headlab bench measures sgemm's), for "% of peak"
  "${HL_ENV[@]}" ./build/headlab bench --peak --precision bf16 --threads "$THREADS" > "$out/bf16_peak.json"
fi
for cfg in "${configs[@]}"; do
  steps=30; case $cfg in S|S-llama|V*) steps=50;; gpt2-small) steps=10;; esac
  for r in $(seq "$ROUNDS"); do
    echo "round $r/$ROUNDS: $cfg" >&2
    "${HL_ENV[@]}" ./build/headlab bench --one "$cfg" --threads "$THREADS" --steps "$steps" --warmup 5 >> "$out/headlab.jsonl"
    /usr/bin/python3 "$SHARED/torch_step.py" --config "$cfg" --steps "$steps" --threads "$THREADS" --mode train >> "$out/torch_train.jsonl"
    /usr/bin/python3 "$SHARED/torch_step.py" --config "$cfg" --steps "$steps" --threads "$THREADS" --mode forward >> "$out/torch_fwd.jsonl"
    if [ "$BF16" = 1 ]; then
      "${HL_ENV[@]}" ./build/headlab bench --one "$cfg" --precision bf16 --threads "$THREADS" --steps "$steps" --warmup 5 >> "$out/headlab_bf16.jsonl"
      /usr/bin/python3 "$SHARED/torch_step.py" --config "$cfg" --steps "$steps" --threads "$THREADS" --mode train --autocast >> "$out/torch_train_bf16.jsonl"
      /usr/bin/python3 "$SHARED/torch_step.py" --config "$cfg" --steps "$steps" --threads "$THREADS" --mode forward --autocast >> "$out/torch_fwd_bf16.jsonl"
    fi
  done
done
/usr/bin/python3 - "$out" "${OPENBLAS_CORETYPE:-unset}" "$THREADS" "${HEADLAB_ENV:-best}" <<'PY'
import json, statistics, sys
d, core, threads = sys.argv[1], sys.argv[2], sys.argv[3]
load = lambda f: [json.loads(l) for l in open(f"{d}/{f}") if l.strip()]
hl, tt, tf = load("headlab.jsonl"), load("torch_train.jsonl"), load("torch_fwd.jsonl")
med = lambda xs: statistics.median(xs)
print(f"OPENBLAS_CORETYPE={core}, {threads} threads, headlab environment: {sys.argv[4]}, medians over rounds of per-run medians")
print(f"{'cfg':7} {'headlab train ms':>16} {'torch train ms':>15} {'speed-up':>9} {'headlab fwd ms':>15} {'torch fwd ms':>13} {'speed-up':>9} {'headlab RSS MiB':>16} {'torch RSS MiB':>14}")
for cfg in dict.fromkeys(r["config"] for r in hl):
    h = [r for r in hl if r["config"] == cfg]; a = [r for r in tt if r["config"] == cfg]; f = [r for r in tf if r["config"] == cfg]
    ht, at = med([r["train_ms_median"] for r in h]), med([r["ms_median"] for r in a])
    hf, af = med([r["fwd_ms_median"] for r in h]), med([r["ms_median"] for r in f])
    hr, ar = med([r["peak_rss_kb"] for r in h]) / 1024, med([r["peak_rss_kb"] for r in a]) / 1024
    print(f"{cfg:7} {ht:16.2f} {at:15.2f} {at/ht:8.2f}x {hf:15.2f} {af:13.2f} {af/hf:8.2f}x {hr:16.1f} {ar:14.1f}")
import os
if os.path.exists(f"{d}/headlab_bf16.jsonl"):
    hb, tb, fb = load("headlab_bf16.jsonl"), load("torch_train_bf16.jsonl"), load("torch_fwd_bf16.jsonl")
    peak = json.load(open(f"{d}/bf16_peak.json"))["sgemm_gflops"]
    print("\nbf16: headlab --precision bf16 against headlab float32 and PyTorch under torch.autocast(\"cpu\", dtype=torch.bfloat16);"
          f" bf16 product peak {peak:.0f} GFLOP/s (2048^3, oneDNN)")
    print(f"{'cfg':10} {'hl f32 train':>12} {'hl bf16 train':>13} {'torch autocast train':>20} {'bf16/f32':>8} {'vs autocast':>11}"
          f" {'hl f32 fwd':>10} {'hl bf16 fwd':>11} {'torch autocast fwd':>18} {'bf16/f32':>8} {'vs autocast':>11}"
          f" {'% bf16 peak':>11} {'hl bf16 RSS MiB':>15} {'autocast RSS MiB':>16}")
    for cfg in dict.fromkeys(r["config"] for r in hb):
        pick = lambda rows, key: med([r[key] for r in rows if r["config"] == cfg])
        ht, hf = pick(hl, "train_ms_median"), pick(hl, "fwd_ms_median")
        bt, bf = pick(hb, "train_ms_median"), pick(hb, "fwd_ms_median")
        at, af = pick(tb, "ms_median"), pick(fb, "ms_median")
        gf, hr, ar = pick(hb, "train_gflops"), pick(hb, "peak_rss_kb") / 1024, pick(tb, "peak_rss_kb") / 1024
        print(f"{cfg:10} {ht:12.2f} {bt:13.2f} {at:20.2f} {ht/bt:7.2f}x {at/bt:10.2f}x {hf:10.2f} {bf:11.2f} {af:18.2f} {hf/bf:7.2f}x {af/bf:10.2f}x"
              f" {100 * gf / peak:10.1f}% {hr:15.1f} {ar:16.1f}")
PY
rm -rf "$out"
