#!/usr/bin/python3
"""Edge patching of every edge of a headlab checkpoint, written as a TransformerLens user writes
it: the model (gpt.py) with TransformerLens's hook points, a Python loop over the edges, each
edge one full forward with a hook that adds delta_s to its receiver's input. The reference
`headlab edges` is checked against (python/tests/test_edges_reference.py) and timed against
(scripts/bench_edges.sh).

Definitions (the same text headlab implements; docs in the edges command):
  senders    embed (hook_embed + hook_pos_embed) and every head L{l}H{h} (attn.hook_result: z_h @ W_O[:, h],
             no W_O bias)
  receivers  L{l}H{h}.q / .k / .v (blocks.{l}.hook_{q,k,v}_input[:, :, h], the residual copy that head
             h's query / key / value reads, before ln1), mlp{l} (blocks.{l}.hook_mlp_in, before ln2),
             logits (the final residual, before ln_final)
  delta_s    out_s(corrupted) - out_s(clean), (B, T, d_model)
  metric     mean over answers (row, pos, clean, corrupted) of logits[row, pos, clean] - logits[row, pos, corrupted]
  exact      metric(clean run, receiver reads its input + delta_s) - metric(clean run)
  attribution  sum(delta_s * d metric / d receiver input), the gradient from one backward of the clean run

Usage: edge_patching_tl.py --checkpoint CK.safetensors --inputs DIR/inputs.safetensors --out OUT.json
                           [--threads N] [--repeat R] [--float64]
OUT.json has the format of `headlab edges`'s edges.json plus "seconds": the median over R repeats of
the time of the whole computation (the two cached runs, every edge's forward, the attribution's
forward and backward), model loading and Python start-up not included.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
from gpt import load_headlab  # noqa: E402
from safetensors_np import read_safetensors  # noqa: E402


class InputError(Exception):
    pass


def receivers(n_layers, n_heads, has_mlp):
    """[(name, layer)] in forward order; logits has layer n_layers."""
    out = []
    for layer in range(n_layers):
        out += [(f"L{layer}H{h}.{c}", layer) for h in range(n_heads) for c in "qkv"]
        if has_mlp:
            out.append((f"mlp{layer}", layer))
    return out + [("logits", n_layers)]


def senders_of(receiver, layer, n_heads):
    """The senders written before `receiver` reads: embed, then heads of earlier layers (the MLP of
    block l also reads the heads of layer l: it reads hook_resid_mid)."""
    last = layer + 1 if receiver.startswith("mlp") else layer
    return ["embed"] + [f"L{l}H{h}" for l in range(last) for h in range(n_heads)]


def edge_list(model):
    L, H = len(model.blocks), model.blocks[0].attn.H
    return [(s, r) for r, layer in receivers(L, H, model.blocks[0].has_mlp) for s in senders_of(r, layer, H)]


def receiver_hook(model, receiver, delta):
    """(hook point name, hook adding delta (B,T,d_model) to that receiver's input alone)."""
    if receiver == "logits":
        return f"blocks.{len(model.blocks) - 1}.hook_resid_post", lambda x, hook: x + delta
    if receiver.startswith("mlp"):
        return f"blocks.{int(receiver[3:])}.hook_mlp_in", lambda x, hook: x + delta
    head, component = receiver.split(".")
    layer, h = (int(v) for v in head[1:].split("H"))

    def add_to_head(x, hook):  # x (B, T, H, d_model): one residual copy per head (an expanded view)
        x = x.clone()
        x[:, :, h] += delta
        return x
    return f"blocks.{layer}.hook_{component}_input", add_to_head


def logit_difference(logits, answers):
    """logits (B, T, V), answers (N, 4) int64 -> mean of logits[row, pos, clean] - logits[row, pos, corrupted]."""
    rows, pos, good, bad = answers.T
    return (logits[rows, pos, good] - logits[rows, pos, bad]).mean()


def use_edge_hook_points(model):
    """TransformerLens's switches the edges need: per-head q/k/v inputs, per-head results, hook_mlp_in."""
    model.set_hook_options(use_split_qkv_input=True, use_attn_result=True, use_hook_mlp_in=True)


def sender_outputs(model, ids):
    """{sender: (B, T, d_model)} of one run: embed and every head's hook_result."""
    use_edge_hook_points(model)
    names = ["hook_embed", "hook_pos_embed"] + [f"blocks.{l}.attn.hook_result" for l in range(len(model.blocks))]
    logits, cache = model.run_with_cache(ids, names)
    out = {"embed": cache["hook_embed"] + cache["hook_pos_embed"][None]}
    for layer in range(len(model.blocks)):
        result = cache[f"blocks.{layer}.attn.hook_result"]  # B, T, H, d_model
        for h in range(result.shape[2]):
            out[f"L{layer}H{h}"] = result[:, :, h]
    return logits, out


def patched_metric(model, clean, answers, patches):
    """The metric of the clean run in which each receiver of `patches` [(receiver, delta)] reads its
    input + delta (several at once: path patching)."""
    use_edge_hook_points(model)
    hooks = [receiver_hook(model, r, d) for r, d in patches]
    return logit_difference(model.run_with_hooks(clean, hooks), answers).item()


def attribution_gradients(model, clean, answers):
    """{receiver: d metric / d its input (B, T, d_model)} from one forward and backward of the clean run."""
    use_edge_hook_points(model)
    L, H = len(model.blocks), model.blocks[0].attn.H
    grads = {}

    def keep(name):
        def hook(g, h):
            grads[name] = g.detach()
        return hook
    names = []
    for layer in range(L):
        names += [f"blocks.{layer}.hook_{c}_input" for c in "qkv"]
        if model.blocks[0].has_mlp:
            names.append(f"blocks.{layer}.hook_mlp_in")
    names.append(f"blocks.{L - 1}.hook_resid_post")
    with torch.enable_grad(), model.hooks(bwd_hooks=[(n, keep(n)) for n in names]):
        logit_difference(model(clean), answers).backward()
    model.zero_grad(set_to_none=True)
    out = {}
    for r, layer in receivers(L, H, model.blocks[0].has_mlp):
        if r == "logits":
            out[r] = grads[f"blocks.{L - 1}.hook_resid_post"]
        elif r.startswith("mlp"):
            out[r] = grads[f"blocks.{layer}.hook_mlp_in"]
        else:
            h, c = int(r.split(".")[0].split("H")[1]), r[-1]
            out[r] = grads[f"blocks.{layer}.hook_{c}_input"][:, :, h]
    return out


def edge_patching(model, clean, corrupted, answers):
    """Exact edge patching and edge attribution patching of every edge: the edges.json dict."""
    with torch.inference_mode():
        clean_logits, clean_out = sender_outputs(model, clean)
        corrupted_logits, corrupted_out = sender_outputs(model, corrupted)
        delta = {s: corrupted_out[s] - clean_out[s] for s in clean_out}
        clean_metric = logit_difference(clean_logits, answers).item()
        corrupted_metric = logit_difference(corrupted_logits, answers).item()
        exact = {(s, r): patched_metric(model, clean, answers, [(r, delta[s])]) - clean_metric
                 for s, r in edge_list(model)}
    grads = attribution_gradients(model, clean, answers)
    edges = []
    for s, r in edge_list(model):
        a = (delta[s] * grads[r]).sum().item()
        edges.append({"sender": s, "receiver": r, "exact": exact[(s, r)], "attribution": a,
                      "linearisation_error": a - exact[(s, r)]})
    return {"metric": "logit_difference", "clean_metric": clean_metric, "corrupted_metric": corrupted_metric,
            "n_layers": len(model.blocks), "n_heads": model.blocks[0].attn.H, "has_mlp": model.blocks[0].has_mlp,
            "edges": edges}


def read_inputs(path, model):
    """clean, corrupted (B, T) and answers (N, 4) as int64 tensors, checked against the model."""
    try:
        t = read_safetensors(path)
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"{path}: cannot read ({e})")
    for name in ("clean", "corrupted", "answers"):
        if name not in t:
            raise InputError(f"{path}: no tensor '{name}' (needs clean (B,T), corrupted (B,T), answers (N,4))")
    clean, corrupted, answers = (torch.from_numpy(t[n].astype(np.int64)) for n in ("clean", "corrupted", "answers"))
    if clean.dim() != 2 or clean.shape != corrupted.shape:
        raise InputError(f"{path}: clean {list(clean.shape)} and corrupted {list(corrupted.shape)} must be the same (B, T)")
    if answers.dim() != 2 or answers.shape[1] != 4 or answers.shape[0] == 0:
        raise InputError(f"{path}: answers has shape {list(answers.shape)}, needs (N, 4) with N > 0")
    B, T = clean.shape
    V, max_len = model.cfg["vocab"], model.cfg["max_len"]
    if T > max_len:
        raise InputError(f"{path}: {T} positions, the model has {max_len}")
    for name, ids in (("clean", clean), ("corrupted", corrupted), ("answers' tokens", answers[:, 2:])):
        if ids.numel() and (ids.min() < 0 or ids.max() >= V):
            raise InputError(f"{path}: {name} has token {int(ids.min() if ids.min() < 0 else ids.max())} outside the vocabulary 0..{V - 1}")
    for col, name, n in ((0, "row", B), (1, "pos", T)):
        bad = (answers[:, col] < 0) | (answers[:, col] >= n)
        if bad.any():
            raise InputError(f"{path}: answers {name} {int(answers[bad][0, col])} outside 0..{n - 1}")
    return clean, corrupted, answers


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    p.add_argument("--repeat", type=int, default=1, help="repeat the computation R times; seconds = median")
    p.add_argument("--float64", action="store_true", help="compute in float64 (a reference for float32)")
    args = p.parse_args(argv)
    if args.repeat < 1 or args.threads < 0:
        p.error("--repeat must be >= 1 and --threads >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        model = load_headlab(args.checkpoint, torch.float64 if args.float64 else torch.float32)
        clean, corrupted, answers = read_inputs(args.inputs, model)
    except (InputError, ValueError, OSError) as e:
        sys.exit(f"edge_patching_tl: {e}")
    seconds = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        result = edge_patching(model, clean, corrupted, answers)
        seconds.append(time.perf_counter() - start)
    result["seconds"] = statistics.median(seconds)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, args.out)
    print(f"{len(result['edges'])} edges, {clean.shape[0]} rows x {clean.shape[1]} tokens, "
          f"{'float64' if args.float64 else 'float32'}, {torch.get_num_threads()} threads: "
          f"{result['seconds']:.3f} s (median of {args.repeat}: {', '.join(f'{s:.3f}' for s in seconds)})")


if __name__ == "__main__":
    main()
