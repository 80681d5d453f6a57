#!/usr/bin/python3
"""Sequences for the induction study where no absolute position helps: each row of --length
random tokens holds a block of n random tokens (n uniform in --min-n..--max-n) written twice in
a row at a random offset; the loss mask covers the second copy's predictable tokens (r_2..r_n:
position t predicts token t + 1). Written as a `headlab train --task tokens` file (input_ids,
loss_mask).

Usage: /usr/bin/python3 scripts/make_induction_prefix.py OUT.safetensors [--rows 20000]
       [--length 64] [--vocab 64] [--min-n 8] [--max-n 24] [--seed 0]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_np import write_safetensors  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--length", type=int, default=64, help="tokens per row")
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--min-n", type=int, default=8)
    ap.add_argument("--max-n", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if not 2 <= a.min_n <= a.max_n or 2 * a.max_n > a.length:
        ap.error(f"need 2 <= --min-n <= --max-n and 2 * --max-n <= --length (got {a.min_n}, {a.max_n}, {a.length})")
    rng = np.random.default_rng(a.seed)
    ids = rng.integers(0, a.vocab, size=(a.rows, a.length)).astype(np.int32)
    mask = np.zeros((a.rows, a.length), np.float32)
    for r in range(a.rows):
        n = rng.integers(a.min_n, a.max_n + 1)
        m = rng.integers(0, a.length - 2 * n + 1)
        block = rng.integers(0, a.vocab, size=n)
        ids[r, m:m + n] = block
        ids[r, m + n:m + 2 * n] = block
        mask[r, m + n:m + 2 * n - 1] = 1
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    write_safetensors(a.out, {"input_ids": ids, "loss_mask": mask})
    print(f"wrote {a.out}: {a.rows} rows of {a.length} tokens")


if __name__ == "__main__":
    main()
