"""No silent wrong result from Python: a resume on a changed data file, NaN logits from an
ablation, a view of -1 or 0 rows; paths as pathlib.Path; arguments of the wrong type named with
the type they take; messages that name the file and cause."""
import pathlib

import numpy as np
import pytest

import headlab as hl

SMALL = dict(d_model=16, heads=2, layers=1, d_ff=32, batch=8, eval_size=16, threads=1)


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("wrong") / "run"  # a pathlib.Path: out= takes one
    t = hl.Trainer(out=out, task="copy", length=4, alphabet=5, steps=6, snapshot_at=[3], **SMALL)
    t.run(progress=False)
    return out, t


def test_resume_refuses_a_changed_data_file(tmp_path):
    data = tmp_path / "data.npy"
    rng = np.random.default_rng(0)
    np.save(data, rng.integers(0, 10, size=(40, 8)).astype(np.int32))
    out = tmp_path / "tok"
    hl.Trainer(out=out, task="tokens", data=data, steps=3, **SMALL).run(progress=False)
    hl.Trainer(out=out, resume=True, steps=4).run(progress=False)  # the same file: continues
    np.save(data, rng.integers(0, 10, size=(40, 8)).astype(np.int32))  # same size, other tokens
    with pytest.raises(ValueError, match=r"data\.npy: the run's data file has changed since the run began"):
        hl.Trainer(out=out, resume=True, steps=5)


def test_nan_logits_from_an_ablation_raise_naming_it(copy_run):
    _, t = copy_run
    data = t.task.held_out(8, 1, 8)
    with pytest.raises(ValueError, match=r"the zero ablation of blocks\.0\.ln1\.hook_scale makes the model's logits non-finite"):
        hl.ablate(t.model, data, "blocks.0.ln1.hook_scale")
    r = hl.ablate(t.model, data, "blocks.0.attn.hook_z", head=0)  # a finite ablation still works
    assert np.isfinite(r["ablated_loss"])


def test_view_refuses_row_counts_that_are_not_positive_whole_numbers():
    m = hl.TransformerLM(hl.ModelConfig(vocab_size=20, layers=1, heads=2, d_model=16, d_ff=32), 0)
    ids = np.random.default_rng(0).integers(0, 20, size=(3, 6))
    for bad in (-1, 0):
        with pytest.raises(ValueError, match=f"view: examples must be at least 1, got {bad}"):
            hl.view(m, ids, examples=bad)
    with pytest.raises(TypeError, match="view: examples must be a whole number, got bool"):
        hl.view(m, ids, examples=True)
    assert hl.view(m, ids, examples=3).html.count('"name":"example ') == 3


def test_scores_over_training_refuses_an_unknown_task_and_a_bool(copy_run):
    out, _ = copy_run
    with pytest.raises(ValueError, match="task: unknown task 'junk'"):
        hl.scores_over_training(out, task="junk")
    with pytest.raises(TypeError, match="examples must be a whole number, got bool"):
        hl.scores_over_training(out, examples=True)


def test_paths_may_be_pathlib_paths(copy_run, tmp_path):
    out, t = copy_run
    m = hl.TransformerLM.load(pathlib.Path(out) / "model.safetensors")
    m.save(tmp_path / "copy.safetensors")
    assert (tmp_path / "copy.safetensors").is_file()
    t.save(tmp_path / "trainer.safetensors")
    assert (tmp_path / "trainer.safetensors").is_file()
    with pytest.raises(TypeError, match=r"str \| os.PathLike"):
        hl.TransformerLM.load(3)


def test_wrong_argument_types_are_named_with_the_type_they_take(copy_run, tmp_path):
    out, t = copy_run
    with pytest.raises(TypeError, match=r"gate: expected a list of str such as \['0.1=0'\], got str"):
        hl.Trainer(fork=out, at=3, gate="0.0=0", out=tmp_path / "g")
    with pytest.raises(TypeError, match=r"freeze: expected a list of str such as \['0.1'\], got list"):
        hl.Trainer(fork=out, at=3, freeze=[0], out=tmp_path / "f")
    ids = np.array([[1, 2, 3, 1, 2, 3]], dtype=np.int32)
    with pytest.raises(TypeError, match=r"receivers: expected a list of str such as \['L1H0.q', 'logits'\], got dict"):
        hl.path_patching(t.model, ids, ids, sender="L0H0", receivers={"L0H1.q": 1}, answers=[[0, 5, 1, 2]])


def test_tokenizer_vocab_that_is_not_utf8_names_the_file(tmp_path):
    (tmp_path / "vocab.json").write_bytes(b'{"a": 0, "\xff\xfe": 1}')
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(ValueError) as e:
        hl.Tokenizer.load(tmp_path)  # a pathlib.Path too
    message = str(e.value)
    assert "vocab.json: not JSON" in message and "UTF-8" in message, message
    assert "[json.exception" not in message
