"""One run plan for both doors: every combination of run-control settings below goes through
`headlab train` (the command line) and through hl.Trainer (Python), and both refuse it in the same
words, or both accept it and plan the same run (train/run_plan.h)."""
import json
import os
import shutil
import subprocess

import pytest

import headlab as hl

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")
SMALL = dict(d_model=16, layers=1, heads=2, d_ff=32, length=4, alphabet=5, batch=8, eval_size=16, steps=4, eval_every=2,
             threads=1)

# (name, the settings given (as Python keywords; the command line gets the same as flags), the
# refusal both give, or None when both accept). {run}: a finished run with a snapshot at step 2 and
# its model; {out}: a new directory; {file}: an existing file; {copy}: a copy of {run} for each door.
# A range of a single setting is worded with the setting's own name: --threads on the command
# line, threads in Python; {threads} stands for it.
CASES = [
    ("fork without at", dict(fork="{run}"), "--fork {run}: give the step of its snapshot to start from (--at STEP)"),
    ("at without fork", dict(at=2), "--at 2 goes with --fork RUN"),
    ("fork and init", dict(fork="{run}", at=2, init="{run}/model.safetensors"),
     "--init and --fork both give the starting weights: choose one"),
    ("fork_from and init", dict(fork_from="{run}/checkpoint.safetensors", init="{run}/model.safetensors"),
     "--init and --fork both give the starting weights: choose one"),
    ("fork and fork_from", dict(fork="{run}", at=2, fork_from="{run}/checkpoint.safetensors"),
     "--fork and --fork-from both name the state to fork from: choose one"),
    ("resume and init", dict(resume=True, init="{run}/model.safetensors"),
     "--init gives a new run its starting weights and --resume continues from the run's checkpoint: choose one"),
    ("resume and fork", dict(resume=True, fork="{run}", at=2),
     "--resume continues a run (a fork too) from its own checkpoint: leave out --fork"),
    ("resume of nothing", dict(resume=True), "resume: no run to resume in {out} ({out}/checkpoint.safetensors is missing)"),
    ("gate without fork", dict(gate=["0.0=0"]),
     "--gate, --freeze and --reinit apply to a fork: give --fork RUN --at STEP (or --fork-from FILE)"),
    ("freeze of a head out of range", dict(fork="{run}", at=2, freeze=["0.5"]), "--freeze 0.5: head 5 is outside 0..1 (the model has 2 heads per layer)"),
    ("fork at a step without a snapshot", dict(fork="{run}", at=3),
     "{run} has no snapshot at step 3; it has 2"),
    ("at below 0", dict(fork="{run}", at=-1), "--at: value -1 is below 0"),
    ("snapshot list empty", dict(snapshot_at=[]), "--snapshot-at is empty: give a value, or leave the flag out for its default"),
    ("snapshot after the last step", dict(snapshot_at=[9]), "--snapshot-at 9 is outside the run's steps 0..4 (0 = the initial weights)"),
    ("log_grads below 0", dict(log_grads=-1), "--log-grads: value -1 is below 0"),
    ("dump_grads_at 0", dict(dump_grads_at=[0]), "--dump-grads-at: value 0 is below 1"),
    ("threads 0", dict(threads=0), "{threads}: value 0 is outside [1, 1024]"),
    ("out an existing file", dict(out="{file}"), "{file}: cannot create directory: Not a directory"),
    ("init the checkpoint out would overwrite", dict(init="{run}/checkpoint.safetensors", out="{run}"),
     "--out {run}/checkpoint.safetensors is the same file as --init {run}/checkpoint.safetensors: writing it would "
     "destroy the input; choose another output"),
    ("a new run with snapshots", dict(snapshot_at=[0, 2]), None),
    ("a fork with a frozen head", dict(fork="{run}", at=2, freeze=["0.1"], gate=["0.0=0.5"]), None),
    ("a fork from a file", dict(fork_from="{run}/snapshots/step_00000002.safetensors"), None),
    ("init from a model", dict(init="{run}/model.safetensors", log_grads=2), None),
    ("resume further", dict(resume=True, out="{copy}", steps=6), None),
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    subprocess.run([HEADLAB, "train", *flags(SMALL), "--snapshot-at", "2", "--quiet", "--out", str(d / "run")], check=True,
                   capture_output=True)
    (d / "file").write_text("not a directory")
    return d


def flags(given):
    out = []
    for k, v in given.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        else:
            out += [flag, ",".join(map(str, v)) if isinstance(v, list) else str(v)]
    return out


def filled(given, places):
    def fill(v):
        return [fill(x) for x in v] if isinstance(v, list) else v.format(**places) if isinstance(v, str) else v
    return {k: fill(v) for k, v in given.items()}


def cli_message(stderr):
    """The refusal without the command line's prefix (headlab: error:) or CLI11's --help hint."""
    lines = [line for line in stderr.splitlines() if line and not line.startswith("Run with --help")]
    return lines[-1].removeprefix("headlab: error: ")


@pytest.mark.parametrize("name,given,refusal", CASES, ids=[c[0] for c in CASES])
def test_both_doors_plan_a_run_alike(run, tmp_path, name, given, refusal):
    places = {"run": str(run / "run"), "file": str(run / "file")}
    doors = {}
    for door in ("cli", "python"):
        places.update(out=str(tmp_path / door), copy=str(tmp_path / f"{door}-copy"))
        shutil.copytree(places["run"], places["copy"])
        settings = {**SMALL, "out": places["out"], **filled(given, places)}
        if door == "cli":
            p = subprocess.run([HEADLAB, "train", *flags(settings), "--quiet"], capture_output=True, text=True)
            doors[door] = (p.returncode == 0, cli_message(p.stderr) if p.returncode else p.stderr)
            places["threads"] = "--threads"
        else:
            try:
                t = hl.Trainer(quiet=True, **settings)
                t.run(progress=False)
                doors[door] = (True, "")
            except (ValueError, TypeError) as e:
                doors[door] = (False, str(e))
            places["threads"] = "threads"
        if refusal is not None:
            assert doors[door] == (False, refusal.format(**places)), door
        else:
            assert doors[door][0], (door, doors[door][1])
    if refusal is None:  # the same run planned: its stored settings (all but the directory) agree
        configs = [json.load(open(f"{tmp_path / d}{'-copy' if 'resume' in given else ''}/summary.json"))["config"]
                   for d in ("cli", "python")]
        for c in configs:
            c.pop("out", None)
        assert configs[0] == configs[1]
