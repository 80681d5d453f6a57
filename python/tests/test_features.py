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


def test_batchtopk_trains_on_layer_normed_rows_by_default_and_keeps_it_in_its_files(tmp_path):
    m = tiny()
    sae = hl.train_sae(m, "blocks.1.attn.hook_z", IDS, architecture="batchtopk", expansion=2, k=3, steps=20, batch=32,
                       lr=1e-2, buffer=96)
    assert sae.normalize_activations == "layer_norm"
    _, cache = m.run_with_cache(IDS)
    x = np.asarray(cache["blocks.1.attn.hook_z"]).reshape(-1, 16).astype(np.float64)
    mu = x.mean(1, keepdims=True)
    xn = (x - mu) / (x.std(1, ddof=1, keepdims=True) + 1e-5)
    pre = (xn - sae.b_dec) @ sae.W_enc + sae.b_enc
    f = np.asarray(sae.encode(x))
    assert (f != 0).any()
    np.testing.assert_allclose(f[f != 0], pre[f != 0], atol=1e-4)  # the kept entries pass unchanged
    # forward(x): decode's normalised output scaled back by each row's std (no eps) and mean, in x's units
    sd = x.std(1, ddof=1, keepdims=True)
    want = (f.astype(np.float64) @ sae.W_dec + sae.b_dec) * sd + mu
    np.testing.assert_allclose(np.asarray(sae.forward(x)), want, rtol=1e-4, atol=1e-4)
    assert np.array_equal(np.asarray(sae(x)), np.asarray(sae.forward(x)))
    sae.save(tmp_path / "sae")
    back = hl.SAE.load(tmp_path / "sae")
    assert back.normalize_activations == "layer_norm" and np.array_equal(np.asarray(back.encode(x)), f)
    assert hl.train_sae(m, "blocks.1.attn.hook_z", IDS, architecture="batchtopk", expansion=2, k=3, steps=2, batch=16,
                        buffer=32, normalize_activations="none").normalize_activations == "none"
    assert hl.train_sae(m, "blocks.1.attn.hook_z", IDS, expansion=2, k=3, steps=2, batch=16,
                        buffer=32).normalize_activations == "none"


def test_train_sae_refuses_a_missing_hook():
    with pytest.raises(ValueError, match=r"the model has no hook point 'blocks.9.attn.hook_z'"):
        hl.train_sae(tiny(), "blocks.9.attn.hook_z", IDS, steps=1)


def test_sae_refuses_activations_of_another_width(tmp_path):
    sae = hl.train_sae(tiny(), "blocks.0.hook_resid_post", IDS, expansion=1, k=2, steps=2, batch=16, buffer=32)
    with pytest.raises(ValueError, match=r"SAE: activations must be \(N, 16\), got \(3,5\)"):
        sae.encode(np.zeros((3, 5), np.float32))


def test_evaluate_sae_reports_the_loss_recovered_as_its_three_losses_say():
    m = tiny()
    sae = hl.train_sae(m, "blocks.1.hook_resid_post", IDS, expansion=2, k=4, steps=30, batch=32, lr=1e-2, buffer=96)
    r = hl.evaluate_sae(m, sae, IDS)
    # the clean loss is the model's own next-token loss on the same ids
    assert r["loss_clean"] == pytest.approx(hl.evaluate(m, IDS)["loss"], rel=1e-6)
    gap = r["loss_zero_ablated"] - r["loss_clean"]
    assert r["loss_recovered"] == pytest.approx((r["loss_zero_ablated"] - r["loss_spliced"]) / gap, rel=1e-9)
    assert len(r["density"]) == sae.d_sae
    assert sum(b["features"] for b in r["density_histogram"]) == sae.d_sae
    assert r["density_histogram"][0]["log10_density_from"] is None
    assert r["dead_fraction"] == pytest.approx(np.mean(np.asarray(r["density"]) == 0))


def test_train_sae_makes_a_transcoder_from_the_mlp_input_to_its_output(tmp_path):
    m = tiny()
    tc = hl.train_sae(m, "blocks.0.ln2.hook_normalized", IDS, hook_out="blocks.0.hook_mlp_out", expansion=2, k=4,
                      steps=30, batch=32, lr=1e-2, buffer=96)
    assert (tc.hook_name, tc.hook_name_out, tc.d_in, tc.d_out) == ("blocks.0.ln2.hook_normalized",
                                                                    "blocks.0.hook_mlp_out", 16, 16)
    _, cache = m.run_with_cache(IDS)
    x = np.asarray(cache["blocks.0.ln2.hook_normalized"]).reshape(-1, 16)
    pre = x.astype(np.float64) @ tc.W_enc + tc.b_enc  # a transcoder never subtracts b_dec
    keep = np.argsort(-pre, axis=1)[:, :4]
    want = np.zeros_like(pre)
    np.put_along_axis(want, keep, np.maximum(np.take_along_axis(pre, keep, 1), 0), 1)
    np.testing.assert_allclose(np.asarray(tc.encode(x)), want, atol=1e-5)
    r = hl.evaluate_sae(m, tc, IDS)
    assert r["loss_spliced"] != r["loss_clean"]  # the splice replaced the MLP's output
    tc.save(tmp_path / "tc")
    back = hl.SAE.load(tmp_path / "tc")
    assert (back.hook_name_out, back.d_out) == ("blocks.0.hook_mlp_out", 16)
    # a BatchTopK transcoder keeps its rows as they are (layer_norm is an autoencoder's)
    btc = hl.train_sae(m, "blocks.0.ln2.hook_normalized", IDS, hook_out="blocks.0.hook_mlp_out", architecture="batchtopk",
                       expansion=2, k=4, steps=2, batch=16, buffer=32)
    assert btc.normalize_activations == "none"


def test_train_sae_in_a_run_directory_resumes_bit_for_bit(tmp_path):
    # the files `headlab sae --out` writes; 12 steps + a resume to 24 = 24 straight, byte for byte
    kw = dict(architecture="jumprelu", jumprelu_sparsity="tanh", expansion=2, batch=16, lr=1e-2, warmup=3, buffer=48,
              bandwidth=0.05, snapshot_every=6)
    m = tiny()
    straight = hl.train_sae(m, "blocks.1.attn.hook_z", IDS, steps=24, out=tmp_path / "straight", **kw)
    names = {".headlab-kind", "cfg.json", "sae_weights.safetensors", "metrics.json", "sae_state.safetensors", "snapshots"}
    assert set(p.name for p in (tmp_path / "straight").iterdir()) == names
    assert sorted(p.name for p in (tmp_path / "straight" / "snapshots").iterdir()) == ["step12", "step18", "step6"]
    hl.train_sae(m, "blocks.1.attn.hook_z", IDS, steps=12, out=tmp_path / "half", **kw)
    resumed = hl.train_sae(m, "blocks.1.attn.hook_z", IDS, steps=24, out=tmp_path / "half", resume=True, **kw)
    for f in ("sae_weights.safetensors", "cfg.json"):
        assert (tmp_path / "half" / f).read_bytes() == (tmp_path / "straight" / f).read_bytes()
    assert np.array_equal(resumed.W_enc, straight.W_enc)
    with pytest.raises(ValueError, match="holds an SAE run already: continue it with resume=True"):
        hl.train_sae(m, "blocks.1.attn.hook_z", IDS, steps=24, out=tmp_path / "half", **kw)
    with pytest.raises(ValueError, match="cannot resume: lr is"):
        hl.train_sae(m, "blocks.1.attn.hook_z", IDS, steps=30, out=tmp_path / "half", resume=True, **{**kw, "lr": 2e-2})
