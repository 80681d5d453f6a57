"""headlab's block options against scripts/reference/modern_lm.py (PyTorch, written from the
published definitions), in float64: the logits and every parameter's gradient of the loss equal
the reference within float32's arithmetic, for each option, the presets and mixed combinations."""
import os
import sys

import numpy as np
import pytest

import headlab as hl

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian's python3-torch)")

sys.path.insert(0, os.path.join(os.environ.get("HEADLAB_SOURCE_DIR", "."), "scripts", "reference"))
import modern_lm  # noqa: E402

SMALL = dict(d_vocab=11, d_model=16, n_layers=2, n_heads=4, d_mlp=24, n_ctx=8, head_bias=True)
CASES = {
    "rmsnorm": dict(normalization="rmsnorm"),
    "rmsnorm_1p": dict(normalization="rmsnorm_1p"),
    "sandwich layernorm": dict(sandwich_norm=True, attn_bias=True),
    "swiglu": dict(mlp="swiglu"),
    "geglu erf": dict(mlp="geglu", activation="gelu_erf"),
    "relu2": dict(activation="relu2"),
    "parallel": dict(parallel_block=True),
    "embed scale": dict(embed_scale=True),
    "final softcap": dict(final_softcap=2.0),
    "llama": dict(arch="llama", n_key_value_heads=2),
    "neox": dict(arch="neox", d_head=8),  # rotary on 2 of each head's 8
    "gemma2": dict(arch="gemma2", final_softcap=3.0),
    "parallel swiglu rmsnorm_1p sandwich": dict(parallel_block=True, mlp="swiglu", normalization="rmsnorm_1p",
                                                sandwich_norm=True, embed_scale=True),
    "post-norm rmsnorm geglu": dict(norm="post", normalization="rmsnorm", mlp="geglu"),
    # attention options
    "rotary interleaved partial, qk-norm": dict(positions="rotary", rotary_dim=2, rotary_style="interleaved",
                                                 qk_norm=True, rope_theta=100.0),
    "rotary_pct, soft-cap, q/k/v biases": dict(positions="rotary", rotary_pct=0.5, attn_softcap=2.0, qkv_bias=True),
    "nope, unscaled, alternate windows, o bias": dict(positions="none", attn_scale=1.0, sliding_window=3,
                                                      window_layers="alternate", o_bias=True),
    "sinusoidal, scale, 1:1 windows": dict(positions="sinusoidal", attn_scale=0.7, sliding_window=2, window_layers="1:1"),
    "llama + qk-norm + windows": dict(arch="llama", n_key_value_heads=2, qk_norm=True, sliding_window=4),
    # Gemma 3's: the QK-norm of the model's rmsnorm_1p is (1 + w); local layers turn by their own base
    "gemma3-like: (1 + w) qk-norm, local rope base": dict(arch="gemma2", qk_norm=True, rope_theta=1000.0, rope_theta_local=10.0,
                                                          sliding_window=3, window_layers="LG"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_gradients_equal_the_reference(tmp_path, case):
    cfg = hl.ModelConfig(**SMALL, **CASES[case])
    model = hl.TransformerLM(cfg, seed=1)
    rng = np.random.default_rng(2)
    for name, p in model.named_parameters().items():  # away from the init: gains not 1, biases not 0
        a = np.asarray(p.numpy())
        a[...] = rng.normal(0, 0.3, a.shape) + (1.0 if "ln" in name and name.endswith("weight")
                                                and cfg.normalization != "rmsnorm_1p" else 0.0)
    path = str(tmp_path / "m.safetensors")
    model.save(path)
    ids = rng.integers(0, 11, (3, 8))
    targets = np.roll(ids, -1, axis=1)
    targets[:, -1] = -1

    loss = model.loss(ids, targets)
    loss.backward()
    got_logits = np.asarray(model(ids).numpy(), dtype=np.float64)

    ref_cfg, params = modern_lm.load(path, requires_grad=True)
    logits = modern_lm.forward(ref_cfg, params, torch.tensor(ids))
    t = torch.tensor(targets)
    ref_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), t.reshape(-1), ignore_index=-1)
    ref_loss.backward()

    # float32 through two blocks of width 16 to 24: a few hundred unit round-offs of the values'
    # size; 1e-5 of the largest value leaves room and is far below any wrong formula
    want = logits.detach().numpy()
    assert np.abs(got_logits - want).max() <= 1e-5 * (1 + np.abs(want).max()), case
    assert abs(loss.item() - ref_loss.item()) <= 1e-5 * (1 + abs(ref_loss.item()))
    names = dict(model.named_parameters())
    assert sorted(names) == sorted(params)
    for name, p in names.items():
        g = np.asarray(p.grad.numpy(), dtype=np.float64)
        r = params[name].grad.numpy()
        assert np.abs(g - r).max() <= 2e-5 * (1 + np.abs(r).max()), (case, name, np.abs(g - r).max(), np.abs(r).max())


def test_trainer_takes_the_block_options_and_presets(tmp_path):
    """hl.Trainer's keywords are the settings table's: a preset, and a flag that overrides it."""
    t = hl.Trainer(task="induction", arch="gemma2", mlp="swiglu", d_ff=16, steps=2, eval_every=2, threads=1,
                   out=str(tmp_path / "run"))
    cfg = t.model.cfg
    assert (cfg.arch, cfg.normalization, cfg.sandwich_norm, cfg.mlp, cfg.embed_scale, cfg.final_softcap) == \
        ("gemma2", "rmsnorm_1p", True, "swiglu", True, 30.0)
    with pytest.raises(ValueError, match="^mlp must be one of plain, swiglu, geglu, got 'glu'$"):
        hl.Trainer(task="induction", mlp="glu", steps=2, out=str(tmp_path / "bad"))


def test_a_llama_style_model_trains_as_pytorch_does(tmp_path):
    """60 AdamW steps of a Llama-style model (RMSNorm, SwiGLU, no biases, grouped-query attention)
    from the same weights on the same rows in the same order follow the reference's held-out loss
    within 2e-3 relative, as the GPT-2-style model does (test_vs_pytorch.py)."""
    import json
    import math
    import subprocess
    V, T, B, STEPS, EVAL_EVERY = 11, 24, 8, 60, 10
    HP = dict(lr=3e-3, warmup=10, min_lr_ratio=0.1, weight_decay=0.01, clip=1.0)
    cfg = hl.ModelConfig(d_vocab=V, d_model=32, n_layers=2, n_heads=4, n_key_value_heads=2, d_mlp=64, n_ctx=T,
                         arch="llama")
    model = hl.TransformerLM(cfg, seed=0)
    rng = np.random.default_rng(3)
    for name, p in model.named_parameters().items():  # away from the init
        a = np.asarray(p.numpy())
        a += rng.normal(0, 0.1, a.shape).astype(np.float32)
    ckpt = str(tmp_path / "llama.safetensors")
    model.save(ckpt)

    def rows(n):  # a random start, then each token the previous plus a row's step
        start = rng.integers(0, V, (n, 1))
        step = rng.integers(1, 4, (n, 1))
        return ((start + step * np.arange(T)) % V).astype(np.int32)

    train, held = rows(STEPS * B), rows(32)
    np.save(tmp_path / "train.npy", train)
    np.save(tmp_path / "held.npy", held)

    ref_cfg, params = modern_lm.load(ckpt, dtype=torch.float32, requires_grad=True)

    def lm_loss(ids):
        logits = modern_lm.forward(ref_cfg, params, ids)[:, :-1]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1))

    def lr_at(step):
        if step < HP["warmup"]:
            return HP["lr"] * (step + 1) / HP["warmup"]
        t = min(1.0, (step - HP["warmup"]) / max(1, STEPS - HP["warmup"]))
        return HP["min_lr_ratio"] * HP["lr"] + (1 - HP["min_lr_ratio"]) * HP["lr"] * 0.5 * (1.0 + math.cos(math.pi * t))

    decay = [p for n, p in params.items() if p.dim() >= 2 and "emb" not in n]
    rest = [p for n, p in params.items() if not (p.dim() >= 2 and "emb" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": HP["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
                            lr=HP["lr"], betas=(0.9, 0.999), eps=1e-8)
    want = {}
    for step in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        lm_loss(torch.tensor(train[step * B:(step + 1) * B]).long()).backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), HP["clip"])
        opt.step()
        opt.zero_grad()
        if (step + 1) % EVAL_EVERY == 0:
            with torch.no_grad():
                want[step + 1] = lm_loss(torch.tensor(held).long()).item()

    out = tmp_path / "run"
    binary = os.environ.get("HEADLAB_BINARY", "headlab")
    subprocess.run([binary, "train", "--init", ckpt, "--task", "tokens", "--data", str(tmp_path / "train.npy"),
                    "--eval-data", str(tmp_path / "held.npy"), "--shuffle", "off", "--batch", str(B), "--steps", str(STEPS),
                    "--lr", str(HP["lr"]), "--warmup", str(HP["warmup"]), "--schedule", "cosine",
                    "--min-lr-ratio", str(HP["min_lr_ratio"]), "--weight-decay", str(HP["weight_decay"]),
                    "--clip", str(HP["clip"]), "--eval-every", str(EVAL_EVERY), "--eval-size", "32",
                    "--threads", "2", "--quiet", "--out", str(out)], check=True, capture_output=True, text=True)
    got = {m["step"]: m["loss"] for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in m}
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["config"]["model"]["normalization"], summary["config"]["model"]["mlp"]) == ("rmsnorm", "swiglu")
    assert sorted(got) == sorted(want)
    assert want[STEPS] < 0.5 * want[EVAL_EVERY], want  # it learned: the comparison is not of a flat line
    for s in want:
        assert abs(got[s] - want[s]) <= 2e-3 * want[s], (s, got[s], want[s])
    print("largest relative difference:", max(abs(got[s] - want[s]) / want[s] for s in want))
