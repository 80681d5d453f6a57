"""`headlab dla` on a model with a final logit soft-cap (Gemma 2's cap * tanh(logit / cap)): the capped
logit is not a sum of components, so the attributions, and the row they sum to, are of the logit
before the cap, and the command says so (the row is named logit_before_cap, not logit)."""
import csv
import os
import subprocess

import numpy as np

import headlab as hl

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")
TOKENS = [1, 4, 2, 6, 3, 5]


def dla_rows(tmp_path, **cfg):
    m = hl.TransformerLM(hl.ModelConfig(d_vocab=7, d_model=16, n_layers=2, n_heads=2, d_mlp=12, n_ctx=8, **cfg), seed=5)
    rng = np.random.default_rng(1)
    for name, p in m.named_parameters().items():  # logits large enough for the cap to bend them
        if name.endswith("weight") and "ln" not in name:
            a = np.asarray(p.numpy())
            a[...] = rng.normal(0, 0.8, a.shape)
    ckpt, out = str(tmp_path / "m.safetensors"), tmp_path / "dla"
    m.save(ckpt)
    r = subprocess.run([HEADLAB, "dla", "--checkpoint", ckpt, "--tokens", ",".join(map(str, TOKENS)), "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = {row["component"]: float(row["mean"]) for row in csv.DictReader(open(out / "dla.csv"))}
    logits, cache = m.run_with_cache(np.array([TOKENS]))
    params = {n: np.asarray(p.numpy(), dtype=np.float64) for n, p in m.named_parameters().items()}
    before = np.asarray(cache["ln_final.hook_normalized"], dtype=np.float64)[0] @ params["head.weight"].T
    if "head.bias" in params:
        before += params["head.bias"]
    logits = np.asarray(logits.numpy(), dtype=np.float64)[0]  # the model's logits (capped when it caps)
    pick = lambda z: np.array([z[t, TOKENS[t + 1]] for t in range(len(TOKENS) - 1)])
    return rows, pick(logits), pick(before), r.stdout


def test_dla_of_a_soft_capped_model_is_of_the_logit_before_the_cap(tmp_path):
    cap = 2.0
    rows, capped, before, said = dla_rows(tmp_path, final_softcap=cap)
    np.testing.assert_allclose(capped, cap * np.tanh(before / cap), rtol=1e-5, atol=1e-5)  # ln_final -> W_U -> cap
    assert "logit" not in rows and "the attributions are of the logit before the cap" in said
    assert abs(np.mean(capped) - np.mean(before)) > 0.05  # the cap bends these logits: the test tells them apart
    assert abs(rows["logit_before_cap"] - np.mean(before)) <= 1e-4 * (1 + abs(np.mean(before)))
    parts = sum(v for k, v in rows.items() if k != "logit_before_cap")  # the components and ln_final_bias
    assert abs(parts - rows["logit_before_cap"]) <= 1e-4 * (1 + abs(np.mean(before)))


def test_dla_without_a_cap_is_of_the_logit(tmp_path):
    rows, logit, before, said = dla_rows(tmp_path)
    np.testing.assert_allclose(logit, before, rtol=1e-5, atol=1e-5)
    assert "logit_before_cap" not in rows and "before the cap" not in said
    assert abs(rows["logit"] - np.mean(logit)) <= 1e-4 * (1 + abs(np.mean(logit)))
