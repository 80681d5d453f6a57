"""Today's decoder-only blocks in PyTorch, written from the published definitions, built from a
headlab checkpoint (its config JSON and safetensors, docs/formats.md and docs/architectures.md):
what headlab's models must compute, for tests in any dtype (float64 for the comparisons).

Block options (headlab names, with the definitions they follow):
  normalization  layernorm  (x - mean) / sqrt(var + eps) * w + b                 (Ba et al. 2016)
                 rmsnorm    x / sqrt(mean(x^2) + eps) * w                       (Zhang & Sennrich 2019; Llama)
                 rmsnorm_1p x / sqrt(mean(x^2) + eps) * (1 + w)                 (Gemma's GemmaRMSNorm)
  sandwich_norm  x + ln1_post(attn(ln1 x)); x + ln2_post(mlp(ln2 x))            (Gemma 2)
  mlp            plain fc2(act(fc1 x)); swiglu fc2(silu(gate x) * fc1 x)        (Shazeer 2020)
                 geglu fc2(gelu(gate x) * fc1 x), the gelu of `activation`
  activation     gelu_erf, gelu_tanh, relu, relu2 = relu(x)^2 (So et al. 2021), silu
  parallel_block x + attn(ln1 x) + mlp(ln2 x)                                   (GPT-J, GPT-NeoX)
  embed_scale    tok_emb[ids] * sqrt(d_model)                                   (Gemma)
  final_softcap  logits -> cap * tanh(logits / cap)                             (Gemma 2)

Attention options (of the attention side; read when the config has them, defaults otherwise):
  positions      learned | sinusoidal (added to the embeddings) | rotary | none (NoPE)
  rope_theta, rotary_dim (0 = int(rotary_pct * d_head), rotary_pct 1 when absent; partial rotary
                 rotates the first rotary_dim features of each head, as GPT-NeoX), rotary_style half (rotate-half pairs (i, i + r/2), Llama,
                 NeoX) | interleaved (pairs (2i, 2i + 1), GPT-J); angle of pair i at position p:
                 p * theta^(-2i / r)
  rope_theta_local > 0: the base of the local (sliding-window) layers instead (Gemma 3)
  qk_norm        RMSNorm over d_head of q and of k (weights attn.q_norm.weight, attn.k_norm.weight,
                 (d_head), shared by the heads; eps the model's), before rotary (Qwen3, OLMo 2);
                 with normalization rmsnorm_1p its gain is (1 + w) (Gemma 3)
  attn_scale     scores * attn_scale (0 = 1/sqrt(d_head))
  attn_softcap   scores -> cap * tanh(scores / cap) after scaling, before the mask (Gemma 2)
  sliding_window key j seen by query i when i - j < window, on the local layers of window_layers:
                 all | alternate (even layers local) | "L:G" (L local then G global, repeating)
  qkv_bias, o_bias (or attn_bias for both)

Parameter names are headlab's (tok_emb.weight, blocks.{l}.ln1.weight, blocks.{l}.attn.W_Q.weight,
blocks.{l}.ffn.gate.weight, ...). Attention heads: head h is rows h*d_head.. of W_Q (of W_K, W_V
for kv head h // (n_heads / n_kv_heads)) and the same columns of W_O.
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from safetensors_np import read_safetensors, read_safetensors_metadata  # noqa: E402

ACTIVATIONS = {
    "gelu_erf": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "relu2": lambda x: F.relu(x) ** 2,
    "silu": F.silu,
}


def norm(x, p, prefix, kind, eps):
    w = p[prefix + ".weight"]
    if kind == "layernorm":
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + eps) * w + p[prefix + ".bias"]
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y * (1 + w) if kind == "rmsnorm_1p" else y * w


def linear(x, p, prefix):
    y = x @ p[prefix + ".weight"].T
    b = p.get(prefix + ".bias")
    return y if b is None else y + b


def rotary(x, theta, dim, style):
    """x (B, H, T, d_head): the first `dim` features of each head rotated by position."""
    T = x.shape[2]
    r = x[..., :dim]
    inv = theta ** (-torch.arange(0, dim, 2, dtype=x.dtype) / dim)  # (dim/2)
    ang = torch.arange(T, dtype=x.dtype)[:, None] * inv[None, :]  # (T, dim/2)
    cos, sin = torch.cos(ang), torch.sin(ang)
    if style == "interleaved":
        a, b = r[..., 0::2], r[..., 1::2]
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:
        a, b = r[..., : dim // 2], r[..., dim // 2:]
        out = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return torch.cat((out, x[..., dim:]), dim=-1)


def is_local(cfg, layer):
    if not cfg.get("sliding_window", 0):
        return False
    pattern = cfg.get("window_layers", "all")
    if pattern == "all":
        return True
    if pattern == "alternate":
        return layer % 2 == 0
    if set(pattern) <= {"L", "G"}:  # one letter per layer
        return pattern[layer] == "L"
    local, glob = (int(v) for v in pattern.split(":"))
    return layer % (local + glob) < local


def attention(x, p, prefix, cfg, layer):
    B, T, _ = x.shape
    H, Hkv, dh = cfg["n_heads"], cfg.get("n_kv_heads") or cfg["n_heads"], cfg.get("d_head") or cfg["d_model"] // cfg["n_heads"]
    q = linear(x, p, prefix + "W_Q").view(B, T, H, dh).transpose(1, 2)
    k = linear(x, p, prefix + "W_K").view(B, T, Hkv, dh).transpose(1, 2)
    v = linear(x, p, prefix + "W_V").view(B, T, Hkv, dh).transpose(1, 2)
    if cfg.get("qk_norm"):
        kind = "rmsnorm_1p" if cfg.get("normalization") == "rmsnorm_1p" else "rmsnorm"
        q = norm(q, p, prefix + "q_norm", kind, cfg["layer_norm_eps"])
        k = norm(k, p, prefix + "k_norm", kind, cfg["layer_norm_eps"])
    if cfg.get("positions") == "rotary":
        dim = cfg.get("rotary_dim") or int(dh * cfg.get("rotary_pct", 1.0))  # GPT-NeoX's rotary_ndims
        theta = cfg.get("rope_theta", 10000.0)
        if cfg.get("rope_theta_local", 0) and is_local(cfg, layer):
            theta = cfg["rope_theta_local"]
        q = rotary(q, theta, dim, cfg.get("rotary_style", "half"))
        k = rotary(k, theta, dim, cfg.get("rotary_style", "half"))
    k = k.repeat_interleave(H // Hkv, dim=1)
    v = v.repeat_interleave(H // Hkv, dim=1)
    scale = cfg.get("attn_scale") or 1.0 / math.sqrt(dh)
    s = (q @ k.transpose(-2, -1)) * scale
    cap = cfg.get("attn_softcap", 0)
    if cap:
        s = cap * torch.tanh(s / cap)
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    seen = j <= i
    if is_local(cfg, layer):
        seen = seen & (i - j < cfg["sliding_window"])
    s = s.masked_fill(~seen, float("-inf"))
    z = torch.softmax(s, dim=-1) @ v  # (B, H, T, dh)
    return linear(z.transpose(1, 2).reshape(B, T, H * dh), p, prefix + "W_O")


def mlp(x, p, prefix, cfg):
    up = linear(x, p, prefix + "fc1")
    kind = cfg.get("mlp", "plain")
    if kind == "plain":
        h = ACTIVATIONS[cfg["activation"]](up)
    else:
        act = F.silu if kind == "swiglu" else ACTIVATIONS[cfg["activation"]]
        h = act(linear(x, p, prefix + "gate")) * up
    return linear(h, p, prefix + "fc2")


def sinusoid(T, D, dtype):
    pe = torch.zeros(T, D, dtype=dtype)
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    for i in range(0, D, 2):
        ang = pos[:, 0] / 10000.0 ** (i / D)
        pe[:, i] = torch.sin(ang)
        if i + 1 < D:
            pe[:, i + 1] = torch.cos(ang)
    return pe


def forward(cfg, p, ids):
    """Logits (B, T, vocab) of the model `cfg` with parameters p (name -> tensor) for ids (B, T)."""
    T, D = ids.shape[1], cfg["d_model"]
    kind, eps = cfg.get("normalization", "layernorm"), cfg["layer_norm_eps"]
    x = p["tok_emb.weight"][ids]
    if cfg.get("embed_scale"):
        x = x * math.sqrt(D)
    if cfg.get("positions", "learned") == "learned":
        x = x + p["pos_emb.weight"][:T]
    elif cfg["positions"] == "sinusoidal":
        x = x + sinusoid(T, D, x.dtype)
    pre = cfg.get("norm", "pre") == "pre"
    for layer in range(cfg["n_layers"]):
        b = f"blocks.{layer}."
        if not pre:  # post-norm: ln1(x + attn(x)), ln2(x + mlp(x))
            x = norm(x + attention(x, p, b + "attn.", cfg, layer), p, b + "ln1", kind, eps)
            if cfg["d_ff"]:
                x = norm(x + mlp(x, p, b + "ffn.", cfg), p, b + "ln2", kind, eps)
            continue
        a = attention(norm(x, p, b + "ln1", kind, eps), p, b + "attn.", cfg, layer)
        if cfg.get("sandwich_norm"):
            a = norm(a, p, b + "ln1_post", kind, eps)
        if not cfg["d_ff"]:
            x = x + a
            continue
        mid = x if cfg.get("parallel_block") else x + a  # a parallel MLP reads the block's input
        m = mlp(norm(mid, p, b + "ln2", kind, eps), p, b + "ffn.", cfg)
        if cfg.get("sandwich_norm"):
            m = norm(m, p, b + "ln2_post", kind, eps)
        x = (x + a + m) if cfg.get("parallel_block") else (mid + m)
    if pre:
        x = norm(x, p, "ln_f", kind, eps)
    logits = linear(x, p, "head")
    cap = cfg.get("final_softcap", 0)
    return cap * torch.tanh(logits / cap) if cap else logits


def load(path, dtype=torch.float64, requires_grad=False):
    """(config dict, name -> tensor) of a headlab checkpoint."""
    cfg = json.loads(read_safetensors_metadata(path)["config"])
    params = {}
    for name, arr in read_safetensors(path).items():
        t = torch.tensor(arr.copy(), dtype=dtype)
        params[name] = t.requires_grad_(requires_grad)
    return cfg, params
