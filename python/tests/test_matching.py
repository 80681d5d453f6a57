"""Heads matched across models (hl.match_heads, hl.hungarian, hl.permute_heads): a copy with its
heads permuted computes the same logits and is matched back exactly, by pattern and by weights."""
import itertools

import numpy as np
import pytest

import headlab as hl


def sharp_model(seed=0, heads=4):
    m = hl.TransformerLM(hl.ModelConfig(d_model=16, layers=2, heads=heads, d_ff=24, vocab_size=11, max_seq_len=16), seed=seed)
    # at initialisation every head attends almost uniformly; scaled queries and keys make them differ
    for name, t in m.named_parameters().items():
        if name.endswith("W_Q.weight") or name.endswith("W_K.weight"):
            np.asarray(t)[...] *= 25
    return m


def test_hungarian_against_brute_force():
    rng = np.random.default_rng(0)
    for rows, cols in [(5, 5), (3, 6), (6, 3)]:
        c = rng.integers(0, 100, size=(rows, cols)).astype(float)
        col = hl.hungarian(c.tolist())
        got = sum(c[r, j] for r, j in enumerate(col) if j >= 0)
        if rows <= cols:
            best = min(sum(c[r, p[r]] for r in range(rows)) for p in itertools.permutations(range(cols), rows))
        else:
            best = min(sum(c[p[k], k] for k in range(cols)) for p in itertools.permutations(range(rows), cols))
        assert got == best
        assert sum(j >= 0 for j in col) == min(rows, cols)


def test_permuted_copy_is_matched_back_by_pattern_and_weights():
    a, b = sharp_model(3), sharp_model(3)
    perm = [[2, 0, 3, 1], [1, 3, 0, 2]]
    for layer, p in enumerate(perm):
        hl.permute_heads(b, layer, p)
    ids = np.random.default_rng(1).integers(0, 11, size=(4, 16))
    la, lb = np.asarray(a.forward(ids)), np.asarray(b.forward(ids))
    assert np.max(np.abs(la - lb)) <= 1e-5 * max(1.0, np.max(np.abs(la)))  # the same function, up to round-off
    for by in ("pattern", "weights"):
        r = hl.match_heads(a, b, by=by, examples=16)
        assert r["by"] == by and r["unmatched_a"] == [] and r["unmatched_b"] == []
        assert r["similarity"].shape == (8, 8)
        for la_, ha, lb_, hb, sim in r["pairs"]:
            assert lb_ == la_ and perm[la_][hb] == ha
            assert sim > 1 - 1e-5


def test_match_heads_with_given_data_and_refusals():
    a, b = sharp_model(1), sharp_model(2, heads=2)
    ids = np.random.default_rng(2).integers(0, 11, size=(6, 12))
    r = hl.match_heads(a, b, ids)
    assert len(r["pairs"]) == 4 and len(r["unmatched_a"]) == 4
    with pytest.raises(hl.HeadlabError, match="choose pattern or weights"):
        hl.match_heads(a, b, by="cosine")
    with pytest.raises(hl.HeadlabError, match="not a permutation"):
        hl.permute_heads(a, 0, [0, 0, 1, 2])
