"""Trainer.run()'s progress: a bar updated in place in a notebook (a fake IPython display here,
no kernel needed), a \\r line on a terminal, one line per evaluation in logs, nothing when quiet."""
import io
import json

import headlab as hl
import headlab.progress as progress

SETTINGS = dict(task="copy", d_model=16, heads=2, d_ff=32, steps=30, eval_every=10, eval_size=16)


class FakeDisplay:
    """IPython.display.display with display_id=True: returns a handle whose update() replaces it."""

    def __init__(self):
        self.shown, self.updates = [], []

    def __call__(self, obj, display_id=None):
        assert display_id is True
        self.shown.append(obj)
        fake = self

        class Handle:
            def update(self, obj):
                fake.updates.append(obj)
        return Handle()


def eval_steps(result):
    return [row["step"] for row in result["curve"]]


def test_a_notebook_gets_one_display_updated_in_place_then_the_final_table(monkeypatch, capfd, tmp_path):
    fake = FakeDisplay()
    monkeypatch.setattr(progress, "notebook_display", lambda: fake)
    out = tmp_path / "run"
    result = hl.Trainer(**SETTINGS, out=str(out), snapshot_at=[30]).run()
    assert len(fake.shown) == 1 and fake.updates  # one cell output, then updates of it
    text = repr(fake.updates[-1]).split("\n")
    assert text[0].startswith("train [" + "#" * 30 + "] 30/30")
    # under the bar the final table, no evaluation lines: those are in the run's log
    ev = result["final_eval"]
    assert text[1:] == ["steps                         30", f"train time                    {result['wall_s']:.1f} s",
                        f"held-out loss                 {ev['loss']:.6f}",
                        f"token accuracy                {100 * ev['token_acc']:.2f}%",
                        f"exact match (teacher-forced)  {100 * ev['exact_match']:.2f}%",
                        "first step >= 99% token acc   " + (str(result["first_step_99"]) if result["first_step_99"] >= 0 else "never"),
                        f"parameters                    {result['params']}"]
    assert not any("token_acc" in repr(u) for u in fake.updates)  # an evaluation line's word
    html = fake.updates[-1]._repr_html_()
    assert "<progress value='1.0000'" in html and "<td>held-out loss</td>" in html
    assert [json.loads(line)["step"] for line in open(out / "metrics.jsonl")] == eval_steps(result)
    # the snapshots' disk notice: a plain line in the cell's output (stdout), nothing red on stderr
    captured = capfd.readouterr()
    assert captured.err == ""
    assert captured.out.startswith("headlab: 1 snapshot (step 30) of ") and captured.out.endswith(" of disk in " + str(out) + "/snapshots\n")


def test_a_notebook_run_without_a_log_keeps_its_evaluations_folded_under_the_bar(monkeypatch):
    fake = FakeDisplay()
    monkeypatch.setattr(progress, "notebook_display", lambda: fake)
    result = hl.Trainer(**SETTINGS).run()  # no out: no metrics.jsonl to hold the evaluations
    text = repr(fake.updates[-1]).split("\n")
    want = [progress.eval_line(row["step"], 30, row) for row in result["curve"]]
    assert len(want) == 3 and text[-3:] == want  # after the final table
    html = fake.updates[-1]._repr_html_()
    assert "<details><summary>3 evaluations</summary>" in html and want[-1] in html


def test_a_log_gets_one_line_per_evaluation_and_quiet_nothing(capsys):
    result = hl.Trainer(**SETTINGS).run()  # stderr is captured: not a terminal
    lines = capsys.readouterr().err.splitlines()
    assert [line.split()[1] for line in lines] == [f"{s}/30" for s in eval_steps(result)]
    assert all(line.startswith("step ") and "held-out loss" in line and "\r" not in line for line in lines)
    hl.Trainer(quiet=True, **SETTINGS).run()
    hl.Trainer(**SETTINGS).run(progress=False)
    assert capsys.readouterr().err == ""


def test_a_terminal_gets_one_line_redrawn():
    class Tty(io.StringIO):
        def isatty(self):
            return True
    out = Tty()
    bar = progress.Progress(5, True, stream=out, min_interval=0)
    assert bar.mode == "tty"
    for s in range(1, 6):
        bar.step(s, 5, 1.0 / s, 2000.0)
    text = out.getvalue()
    assert text.count("\r") == 5 and text.endswith("5/5 loss 0.2000 acc - 2.0k tok/s\n")
    # redraws at most every min_interval, but always the last step
    out = Tty()
    bar = progress.Progress(100, True, stream=out, min_interval=3600)
    for s in range(1, 101):
        bar.step(s, 100, 0.5, 1000.0)
    assert out.getvalue().count("\r") == 2 and "100/100" in out.getvalue()


def test_outside_a_kernel_there_is_no_notebook_display():
    assert progress.notebook_display() is None  # pytest is no Jupyter kernel
