"""One SAE's features on a run and on its fork (docs/features.md, "The same SAE on a fork"):
per live feature its decoder's share in each head, and its mean activation at the end of both
branches (`headlab features --compare`'s presence.csv) and over each branch's snapshots
(over_training.csv). Prints the summary the docs quote.

usage: sae_fork_summary.py SAE_DIR ORIGINAL_FEATURES_DIR FORK_FEATURES_DIR [--match MATCH_DIR] [--heads H]
(ORIGINAL_FEATURES_DIR from `headlab features --run ORIGINAL`, FORK_FEATURES_DIR from
`headlab features --run FORK --compare FORK/model.safetensors`, both with the same SAE and checkpoint;
MATCH_DIR from `headlab features --match FORK_SAE`: the live features' matched decoder cosines.)"""
import argparse
import csv

import numpy as np

import headlab as hl


def over_training(path):
    steps = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            steps.setdefault(int(r["step"]), {})[int(r["feature"])] = float(r["mean_activation"])
    return {s: np.array([v[j] for j in sorted(v)]) for s, v in steps.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sae_dir"), ap.add_argument("orig_dir"), ap.add_argument("fork_dir")
    ap.add_argument("--match"), ap.add_argument("--heads", type=int, default=2)
    a = ap.parse_args()
    sae_dir, orig_dir, fork_dir, heads = a.sae_dir, a.orig_dir, a.fork_dir, a.heads
    w = np.asarray(hl.SAE.load(sae_dir).W_dec, dtype=np.float64)  # (d_sae, H * d_head)
    sq = (w.reshape(w.shape[0], heads, -1) ** 2).sum(2)
    share = sq / np.maximum(sq.sum(1, keepdims=True), 1e-30)  # (d_sae, H)
    with open(f"{fork_dir}/presence.csv") as f:
        rows = list(csv.DictReader(f))
    fires = np.array([float(r["firing_frequency"]) for r in rows])
    orig_end = np.array([float(r["mean_activation"]) for r in rows])
    fork_end = np.array([float(r["compare_mean_activation"]) for r in rows])
    live = fires > 0.002
    ratio = fork_end[live] / np.maximum(orig_end[live], 1e-12)
    print(f"live features: {live.sum()} of {len(rows)}")
    print(f"summed mean activation at the end: original {orig_end[live].sum():.3f}, fork {fork_end[live].sum():.3f}")
    print(f"fork / original per live feature: median {np.median(ratio):.2f}; "
          f"below 0.5: {(ratio < 0.5).sum()}, 0.5-2: {((ratio >= 0.5) & (ratio <= 2)).sum()}, above 2: {(ratio > 2).sum()}")
    for h in range(heads):
        print(f"correlation of the ratio with the decoder's share in head {h}: {np.corrcoef(ratio, share[live, h])[0, 1]:+.2f}")
    # by the share in head 0: thirds of the live features
    order = np.argsort(share[live, 0])
    for name, part in zip(("least head 0", "middle", "most head 0"), np.array_split(order, 3)):
        print(f"  {name:12s} (head-0 share {share[live, 0][part].min():.2f}-{share[live, 0][part].max():.2f}): "
              f"median fork / original {np.median(ratio[part]):.2f}")
    # features that form with the phase change on the original: at half their final strength only after step 200
    orig, fork = over_training(f"{orig_dir}/over_training.csv"), over_training(f"{fork_dir}/over_training.csv")
    late = live & (orig[200] < 0.5 * orig_end)
    early = live & ~late
    for name, m in (("form after step 200", late), ("present by step 200", early)):
        r = fork_end[m] / np.maximum(orig_end[m], 1e-12)
        print(f"{name}: {m.sum()} features, median fork / original at the end {np.median(r):.2f}, "
              f"below half on the fork: {(r < 0.5).sum()}")
    steps = sorted(s for s in fork if s in orig)
    print("summed mean activation of live features, step: original / fork")
    print("  " + ", ".join(f"{s}: {orig[s][live].sum():.2f} / {fork[s][live].sum():.2f}" for s in steps[:: max(1, len(steps) // 6)]))
    if a.match:
        with open(f"{a.match}/match.csv") as f:
            cos = np.array([float(r["cosine"] or "nan") for r in csv.DictReader(f)])
        c = cos[live]
        print(f"matched to the fork's own SAE, live features: mean cosine {np.nanmean(c):.2f}, >= 0.9: {(c >= 0.9).sum()}, "
              f">= 0.7: {(c >= 0.7).sum()}, < 0.5: {(c < 0.5).sum()}")
        for name, m in (("form after step 200", late), ("present by step 200", early)):
            print(f"  {name}: mean cosine {np.nanmean(cos[m]):.2f}, >= 0.7: {(cos[m] >= 0.7).sum()} of {m.sum()}")


if __name__ == "__main__":
    main()
