"""The busy-machine rule from Python: with one other CPU-bound process running, hl.Trainer on the
default task with its default threads, against threads=1 and against `headlab train` (default
threads), each in a fresh process, in alternated rounds; wall seconds of the whole run, medians.
The rule holds when the default is within 1.25x of threads=1.

Usage: PYTHONPATH=build/python python3 scripts/bench_trainer_busy.py [ROUNDS] [STEPS]   (3 rounds, 200 steps)
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HEADLAB = os.environ.get("HEADLAB_BINARY", os.path.join(HERE, "..", "build", "headlab"))
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
work = tempfile.mkdtemp()


def wall(cmd):
    out = os.path.join(work, f"r{time.monotonic_ns()}")
    t0 = time.monotonic()
    subprocess.run([*cmd, out], check=True, capture_output=True)
    return time.monotonic() - t0


def trainer(threads):
    code = ("import sys, headlab as hl; kw = dict(steps=%d, out=sys.argv[1], quiet=True)%s; hl.Trainer(**kw).run(progress=False)"
            % (steps, "" if threads is None else "; kw['threads'] = %d" % threads))
    return [sys.executable, "-c", code]


runs = {"hl.Trainer, default threads": trainer(None), "hl.Trainer, threads=1": trainer(1),
        "headlab train, default threads": [HEADLAB, "train", "--quiet", "--steps", str(steps), "--out"]}
times = {name: [] for name in runs}
load = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # the other process
try:
    time.sleep(0.5)
    for r in range(rounds):
        for name, cmd in runs.items():
            times[name].append(wall(cmd))
        print(f"round {r + 1}: " + ", ".join(f"{times[n][-1]:.2f}" for n in runs), file=sys.stderr)
finally:
    load.kill()
    load.wait()
one = statistics.median(times["hl.Trainer, threads=1"])
print(f"{'with one busy process':34} {'median (s)':>10}  {'/ threads=1':>11}")
for name in runs:
    m = statistics.median(times[name])
    print(f"{name:34} {m:>10.2f}  {m / one:>11.2f}")
print(f"({rounds} rounds alternated, {steps} steps of the default task, {os.cpu_count()} cores, "
      f"load average {os.getloadavg()[0]:.2f} at the end)")
