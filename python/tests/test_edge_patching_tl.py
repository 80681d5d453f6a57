"""The PyTorch edge-patching reference (scripts/reference/edge_patching_tl.py) checked against
identities of its own, on a small random model (no headlab binary needed): path patching of a
sender to all its readers is activation patching of it, attribution is the derivative of exact
patching along delta (central finite difference), both vanish where the metric is truly flat
(a delta along the all-ones direction, which every LayerNorm removes)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian's python3-torch)")

SCRIPTS = os.path.join(os.environ.get("HEADLAB_SOURCE_DIR", "."), "scripts")
sys.path.insert(0, SCRIPTS)
sys.path.insert(0, os.path.join(SCRIPTS, "reference"))
import edge_patching_tl as ep  # noqa: E402
from gpt import GPT, load_headlab  # noqa: E402
from safetensors_np import write_safetensors  # noqa: E402

V, D, L, H, FF, T, B = 7, 16, 2, 2, 32, 6, 3


def small_model(dtype=torch.float64, d_ff=FF, seed=0):
    torch.manual_seed(seed)
    model = GPT(V, D, L, H, d_ff, max_len=T)
    with torch.no_grad():  # away from the init: sizeable effects, layer norms that are not the identity
        for p in model.parameters():
            p.add_(0.4 * torch.randn(p.shape))
    return model.to(dtype).eval()


def small_inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, V, (B, T), generator=g)
    corrupted = clean.clone()
    corrupted[:, 2:] = torch.randint(0, V, (B, T - 2), generator=g)
    rows, pos = torch.meshgrid(torch.arange(B), torch.arange(2, T), indexing="ij")
    rows, pos = rows.reshape(-1), pos.reshape(-1)
    good = clean[rows, pos]
    bad = (good + 1 + torch.randint(0, V - 1, good.shape, generator=g)) % V  # != good
    return clean, corrupted, torch.stack([rows, pos, good, bad], 1)


def test_the_hooked_forward_is_the_plain_forward():
    """Per-head q/k/v inputs, per-head results and the MLP-input copy change no number."""
    model = small_model()
    clean, _, _ = small_inputs()
    plain = model(clean)
    model.set_hook_options(use_split_qkv_input=True, use_attn_result=True, use_hook_mlp_in=True)
    hooked = model(clean)
    assert torch.allclose(hooked, plain, rtol=0, atol=1e-12 * plain.abs().max().item())


def test_edges_in_forward_order():
    model = small_model()
    edges = ep.edge_list(model)
    # layer 0: 2 heads x q,k,v from embed; mlp0 from embed + 2 heads; layer 1: 6 x 3; mlp1 5; logits 5
    assert len(edges) == 6 * 1 + 3 + 6 * 3 + 5 + 5
    assert edges[:4] == [("embed", "L0H0.q"), ("embed", "L0H0.k"), ("embed", "L0H0.v"), ("embed", "L0H1.q")]
    assert edges[6:9] == [("embed", "mlp0"), ("L0H0", "mlp0"), ("L0H1", "mlp0")]
    assert edges[9:12] == [("embed", "L1H0.q"), ("L0H0", "L1H0.q"), ("L0H1", "L1H0.q")]
    assert edges[-1] == ("L1H1", "logits") and edges[-5] == ("embed", "logits")
    attention_only = ep.edge_list(small_model(d_ff=0))
    assert not any(r.startswith("mlp") for _, r in attention_only) and len(attention_only) == 6 + 6 * 3 + 5


@pytest.mark.parametrize("d_ff", [FF, 0])
def test_path_patching_to_all_readers_is_activation_patching(d_ff):
    """Adding delta_s to every reader of s at once (downstream recomputed) is replacing s's output by
    the corrupted run's: the residual stream is a sum. float64, to rounding."""
    model = small_model(d_ff=d_ff)
    clean, corrupted, answers = small_inputs()
    result = ep.edge_patching(model, clean, corrupted, answers)
    with torch.inference_mode():
        _, clean_out = ep.sender_outputs(model, clean)
        _, corrupted_out = ep.sender_outputs(model, corrupted)
        _, cache = model.run_with_cache(corrupted, ["hook_embed"] + [f"blocks.{l}.attn.hook_result" for l in range(L)])
        for s in clean_out:
            readers = [r for s2, r in ep.edge_list(model) if s2 == s]
            path = ep.patched_metric(model, clean, answers, [(r, corrupted_out[s] - clean_out[s]) for r in readers])
            if s == "embed":
                hook = ("hook_embed", lambda x, hook: cache["hook_embed"])
            else:
                layer, h = (int(v) for v in s[1:].split("H"))

                def replace(x, hook, layer=layer, h=h):
                    x = x.clone()
                    x[:, :, h] = cache[f"blocks.{layer}.attn.hook_result"][:, :, h]
                    return x
                hook = (f"blocks.{layer}.attn.hook_result", replace)
            activation = ep.logit_difference(model.run_with_hooks(clean, [hook]), answers).item()
            assert abs(activation - result["clean_metric"]) > 1e-3, s  # the sender matters: not 0 == 0
            assert abs(path - activation) <= 1e-12 * abs(activation) + 1e-13, (s, path, activation)


def test_attribution_is_the_derivative_of_exact_patching():
    """attribution(s -> r) = d/de metric(r reads input + e delta_s) at e = 0, by a central difference
    (error e^2 |m'''| / 6 ~ 1e-10 plus rounding 1e-16 / e ~ 1e-11, float64)."""
    model = small_model()
    clean, corrupted, answers = small_inputs()
    result = ep.edge_patching(model, clean, corrupted, answers)
    with torch.inference_mode():
        _, clean_out = ep.sender_outputs(model, clean)
        _, corrupted_out = ep.sender_outputs(model, corrupted)
    eps = 1e-5
    scale = max(abs(e["attribution"]) for e in result["edges"])
    nonlinear = 0.0
    for e in result["edges"]:
        d = corrupted_out[e["sender"]] - clean_out[e["sender"]]
        plus = ep.patched_metric(model, clean, answers, [(e["receiver"], eps * d)])
        minus = ep.patched_metric(model, clean, answers, [(e["receiver"], -eps * d)])
        assert abs((plus - minus) / (2 * eps) - e["attribution"]) <= 1e-7 * scale, e
        assert e["linearisation_error"] == e["attribution"] - e["exact"]
        nonlinear = max(nonlinear, abs(e["linearisation_error"]))
    assert nonlinear > 1e-3 * scale  # the full-size deltas are not in the linear regime: exact is computed, not the gradient


def test_attribution_and_exact_vanish_along_the_all_ones_direction():
    """Token embeddings that differ only by a constant across d_model: delta_embed = c * ones, which
    every receiver's LayerNorm removes (x + c1 has the same centred values), so the metric is exactly
    flat along it: exact 0 and attribution 0, though the gradients are not 0."""
    model = small_model()
    with torch.no_grad():
        model.tok_emb.weight.copy_(model.tok_emb.weight[0] + torch.arange(V, dtype=torch.float64)[:, None])
    clean, corrupted, answers = small_inputs()
    result = ep.edge_patching(model, clean, corrupted, answers)
    grads = ep.attribution_gradients(model, clean, answers)
    embed = [e for e in result["edges"] if e["sender"] == "embed"]
    for e in embed:
        assert abs(e["exact"]) < 1e-12 and abs(e["attribution"]) < 1e-12, e
        assert grads[e["receiver"]].abs().max() > 1e-3, e["receiver"]
    with torch.inference_mode():  # delta_embed is not 0: the zeros are the flat direction's, not a missing change
        delta = ep.sender_outputs(model, corrupted)[1]["embed"] - ep.sender_outputs(model, clean)[1]["embed"]
    assert delta.abs().max() >= 1 and torch.allclose(delta, delta[..., :1].expand_as(delta))


def write_headlab_checkpoint(model, path):
    cfg = dict(vocab_size=V, d_model=D, n_layers=L, n_heads=H, n_kv_heads=H, d_head=D // H, d_ff=FF,
               max_seq_len=T, norm="pre", activation="gelu_erf", positions="learned", attn_bias=True,
               mlp_bias=True, head_bias=True, layer_norm_eps=1e-5)
    name = lambda n: n.replace(".W1.", ".ffn.fc1.").replace(".W2.", ".ffn.fc2.")  # noqa: E731
    write_safetensors(path, {name(n): p.detach().float().numpy() for n, p in model.state_dict().items()},
                      {"format": "headlab-checkpoint", "format_version": "1", "config": json.dumps(cfg)})


def test_the_loader_reads_the_settings_of_the_checkpoint(tmp_path):
    """headlab's defaults (tanh GELU, no attention or unembedding bias), sinusoidal positions and
    head gates, through the checkpoint's config: the loaded model computes what the written one does."""
    torch.manual_seed(3)
    model = GPT(V, D, L, H, FF, max_len=T, activation="gelu_tanh", positions="sinusoidal", attn_bias=False,
                head_bias=False, layer_norm_eps=1e-3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape))
    gates = [[1.0, 0.5], [0.0, 2.0]]
    cfg = dict(vocab_size=V, d_model=D, n_layers=L, n_heads=H, n_kv_heads=H, d_head=D // H, d_ff=FF, max_seq_len=T,
               norm="pre", activation="gelu_tanh", positions="sinusoidal", attn_bias=False, mlp_bias=True,
               head_bias=False, layer_norm_eps=1e-3, head_gates=gates)
    name = lambda n: n.replace(".W1.", ".ffn.fc1.").replace(".W2.", ".ffn.fc2.")  # noqa: E731
    path = str(tmp_path / "ck.safetensors")
    write_safetensors(path, {name(n): p.detach().numpy() for n, p in model.state_dict().items()},
                      {"format": "headlab-checkpoint", "format_version": "1", "config": json.dumps(cfg)})
    loaded = load_headlab(path)
    assert "blocks.0.attn.W_Q.bias" not in loaded.state_dict() and loaded.blocks[0].ln1.eps == 1e-3
    pe = loaded.sinusoid  # PE[p, 2i] = sin(p / 10000^(2i / d)), PE[p, 2i + 1] = cos(...)
    assert abs(pe[3, 4].item() - np.sin(3 / 10000 ** (4 / D))) < 1e-7 and abs(pe[3, 5].item() - np.cos(3 / 10000 ** (4 / D))) < 1e-7
    clean, _, _ = small_inputs()
    model.eval()
    assert torch.equal(loaded(clean), model(clean, gates=torch.tensor(gates)))
    assert not torch.equal(loaded(clean), model(clean))  # the gates were read
    cfg["norm"] = "post"
    write_safetensors(path, {name(n): p.detach().numpy() for n, p in model.state_dict().items()},
                      {"format": "headlab-checkpoint", "format_version": "1", "config": json.dumps(cfg)})
    with pytest.raises(ValueError, match="pre-norm only"):
        load_headlab(path)


def test_the_command_on_a_checkpoint_and_inputs(tmp_path):
    threads = torch.get_num_threads()
    model = small_model(torch.float32)
    clean, corrupted, answers = small_inputs()
    write_headlab_checkpoint(model, str(tmp_path / "ck.safetensors"))
    to32 = lambda t: t.numpy().astype(np.int32)  # noqa: E731
    write_safetensors(str(tmp_path / "inputs.safetensors"), {"clean": to32(clean), "corrupted": to32(corrupted),
                                                             "answers": to32(answers)})
    loaded = load_headlab(str(tmp_path / "ck.safetensors"))
    assert torch.equal(loaded(clean), model(clean))
    script = os.path.join(SCRIPTS, "reference", "edge_patching_tl.py")
    base = [sys.executable, script, "--checkpoint", str(tmp_path / "ck.safetensors"), "--threads", "1"]
    r = subprocess.run(base + ["--inputs", str(tmp_path / "inputs.safetensors"), "--out", str(tmp_path / "e.json"),
                               "--repeat", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads((tmp_path / "e.json").read_text())
    assert set(got) == {"metric", "clean_metric", "corrupted_metric", "n_layers", "n_heads", "has_mlp", "edges", "seconds"}
    assert (got["n_layers"], got["n_heads"], got["has_mlp"], got["metric"]) == (L, H, True, "logit_difference")
    assert got["seconds"] > 0 and "median of 2" in r.stdout
    want = ep.edge_patching(loaded, clean, corrupted, answers)
    assert [(e["sender"], e["receiver"]) for e in got["edges"]] == ep.edge_list(loaded)
    for g, w in zip(got["edges"], want["edges"]):
        assert g["exact"] == pytest.approx(w["exact"], rel=1e-4, abs=1e-5)
    ep.main(base[2:] + ["--inputs", str(tmp_path / "inputs.safetensors"), "--out", str(tmp_path / "e64.json"), "--float64"])
    got64 = json.loads((tmp_path / "e64.json").read_text())
    scale = max(abs(e["exact"]) for e in got64["edges"])
    assert max(abs(a["exact"] - b["exact"]) for a, b in zip(got["edges"], got64["edges"])) < 1e-4 * scale

    # a bad input: one clear message, a non-zero exit, no output file
    bad = answers.clone()
    bad[1, 2] = V
    write_safetensors(str(tmp_path / "bad.safetensors"), {"clean": to32(clean), "corrupted": to32(corrupted),
                                                          "answers": to32(bad)})
    with pytest.raises(SystemExit) as exit:
        ep.main(base[2:] + ["--inputs", str(tmp_path / "bad.safetensors"), "--out", str(tmp_path / "bad.json")])
    message = str(exit.value.code)
    assert f"token {V} outside the vocabulary" in message and "answers" in message, message
    assert not (tmp_path / "bad.json").exists()
    torch.set_num_threads(threads)  # main() set 1
