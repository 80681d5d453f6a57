"""The Python module against the C++ library and the command line: views, conversions,
autograd, hooks, training (bit for bit with `headlab train`), gradients (bit for bit with
`headlab grads`), errors, Ctrl-C and leaks. Run by ctest (see python/CMakeLists.txt)."""
import json
import os
import resource
import signal
import subprocess
import sys

import numpy as np
import pytest

import headlab as hl

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")
sys.path.insert(0, os.path.join(os.environ.get("HEADLAB_SOURCE_DIR", "."), "scripts"))
from safetensors_np import read_safetensors, write_safetensors  # noqa: E402


def small_model(seed=0, **kw):
    cfg = dict(d_model=32, layers=2, heads=4, d_ff=64, vocab_size=13)
    cfg.update(kw)
    return hl.TransformerLM(hl.ModelConfig(**cfg), seed=seed)


def ids_batch(seed=0, B=3, T=10, vocab=13):
    return np.random.default_rng(seed).integers(0, vocab, size=(B, T))


def metrics(run_dir):
    rows = []
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        j = json.loads(line)
        j.pop("wall_s"), j.pop("tokens_per_s")
        rows.append(j)
    return rows


# ---- tensors ------------------------------------------------------------------------------------

def test_asarray_is_a_view_both_ways():
    m = small_model()
    w = m.named_parameters()["blocks.0.attn.W_Q.weight"]
    a = np.asarray(w)
    assert a.dtype == np.float32 and a.shape == (32, 32) and a.flags["C_CONTIGUOUS"]
    assert np.shares_memory(a, np.asarray(w))
    before = np.asarray(m(ids_batch())).copy()
    a[:] = 0  # a write through the array changes the model
    assert np.all(np.asarray(m.named_parameters()["blocks.0.attn.W_Q.weight"]) == 0)
    assert not np.array_equal(np.asarray(m(ids_batch())), before)
    # a write by C++ (an optimiser step) shows in the array
    t = hl.Trainer(steps=2, eval_size=8, d_model=32, heads=4)
    view = np.asarray(t.model.named_parameters()["head.weight"])
    copy = view.copy()
    t.step()
    assert not np.array_equal(view, copy)


def test_the_array_keeps_the_tensor_alive():
    a = np.asarray(hl.tensor(np.arange(6, dtype=np.float32).reshape(2, 3)))
    import gc
    gc.collect()
    assert a.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_tensor_copies_and_converts():
    src = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = hl.tensor(src)
    src[0, 0] = 99
    assert np.asarray(t)[0, 0] == 0  # a copy, never a view
    d = hl.tensor(np.array([0.1, 1 / 3], dtype=np.float64))
    assert np.asarray(d).dtype == np.float32
    assert np.asarray(d).tolist() == np.array([0.1, 1 / 3], dtype=np.float32).tolist()  # rounded as float32
    assert t.shape == (2, 3)
    with pytest.raises(TypeError, match="expected a float array, got dtype int64"):
        hl.tensor(np.arange(3, dtype=np.int64))
    with pytest.raises(ValueError, match=r"at most 6 dimensions, got shape \(1, 1, 1, 1, 1, 1, 1\)"):
        hl.tensor(np.zeros((1,) * 7, dtype=np.float32))
    with pytest.raises(TypeError, match="token ids must be integers, got dtype float32"):
        small_model()(np.zeros((1, 4), dtype=np.float32))
    with pytest.raises(ValueError, match=r"expected \(T\) or \(B, T\) token ids, got shape \(1, 2, 3\)"):
        small_model()(np.zeros((1, 2, 3), dtype=np.int64))


def test_autograd_from_python():
    x = hl.tensor(np.array([1.0, -2.0, 3.0], dtype=np.float32), requires_grad=True)
    y = (x * x).sum()
    y.backward()
    assert np.asarray(x.grad).tolist() == [2.0, -4.0, 6.0]
    with hl.no_grad():
        assert not hl.grad_enabled()
        z = (x * x).sum()
    assert hl.grad_enabled()
    assert not z.requires_grad
    with pytest.raises(ValueError, match="does not require grad"):
        z.backward()


# ---- models and checkpoints ---------------------------------------------------------------------

def test_model_config_takes_the_cli_names_and_defaults():
    c = hl.ModelConfig()
    assert (c.d_model, c.n_layers, c.n_heads, c.d_mlp, c.norm, c.activation) == (64, 2, 4, 256, "pre", "gelu_erf")
    c = hl.ModelConfig(d_model=48, heads=6, kv_heads=2, norm="post")
    assert (c.d_head, c.n_key_value_heads, c.norm) == (8, 2, "post")
    with pytest.raises(TypeError, match="unknown setting 'num_heads'"):
        hl.ModelConfig(num_heads=4)
    with pytest.raises(ValueError, match="norm must be one of pre, post, got 'mid'"):
        hl.ModelConfig(norm="mid")


def test_checkpoints_round_trip_with_the_cli(tmp_path):
    m = small_model(seed=3)
    path = str(tmp_path / "m.safetensors")
    m.save(path)
    tensors = read_safetensors(path)
    for name, t in m.named_parameters().items():
        assert np.array_equal(tensors[name], np.asarray(t))
    again = hl.TransformerLM.load(path)
    ids = ids_batch()
    assert np.array_equal(np.asarray(again(ids)), np.asarray(m(ids)))
    # the CLI reads it
    out = subprocess.run([HEADLAB, "hooks", "--checkpoint", path], capture_output=True, text=True)
    assert out.returncode == 0 and "blocks.1.attn.hook_pattern" in out.stdout


def test_errors_carry_the_cli_message(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(hl.HeadlabError) as e:
        hl.TransformerLM.load(str(bad))
    cli = subprocess.run([HEADLAB, "hooks", "--checkpoint", str(bad)], capture_output=True, text=True)
    assert cli.returncode != 0
    assert str(e.value) in cli.stderr
    assert isinstance(e.value, ValueError)


def test_head_weights_are_the_blocks_of_the_parameters():
    m = small_model()
    p = {k: np.asarray(v) for k, v in m.named_parameters().items()}
    w = m.head_weights(1, 2)
    assert np.array_equal(w["W_Q"], p["blocks.1.attn.W_Q.weight"][16:24])
    assert np.array_equal(w["W_O"], p["blocks.1.attn.W_O.weight"][:, 16:24])
    m.loss(ids_batch(), ids_batch(1)).backward()
    g = m.head_weights(1, 2, grads=True)
    assert np.array_equal(g["W_K"], np.asarray(m.named_parameters()["blocks.1.attn.W_K.weight"].grad)[16:24])
    with pytest.raises(IndexError, match=r"head \(2, 0\) is outside 2 layers x 4 heads"):
        m.head_weights(2, 0)


# ---- hooks --------------------------------------------------------------------------------------

def test_zero_ablation_hook_equals_gate_zero():
    m = small_model(seed=1)
    ids = ids_batch()

    def zero_head_2(z, name):
        z = z.copy()
        z[:, :, 2, :] = 0
        return z

    hooked = np.asarray(m.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_z", zero_head_2)])).copy()
    np.asarray(m.gates(0))[2] = 0.0
    gated = np.asarray(m(ids))
    assert np.array_equal(hooked, gated)


def test_patching_with_the_clean_cache_restores_the_clean_logits():
    m = small_model(seed=2)
    clean, corrupt = ids_batch(0), ids_batch(1)
    clean_logits, cache = m.run_with_cache(clean)
    # every hook point but the split q/k/v inputs, which are cached only when named
    names = [n for n, _ in hl.hook_points(m.config) if not n.endswith(("q_input", "k_input", "v_input"))]
    assert sorted(cache.keys()) == sorted(names)
    patched = m.run_with_hooks(corrupt, fwd_hooks=[(n, lambda x, n: cache[n]) for n in names])
    assert np.array_equal(np.asarray(patched), np.asarray(clean_logits))
    assert not np.array_equal(np.asarray(m(corrupt)), np.asarray(clean_logits))


def test_a_cache_holds_exactly_the_requested_names_and_is_read_only():
    m = small_model()
    _, cache = m.run_with_cache(ids_batch(), names_filter=["blocks.1.attn.hook_pattern", "hook_embed"])
    assert sorted(cache.keys()) == ["blocks.1.attn.hook_pattern", "hook_embed"]
    p = cache["blocks.1.attn.hook_pattern"]
    assert p.shape == (3, 4, 10, 10)
    assert np.allclose(p.sum(-1), 1, atol=1e-6)
    with pytest.raises(ValueError, match="read-only"):
        p[0, 0, 0, 0] = 1
    with pytest.raises(ValueError, match="unknown hook point 'blocks.0.attn.hook_patern'"):  # refused at once
        m.run_with_cache(ids_batch(), names_filter=["blocks.0.attn.hook_patern"])
    c = m.config  # its repr uses the attribute names
    assert repr(c).startswith(f"headlab.ModelConfig(d_vocab=13, d_model=32, n_layers={c.n_layers}, n_heads={c.n_heads}, ")
    assert "vocab_size" not in repr(c) and c.attn_bias in (True, False)
    with pytest.raises(ValueError, match="unknown hook point 'blocks.9.hook_z'"):
        m.run_with_hooks(ids_batch(), fwd_hooks=[("blocks.9.hook_z", lambda x, n: None)])
    with pytest.raises(ValueError, match="replacement has shape"):
        m.run_with_hooks(ids_batch(), fwd_hooks=[("hook_embed", lambda x, n: np.zeros((1, 2), np.float32))])


def test_backward_hooks_see_the_cached_gradients():
    m = small_model(seed=4)
    ids, targets = ids_batch(), ids_batch(5)
    logits, cache = m.run_with_cache(ids, names_filter=["blocks.1.attn.hook_pattern", "blocks.0.hook_resid_mid"], incl_bwd=True)
    hl.cross_entropy(logits, targets).backward()
    seen = {}
    logits2 = m.run_with_hooks(ids, bwd_hooks=[(n, lambda g, n: seen.__setitem__(n, g.copy()))
                                               for n in ["blocks.1.attn.hook_pattern", "blocks.0.hook_resid_mid"]])
    hl.cross_entropy(logits2, targets).backward()
    for n in seen:
        assert np.array_equal(seen[n], cache.grad(n)), n
    assert len(seen) == 2


# ---- training -----------------------------------------------------------------------------------

def test_training_from_python_equals_the_cli_bit_for_bit(tmp_path):
    cli_dir, py_dir = str(tmp_path / "cli"), str(tmp_path / "py")
    subprocess.run([HEADLAB, "train", "--quiet", "--threads", "2", "--out", cli_dir], check=True, capture_output=True)
    t = hl.Trainer(out=py_dir, threads=2)  # as the CLI's (without it, a busy machine may choose fewer)
    r = t.run(progress=False)
    assert metrics(cli_dir) == metrics(py_dir)
    assert len(metrics(py_dir)) == 6
    assert r["final_eval"]["token_acc"] == metrics(cli_dir)[-1]["token_acc"]
    a, b = read_safetensors(cli_dir + "/model.safetensors"), read_safetensors(py_dir + "/model.safetensors")
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_snapshots_from_python_equal_the_cli_s(tmp_path, capfd):
    flags = ["--d-model", "16", "--layers", "1", "--steps", "20", "--eval-every", "10", "--threads", "2"]
    cli_dir = str(tmp_path / "cli")
    subprocess.run([HEADLAB, "train", "--quiet", *flags, "--snapshot-every", "10", "--snapshot-at", "5",
                    "--out", cli_dir], check=True, capture_output=True)
    settings = dict(d_model=16, layers=1, steps=20, eval_every=10, threads=2, snapshot_every=10, snapshot_at=[5])
    t = hl.Trainer(out=str(tmp_path / "run"), **settings)
    steps, each = t.snapshot_plan  # said up front, as the CLI says it
    assert steps == [0, 5, 10, 20]
    assert "4 snapshots (steps 0, 5, 10, 20) of" in capfd.readouterr().err
    t.run(progress=False)
    for s in steps:
        size = os.path.getsize(tmp_path / "run" / "snapshots" / ("step_%08d.safetensors" % s))
        assert each - 128 <= size <= each
    stepped = hl.Trainer(out=str(tmp_path / "step"), **settings)  # a loop of one's own keeps them too
    for _ in range(20):
        stepped.step()
    names = ["step_%08d.safetensors" % s for s in (0, 5, 10, 20)]
    for d in ("cli", "run", "step"):
        assert sorted(os.listdir(tmp_path / d / "snapshots")) == names
    for name in names:
        a = read_safetensors(os.path.join(cli_dir, "snapshots", name))
        for d in ("run", "step"):
            b = read_safetensors(str(tmp_path / d / "snapshots" / name))
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), (d, name)
    with pytest.raises(hl.HeadlabError, match="snapshots are kept in the run's directory"):
        hl.Trainer(steps=20, snapshot_every=10)


def test_manual_steps_follow_the_same_batches_as_run():
    settings = dict(steps=30, eval_size=50, task="varcopy", d_model=32, threads=2)
    a = hl.Trainer(**settings)
    a.run(progress=False)
    b = hl.Trainer(**settings)
    losses = [b.step()[0] for _ in range(30)]
    assert all(np.isfinite(losses)) and b.steps_done == 30
    pa, pb = a.model.named_parameters(), b.model.named_parameters()
    assert all(np.array_equal(np.asarray(pa[k]), np.asarray(pb[k])) for k in pa)
    assert a.evaluate() == b.evaluate()
    with pytest.raises(hl.HeadlabError, match="run\\(\\) after step\\(\\)"):
        b.run(progress=False)


def test_token_arrays_train_as_the_same_file_does(tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 20, size=(200, 12)).astype(np.int64)
    np.save(tmp_path / "ids.npy", ids)
    settings = dict(task="tokens", steps=20, eval_every=10, batch=16, threads=2)
    hl.Trainer(data=str(tmp_path / "ids.npy"), out=str(tmp_path / "file"), **settings).run(progress=False)
    hl.Trainer(data=ids, out=str(tmp_path / "arrays"), **settings).run(progress=False)
    assert metrics(str(tmp_path / "file")) == metrics(str(tmp_path / "arrays"))
    with pytest.raises(ValueError, match=r"loss_mask has shape \(3, 4\) but input_ids is \(200, 12\)"):
        hl.Trainer(data={"input_ids": ids, "loss_mask": np.ones((3, 4))}, **settings)
    with pytest.raises(hl.HeadlabError, match="holds the id 19, outside the vocabulary 0..9"):
        hl.Trainer(data=ids, alphabet=10, **settings)
    # input_ids alone are language modelling; with targets or a loss mask the rows count as answers
    assert not hl.Task("tokens", data=ids).rows_are_answers
    # 200 rows: 20 held out; asking for more says so instead of returning fewer
    with pytest.raises(ValueError, match=r"held_out\(100\): the task holds 20 held-out rows \(the last 10% of its data\)"):
        hl.Task("tokens", data=ids).held_out(100)
    assert sum(len(b["input_ids"]) for b in hl.Task("tokens", data=ids).held_out(20)) == 20
    assert hl.Task("tokens", data={"input_ids": ids, "loss_mask": np.ones(ids.shape)}).rows_are_answers
    assert hl.Task("copy").rows_are_answers


def test_ctrl_c_stops_at_a_step_with_the_checkpoint_and_resume_finishes_the_same(tmp_path):
    settings = dict(steps=40, eval_every=10, checkpoint_every=100, eval_size=64, d_model=32, threads=2)
    full = str(tmp_path / "full")
    hl.Trainer(out=full, **settings).run(progress=False)

    def interrupt_at_15(step, total, loss, tps):
        if step == 15:
            os.kill(os.getpid(), signal.SIGINT)

    run = str(tmp_path / "run")
    with pytest.raises(KeyboardInterrupt, match="stopped at step 1[56] of 40"):
        hl.Trainer(out=run, **settings).run(callback=interrupt_at_15, progress=False)
    assert os.path.exists(run + "/checkpoint.safetensors")
    hl.Trainer(out=run, resume=True).run(progress=False)
    assert metrics(full) == metrics(run)


def test_settings_are_checked_by_keyword():
    with pytest.raises(ValueError, match=r"^lr: value -1\.0 is outside \[1e-30, 100\]$"):
        hl.Trainer(lr=-1.0)
    with pytest.raises(TypeError, match="unknown setting 'learning_rate'"):
        hl.Trainer(learning_rate=0.1)
    with pytest.raises(ValueError, match="task must be one of"):
        hl.Trainer(task="sorting")


# ---- gradients against the CLI and PyTorch ------------------------------------------------------

def test_gradients_equal_headlab_grads_bit_for_bit(tmp_path):
    m = small_model(seed=5)
    ckpt, batch, out = (str(tmp_path / n) for n in ("m.safetensors", "b.safetensors", "g.safetensors"))
    m.save(ckpt)
    ids, targets = ids_batch(7, B=4, T=12).astype(np.int32), ids_batch(8, B=4, T=12).astype(np.int32)
    targets[:, :3] = -1
    write_safetensors(batch, {"input_ids": ids, "targets": targets})
    subprocess.run([HEADLAB, "grads", "--checkpoint", ckpt, "--batch", batch, "--out", out, "--threads", "2"],
                   check=True, capture_output=True)
    cli = read_safetensors(out)
    hl.set_num_threads(2)
    loss = m.loss(ids, targets)
    loss.backward()
    assert np.float32(loss.item()) == cli["loss"].reshape(())
    for name, p in m.named_parameters().items():
        assert np.array_equal(np.asarray(p.grad), cli["grad." + name]), name


def test_gradients_match_pytorch_when_it_is_installed(tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (optional: Debian's python3-torch)")
    try:
        import check_vs_pytorch as ref  # the reference GPT of scripts/reference in PyTorch, docs/formats.md names
    except ImportError as e:
        pytest.skip(f"the PyTorch reference model is not available: {e}")
    import torch.nn.functional as F
    torch.manual_seed(0)
    V, D, L, H, FF, T, B = 13, 32, 2, 4, 64, 16, 3
    model = ref.GPT(V, D, L, H, FF, max_len=T)
    with torch.no_grad():  # larger than the 0.02 init, so every gradient is sizeable
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    cfg = dict(vocab_size=V, d_model=D, n_layers=L, n_heads=H, n_kv_heads=H, d_head=D // H, d_ff=FF, max_seq_len=T,
               norm="pre", activation="gelu_erf", positions="learned", attn_bias=True, mlp_bias=True,
               head_bias=True, layer_norm_eps=1e-5)
    path = str(tmp_path / "m.safetensors")
    write_safetensors(path, {ref.interop_name(n): p.detach().numpy() for n, p in model.state_dict().items()},
                      {"format": "headlab-checkpoint", "format_version": "1", "config": json.dumps(cfg)})
    idx, tgt = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    tgt[:, :3] = -1
    torch_loss = F.cross_entropy(model(idx).reshape(-1, V), tgt.reshape(-1), ignore_index=-1)
    torch_loss.backward()
    m = hl.TransformerLM.load(path)
    loss = m.loss(idx.numpy(), tgt.numpy())
    loss.backward()
    assert abs(loss.item() - torch_loss.item()) <= 1e-5 * abs(torch_loss.item())
    ours = m.named_parameters()
    largest = max(np.abs(p.grad.numpy()).max() for p in model.parameters())
    for n, p in model.named_parameters():
        want = p.grad.numpy()
        got = np.asarray(ours[ref.interop_name(n)].grad)
        if "W_K.bias" in n:  # truly 0 (softmax ignores a shift shared by a row): round-off on both sides
            assert np.abs(got).max() <= 1e-5 * largest and np.abs(want).max() <= 1e-5 * largest, n
        else:  # relative to the gradient's own scale
            assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), n


def test_an_attention_only_model_has_no_mlp_and_trains():
    m = small_model(d_ff=0)
    names = [n for n, _ in hl.hook_points(m.config)]
    assert "blocks.0.hook_attn_out" in names and not any("mlp" in n or "ln2" in n or "resid_mid" in n for n in names)
    assert not any("ffn" in n or "ln2" in n for n in m.named_parameters())
    _, cache = m.run_with_cache(ids_batch(), names_filter=names)
    assert sorted(cache.keys()) == sorted(names)
    t = hl.Trainer(task="induction", d_ff=0, steps=20, eval_size=64)
    assert np.isfinite(t.run(progress=False)["final_eval"]["loss"])


# ---- analyses -----------------------------------------------------------------------------------

def test_analyses_return_arrays_that_agree_with_each_other():
    t = hl.Trainer(task="varcopy", d_model=32, steps=150, eval_size=200)
    t.run(progress=False)
    data = t.task.held_out(200)
    imp = hl.head_importance(t.model, data)
    assert imp.shape == (2, 4) and np.all(imp >= 0)
    # Michel et al.'s per-example |dL(x)/dg| is not the token-level variant (C++ tests check both)
    per_token = hl.head_importance_per_token(t.model, data)
    assert per_token.shape == (2, 4) and np.all(per_token >= 0) and not np.allclose(imp, per_token, rtol=1e-3)
    abl = hl.single_head_ablation(t.model, t.task, data)
    assert abl["d_loss"].shape == (2, 4)
    assert abs(abl["base"]["loss"] - hl.evaluate(t.model, t.task, data)["loss"]) == 0
    st = hl.attention_statistics(t.model, data)
    assert np.all(st["entropy_norm"] <= 1 + 1e-9)
    curve = hl.prune_curve(t.model, t.task, data, order="importance")
    assert curve["fraction"][-1] == 1.0 and len(curve["removed"]) == len(curve["fraction"])
    assert np.all(t.model.gate_values() == 1)  # pruned a copy
    assert len(hl.qk_singular_values(t.model, 0, 1)) == 8
    # the head-role analyses
    probe = hl.repeated_random_tokens(20, 8, t.model.config.d_vocab)
    assert hl.detect_heads(t.model, probe, "previous_token").shape == (2, 4)
    comp = hl.composition_scores(t.model, 0, 1)
    assert comp["k"].shape == (4, 4) and np.all((comp["k"] >= 0) & (comp["k"] <= 1))
    patch = hl.activation_patching(t.model, t.task, data)
    assert patch["z_exact"].shape == (2, 4) and patch["resid_exact"].shape[0] == 2
    with pytest.raises(ValueError, match="the model holds no gradients"):  # not zeros, silently
        hl.head_gradient_norms(t.model)
    t.model.loss(data[0]["input_ids"], data[0]["targets"]).backward()
    norms = hl.head_gradient_norms(t.model)
    g = np.asarray(t.model.named_parameters()["blocks.0.attn.W_Q.weight"].grad)[8:16]
    assert np.isclose(norms["grad_W_Q"][0, 1], np.linalg.norm(g.astype(np.float64)), rtol=1e-6)


# ---- memory -------------------------------------------------------------------------------------

def test_no_leak_over_10000_forward_backward_calls():
    m = small_model(d_model=16, layers=1, heads=2, d_ff=32)
    ids, targets = ids_batch(0, B=2, T=8), ids_batch(1, B=2, T=8)

    def once():
        m.loss(ids, targets).backward()
        _, cache = m.run_with_cache(ids, names_filter=["blocks.0.attn.hook_pattern"])
        np.asarray(cache["blocks.0.attn.hook_pattern"]).sum()

    for _ in range(200):
        once()
    live = hl.live_tensors()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(10000):
        once()
    assert hl.live_tensors() == live
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 8 * 1024  # KiB


# ---- the guide ----------------------------------------------------------------------------------

def test_the_worked_example_of_the_python_guide_runs(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (Debian's python3-matplotlib)")
    guide = open(os.path.join(os.environ.get("HEADLAB_SOURCE_DIR", "."), "docs", "python.md")).read()
    code = guide.split("```python\n")[1].split("```")[0]
    # plt.show() draws nothing without a display; the module as this test imported it
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(hl.__file__))))
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "without L0H2" in out.stdout
    assert os.path.exists(tmp_path / "runs" / "varcopy-py" / "model.safetensors")


def test_init_takes_the_architecture_and_position_table_from_the_checkpoint(tmp_path):
    # a model made elsewhere: not the default architecture, a position table of 24 (the data's length)
    made = hl.TransformerLM(hl.ModelConfig(d_model=24, layers=1, heads=3, d_ff=40, vocab_size=20, max_seq_len=24), seed=5)
    ck = str(tmp_path / "made.safetensors")
    made.save(ck)
    ids = np.random.default_rng(1).integers(0, 20, size=(300, 24)).astype(np.int64)
    settings = dict(task="tokens", data=ids, alphabet=20, steps=10, batch=16, eval_size=32)
    t = hl.Trainer(init=ck, **settings)
    c = t.model.config
    assert (c.d_model, c.n_layers, c.n_heads, c.d_mlp, c.n_ctx) == (24, 1, 3, 40, 24)
    start = t.model.named_parameters()
    for name, w in made.named_parameters().items():
        assert np.array_equal(start[name], w), name  # the checkpoint's weights, untouched before training
    assert np.isfinite(t.run(progress=False)["final_eval"]["loss"])
    # a model flag that contradicts the checkpoint is refused, naming both
    with pytest.raises(hl.HeadlabError, match=r"--d-model 32 contradicts --init .*made.safetensors, whose model has d_model 24"):
        hl.Trainer(init=ck, d_model=32, **settings)
    hl.Trainer(init=ck, d_model=24, **settings)  # agreeing is fine


def test_every_train_setting_works_as_a_keyword_and_the_atlas_matches_the_cli(tmp_path):
    # quiet, log_grads and dump_grads_at, as `headlab train --quiet --log-grads 10 --dump-grads-at 20`
    settings = dict(steps=20, eval_every=10, eval_size=64, threads=2)
    t = hl.Trainer(out=str(tmp_path / "py"), quiet=True, log_grads=10, dump_grads_at=[20], **settings)
    t.run()
    subprocess.run([HEADLAB, "train", "--steps", "20", "--eval-every", "10", "--eval-size", "64", "--threads", "2",
                    "--quiet", "--log-grads", "10", "--dump-grads-at", "20", "--out", str(tmp_path / "cli")],
                   check=True, capture_output=True)
    for f in ("grad_atlas.csv", "attn_entropy.csv", "circuits.csv"):
        py, cli = (tmp_path / "py" / f).read_text(), (tmp_path / "cli" / f).read_text()
        assert py == cli and len(py.splitlines()) > 2, f
    assert (tmp_path / "py" / "grads" / "step_20.safetensors").exists()
    with pytest.raises(ValueError, match="write the gradient atlas into the run.s directory: give --out"):
        hl.Trainer(log_grads=10, **settings)


def test_view_shows_a_run_trained_from_arrays(tmp_path):
    ids = np.random.default_rng(2).integers(0, 20, size=(100, 12)).astype(np.int64)
    hl.Trainer(task="tokens", data=ids, steps=5, eval_size=16, out=str(tmp_path / "run"), quiet=True).run()
    r = subprocess.run([HEADLAB, "view", str(tmp_path / "run")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "came from Python arrays" in r.stderr and (tmp_path / "run" / "view.html").stat().st_size > 10000


def test_a_step_loop_with_out_writes_the_metrics_and_checkpoints_run_writes(tmp_path):
    settings = dict(steps=20, eval_every=10, checkpoint_every=10, eval_size=64, threads=2, quiet=True)
    hl.Trainer(out=str(tmp_path / "run"), **settings).run()
    t = hl.Trainer(out=str(tmp_path / "loop"), **settings)
    for _ in range(20):
        t.step()
    assert metrics(str(tmp_path / "loop")) == metrics(str(tmp_path / "run"))  # the same held-out numbers
    assert [m["step"] for m in metrics(str(tmp_path / "loop"))] == [10, 20]
    assert (tmp_path / "loop" / "checkpoint.safetensors").exists() and (tmp_path / "loop" / "model.safetensors").exists()


def test_composition_baseline_is_the_commands_and_random_models_fall_inside_it(tmp_path):
    ckpt = str(tmp_path / "m.safetensors")
    m = small_model(seed=3)
    m.save(ckpt)
    base = hl.composition_baseline(m.config)
    subprocess.run([HEADLAB, "compose", "--checkpoint", ckpt, "--out", str(tmp_path / "c")], check=True, capture_output=True)
    rows = [line.split(",") for line in open(tmp_path / "c" / "compose_baseline.csv").read().split("\n")[1:] if line]
    for kind, mean, lo, hi in rows:
        b = base[kind]
        assert abs(b["mean"] - float(mean)) <= 5e-7 and abs(b["lo"] - float(lo)) <= 5e-7 and abs(b["hi"] - float(hi)) <= 5e-7
        assert b["lo"] < b["mean"] < b["hi"]
    # a freshly initialised model is random weights: most of its head pairs score inside the range
    for seed in (11, 12):
        scores = hl.composition_scores(hl.TransformerLM(m.config, seed), 0, 1)
        for kind in "qkv":
            s = np.asarray(scores[kind]).ravel()
            inside = np.mean((s >= base[kind]["lo"]) & (s <= base[kind]["hi"]))
            assert inside >= 0.75, (kind, s, base[kind])
    with pytest.raises(ValueError, match="at least 2"):
        hl.composition_baseline(m.config, models=1)


def test_run_with_cache_by_default_leaves_out_the_split_qkv_inputs_and_caches_them_when_named():
    m = small_model()
    ids = ids_batch()
    _, cache = m.run_with_cache(ids)
    names = [n for n, _ in hl.hook_points(m.config)]
    split = [n for n in names if n.endswith(("hook_q_input", "hook_k_input", "hook_v_input"))]
    assert len(split) == 3 * m.config.n_layers
    assert sorted(cache.keys()) == sorted(set(names) - set(split))
    _, named = m.run_with_cache(ids, names_filter=["blocks.0.attn.hook_k_input"])
    x = np.asarray(cache["blocks.0.ln1.hook_normalized"])
    assert np.array_equal(np.asarray(named["blocks.0.attn.hook_k_input"]), np.repeat(x[:, :, None, :], m.config.n_heads, axis=2))


def test_per_token_loss_runs_with_dropout_off():
    m = small_model(dropout=0.3)
    m.train()
    ids = ids_batch()
    a, b = hl.per_token_loss(m, ids), hl.per_token_loss(m, ids)
    assert np.array_equal(a, b)
    m.eval()
    logits = np.asarray(m(ids), dtype=np.float64)[:, :-1]
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    want = lse - np.take_along_axis(logits, ids[:, 1:, None], -1)[..., 0]
    assert np.abs(a - want).max() <= 1e-5
