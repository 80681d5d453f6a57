"""`headlab edges` against the PyTorch reference written as a TransformerLens user writes it
(scripts/reference/edge_patching_tl.py): on a briefly trained model and the inputs headlab
wrote (DIR/inputs.safetensors), every edge's exact and attribution agree within float32
round-off bounds computed from the arithmetic.

The bounds (first order, as tests/roundoff.h: a sum of K terms in float32 is within
gamma(K) ~ K u of the exact sum, u = 2^-24, times the terms' magnitudes, and an error in an
activation a moves the metric m by |dm/da| times it):
  metric      B(m) = u * sum over every matrix product, LayerNorm and attention output a of the
              run of K_a * sum(|a| * |dm/da|)        (K_a the length of the sums that make a)
  exact       = m(patched) - m(clean): each float32 evaluation is within B of the float64 value,
              so two implementations differ by at most 4 B (B of the clean and corrupted runs,
              the larger).
  attribution = sum(delta_s * g_r): delta_s carries the errors of the two runs' sender outputs
              (K_chain u |out| each), g_r those of the forward and backward chain (K_chain u |g_r|),
              K_chain the sum of the sum lengths along the model's forward; two implementations
              differ by at most 2 u K_chain sum((|out_clean| + |out_corrupted| + |delta_s|) |g_r|).
The bounds are worst case (K u where typical errors grow like sqrt(K) u, and with no cancellation
between the rounding errors of different activations): on small models the float32 PyTorch run
stays ~10^3 below them. Both float32 implementations are held to them against float64; a wrong
edge (a missing term, a wrong head or component) moves a number by O(|exact|), and the largest
edges stand more than 50 bounds high.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian's python3-torch)")

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")
SCRIPTS = os.path.join(os.environ.get("HEADLAB_SOURCE_DIR", "."), "scripts")
sys.path.insert(0, SCRIPTS)
sys.path.insert(0, os.path.join(SCRIPTS, "reference"))
import edge_patching_tl as ep  # noqa: E402
from gpt import load_headlab  # noqa: E402
from safetensors_np import read_safetensors  # noqa: E402

U = 2.0 ** -24


def require_edges_command():
    """A failure, not a skip: the test exists to compare the command, which must be there."""
    r = subprocess.run([HEADLAB, "--help"], capture_output=True, text=True)
    if not re.search(r"^\s+edges\s", r.stdout, re.M):  # `headlab edges --help` prints the general help when missing
        pytest.fail(f"`{HEADLAB} edges` is missing: not among the subcommands of `{HEADLAB} --help`")


def metric_bound(model, ids, answers):
    """B(m) for one run of `ids` (float64 model): u * sum over the run's sums of K * |a| * |dm/da|."""
    d, T = model.cfg["d_model"], ids.shape[1]
    dk = model.blocks[0].attn.dk
    acts = []

    def keep(K):
        def hook(_m, _i, out):
            out.retain_grad()
            acts.append((K, out))
        return hook
    handles = []
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            handles.append(m.register_forward_hook(keep(m.in_features + 1)))  # the dot and the bias
        elif isinstance(m, torch.nn.LayerNorm):
            handles.append(m.register_forward_hook(keep(d + 4)))  # mean and variance sums, sqrt, scale
    for blk in model.blocks:  # z = softmax(q k^T / sqrt(dk)) v: the scores' sums, softmax's, the weighted sum
        handles.append(blk.attn.hook_z.register_forward_hook(keep(dk + 2 * T + 4)))
        for hp in (blk.hook_resid_mid, blk.hook_resid_post):
            handles.append(hp.register_forward_hook(keep(1)))
    model.set_hook_options(use_split_qkv_input=False, use_attn_result=False, use_hook_mlp_in=False)
    try:
        with torch.enable_grad():
            ep.logit_difference(model(ids), answers).backward()
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
    return U * sum(K * (a.detach().abs() * a.grad.abs()).sum().item() for K, a in acts if a.grad is not None)


def chain_length(model, T):
    """K_chain: the lengths of the sums along the forward (each layer's LayerNorms, q/k/v, scores,
    softmax, z, W_O, MLP; then ln_final and the unembedding)."""
    c, blk = model.cfg, model.blocks[0]
    per_layer = 2 * c["d_model"] + blk.attn.dk + 2 * T + blk.attn.H * blk.attn.dk + (2 * c["d_model"] + c["d_ff"] if blk.has_mlp else 0)
    return c["n_layers"] * per_layer + 2 * c["d_model"]


def attribution_bounds(model, clean, corrupted, answers):
    """{(sender, receiver): bound on |attribution_a - attribution_b| of two float32 implementations}."""
    with torch.inference_mode():
        _, out_clean = ep.sender_outputs(model, clean)
        _, out_corrupted = ep.sender_outputs(model, corrupted)
    grads = ep.attribution_gradients(model, clean, answers)
    K = chain_length(model, clean.shape[1])
    return {(s, r): 2 * U * K * ((out_clean[s].abs() + out_corrupted[s].abs() + (out_corrupted[s] - out_clean[s]).abs())
                                 * grads[r].abs()).sum().item()
            for s, r in ep.edge_list(model)}


@pytest.fixture(scope="module")
def edges_run(tmp_path_factory):
    require_edges_command()
    d = tmp_path_factory.mktemp("edges")
    subprocess.run([HEADLAB, "train", "--task", "induction", "--layers", "2", "--heads", "2", "--d-model", "32",
                    "--d-ff", "64", "--steps", "60", "--quiet", "--out", str(d / "run")], check=True, capture_output=True)
    ck = str(d / "run" / "model.safetensors")
    r = subprocess.run([HEADLAB, "edges", "--checkpoint", ck, "--task", "induction", "--rows", "6", "--seed", "7",
                        "--out", str(d / "edges")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return ck, str(d / "edges")


def test_headlab_edges_equal_the_pytorch_reference_within_round_off(edges_run):
    ck, out = edges_run
    got = json.loads(open(os.path.join(out, "edges.json")).read())
    inputs = os.path.join(out, "inputs.safetensors")
    t = read_safetensors(inputs)
    assert t["clean"].dtype == np.int32 and t["answers"].shape[1] == 4 and t["clean"].shape == t["corrupted"].shape
    ref64 = load_headlab(ck, torch.float64)
    clean, corrupted, answers = ep.read_inputs(inputs, ref64)
    want64 = ep.edge_patching(ref64, clean, corrupted, answers)
    want32 = ep.edge_patching(load_headlab(ck, torch.float32), clean, corrupted, answers)

    assert (got["n_layers"], got["n_heads"], got["has_mlp"], got["metric"]) == (2, 2, True, "logit_difference")
    assert [(e["sender"], e["receiver"]) for e in got["edges"]] == [(e["sender"], e["receiver"]) for e in want64["edges"]]
    B = max(metric_bound(ref64, clean, answers), metric_bound(ref64, corrupted, answers))
    for key in ("clean_metric", "corrupted_metric"):
        assert abs(got[key] - want64[key]) <= B, (key, got[key], want64[key], B)
    attr_bound = attribution_bounds(ref64, clean, corrupted, answers)
    worst = {"exact": 0.0, "attribution": 0.0}
    for g, w32, w in zip(got["edges"], want32["edges"], want64["edges"]):
        edge = (w["sender"], w["receiver"])
        for name, bound in (("exact", 4 * B), ("attribution", attr_bound[edge])):
            for impl, value in (("headlab", g[name]), ("PyTorch float32", w32[name])):
                assert abs(value - w[name]) <= bound, (impl, edge, name, value, w[name], bound)
            worst[name] = max(worst[name], abs(g[name] - w[name]) / bound)
        assert g["linearisation_error"] == pytest.approx(g["attribution"] - g["exact"], rel=1e-6, abs=1e-7 * B)
    # the comparison is of numbers that matter: the largest edges stand far above the bounds
    scale = max(abs(e["exact"]) for e in want64["edges"])
    assert scale > 50 * 4 * B, (scale, B)
    print(f"\nbound B(m) = {B:.3g}; largest |exact| {scale:.3g}; headlab's largest error / bound: "
          f"exact {worst['exact']:.3g}, attribution {worst['attribution']:.3g}")


def test_the_csv_holds_the_json_rows(edges_run):
    _, out = edges_run
    got = json.loads(open(os.path.join(out, "edges.json")).read())
    lines = open(os.path.join(out, "edges.csv")).read().splitlines()
    assert lines[0] == "sender,receiver,exact,attribution,linearisation_error"
    assert len(lines) == 1 + len(got["edges"])
    for line, e in zip(lines[1:], got["edges"]):
        s, r, exact, attribution, lin = line.split(",")
        assert (s, r) == (e["sender"], e["receiver"])
        assert float(exact) == pytest.approx(e["exact"], rel=1e-6, abs=1e-12)
        assert float(attribution) == pytest.approx(e["attribution"], rel=1e-6, abs=1e-12)
