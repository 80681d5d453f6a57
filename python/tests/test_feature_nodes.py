"""SAE features as nodes from Python: model.add_sae (SAELens's HookedSAETransformer), the SAE's
hook points in run_with_cache and hooks, activation_patching over the feature axis, and
edge_patching's feature senders."""
import numpy as np
import pytest

import headlab as hl

HOOK = "blocks.1.attn.hook_z"
ACTS = HOOK + ".hook_sae_acts_post"


def tiny(seed=0):
    cfg = dict(d_model=16, n_layers=2, n_heads=4, d_mlp=32, d_vocab=11, n_ctx=16)
    return hl.TransformerLM(hl.ModelConfig(**cfg), seed=seed)


IDS = np.random.default_rng(0).integers(0, 11, size=(8, 12))


def spliced():
    m = tiny()
    sae = hl.train_sae(m, HOOK, IDS, architecture="standard", expansion=2, steps=30, batch=32, lr=1e-2, buffer=96)
    return m, sae


def test_an_attached_sae_keeps_the_logits_and_exposes_its_features():
    m, sae = spliced()
    plain = np.asarray(m(IDS))
    m.add_sae(sae)
    assert [s.hook_name for s in m.saes] == [HOOK]
    names = [n for n, _ in m.hook_points()]
    assert names[names.index(HOOK) + 3] == ACTS and HOOK + ".hook_sae_error" in names
    logits, cache = m.run_with_cache(IDS, names_filter=[HOOK, ACTS])
    assert np.array_equal(np.asarray(logits), plain)  # the error term: the model's own logits, bit for bit
    f = np.asarray(sae.encode(np.asarray(cache[HOOK]).reshape(-1, 16)))
    assert np.array_equal(np.asarray(cache[ACTS]).reshape(-1, sae.d_sae), f)
    # ablating a feature through a hook subtracts f_i W_dec[i] from hook_z
    i = int(np.argmax((f > 0).sum(0)))

    def ablate(acts, name):
        out = np.array(acts)
        out[..., i] = 0
        return out

    ablated = np.asarray(m.run_with_hooks(IDS, fwd_hooks=[(ACTS, ablate)]))
    m.reset_saes()
    z = np.asarray(m.run_with_cache(IDS, names_filter=HOOK)[1][HOOK])
    want_z = (z.reshape(-1, 16) - np.outer(f[:, i], sae.W_dec[i])).reshape(z.shape).astype(np.float32)
    by_hand = np.asarray(m.run_with_hooks(IDS, fwd_hooks=[(HOOK, lambda a, n: want_z)]))
    np.testing.assert_allclose(ablated, by_hand, atol=1e-5)
    assert np.abs(ablated - plain).max() > 1e-4
    assert m.saes == [] and np.array_equal(np.asarray(m(IDS)), plain)
    with pytest.raises(ValueError, match="unknown hook point"):
        m.run_with_cache(IDS, names_filter=ACTS)


def test_activation_patching_over_the_feature_axis_and_edge_patching_take_the_features():
    m, sae = spliced()
    clean = IDS[:4]
    corrupted = clean.copy()
    corrupted[:, 2] = (corrupted[:, 2] + 1) % 11
    m.add_sae(sae)
    metric = lambda logits: float(np.asarray(logits)[:, -1, 3].sum())  # noqa: E731
    g = hl.activation_patching(m, clean, corrupted, hook=ACTS, axes=["feature"], metric=metric)
    assert g.shape == (sae.d_sae,)
    # feature j patched = hook_z of the corrupted run + (f_clean - f_corr)_j W_dec[j], on the model alone
    zc = np.asarray(m.run_with_cache(clean, names_filter=HOOK)[1][HOOK]).reshape(-1, 16)
    zk = np.asarray(m.run_with_cache(corrupted, names_filter=HOOK)[1][HOOK]).reshape(-1, 16)
    fc, fk = np.asarray(sae.encode(zc)), np.asarray(sae.encode(zk))
    m.reset_saes()
    for j in np.argsort(-np.abs(fc - fk).max(0))[:3]:
        z = (zk + np.outer(fc[:, j] - fk[:, j], sae.W_dec[j])).reshape(4, 12, 4, 4).astype(np.float32)
        want = metric(m.run_with_hooks(corrupted, fwd_hooks=[(HOOK, lambda a, n: z)]))
        assert abs(g[j] - want) <= 1e-4 * max(1.0, abs(want))
    m.add_sae(sae)
    answers = np.array([[r, 11, clean[r, 2], corrupted[r, 2]] for r in range(4)])
    e = hl.edge_patching(m, clean, corrupted, answers=answers)
    senders = e["feature_senders"]
    assert senders and all(s.startswith("L1z.") for s in senders) and "L1z.err" in senders
    assert set(e["feature_receivers"]) <= {"mlp1", "logits"}
    assert len(e["feature_exact"]) == len(senders) == len(e["feature_attribution"])
