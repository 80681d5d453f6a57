"""TransformerLens's names on the model, its config and its cache: cfg fields, W_Q and the other
weights in [n_layers, n_heads, ...] shapes, run_with_cache's names_filter / incl_bwd, cache keys
as get_act_name, hooks() as a with block, generate and the tokenizer's text."""
import numpy as np
import pytest

import headlab as hl


def tiny(seed=0, **kw):
    cfg = dict(d_model=16, n_layers=2, n_heads=4, d_mlp=32, d_vocab=11, n_ctx=16)
    cfg.update(kw)
    return hl.TransformerLM(hl.ModelConfig(**cfg), seed=seed)


def ids(seed=0, B=2, T=7, vocab=11):
    return np.random.default_rng(seed).integers(0, vocab, size=(B, T))


# ---- cfg ----------------------------------------------------------------------------------------

def test_cfg_has_transformerlens_names_and_round_trips_through_to_dict():
    c = hl.ModelConfig(d_model=24, n_layers=3, n_heads=6, n_key_value_heads=2, d_mlp=40, d_vocab=50, n_ctx=20,
                       head_bias=True, eps=1e-6, norm="post")
    assert (c.n_layers, c.n_heads, c.n_key_value_heads, c.d_head, c.d_mlp, c.d_vocab, c.n_ctx) == (3, 6, 2, 4, 40, 50, 20)
    d = c.to_dict()
    assert list(d) == ["d_vocab", "d_model", "n_layers", "n_heads", "n_key_value_heads", "d_head", "d_mlp", "n_ctx",
                       "norm", "activation", "positions", "attn_bias", "mlp_bias", "head_bias", "eps", "dropout",
                       "attn_dropout", "normalization", "sandwich_norm", "mlp", "parallel_block", "embed_scale",
                       "final_softcap", "rope_theta", "rope_theta_local", "rotary_dim", "rotary_pct", "rotary_style", "qk_norm",
                       "attn_scale", "attn_softcap", "sliding_window", "window_layers", "qkv_bias", "o_bias", "arch"]
    again = hl.ModelConfig(**d)
    assert again == c and again.to_dict() == d and d["head_bias"] is True and d["eps"] == 1e-6
    # the CLI's names are the same fields; one field given twice is refused
    assert hl.ModelConfig(layers=3, heads=6, kv_heads=2, d_ff=40, vocab_size=50, max_seq_len=20, d_model=24,
                          head_bias=True, eps=1e-6, norm="post") == c
    with pytest.raises(TypeError, match="ModelConfig: n_layers is given twice \\(as n_layers and layers\\)"):
        hl.ModelConfig(n_layers=2, layers=3)
    with pytest.raises(TypeError, match="unknown setting 'n_layer' \\(settings: d_vocab, d_model, n_layers,"):
        hl.ModelConfig(n_layer=2)
    # a bad value is named as it was given
    with pytest.raises(ValueError, match="^ModelConfig: n_layers: value 0 is outside \\[1, 1024\\]$"):
        hl.ModelConfig(n_layers=0)
    with pytest.raises(ValueError, match="^ModelConfig: d_ff: value -1 is outside"):
        hl.ModelConfig(d_ff=-1)
    with pytest.raises(TypeError, match="^ModelConfig: d_vocab: expected an integer, got str$"):
        hl.ModelConfig(d_vocab="x")
    for old in ("layers", "heads", "vocab_size", "max_seq_len", "d_ff", "kv_heads"):  # one name per field
        assert not hasattr(c, old)


def test_reprs_say_what_they_hold():
    m = tiny()
    assert repr(m.cfg).startswith("headlab.ModelConfig(d_vocab=11, d_model=16, n_layers=2, n_heads=4, n_key_value_heads=4, "
                                  "d_head=4, d_mlp=32, n_ctx=16, norm='pre', ")
    assert repr(m.cfg).endswith("eps=1e-05, dropout=0.0, attn_dropout=0.0, normalization='layernorm', "
                                "sandwich_norm=False, mlp='plain', parallel_block=False, embed_scale=False, "
                                "final_softcap=0.0, rope_theta=10000.0, rope_theta_local=0.0, rotary_dim=0, rotary_pct=1.0, "
                                "rotary_style='half', qk_norm=False, attn_scale=0.0, attn_softcap=0.0, "
                                "sliding_window=0, window_layers='all', qkv_bias=False, o_bias=False, arch='')")
    assert repr(m) == f"headlab.TransformerLM({m.cfg!r}, {m.num_parameters} parameters)"
    _, cache = m.run_with_cache(ids(), names_filter=["blocks.0.attn.hook_pattern", "hook_embed"])
    assert repr(cache) == ("headlab.ActivationCache(2 activations\n  blocks.0.attn.hook_pattern: (2, 4, 7, 7)\n"
                           "  hook_embed: (2, 7, 16)\n)")


# ---- weights ------------------------------------------------------------------------------------

def test_weights_in_transformerlens_shapes_equal_the_parameters():
    m = tiny(attn_bias=True, head_bias=True)
    p = {k: np.asarray(v) for k, v in m.named_parameters().items()}
    L, H, D, dh, V = 2, 4, 16, 4, 11
    assert m.W_Q.shape == m.W_K.shape == m.W_V.shape == (L, H, D, dh) and m.W_O.shape == (L, H, dh, D)
    assert m.b_Q.shape == (L, H, dh) and m.b_O.shape == (L, D)
    assert m.W_E.shape == (V, D) and m.W_U.shape == (D, V) and m.W_pos.shape == (16, D) and m.b_U.shape == (V,)
    for l in range(L):
        for h in range(H):
            hw = m.head_weights(l, h)
            for w in ("W_Q", "W_K", "W_V"):
                assert np.array_equal(getattr(m, w)[l, h], hw[w].T)
                assert np.array_equal(getattr(m, "b_" + w[-1])[l, h], p[f"blocks.{l}.attn.{w}.bias"][h * dh:(h + 1) * dh])
            assert np.array_equal(m.W_O[l, h], hw["W_O"].T)
        assert np.array_equal(m.b_O[l], p[f"blocks.{l}.attn.W_O.bias"])
    assert np.array_equal(m.W_E, p["tok_emb.weight"]) and np.array_equal(m.W_pos, p["pos_emb.weight"])
    assert np.array_equal(m.W_U, p["head.weight"].T) and np.array_equal(m.b_U, p["head.bias"])
    m.W_E[3, 0] = 7.0  # a view: the model changes
    assert np.asarray(m.named_parameters()["tok_emb.weight"])[3, 0] == 7.0
    assert not np.any(tiny().b_Q) and not np.any(tiny().b_U)  # no biases: zeros, as TransformerLens has them


def test_grouped_query_W_K_repeats_the_kv_heads_and_underscore_W_K_keeps_them():
    m = tiny(n_heads=4, n_key_value_heads=2)
    assert m._W_K.shape == (2, 2, 16, 4) and m.W_K.shape == (2, 4, 16, 4)
    for h in range(4):
        assert np.array_equal(m.W_K[1, h], m._W_K[1, h // 2]) and np.array_equal(m.W_V[0, h], m._W_V[0, h // 2])
        assert np.array_equal(m.W_K[1, h], m.head_weights(1, h)["W_K"].T)


def test_einsum_with_W_Q_reproduces_hook_q():
    m = tiny(attn_bias=True)
    _, cache = m.run_with_cache(ids(), names_filter=lambda n: n.endswith(("ln1.hook_normalized", "hook_q")))
    x = np.asarray(cache["normalized", 1, "ln1"], dtype=np.float64)
    q = np.einsum("btd,hde->bthe", x, m.W_Q[1].astype(np.float64)) + m.b_Q[1]
    assert np.allclose(q, cache["q", 1], atol=1e-5)


# ---- cache and hooks ----------------------------------------------------------------------------

def test_cache_keys_as_get_act_name():
    assert hl.get_act_name("pattern", 0) == "blocks.0.attn.hook_pattern"
    assert hl.get_act_name("q", 1, "attn") == "blocks.1.attn.hook_q"
    assert hl.get_act_name("resid_pre", 1) == "blocks.1.hook_resid_pre"
    assert hl.get_act_name("post", 0) == "blocks.0.mlp.hook_post"
    assert hl.get_act_name("scale", 0, "ln1") == "blocks.0.ln1.hook_scale"
    assert hl.get_act_name("scale") == "ln_final.hook_scale"
    assert hl.get_act_name("embed") == "hook_embed"
    assert hl.get_act_name("resid_post1") == "blocks.1.hook_resid_post"
    assert hl.get_act_name("blocks.0.hook_mlp_out") == "blocks.0.hook_mlp_out"
    m = tiny()
    _, cache = m.run_with_cache(ids(), names_filter="blocks.0.attn.hook_pattern")
    assert list(cache.keys()) == ["blocks.0.attn.hook_pattern"] and ("pattern", 0) in cache
    assert np.array_equal(cache["pattern", 0], cache["blocks.0.attn.hook_pattern"])
    with pytest.raises(TypeError, match="a cache key tuple is \\(name, layer\\[, layer_type\\]\\)"):
        cache[0, "pattern"]


def test_run_with_cache_incl_bwd_caches_gradients():
    m = tiny()
    x = ids()
    logits, cache = m.run_with_cache(x, names_filter=["blocks.1.hook_resid_post"], incl_bwd=True)
    assert not cache.has_grad(("resid_post", 1))
    hl.cross_entropy(logits, np.roll(x, -1, axis=1)).backward()
    g = cache.grad(("resid_post", 1))
    assert g.shape == (2, 7, 16) and np.any(g != 0)


def test_return_type_gives_the_next_token_loss_as_transformerlens():
    m, x = tiny(), ids()
    loss = m(x, return_type="loss")
    want = m.loss(x[:, :-1], x[:, 1:]).item()  # position t predicts token t + 1
    assert loss.item() == pytest.approx(want, rel=1e-6)
    logits, both = m.forward(x, return_type="both")
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(m(x)))
    assert both.item() == loss.item() and m(x, return_type=None) is None
    # padded rows: padding is neither predicted nor a context; the mean over every row's next tokens
    rows = [[3, 7, 9, 1, 5], [4, 4], [2, 8, 6]]
    for side in ("right", "left"):
        T = max(map(len, rows))
        pad, mask = np.full((3, T), 10), np.zeros((3, T), dtype=np.int64)
        for i, r in enumerate(rows):
            cols = slice(0, len(r)) if side == "right" else slice(T - len(r), T)
            pad[i, cols], mask[i, cols] = r, 1
        n = [len(r) - 1 for r in rows]
        want = np.dot([m(np.array([r]), return_type="loss").item() for r in rows], n) / sum(n)
        assert m(pad, attention_mask=mask, return_type="loss").item() == pytest.approx(want, rel=1e-5), side
    with pytest.raises(ValueError, match="return_type must be 'logits', 'loss', 'both' or None, got 'los'"):
        m(x, return_type="los")
    with pytest.raises(ValueError, match="return_type='loss': no position has a next token to predict"):
        m([[3]], return_type="loss")


def test_run_with_cache_return_type_loss_runs_the_backward_and_grad_keys_read_it():
    m, x = tiny(), ids()
    loss, cache = m.run_with_cache(x, names_filter=["blocks.1.attn.hook_q", "hook_embed"], incl_bwd=True, return_type="loss")
    assert loss.item() == pytest.approx(m(x, return_type="loss").item(), rel=1e-6)
    # the same gradients as a backward of our own on the logits' next-token loss
    logits, mine = m.run_with_cache(x, names_filter=["blocks.1.attn.hook_q", "hook_embed"], incl_bwd=True)
    targets = np.concatenate([x[:, 1:], np.full((x.shape[0], 1), -1)], axis=1)
    hl.cross_entropy(logits, targets).backward()
    for key in (("q_grad", 1), "blocks.1.attn.hook_q_grad", "hook_embed_grad"):
        plain = key[0][:-len("_grad")] if isinstance(key, tuple) else key[:-len("_grad")]
        want = mine.grad((plain, key[1]) if isinstance(key, tuple) else plain)
        np.testing.assert_allclose(cache[key], want, rtol=1e-5, atol=1e-8, err_msg=str(key))
    np.testing.assert_array_equal(cache["q_grad", 1], cache.grad(("q", 1)))
    # without incl_bwd nothing ran backward: no gradient to read
    _, none = m.run_with_cache(x, names_filter="hook_embed", return_type="loss")
    assert not none.has_grad("hook_embed")


def test_training_takes_the_model_settings_under_transformerlens_names():
    tl = hl.Trainer(task="copy", n_layers=1, n_heads=2, d_mlp=24, steps=1, quiet=True)
    flags = hl.Trainer(task="copy", layers=1, heads=2, d_ff=24, steps=1, quiet=True)
    assert tl.model.cfg == flags.model.cfg and (tl.model.cfg.n_layers, tl.model.cfg.n_heads, tl.model.cfg.d_mlp) == (1, 2, 24)
    with pytest.raises(TypeError, match="the setting heads is given twice \\(under its two names\\)"):
        hl.Trainer(task="copy", heads=2, n_heads=2, steps=1, quiet=True)
    with pytest.raises(TypeError, match="unknown setting 'n_head' \\(the names are the CLI's flags"):
        hl.Trainer(task="copy", n_head=2, steps=1, quiet=True)


def test_hooks_block_runs_the_hooks_in_every_forward_then_removes_them():
    m = tiny()
    x = ids()
    clean = np.asarray(m(x)).copy()
    seen = []

    def zero_head(z, name):
        seen.append(name)
        z = z.copy()
        z[:, -1, 2] = 0
        return z

    patched = np.asarray(m.run_with_hooks(x, fwd_hooks=[("blocks.1.attn.hook_z", zero_head)])).copy()
    with m.hooks(fwd_hooks=[("blocks.1.attn.hook_z", zero_head)]):
        assert np.array_equal(np.asarray(m(x)), patched) and not np.array_equal(patched, clean)
        _, cache = m.run_with_cache(x, names_filter="blocks.1.attn.hook_z")
        assert not np.any(cache["z", 1][:, -1, 2]) and np.any(cache["z", 1][:, -1, 1])
    assert seen == ["blocks.1.attn.hook_z"] * 3
    assert np.array_equal(np.asarray(m(x)), clean)  # removed on leaving the block
    m.add_hook("blocks.1.attn.hook_z", zero_head)
    assert np.array_equal(np.asarray(m(x)), patched)
    m.reset_hooks()
    assert np.array_equal(np.asarray(m(x)), clean)


def test_a_hook_that_edits_in_place_is_told_to_return_a_copy():
    m = tiny()

    def in_place(z, name):
        z[:, :, 0] = 0

    with pytest.raises(ValueError, match="hook at blocks.0.attn.hook_z: the activation is read-only; return an edited "
                                         "copy instead"):
        m.run_with_hooks(ids(), fwd_hooks=[("blocks.0.attn.hook_z", in_place)])


# ---- loss, generate, text -----------------------------------------------------------------------

def test_loss_over_no_counted_target_raises_as_cross_entropy_does():
    m = tiny()
    with pytest.raises(ValueError, match="loss: every target is -1 \\(not counted\\)"):
        m.loss(ids(), np.full((2, 7), -1))
    with pytest.raises(ValueError, match="cross_entropy: every target is -1 \\(not counted\\)"):
        hl.cross_entropy(m(ids()), np.full((2, 7), -1))


def test_generate_greedy_is_the_argmax_of_full_forwards_and_sampling_follows_the_seed():
    m = tiny(seed=3)
    prompt = ids(B=2, T=4)
    out = m.generate(prompt, max_new_tokens=5)
    assert out.shape == (2, 9) and np.array_equal(out[:, :4], prompt)
    for t in range(4, 9):  # each new token is the full forward's argmax at the position before it
        assert np.array_equal(out[:, t], np.asarray(m(out[:, :t]))[:, -1].argmax(-1))
    a = m.generate(prompt, max_new_tokens=6, temperature=1.0, seed=7)
    assert np.array_equal(a, m.generate(prompt, max_new_tokens=6, temperature=1.0, seed=7))
    assert not np.array_equal(a, m.generate(prompt, max_new_tokens=6, temperature=1.0, seed=8))
    with pytest.raises(ValueError, match="generate: 4 prompt tokens \\+ 13 new ones = 17 exceed the model's n_ctx \\(16\\)"):
        m.generate(prompt, max_new_tokens=13)


def test_generate_refuses_a_hooked_model_and_ignores_training_mode():
    m = tiny(seed=3, dropout=0.5)
    prompt = ids(B=1, T=4)
    want = m.generate(prompt, max_new_tokens=5, temperature=1.0, seed=2)
    m.train()  # dropout on: generation still runs in evaluation mode
    assert np.array_equal(m.generate(prompt, max_new_tokens=5, temperature=1.0, seed=2), want)
    m.eval()
    with m.hooks(fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: np.zeros_like(z))]):
        with pytest.raises(ValueError, match="generate runs without hooks, and this model holds some"):
            m.generate(prompt, max_new_tokens=2)
    assert np.array_equal(m.generate(prompt, max_new_tokens=5, temperature=1.0, seed=2), want)


def test_byte_level_text_round_trips_and_a_model_without_tokenizer_says_so():
    m = tiny(d_vocab=256)
    t = m.to_tokens("héllo")
    assert t.shape == (1, 6) and t[0].tolist() == list("héllo".encode("utf-8"))
    assert m.to_string(t[0]) == "héllo" and m.to_str_tokens("hi") == ["h", "i"]
    with pytest.raises(ValueError, match="to_tokens: prepend_bos=True, but the model's tokenizer has no BOS token"):
        m.to_tokens("hi", prepend_bos=True)
    with pytest.raises(ValueError, match="to_tokens: the model has no tokenizer .* and is not byte-level \\(256 tokens; it has 11\\)"):
        tiny().to_tokens("hi")


def test_a_swiglu_gate_refuses_an_activation_it_would_ignore():
    with pytest.raises(ValueError, match="--mlp swiglu: its gate is silu, so --activation relu would be ignored"):
        hl.ModelConfig(mlp="swiglu", activation="relu")
    assert hl.ModelConfig(mlp="swiglu", activation="silu").mlp == "swiglu"
    assert hl.ModelConfig(mlp="swiglu").mlp == "swiglu"  # not given: nothing to ignore
    # a SwiGLU config says silu, so it makes itself again
    cfg = hl.ModelConfig(arch="llama", d_model=16, n_heads=2)
    assert cfg.activation == "silu" and hl.ModelConfig(**cfg.to_dict()) == cfg


# ---- TransformerLens's spellings of headlab's settings ------------------------------------------

@pytest.mark.parametrize("arch, tl", [
    ("gpt2", dict(act_fn="gelu", normalization_type="LN",  # the preset keeps headlab's default gelu (erf) positional_embedding_type="standard",
                  original_architecture="GPT2LMHeadModel")),
    ("llama", dict(act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary",
                   original_architecture="LlamaForCausalLM")),
    ("neox", dict(act_fn="gelu", normalization_type="LN", positional_embedding_type="rotary",
                  original_architecture="GPTNeoXForCausalLM")),
])
def test_cfg_reads_and_takes_transformerlens_spellings(arch, tl):
    c = hl.ModelConfig(arch=arch, d_model=16, n_layers=1, n_heads=2)
    assert {k: getattr(c, k) for k in tl} == tl  # cfg -> TransformerLens's names
    # TransformerLens's names -> the same settings, each given alone over a blank config
    native = dict(act_fn="activation", normalization_type="normalization", positional_embedding_type="positions",
                  original_architecture="arch")
    for k, v in tl.items():
        if k != "original_architecture":
            assert getattr(hl.ModelConfig(**{k: v}), native[k]) == getattr(c, native[k]), k
    # the preset by its Hugging Face class is the preset; to_dict keeps one name per field
    again = hl.ModelConfig(original_architecture=tl["original_architecture"], d_model=16, n_layers=1, n_heads=2)
    assert again == c and hl.ModelConfig(**again.to_dict()) == c
    assert not set(tl) & set(c.to_dict())


def test_transformerlens_spellings_are_checked_as_the_settings():
    assert hl.ModelConfig(act_fn="gelu").to_dict()["activation"] == "gelu_erf"  # TL's gelu is erf, not headlab's gelu_tanh
    assert hl.ModelConfig(act_fn="gelu_pytorch_tanh").act_fn == "gelu_new"
    assert hl.ModelConfig(activation="relu2").act_fn == "relu2"  # headlab's own: no TransformerLens name
    assert hl.ModelConfig(normalization="rmsnorm_1p").normalization_type == "RMS"
    assert hl.ModelConfig(positions="none").positional_embedding_type == "none"
    assert hl.ModelConfig().original_architecture is None
    with pytest.raises(ValueError, match="^ModelConfig: act_fn must be one of 'gelu', 'gelu_new', 'gelu_fast', "
                                         "'gelu_pytorch_tanh', 'relu', 'silu', 'relu2', got 'solu_ln'$"):
        hl.ModelConfig(act_fn="solu_ln")
    with pytest.raises(ValueError, match="^ModelConfig: normalization_type: 'LNPre' \\(a norm whose weights are folded"):
        hl.ModelConfig(normalization_type="LNPre")
    with pytest.raises(ValueError, match="^ModelConfig: normalization_type: None \\(no norm\\) is not in headlab"):
        hl.ModelConfig(normalization_type=None)
    with pytest.raises(TypeError, match="^ModelConfig: activation is given twice \\(as activation and act_fn\\)$"):
        hl.ModelConfig(act_fn="relu", activation="relu")
    with pytest.raises(TypeError, match="^ModelConfig: positional_embedding_type: expected a string, got int$"):
        hl.ModelConfig(positional_embedding_type=1)


def test_trainer_takes_transformerlens_spellings_n_ctx_and_d_vocab():
    small = dict(task="copy", d_model=16, n_layers=1, n_heads=2, d_mlp=24, steps=1, quiet=True)
    tl = hl.Trainer(act_fn="gelu", normalization_type="RMS", positional_embedding_type="rotary", **small)
    assert (tl.model.cfg.act_fn, tl.model.cfg.normalization_type, tl.model.cfg.positional_embedding_type) == \
        ("gelu", "RMS", "rotary")
    assert tl.args["model"]["activation"] == "gelu_erf"
    task = hl.Task("copy")
    t = hl.Trainer(n_ctx=task.seq_len + 7, d_vocab=task.vocab_size, **small)
    assert (t.model.cfg.n_ctx, t.model.cfg.d_vocab) == (task.seq_len + 7, task.vocab_size)
    with pytest.raises(ValueError, match=f"^Trainer: n_ctx 3 is shorter than the task's rows \\({task.seq_len} tokens\\)$"):
        hl.Trainer(n_ctx=3, **small)
    with pytest.raises(ValueError, match=f"^Trainer: d_vocab 7 is not the task's vocabulary \\({task.vocab_size}\\)"):
        hl.Trainer(d_vocab=7, **small)
    with pytest.raises(ValueError, match="^Trainer: n_ctx: must be >= 1, got 0$"):
        hl.Trainer(n_ctx=0, **small)
    with pytest.raises(TypeError, match="^Trainer: d_vocab: expected an integer, got str$"):
        hl.Trainer(d_vocab="x", **small)
    with pytest.raises(ValueError, match="act_fn must be one of 'gelu'"):
        hl.Trainer(act_fn="tanh", **small)


# ---- what a TransformerLens user reached for next: MLP weights, text in, cache.items ------------

def test_mlp_weights_in_transformerlens_shapes_and_their_einsum_gives_hook_pre():
    m = tiny(seed=5)
    L, D, F = 2, 16, 32
    p = {k: np.asarray(v) for k, v in m.named_parameters().items()}
    assert m.W_in.shape == (L, D, F) and m.W_out.shape == (L, F, D) and m.b_in.shape == (L, F) and m.b_out.shape == (L, D)
    for l in range(L):
        assert np.array_equal(m.W_in[l], p[f"blocks.{l}.ffn.fc1.weight"].T)
        assert np.array_equal(m.W_out[l], p[f"blocks.{l}.ffn.fc2.weight"].T)
        assert np.array_equal(m.b_in[l], p[f"blocks.{l}.ffn.fc1.bias"])
    x = ids(seed=2)
    _, cache = m.run_with_cache(x)
    pre = np.einsum("btd,dm->btm", cache["normalized", 1, "ln2"], m.W_in[1]) + m.b_in[1]
    np.testing.assert_allclose(pre, cache["pre", 1], atol=1e-5)
    post = np.einsum("btm,md->btd", cache["post", 1], m.W_out[1]) + m.b_out[1]
    np.testing.assert_allclose(post, cache["mlp_out", 1], atol=1e-5)
    gated = tiny(mlp="swiglu", mlp_bias=False)
    assert gated.W_gate.shape == (L, D, F) and not np.any(gated.b_in)
    with pytest.raises(AttributeError, match="^W_gate: the MLP is not gated \\(mlp='plain'\\): it has no gate$"):
        m.W_gate
    with pytest.raises(AttributeError, match="^W_in: the model is attention-only \\(d_mlp 0\\)"):
        tiny(d_mlp=0).W_in


def test_text_goes_in_where_ids_do_and_run_with_hooks_takes_return_type():
    m = tiny(d_vocab=256, seed=6)
    x = m.to_tokens("hello")
    np.testing.assert_array_equal(np.asarray(m("hello")), np.asarray(m(x)))
    assert m.run_with_cache("hello")[1].ids.tolist() == x.tolist()
    # texts of different lengths: padded on the right with their attention_mask, each row as alone
    both = np.asarray(m(["hello", "hi"]))
    np.testing.assert_allclose(both[1, :2], np.asarray(m("hi"))[0], atol=2e-5)
    out = m.generate("hel", max_new_tokens=3)
    assert isinstance(out, str) and out == m.to_string(m.generate(m.to_tokens("hel"), max_new_tokens=3)[0])
    assert m.generate("hel", max_new_tokens=3, verbose=False, use_past_kv_cache=True) == out  # TL's keywords, no effect
    assert m.to_single_token("h") == 104
    with pytest.raises(ValueError, match="^to_single_token: 'hi' is 2 tokens, not one$"):
        m.to_single_token("hi")
    loss = m.run_with_hooks(x, return_type="loss", fwd_hooks=[("blocks.0.hook_resid_pre", lambda a, name: None)])
    assert loss.item() == pytest.approx(m(x, return_type="loss").item(), rel=1e-6)
    _, cache = m.run_with_cache(x, names_filter=["blocks.0.attn.hook_pattern", "hook_embed"])
    assert [k for k, _ in cache.items()] == cache.keys() and len(cache.values()) == 2
    np.testing.assert_array_equal(dict(cache.items())["hook_embed"], cache["hook_embed"])
