"""Typed results: every analysis returns its result class (named fields as attributes, a repr that
names them, to_dict()), still read as the dict earlier versions returned."""
import numpy as np
import pytest

import headlab as hl


@pytest.fixture(scope="module")
def setup():
    task = hl.Task("copy", length=4, alphabet=8)
    model = hl.TransformerLM(hl.ModelConfig(d_model=16, n_layers=2, n_heads=2, d_mlp=32, d_vocab=task.vocab_size,
                                            n_ctx=task.seq_len), seed=3)
    return model, task, task.held_out(16, batch=16)


def test_each_analysis_returns_its_typed_result(setup):
    model, task, data = setup
    inp = hl.corrupt_one_symbol(task, data)
    got = {
        hl.EvalResult: hl.evaluate(model, task, data),
        hl.AblationResult: hl.single_head_ablation(model, task, data),
        hl.HeadStats: hl.attention_statistics(model, data),
        hl.PruneCurve: hl.prune_curve(model, task, data),
        hl.CompositionScores: hl.composition_scores(model, 0, 1),
        hl.CompositionBaseline: hl.composition_baseline(model.cfg, models=2),
        hl.PatchingInputs: inp,
        hl.PatchingResult: hl.activation_patching(model, task, data),
        hl.EdgeResult: hl.edge_patching(model, inp.clean, inp.corrupted, answers=inp.answers),
        hl.PathPatchingResult: hl.path_patching(model, inp.clean, inp.corrupted, sender="L0H0", answers=inp.answers),
        hl.KnockoutResult: hl.ablate(model, data, "blocks.0.attn.hook_z", head=1),
        hl.HeadMatch: hl.match_heads(model, model, by="weights"),
    }
    for cls, r in got.items():
        assert type(r) is cls
        assert isinstance(r, hl.Result)
    assert type(hl.single_head_ablation(model, task, data).base) is hl.EvalResult
    assert all(type(a) is hl.HeadAnalysis for a in hl.head_analyses())


def test_a_result_reads_as_attributes_and_as_the_old_dict(setup):
    model, task, data = setup
    r = hl.attention_statistics(model, data)
    assert list(r) == ["entropy", "entropy_norm", "confidence", "argmax_distance"]
    assert r.entropy is r["entropy"] and r.entropy.shape == (2, 2)
    assert dict(r).keys() == r.keys() and len(r) == 4 and "confidence" in r
    assert repr(r) == ("HeadStats(entropy=array(2, 2) float64, entropy_norm=array(2, 2) float64, "
                       "confidence=array(2, 2) float64, argmax_distance=array(2, 2) float64)")
    e = hl.evaluate(model, task, data)
    fields = dict(f.split("=") for f in repr(e)[len("EvalResult("):-1].split(", "))
    assert list(fields) == ["loss", "token_acc", "exact_match", "tokens", "sequences"]
    assert fields["tokens"] == str(e.tokens) and fields["sequences"] == "16"
    for k in ("loss", "token_acc", "exact_match"):
        assert "." in fields[k] and float(fields[k]) == pytest.approx(e[k], rel=5e-4, abs=1e-12), k
    with pytest.raises(AttributeError, match="HeadStats has no field 'entropi' \\(fields: entropy, entropy_norm"):
        r.entropi
    with pytest.raises(KeyError, match="no field 'entropi'"):
        r["entropi"]
    with pytest.raises(AttributeError, match="read-only"):
        r.entropy = 0


def test_reprs_print_floats_to_four_significant_digits_with_a_decimal_point():
    r = hl.EvalResult(loss=1.0, token_acc=0.123456, exact_match=12345.678, tiny=1e-7, missing=float("nan"),
                      f32=np.float32(2.0), f64=np.float64(-0.0), zero=0.0, tokens=np.int64(3), flag=True, big=100.0)
    assert repr(r) == ("EvalResult(loss=1.0, token_acc=0.1235, exact_match=1.235e+04, tiny=1e-07, missing=nan, f32=2.0, "
                       "f64=-0.0, zero=0.0, tokens=3, flag=True, big=100.0)")
    # nested: a result inside a result, a dict of floats
    t = hl.TrainResult(final_eval=hl.EvalResult(loss=2.0), curve={"loss": 0.5})
    assert repr(t) == "TrainResult(final_eval=EvalResult(loss=2.0), curve={loss: 0.5})"


def test_to_dict_is_plain_all_the_way_down(setup):
    model, task, data = setup
    a = hl.single_head_ablation(model, task, data)
    d = a.to_dict()
    assert type(d) is dict and type(d["base"]) is dict
    assert d["base"] == dict(a.base)
    assert d["d_loss"] is a.d_loss  # arrays are the same objects, not copies
    b = hl.composition_baseline(model.cfg, models=2).to_dict()
    assert set(b) == {"q", "k", "v"} and set(b["q"]) == {"mean", "lo", "hi"}
    t = hl.Trainer(task="copy", length=4, alphabet=8, d_model=16, layers=1, heads=2, steps=2, eval_every=1,
                   threads=1, quiet=True)
    r = t.run(progress=False)
    assert type(r) is hl.TrainResult and type(r.final_eval) is hl.EvalResult
    assert all(type(c) is hl.EvalResult and "step" in c for c in r.curve)
    plain = r.to_dict()
    assert type(plain["curve"][0]) is dict and plain["curve"][-1]["step"] == 2

