"""The busy-machine rule from Python (hl.Trainer and scores_over_training choose their threads as
every command does, and say so in the same words), and Ctrl-C during Tokenizer.encode."""
import json
import os
import signal
import subprocess
import threading
import time
import warnings

import pytest

import headlab as hl
from hf_tokenizer_files import byte_symbols  # GPT-2's printable stand-in for each byte

BUSY = "1 of the 2 cores is busy with other processes: running on 1 thread (threads=2 to use them anyway)"
two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) != 2, reason="the notice's numbers are for a 2-core machine")
SMALL = dict(d_model=16, layers=1, heads=2, d_ff=32, length=4, alphabet=5, batch=8, eval_size=16, steps=2)


@two_cores
def test_trainer_applies_the_busy_machine_rule_and_says_so_as_the_cli_does(monkeypatch, capfd, tmp_path):
    # HEADLAB_TEST_IDLE_CORES stands in for /proc/stat's reading: one core left idle by others
    monkeypatch.setenv("HEADLAB_TEST_IDLE_CORES", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a line on stderr as the command line's, not a warning
        t = hl.Trainer(**SMALL, out=str(tmp_path / "py"))
    assert capfd.readouterr().err == "headlab: " + BUSY + "\n"
    assert t.args["threads"] == 1  # what runs, and what the run's summary records
    t.run(progress=False)
    hl.Trainer(**SMALL, quiet=True)  # quiet: not a word
    assert hl.Trainer(**SMALL, threads=2).args["threads"] == 2  # a count given is obeyed without a word
    assert capfd.readouterr().err == ""
    # the command line chooses the same count from the same reading, and so trains the same numbers
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]
    p = subprocess.run([os.environ.get("HEADLAB_BINARY", "headlab"), "train", *flags, "--quiet", "--out",
                        str(tmp_path / "cli")], capture_output=True, text=True, check=True)
    assert p.stderr.splitlines()[0] == "headlab: " + BUSY.replace("threads=2", "--threads 2")
    summaries = [json.load(open(tmp_path / d / "summary.json")) for d in ("cli", "py")]
    assert [s["config"]["threads"] for s in summaries] == [1, 1]
    numbers = [[{k: v for k, v in json.loads(line).items() if k not in ("wall_s", "tokens_per_s")}
                for line in open(tmp_path / d / "metrics.jsonl")] for d in ("cli", "py")]
    assert numbers[0] == numbers[1] and numbers[0][-1]["step"] == 2
    monkeypatch.setenv("HEADLAB_TEST_IDLE_CORES", "2")
    assert hl.Trainer(**SMALL).args["threads"] == 2  # a quiet machine: the default, without a word
    assert capfd.readouterr().err == ""


@two_cores
def test_scores_over_training_applies_the_busy_machine_rule_and_says_it_as_trainer(monkeypatch, tmp_path, capfd):
    t = hl.Trainer(**SMALL, threads=1, out=str(tmp_path / "run"), snapshot_at=[1])
    t.run(progress=False)
    monkeypatch.setenv("HEADLAB_TEST_IDLE_CORES", "1")
    capfd.readouterr()
    hl.Trainer(**SMALL)
    trainer_said = capfd.readouterr().err
    hl.scores_over_training(str(tmp_path / "run"), "detect", examples=4)
    assert capfd.readouterr().err == trainer_said == "headlab: " + BUSY + "\n"  # one behaviour for both
    hl.scores_over_training(str(tmp_path / "run"), "detect", examples=4, quiet=True)
    assert capfd.readouterr().err == ""


def test_encode_stops_on_ctrl_c(tmp_path):
    vocab = {s: b for b, s in byte_symbols().items()}
    vocab["<|endoftext|>"] = 256
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    tok = hl.Tokenizer.load(str(tmp_path))

    def text(seed, words=150_000):  # distinct words, so no run is helped by the word cache
        return " ".join(os.urandom(6).hex() + str(i) + seed for i in range(words))

    t0 = time.monotonic()
    n = len(tok.encode(text("a")))
    whole = time.monotonic() - t0
    assert n > 150_000
    big = text("b", 1_500_000)  # ten times the measured text: about 10 x `whole` to encode
    timer = threading.Timer(0.1, lambda: os.kill(os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt, match="stopped by"):
        tok.encode(big)
    stopped = time.monotonic() - t0
    timer.join()
    # stopped within a few thousand words, far from the whole text (about 10 x `whole`): a margin
    # that a loaded machine's timing noise does not reach
    assert stopped < 0.1 + 3 * whole, f"encode took {stopped:.2f} s to stop; a tenth of the text takes {whole:.2f} s"
