"""The residual stream as components and direct logit attribution on ActivationCache
(TransformerLens's names), per-token loss and the eigenvalue copying score: identities, a NumPy
re-computation from hook_z and the weights, the same numbers as `headlab dla`, and clear errors."""
import csv
import os
import subprocess

import numpy as np
import pytest

import headlab as hl

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")
U = 2.0 ** -24  # float32 unit round-off


def random_model(seed=0, **kw):
    """A small model whose every parameter is drawn again (layer norms far from 1 and 0, biases on),
    so a term left out or a weight not folded in shows."""
    cfg = dict(d_model=16, layers=2, heads=4, d_ff=32, vocab_size=11, max_seq_len=12, attn_bias=True)
    cfg.update(kw)
    m = hl.TransformerLM(hl.ModelConfig(**cfg), seed=seed)
    rng = np.random.default_rng(seed)
    for name, p in m.named_parameters().items():
        a = np.asarray(p)
        a[...] = rng.uniform(-0.6, 0.6, size=a.shape) + (1.0 if ("ln" in name and name.endswith("weight")) else 0.0)
    return m


def ids_batch(seed=0, B=3, T=9, vocab=11):
    return np.random.default_rng(seed).integers(0, vocab, size=(B, T))


def test_components_sum_to_the_residual_at_every_layer():
    for kw in [{}, dict(d_ff=0, attn_bias=False), dict(kv_heads=2, layers=3)]:
        m = random_model(1, **kw)
        L = m.config.n_layers
        _, cache = m.run_with_cache(ids_batch())
        for layer in range(L + 1):
            stack, labels = cache.decompose_resid(layer=layer, return_labels=True)
            resid = cache[f"blocks.{layer}.hook_resid_pre"] if layer < L else cache[f"blocks.{L - 1}.hook_resid_post"]
            assert stack.shape == (len(labels), 3, 9, 16) and stack.dtype == np.float64
            # float32 sums in the model (a few residual adds, W_O's and fc2's dot products): 1e-5 of
            # the summed magnitudes
            assert np.all(np.abs(stack.sum(0) - resid) <= 1e-5 * (1 + np.abs(stack).sum(0)))
            assert labels[:2] == ["embed", "pos_embed"]
            if layer:
                assert labels[2:2 + m.config.n_heads] == [f"L0H{h}" for h in range(m.config.n_heads)]
            # the last position alone
            one = cache.decompose_resid(layer=np.int64(layer), pos_slice=np.int32(-1))  # NumPy integers too
            assert np.array_equal(one, stack[:, :, -1])
        acc, acc_labels = cache.accumulated_resid(return_labels=True)
        assert acc_labels == [f"{l}_pre" for l in range(L)] + ["final_post"]
        assert np.array_equal(acc[-1], cache[f"blocks.{L - 1}.hook_resid_post"])
        heads, head_labels = cache.stack_head_results(return_labels=True)
        assert heads.shape[0] == L * m.config.n_heads and head_labels[-1] == f"L{L - 1}H{m.config.n_heads - 1}"
        assert np.array_equal(heads[m.config.n_heads + 1], cache["blocks.1.attn.hook_result"][:, :, 1])


def test_logit_attributions_plus_the_bias_term_are_the_logits():
    m = random_model(2)
    ids = ids_batch(1)
    logits, cache = m.run_with_cache(ids)
    logits = np.asarray(logits)
    scaled = cache.apply_ln_to_stack(cache.decompose_resid())  # (C, B, T, D)
    w = np.asarray(m.named_parameters()["ln_f.weight"])
    W_U = np.asarray(m.named_parameters()["head.weight"]).T  # (D, V)
    for tok in range(11):
        attrs = cache.logit_attrs(scaled, tok)  # (C, B, T)
        total = attrs.sum(0) + cache.final_bias_term(tok)
        # |each product| of the projection: the float32 logit carries ~(D + 8) u of each
        mag = np.abs(scaled * (w * W_U[:, tok])).sum((0, -1)) + abs(cache.final_bias_term(tok))
        assert np.all(np.abs(total - logits[..., tok]) <= 4 * (16 + 8) * U * mag + 1e-6)
        other = (tok + 4) % 11
        diff = cache.logit_attrs(scaled, tok, incorrect_tokens=other).sum(0) + cache.final_bias_term(tok, other)
        assert np.all(np.abs(diff - (logits[..., tok] - logits[..., other])) <= 12 * (16 + 8) * U * mag + 1e-6)
    # per-position tokens (the next token), and at one position from the (B, T) tokens
    nxt = np.roll(ids, -1, axis=1)
    per = cache.logit_attrs(scaled, nxt)
    assert per.shape == scaled.shape[:3]
    at3 = cache.logit_attrs(cache.apply_ln_to_stack(cache.decompose_resid(pos_slice=3), pos_slice=3), nxt, pos_slice=3)
    assert np.allclose(at3, per[:, :, 3], rtol=0, atol=1e-12)


def test_one_heads_attribution_recomputed_with_numpy_from_hook_z():
    m = random_model(3)
    ids = ids_batch(2)
    _, cache = m.run_with_cache(ids)
    layer, head, pos, tok = 1, 3, 5, 7
    heads = cache.stack_head_results(pos_slice=pos, apply_ln=True)  # (L*H, B, D)
    got = cache.logit_attrs(heads, tok)[layer * 4 + head]  # (B)
    p = m.named_parameters()
    z = cache[f"blocks.{layer}.attn.hook_z"][:, pos, head].astype(np.float64)  # (B, d_head)
    W_O = np.asarray(p[f"blocks.{layer}.attn.W_O.weight"], dtype=np.float64)[:, head * 4:(head + 1) * 4]  # (D, d_head)
    r = z @ W_O.T  # (B, D): the head's write
    r -= r.mean(-1, keepdims=True)
    scale = cache["ln_final.hook_scale"][:, pos, 0].astype(np.float64)
    x = cache[f"blocks.{layer}.hook_resid_post"][:, pos].astype(np.float64)
    assert np.allclose(scale, np.sqrt(x.var(-1) + 1e-5), rtol=2 * U, atol=0)  # TransformerLens's hook_scale
    direction = np.asarray(p["ln_f.weight"], dtype=np.float64) * np.asarray(p["head.weight"], dtype=np.float64)[tok]
    want = (r / scale[:, None]) @ direction
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6)


def test_per_token_loss():
    m = random_model(4)
    ids = ids_batch(3)
    logits = np.asarray(m(ids)).astype(np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
    nxt = hl.per_token_loss(m, ids)
    assert nxt.shape == (3, 8)
    want = -np.take_along_axis(logp[:, :-1], ids[:, 1:, None], -1)[..., 0]
    assert np.allclose(nxt, want, rtol=1e-6, atol=1e-6)
    targets = ids.copy()
    targets[0, 2] = -1
    own = hl.per_token_loss(m, ids, targets)
    assert own.shape == (3, 9) and own[0, 2] == 0
    assert np.isclose(own.sum() / (own.size - 1), m.loss(ids, targets).item(), rtol=1e-5)


def test_bad_input_raises_a_clear_error():
    m = random_model(5)
    _, cache = m.run_with_cache(ids_batch())
    with pytest.raises(ValueError, match=r"decompose_resid: layer 3 is outside 0..2"):
        cache.decompose_resid(layer=3)
    with pytest.raises(ValueError, match=r"pos_slice 9 is outside the 9 cached positions"):
        cache.decompose_resid(pos_slice=9)
    stack = cache.apply_ln_to_stack(cache.decompose_resid())
    with pytest.raises(ValueError, match=r"logit_attrs: tokens have shape \(2\) but the stack's positions are \(3, 9\)"):
        cache.logit_attrs(stack, np.array([1, 2]))
    with pytest.raises(ValueError, match=r"token 11 is outside the vocabulary 0..10"):
        cache.logit_attrs(stack, 11)
    with pytest.raises(ValueError, match=r"apply_ln_to_stack: the stack has shape \(14, 3, 9, 16\) but this cache and position need"):
        cache.apply_ln_to_stack(stack, pos_slice=0)
    _, partial = m.run_with_cache(ids_batch(), names_filter=["hook_embed", "hook_pos_embed"])
    with pytest.raises(ValueError, match=r"the cache has no blocks.0.attn.hook_result"):
        partial.decompose_resid()
    with pytest.raises(TypeError, match=r"layer must be an int or None"):
        cache.decompose_resid(layer="1")


def test_the_cli_writes_the_numbers_python_computes(tmp_path):
    run = str(tmp_path / "run")
    hl.Trainer(steps=30, eval_size=16, d_model=32, heads=4, layers=2, out=run).run(progress=False)
    ckpt = run + "/checkpoint.safetensors"
    if not os.path.exists(ckpt):
        ckpt = run + "/model.safetensors"
    out = str(tmp_path / "dla")
    r = subprocess.run([HEADLAB, "dla", "--checkpoint", ckpt, "--examples", "24", "--seed", "5", "--threads", "2", "--out", out],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = {row["component"]: row for row in csv.DictReader(open(out + "/dla.csv"))}
    m = hl.TransformerLM.load(ckpt)
    task = hl.Task("copy")
    per_row = {}
    for i in range(len(data := task.held_out(24, 5, 64))):
        b = data[i]
        ids, targets = np.asarray(b["input_ids"]), np.asarray(b["targets"])
        _, cache = m.run_with_cache(ids)
        stack, labels = cache.decompose_resid(apply_ln=True, return_labels=True)
        attrs = cache.logit_attrs(stack, np.where(targets >= 0, targets, 0))  # (C, B, T)
        counted = targets >= 0
        for c, lab in enumerate(labels):
            per_row.setdefault(lab, []).extend((attrs[c] * counted).sum(1) / counted.sum(1))
    for lab, values in per_row.items():
        assert abs(float(rows[lab]["mean"]) - np.mean(values)) <= 1e-6 * (1 + abs(np.mean(values))), lab
    total = sum(float(rows[lab]["mean"]) for lab in per_row) + float(rows["ln_final_bias"]["mean"])
    assert abs(total - float(rows["logit"]["mean"])) <= 1e-4
    assert float(rows["L1H0"]["ci95_lo"]) <= float(rows["L1H0"]["mean"]) <= float(rows["L1H0"]["ci95_hi"])


def test_copying_score_matches_numpy_eigenvalues_of_the_full_ov_circuit():
    m = random_model(6, vocab_size=13)
    p = {k: np.asarray(v, dtype=np.float64) for k, v in m.named_parameters().items()}
    layer, head, dh = 1, 2, 4
    W_E = p["tok_emb.weight"].T  # (D, V): column v embeds token v
    W_V = p[f"blocks.{layer}.attn.W_V.weight"][head * dh:(head + 1) * dh] * p[f"blocks.{layer}.ln1.weight"]  # (dh, D)
    W_O = p[f"blocks.{layer}.attn.W_O.weight"][:, head * dh:(head + 1) * dh]  # (D, dh)
    W_U = p["head.weight"] * p["ln_f.weight"]  # (V, D)
    full = W_U @ W_O @ W_V @ W_E  # (V, V)
    want = np.linalg.eigvals(full)
    got = hl.ov_eigenvalues(m, layer, head)
    assert got.shape == (dh,) and got.dtype == np.complex128
    # the d_head non-zero eigenvalues, the rest ~0
    big = sorted(want, key=abs)[-dh:]
    for g in got:
        assert min(abs(g - w) for w in big) <= 1e-9 * max(abs(w) for w in want)
    assert np.isclose(hl.copying_score(m, layer, head), want.real.sum() / np.abs(want).sum(), rtol=1e-8, atol=1e-10)
    # a negated OV circuit negates the score
    W_O_param = np.asarray(m.named_parameters()[f"blocks.{layer}.attn.W_O.weight"])
    score = hl.copying_score(m, layer, head)
    W_O_param[:, head * dh:(head + 1) * dh] *= -1
    assert np.isclose(hl.copying_score(m, layer, head), -score, rtol=1e-12)
    with pytest.raises(ValueError, match=r"head \(2, 0\) is outside 2 layers x 4 heads"):
        hl.copying_score(m, 2, 0)
