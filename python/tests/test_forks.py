"""Counterfactual forks from Python (hl.Trainer(fork=RUN, at=STEP, gate=, freeze=)): the same numbers
as the original without an intervention; a frozen head stays put."""
import numpy as np
import pytest

import headlab as hl

SMALL = dict(task="copy", d_model=16, heads=2, layers=2, d_ff=32, length=4, alphabet=5, batch=8, steps=20, eval_every=10,
             eval_size=16, threads=1)


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("forks") / "orig")
    t = hl.Trainer(out=out, snapshot_at=[10], **SMALL)
    t.run(progress=False)
    return out, {k: np.array(v) for k, v in t.model.named_parameters().items()}


def test_fork_without_intervention_reproduces_the_run(original, tmp_path):
    run, weights = original
    f = hl.Trainer(fork=run, at=10, out=str(tmp_path / "plain"))
    f.run(progress=False)
    for k, v in f.model.named_parameters().items():
        assert np.array_equal(np.asarray(v), weights[k]), k


def test_frozen_head_and_refusals(original, tmp_path):
    run, _ = original
    snap = hl.TransformerLM.load(f"{run}/snapshots/step_00000010.safetensors")
    f = hl.Trainer(fork=run, at=10, freeze=["1.1"], out=str(tmp_path / "frozen"))
    f.run(progress=False)
    before = np.asarray(snap.named_parameters()["blocks.1.attn.W_V.weight"])[8:16]
    after = np.asarray(f.model.named_parameters()["blocks.1.attn.W_V.weight"])
    assert np.array_equal(after[8:16], before)   # head 1's rows (d_head 8): exactly kept
    assert not np.array_equal(after[:8], np.asarray(snap.named_parameters()["blocks.1.attn.W_V.weight"])[:8])
    with pytest.raises(hl.HeadlabError, match="has no snapshot at step 15; it has 10"):
        hl.Trainer(fork=run, at=15, out=str(tmp_path / "x"))
    with pytest.raises(ValueError, match=r"give the step of its snapshot to start from \(--at STEP\)"):
        hl.Trainer(fork=run, out=str(tmp_path / "y"))
