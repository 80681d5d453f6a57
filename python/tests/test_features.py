"""hl.SAE and hl.train_sae: training on a model's hook_z, encode/decode against the SAELens
formula in NumPy, save/load in SAELens's layout bit for bit, and the refusals."""
import numpy as np
import pytest

import headlab as hl


def tiny(seed=0):
    cfg = dict(d_model=16, n_layers=2, n_heads=4, d_mlp=32, d_vocab=11, n_ctx=16)
    return hl.TransformerLM(hl.ModelConfig(**cfg), seed=seed)


IDS = np.random.default_rng(0).integers(0, 11, size=(8, 12))


def test_train_sae_on_hook_z_encodes_and_decodes_as_saelens(tmp_path):
    m = tiny()
    sae = hl.train_sae(m, "blocks.1.attn.hook_z", IDS, architecture="topk", expansion=2, k=3, steps=40, batch=32,
                       lr=1e-2, warmup=5, buffer=96)
    assert (sae.d_in, sae.d_sae, sae.architecture, sae.hook_name) == (16, 32, "topk", "blocks.1.attn.hook_z")
    _, cache = m.run_with_cache(IDS)
    x = np.asarray(cache["blocks.1.attn.hook_z"]).reshape(-1, 16)  # heads concatenated
    f = np.asarray(sae.encode(x))
    pre = (x.astype(np.float64) - sae.b_dec) @ sae.W_enc + sae.b_enc
    keep = np.argsort(-pre, axis=1)[:, :3]
    want = np.zeros_like(pre)
    np.put_along_axis(want, keep, np.maximum(np.take_along_axis(pre, keep, 1), 0), 1)
    np.testing.assert_allclose(f, want, atol=1e-5)
    np.testing.assert_allclose(np.asarray(sae.decode(f)), f @ sae.W_dec + sae.b_dec, atol=1e-5)
    # the decoder rows stayed unit norm
    np.testing.assert_allclose(np.linalg.norm(sae.W_dec, axis=1), 1, atol=1e-5)
    sae.save(tmp_path / "sae")
    back = hl.SAE.load(tmp_path / "sae")
    for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
        assert np.array_equal(getattr(back, name), getattr(sae, name))
    assert np.array_equal(np.asarray(back.encode(x)), f)


def test_train_sae_refuses_a_missing_hook():
    with pytest.raises(ValueError, match=r"the model has no hook point 'blocks.9.attn.hook_z'"):
        hl.train_sae(tiny(), "blocks.9.attn.hook_z", IDS, steps=1)


def test_sae_refuses_activations_of_another_width(tmp_path):
    sae = hl.train_sae(tiny(), "blocks.0.hook_resid_post", IDS, expansion=1, k=2, steps=2, batch=16, buffer=32)
    with pytest.raises(ValueError, match=r"SAE: activations must be \(N, 16\), got \(3,5\)"):
        sae.encode(np.zeros((3, 5), np.float32))
