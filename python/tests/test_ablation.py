"""Ablations by hook name (hl.ablate, hl.ablation_hook, hl.mean_activation) and generic activation
patching (hl.activation_patching over a hook's axes), checked against NumPy recomputations, the
model's gates and the command line."""
import csv
import os
import subprocess

import numpy as np
import pytest

import headlab as hl

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")


@pytest.fixture(scope="module")
def trained():
    t = hl.Trainer(task="copy", d_model=32, heads=4, steps=60, eval_size=64)
    t.run(progress=False)
    return t


def per_example_loss(logits, batch):
    """Mean cross-entropy over each row's counted targets, in float64 (NumPy)."""
    logits = np.asarray(logits, dtype=np.float64)
    targets = np.asarray(batch["targets"])
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    out = []
    for r in range(targets.shape[0]):
        cols = np.nonzero(targets[r] >= 0)[0]
        out.append(-logp[r, cols, targets[r, cols]].mean())
    return np.array(out)


def test_zero_ablation_matches_numpy_and_the_gate(trained):
    m, data = trained.model, trained.task.held_out(24, 5, 12)
    r = hl.ablate(m, data, hook="blocks.1.attn.hook_z", head=2, kind="zero")
    n = sum(len(b["input_ids"]) for b in data)
    assert r["clean_losses"].shape == (n,) and r["ablated_losses"].shape == (n,)
    assert r["ablated_loss"] != r["clean_loss"]
    lo, hi = r["ci95"]["d_loss"]
    assert lo <= r["ablated_loss"] - r["clean_loss"] <= hi
    # the hook function gives the same ablated run under run_with_hooks (a NumPy loss of its logits)
    hook = hl.ablation_hook(m, "blocks.1.attn.hook_z", kind="zero", head=2)
    want = np.concatenate([per_example_loss(m.run_with_hooks(b["input_ids"], [("blocks.1.attn.hook_z", hook)]), b)
                           for b in data])
    assert np.allclose(r["ablated_losses"], want, rtol=1e-5, atol=1e-6)
    # zeroing head 2's z is closing its gate: the gated model's clean run, bit for bit
    gates = np.asarray(m.gates(1))
    gates[2] = 0.0
    try:
        same = hl.ablate(m, data, hook="blocks.1.attn.hook_z", head=2, kind="resample", permutation=range(n))
    finally:
        gates[2] = 1.0
    assert np.array_equal(same["clean_losses"], r["ablated_losses"])
    assert np.array_equal(same["ablated_losses"], same["clean_losses"])  # the identity resample changes nothing


def test_mean_and_resample_ablations(trained):
    m, data = trained.model, trained.task.held_out(16, 6, 16)
    mean = hl.mean_activation(m, data, "blocks.0.hook_resid_mid", per_position=True)
    T = len(data[0]["input_ids"][0])
    assert mean.shape == (1, T, 32)
    assert hl.mean_activation(m, data, "blocks.0.hook_resid_mid").shape == (1, 1, 32)
    r = hl.ablate(m, data, hook="blocks.0.hook_resid_mid", kind="mean", per_position=True, positions=np.array([3, 4]))
    hook = hl.ablation_hook(m, "blocks.0.hook_resid_mid", kind="mean", positions=[3, 4], value=mean)
    want = per_example_loss(m.run_with_hooks(data[0]["input_ids"], [("blocks.0.hook_resid_mid", hook)]), data[0])
    assert np.allclose(r["ablated_losses"], want, rtol=1e-5, atol=1e-6)
    s = hl.ablate(m, data, hook="blocks.0.attn.hook_v", head=1, kind="resample", seed=3)
    assert sorted(s["permutation"]) == list(range(16)) and all(s["permutation"] != np.arange(16))


def test_bad_ablations_raise_value_errors_with_the_cli_wording(trained):
    m, data = trained.model, trained.task.held_out(8, 7, 8)
    with pytest.raises(ValueError, match="unknown hook point 'blocks.7.attn.hook_z'"):
        hl.ablate(m, data, hook="blocks.7.attn.hook_z")
    with pytest.raises(ValueError, match="head 4 is outside 0..3"):
        hl.ablate(m, data, hook="blocks.0.attn.hook_z", head=4)
    with pytest.raises(ValueError, match="has no head axis"):
        hl.ablation_hook(m, "blocks.0.hook_resid_pre", head=0)
    with pytest.raises(ValueError, match="expected zero, mean or resample"):
        hl.ablate(m, data, hook="blocks.0.attn.hook_z", kind="half")
    # data as arrays, as every analysis takes it: the same numbers as the Batches they make
    as_batches = hl.ablate(m, data, hook="blocks.0.attn.hook_z", kind="mean", mean_data=data)
    as_arrays = hl.ablate(m, data, hook="blocks.0.attn.hook_z", kind="mean", mean_data=data[0]["input_ids"])
    assert np.array_equal(as_batches["ablated_losses"], as_arrays["ablated_losses"])
    with pytest.raises(ValueError, match="needs its value"):
        hl.ablation_hook(m, "blocks.0.attn.hook_z", kind="mean")


def test_generic_patching_restores_and_refuses(trained):
    m = trained.model
    inp = hl.corrupt_one_symbol(trained.task, trained.task.held_out(8, 8, 8), 3)
    clean, corrupted = inp["clean"], inp["corrupted"]
    clean_logits = np.array(m(clean))
    # the whole residual stream of any layer from the clean run: the clean logits exactly
    g = hl.activation_patching(m, clean, corrupted, hook="hook_resid_pre", axes=("layer",),
                               metric=lambda logits: float(np.abs(np.asarray(logits) - clean_logits).max()))
    assert g.shape == (2,) and np.all(g == 0.0)
    both = hl.activation_patching(m, clean, corrupted, hook="hook_z", axes=("layer", "head", "pos"), answers=inp["answers"])
    assert both.shape == (2, 4, clean.shape[1])
    with pytest.raises(ValueError, match="must have one shape"):
        hl.activation_patching(m, clean, corrupted[:, :-1], hook="hook_z", answers=inp["answers"])
    with pytest.raises(ValueError, match="has no head axis"):
        hl.activation_patching(m, clean, corrupted, hook="hook_resid_pre", axes=("layer", "head"), answers=inp["answers"])
    with pytest.raises(ValueError, match="give answers"):
        hl.activation_patching(m, clean, corrupted, hook="hook_z")
    with pytest.raises(ValueError, match="give answers"):  # positional: the generic form, not (model, task, data)
        hl.activation_patching(m, clean, corrupted)


def test_cli_and_python_patching_agree_bit_for_bit(tmp_path):
    ck = str(tmp_path / "run")
    subprocess.run([HEADLAB, "train", "--task", "copy", "--d-model", "32", "--steps", "40", "--threads", "2", "--quiet",
                    "--out", ck], check=True, capture_output=True)
    out = str(tmp_path / "patch")
    subprocess.run([HEADLAB, "patch", "--checkpoint", ck + "/model.safetensors", "--examples", "8", "--seed", "11",
                    "--threads", "2", "--hook", "hook_z", "--axes", "layer,head", "--out", out],
                   check=True, capture_output=True)
    rows = list(csv.DictReader(open(os.path.join(out, "patch_hook_z.csv"))))
    hl.set_num_threads(2)
    m = hl.TransformerLM.load(ck + "/model.safetensors")
    task = hl.Task("copy")
    data = task.held_out(8, 11, 8)
    inp = hl.corrupt_one_symbol(task, data, 11)
    g = hl.activation_patching(m, inp["clean"], inp["corrupted"], hook="hook_z", axes=("layer", "head"),
                               answers=inp["answers"])
    assert g.shape == (2, 4) and len(rows) == 8
    for row in rows:
        assert float(row["restored"]) == g[int(row["layer"]), int(row["head"])]
    # and the per-head patching of activation_patching(model, task, data) is the same loop
    assert np.array_equal(hl.activation_patching(m, task, data, seed=11)["z_exact"], g)
