"""headlab against PyTorch (Debian's python3-torch, installed by scripts/install-deps.sh): a model
made in PyTorch continues training in `headlab train --init` as it does in PyTorch."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian's python3-torch)")
import torch.nn.functional as F  # noqa: E402

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")
SCRIPTS = os.path.join(os.environ.get("HEADLAB_SOURCE_DIR", "."), "scripts")
sys.path.insert(0, SCRIPTS)
sys.path.insert(0, os.path.join(SCRIPTS, "reference"))
from gpt import GPT  # noqa: E402
from safetensors_np import write_safetensors  # noqa: E402


def interop_name(name):
    return name.replace(".W1.", ".ffn.fc1.").replace(".W2.", ".ffn.fc2.")


def lr_at(step, lr, warmup, total, min_lr_ratio):
    """headlab's cosine schedule: linear warmup from lr/warmup, then cosine to min_lr_ratio * lr."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr_ratio * lr + (1 - min_lr_ratio) * lr * 0.5 * (1.0 + math.cos(math.pi * t))


def lm_loss(model, ids):
    """Language modelling on plain token rows: position t predicts token t + 1."""
    logits = model(ids)[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def test_init_from_a_pytorch_checkpoint_of_24_positions_trains_as_pytorch_does(tmp_path):
    """A 24-position model made in PyTorch (the position table is not headlab's default length)
    takes its architecture from the file under --init, and 60 AdamW steps on the same rows in
    the same order (--shuffle off) follow PyTorch's held-out loss."""
    V, D, L, H, FF, T, B, STEPS, EVAL_EVERY = 11, 32, 2, 4, 64, 24, 8, 60, 10
    HP = dict(lr=3e-3, warmup=10, min_lr_ratio=0.1, weight_decay=0.01, clip=1.0)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = GPT(V, D, L, H, FF, max_len=T)
    with torch.no_grad():  # away from the init: layer norms and biases that are not the identity
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    cfg = dict(vocab_size=V, d_model=D, n_layers=L, n_heads=H, n_kv_heads=H, d_head=D // H, d_ff=FF,
               max_seq_len=T, norm="pre", activation="gelu_erf", positions="learned", attn_bias=True,
               mlp_bias=True, head_bias=True, layer_norm_eps=1e-5)
    ckpt = str(tmp_path / "pytorch.safetensors")
    write_safetensors(ckpt, {interop_name(n): p.detach().numpy() for n, p in model.state_dict().items()},
                      {"format": "headlab-checkpoint", "format_version": "1", "config": json.dumps(cfg)})

    # Rows with something to learn: a random start, then each token the previous plus a row's step.
    def rows(n):
        start = torch.randint(0, V, (n, 1), generator=gen)
        step = torch.randint(1, 4, (n, 1), generator=gen)
        return ((start + step * torch.arange(T)) % V).to(torch.int32)

    train, held = rows(STEPS * B), rows(32)
    np.save(tmp_path / "train.npy", train.numpy())
    np.save(tmp_path / "held.npy", held.numpy())

    # PyTorch: AdamW as headlab's trainer (no decay on biases, norms and embeddings), global-norm clipping
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "emb" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "emb" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": HP["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
                            lr=HP["lr"], betas=(0.9, 0.999), eps=1e-8)
    want = {}
    for step in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, HP["lr"], HP["warmup"], STEPS, HP["min_lr_ratio"])
        loss = lm_loss(model, train[step * B:(step + 1) * B].long())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), HP["clip"])
        opt.step()
        opt.zero_grad()
        if (step + 1) % EVAL_EVERY == 0:
            with torch.no_grad():
                want[step + 1] = lm_loss(model, held.long()).item()

    out = tmp_path / "run"
    cmd = [HEADLAB, "train", "--init", ckpt, "--task", "tokens", "--data", str(tmp_path / "train.npy"),
           "--eval-data", str(tmp_path / "held.npy"), "--shuffle", "off", "--batch", str(B), "--steps", str(STEPS),
           "--lr", str(HP["lr"]), "--warmup", str(HP["warmup"]), "--schedule", "cosine",
           "--min-lr-ratio", str(HP["min_lr_ratio"]), "--weight-decay", str(HP["weight_decay"]),
           "--clip", str(HP["clip"]), "--eval-every", str(EVAL_EVERY), "--eval-size", "32",
           "--threads", "2", "--quiet", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    got = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "loss" in m:
            got[m["step"]] = m["loss"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["model"]["max_seq_len"] == T, summary["config"]["model"]
    assert sorted(got) == sorted(want)
    assert want[STEPS] < 0.5 * want[EVAL_EVERY], want  # it learned: the comparison is not of a flat line
    for s in want:
        assert abs(got[s] - want[s]) <= 2e-3 * want[s], (s, got[s], want[s])
    print("largest relative difference:", max(abs(got[s] - want[s]) / want[s] for s in want))


def test_init_refuses_a_flag_that_contradicts_the_pytorch_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = GPT(11, 32, 1, 4, 64, max_len=24)
    cfg = dict(vocab_size=11, d_model=32, n_layers=1, n_heads=4, n_kv_heads=4, d_head=8, d_ff=64, max_seq_len=24,
               norm="pre", activation="gelu_erf", positions="learned", attn_bias=True, mlp_bias=True,
               head_bias=True, layer_norm_eps=1e-5)
    ckpt = str(tmp_path / "pytorch.safetensors")
    write_safetensors(ckpt, {interop_name(n): p.detach().numpy() for n, p in model.state_dict().items()},
                      {"format": "headlab-checkpoint", "format_version": "1", "config": json.dumps(cfg)})
    np.save(tmp_path / "rows.npy", np.zeros((40, 24), np.int32))
    r = subprocess.run([HEADLAB, "train", "--init", ckpt, "--heads", "2", "--task", "tokens", "--data",
                        str(tmp_path / "rows.npy"), "--steps", "1", "--quiet", "--out", str(tmp_path / "run")],
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "--heads" in r.stderr and "2" in r.stderr and "4" in r.stderr, r.stderr
    assert not (tmp_path / "run" / "model.safetensors").exists()
