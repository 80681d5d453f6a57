"""GPT-2 as Hugging Face and nanoGPT store it, written from GPT-2's definition (transformers is
not needed): tiny random models in both layouts, and a float64 forward that is the reference
headlab's logits are checked against (python/tests/test_interop.py).

GPT-2 (GPT2LMHeadModel): x = wte[ids] + wpe[0..T-1]; per block x += attn(ln_1(x)),
x += mlp(ln_2(x)); logits = ln_f(x) @ wte^T (the lm_head is tied to wte). Conv1D layers keep
their weight as (in, out): y = x @ W + b. c_attn (d, 3d) produces [q | k | v]; head h owns
columns h*d_head..(h+1)*d_head-1 of each. gelu_new is the tanh approximation.
"""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from safetensors_np import write_safetensors  # noqa: E402

ACTIVATIONS = {
    "gelu_new": lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3))),
    "gelu": lambda x: 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0))),
    "relu": torch.relu,
}


def gpt2_forward(state, config, ids):
    """float64 logits (B, T, vocab) of a GPT-2 state dict in HF layout (keys without the
    'transformer.' prefix; Conv1D weights (in, out)). ids: (B, T) int64."""
    sd = {k: torch.as_tensor(np.asarray(v)).double() for k, v in state.items()}
    d, H = config["n_embd"], config["n_head"]
    eps = config.get("layer_norm_epsilon", 1e-5)
    act = ACTIVATIONS[config.get("activation_function", "gelu_new")]
    ln = lambda x, p: torch.nn.functional.layer_norm(x, (d,), sd[p + ".weight"], sd[p + ".bias"], eps)  # noqa: E731
    B, T = ids.shape
    x = sd["wte.weight"][ids] + sd["wpe.weight"][:T]  # (B, T, d)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for i in range(config["n_layer"]):
        h = f"h.{i}."
        a = ln(x, h + "ln_1") @ sd[h + "attn.c_attn.weight"] + sd[h + "attn.c_attn.bias"]  # (B, T, 3d)
        q, k, v = (t.reshape(B, T, H, d // H).transpose(1, 2) for t in a.split(d, dim=-1))  # (B, H, T, d_head)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // H)  # (B, H, T, T)
        pattern = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        z = (pattern @ v).transpose(1, 2).reshape(B, T, d)
        x = x + z @ sd[h + "attn.c_proj.weight"] + sd[h + "attn.c_proj.bias"]
        m = act(ln(x, h + "ln_2") @ sd[h + "mlp.c_fc.weight"] + sd[h + "mlp.c_fc.bias"])  # (B, T, d_ff)
        x = x + m @ sd[h + "mlp.c_proj.weight"] + sd[h + "mlp.c_proj.bias"]
    unembed = sd["wte.weight"] if config.get("tie_word_embeddings", True) else sd["lm_head.weight"]
    return ln(x, "ln_f") @ unembed.T


def random_gpt2(config, seed=0, std=0.3):
    """A random GPT-2 state dict (HF names without the prefix, float32 numpy) for `config`:
    normal weights of standard deviation `std` (0.3 makes tiny models' logits spread out; GPT-2's
    own initialisation is 0.02), LayerNorm gains 1 + that."""
    g = torch.Generator().manual_seed(seed)
    d, V, P, L = config["n_embd"], config["vocab_size"], config["n_positions"], config["n_layer"]
    F = config.get("n_inner") or 4 * d
    r = lambda *s: (std * torch.randn(*s, generator=g)).numpy()  # noqa: E731
    sd = {"wte.weight": r(V, d), "wpe.weight": r(P, d)}
    for i in range(L):
        h = f"h.{i}."
        sd.update({h + "ln_1.weight": 1 + r(d), h + "ln_1.bias": r(d),
                   h + "attn.c_attn.weight": r(d, 3 * d), h + "attn.c_attn.bias": r(3 * d),
                   h + "attn.c_proj.weight": r(d, d), h + "attn.c_proj.bias": r(d),
                   h + "ln_2.weight": 1 + r(d), h + "ln_2.bias": r(d),
                   h + "mlp.c_fc.weight": r(d, F), h + "mlp.c_fc.bias": r(F),
                   h + "mlp.c_proj.weight": r(F, d), h + "mlp.c_proj.bias": r(d)})
    sd.update({"ln_f.weight": 1 + r(d), "ln_f.bias": r(d)})
    if not config.get("tie_word_embeddings", True):
        sd["lm_head.weight"] = r(V, d)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}


def write_hf_gpt2(directory, config, state, prefix=True, buffers=True, shards=1):
    """Writes config.json and model.safetensors (or `shards` files with
    model.safetensors.index.json) as GPT2LMHeadModel would: keys with the 'transformer.' prefix
    (or, prefix=False, as the hub's gpt2 files have them), and with the causal-mask buffers
    attn.bias (1, 1, P, P) and attn.masked_bias () that older transformers versions saved."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(dict(config, model_type="gpt2", architectures=["GPT2LMHeadModel"]), f, indent=2)
    P = config["n_positions"]
    tensors = {}
    for k, v in state.items():
        tensors[("transformer." + k) if prefix and k != "lm_head.weight" else k] = v
    if buffers:
        for i in range(config["n_layer"]):
            p = ("transformer." if prefix else "") + f"h.{i}.attn."
            tensors[p + "bias"] = np.tril(np.ones((P, P), dtype=np.uint8)).reshape(1, 1, P, P)
            tensors[p + "masked_bias"] = np.array(-1e4, dtype=np.float32)
    names = list(tensors)
    if shards == 1:
        write_safetensors(os.path.join(directory, "model.safetensors"), tensors, {"format": "pt"})
        return
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        write_safetensors(os.path.join(directory, fname), part, {"format": "pt"})
        weight_map.update({n: fname for n in part})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}, f)


def read_hf_state(directory):
    """The state dict of an HF GPT-2 directory (one file or shards), keys without the prefix."""
    from safetensors_np import read_safetensors
    index = os.path.join(directory, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    out = {}
    for fname in files:
        for k, v in read_safetensors(os.path.join(directory, fname)).items():
            out[k[len("transformer."):] if k.startswith("transformer.") else k] = v
    return out


# nanoGPT (karpathy/nanoGPT model.py): the same blocks with nn.Linear (weight (out, in)),
# exact GELU (nn.GELU()), LayerNorm eps 1e-5 with an optional bias, lm_head tied to wte.

def random_nanogpt(model_args, seed=0):
    """A random nanoGPT state dict (torch tensors, nanoGPT's names) for model_args."""
    g = torch.Generator().manual_seed(seed)
    d, V, P, L = model_args["n_embd"], model_args["vocab_size"], model_args["block_size"], model_args["n_layer"]
    bias = model_args["bias"]
    r = lambda *s: 0.3 * torch.randn(*s, generator=g)  # noqa: E731
    sd = {"transformer.wte.weight": r(V, d), "transformer.wpe.weight": r(P, d)}
    for i in range(L):
        h = f"transformer.h.{i}."
        sd.update({h + "ln_1.weight": 1 + r(d), h + "attn.c_attn.weight": r(3 * d, d), h + "attn.c_proj.weight": r(d, d),
                   h + "ln_2.weight": 1 + r(d), h + "mlp.c_fc.weight": r(4 * d, d), h + "mlp.c_proj.weight": r(d, 4 * d)})
        if bias:
            sd.update({h + "ln_1.bias": r(d), h + "attn.c_attn.bias": r(3 * d), h + "attn.c_proj.bias": r(d),
                       h + "ln_2.bias": r(d), h + "mlp.c_fc.bias": r(4 * d), h + "mlp.c_proj.bias": r(d)})
    sd["transformer.ln_f.weight"] = 1 + r(d)
    if bias:
        sd["transformer.ln_f.bias"] = r(d)
    sd["lm_head.weight"] = sd["transformer.wte.weight"]  # tied, as nanoGPT's GPT does
    return sd


def nanogpt_as_gpt2(sd, model_args):
    """nanoGPT's state dict as GPT-2 (HF) tensors: Linear weights transposed to (in, out), missing
    biases as zeros. For the float64 reference forward."""
    out = {}
    for k, v in sd.items():
        k = k[len("_orig_mod."):] if k.startswith("_orig_mod.") else k
        if k == "lm_head.weight" or k.endswith(".attn.bias"):
            continue
        k = k[len("transformer."):]
        v = v.detach().numpy()
        out[k] = v.T.copy() if (k.endswith(".weight") and v.ndim == 2 and k not in ("wte.weight", "wpe.weight")) else v
    d = model_args["n_embd"]
    if not model_args["bias"]:
        for i in range(model_args["n_layer"]):
            h = f"h.{i}."
            for name, n in (("ln_1", d), ("ln_2", d), ("attn.c_attn", 3 * d), ("attn.c_proj", d), ("mlp.c_fc", 4 * d),
                            ("mlp.c_proj", d)):
                out[h + name + ".bias"] = np.zeros(n, dtype=np.float32)
        out["ln_f.bias"] = np.zeros(d, dtype=np.float32)
    return out


def nanogpt_config(model_args):
    """The GPT-2 config of nanoGPT's model_args (for gpt2_forward)."""
    return {"n_embd": model_args["n_embd"], "n_head": model_args["n_head"], "n_layer": model_args["n_layer"],
            "vocab_size": model_args["vocab_size"], "n_positions": model_args["block_size"],
            "activation_function": "gelu", "layer_norm_epsilon": 1e-5}


def write_nanogpt_ckpt(path, model_args, sd, compiled=False):
    """ckpt.pt as nanoGPT's train.py saves it (torch.compile leaves an '_orig_mod.' prefix)."""
    model = {("_orig_mod." + k) if compiled else k: v for k, v in sd.items()}
    torch.save({"model": model, "optimizer": {}, "model_args": dict(model_args), "iter_num": 0,
                "best_val_loss": torch.tensor(1.5), "config": {"dataset": "shakespeare_char"}}, path)


# GPT-2 small: what the hub's `gpt2` has (124 M parameters)
GPT2_SMALL = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
              "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}


def main():
    """python3 scripts/reference/hf_gpt2.py --out DIR [--layers 12 --heads 12 --d-model 768 ...]:
    a random GPT-2 (GPT-2 small's shape by default) as a Hugging Face directory, config.json +
    model.safetensors, with a tokenizer's files copied beside it (--tokenizer DIR: vocab.json +
    merges.txt or encoder.json + vocab.bpe), so it stands where a downloaded `gpt2` would."""
    import argparse
    import shutil
    p = argparse.ArgumentParser(description=main.__doc__.split(":", 1)[1].strip())
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=GPT2_SMALL["n_layer"])
    p.add_argument("--heads", type=int, default=GPT2_SMALL["n_head"])
    p.add_argument("--d-model", type=int, default=GPT2_SMALL["n_embd"])
    p.add_argument("--vocab", type=int, default=GPT2_SMALL["vocab_size"])
    p.add_argument("--positions", type=int, default=GPT2_SMALL["n_positions"])
    p.add_argument("--std", type=float, default=0.02, help="weights' standard deviation (GPT-2's initialisation)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", help="directory whose tokenizer files are copied beside the model")
    a = p.parse_args()
    config = dict(GPT2_SMALL, n_layer=a.layers, n_head=a.heads, n_embd=a.d_model, vocab_size=a.vocab, n_positions=a.positions)
    copied = []
    if a.tokenizer:
        copied = [f for f in ("vocab.json", "merges.txt", "encoder.json", "vocab.bpe")
                  if os.path.isfile(os.path.join(a.tokenizer, f))]
        if not copied:
            sys.exit(f"{a.tokenizer}: no tokenizer files (vocab.json + merges.txt or encoder.json + vocab.bpe)")
    write_hf_gpt2(a.out, config, random_gpt2(config, seed=a.seed, std=a.std), buffers=False)
    for f in copied:
        shutil.copyfile(os.path.join(a.tokenizer, f), os.path.join(a.out, f))
    print(f"wrote {a.out}: config.json, model.safetensors{''.join(', ' + f for f in copied)}")


if __name__ == "__main__":
    main()
