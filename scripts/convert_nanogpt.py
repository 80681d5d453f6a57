#!/usr/bin/python3
"""nanoGPT's ckpt.pt -> a headlab checkpoint (safetensors, docs/formats.md).

    /usr/bin/python3 scripts/convert_nanogpt.py ckpt.pt --out model.safetensors

(`headlab convert ckpt.pt --out model.safetensors` runs this.) Nothing in the file is ever run:
torch.load is never called (torch 1.13 hands a TorchScript archive to torch.jit.load, which runs
its code); a zip archive must hold exactly the members torch.save writes (no code/, no
constants.pkl), and the pickle is read with an unpickler that resolves only the functions that
rebuild tensors and OrderedDict, so a __reduce__ payload is refused before it is called. Both of
torch.save's formats are read: the zip archive and the legacy bare pickle.

nanoGPT's GPT is GPT-2 with nn.Linear layers (weight (out, in), headlab's layout too): c_attn
(3d, d) holds [W_Q; W_K; W_V]; exact GELU; LayerNorm eps 1e-5, its bias absent when
model_args.bias is False (headlab's LayerNorm always has one: zeros, exact); block_size
positions; lm_head tied to wte (headlab keeps a copy as head.weight). torch.compile's
'_orig_mod.' prefix is dropped.
"""
import argparse
import json
import os
import re
import signal
import stat
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_np import write_safetensors  # noqa: E402


class Refused(Exception):
    pass


def shape_str(shape):
    return "(" + ",".join(str(n) for n in shape) + ")"  # as headlab writes shapes


# What a checkpoint of tensors and plain data may name: the functions torch.save uses to rebuild
# tensors, and OrderedDict. Anything else (builtins.open, os.system, a class of the author's) is
# refused before it is called.
SAFE_GLOBALS = {("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2"),
                ("torch._utils", "_rebuild_tensor"), ("torch._utils", "_rebuild_parameter"), ("torch", "Size")}


class _RestrictedPickle:
    """The pickle module handed to torch's readers: its Unpickler (and load, which torch's legacy
    reader calls for the file's header pickles) resolves only SAFE_GLOBALS (Python's
    "restricting globals" recipe), so nothing named in the file is ever called but them. It is
    used instead of torch.load(weights_only=True), whose 1.13 version hands a TorchScript
    archive to torch.jit.load (which runs the archive's code) and cannot read floats."""
    import pickle as _pickle

    class Unpickler(_pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) in SAFE_GLOBALS:
                return super().find_class(module, name)
            raise _RestrictedPickle._pickle.UnpicklingError(f"global '{module}.{name}' is not allowed")

    @staticmethod
    def load(f, **kw):
        return _RestrictedPickle.Unpickler(f, **kw).load()


# The members torch.save writes into its zip archive, under one top folder ARCHIVE/. A TorchScript
# archive (torch.jit.save) also has code/ and constants.pkl; torch.load would hand it to
# torch.jit.load, which runs that code. Anything else is not a plain checkpoint either.
_ZIP_MEMBER = re.compile(r"(data\.pkl|version|byteorder|\.format_version|\.storage_alignment|\.data/version|\.data/serialization_id|data/[0-9]+)")


def check_zip_members(path, names):
    """Refuses a zip that is not exactly what torch.save writes, before any torch reader opens it."""
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) != 1 or any("/" not in n for n in names):
        raise Refused(f"{path}: refused: not a torch.save archive (its members are not in one folder); it is not read")
    for n in names:
        member = n.split("/", 1)[1]
        if member == "constants.pkl" or member.startswith("code/"):
            raise Refused(f"{path}: refused: a TorchScript archive (it holds code: {n}), not a checkpoint of tensors; "
                          "nothing in it is run")
        if not _ZIP_MEMBER.fullmatch(member):
            raise Refused(f"{path}: refused: unexpected member {n} (torch.save writes only data.pkl, data/N and version "
                          "files); it is not read")
    if tops.pop() + "/data.pkl" not in names:
        raise Refused(f"{path}: refused: a zip without data.pkl, not a torch.save checkpoint")


def load_ckpt(path):
    import pickle
    import zipfile
    try:
        import torch
    except ImportError:
        raise Refused(f"{path}: reading a torch checkpoint needs PyTorch ({sys.executable} has none; "
                      "Debian's python3-torch provides it)")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise Refused(f"{path}: not found")
    except OSError as e:
        raise Refused(f"{path}: cannot read: {e.strerror}")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a pipe (FIFO)" if stat.S_ISFIFO(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a file")
        raise Refused(f"{path}: is {kind}, not a regular file: give a file")

    def unreadable(e):
        return Refused(f"{path}: not a readable torch checkpoint ({str(e).splitlines()[0] if str(e) else type(e).__name__})")

    # torch.load is never called: the two formats torch.save writes are told apart here and read
    # by torch's own readers with the restricted pickle module. A zip (torch >= 1.6) is checked
    # member by member first; a bare pickle (the legacy format, protocol 2+) starts with 0x80.
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(0)
            if head == b"PK\x03\x04":
                try:
                    names = zipfile.ZipFile(f).namelist()
                except zipfile.BadZipFile as e:
                    raise unreadable(e)
                check_zip_members(path, names)
                f.seek(0)
                with torch.serialization._open_zipfile_reader(f) as archive:
                    return torch.serialization._load(archive, "cpu", _RestrictedPickle, encoding="utf-8")
            if head[:1] == b"\x80":
                return torch.serialization._legacy_load(f, "cpu", _RestrictedPickle, encoding="utf-8")
            raise Refused(f"{path}: not a torch checkpoint (neither the zip archive nor the pickle that torch.save writes)")
    except pickle.UnpicklingError as e:
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise Refused(f"{path}: refused: the pickle holds more than tensors and plain data, and is not run ({msg})")
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise unreadable(e)


def convert(ckpt, source):
    """headlab tensors (name -> float32 array) and config of a loaded nanoGPT checkpoint."""
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
        raise Refused(f"{source}: not a nanoGPT checkpoint (needs a dict with 'model' and 'model_args')")
    args = ckpt["model_args"]
    if not isinstance(args, dict) or not isinstance(ckpt["model"], dict):
        raise Refused(f"{source}: not a nanoGPT checkpoint ('model' and 'model_args' must be dicts)")
    for key in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
        v = args.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise Refused(f"{source}: model_args['{key}'] must be a positive integer, got {v!r}")
    L, H, d, P, V = (args[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"))
    if d % H:
        raise Refused(f"{source}: model_args n_embd {d} is not a multiple of n_head {H}")
    sd = {}
    for k, v in ckpt["model"].items():
        k = k[len("_orig_mod."):] if k.startswith("_orig_mod.") else k
        if k.endswith(".attn.bias"):  # the causal-mask buffer of nanoGPT without flash attention
            continue
        if not hasattr(v, "detach"):
            raise Refused(f"{source}: model entry '{k}' is not a tensor")
        if not v.dtype.is_floating_point:  # a complex weight would lose its imaginary part, an integer one means another model
            raise Refused(f"{source}: tensor '{k}' is {str(v.dtype).replace('torch.', '')}, not a real floating-point tensor")
        sd[k] = v.detach().float().contiguous().numpy()
    bias = "transformer.h.0.attn.c_attn.bias" in sd
    if "bias" in args and bool(args["bias"]) != bias:
        raise Refused(f"{source}: model_args bias is {args['bias']} but the state dict "
                      f"{'has' if bias else 'has no'} biases")
    out, used = {}, set()

    def take(name, shape):
        if name not in sd:
            raise Refused(f"{source}: missing tensor '{name}' that model_args needs")
        if tuple(sd[name].shape) != shape:
            raise Refused(f"{source}: tensor '{name}' has shape {shape_str(sd[name].shape)} but model_args (n_embd {d}, "
                          f"n_layer {L}, n_head {H}, vocab_size {V}, block_size {P}) needs {shape_str(shape)}")
        used.add(name)
        return sd[name]

    def bias_of(name, n):
        return take(name, (n,)) if bias else np.zeros(n, dtype=np.float32)

    t = "transformer."
    out["tok_emb.weight"] = take(t + "wte.weight", (V, d))
    out["pos_emb.weight"] = take(t + "wpe.weight", (P, d))
    for i in range(L):
        h, b = f"{t}h.{i}.", f"blocks.{i}."
        out[b + "ln1.weight"], out[b + "ln1.bias"] = take(h + "ln_1.weight", (d,)), bias_of(h + "ln_1.bias", d)
        qkv, qkv_b = take(h + "attn.c_attn.weight", (3 * d, d)), bias_of(h + "attn.c_attn.bias", 3 * d)
        for j, n in enumerate(("W_Q", "W_K", "W_V")):
            out[f"{b}attn.{n}.weight"] = qkv[j * d:(j + 1) * d]  # (d, d), rows h*d_head.. for head h
            if bias:
                out[f"{b}attn.{n}.bias"] = qkv_b[j * d:(j + 1) * d]
        out[b + "attn.W_O.weight"] = take(h + "attn.c_proj.weight", (d, d))
        if bias:
            out[b + "attn.W_O.bias"] = take(h + "attn.c_proj.bias", (d,))
        out[b + "ln2.weight"], out[b + "ln2.bias"] = take(h + "ln_2.weight", (d,)), bias_of(h + "ln_2.bias", d)
        out[b + "ffn.fc1.weight"] = take(h + "mlp.c_fc.weight", (4 * d, d))
        if bias:
            out[b + "ffn.fc1.bias"] = take(h + "mlp.c_fc.bias", (4 * d,))
        out[b + "ffn.fc2.weight"] = take(h + "mlp.c_proj.weight", (d, 4 * d))
        if bias:
            out[b + "ffn.fc2.bias"] = take(h + "mlp.c_proj.bias", (d,))
    out["ln_f.weight"], out["ln_f.bias"] = take(t + "ln_f.weight", (d,)), bias_of(t + "ln_f.bias", d)
    # lm_head is tied to wte (the same tensor); headlab's head.weight is a copy.
    out["head.weight"] = take("lm_head.weight", (V, d)) if "lm_head.weight" in sd else out["tok_emb.weight"].copy()
    extra = sorted(set(sd) - used)
    if extra:
        raise Refused(f"{source}: unexpected tensor '{extra[0]}' (not part of nanoGPT's GPT)")
    for name, a in out.items():
        if not np.all(np.isfinite(a)):
            raise Refused(f"{source}: tensor '{name}' holds a non-finite value")
    # bias=False: no attention or MLP biases (headlab's attn_bias/mlp_bias off); LayerNorm biases zero.
    config = {"vocab_size": V, "d_model": d, "n_layers": L, "n_heads": H, "n_kv_heads": H, "d_head": d // H,
              "d_ff": 4 * d, "max_seq_len": P, "norm": "pre", "activation": "gelu_erf", "positions": "learned",
              "attn_bias": bias, "mlp_bias": bias, "head_bias": False, "layer_norm_eps": 1e-5}
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}, config, bias


_partial = []  # the temporary file being written, removed if a signal ends the conversion


def _stopper(ckpt, to):
    """SIGINT or SIGTERM ends the conversion where it is (even inside torch's C++ code, which
    would turn an exception into a RuntimeError): one line, nothing written, exit 128 + signal."""
    def stop(signum, frame):
        for p in _partial:
            try:
                os.remove(p)
            except OSError:
                pass
        print(f"error: {ckpt}: not converted: stopped by {signal.Signals(signum).name}; nothing was written",
              file=to, flush=True)
        os._exit(128 + signum)
    return stop


def main(argv=None):
    ap = argparse.ArgumentParser(description="nanoGPT ckpt.pt -> headlab checkpoint")
    ap.add_argument("ckpt")
    ap.add_argument("--out", required=True)
    ap.add_argument("--errors-to-stdout", action="store_true",
                    help="print a refusal on stdout (headlab convert, which runs this, reports it)")
    a = ap.parse_args(argv)
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _stopper(a.ckpt, sys.stdout if a.errors_to_stdout else sys.stderr))
    try:
        tensors, config, bias = convert(load_ckpt(a.ckpt), a.ckpt)
    except Refused as e:
        print(f"error: {e}", file=sys.stdout if a.errors_to_stdout else sys.stderr)
        return 1
    # headlab's parameter order (docs/formats.md); written beside the target, then renamed. The
    # target is only ever a regular file (or new): never a device, a FIFO or a symlink.
    out_dir = os.path.dirname(a.out) or "."
    tmp = os.path.join(out_dir, f".{os.path.basename(a.out)}.tmp.{os.getpid()}")
    _partial.append(tmp)
    try:
        if os.path.lexists(a.out) and not stat.S_ISREG(os.lstat(a.out).st_mode):
            raise Refused(f"--out {a.out}: exists and is not a regular file (a device, a pipe, a link or a directory); "
                          "give a path of its own")
        write_safetensors(tmp, tensors, {"format": "headlab-checkpoint", "format_version": "1",
                                         "config": json.dumps(config), "converted_from": "nanogpt"})
        os.replace(tmp, a.out)
    except Refused as e:
        print(f"error: {e}", file=sys.stdout if a.errors_to_stdout else sys.stderr)
        return 1
    except OSError as e:  # a full disk, a directory we may not write: one line, not a traceback
        print(f"error: {a.out}: cannot write: {e.strerror or e}", file=sys.stdout if a.errors_to_stdout else sys.stderr)
        return 1
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    print(f"converted {a.ckpt} (nanoGPT, {config['n_layers']} layers, "
          f"{'with biases' if bias else 'bias=False: no attention/MLP biases, LayerNorm biases zero'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
