"""Hostile input for the Python module: files that lie about their size, threads, re-entrant
autograd, exceptions and Ctrl-C inside hooks and callbacks, odd arrays and settings. Whatever can
crash or hang runs in a child interpreter with a timeout, so a segfault or a hang fails the test
instead of ending pytest. Run by ctest (see python/CMakeLists.txt) or directly:
PYTHONPATH=build/python python3 -m pytest python/tests/test_hostile.py"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import headlab as hl

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(hl.__file__)))  # the module this test imported


def run_script(code, timeout=60, cwd=None):
    """Runs `code` in a fresh interpreter importing this headlab; fails on a crash or a timeout.
    The script reports by printing one JSON line starting with RESULT; returns (process, result)."""
    env = dict(os.environ, PYTHONPATH=PACKAGE_DIR, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    prelude = "import json, os, sys, signal, threading, time\nimport numpy as np\nimport headlab as hl\n"
    try:
        p = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"the child hung: no exit within {timeout} s\n{err[-1500:]}")
    assert p.returncode >= 0, f"the child crashed (signal {-p.returncode})\n{p.stderr[-1500:]}"
    result = None
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    return p, result


def write_npy_header(path, descr, shape, body=b"\0" * 64):
    """A .npy file whose header declares `shape` (a Python literal), whatever the body holds."""
    h = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h.encode() + body)


SMALL_TRAIN = dict(task="copy", d_model=32, layers=2, heads=4, d_ff=64, length=8, alphabet=10, batch=16,
                   eval_size=64, eval_every=10, steps=100, threads=1)


# ---- 1. crashes: a .npy header declaring (2^40, 2^40) -------------------------------------------

def test_npy_header_with_a_huge_shape_is_refused_naming_the_file(tmp_path):
    path = str(tmp_path / "huge_shape.npy")
    write_npy_header(path, "<i4", "(%d, %d)" % (2**40, 2**40))
    p, r = run_script(f"""
        try:
            hl.Task("tokens", data={path!r}); r = {{"raised": None}}
        except BaseException as e:
            r = {{"raised": type(e).__name__, "headlab": isinstance(e, hl.HeadlabError),
                 "value": isinstance(e, ValueError), "msg": str(e)}}
        print("RESULT " + json.dumps(r))
        """, timeout=60)
    assert r is not None, p.stderr[-1500:]
    assert r["raised"] is not None, "a (2^40, 2^40) .npy was accepted"
    assert r["headlab"] and r["value"], r
    assert "huge_shape.npy" in r["msg"], r["msg"]


# ---- 2. crashes: two threads training / forwarding their own models -----------------------------

def test_two_threads_each_with_its_own_trainer_and_model():
    for child in range(3):  # a race: three children of 10 rounds each, every one must come out clean
        two_threads_once()


def two_threads_once():
    p, r = run_script(f"""
        S = {SMALL_TRAIN!r}
        ref = {{s: hl.Trainer(seed=s, **S).run(progress=False)["final_eval"]["loss"] for s in (1, 2)}}
        bad = []
        for it in range(10):
            res = {{}}
            def go(s):
                res[s] = hl.Trainer(seed=s, **S).run(progress=False)["final_eval"]["loss"]
            ts = [threading.Thread(target=go, args=(s,)) for s in (1, 2)]
            [t.start() for t in ts]; [t.join() for t in ts]
            if res != ref: bad.append([it, repr(res)])
        ms = [hl.TransformerLM(hl.ModelConfig(d_model=32, layers=2, heads=4, d_ff=64, vocab_size=13), seed=s) for s in (1, 2)]
        ids = np.random.default_rng(0).integers(0, 13, size=(4, 16))
        fref = [np.asarray(m(ids)).copy() for m in ms]
        fbad = []
        for it in range(10):
            out = {{}}
            def fwd(i):
                for _ in range(20): out[i] = np.asarray(ms[i](ids)).copy()
            ts = [threading.Thread(target=fwd, args=(i,)) for i in (0, 1)]
            [t.start() for t in ts]; [t.join() for t in ts]
            if not all(np.array_equal(out[i], fref[i]) for i in (0, 1)): fbad.append(it)
        print("RESULT " + json.dumps({{"ref": repr(ref), "train_mismatch": bad, "forward_mismatch": fbad}}))
        """, timeout=120)
    assert p.returncode == 0 and r is not None, p.stderr[-1500:]
    assert r["train_mismatch"] == [], f"threaded runs differ from the sequential ones {r['ref']}: {r['train_mismatch']}"
    assert r["forward_mismatch"] == [], r


# ---- 3. crashes: backward inside a backward hook ------------------------------------------------

def test_backward_of_an_unrelated_graph_inside_a_backward_hook():
    p, r = run_script("""
        cfg = hl.ModelConfig(d_model=16, layers=1, heads=2, d_ff=32, vocab_size=8)
        ids = np.random.default_rng(0).integers(0, 8, size=(2, 6))
        targets = np.random.default_rng(1).integers(0, 8, size=(2, 6))
        plain = hl.TransformerLM(cfg, seed=3)
        hl.cross_entropy(plain.run_with_hooks(ids, bwd_hooks=[("blocks.0.hook_resid_mid", lambda g, n: None)]), targets).backward()
        want = {k: np.asarray(v.grad).copy() for k, v in plain.named_parameters().items()}
        hooked = hl.TransformerLM(cfg, seed=3)
        inner = {}
        def hook(g, name):
            x = hl.tensor(np.array([[1.0, 2.0], [3.0, -4.0]], np.float32), requires_grad=True)
            (x * x).sum().backward()
            inner["grad"] = np.asarray(x.grad).tolist()
        hl.cross_entropy(hooked.run_with_hooks(ids, bwd_hooks=[("blocks.0.hook_resid_mid", hook)]), targets).backward()
        got = {k: np.asarray(v.grad) for k, v in hooked.named_parameters().items()}
        differ = sorted(k for k in want if not np.array_equal(want[k], got[k]))
        print("RESULT " + json.dumps({"inner": inner.get("grad"), "differ": differ}))
        """, timeout=60)
    assert p.returncode == 0 and r is not None, p.stderr[-1500:]
    assert r["inner"] == [[2.0, 4.0], [6.0, -8.0]], r
    assert r["differ"] == [], f"parameter gradients changed by the hook's inner backward: {r['differ']}"


# ---- 4. crashes: arrays of strings, broadcast views ---------------------------------------------

def test_string_loss_mask_and_huge_broadcast_view_raise():
    p, r = run_script("""
        out = {}
        ids = np.random.default_rng(0).integers(0, 10, size=(40, 8))
        for name, f in [("mask", lambda: hl.Task("tokens", data={"input_ids": ids, "loss_mask": np.full(ids.shape, "x")})),
                        ("broadcast", lambda: hl.tensor(np.broadcast_to(np.float32(0), (2**20, 2**20))))]:
            try:
                f(); out[name] = None
            except BaseException as e:
                out[name] = [type(e).__name__, isinstance(e, (TypeError, ValueError)), str(e)]
            print(name, "done", flush=True)
        print("RESULT " + json.dumps(out))
        """, timeout=60)
    assert p.returncode == 0 and r is not None, p.stderr[-1500:]
    for name in ("mask", "broadcast"):
        assert r[name] is not None, f"{name} was accepted"
        assert r[name][1], f"{name} raised {r[name][0]}, not TypeError or ValueError: {r[name][2]}"


# ---- 5. hangs: a backward hook that raises ------------------------------------------------------

def test_interpreter_exits_after_a_backward_hook_raised():
    p, r = run_script("""
        m = hl.TransformerLM(hl.ModelConfig(d_model=16, layers=1, heads=2, d_ff=32, vocab_size=8))
        ids = np.zeros((2, 4), np.int64)
        def hook(g, name):
            raise RuntimeError("boom from the hook")
        logits = m.run_with_hooks(ids, bwd_hooks=[("hook_embed", hook)])
        try:
            hl.cross_entropy(logits, ids).backward(); caught = None
        except Exception as e:
            caught = str(e)
        print("RESULT " + json.dumps({"caught": caught}), flush=True)
        """, timeout=30)
    assert r is not None and r["caught"] is not None and "boom from the hook" in r["caught"], p.stderr[-1500:]
    assert p.returncode == 0, p.stderr[-1500:]


# ---- 7. hangs: held_out(batch=0) ----------------------------------------------------------------

def test_held_out_with_batch_zero_is_a_value_error_naming_the_batch():
    p, r = run_script("""
        ids = np.random.default_rng(0).integers(0, 10, size=(40, 8))
        try:
            hl.Task("tokens", data=ids).held_out(n=10, batch=0); r = {"raised": None}
        except BaseException as e:
            r = {"raised": type(e).__name__, "value": isinstance(e, ValueError), "msg": str(e)}
        print("RESULT " + json.dumps(r))
        """, timeout=30)
    assert r is not None and r["raised"] is not None, p.stderr[-1500:]
    assert r["value"], r
    assert "batch" in r["msg"], r["msg"]


# ---- 12. Ctrl-C during evaluation; exceptions out of hooks keep their type ----------------------

def test_ctrl_c_during_evaluation_raises_keyboard_interrupt_and_resume_finishes_the_same(tmp_path):
    run = str(tmp_path / "run")
    p, r = run_script(f"""
        S = dict(task="copy", d_model=16, layers=1, heads=2, d_ff=32, length=4, alphabet=5, batch=8,
                 eval_every=20, steps=40, threads=1, checkpoint_every=100, eval_size=300000)
        full = hl.Trainer(**S).run(progress=False)["final_eval"]["loss"]
        def at_20(step, total, loss, tps):  # the held-out evaluation of step 20 (0.3 s) follows
            if step == 20:
                threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        r = {{"full": full}}
        try:
            hl.Trainer(out={run!r}, **S).run(callback=at_20, progress=False)
            r["first"] = None
        except BaseException as e:
            r["first"] = [type(e).__name__, str(e)]
        try:
            r["resumed"] = hl.Trainer(out={run!r}, resume=True).run(progress=False)["final_eval"]["loss"]
        except BaseException as e:
            r["resumed"] = [type(e).__name__, str(e)]
        print("RESULT " + json.dumps(r))
        """, timeout=120)
    assert p.returncode == 0 and r is not None, p.stderr[-1500:]
    assert r["first"] is not None, "SIGINT during evaluation did not stop run()"
    assert r["first"][0] == "KeyboardInterrupt", f"SIGINT during evaluation raised {r['first']}"
    assert not isinstance(r["resumed"], list), f"resume failed: {r['resumed']}"
    assert r["resumed"] == r["full"]


def test_exceptions_raised_in_forward_hooks_keep_their_type():
    p, r = run_script("""
        m = hl.TransformerLM(hl.ModelConfig(d_model=16, layers=1, heads=2, d_ff=32, vocab_size=8))
        ids = np.zeros((2, 4), np.int64)
        class MyError(Exception):
            pass
        seen = {}
        for exc in (KeyboardInterrupt, SystemExit, MyError):
            def hook(x, name, exc=exc):
                raise exc("from the hook")
            try:
                m.run_with_hooks(ids, fwd_hooks=[("hook_embed", hook)]); seen[exc.__name__] = None
            except BaseException as e:
                seen[exc.__name__] = type(e).__name__
        print("RESULT " + json.dumps(seen))
        """, timeout=60)
    assert p.returncode == 0 and r is not None, p.stderr[-1500:]
    assert r == {"KeyboardInterrupt": "KeyboardInterrupt", "SystemExit": "SystemExit", "MyError": "MyError"}, r


# ---- 15. zero targets ---------------------------------------------------------------------------

def test_cross_entropy_with_every_target_ignored_raises():
    logits = hl.tensor(np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32), requires_grad=True)
    with pytest.raises((ValueError, hl.HeadlabError)):
        v = hl.cross_entropy(logits, np.full((2, 3), -1)).item()
        print("cross_entropy with no counted target returned", v)


# ---- 16. a model with a NaN is not saved -------------------------------------------------------

def test_save_refuses_a_nan_parameter_and_writes_nothing(tmp_path):
    m = hl.TransformerLM(hl.ModelConfig(d_model=16, layers=1, heads=2, d_ff=32, vocab_size=8))
    np.asarray(m.named_parameters()["blocks.0.attn.W_Q.weight"])[0, 3] = np.nan
    path = tmp_path / "nan.safetensors"
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.W_Q\.weight"):
        m.save(str(path))
    assert not path.exists()
    assert [f for f in os.listdir(tmp_path)] == [], "temporary files left behind"


# ---- 18. messages without library internals ----------------------------------------------------

def test_out_of_range_gates_and_wrong_typed_settings():
    m = hl.TransformerLM(hl.ModelConfig(d_model=16, layers=1, heads=2, d_ff=32, vocab_size=8))
    with pytest.raises((IndexError, ValueError)) as e:
        m.gates(5)
    assert "_M_range_check" not in str(e.value) and "vector" not in str(e.value), str(e.value)
    assert "5" in str(e.value), str(e.value)
    with pytest.raises(TypeError, match="lr"):
        hl.Trainer(lr="x")


def test_arguments_that_do_not_convert_get_one_line_naming_the_argument_and_its_type():
    # pybind11's own message lists every signature and the repr of every argument (pages for an array)
    m = hl.TransformerLM(hl.ModelConfig(d_model=16, n_layers=1, n_heads=2, d_mlp=32, d_vocab=11, n_ctx=8), seed=0)
    big = np.zeros((300, 400), dtype=np.int64)
    cases = [
        (lambda: hl.detect_heads(m, big, kind=3), "hl.detect_heads: argument 'kind' is int, expected str"),
        (lambda: hl.detect_heads("model", big), "hl.detect_heads: argument 'model' is str, expected TransformerLM"),
        (lambda: hl.detect_heads(m, big, "induction", True, False, 7), "hl.detect_heads: takes 5 positional arguments, got 6"),
        (lambda: hl.detect_heads(m, big, knd="induction"),
         "hl.detect_heads: has no argument 'knd' (its arguments: model, data, kind, exclude_bos, exclude_current_token)"),
        (lambda: hl.edge_patching(m, big, big, answers=[(0, 1, 2, 3)], ig_steps="5"),
         "hl.edge_patching: argument 'ig_steps' is str, expected int"),
        (lambda: m.run_with_cache(big, incl_bwd="yes"), "TransformerLM.run_with_cache: argument 'incl_bwd' is str, expected bool"),
        (lambda: hl.TransformerLM(big), "hl.TransformerLM: argument 'config' is ndarray, expected ModelConfig"),
    ]
    for call, message in cases:
        with pytest.raises(TypeError) as e:
            call()
        assert str(e.value) == message
    # the wrapper keeps what help() and the stub read
    assert hl.detect_heads.__doc__.startswith("detect_heads(model: headlab._core.TransformerLM, data: object")
    assert hl.TransformerLM.run_with_cache.__wrapped__.__doc__.startswith("run_with_cache(self: object, ids: object")
    # a TypeError of the function itself is not touched
    with pytest.raises(TypeError, match="^attention_mask: expected an integer or bool array"):
        m(big[:2, :4], attention_mask=np.ones((2, 4), dtype=np.float32))
