#!/usr/bin/python3
"""Overhead of driving training from Python: the default copy model (headlab train's
defaults), one step at a time from a Python loop (Trainer.step) against the C++ loop
(Trainer.run, time inside its steps). Rounds alternate the two; medians and their ratio.

Usage: PYTHONPATH=build/python /usr/bin/python3 scripts/bench_python.py [--steps 100] [--rounds 5]
Benchmark with OPENBLAS_CORETYPE unset.
"""
import argparse
import statistics
import time

import headlab as hl


def cpp_loop(steps, threads):
    t = hl.Trainer(steps=steps, eval_every=steps, eval_size=64, threads=threads, warmup=0)
    r = t._t.run()  # the C++ loop without a per-step Python callback
    return r["train_s"] / steps


def python_loop(steps, threads):
    t = hl.Trainer(steps=steps, eval_every=steps, eval_size=64, threads=threads, warmup=0)
    t.step()  # the first step also reads the task's position; not timed
    start = time.perf_counter()
    for _ in range(steps - 1):
        t.step()
    return (time.perf_counter() - start) / (steps - 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    cpp, py = [], []
    for _ in range(a.rounds):
        cpp.append(cpp_loop(a.steps, a.threads))
        py.append(python_loop(a.steps, a.threads))
    c, p = statistics.median(cpp), statistics.median(py)
    print(f"default copy model, batch 64, {a.threads} threads, {a.rounds} rounds of {a.steps} steps (medians)")
    print(f"{'loop':<22}{'ms/step':>10}")
    print(f"{'C++ (Trainer.run)':<22}{1000 * c:>10.3f}")
    print(f"{'Python (Trainer.step)':<22}{1000 * p:>10.3f}")
    print(f"Python / C++ = {p / c:.4f} ({100 * (p / c - 1):+.2f}%)")


if __name__ == "__main__":
    main()
