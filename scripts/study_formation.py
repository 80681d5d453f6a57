#!/usr/bin/env python3
"""How the induction circuit forms, over several seeds: the order in which the heads' scores rise,
and counterfactual forks with layer 0's heads gated off (docs/training_dynamics.md).

For each seed: `headlab train --task induction` keeping snapshots (every 5 steps through the phase
change), `headlab detect --run` over them, then two forks at --fork-at (the start of the phase
change): the previous-token head gated off (the layer-0 head with the highest previous-token score
at the end of the original run), and both layer-0 heads gated off. Prints per seed, then the mean
over seeds with a 95% t interval (mean +- t(0.975, n-1) * sd / sqrt(n)).

Usage: scripts/study_formation.py [--seeds 0,1,2,3,4] [--fork-at 200] [--out runs/formation]
       [--headlab build/headlab]      (about 50 s a seed on 2 cores)
"""
import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys

RISE = 0.05  # a score has "risen" at the first snapshot where it is this far above its step-0 value
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit("study_formation: %s failed:\n%s" % (" ".join(cmd), r.stderr.strip()))
    return r.stdout


def detect_over_training(path):
    """{(layer, head): [(step, prev, induction)]} from detect --run's CSV."""
    series = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            key = (int(row["layer"]), int(row["head"]))
            series.setdefault(key, []).append((int(row["step"]), float(row["previous_token"]), float(row["induction"])))
    return series


def rise_step(points, column):
    start = points[0][column]
    for p in points:
        if p[column] >= start + RISE:
            return p[0]
    return None


def final_scores(hl, checkpoint, out):
    run([hl, "detect", "--checkpoint", checkpoint, "--out", out])
    scores = {}
    with open(os.path.join(out, "detect.csv")) as f:
        for row in csv.DictReader(f):
            scores[(int(row["layer"]), int(row["head"]))] = (float(row["previous_token"]), float(row["induction"]))
    return scores


def token_acc(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)["final"]["token_acc"]


def interval(xs):
    xs = [x for x in xs if x is not None]
    if len(xs) < 2:
        return "%s (n=%d)" % (xs[0] if xs else "-", len(xs))
    m, sd = statistics.mean(xs), statistics.stdev(xs)
    h = T975.get(len(xs) - 1, 1.96) * sd / math.sqrt(len(xs))
    return "%.3f [%.3f, %.3f]" % (m, m - h, m + h)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--fork-at", type=int, default=200)
    ap.add_argument("--out", default="runs/formation")
    ap.add_argument("--headlab", default=os.environ.get("HEADLAB_BINARY", "build/headlab"))
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    at = sorted(set(list(range(0, 100, 25)) + list(range(100, 401, 5)) + list(range(500, 4001, 500)) + [a.fork_at]))
    rows = []
    for seed in seeds:
        base = os.path.join(a.out, "seed-%d" % seed)
        if not os.path.exists(os.path.join(base, "summary.json")):
            run([a.headlab, "train", "--task", "induction", "--seed", str(seed), "--eval-every", "25", "--quiet",
                 "--snapshot-at", ",".join(map(str, at)), "--out", base])
        run([a.headlab, "detect", "--run", base])
        series = detect_over_training(os.path.join(base, "over_training", "detect", "detect_over_training.csv"))
        end = {k: v[-1] for k, v in series.items()}
        prev_head = max((k for k in end if k[0] == 0), key=lambda k: end[k][1])
        ind_heads = [k for k in end if k[0] == 1]
        prev_rise = rise_step(series[prev_head], 1)
        ind_rise = min((s for s in (rise_step(series[k], 2) for k in ind_heads) if s is not None), default=None)
        forks = {}
        for name, gates in (("gate-prev", ["%d.%d=0" % prev_head]), ("gate-layer0", ["0.%d=0" % h for h in range(2)])):
            d = os.path.join(a.out, "seed-%d-%s" % (seed, name))
            if not os.path.exists(os.path.join(d, "summary.json")):
                cmd = [a.headlab, "train", "--fork", base, "--at", str(a.fork_at), "--quiet", "--out", d]
                for g in gates:
                    cmd += ["--gate", g]
                run(cmd)
            s = final_scores(a.headlab, os.path.join(d, "model.safetensors"), d + "-detect")
            forks[name] = {"acc": token_acc(d),
                           "prev": max(v[0] for k, v in s.items() if k[0] == 0),
                           "ind": max(v[1] for k, v in s.items() if k[0] == 1),
                           "prev_other": max((v[0] for k, v in s.items() if k[0] == 0 and k != prev_head), default=0)}
        rows.append({"seed": seed, "prev_head": "L%dH%d" % prev_head, "prev_rise": prev_rise, "ind_rise": ind_rise,
                     "acc": token_acc(base), "prev": end[prev_head][1], "ind": max(end[k][2] for k in ind_heads),
                     "forks": forks})
        print("seed %d done" % seed, file=sys.stderr)

    print("Induction task, %d seeds; scores rise = first snapshot %.2f above step 0; forks at step %d\n"
          % (len(rows), RISE, a.fork_at))
    print("seed  prev head  prev rises  induction rises  | original: prev  ind    acc %  | gate prev: other L0 prev  ind    acc %"
          "  | gate layer 0: ind   acc %")
    for r in rows:
        g, z = r["forks"]["gate-prev"], r["forks"]["gate-layer0"]
        print("%-4d  %-9s  %-10s  %-15s  |           %.3f  %.3f  %5.1f  |            %.3f         %.3f  %5.1f  |              %.3f  %5.1f"
              % (r["seed"], r["prev_head"], r["prev_rise"], r["ind_rise"], r["prev"], r["ind"], 100 * r["acc"],
                 g["prev_other"], g["ind"], 100 * g["acc"], z["ind"], 100 * z["acc"]))
    lead = [r["ind_rise"] - r["prev_rise"] for r in rows if r["ind_rise"] is not None and r["prev_rise"] is not None]
    print("\nmean over seeds [95% interval]")
    print("induction rise - previous-token rise (steps): %s" % interval(lead))
    # previous-token score: the original's previous-token head; with it gated, the other layer-0
    # head (a gated head's pattern is still computed, but it writes nothing); none with both gated
    for name, label, prev in (("original", "original run", "prev"), ("gate-prev", "previous-token head gated", "prev_other"),
                              ("gate-layer0", "both layer-0 heads gated", None)):
        get = (lambda r, k: r[k]) if name == "original" else (lambda r, k, n=name: r["forks"][n][k])
        print("%-27s induction %s   previous-token %s   token acc %s"
              % (label, interval([get(r, "ind") for r in rows]),
                 interval([get(r, prev) for r in rows]) if prev else "-", interval([get(r, "acc") for r in rows])))


if __name__ == "__main__":
    main()
