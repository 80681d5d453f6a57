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


@pytest.mark.parametrize("side", ["right", "left"])
def test_the_residual_decomposition_of_a_padded_batch_sums_to_each_rows_residual(side):
    # with a mask the position embeddings are per row: each row's components must use its own
    m = tiny()
    ids, mask = padded(ROWS, side, pad=10)
    _, cache = m.run_with_cache(ids, attention_mask=mask)
    L = m.cfg.n_layers
    stack = cache.decompose_resid(layer=L)  # (components, B, T, d_model)
    resid = cache[f"blocks.{L - 1}.hook_resid_post"]
    assert np.all(np.abs(stack.sum(0) - resid) <= 1e-5 * (1 + np.abs(stack).sum(0)))
    _, one = m.run_with_cache([ROWS[1]])
    alone = one.decompose_resid(layer=L)
    c = real_cols(mask, 1)
    np.testing.assert_allclose(stack[:, 1][:, c], alone[:, 0], rtol=0, atol=2e-5)


# ---- analyses of a padded batch: hl.Batches(ids, attention_mask=mask) --------------------------

def alone(row):
    return hl.Batches(np.array([row]))


@pytest.mark.parametrize("side", ["right", "left"])
def test_analyses_of_a_padded_batch_give_each_row_alone(side):
    m = tiny(seed=2)
    ids, mask = padded(ROWS, side, pad=10)
    data = hl.Batches(ids, attention_mask=mask)
    n = np.array([len(r) - 1 for r in ROWS], dtype=float)  # each row's next-token targets
    q = np.array([len(r) for r in ROWS], dtype=float)  # each row's queries
    # detectors and importance: the mean over rows of each row alone
    for kind in ("previous_token", "duplicate_token", "induction"):
        want = np.mean([hl.detect_heads(m, alone(r), kind) for r in ROWS], axis=0)
        np.testing.assert_allclose(hl.detect_heads(m, data, kind), want, rtol=0, atol=1e-6, err_msg=kind)
    want = np.mean([hl.head_importance(m, alone(r)) for r in ROWS], axis=0)
    np.testing.assert_allclose(hl.head_importance(m, data), want, rtol=1e-4, atol=1e-6)
    # over tokens: the mean of each row's, weighted by its counted targets (or queries)
    e = hl.evaluate(m, data)
    each = [hl.evaluate(m, alone(r)) for r in ROWS]
    assert e.tokens == n.sum() and e.sequences == len(ROWS)
    np.testing.assert_allclose(e.loss, np.dot(n, [x.loss for x in each]) / n.sum(), rtol=1e-5)
    s = hl.attention_statistics(m, data)
    each = [hl.attention_statistics(m, alone(r)) for r in ROWS]
    np.testing.assert_allclose(s.entropy, np.tensordot(q, [x.entropy for x in each], 1) / q.sum(), rtol=1e-5, atol=1e-6)
    a = hl.single_head_ablation(m, data)
    each = [hl.single_head_ablation(m, alone(r)) for r in ROWS]
    np.testing.assert_allclose(a.d_loss, np.tensordot(n, [x.d_loss for x in each], 1) / n.sum(), rtol=1e-4, atol=1e-6)
    # a hook's ablation, per example: each row's losses as alone
    k = hl.ablate(m, data, "blocks.0.attn.hook_z", head=1)
    for i, r in enumerate(ROWS):
        one = hl.ablate(m, alone(r), "blocks.0.attn.hook_z", head=1)
        np.testing.assert_allclose([k.clean_losses[i], k.ablated_losses[i]], [one.clean_losses[0], one.ablated_losses[0]],
                                   rtol=1e-5, err_msg=f"{side} row {i}")
    # the dict form is the same batches
    np.testing.assert_array_equal(hl.detect_heads(m, {"input_ids": ids, "attention_mask": mask}),
                                  hl.detect_heads(m, data))


def test_a_left_padded_batch_gives_the_analyses_the_right_padded_rows_prompt_len_in_its_columns():
    m = tiny(seed=4)
    (ids_r, mask_r), (ids_l, mask_l) = padded(ROWS, "right", pad=10), padded(ROWS, "left", pad=10)
    prompt = np.array([2, 1, 2])  # each row's prompt: its first tokens
    lead = (mask_l == 0).sum(1)
    right = hl.Batches(ids_r, attention_mask=mask_r, prompt_len=prompt)
    left = hl.Batches(ids_l, attention_mask=mask_l, prompt_len=prompt + lead)  # counted in the padded columns
    a, b = hl.evaluate(m, right, autoregressive=True).to_dict(), hl.evaluate(m, left, autoregressive=True).to_dict()
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(np.asarray(b[key]), np.asarray(a[key]), err_msg=key)
    np.testing.assert_array_equal(hl.detect_heads(m, left, "induction"), hl.detect_heads(m, right, "induction"))
    # targets and loss_mask given in the padded columns move with their row
    lead = (mask_l == 0).sum(1)
    targets_r = np.where(mask_r == 1, (ids_r + 1) % 11, -1)
    loss_mask_r = np.tile([1, 0, 1, 1, 0], (3, 1)) * mask_r
    turn = lambda x: np.stack([np.roll(r, k) for r, k in zip(x, lead)])
    a = hl.evaluate(m, hl.Batches(ids_r, targets=targets_r, loss_mask=loss_mask_r, attention_mask=mask_r)).to_dict()
    b = hl.evaluate(m, hl.Batches(ids_l, targets=turn(targets_r), loss_mask=turn(loss_mask_r), attention_mask=mask_l)).to_dict()
    assert a == b and a["tokens"] == loss_mask_r.sum()
    with pytest.raises(ValueError, match="prompt_len 2 at row 1 is outside 4..5 \\(the row's tokens, counted in the padded "
                                         "columns; 0: no answer\\)"):
        hl.Batches(ids_l, attention_mask=mask_l, prompt_len=[4, 2, 4])


def test_padding_an_analysis_cannot_take_is_refused_naming_attention_mask():
    ids, mask = padded(ROWS, "right")
    gap = mask.copy()
    gap[0, 1] = 0
    with pytest.raises(ValueError, match="attention_mask: row 0 has padding at column 1 between its tokens: pad each row "
                                         "on one side"):
        hl.Batches(ids, attention_mask=gap)
    with pytest.raises(ValueError, match="attention_mask has shape \\(3, 4\\) but input_ids is \\(3, 5\\)"):
        hl.Batches(ids, attention_mask=mask[:, :4])
    with pytest.raises(ValueError, match="data: attention_mask: training rows are not padded"):
        hl.Trainer(task="tokens", data={"input_ids": ids, "attention_mask": mask}, steps=1, quiet=True)


# ---- patching and edges of a padded batch: attention_mask= -----------------------------------
# Each row's clean ids, corrupted at its first token, and its answer at its last token.
PATCH_ROWS = [([3, 7, 9, 1, 5], 8), ([4, 2], 6), ([2, 8, 6], 0)]


def patch_batch(pad):
    clean, mask = padded([r for r, _ in PATCH_ROWS], "right", pad=pad)
    corrupted = clean.copy()
    answers = []
    for i, (row, bad) in enumerate(PATCH_ROWS):
        corrupted[i, 0] = bad
        answers.append((i, len(row) - 1, row[0], bad))
    return clean, corrupted, mask, answers


def patch_alone(i):
    row, bad = PATCH_ROWS[i]
    return [row], [[bad] + row[1:]], [(0, len(row) - 1, row[0], bad)]


def test_patching_and_edges_of_a_right_padded_batch_give_each_row_alone():
    # the batch's metric is the mean over its answers (one per row): its raw scores are the mean of
    # each row's alone, its normalised ones rebuilt from each row's clean and corrupted metrics
    m = tiny(seed=3)
    clean, corrupted, mask, answers = patch_batch(pad=10)
    rows = range(len(PATCH_ROWS))
    e = hl.edge_patching(m, clean, corrupted, answers=answers, attention_mask=mask)
    each = [hl.edge_patching(m, *patch_alone(i)[:2], answers=patch_alone(i)[2]) for i in rows]
    assert list(e.senders) == list(each[0].senders) and list(e.receivers) == list(each[0].receivers)
    for field in ("exact", "attribution", "clean_metric", "corrupted_metric"):
        want = np.mean([np.asarray(getattr(x, field)) for x in each], axis=0)
        np.testing.assert_allclose(getattr(e, field), want, rtol=1e-4, atol=1e-5, err_msg=field)
    p = hl.path_patching(m, clean, corrupted, sender="L0H1", answers=answers, attention_mask=mask)
    each = [hl.path_patching(m, *patch_alone(i)[:2], sender="L0H1", answers=patch_alone(i)[2]) for i in rows]
    for field in ("path", "activation"):
        assert getattr(p, field) == pytest.approx(np.mean([getattr(x, field) for x in each]), rel=1e-4, abs=1e-5)
    # generic activation patching over (layer, pos) of hook_resid_pre: a position past a row's end
    # is not in the row alone, and patching it leaves that row's corrupted metric
    T = clean.shape[1]
    g = hl.activation_patching(m, clean, corrupted, hook="hook_resid_pre", axes=["layer", "pos"], answers=answers,
                               attention_mask=mask)
    restored = np.zeros(g.shape)  # the batch's raw patched metric, summed over rows
    mc = mk = 0.0
    for i in rows:
        c, k, a = patch_alone(i)
        one = hl.activation_patching(m, c, k, hook="hook_resid_pre", axes=["layer", "pos"], answers=a)
        lo, hi = hl.edge_patching(m, c, k, answers=a).corrupted_metric, hl.edge_patching(m, c, k, answers=a).clean_metric
        full = np.zeros(g.shape)
        full[:, :one.shape[1]] = one
        restored += lo + full * (hi - lo)
        mc, mk = mc + hi, mk + lo
    n = len(PATCH_ROWS)
    np.testing.assert_allclose(g, (restored / n - mk / n) / (mc / n - mk / n), rtol=1e-4, atol=1e-5)
    # the padding's token ids change nothing
    clean0, corrupted0, _, _ = patch_batch(pad=0)
    np.testing.assert_array_equal(
        hl.edge_patching(m, clean0, corrupted0, answers=answers, attention_mask=mask).exact, e.exact)


def left_padded(clean, corrupted, mask, answers):
    """The right-padded batch padded on the left instead: the same rows, answers moved with them."""
    lead = (mask == 0).sum(1)
    turn = lambda x: np.stack([np.roll(r, k) for r, k in zip(x, lead)])
    return turn(clean), turn(corrupted), turn(mask), [(r, p + lead[r], c, k) for r, p, c, k in answers]


def test_patching_and_edges_of_a_left_padded_batch_give_the_right_padded_scores():
    m = tiny(seed=3)
    right = patch_batch(pad=10)
    clean, corrupted, mask, answers = left_padded(*right)
    assert mask[1].tolist() == [0, 0, 0, 1, 1] and answers[1] == (1, 4, 4, 6)
    e_r = hl.edge_patching(m, right[0], right[1], answers=right[3], attention_mask=right[2])
    e_l = hl.edge_patching(m, clean, corrupted, answers=answers, attention_mask=mask)
    for field in ("exact", "attribution", "clean_metric", "corrupted_metric"):
        np.testing.assert_array_equal(getattr(e_l, field), getattr(e_r, field), err_msg=field)
    p_r = hl.path_patching(m, right[0], right[1], sender="L0H1", answers=right[3], attention_mask=right[2])
    p_l = hl.path_patching(m, clean, corrupted, sender="L0H1", answers=answers, attention_mask=mask)
    assert (p_l.path, p_l.activation) == (p_r.path, p_r.activation)
    # the pos axis counts each row's tokens from its first: the right-padded grid
    kw = dict(hook="hook_resid_pre", axes=["layer", "pos"])
    np.testing.assert_array_equal(hl.activation_patching(m, clean, corrupted, answers=answers, attention_mask=mask, **kw),
                                  hl.activation_patching(m, right[0], right[1], answers=right[3], attention_mask=right[2], **kw))
    # a metric reads the logits in the columns it was given: each row's last column is its last token
    last = lambda logits: float(sum(logits[i, -1, 0] for i in range(len(PATCH_ROWS))))
    at_end = lambda logits: float(sum(logits[i, len(r) - 1, 0] for i, (r, _) in enumerate(PATCH_ROWS)))
    np.testing.assert_array_equal(hl.activation_patching(m, clean, corrupted, metric=last, attention_mask=mask, **kw),
                                  hl.activation_patching(m, right[0], right[1], metric=at_end, attention_mask=right[2], **kw))


def test_patching_and_edges_refuse_gaps_and_answers_at_padding_naming_attention_mask():
    m = tiny(seed=3)
    clean, corrupted, mask, answers = left_padded(*patch_batch(pad=10))
    gap = mask.copy()
    gap[0, 2] = 0
    calls = [
        ("edge_patching", lambda mk, ans: hl.edge_patching(m, clean, corrupted, answers=ans, attention_mask=mk)),
        ("path_patching", lambda mk, ans: hl.path_patching(m, clean, corrupted, sender="L0H0", answers=ans, attention_mask=mk)),
        ("activation_patching", lambda mk, ans: hl.activation_patching(m, clean, corrupted, answers=ans, attention_mask=mk)),
    ]
    for fn, call in calls:
        with pytest.raises(ValueError, match=f"{fn}: attention_mask: row 0 has padding at column 2 between its tokens"):
            call(gap, answers)
        with pytest.raises(ValueError, match=f"{fn}: answer \\(1, 1, 4, 6\\) is at padding \\(attention_mask 0 there\\)"):
            call(mask, answers[:1] + [(1, 1, 4, 6)])
    with pytest.raises(ValueError, match="activation_patching: attention_mask: row 0 has padding at column 2"):
        hl.activation_patching(m, clean, corrupted, metric=lambda logits: float(logits[0, 0, 0]), attention_mask=gap)
    with pytest.raises(ValueError, match="attention_mask: shape \\(3, 4\\) must be the ids' \\(3, 5\\)"):
        hl.edge_patching(m, clean, corrupted, answers=answers, attention_mask=mask[:, :4])


# ---- an SAE's feature analyses on a padded batch -------------------------------------------------

@pytest.mark.parametrize("side", ["right", "left"])
def test_sae_feature_analyses_of_a_padded_batch_give_each_row_alone(side):
    m = tiny(seed=5)
    hook = "blocks.1.attn.hook_z"
    train = np.random.default_rng(1).integers(0, 10, size=(8, 6))
    sae = hl.train_sae(m, hook, train, architecture="standard", expansion=2, steps=20, batch=16, buffer=48, lr=1e-2,
                       l1_coefficient=0.01)
    ids, mask = padded(ROWS, side, pad=10)
    data = hl.Batches(ids, attention_mask=mask)
    n = np.array([len(r) for r in ROWS], dtype=float)  # each row's tokens
    # presence: token-weighted means of each row alone; padding is no token
    p = hl.feature_presence(m, sae, data)
    each = [hl.feature_presence(m, sae, alone(r)) for r in ROWS]
    assert p["tokens"] == n.sum()
    for key in ("mean_activation", "firing_frequency"):
        np.testing.assert_allclose(p[key], np.tensordot(n, [e[key] for e in each], 1) / n.sum(), rtol=1e-5, atol=1e-7, err_msg=key)
    assert p["firing_frequency"].max() > 0
    # densities and L0 of the evaluation the same way (the loss over each row's counted targets)
    e = hl.evaluate_sae(m, sae, data)
    each = [hl.evaluate_sae(m, sae, alone(r)) for r in ROWS]
    np.testing.assert_allclose(e["density"], np.tensordot(n, [x["density"] for x in each], 1) / n.sum(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(e["l0"], np.dot(n, [x["l0"] for x in each]) / n.sum(), rtol=1e-5)
    # ln_final's mean scale, the logit effects' divisor
    np.testing.assert_allclose(hl.feature_final_scale(m, data),
                               np.dot(n, [hl.feature_final_scale(m, alone(r)) for r in ROWS]) / n.sum(), rtol=1e-5)
    # top examples: each row's own best example, its window within the row's tokens
    features = list(np.argsort(-p["firing_frequency"])[:3])
    top = hl.top_activating_examples(m, sae, data, features, k=3, before=2, after=4)
    for f in top:
        alone_best = {}
        for i, r in enumerate(ROWS):
            ex = hl.top_activating_examples(m, sae, alone(r), [f["feature"]], k=1, before=2, after=4)[0]["examples"]
            if ex:
                alone_best[i] = ex[0]
        want = sorted(alone_best, key=lambda i: -alone_best[i]["max_activation"])[:3]
        assert [x["row"] for x in f["examples"]] == want
        for x in f["examples"]:
            a = alone_best[x["row"]]
            assert (x["position"], x["window_start"], x["tokens"]) == (a["position"], a["window_start"], a["tokens"])
            np.testing.assert_allclose(x["activations"], a["activations"], rtol=1e-5, atol=1e-6)
            assert 10 not in x["tokens"]  # the padding's id is never shown


@pytest.mark.parametrize("side", ["right", "left"])
def test_feature_source_attribution_of_a_padded_batch_gives_each_row_alone(side):
    m = tiny(seed=6)
    hook = "blocks.1.attn.hook_z"
    train = np.random.default_rng(2).integers(0, 10, size=(8, 6))
    sae = hl.train_sae(m, hook, train, architecture="standard", expansion=2, steps=10, batch=16, buffer=48)
    ids, mask = padded(ROWS, side, pad=10)
    for j in (0, 5):
        a = hl.feature_attribution(m, sae, ids, j, attention_mask=mask)
        for i, r in enumerate(ROWS):
            c = real_cols(mask, i)
            one = hl.feature_attribution(m, sae, [r], j)
            np.testing.assert_allclose(a["contribution"][i][c][:, :, c], one["contribution"][0], rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(a["pre_activation"][i, c], one["pre_activation"][0], rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(a["activation"][i, c], one["activation"][0], rtol=1e-4, atol=1e-6)
            pad = np.flatnonzero(mask[i] == 0)
            assert np.all(np.isnan(a["activation"][i, pad])) and np.all(a["contribution"][i][:, :, pad] == 0)
            assert np.all(a["contribution"][i][pad] == 0)
    with pytest.raises(ValueError, match="feature attribution: attention_mask: row 0 has padding at column 1 between its tokens"):
        hl.feature_attribution(m, sae, [[1, 2, 3]], 0, attention_mask=[[1, 0, 1]])


def test_train_sae_on_a_padded_batch_never_reads_the_padding():
    # the padding's ids and side change nothing: its activations never enter the shuffle buffer
    m = tiny(seed=7)
    kw = dict(architecture="topk", expansion=2, k=2, steps=6, batch=4, buffer=10, lr=1e-2, warmup=1)
    saes = []
    for side, pad in (("right", 10), ("right", 3), ("left", 10)):
        ids, mask = padded(ROWS, side, pad=pad)
        saes.append(hl.train_sae(m, "blocks.1.attn.hook_z", hl.Batches(ids, attention_mask=mask), **kw))
    for other in saes[1:]:
        for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
            assert np.array_equal(getattr(other, name), getattr(saes[0], name)), name
