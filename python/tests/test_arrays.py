"""The user's own arrays: hl.Batches from arrays and dicts (the tokens task's rule), every
analysis taking arrays directly with the same numbers as the Task path on the same rows, and
the refusals (nothing counted, ids outside the model's vocabulary)."""
from collections.abc import Mapping

import numpy as np
import pytest

import headlab as hl


@pytest.fixture(scope="module")
def trained():
    # copy rows have no padding (n is fixed), so the same rows from arrays are the same batches
    t = hl.Trainer(task="copy", d_model=32, heads=4, steps=60, eval_size=64, quiet=True)
    t.run()
    return t


def rows_of(data):
    """input_ids, targets, prompt_len of all batches of a Batches, concatenated."""
    ids = np.concatenate([data[i]["input_ids"] for i in range(len(data))])
    targets = np.concatenate([data[i]["targets"] for i in range(len(data))])
    prompt = np.concatenate([data[i]["prompt_len"] for i in range(len(data))])
    return ids, targets, prompt


def same_batches(a, b):
    assert len(a) == len(b)
    for i in range(len(a)):
        for k in ("input_ids", "targets", "prompt_len"):
            assert np.array_equal(a[i][k], b[i][k]), (i, k)


def test_batches_from_arrays_and_dicts_are_the_tasks_batches(trained):
    data = trained.task.held_out(70, batch=32)
    ids, targets, prompt = rows_of(data)
    same_batches(hl.Batches(ids, targets, prompt_len=prompt, batch_size=32), data)
    same_batches(hl.Batches({"input_ids": ids, "targets": targets, "prompt_len": prompt}, batch_size=32), data)
    # any integer dtype that holds the ids
    for dtype in (np.int32, np.int64, np.int16, np.uint8):
        same_batches(hl.Batches(ids.astype(dtype), targets.astype(np.int32), prompt_len=prompt, batch_size=32), data)
    b = hl.Batches(ids, targets)
    assert len(b) == 1 and b.rows == 70 and not any(b[0]["prompt_len"])  # batch_size 128, no answers
    assert hl.Batches(ids, targets, prompt_len=np.int64(5))[0]["prompt_len"] == [5] * 70


def test_the_loss_mask_rule_is_the_tokens_tasks():
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 9, size=(5, 8))
    # no targets: position t predicts input t+1, the last position nothing
    lm = hl.Batches(ids)[0]["targets"]
    ref = np.full(ids.shape, -1)
    ref[:, :-1] = ids[:, 1:]
    assert np.array_equal(lm, ref)
    # a mask: position t counts (predicting input t+1) where it is not 0
    mask = rng.random(ids.shape) < 0.5
    mask[:, 0] = True
    want = np.where(mask, ref, -1)
    for m in (mask, mask.astype(np.uint8), mask.astype(np.int64), mask.astype(np.float32) * 0.5):
        assert np.array_equal(hl.Batches(ids, loss_mask=m)[0]["targets"], want)
        assert np.array_equal(hl.Batches({"input_ids": ids, "loss_mask": m})[0]["targets"], want)
    # with targets the mask applies to the targets as given
    targets = rng.integers(0, 9, size=ids.shape)
    assert np.array_equal(hl.Batches(ids, targets, loss_mask=mask)[0]["targets"], np.where(mask, targets, -1))
    # the tokens task trained from the same arrays reads them the same way
    task = hl.Task("tokens", data={"input_ids": ids, "loss_mask": mask}, eval_data={"input_ids": ids, "loss_mask": mask})
    assert np.array_equal(task.held_out(5)[0]["targets"], want)


def test_data_that_counts_nothing_or_cannot_be_ids_is_refused():
    ids = np.arange(24).reshape(3, 8) % 7
    with pytest.raises(hl.HeadlabError, match=r"no position has a target \(its loss_mask is 0 at every position "
                                              r"that has a target\): nothing to measure"):
        hl.Batches(ids, loss_mask=np.zeros(ids.shape, bool))
    last_only = np.zeros(ids.shape, np.uint8)
    last_only[:, -1] = 1  # the last position predicts nothing
    with pytest.raises(hl.HeadlabError, match="its loss_mask is 0 at every position that has a target"):
        hl.Batches(ids, loss_mask=last_only)
    with pytest.raises(hl.HeadlabError, match="every target is -1"):
        hl.Batches(ids, np.full(ids.shape, -1))
    with pytest.raises(hl.HeadlabError, match="sequences of 1 token predict no next token"):
        hl.Batches(ids[:, :1])
    with pytest.raises(TypeError, match="token ids must be integers, got dtype float64"):
        hl.Batches(ids.astype(float))
    with pytest.raises(ValueError, match="id 4294967296 is out of range"):
        hl.Batches(np.full((2, 3), 2**32))
    with pytest.raises(hl.HeadlabError, match="input_ids has the id -3 at row 0, position 0"):
        hl.Batches(np.full((2, 3), -3))
    with pytest.raises(ValueError, match=r"targets has shape \(2,8\) but input_ids is \(3,8\)"):
        hl.Batches(ids, ids[:2])
    with pytest.raises(ValueError, match=r"loss_mask has shape \(3, 7\) but input_ids is \(3, 8\)"):
        hl.Batches(ids, loss_mask=np.ones((3, 7)))
    with pytest.raises(TypeError, match="loss_mask must be bool, integer or float"):
        hl.Batches(ids, loss_mask=np.full(ids.shape, "x"))
    with pytest.raises(ValueError, match="loss_mask holds NaN"):
        hl.Batches(ids, loss_mask=np.full(ids.shape, np.nan))
    with pytest.raises(ValueError, match="unknown key 'mask'"):
        hl.Batches({"input_ids": ids, "mask": ids})
    with pytest.raises(ValueError, match="needs 'input_ids'"):
        hl.Batches({"targets": ids})
    with pytest.raises(ValueError, match="not both"):
        hl.Batches({"input_ids": ids}, targets=ids)
    with pytest.raises(hl.HeadlabError, match=r"prompt_len 9 at row 0 is outside 0..8"):
        hl.Batches(ids, prompt_len=9)
    with pytest.raises(hl.HeadlabError, match="prompt_len has 2 values but input_ids has 3 rows"):
        hl.Batches(ids, prompt_len=[1, 2])
    with pytest.raises(ValueError, match="batch_size must be positive, got 0"):
        hl.Batches(ids, batch_size=0)


def test_ids_outside_the_models_vocabulary_are_refused_naming_them(trained):
    V = trained.model.config.d_vocab
    ids = np.zeros((2, 6), np.int64)
    ids[1, 3] = V + 4
    for fn in (lambda d: hl.evaluate(trained.model, d), lambda d: hl.head_importance(trained.model, d),
               lambda d: hl.detect_heads(trained.model, d)):
        with pytest.raises(hl.HeadlabError, match=rf"input_ids holds the id {V + 4} \(row 1, position 3\), "
                                                  rf"outside the model's vocabulary 0..{V - 1}"):
            fn(ids)
    targets = np.full(ids.shape, -1)
    targets[0, 2] = V
    with pytest.raises(hl.HeadlabError, match=rf"targets holds the id {V} \(row 0, position 2\)"):
        hl.evaluate(trained.model, {"input_ids": np.zeros((2, 6), int), "targets": targets})
    with pytest.raises(hl.HeadlabError, match="longer than the model's max_seq_len"):
        hl.evaluate(trained.model, np.zeros((1, trained.model.config.n_ctx + 1), int))
    with pytest.raises(TypeError, match="give the data"):
        hl.evaluate(trained.model, trained.task)
    with pytest.raises(TypeError, match="task must be a Task"):
        hl.evaluate(trained.model, np.zeros((2, 6), int), np.zeros((2, 6), int))


def test_every_analysis_takes_arrays_with_the_numbers_of_the_task_path(trained):
    model, task = trained.model, trained.task
    data = task.held_out(48, batch=16)
    ids, targets, prompt = rows_of(data)
    forms = [  # the same rows: a dict, a Batches of arrays, keywords
        {"input_ids": ids, "targets": targets, "prompt_len": prompt},
        hl.Batches(ids, targets, prompt_len=prompt, batch_size=16),
    ]

    def same(a, b, exact=True):
        if isinstance(a, Mapping):
            assert a.keys() == b.keys()
            for k in a:
                same(a[k], b[k], exact)
        elif exact:
            assert np.array_equal(a, b)
        else:  # the dict's rows form one batch of 48: sums in another order
            assert np.allclose(a, b, rtol=1e-5, atol=1e-6)

    want = hl.evaluate(model, task, data, autoregressive=True)
    for d in forms:
        same(hl.evaluate(model, d, autoregressive=True), want)
        same(hl.evaluate(model, data=d, autoregressive=True), want)
        same(hl.evaluate(model, task, d, autoregressive=True), want)
    # the Batches of the same batch size: the same numbers bit for bit; the dict: up to rounding
    for name in ("head_importance", "head_importance_per_token", "attention_statistics"):
        fn = getattr(hl, name)
        want = fn(model, data)
        same(fn(model, forms[1]), want)
        same(fn(model, forms[0]), want, exact=False)
    want = hl.single_head_ablation(model, task, data)
    same(hl.single_head_ablation(model, forms[1]), want)
    same(hl.single_head_ablation(model, forms[0]), want, exact=False)
    want = hl.prune_curve(model, task, data, order="ablation")
    got = hl.prune_curve(model, forms[1], order="ablation")
    assert np.array_equal(got["loss"], want["loss"]) and got["removed"] == want["removed"]
    # detectors read input_ids only: a plain array of the rows is enough
    for kind in ("previous_token", "duplicate_token", "induction"):
        want = hl.detect_heads(model, data, kind)
        assert np.allclose(hl.detect_heads(model, ids, kind), want, rtol=1e-6, atol=1e-9)
    # patching corrupts the first batch's rows; the task gives the symbols a corruption may use
    want = hl.activation_patching(model, task, data)
    got = hl.activation_patching(model, hl.Batches(ids, targets, batch_size=16), alphabet=task.symbols)
    same(got, want)
    with pytest.raises(ValueError, match="alphabet 1 must be in 2..13"):
        hl.activation_patching(model, ids, alphabet=1)


def test_input_ids_alone_are_language_modelling(trained):
    model = trained.model
    ids = np.random.default_rng(3).integers(0, model.config.d_vocab, size=(6, 12))
    z = np.asarray(model(ids), dtype=np.float64)[:, :-1]  # (B, T-1, V): position t predicts t+1
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    ref = -np.take_along_axis(logp, ids[:, 1:, None], -1).mean()
    e = hl.evaluate(model, ids)
    assert e["loss"] == pytest.approx(ref, rel=1e-5) and e["tokens"] == 6 * 11
    mask = np.zeros(ids.shape, bool)
    mask[:, 4] = True  # position 4 counts: the prediction of token 5
    ref4 = -np.take_along_axis(logp[:, 4], ids[:, 5, None], -1).mean()
    assert hl.evaluate(model, {"input_ids": ids, "loss_mask": mask})["loss"] == pytest.approx(ref4, rel=1e-5)
    # probes stay Batches
    probe = hl.repeated_random_tokens(8, 5, model.config.d_vocab)
    assert hl.detect_heads(model, probe, "induction").shape == (2, 4)


# ---- headlab view of models trained from arrays ----------------------------------------------------

def test_view_shows_the_held_out_rows_of_a_run_trained_from_arrays(tmp_path):
    import json
    import os
    import subprocess
    import sys
    sys.path.insert(0, os.path.join(os.environ.get("HEADLAB_SOURCE_DIR", "."), "scripts"))
    from safetensors_np import read_safetensors

    headlab = os.environ.get("HEADLAB_BINARY", "headlab")
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 40, size=(60, 10))
    t = hl.Trainer(task="tokens", data=ids, eval_data={"input_ids": ids[:12], "loss_mask": ids[:12] % 2 == 0},
                   steps=3, eval_size=12, out=str(tmp_path / "run"), quiet=True)
    t.run()
    # the trainer saved its held-out rows beside the checkpoint, as a tokens file
    saved = read_safetensors(str(tmp_path / "run" / "eval_data.safetensors"))
    held = t.held_out
    assert np.array_equal(saved["input_ids"], np.concatenate([held[i]["input_ids"] for i in range(len(held))]))
    assert np.array_equal(saved["targets"], np.concatenate([held[i]["targets"] for i in range(len(held))]))
    r = subprocess.run([headlab, "view", str(tmp_path / "run")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "showing its held-out rows" in r.stderr and "cannot open" not in r.stderr
    page = (tmp_path / "run" / "view.html").read_text()
    first = json.dumps([str(int(x)) for x in ids[0]], separators=(",", ":"))
    assert '"held-out 0"' in page and first in page
    # a checkpoint without its task (model.save) shows given tokens
    t.model.save(str(tmp_path / "bare.safetensors"))
    r = subprocess.run([headlab, "view", "--checkpoint", str(tmp_path / "bare.safetensors"), "--tokens", "1 2 3 39",
                        "--out", str(tmp_path / "bare.html")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert '["1","2","3","39"]' in (tmp_path / "bare.html").read_text()
    r = subprocess.run([headlab, "view", "--checkpoint", str(tmp_path / "bare.safetensors"),
                        "--out", str(tmp_path / "bare2.html")], capture_output=True, text=True)
    # ... and without tokens shows the detectors' probe (the model names no task), saying so
    assert r.returncode == 0, r.stderr
    assert "task probe" in (tmp_path / "bare2.html").read_text()
    # eval_data as arrays with data from a file: refused, not silently dropped
    np.save(tmp_path / "ids.npy", ids)
    with pytest.raises(ValueError, match="eval_data as arrays goes with data as arrays"):
        hl.Trainer(task="tokens", data=str(tmp_path / "ids.npy"), eval_data=ids[:5], steps=1)
