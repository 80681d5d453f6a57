"""Composition under rotary positions, through both doors: hl.composition_scores(offset=k) and
`headlab compose --offset k` equal the scores of the QK circuit read off a run's own hook_rot_q and
hook_rot_k (the model's rotation, not a formula of ours); without an offset they are the mean over
every offset; V-composition and models without rotary positions do not depend on the offset."""
import os
import subprocess

import numpy as np
import pytest

import headlab as hl

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")
D, H, DH, T = 8, 2, 4, 5


def model(**kw):
    cfg = dict(d_vocab=11, d_model=D, n_layers=2, n_heads=H, d_mlp=12, n_ctx=T, attn_bias=False, positions="rotary")
    cfg.update(kw)
    return hl.TransformerLM(hl.ModelConfig(**cfg), seed=3)


def qk_from_hooks(m, layer, offset):
    """W_QK(offset)[h] (D x D) with x_i^T W x_j = hook_rot_q[i] . hook_rot_k[j] for i - j = offset: layer's
    attention is fed basis vectors (e_a at the query position `offset` >= 1, e_b at the key position 0)."""
    x = np.zeros((D * D, T, D), dtype=np.float32)
    for a in range(D):
        for b in range(D):
            x[a * D + b, 0, b] = 1
            x[a * D + b, offset, a] = 1
    got = {}

    def keep(t, name):
        got[name.split(".")[-1]] = np.asarray(t, dtype=np.float64).copy()

    m.run_with_hooks(np.zeros((D * D, T), dtype=np.int64),
                     fwd_hooks=[(f"blocks.{layer}.ln1.hook_normalized", lambda t, name: x),
                                (f"blocks.{layer}.attn.hook_rot_q", keep), (f"blocks.{layer}.attn.hook_rot_k", keep)])
    q = got["hook_rot_q"].reshape(D * D, T, H, DH)[:, offset]
    k = got["hook_rot_k"].reshape(D * D, T, H, DH)[:, 0]
    s = np.einsum("rhd,rhd->hr", q, k).reshape(H, D, D)  # [h][a][b]
    return s


def weights(m, layer):
    p = {n: np.asarray(t.numpy(), dtype=np.float64) for n, t in m.named_parameters().items()}
    return p[f"blocks.{layer}.attn.W_V.weight"], p[f"blocks.{layer}.attn.W_O.weight"]


def scores_from_hooks(m, offset):
    wv, wo = weights(m, 0)
    qk = qk_from_hooks(m, 1, offset)
    ks, qs = np.zeros((H, H)), np.zeros((H, H))
    for a in range(H):
        ov = wo[:, a * DH:(a + 1) * DH] @ wv[a * DH:(a + 1) * DH]
        for b in range(H):
            w = qk[b]
            norm = np.linalg.norm(w) * np.linalg.norm(ov)
            ks[a, b], qs[a, b] = np.linalg.norm(w @ ov) / norm, np.linalg.norm(w.T @ ov) / norm
    return qs, ks


def compose_csv(m, tmp_path, *flags):
    ckpt, out = str(tmp_path / "m.safetensors"), tmp_path / ("c" + "".join(flags))
    m.save(ckpt)
    r = subprocess.run([HEADLAB, "compose", "--checkpoint", ckpt, "--out", str(out), *flags], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = [line.split(",") for line in (out / "compose.csv").read_text().splitlines()[1:]]
    return {kind: np.array([[float(r[4 + i]) for r in rows if r[0] == "0" and int(r[1]) == a] for a in range(H)])
            for i, kind in enumerate("qkv")}, r.stdout


@pytest.mark.parametrize("rotary", [dict(), dict(rotary_style="interleaved", rotary_dim=2)], ids=["half", "interleaved partial"])
def test_rotary_composition_at_an_offset_is_that_of_the_runs_own_rotated_scores(tmp_path, rotary):
    m = model(**rotary)
    per_offset = []
    for offset in range(1, T):
        qs, ks = scores_from_hooks(m, offset)
        got = hl.composition_scores(m, 0, 1, offset=offset)
        np.testing.assert_allclose(got["k"], ks, rtol=1e-5)
        np.testing.assert_allclose(got["q"], qs, rtol=1e-5)
        per_offset.append(got)
    assert not np.allclose(per_offset[0]["k"], per_offset[2]["k"], rtol=1e-3)  # the offset matters
    at0 = hl.composition_scores(m, 0, 1, offset=0)
    for got in per_offset:
        np.testing.assert_array_equal(got["v"], at0["v"])  # W_OV is never rotated
    # no offset: the mean over offsets 0..n_ctx-1, in both doors
    mean = hl.composition_scores(m, 0, 1)
    for kind in "qk":
        np.testing.assert_allclose(mean[kind], np.mean([at0[kind]] + [g[kind] for g in per_offset], axis=0), rtol=1e-9)
    csv, said = compose_csv(m, tmp_path)
    assert f"mean over key offsets 0..{T - 1}" in said
    csv2, said2 = compose_csv(m, tmp_path, "--offset", "2")
    assert "at key offset 2" in said2
    for kind in "qkv":
        np.testing.assert_allclose(csv[kind], mean[kind], atol=5.1e-7)
        np.testing.assert_allclose(csv2[kind], per_offset[1][kind], atol=5.1e-7)


def test_without_rotary_positions_every_offset_scores_the_same_and_a_bad_offset_is_named(tmp_path):
    for positions in ("learned", "none"):
        m = model(positions=positions)
        base = hl.composition_scores(m, 0, 1)
        for offset in (0, 3):
            got = hl.composition_scores(m, 0, 1, offset=offset)
            for kind in "qkv":
                np.testing.assert_array_equal(got[kind], base[kind])
        np.testing.assert_array_equal(hl.qk_singular_values(m, 1, 0, offset=4), hl.qk_singular_values(m, 1, 0))
    csv, _ = compose_csv(m, tmp_path)
    csv3, _ = compose_csv(m, tmp_path, "--offset", "3")
    for kind in "qkv":
        np.testing.assert_array_equal(csv[kind], csv3[kind])
    with pytest.raises(ValueError, match=f"offset 5 is outside the key offsets 0..4"):
        hl.composition_scores(model(), 0, 1, offset=5)
    model().save(str(tmp_path / "r.safetensors"))
    r = subprocess.run([HEADLAB, "compose", "--checkpoint", str(tmp_path / "r.safetensors"), "--offset", "5", "--out",
                        str(tmp_path / "bad")], capture_output=True, text=True)
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1].endswith("--offset 5 is outside the key offsets 0..4 (max_seq_len 5)")
    assert not (tmp_path / "bad").exists()


def test_rotary_qk_singular_values_are_those_of_the_rotated_circuit():
    m = model(rotary_style="interleaved", rotary_dim=2)
    svals = []
    for offset in range(1, T):
        qk = qk_from_hooks(m, 1, offset)
        ref = np.linalg.svd(qk[0], compute_uv=False)[:DH]
        np.testing.assert_allclose(hl.qk_singular_values(m, 1, 0, offset=offset), ref, rtol=1e-5, atol=1e-6)
        svals.append(ref)
    svals.append(hl.qk_singular_values(m, 1, 0, offset=0))
    np.testing.assert_allclose(hl.qk_singular_values(m, 1, 0), np.mean(svals, axis=0), rtol=1e-5)
