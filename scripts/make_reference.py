#!/usr/bin/python3
"""Writes tests/data/reference_gpt.safetensors: what PyTorch computes for a small GPT, for
tests/test_reference.cpp to compare headlab with on every test run, without PyTorch (as llm.c's
test_gpt2 does with its dump).

Needs Debian's PyTorch:   apt-get install -y python3-torch python3-numpy
Run:                      /usr/bin/python3 scripts/make_reference.py

The model is scripts/reference/gpt.py (pre-norm, learned positions, exact-erf GELU, biases
everywhere), with weights perturbed from its initialisation so every gradient is sizeable and
the layer norms are not the identity. The file holds, besides the initial weights under their
headlab's parameter names (and the checkpoint metadata):
  input_ids, targets (4, 17)           a batch; -1 = not in the loss
  ref.loss (), ref.logits (4, 17, 13)  the forward
  ref.grad.<name>                      every parameter's gradient
  ref.attn.<l> (4, 4, 17, 17)          the attention pattern of each layer
  train.input_ids, train.targets (20, 4, 17)   20 fixed training batches
  heldout.input_ids, heldout.targets (8, 17)   a held-out batch
  ref.heldout_loss (20)                held-out loss after each of 20 AdamW steps (global-norm
                                       clipping, warmup + cosine schedule as headlab's trainer)
  ref.final.<name>                     the weights after those 20 steps
and the hyperparameters in the metadata key "reference".
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "reference"))
from gpt import GPT  # noqa: E402
sys.path.insert(0, HERE)
from safetensors_np import write_safetensors  # noqa: E402

VOCAB, D, LAYERS, HEADS, DFF, T, B = 13, 32, 2, 4, 64, 17, 4
STEPS, HELD = 20, 8
HP = dict(lr=3e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, clip=1.0, warmup=5, total=STEPS,
          min_lr_ratio=0.1, schedule="cosine")
OUT = os.path.join(HERE, "..", "tests", "data", "reference_gpt.safetensors")


def interop_name(name):
    return name.replace(".W1.", ".ffn.fc1.").replace(".W2.", ".ffn.fc2.")


def lr_at(step):
    """headlab's LrSchedule::at: linear warmup from lr/warmup, then cosine to min_lr_ratio * lr."""
    lr, warmup = HP["lr"], HP["warmup"]
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    span = max(1, HP["total"] - warmup)
    t = min(1.0, (step - warmup) / span)
    min_lr = HP["min_lr_ratio"] * lr
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))


def batch(gen, rows):
    ids = torch.randint(0, VOCAB, (rows, T), generator=gen)
    tgt = torch.randint(0, VOCAB, (rows, T), generator=gen)
    tgt[torch.rand(rows, T, generator=gen) < 0.2] = -1  # some targets not in the loss
    return ids, tgt


def loss_of(model, ids, tgt):
    logits = model(ids)
    return F.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1), ignore_index=-1), logits


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = GPT(VOCAB, D, LAYERS, HEADS, DFF, max_len=T)
    with torch.no_grad():  # larger weights than the 0.02 init: sizeable gradients, non-trivial norms
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    init = {interop_name(n): p.detach().numpy().copy() for n, p in model.state_dict().items()}
    ids, tgt = batch(gen, B)
    train = [batch(gen, B) for _ in range(STEPS)]
    held_ids, held_tgt = batch(gen, HELD)

    # forward, attention maps (recomputed from each block's input, as headlab's pattern), backward
    maps = []

    def capture(mod, inp, _out):
        x = inp[0]
        q = mod.W_Q(x).view(B, T, HEADS, -1).transpose(1, 2)
        k = mod.W_K(x).view(B, T, HEADS, -1).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        att = att.masked_fill(~mod.causal[:T, :T], float("-inf"))
        maps.append(torch.softmax(att, -1).detach().numpy().copy())

    hooks = [blk.attn.register_forward_hook(capture) for blk in model.blocks]
    loss, logits = loss_of(model, ids, tgt)
    loss.backward()
    for h in hooks:
        h.remove()
    out = dict(init)
    out["input_ids"], out["targets"] = ids.numpy(), tgt.numpy()
    out["ref.loss"] = np.array(loss.item(), dtype=np.float32)
    out["ref.logits"] = logits.detach().numpy()
    for n, p in model.named_parameters():
        out["ref.grad." + interop_name(n)] = p.grad.numpy().copy()
    for layer, m in enumerate(maps):
        out[f"ref.attn.{layer}"] = m

    # 20 AdamW steps as headlab's trainer: no decay on biases, norms and embeddings
    model.zero_grad()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "emb" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "emb" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": HP["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=HP["lr"], betas=(HP["beta1"], HP["beta2"]), eps=HP["eps"])
    held = []
    for step, (bi, bt) in enumerate(train):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss, _ = loss_of(model, bi, bt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), HP["clip"])
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            held.append(loss_of(model, held_ids, held_tgt)[0].item())
    out["train.input_ids"] = torch.stack([b[0] for b in train]).numpy()
    out["train.targets"] = torch.stack([b[1] for b in train]).numpy()
    out["heldout.input_ids"], out["heldout.targets"] = held_ids.numpy(), held_tgt.numpy()
    out["ref.heldout_loss"] = np.array(held, dtype=np.float32)
    for n, p in model.named_parameters():
        out["ref.final." + interop_name(n)] = p.detach().numpy().copy()

    cfg = dict(vocab_size=VOCAB, d_model=D, n_layers=LAYERS, n_heads=HEADS, n_kv_heads=HEADS, d_head=D // HEADS,
               d_ff=DFF, max_seq_len=T, norm="pre", activation="gelu_erf", positions="learned", attn_bias=True,
               mlp_bias=True, head_bias=True, layer_norm_eps=1e-5)
    meta = {"format": "headlab-checkpoint", "format_version": "1", "config": json.dumps(cfg),
            "reference": json.dumps(HP), "made_by": f"scripts/make_reference.py, PyTorch {torch.__version__}"}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    write_safetensors(OUT, out, meta)
    print(f"wrote {os.path.normpath(OUT)} ({os.path.getsize(OUT)} bytes); loss {out['ref.loss']:.6f}, "
          f"held-out loss {held[0]:.4f} -> {held[-1]:.4f} over {STEPS} steps")


if __name__ == "__main__":
    main()
