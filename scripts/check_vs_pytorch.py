#!/usr/bin/python3
"""Checks headlab's loss and every gradient against PyTorch autograd (not part of CI: it needs
Debian's python3-torch, about 1 GB).

Builds the reference GPT of scripts/reference/gpt.py in PyTorch, writes it as a headlab
checkpoint (headlab's parameter names: W1/W2 become ffn.fc1/ffn.fc2), writes a batch file with ignored
targets, runs `headlab grads`, and compares loss, gradients and attention maps.

Usage: /usr/bin/python3 scripts/check_vs_pytorch.py [path/to/headlab]
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "reference"))
from gpt import GPT  # noqa: E402
sys.path.insert(0, HERE)
from safetensors_np import read_safetensors, write_safetensors  # noqa: E402

VOCAB, D, LAYERS, HEADS, DFF, T, B = 13, 32, 2, 4, 64, 33, 4


def interop_name(name):
    return name.replace(".W1.", ".ffn.fc1.").replace(".W2.", ".ffn.fc2.")


def main():
    headlab = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "build", "headlab")
    torch.manual_seed(0)
    model = GPT(VOCAB, D, LAYERS, HEADS, DFF, max_len=T)
    with torch.no_grad():  # larger weights than the 0.02 init, so every gradient is sizeable
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    idx = torch.randint(0, VOCAB, (B, T))
    tgt = torch.randint(0, VOCAB, (B, T))
    tgt[:, :5] = -1  # ignored targets
    cfg = dict(vocab_size=VOCAB, d_model=D, n_layers=LAYERS, n_heads=HEADS, n_kv_heads=HEADS, d_head=D // HEADS,
               d_ff=DFF, max_seq_len=T, norm="pre", activation="gelu_erf", positions="learned", attn_bias=True,
               mlp_bias=True, head_bias=True, layer_norm_eps=1e-5)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, batch, out = (os.path.join(tmp, n) for n in ("m.safetensors", "b.safetensors", "g.safetensors"))
        write_safetensors(ckpt, {interop_name(n): p.detach().numpy() for n, p in model.state_dict().items()},
                          {"format": "headlab-checkpoint", "format_version": "1", "config": json.dumps(cfg)})
        write_safetensors(batch, {"input_ids": idx.numpy(), "targets": tgt.numpy()})
        subprocess.run([headlab, "grads", "--checkpoint", ckpt, "--batch", batch, "--out", out], check=True)
        got = read_safetensors(out)

    # PyTorch: same loss, plus the attention maps through a forward hook.
    maps = []

    def capture(mod, inp, _out):
        x = inp[0]
        q = mod.W_Q(x).view(B, T, HEADS, -1).transpose(1, 2)
        k = mod.W_K(x).view(B, T, HEADS, -1).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
        att = att.masked_fill(~mod.causal[:T, :T], float("-inf"))
        maps.append(torch.softmax(att, -1).detach().numpy())

    for blk in model.blocks:
        blk.attn.register_forward_hook(capture)
    logits = model(idx)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1), ignore_index=-1)
    loss.backward()

    worst = 0.0
    rows = [("loss", abs(got["loss"].item() - loss.item()) / abs(loss.item()))]
    # Errors relative to the gradient's own scale, floored at 1e-3 of the largest gradient: the
    # W_K biases have a true gradient of exactly 0 (softmax ignores a shift shared by a row),
    # so both sides hold only round-off there.
    floor = 1e-3 * max(np.abs(p.grad.numpy()).max() for p in model.parameters())
    for n, p in model.named_parameters():
        ref = p.grad.numpy()
        err = np.abs(got["grad." + interop_name(n)] - ref).max() / max(np.abs(ref).max(), floor)
        rows.append((interop_name(n), err))
    for layer, m in enumerate(maps):
        rows.append((f"attn.{layer}", np.abs(got[f"attn.{layer}"] - m).max()))
    for name, err in rows:
        worst = max(worst, err)
        print(f"{name:36s} max error / max |ref| = {err:.2e}")
    ok = worst < 1e-4
    print(f"{'PASS' if ok else 'FAIL'}: worst relative error {worst:.2e} (float32 round-off is ~1e-6)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
