#!/usr/bin/python3
"""SAE directories in SAELens's (v6) layout, written from its documented format and forward, with
the expected outputs, for headlab's reader (tests/test_sae.cpp: saelens_reference_files_load_...).

Layout: DIR/cfg.json ({"architecture", "d_in", "d_sae", "dtype", "apply_b_dec_to_input",
"normalize_activations", "hook_name", "k" for topk}) and DIR/sae_weights.safetensors (float32
W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in], b_dec [d_in], threshold [d_sae] for
jumprelu). Forward (float64 here):
  hidden_pre = (x - b_dec if apply_b_dec_to_input else x) @ W_enc + b_enc
  standard   f = relu(hidden_pre)
  topk       f = zeros scattered with relu(topk(hidden_pre, k).values) at their indices
  jumprelu   f = relu(hidden_pre) * (hidden_pre > threshold)
  sae_out    = f @ W_dec + b_dec
DIR/expected.safetensors holds x (float32, the input) and feature_acts, sae_out (the float64
results rounded to float32).

Usage: saelens_layout.py OUT_DIR   (writes OUT_DIR/{standard,topk,jumprelu}/)
"""
import json
import os
import struct
import sys

import torch


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def forward(arch, w, x, k, apply_b_dec):
    W_enc, b_enc, W_dec, b_dec = (w[n].double() for n in ("W_enc", "b_enc", "W_dec", "b_dec"))
    x = x.double()
    hidden_pre = (x - b_dec if apply_b_dec else x) @ W_enc + b_enc
    if arch == "standard":
        f = torch.relu(hidden_pre)
    elif arch == "topk":
        top = torch.topk(hidden_pre, k, dim=-1)
        f = torch.zeros_like(hidden_pre).scatter(-1, top.indices, top.values.relu())
    else:
        f = torch.relu(hidden_pre) * (hidden_pre > w["threshold"].double())
    return f, f @ W_dec + b_dec


def main():
    out = sys.argv[1]
    d_in, d_sae, k, n = 8, 24, 5, 7
    for seed, arch in enumerate(("standard", "topk", "jumprelu")):
        g = torch.Generator().manual_seed(seed)
        w = {"W_enc": torch.randn(d_in, d_sae, generator=g) * 0.5,
             "b_enc": torch.randn(d_sae, generator=g) * 0.1,
             "W_dec": torch.randn(d_sae, d_in, generator=g) * 0.5,
             "b_dec": torch.randn(d_in, generator=g) * 0.1}
        if arch == "jumprelu":
            w["threshold"] = torch.rand(d_sae, generator=g) * 0.5
        apply_b_dec = arch != "topk"  # both settings of the flag are read
        cfg = {"architecture": arch, "d_in": d_in, "d_sae": d_sae, "dtype": "float32", "device": "cpu",
               "apply_b_dec_to_input": apply_b_dec, "normalize_activations": "none",
               "hook_name": "blocks.1.attn.hook_z", "metadata": {"model_name": "reference"}}
        if arch == "topk":
            cfg["k"] = k
        x = torch.randn(n, d_in, generator=g)
        f, sae_out = forward(arch, w, x, k, apply_b_dec)
        d = os.path.join(out, arch)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "cfg.json"), "w") as fh:
            json.dump(cfg, fh, indent=2)
        write_safetensors(os.path.join(d, "sae_weights.safetensors"), w)
        write_safetensors(os.path.join(d, "expected.safetensors"), {"x": x, "feature_acts": f, "sae_out": sae_out})


if __name__ == "__main__":
    main()
