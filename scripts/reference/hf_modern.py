"""Today's decoder-only architectures as Hugging Face stores them, written from each model's
published definition (transformers' modeling_gpt_neox.py, modeling_llama.py, modeling_mistral.py,
modeling_qwen2.py, modeling_qwen3.py, modeling_gpt_neo.py, modeling_gemma2.py, modeling_gemma3.py and
configuration_gemma3.py's Gemma3TextConfig; transformers is not
needed): tiny random models in the HF layout (config.json + model.safetensors, sharded, BF16 or
F16) and a float64 forward that is the reference headlab's logits are checked against
(python/tests/test_hf_models.py). Read from the HF names alone: nothing here knows headlab's layout.

What each forward computes (ids (B, T); x the residual stream; linear layers y = x W^T + b):
  gpt_neox  x = embed_in[ids]; a = attn(input_layernorm x) with the fused query_key_value viewed
            as (B, T, H, 3 d_head) -> q | k | v per head, rotary (rotate-half) on the first
            int(rotary_pct d_head) dims of q and k with base rotary_emb_base, scores / sqrt(d_head);
            use_parallel_residual: x + a + mlp(post_attention_layernorm x), else x + a then
            + mlp(post_attention_layernorm(x + a)); mlp = dense_4h_to_h gelu(dense_h_to_4h);
            logits = final_layer_norm(x) embed_out^T.
  llama     (mistral, qwen2, qwen3) x = embed_tokens[ids]; RMSNorm x / sqrt(mean x^2 + eps) w;
            q/k/v/o_proj with GQA (each key/value head serves n_heads / n_kv_heads query heads),
            qwen2's q/k/v biases, qwen3's RMSNorm over d_head on q and k before the rotation;
            rotary on all of d_head with base rope_theta; mistral's sliding_window hides keys j
            with i - j >= window; mlp = down(silu(gate x) * up x); logits = norm(x) lm_head^T
            (embed_tokens when tie_word_embeddings).
  gpt_neo   x = wte[ids] + wpe[0..T-1]; q/k/v without bias and without score scaling; local
            layers (attention_types) hide keys j with i - j >= window_size; out_proj with bias;
            mlp c_fc/c_proj (Linear) with gelu_new; tied lm_head.
  gemma2    x = embed_tokens[ids] * sqrt(hidden_size); RMSNorm with (1 + w); per layer
            x + post_attention_layernorm(attn(input_layernorm x)), then
            x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm x)); scores times
            query_pre_attn_scalar^-0.5, then attn_logit_softcapping c: c tanh(s / c); even layers
            slide (sliding_window); mlp = down(gelu_tanh(gate x) * up x); logits capped by
            final_logit_softcapping; tied.
  gemma3_text as gemma2, and: q and k each through a (1 + w) RMSNorm over head_dim (q_norm, k_norm)
            before the rotation; layer i slides unless (i + 1) % sliding_window_pattern == 0 (5 local,
            1 global; or layer_types); local layers turn with base rope_local_base_freq, global ones
            with rope_theta; attn_logit_softcapping and final_logit_softcapping null by default.
"""
import json
import math
import os
import sys

import numpy as np
import torch

F = torch.nn.functional


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


ACT = {"gelu": lambda x: 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0))), "gelu_new": gelu_tanh,
       "gelu_pytorch_tanh": gelu_tanh, "silu": F.silu, "relu": torch.relu}

# Tiny configs, one per architecture and variant; every option the architecture has is exercised.
CONFIGS = {
    "pythia": {"model_type": "gpt_neox", "vocab_size": 29, "hidden_size": 32, "num_hidden_layers": 2,
               "num_attention_heads": 2, "intermediate_size": 40, "max_position_embeddings": 32,
               "rotary_pct": 0.25, "rotary_emb_base": 10000, "use_parallel_residual": True,
               "hidden_act": "gelu", "layer_norm_eps": 1e-5, "tie_word_embeddings": False},
    "neox_sequential": {"model_type": "gpt_neox", "vocab_size": 29, "hidden_size": 24, "num_hidden_layers": 2,
                        "num_attention_heads": 3, "intermediate_size": 36, "max_position_embeddings": 32,
                        "rotary_pct": 0.5, "rotary_emb_base": 500, "use_parallel_residual": False,
                        "hidden_act": "gelu", "layer_norm_eps": 1e-5, "tie_word_embeddings": False},
    "smollm2": {"model_type": "llama", "vocab_size": 29, "hidden_size": 24, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 36,
                "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                "hidden_act": "silu", "tie_word_embeddings": True, "rope_scaling": None},
    "llama_untied": {"model_type": "llama", "vocab_size": 29, "hidden_size": 24, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 36,
                     "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "rope_theta": 500.0,
                     "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": True, "mlp_bias": True},
    "mistral": {"model_type": "mistral", "vocab_size": 29, "hidden_size": 24, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 36,
                "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                "hidden_act": "silu", "tie_word_embeddings": False, "sliding_window": 4},
    "qwen2": {"model_type": "qwen2", "vocab_size": 29, "hidden_size": 24, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 36,
              "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
              "hidden_act": "silu", "tie_word_embeddings": True, "use_sliding_window": False},
    "qwen3": {"model_type": "qwen3", "vocab_size": 29, "hidden_size": 24, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 36,
              "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
              "hidden_act": "silu", "tie_word_embeddings": True, "attention_bias": False},
    "tinystories": {"model_type": "gpt_neo", "vocab_size": 29, "hidden_size": 24, "num_layers": 2,
                    "num_heads": 3, "intermediate_size": None, "max_position_embeddings": 32,
                    "attention_types": [[["global", "local"], 1]], "window_size": 4,
                    "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5},
    "gemma2": {"model_type": "gemma2", "vocab_size": 29, "hidden_size": 24, "num_hidden_layers": 3,
               "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 40,
               "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
               "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 12,
               "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0, "sliding_window": 4,
               "tie_word_embeddings": True},
    # 7 layers: with sliding_window_pattern 3, layers 2 and 5 are global, the rest local
    "gemma3": {"model_type": "gemma3_text", "vocab_size": 29, "hidden_size": 24, "num_hidden_layers": 7,
               "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 40,
               "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
               "rope_local_base_freq": 10.0, "hidden_activation": "gelu_pytorch_tanh",
               "query_pre_attn_scalar": 12, "attn_logit_softcapping": None, "final_logit_softcapping": None,
               "sliding_window": 4, "sliding_window_pattern": 3, "rope_scaling": None, "tie_word_embeddings": True},
    # Gemma 3 as its newer config.json say it (layer_types) and with a final soft-cap
    "gemma3_types": {"model_type": "gemma3_text", "vocab_size": 29, "hidden_size": 24, "num_hidden_layers": 3,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 40,
                     "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "rope_theta": 1000.0,
                     "rope_local_base_freq": 100.0, "hidden_activation": "gelu_pytorch_tanh",
                     "query_pre_attn_scalar": 8, "final_logit_softcapping": 4.0, "sliding_window": 3,
                     "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
                     "tie_word_embeddings": False},
}


def gemma3_local(c, i):
    """Whether layer i of a gemma3_text config slides (Gemma3TextConfig's layer_types)."""
    if c.get("layer_types"):
        return c["layer_types"][i] == "sliding_attention"
    return (i + 1) % c.get("sliding_window_pattern", 6) != 0


def _gqa(c):
    H = c["num_attention_heads"]
    return H, c.get("num_key_value_heads", H), c.get("head_dim", c["hidden_size"] // H)


def random_state(config, seed=0, std=0.3, lazy=False):
    """A random state dict (HF names, float32 numpy) for `config`. With `lazy`, each value is a
    Drawn(shape, make) instead, made when written (write_hf_lazy: a model larger than memory)."""
    g = torch.Generator().manual_seed(seed)
    if lazy:
        r = lambda *s: Drawn(s, lambda: std * torch.randn(*s, generator=g))  # noqa: E731
        gain = lambda n: Drawn((n,), lambda: 1.0 + std * torch.randn(n, generator=g))  # noqa: E731
    else:
        r = lambda *s: (std * torch.randn(*s, generator=g)).numpy()  # noqa: E731
        gain = lambda n: (1.0 + std * torch.randn(n, generator=g)).numpy()  # noqa: E731
    t, c, sd = config["model_type"], config, {}
    d, V = c["hidden_size"], c["vocab_size"]
    tied = c.get("tie_word_embeddings", t in ("gpt_neo", "gemma2", "gemma3_text"))
    if t == "gpt_neox":
        H = c["num_attention_heads"]
        Fi = c["intermediate_size"]
        sd["gpt_neox.embed_in.weight"] = r(V, d)
        for i in range(c["num_hidden_layers"]):
            p = f"gpt_neox.layers.{i}."
            for n in ("input_layernorm", "post_attention_layernorm"):
                sd[p + n + ".weight"], sd[p + n + ".bias"] = gain(d), r(d)
            sd[p + "attention.query_key_value.weight"], sd[p + "attention.query_key_value.bias"] = r(3 * d, d), r(3 * d)
            sd[p + "attention.dense.weight"], sd[p + "attention.dense.bias"] = r(d, d), r(d)
            sd[p + "mlp.dense_h_to_4h.weight"], sd[p + "mlp.dense_h_to_4h.bias"] = r(Fi, d), r(Fi)
            sd[p + "mlp.dense_4h_to_h.weight"], sd[p + "mlp.dense_4h_to_h.bias"] = r(d, Fi), r(d)
        sd["gpt_neox.final_layer_norm.weight"], sd["gpt_neox.final_layer_norm.bias"] = gain(d), r(d)
        if not tied:
            sd["embed_out.weight"] = r(V, d)
        return sd
    if t == "gpt_neo":
        Fi = c.get("intermediate_size") or 4 * d
        sd["transformer.wte.weight"], sd["transformer.wpe.weight"] = r(V, d), r(c["max_position_embeddings"], d)
        for i in range(c["num_layers"]):
            p = f"transformer.h.{i}."
            for n in ("ln_1", "ln_2"):
                sd[p + n + ".weight"], sd[p + n + ".bias"] = gain(d), r(d)
            for n in ("q_proj", "k_proj", "v_proj"):
                sd[p + f"attn.attention.{n}.weight"] = r(d, d)
            sd[p + "attn.attention.out_proj.weight"], sd[p + "attn.attention.out_proj.bias"] = r(d, d), r(d)
            sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"] = r(Fi, d), r(Fi)
            sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"] = r(d, Fi), r(d)
        sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"] = gain(d), r(d)
        if not tied:
            sd["lm_head.weight"] = r(V, d)
        return sd
    H, Hkv, dh = _gqa(c)
    Fi = c["intermediate_size"]
    gemma = t in ("gemma2", "gemma3_text")
    norm = (lambda n: r(n)) if gemma else gain  # Gemma stores w of (1 + w)
    qkv_bias = t == "qwen2" or c.get("attention_bias", False)
    o_bias = t != "qwen2" and c.get("attention_bias", False)
    mlp_bias = c.get("mlp_bias", False)
    sd["model.embed_tokens.weight"] = r(V, d)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = norm(d)
        for n, rows in (("q_proj", H * dh), ("k_proj", Hkv * dh), ("v_proj", Hkv * dh)):
            sd[p + f"self_attn.{n}.weight"] = r(rows, d)
            if qkv_bias:
                sd[p + f"self_attn.{n}.bias"] = r(rows)
        sd[p + "self_attn.o_proj.weight"] = r(d, H * dh)
        if o_bias:
            sd[p + "self_attn.o_proj.bias"] = r(d)
        if t in ("qwen3", "gemma3_text"):
            sd[p + "self_attn.q_norm.weight"], sd[p + "self_attn.k_norm.weight"] = norm(dh), norm(dh)
        sd[p + "post_attention_layernorm.weight"] = norm(d)
        if gemma:
            sd[p + "pre_feedforward_layernorm.weight"], sd[p + "post_feedforward_layernorm.weight"] = norm(d), norm(d)
        for n, shape in (("gate_proj", (Fi, d)), ("up_proj", (Fi, d)), ("down_proj", (d, Fi))):
            sd[p + f"mlp.{n}.weight"] = r(*shape)
            if mlp_bias:
                sd[p + f"mlp.{n}.bias"] = r(shape[0])
    sd["model.norm.weight"] = norm(d)
    if not tied:
        sd["lm_head.weight"] = r(V, d)
    return sd


def rotate(x, dims, base, positions):
    """Rotary positions on the first `dims` features of x (B, H, T, d_head), rotate-half style."""
    inv = 1.0 / (base ** (torch.arange(0, dims, 2, dtype=torch.float64) / dims))  # (dims/2)
    ang = positions[:, None].double() * inv[None, :]  # (T, dims/2)
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)  # (T, dims)
    r, rest = x[..., :dims], x[..., dims:]
    half = dims // 2
    rot = torch.cat([-r[..., half:], r[..., :half]], -1)
    return torch.cat([r * cos + rot * sin, rest], -1)


def attend(q, k, v, scale, window=0, softcap=0.0):
    """q (B, H, T, dh), k/v (B, Hkv, T, dh) -> (B, T, H * dh); causal, optional window and cap."""
    B, H, T, dh = q.shape
    rep = H // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2)) * scale  # (B, H, T, T)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    hidden = (j > i) | ((i - j >= window) if window else torch.zeros(T, T, dtype=torch.bool))
    p = torch.softmax(s.masked_fill(hidden, float("-inf")), -1)
    return (p @ v).transpose(1, 2).reshape(B, T, H * dh)


def forward(config, state, ids):
    """float64 logits (B, T, vocab) of an HF state dict of `config` for ids (B, T) int64."""
    sd = {k: torch.as_tensor(np.asarray(v)).double() for k, v in state.items()}
    c, t = config, config["model_type"]
    ids = torch.as_tensor(ids)
    B, T = ids.shape
    d = c["hidden_size"]
    pos = torch.arange(T)
    lin = lambda x, p: x @ sd[p + ".weight"].T + (sd[p + ".bias"] if p + ".bias" in sd else 0)  # noqa: E731
    heads = lambda x, n: x.reshape(B, T, n, -1).transpose(1, 2)  # noqa: E731
    tied = c.get("tie_word_embeddings", t in ("gpt_neo", "gemma2", "gemma3_text"))
    if t == "gpt_neox":
        H = c["num_attention_heads"]
        dh = d // H
        eps = c.get("layer_norm_eps", 1e-5)
        ln = lambda x, p: F.layer_norm(x, (d,), sd[p + ".weight"], sd[p + ".bias"], eps)  # noqa: E731
        act = ACT[c.get("hidden_act", "gelu")]
        rot = int(dh * c.get("rotary_pct", 0.25))
        x = sd["gpt_neox.embed_in.weight"][ids]
        for i in range(c["num_hidden_layers"]):
            p = f"gpt_neox.layers.{i}."
            qkv = lin(ln(x, p + "input_layernorm"), p + "attention.query_key_value").reshape(B, T, H, 3 * dh)
            q, k, v = (qkv[..., j * dh:(j + 1) * dh].transpose(1, 2) for j in range(3))  # (B, H, T, dh)
            base = c.get("rotary_emb_base", 10000)
            q, k = rotate(q, rot, base, pos), rotate(k, rot, base, pos)
            a = lin(attend(q, k, v, 1 / math.sqrt(dh)), p + "attention.dense")
            mlp = lambda h: lin(act(lin(h, p + "mlp.dense_h_to_4h")), p + "mlp.dense_4h_to_h")  # noqa: E731
            if c.get("use_parallel_residual", True):
                x = x + a + mlp(ln(x, p + "post_attention_layernorm"))
            else:
                x = x + a
                x = x + mlp(ln(x, p + "post_attention_layernorm"))
        h = ln(x, "gpt_neox.final_layer_norm")
        return h @ (sd["gpt_neox.embed_in.weight"] if tied else sd["embed_out.weight"]).T
    if t == "gpt_neo":
        H = c["num_heads"]
        eps = c.get("layer_norm_epsilon", 1e-5)
        ln = lambda x, p: F.layer_norm(x, (d,), sd[p + ".weight"], sd[p + ".bias"], eps)  # noqa: E731
        act = ACT[c.get("activation_function", "gelu_new")]
        kinds = [k for types, n in c["attention_types"] for _ in range(n) for k in types]
        x = sd["transformer.wte.weight"][ids] + sd["transformer.wpe.weight"][:T]
        for i in range(c["num_layers"]):
            p = f"transformer.h.{i}."
            h = ln(x, p + "ln_1")
            q, k, v = (heads(lin(h, p + f"attn.attention.{n}_proj"), H) for n in "qkv")
            window = c["window_size"] if kinds[i] == "local" else 0
            x = x + lin(attend(q, k, v, 1.0, window), p + "attn.attention.out_proj")
            x = x + lin(act(lin(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
        h = ln(x, "transformer.ln_f")
        return h @ (sd["transformer.wte.weight"] if tied else sd["lm_head.weight"]).T
    H, Hkv, dh = _gqa(c)
    gemma = t in ("gemma2", "gemma3_text")
    eps = c.get("rms_norm_eps", 1e-6)

    def rms(x, w):
        n = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
        return n * (1.0 + w) if gemma else n * w

    act = ACT[c.get("hidden_activation", "gelu_pytorch_tanh")] if gemma else ACT[c.get("hidden_act", "silu")]
    base = c.get("rope_theta", 1000000.0 if t == "gemma3_text" else 10000.0)
    scale = c.get("query_pre_attn_scalar", 0) ** -0.5 if gemma else 1 / math.sqrt(dh)
    x = sd["model.embed_tokens.weight"][ids]
    if gemma:
        x = x * math.sqrt(d)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, sd[p + "input_layernorm.weight"])
        q, k, v = heads(lin(h, p + "self_attn.q_proj"), H), heads(lin(h, p + "self_attn.k_proj"), Hkv), heads(lin(h, p + "self_attn.v_proj"), Hkv)
        if t in ("qwen3", "gemma3_text"):
            q, k = rms(q, sd[p + "self_attn.q_norm.weight"]), rms(k, sd[p + "self_attn.k_norm.weight"])
        window, layer_base = 0, base
        if t == "mistral":
            window = c.get("sliding_window") or 0
        elif t == "gemma2" and (c["layer_types"][i] == "sliding_attention" if c.get("layer_types") else i % 2 == 0):
            window = c.get("sliding_window") or 0
        elif t == "gemma3_text" and gemma3_local(c, i):
            window, layer_base = c.get("sliding_window") or 0, c.get("rope_local_base_freq", 10000.0)
        q, k = rotate(q, dh, layer_base, pos), rotate(k, dh, layer_base, pos)
        softcap = (c.get("attn_logit_softcapping") or 0.0) if gemma else 0.0
        a = lin(attend(q, k, v, scale, window, softcap), p + "self_attn.o_proj")
        if gemma:
            a = rms(a, sd[p + "post_attention_layernorm.weight"])
        x = x + a
        h = rms(x, sd[p + ("pre_feedforward_layernorm" if gemma else "post_attention_layernorm") + ".weight"])
        m = lin(act(lin(h, p + "mlp.gate_proj")) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
        if gemma:
            m = rms(m, sd[p + "post_feedforward_layernorm.weight"])
        x = x + m
    logits = rms(x, sd["model.norm.weight"]) @ (sd["model.embed_tokens.weight"] if tied else sd["lm_head.weight"]).T
    cap = c.get("final_logit_softcapping") if gemma else None
    if cap:
        logits = cap * torch.tanh(logits / cap)
    return logits


def narrow(state, dtype):
    """The state rounded to bfloat16 or float16 (as torch tensors of that dtype)."""
    return {k: torch.as_tensor(np.asarray(v)).to(dtype) for k, v in state.items()}


def widen(state):
    """A state of torch tensors (any float dtype) as float32 numpy."""
    return {k: v.float().numpy() for k, v in state.items()}


ST_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def _safetensors_bytes(tensors):
    """tensors: name -> torch tensor (float32, bfloat16 or float16)."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype in (torch.bfloat16, torch.float16) else t.numpy().tobytes()
        header[name] = {"dtype": ST_DTYPE[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return len(h).to_bytes(8, "little") + h + b"".join(blobs)


class Drawn:
    """A tensor of `shape` that make() draws (float32 torch), for random_state(lazy=True)."""

    def __init__(self, shape, make):
        self.shape, self.make = tuple(shape), make


def write_hf_lazy(directory, config, state, dtype, shards):
    """write_hf for random_state(lazy=True): each tensor drawn, converted and written in turn, so
    the memory held is one tensor's (Gemma-2-2B's 10.5 GB in float32 on a machine of 24 GB)."""
    os.makedirs(directory, exist_ok=True)
    size = torch.tensor([], dtype=dtype).element_size()
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(dict(config, torch_dtype=str(dtype).split(".")[-1]), f, indent=2)
    names, weight_map = list(state), {}
    for s in range(shards):
        fname = "model.safetensors" if shards == 1 else f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s::shards]
        header, off = {}, 0
        for n in part:
            nbytes = size * int(np.prod(state[n].shape))
            header[n] = {"dtype": ST_DTYPE[dtype], "shape": list(state[n].shape), "data_offsets": [off, off + nbytes]}
            off += nbytes
            weight_map[n] = fname
        header["__metadata__"] = {"format": "pt"}
        h = json.dumps(header).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(os.path.join(directory, fname), "wb") as f:
            f.write(len(h).to_bytes(8, "little") + h)
            for n in part:
                t = state[n].make().to(dtype).contiguous()
                f.write((t.view(torch.int16) if dtype != torch.float32 else t).numpy().data)
                del t
    if shards > 1:
        with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)


def write_hf(directory, config, state, dtype=torch.float32, shards=1):
    """Writes config.json and model.safetensors (or `shards` files and
    model.safetensors.index.json) as save_pretrained does, the tensors in `dtype`."""
    os.makedirs(directory, exist_ok=True)
    tensors = {k: torch.as_tensor(np.asarray(v)).to(dtype) if not torch.is_tensor(v) else v.to(dtype) for k, v in state.items()}
    cfg = dict(config, torch_dtype={torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype])
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    names = list(tensors)
    if shards == 1:
        with open(os.path.join(directory, "model.safetensors"), "wb") as f:
            f.write(_safetensors_bytes(tensors))
        return
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        weight_map.update({n: fname for n in part})
        with open(os.path.join(directory, fname), "wb") as f:
            f.write(_safetensors_bytes(part))
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)


def read_hf(directory):
    """The state dict (float32 numpy, HF names) and config of an HF directory headlab wrote."""
    config = json.load(open(os.path.join(directory, "config.json")))
    index = os.path.join(directory, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    state = {}
    for name in files:
        data = open(os.path.join(directory, name), "rb").read()
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + n])
        for k, e in header.items():
            if k == "__metadata__":
                continue
            assert e["dtype"] == "F32", (k, e["dtype"])
            b, end = e["data_offsets"]
            state[k] = np.frombuffer(data[8 + n + b:8 + n + end], dtype="<f4").reshape(e["shape"]).copy()
    return config, state


def main():
    """hf_modern.py NAME DIR [bf16|f16] [SHARDS]: writes the tiny model NAME (one of CONFIGS) and
    prints its float64 logits on a fixed batch as JSON."""
    name, directory = sys.argv[1], sys.argv[2]
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}.get(sys.argv[3] if len(sys.argv) > 3 else "", torch.float32)
    shards = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    config, state = CONFIGS[name], random_state(CONFIGS[name])
    write_hf(directory, config, state, dtype, shards)
    ids = np.random.default_rng(0).integers(0, config["vocab_size"], size=(2, 11))
    print(json.dumps(forward(config, widen(narrow(state, dtype)), ids).tolist()))


if __name__ == "__main__":
    main()
