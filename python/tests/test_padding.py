"""Padded batches with an attention mask: each row of a batch padded on the right or the left gives
the logits, activations, hooked logits, loss and generated tokens of the row run alone."""
import numpy as np
import pytest

import headlab as hl

ROWS = [[3, 7, 9, 1, 5], [4, 4], [2, 8, 6]]


def tiny(seed=0, **kw):
    cfg = dict(d_model=16, n_layers=2, n_heads=4, d_mlp=32, d_vocab=11, n_ctx=16)
    cfg.update(kw)
    return hl.TransformerLM(hl.ModelConfig(**cfg), seed=seed)


def padded(rows, side, pad=0):
    T = max(map(len, rows))
    ids = np.full((len(rows), T), pad, dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        cols = slice(0, len(r)) if side == "right" else slice(T - len(r), T)
        ids[i, cols], mask[i, cols] = r, 1
    return ids, mask


def real_cols(mask, i):
    return np.flatnonzero(mask[i])


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_each_row_of_a_padded_batch_gives_its_logits_and_activations_alone(side, positions):
    m = tiny(positions=positions)
    ids, mask = padded(ROWS, side, pad=10)
    logits = np.asarray(m(ids, attention_mask=mask))
    _, cache = m.run_with_cache(ids, attention_mask=mask)
    for i, row in enumerate(ROWS):
        c = real_cols(mask, i)
        alone = np.asarray(m([row]))[0]
        np.testing.assert_allclose(logits[i, c], alone, rtol=0, atol=2e-5)
        _, one = m.run_with_cache([row])
        for name in cache.keys():
            a, b = cache[name], one[name]
            if name.endswith(("hook_pattern", "hook_attn_scores")):  # (B, H, Tq, Tk): real queries x real keys
                got, b = a[i][:, c][:, :, c], b[0]
            elif name == "hook_pos_embed":  # (B, T, d_model) with a mask, (T, d_model) without
                got = a[i, c]
            else:
                got, b = a[i, c], b[0]
            np.testing.assert_allclose(got, b, rtol=0, atol=2e-5, err_msg=f"{side} {name} row {i}")
    # the pattern gives padding no weight, and each real query's weights sum to 1
    pat = cache["pattern", 0]
    assert np.all(pat[:, :, :, :][np.broadcast_to((mask == 0)[:, None, None, :], pat.shape)] == 0)
    for i in range(len(ROWS)):
        np.testing.assert_allclose(pat[i][:, real_cols(mask, i)].sum(-1), 1, atol=1e-5)


@pytest.mark.parametrize("side", ["right", "left"])
def test_hooks_and_loss_of_a_padded_batch_match_each_row_alone(side):
    m = tiny(seed=1)
    ids, mask = padded(ROWS, side)

    def knock_out(z, name):  # head 1's output zeroed at every position
        z = z.copy()
        z[:, :, 1] = 0
        return z

    hooked = np.asarray(m.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_z", knock_out)], attention_mask=mask))
    with m.hooks(fwd_hooks=[("blocks.0.attn.hook_z", knock_out)]):
        in_block = np.asarray(m(ids, attention_mask=mask))
    np.testing.assert_array_equal(hooked, in_block)
    targets = np.full(ids.shape, -1)
    losses, counts = [], []
    for i, row in enumerate(ROWS):
        c = real_cols(mask, i)
        alone = np.asarray(m.run_with_hooks([row], fwd_hooks=[("blocks.0.attn.hook_z", knock_out)]))[0]
        np.testing.assert_allclose(hooked[i, c], alone, rtol=0, atol=2e-5)
        targets[i, c[:-1]] = row[1:]  # next-token targets at the real positions
        losses.append(m.loss([row[:-1]], [row[1:]]).item())
        counts.append(len(row) - 1)
    want = np.dot(losses, counts) / sum(counts)
    assert m.loss(ids, targets, attention_mask=mask).item() == pytest.approx(want, abs=2e-6)
    bad = targets.copy()
    bad[mask == 0] = 0
    with pytest.raises(ValueError, match="loss: targets count a padding position \\(row 1, column"):
        m.loss(ids, bad, attention_mask=mask)


def test_generate_continues_each_left_padded_prompt_as_alone():
    m = tiny(seed=2)
    ids, mask = padded(ROWS, "left")
    out = m.generate(ids, max_new_tokens=4, attention_mask=mask)
    assert out.shape == (3, ids.shape[1] + 4)
    for i, row in enumerate(ROWS):
        np.testing.assert_array_equal(out[i, -4:], m.generate([row], max_new_tokens=4)[0, -4:])
    ids, mask = padded(ROWS, "right")
    with pytest.raises(ValueError, match="generate: row 1 ends in padding: pad the prompts on the left"):
        m.generate(ids, max_new_tokens=2, attention_mask=mask)


def test_rows_of_different_lengths_and_bad_masks_get_a_message():
    m = tiny()
    with pytest.raises(ValueError, match="ids: the rows have different lengths \\(3, 2\\): pad them to one length and "
                                         "pass attention_mask"):
        m([[3, 7, 9], [4, 4]])
    ids, mask = padded(ROWS, "right")
    with pytest.raises(ValueError, match="attention_mask: shape \\(3, 4\\) must be the ids' \\(3, 5\\)"):
        m(ids, attention_mask=mask[:, :4])
    with pytest.raises(ValueError, match="attention_mask: row 0 has no token"):
        m(ids, attention_mask=np.zeros_like(mask))
    with pytest.raises(ValueError, match="attention_mask: values are 1 \\(token\\) or 0 \\(padding\\), got 2"):
        m(ids, attention_mask=mask * 2)
    with pytest.raises(TypeError, match="attention_mask: expected an integer or bool array"):
        m(ids, attention_mask=mask.astype(np.float32))
    # a bool mask is the same as 0/1
    np.testing.assert_array_equal(np.asarray(m(ids, attention_mask=mask.astype(bool))), np.asarray(m(ids, attention_mask=mask)))


def test_to_tokens_pads_on_either_side_and_returns_the_mask():
    m = tiny(d_vocab=256)
    ids, mask = m.to_tokens(["abc", "d"], padding_side="left")
    assert ids.tolist() == [[97, 98, 99], [0, 0, 100]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, mask = m.to_tokens(["abc", "d"], padding_side="right")
    assert ids.tolist() == [[97, 98, 99], [100, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    with pytest.raises(ValueError, match="to_tokens: the texts have different token lengths \\(3, 1\\); pad them with "
                                         "padding_side='right' or 'left'"):
        m.to_tokens(["abc", "d"])
    with pytest.raises(ValueError, match="to_tokens: padding_side must be 'right', 'left' or None, got 'top'"):
        m.to_tokens(["abc"], padding_side="top")
