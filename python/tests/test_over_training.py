# Heads over training: the scores at every snapshot of a run (headlab ANALYSIS --run RUN and
# hl.scores_over_training) against the single-checkpoint commands at each step.
import csv
import math
import os
import subprocess

import numpy as np
import pytest

import headlab as hl

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")
THREADS = ["--threads", "2"]


def cli(*args):
    return subprocess.run([HEADLAB, *args], check=True, capture_output=True, text=True)


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("ot") / "run")
    cli("train", "--quiet", "--d-model", "16", "--layers", "2", "--heads", "2", "--length", "6", "--batch", "16",
        "--steps", "30", "--eval-every", "30", "--eval-size", "32", "--snapshot-every", "20", "--snapshot-at", "5", *THREADS, "--out", d)
    return d


FLAGS = {"detect": ("detect", ["--examples", "24"]), "patch": ("patch", ["--examples", "16"]),
         "dla": ("dla", ["--examples", "24"]), "compose": ("compose", []), "importance": ("prune", ["--eval-size", "48"])}


def test_every_registered_analysis_is_reached_by_its_command_and_by_python():
    # the registry (train/head_analyses.h) names each analysis and the command whose --run gives it;
    # FLAGS drives the CLI and Python runs below: a row left out of it fails here
    rows = hl.head_analyses()
    assert {r["name"]: r["command"] for r in rows} == {a: c for a, (c, _) in FLAGS.items()}
    for r in rows:
        assert r["scores"] and r["help"] and r["default_examples"] >= 1
    with pytest.raises(hl.HeadlabError, match="analysis 'roles' is not one of detect, patch, importance, dla, compose"):
        hl.scores_over_training("no-such-run", analysis="roles")


def test_out_writes_the_files_the_command_and_the_page_read(run, over, tmp_path):
    # out=DIR: the command's CSV and JSON, byte for byte; out=True: RUN/over_training/ANALYSIS, where the page looks
    cli_dir = tmp_path / "cli"
    cli("compose", "--run", run, "--out", str(cli_dir), *THREADS)
    r = hl.scores_over_training(run, analysis="compose", threads=2, out=str(tmp_path / "py"))
    assert r["out"] == str(tmp_path / "py")
    for ext in ("csv", "json"):
        assert (tmp_path / "py" / ("compose_over_training." + ext)).read_bytes() == \
            (cli_dir / ("compose_over_training." + ext)).read_bytes()
    r = hl.scores_over_training(run, analysis="compose", threads=2, out=True)
    assert r["out"] == os.path.join(run, "over_training", "compose")
    assert os.path.isfile(os.path.join(run, "over_training", "compose", "compose_over_training.csv"))
    page = tmp_path / "page.html"
    cli("view", run, "--out", str(page), *THREADS)
    assert '"analysis":"compose"' in page.read_text()


@pytest.fixture(scope="module")
def over(run, tmp_path_factory):
    """Each analysis's ANALYSIS_over_training.csv from `headlab COMMAND --run`, as rows."""
    tmp, rows = tmp_path_factory.mktemp("over"), {}
    for analysis, (command, flags) in FLAGS.items():
        out = str(tmp / analysis)
        cli(command, "--run", run, "--out", out, *flags, *THREADS)
        rows[analysis] = read_csv(os.path.join(out, analysis + "_over_training.csv"))
    return rows


def number(text):
    return math.nan if text == "" else float(text)


@pytest.mark.parametrize("analysis", list(FLAGS))
def test_python_equals_the_cli_and_the_steps_are_the_snapshots(run, over, analysis):
    rows, flags = over[analysis], FLAGS[analysis][1]
    examples = int(flags[1]) if flags else None
    py = hl.scores_over_training(run, analysis=analysis, examples=examples, threads=2)
    # every snapshot (0, 5, 20) and the final checkpoint (30), in order
    assert py["steps"].tolist() == [0, 5, 20, 30]
    assert py["checkpoints"][-1].endswith("checkpoint.safetensors")
    assert list(py["scores"]) == [c for c in rows[0] if c not in ("step", "layer", "head")]
    for name, values in py["scores"].items():
        assert values.shape == (4, 2, 2)
        for r in rows:  # full precision in the CSV: the same doubles
            s = py["steps"].tolist().index(int(r["step"]))
            got, want = values[s, int(r["layer"]), int(r["head"])], number(r[name])
            assert (math.isnan(got) and math.isnan(want)) or got == want, (name, r)


def test_each_step_equals_the_single_checkpoint_command(run, over, tmp_path):
    # a snapshot between others, and the final checkpoint (the loop reads both kinds of file)
    steps, index = [5, 30], [1, 3]
    files = [os.path.join(run, "snapshots", "step_00000005.safetensors"), os.path.join(run, "checkpoint.safetensors")]
    det, pat, dla, com = over["detect"], over["patch"], over["dla"], over["compose"]
    imp = hl.scores_over_training(run, analysis="importance", examples=48, threads=2)["scores"]["importance"]
    at = lambda rows, step, l, h: next(r for r in rows if (r["step"], r["layer"], r["head"]) == (str(step), str(l), str(h)))
    for i, step, ck in zip(index, steps, files):
        one = tmp_path / ("one-%d" % step)
        cli("detect", "--checkpoint", ck, "--examples", "24", "--out", str(one / "d"), *THREADS)
        patched = cli("patch", "--checkpoint", ck, "--examples", "16", "--out", str(one / "p"), *THREADS)
        cli("dla", "--checkpoint", ck, "--examples", "24", "--out", str(one / "dla"), *THREADS)
        cli("compose", "--checkpoint", ck, "--out", str(one / "c"), *THREADS)
        # the single-checkpoint tables round to 6 decimals (dla: 9 significant digits)
        for r in read_csv(one / "d" / "detect.csv"):
            o = at(det, step, r["layer"], r["head"])
            for name in ("previous_token", "duplicate_token", "induction"):
                assert "%.6f" % float(o[name]) == r[name], (step, name, r)
        for r in read_csv(one / "p" / "patch_heads.csv"):
            o = at(pat, step, r["layer"], r["head"])
            if o["exact"] == "":  # left empty over training where the corruption barely moves the metric ...
                assert o["attribution"] == "" and "restored fractions divide by it" in patched.stderr  # ... as patch warns
            else:
                assert "%.6f" % float(o["exact"]) == r["exact"] and "%.6f" % float(o["attribution"]) == r["attribution"]
        for r in read_csv(one / "dla" / "dla.csv"):
            if r["head"]:
                assert "%.9g" % float(at(dla, step, r["layer"], r["head"])["dla"]) == r["mean"], (step, r)
        comp = read_csv(one / "c" / "compose.csv")
        for h in range(2):  # the largest score into head h of layer 1 from layer 0
            for k in "qkv":
                best = max(float(r[k]) for r in comp if r["layer_b"] == "1" and r["head_b"] == str(h))
                assert "%.6f" % float(at(com, step, 1, h)[k + "_composition"]) == "%.6f" % best
            assert at(com, step, 0, h)["q_composition"] == ""  # layer 0 has no layer before it
        # importance: Michel et al.'s on prune's held-out rows, as hl.head_importance gives it
        model = hl.TransformerLM.load(ck)
        data = hl.Task("copy", length=6).held_out(48, 1234, 128)
        assert np.array_equal(np.asarray(hl.head_importance(model, data)), imp[i])


def test_bad_input_says_what_to_do(run, tmp_path):
    with pytest.raises(subprocess.CalledProcessError) as e:
        cli("detect", "--run", run, "--checkpoint", os.path.join(run, "model.safetensors"))
    assert "not both" in e.value.stderr
    bare = str(tmp_path / "bare")
    cli("train", "--quiet", "--d-model", "16", "--layers", "1", "--steps", "5", *THREADS, "--out", bare)
    with pytest.raises(subprocess.CalledProcessError) as e:
        cli("compose", "--run", bare)
    assert bare + " has no snapshots (train with --snapshot-every N" in e.value.stderr
    with pytest.raises(hl.HeadlabError, match="has no snapshots"):
        hl.scores_over_training(bare)
    with pytest.raises(hl.HeadlabError, match="analysis 'heads' is not one of detect, patch, importance, dla, compose"):
        hl.scores_over_training(run, analysis="heads")
    with pytest.raises(subprocess.CalledProcessError) as e:
        cli("detect", "--run", run, "--pattern", "p.safetensors")
    assert "--pattern goes with --checkpoint" in e.value.stderr
