"""bf16 mixed precision from Python: hl.precision("bf16") around a study (a warning says the
results are approximate; they differ from float32's, slightly) and Trainer(precision="bf16")."""
import warnings

import pytest

import headlab as hl

# d_model 128: weights at least 128 wide on both sides run in bf16; thinner ones stay float32
# (docs/performance.md, the per-shape rule).

@pytest.fixture(scope="module")
def trained():
    t = hl.Trainer(task="copy", d_model=128, heads=2, layers=2, d_ff=512, length=4, alphabet=5, batch=32, steps=30,
                   eval_size=64, threads=2, quiet=True)
    t.run()
    return t


def test_precision_block_warns_and_evaluates_close_to_float32(trained):
    m, data = trained.model, trained.task.held_out(64)
    f32 = hl.evaluate(m, data)["loss"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with hl.precision("bf16") as p:
            assert p.name == "bf16"
            b16 = hl.evaluate(m, data)["loss"]
    assert any("precision bf16: results are approximate" in str(w.message) for w in caught)
    assert b16 != f32
    assert abs(b16 - f32) <= 0.01 * f32
    assert hl.evaluate(m, data)["loss"] == f32  # float32 again after the block


def test_unknown_precision_is_refused():
    with pytest.raises(hl.HeadlabError, match="precision: 'fp8' is not a precision"):
        hl.precision("fp8")


def test_trainer_takes_precision():
    kw = dict(task="copy", d_model=128, heads=2, layers=2, d_ff=512, length=4, alphabet=5, batch=32, steps=10,
              eval_size=64, threads=2, quiet=True)
    a, b = hl.Trainer(precision="bf16", **kw), hl.Trainer(**kw)
    a.run()
    b.run()
    la, lb = a.evaluate()["loss"], b.evaluate()["loss"]
    assert la != lb
    assert abs(la - lb) <= 0.005 * lb
