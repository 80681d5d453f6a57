#!/usr/bin/python3
"""EAP-IG (Hanna et al. 2024) of every edge of a headlab checkpoint, computed the way the reference
implementation (hannamw/EAP-IG, src/eap/attribute.py get_scores_eap_ig and utils.py
make_hooks_and_matrices) computes it: the PyTorch side of scripts/bench_eap_ig.sh and the reference
`headlab edges --method eap-ig` is checked against (python/tests/test_eap_ig_reference.py).

As the reference does it:
  * one activation-difference matrix (B, T, n_forward, d_model) filled by forward hooks on every
    sender's output: + the corrupted run's activation, - the clean run's (so corrupted - clean);
  * the token embedding (hook_embed, the "input" node) interpolated between the corrupted and the
    clean run, everything downstream recomputed, one forward and backward per step;
  * backward hooks on every receiver's input (blocks.l.hook_{q,k,v}_input per head,
    blocks.l.hook_mlp_in, the last hook_resid_post for the logits) that add
    einsum(activation_difference[:, :, :prev], gradient) into a (n_forward, n_backward) score
    matrix, prev = the senders written before that receiver reads;
  * the scores divided by the number of steps.
Where headlab's definition differs from the reference's defaults, the script follows headlab's so
that the two sets of scores can be compared edge by edge (the cost is the same):
  * the steps are alpha = k / steps for k = 1..steps (headlab: the right Riemann sum, one step =
    edge attribution); the reference runs k = 0..steps-1;
  * the senders are the input and the heads (headlab's edges have no MLP senders: an MLP's output is
    never patched alone), the metric is the mean logit difference of the answers (row, pos, clean,
    corrupted) and the scores are not divided again by the number of prompts.

Usage: eap_ig_torch.py --checkpoint CK.safetensors --inputs DIR/inputs.safetensors --out OUT.json
                       [--steps 5] [--threads N] [--repeat R] [--float64]
OUT.json: {"steps", "seconds", "edges": [{"sender", "receiver", "eap-ig"}]} in the order of
`headlab edges` (edge_patching_tl.edge_list); "seconds" is the median over R repeats of the whole
computation (the corrupted and clean runs and every step's forward and backward), model loading and
Python start-up not included.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from edge_patching_tl import InputError, edge_list, logit_difference, read_inputs, use_edge_hook_points  # noqa: E402
from gpt import load_headlab  # noqa: E402


class Graph:
    """The reference's index layout for headlab's edges: forward nodes (senders) input, then each
    layer's heads; backward nodes (receivers) per layer the heads' q, k, v and the MLP, then the logits."""

    def __init__(self, n_layers, n_heads, has_mlp):
        self.L, self.H, self.has_mlp = n_layers, n_heads, has_mlp
        self.n_forward = 1 + n_layers * n_heads
        self.per_layer = 3 * n_heads + (1 if has_mlp else 0)
        self.n_backward = n_layers * self.per_layer + 1

    def forward_index(self, sender):
        if sender == "embed":
            return 0
        layer, head = (int(v) for v in sender[1:].split("H"))
        return 1 + layer * self.H + head

    def prev_index(self, layer, mlp=False):
        """Senders written before a receiver of `layer` reads (its MLP also reads that layer's heads)."""
        return 1 + (layer + 1 if mlp else layer) * self.H

    def backward_index(self, receiver):
        if receiver == "logits":
            return self.L * self.per_layer
        if receiver.startswith("mlp"):
            return int(receiver[3:]) * self.per_layer + 3 * self.H
        head, c = receiver.split(".")
        layer, h = (int(v) for v in head[1:].split("H"))
        return layer * self.per_layer + "qkv".index(c) * self.H + h


def make_hooks_and_matrices(model, graph, B, T, scores):
    """(fwd_hooks_corrupted, fwd_hooks_clean, bwd_hooks), activation_difference: as the reference's."""
    d_model = model.cfg["d_model"]
    activation_difference = torch.zeros((B, T, graph.n_forward, d_model), dtype=scores.dtype)

    def activation_hook(index, acts, hook, add=True):
        acts = acts.detach()
        if add:
            activation_difference[:, :, index] += acts
        else:
            activation_difference[:, :, index] -= acts

    def gradient_hook(prev_index, bwd_index, grads, hook):
        grads = grads.detach()
        if grads.ndim == 3:
            grads = grads.unsqueeze(2)
        s = torch.einsum("bpfd,bpkd->fk", activation_difference[:, :, :prev_index], grads)
        scores[:prev_index, bwd_index] += s.squeeze(1) if s.shape[1] == 1 else s

    fwd_corrupted, fwd_clean, bwd = [], [], []

    def on_output(name, index):
        fwd_corrupted.append((name, lambda a, h: activation_hook(index, a, h, True)))
        fwd_clean.append((name, lambda a, h: activation_hook(index, a, h, False)))

    on_output("hook_embed", 0)
    for layer in range(graph.L):
        heads = slice(1 + layer * graph.H, 1 + (layer + 1) * graph.H)
        on_output(f"blocks.{layer}.attn.hook_result", heads)  # (B, T, H, d_model) into H columns
        for i, c in enumerate("qkv"):
            cols = slice(layer * graph.per_layer + i * graph.H, layer * graph.per_layer + (i + 1) * graph.H)
            bwd.append((f"blocks.{layer}.hook_{c}_input",
                        lambda g, h, p=graph.prev_index(layer), b=cols: gradient_hook(p, b, g, h)))
        if graph.has_mlp:
            bwd.append((f"blocks.{layer}.hook_mlp_in", lambda g, h, p=graph.prev_index(layer, True),
                        b=graph.backward_index(f"mlp{layer}"): gradient_hook(p, b, g, h)))
    bwd.append((f"blocks.{graph.L - 1}.hook_resid_post",
                lambda g, h, p=graph.n_forward, b=graph.backward_index("logits"): gradient_hook(p, b, g, h)))
    return (fwd_corrupted, fwd_clean, bwd), activation_difference


def eap_ig(model, clean, corrupted, answers, steps):
    """The (n_forward, n_backward) score matrix of EAP-IG with `steps` input-interpolation steps."""
    use_edge_hook_points(model)
    L, H = len(model.blocks), model.blocks[0].attn.H
    graph = Graph(L, H, model.blocks[0].has_mlp)
    B, T = clean.shape
    scores = torch.zeros((graph.n_forward, graph.n_backward), dtype=next(model.parameters()).dtype)
    (fwd_corrupted, fwd_clean, bwd), activation_difference = make_hooks_and_matrices(model, graph, B, T, scores)
    with torch.inference_mode():
        with model.hooks(fwd_hooks=fwd_corrupted):
            model(corrupted)
        input_corrupted = activation_difference[:, :, 0].clone()
        with model.hooks(fwd_hooks=fwd_clean):
            model(clean)
        input_clean = input_corrupted - activation_difference[:, :, 0]

    def interpolation(k):
        def hook(acts, h):
            x = input_corrupted + (k / steps) * (input_clean - input_corrupted)
            x.requires_grad_(True)
            return x
        return hook

    for k in range(1, steps + 1):
        with torch.enable_grad(), model.hooks(fwd_hooks=[("hook_embed", interpolation(k))], bwd_hooks=bwd):
            logit_difference(model(clean), answers).backward()
        model.zero_grad(set_to_none=True)
    return scores / steps, graph


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--float64", action="store_true", help="the model and the sums in float64 (a reference for the float32 runs)")
    a = p.parse_args(argv)
    if not 1 <= a.steps <= 1000:
        sys.exit(f"eap_ig_torch.py: --steps {a.steps} is outside 1..1000")
    torch.set_num_threads(a.threads)
    model = load_headlab(a.checkpoint, dtype=torch.float64 if a.float64 else torch.float32)
    model.eval()
    try:
        clean, corrupted, answers = read_inputs(a.inputs, model)
    except InputError as e:
        sys.exit(f"eap_ig_torch.py: {e}")
    times = []
    for _ in range(max(1, a.repeat)):
        t0 = time.perf_counter()
        scores, graph = eap_ig(model, clean, corrupted, answers, a.steps)
        times.append(time.perf_counter() - t0)
    edges = [{"sender": s, "receiver": r, "eap-ig": float(scores[graph.forward_index(s), graph.backward_index(r)])}
             for s, r in edge_list(model)]
    with open(a.out, "w") as f:
        json.dump({"steps": a.steps, "seconds": statistics.median(times), "edges": edges}, f)


if __name__ == "__main__":
    main()
