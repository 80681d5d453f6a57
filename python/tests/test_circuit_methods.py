"""Circuit-discovery methods from Python (hl.edge_patching(method=)): the same scores as
`headlab edges --method` from the inputs it writes, one step of EAP-IG is the attribution, and the
messages of bad options."""
import json
import os
import subprocess

import numpy as np
import pytest

import headlab as hl
from test_edges import read_int32_safetensors

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("circuit_methods")
    ck = str(d / "run")
    subprocess.run([HEADLAB, "train", "--task", "copy", "--d-model", "16", "--layers", "2", "--heads", "2", "--d-ff", "32",
                    "--steps", "30", "--threads", "2", "--quiet", "--out", ck], check=True, capture_output=True)
    outs = {}
    for method, extra in (("eap-ig", ["--ig-steps", "3", "--ig-interpolate", "activations"]),
                          ("acdc", ["--acdc-threshold", "0.05", "--acdc-score", "kl"])):
        out = str(d / method)
        subprocess.run([HEADLAB, "edges", "--checkpoint", ck + "/model.safetensors", "--rows", "6", "--seed", "5", "--threads",
                        "2", "--method", method, *extra, "--out", out], check=True, capture_output=True)
        outs[method] = out
    return ck + "/model.safetensors", outs


def test_cli_and_python_methods_agree_bit_for_bit(run):
    ck, outs = run
    hl.set_num_threads(2)
    m = hl.TransformerLM.load(ck)
    for method, kw in (("eap-ig", dict(ig_steps=3, ig_interpolate="activations")),
                       ("acdc", dict(acdc_threshold=0.05, acdc_score="kl"))):
        j = json.load(open(os.path.join(outs[method], "edges.json")))
        inp = read_int32_safetensors(os.path.join(outs[method], "inputs.safetensors"))
        r = hl.edge_patching(m, inp["clean"], inp["corrupted"], answers=inp["answers"], method=method, **kw)
        assert np.array_equal(r[method], np.array([e[method] for e in j["edges"]])), method
        if method == "acdc":
            kept = [f"{s}->{t}" for s, t, k in zip(r["senders"], r["receivers"], r["circuit"]) if k]
            assert kept == [e for e in j["circuit"] if not e.startswith("mlp")]
            assert r["circuit_edges"] == j["circuit"]
        # one step of EAP-IG (inputs) is the attribution, bit for bit
        one = hl.edge_patching(m, inp["clean"], inp["corrupted"], answers=inp["answers"], method="eap-ig", ig_steps=1)
        assert np.array_equal(one["eap-ig"], one["attribution"])


def test_bad_method_options_get_one_line(run):
    ck, outs = run
    m = hl.TransformerLM.load(ck)
    inp = read_int32_safetensors(os.path.join(outs["eap-ig"], "inputs.safetensors"))
    args = (m, inp["clean"], inp["corrupted"])
    n_mlp_edges = 3 * 2 + 1 + 2  # mlp0 -> layer 1's q/k/v (2 heads) and mlp1; mlp0, mlp1 -> logits
    for kw, message in ((dict(method="pruning"),
                         "edges: unknown method 'pruning' (expected attribution, eap-ig, atp-star, acdc or edge-pruning)"),
                        (dict(method="edge-pruning", target_edges=10 ** 6), f"edge pruning: target edges {10 ** 6} is outside "
                         f"1..{len(hl.edge_patching(m, *args[1:], answers=inp['answers'])['exact']) + n_mlp_edges} "
                         "(the model's edges, MLP senders included)"),
                        (dict(method="edge-pruning", prune_steps=0), "edge pruning: steps 0 is outside 1..100000"),
                        (dict(method="atp-star", answers=np.zeros((0, 4), np.int32)),
                         "edge_patching: no answers"),
                        (dict(method="eap-ig", ig_steps=0), "eap-ig: steps 0 is outside 1..1000"),
                        (dict(method="eap-ig", ig_interpolate="both"),
                         "eap-ig: unknown interpolation 'both' (expected inputs or activations)"),
                        (dict(method="acdc", acdc_threshold=-1.0), "acdc: threshold -1 must be a number >= 0"),
                        (dict(method="acdc", acdc_score="l2"), "acdc: unknown score 'l2' (expected metric or kl)")):
        with pytest.raises(Exception) as e:
            hl.edge_patching(*args, **{"answers": inp["answers"], **kw})
        assert str(e.value) == message, kw


def test_qk_attribution_pairs_sum_to_the_models_scores(run):
    ck, _ = run
    m = hl.TransformerLM.load(ck)
    ids = np.array([[1, 3, 2, 0, 4, 3], [2, 2, 1, 4, 0, 1]], dtype=np.int32)
    # the model's own scores, from its hook point, for every head, query and key of both rows
    _, cache = m.run_with_cache(ids)
    for layer in range(2):
        scores = np.asarray(cache[f"blocks.{layer}.attn.hook_attn_scores"])  # (B, H, T, T)
        for row in range(2):
            for head in range(2):
                for q in range(6):
                    for k in range(q + 1):
                        a = hl.qk_attribution(m, ids, row=row, layer=layer, head=head, query=q, key=k)
                        assert a["pairs"].shape == (len(a["components"]),) * 2
                        assert a["components"][0] == "tok" and a["components"][-1] == "bias"
                        assert a["score"] == pytest.approx(float(scores[row, head, q, k]), abs=1e-5)
                        assert a["pairs"].sum() == pytest.approx(a["score"], abs=1e-4 * max(1.0, abs(a["score"])))
    with pytest.raises(Exception, match="qk attribution: key position 3 is outside 0..2"):
        hl.qk_attribution(m, ids, layer=0, head=0, query=2, key=3)


def test_atp_star_and_edge_pruning_from_python(run):
    ck, outs = run
    m = hl.TransformerLM.load(ck)
    inp = read_int32_safetensors(os.path.join(outs["eap-ig"], "inputs.safetensors"))
    atp = hl.edge_patching(m, inp["clean"], inp["corrupted"], answers=inp["answers"], method="atp-star")
    assert atp["atp-star"].shape == atp["exact"].shape and np.all(np.isfinite(atp["atp-star"]))
    pruned = hl.edge_patching(m, inp["clean"], inp["corrupted"], answers=inp["answers"], method="edge-pruning", target_edges=5,
                              prune_steps=10)
    assert len(pruned["circuit_edges"]) == 5  # the model's edges and the MLP-sender edges compete for the 5
    assert np.all((pruned["edge-pruning"] >= 0) & (pruned["edge-pruning"] <= 1))  # each edge's probability of a non-zero mask
