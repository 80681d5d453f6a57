"""Memory and time at the real sizes (docs/models.md, "Memory and time at the real sizes"): random-weight
models of Pythia-160m, SmolLM2-135M, Qwen2.5-0.5B and Gemma-2-2B shapes in the Hugging Face layout
(their published config.json values, the tensors in the dtype the real checkpoint stores, written by
scripts/reference/hf_modern.py), then each command on 128-token inputs, timed, with its peak RSS:

  load    hl.TransformerLM.load(DIR) in a fresh Python process (the time of the call itself)
  detect  headlab detect --checkpoint DIR --length 64 --examples E   (probe rows of 2 x 64 tokens)
  dla     headlab dla --checkpoint DIR --tokens "<128 ids>"
  patch   headlab patch --checkpoint DIR --data probe --length 64 --examples E
  edges   headlab edges --checkpoint DIR --data probe --length 64 --rows E   (the same probe rows; exact
          patching of every edge beside attribution; grouped-query models run ungrouped)
Each command is stopped after --timeout seconds (reported as such).

Usage (from the source directory, after a build; nice: the machine is shared):
  nice -n 19 /usr/bin/python3 scripts/real_sizes.py build/headlab /tmp/real-sizes [NAME ...] [--examples E] [--method M]
      [--commands detect,dla,patch,edges]
prints one Markdown row per model and command. A model whose load headlab refuses (more memory than
is available) is reported with the refusal's estimate, and its commands are skipped. Models already
written in WORKDIR are reused."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "reference"))
import hf_modern as ref  # noqa: E402

# The published config.json of each model (the keys headlab reads), and the dtype its weights ship in.
REAL = {
    "pythia-160m": ({"model_type": "gpt_neox", "vocab_size": 50304, "hidden_size": 768, "num_hidden_layers": 12,
                     "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 2048,
                     "rotary_pct": 0.25, "rotary_emb_base": 10000, "use_parallel_residual": True, "hidden_act": "gelu",
                     "layer_norm_eps": 1e-5, "tie_word_embeddings": False}, torch.float16),
    "smollm2-135m": ({"model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "num_hidden_layers": 30,
                      "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
                      "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "hidden_act": "silu",
                      "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False, "rope_scaling": None},
                     torch.bfloat16),
    "qwen2.5-0.5b": ({"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24,
                      "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
                      "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu",
                      "tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": 32768,
                      "max_window_layers": 24}, torch.bfloat16),
    "gemma-2-2b": ({"model_type": "gemma2", "vocab_size": 256000, "hidden_size": 2304, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 9216,
                    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                    "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0,
                    "final_logit_softcapping": 30.0, "sliding_window": 4096, "tie_word_embeddings": True}, torch.float32),
}


def parameters(config):
    """The parameter count of a config, from the shapes hf_modern writes (without allocating them)."""
    c, t = config, config["model_type"]
    d, V = c["hidden_size"], c["vocab_size"]
    H, Hkv, dh = ref._gqa(c)
    Fi = c["intermediate_size"]
    tied = c.get("tie_word_embeddings", t in ("gpt_neo", "gemma2", "gemma3_text"))
    emb = V * d * (1 if tied else 2)
    if t == "gpt_neox":
        per = 4 * d + 3 * d * d + 3 * d + d * d + d + 2 * Fi * d + Fi + d
        return emb + c["num_hidden_layers"] * per + 2 * d
    norms = 4 if t.startswith("gemma") else 2
    per = norms * d + (H + 2 * Hkv) * dh * d + H * dh * d + 3 * Fi * d + ((H + 2 * Hkv) * dh if t == "qwen2" else 0)
    return emb + c["num_hidden_layers"] * per + d


def write_model(name, directory):
    """The model's directory: config.json, and its random weights when headlab could load them."""
    config, dtype = REAL[name]
    if os.path.exists(os.path.join(directory, "config.json")):
        return
    # a model whose float32 parameters (what headlab's load holds: models/hf_models.h hf_load_bytes)
    # cannot fit in this machine's memory gets its config alone, which headlab refuses before
    # reading weights
    if 4 * parameters(config) > available_bytes():
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(dict(config, torch_dtype=str(dtype).split(".")[-1]), f, indent=2)
        return
    # drawn and written a tensor at a time (the memory held here is one tensor's), into a directory
    # renamed into place when whole; small weights: the activations stay in range at depth
    partial = directory + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    state = ref.random_state(config, std=0.02, lazy=True)
    ref.write_hf_lazy(partial, config, state, dtype, shards=1 if parameters(config) < 6e8 else 4)
    os.rename(partial, directory)


def available_bytes():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return float("inf")


# Runs argv[1:] from a fresh interpreter and writes its peak RSS (wait4) to stderr's last line: Linux
# carries the exec-ing process's own peak into the command's, and this script's (PyTorch, the
# tensors it drew) would hide every smaller figure. The command dies with it (PR_SET_PDEATHSIG).
FRESH_PEAK_RSS = """import ctypes, os, signal, sys
pid = os.fork()
if pid == 0:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print("peak-rss", usage.ru_maxrss * 1024, file=sys.stderr)
sys.exit(os.waitstatus_to_exitcode(status) % 256)"""


def run(cmd, env=None, timeout=None):
    """Runs cmd; returns (wall seconds, peak RSS bytes, returncode, stdout, stderr); stopped
    (SIGKILL, returncode -9) after `timeout` seconds."""
    start = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", FRESH_PEAK_RSS, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env)
    timer = threading.Timer(timeout, p.kill) if timeout else None
    if timer:
        timer.start()
    out, err = p.communicate()
    if timer:
        timer.cancel()
    seconds = time.perf_counter() - start
    err = err.decode(errors="replace")
    lines = err.strip().splitlines()
    rss = int(lines.pop().split()[1]) if lines and lines[-1].startswith("peak-rss ") else 0
    return seconds, rss, p.returncode, out.decode(errors="replace"), "\n".join(lines)


def gib(b):
    return f"{b / 2 ** 30:.2f} GiB" if b >= 2 ** 30 else f"{b / 2 ** 20:.0f} MiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("headlab")
    ap.add_argument("workdir")
    ap.add_argument("names", nargs="*", default=list(REAL))
    ap.add_argument("--examples", type=int, default=4)
    ap.add_argument("--method", default="attribution", help="edges --method")
    ap.add_argument("--timeout", type=float, default=600, help="seconds before a command is stopped")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--commands", default="detect,dla,patch,edges", help="the commands run after the load, comma-separated")
    a = ap.parse_args()
    build = os.path.dirname(os.path.abspath(a.headlab))
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"), OMP_NUM_THREADS=str(a.threads))
    T = 128
    print("| model | parameters | file dtype | command | wall s | peak RSS | note |")
    print("| --- | ---: | --- | --- | ---: | ---: | --- |")
    for name in a.names:
        config, dtype = REAL[name]
        d = os.path.join(a.workdir, name)
        write_model(name, d)
        n = parameters(config)
        row = f"| {name} | {n / 1e6:.0f}M | {str(dtype).split('.')[-1]} |"
        load = ("import sys, time, headlab as hl\nt = time.perf_counter()\nm = hl.TransformerLM.load(sys.argv[1])\n"
                "print(time.perf_counter() - t)")
        s, rss, rc, out, err = run([sys.executable, "-c", load, d], env)
        if rc != 0:
            print(f"{row} load | {s:.1f} | {gib(rss)} | refused: {err.strip().splitlines()[-1]} |", flush=True)
            continue
        print(f"{row} load | {float(out.strip()):.1f} | {gib(rss)} | the load call alone; the process {s:.1f} s |", flush=True)
        ids = " ".join(str(i) for i in np.random.default_rng(0).integers(0, config["vocab_size"], T))
        out_dir = os.path.join(a.workdir, "out-" + name)
        th = ["--threads", str(a.threads)]
        commands = {
            "detect": ["detect", "--checkpoint", d, "--length", "64", "--examples", str(a.examples)],
            "dla": ["dla", "--checkpoint", d, "--tokens", ids],
            "patch": ["patch", "--checkpoint", d, "--data", "probe", "--length", "64", "--examples", str(a.examples)],
            "edges": ["edges", "--checkpoint", d, "--data", "probe", "--length", "64", "--rows", str(a.examples),
                      "--method", a.method],
        }
        for cmd, args in commands.items():
            if cmd not in a.commands.split(","):
                continue
            s, rss, rc, out, err = run([a.headlab, *args, *th, "--out", os.path.join(out_dir, cmd)], env, a.timeout)
            note = "" if rc == 0 else f"stopped after {a.timeout:.0f} s" if rc == -9 else \
                "failed: " + (err.strip().splitlines() or ["?"])[-1][:160]
            print(f"{row} {cmd} | {s:.1f} | {gib(rss)} | {note} |", flush=True)


if __name__ == "__main__":
    main()
