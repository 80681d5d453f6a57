#!/usr/bin/env python3
"""Compares two output trees of scripts/same_outputs.sh, file by file.

Numbers that measure the machine rather than the arithmetic (seconds, tokens per second, memory,
threads found idle, dates, paths) are left out; everything else must be identical: CSV cells,
JSON values, safetensors tensors and metadata. Exit 1 and a line per difference otherwise."""
import csv, json, os, re, struct, sys

MACHINE = re.compile(r"_s_|(^|_)(s|ms|seconds|time|rel|wall|date|rss|rss_kb|bytes|mib|per_s|threads|idle)$|"
                     r"time|wall|peak|tokens_per_s|path|^out$|checkpoint$|^data$|eval_data")


def machine_key(k):
    return bool(MACHINE.search(k))


def clean(v):
    if isinstance(v, dict):
        return {k: clean(x) for k, x in v.items() if not machine_key(k)}
    if isinstance(v, list):
        return [clean(x) for x in v]
    if isinstance(v, str) and v[:1] in "{[":
        try:
            return clean(json.loads(v))
        except ValueError:
            return v
    return v


def load(path):
    name = os.path.basename(path)
    if name.endswith(".jsonl"):
        return [clean(json.loads(l)) for l in open(path)]
    if name.endswith(".json"):
        return clean(json.load(open(path)))
    if name.endswith(".csv"):
        rows = list(csv.reader(open(path)))
        keep = [i for i, h in enumerate(rows[0]) if not machine_key(h)] if rows else []
        return [[r[i] for i in keep if i < len(r)] for r in rows]
    if name.endswith(".safetensors"):
        b = open(path, "rb").read()
        n = struct.unpack("<Q", b[:8])[0]
        head = json.loads(b[8:8 + n])
        return clean(head), b[8 + n:]
    return open(path, "rb").read()


def main(a, b):
    diffs = []
    for root, _, files in os.walk(a):
        for f in sorted(files):
            if f in (".lock",) or f.endswith((".png", ".html")):
                continue  # pictures and pages show what the CSVs and JSON hold
            pa = os.path.join(root, f)
            rel = os.path.relpath(pa, a)
            pb = os.path.join(b, rel)
            if not os.path.exists(pb):
                diffs.append("only in first: " + rel)
            elif load(pa) != load(pb):
                diffs.append("differs: " + rel)
    for d in diffs:
        print(d)
    if not diffs:
        print("same outputs:", a, b)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
