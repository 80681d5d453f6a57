"""Edges from Python (hl.edge_patching, hl.path_patching): the same numbers as `headlab edges` from
the inputs it writes, path patching to every reader against activation patching, and the messages
of bad input."""
import json
import os
import struct
import subprocess

import numpy as np
import pytest

import headlab as hl

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")


def read_int32_safetensors(path):
    """The int32 tensors of a safetensors file, read with NumPy alone (the file's own format)."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "I32"
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<i4").reshape(t["shape"])
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("edges")
    ck = str(d / "run")
    subprocess.run([HEADLAB, "train", "--task", "copy", "--d-model", "32", "--layers", "2", "--heads", "2", "--steps", "40",
                    "--threads", "2", "--quiet", "--out", ck], check=True, capture_output=True)
    out = str(d / "edges")
    subprocess.run([HEADLAB, "edges", "--checkpoint", ck + "/model.safetensors", "--rows", "8", "--seed", "5", "--threads", "2",
                    "--out", out], check=True, capture_output=True)
    return ck + "/model.safetensors", out


def test_cli_and_python_edges_agree_bit_for_bit(run):
    ck, out = run
    j = json.load(open(os.path.join(out, "edges.json")))
    inp = read_int32_safetensors(os.path.join(out, "inputs.safetensors"))
    assert inp["answers"].shape[1] == 4 and inp["clean"].shape == inp["corrupted"].shape
    loaded = hl.load_safetensors(os.path.join(out, "inputs.safetensors"))  # the reader users are pointed to
    assert sorted(loaded) == sorted(inp) and all(np.array_equal(loaded[k], inp[k]) for k in inp)
    assert loaded["clean"].dtype == np.int32
    hl.set_num_threads(2)
    m = hl.TransformerLM.load(ck)
    r = hl.edge_patching(m, inp["clean"], inp["corrupted"], answers=inp["answers"])
    assert len(r["senders"]) == len(j["edges"]) == 6 + 3 + 18 + 5 + 5
    assert r["senders"] == [e["sender"] for e in j["edges"]]
    assert r["receivers"] == [e["receiver"] for e in j["edges"]]
    for key in ("exact", "attribution", "linearisation_error"):
        assert np.array_equal(r[key], np.array([e[key] for e in j["edges"]])), key
    assert r["clean_metric"] == j["clean_metric"] and r["corrupted_metric"] == j["corrupted_metric"]
    assert np.array_equal(r["linearisation_error"], r["attribution"] - r["exact"])
    csv_rows = open(os.path.join(out, "edges.csv")).read().splitlines()
    assert csv_rows[0] == "sender,receiver,exact,attribution,linearisation_error"
    assert [float(x.split(",")[2]) for x in csv_rows[1:]] == list(r["exact"])


def test_path_patching_to_every_reader_is_activation_patching(run):
    ck, out = run
    inp = read_int32_safetensors(os.path.join(out, "inputs.safetensors"))
    m = hl.TransformerLM.load(ck)
    for sender in ("embed", "L0H1", "L1H0"):
        p = hl.path_patching(m, inp["clean"], inp["corrupted"], sender=sender, answers=inp["answers"])
        # two float32 computations of one logit difference (per-head copies through hooks or not)
        assert abs(p["path"] - p["activation"]) <= 2e-5 * (1 + abs(p["activation"])), sender
    # one receiver: that edge's exact patching
    r = hl.edge_patching(m, inp["clean"], inp["corrupted"], answers=inp["answers"])
    i = [k for k in range(len(r["senders"])) if r["senders"][k] == "L0H0" and r["receivers"][k] == "L1H1.v"][0]
    p = hl.path_patching(m, inp["clean"], inp["corrupted"], sender="L0H0", receivers=["L1H1.v"], answers=inp["answers"])
    assert abs(p["path"] - r["exact"][i]) <= 2e-5 * (1 + abs(r["exact"][i]))


def test_bad_input_raises_with_the_cli_wording(run):
    ck, out = run
    inp = read_int32_safetensors(os.path.join(out, "inputs.safetensors"))
    m = hl.TransformerLM.load(ck)
    with pytest.raises(ValueError, match="must have one shape"):
        hl.edge_patching(m, inp["clean"], inp["corrupted"][:, :-1], answers=inp["answers"])
    with pytest.raises(ValueError, match="no answers"):
        hl.edge_patching(m, inp["clean"], inp["corrupted"], answers=np.zeros((0, 4), dtype=np.int64))
    with pytest.raises(ValueError, match="unknown sender 'L0X1'"):
        hl.path_patching(m, inp["clean"], inp["corrupted"], sender="L0X1", answers=inp["answers"])
    with pytest.raises(ValueError, match="L1H0 is written after L1H1.q reads"):
        hl.path_patching(m, inp["clean"], inp["corrupted"], sender="L1H0", receivers=["L1H1.q"], answers=inp["answers"])
    with pytest.raises(ValueError, match="layer 5 is outside 0..1"):
        hl.path_patching(m, inp["clean"], inp["corrupted"], sender="L0H0", receivers=["mlp5"], answers=inp["answers"])


def test_a_grouped_query_model_runs_ungrouped_through_both_doors(tmp_path):
    # 4 query heads sharing 2 key/value heads: both doors run the ungrouped equivalent, name a .k/.v
    # receiver per query head, and agree bit for bit
    ck = str(tmp_path / "gqa")
    subprocess.run([HEADLAB, "train", "--task", "copy", "--d-model", "32", "--layers", "2", "--heads", "4", "--kv-heads", "2",
                    "--steps", "20", "--threads", "2", "--quiet", "--out", ck], check=True, capture_output=True)
    out = str(tmp_path / "edges")
    r = subprocess.run([HEADLAB, "edges", "--checkpoint", ck + "/model.safetensors", "--rows", "4", "--threads", "2",
                        "--out", out], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    j = json.load(open(os.path.join(out, "edges.json")))
    inp = read_int32_safetensors(os.path.join(out, "inputs.safetensors"))
    m = hl.TransformerLM.load(ck + "/model.safetensors")
    py = hl.edge_patching(m, inp["clean"], inp["corrupted"], answers=inp["answers"])
    assert py["receivers"] == [e["receiver"] for e in j["edges"]]
    assert {"L1H0.k", "L1H1.k", "L1H2.v", "L1H3.v"} <= set(py["receivers"])
    assert np.array_equal(py["exact"], np.array([e["exact"] for e in j["edges"]]))
    # the two query heads of a group read one key input in the model, but their copies are patched apart
    k = {(s, rc): x for s, rc, x in zip(py["senders"], py["receivers"], py["exact"])}
    assert any(k[(s, "L1H0.k")] != k[(s, "L1H1.k")] for s in ("embed", "L0H0", "L0H1", "L0H2", "L0H3"))


def test_the_exact_runs_time_is_said_up_front_and_refused_over_max_minutes(run, tmp_path):
    # the exact runs' count (every model edge and MLP-sender edge) and their token-blocks (a packed
    # position through one block: each run from its receiver's block on, every row up to its last
    # answer) from the inputs the run wrote; over --max-minutes the command refuses before the work
    ck, out = run
    j = json.load(open(os.path.join(out, "edges.json")))
    answers = read_int32_safetensors(os.path.join(out, "inputs.safetensors"))["answers"]
    last = {}
    for row, pos, _, _ in answers:
        last[row] = max(last.get(row, -1), pos)
    n = sum(p + 1 for p in last.values())
    L = j["n_layers"]

    def layer(receiver):  # "L1H0.q" -> 1, "mlp1" -> 1, logits -> L
        return L if receiver == "logits" else int(receiver[1:].split("H")[0]) if receiver[0] == "L" else int(receiver[3:])

    receivers = sorted({e["receiver"] for e in j["edges"]}, key=layer)
    model_edges = [e["receiver"] for e in j["edges"]]
    mlp_senders = {r: (L if r == "logits" else layer(r)) for r in receivers}  # MLPs of the layers before r
    edges = len(model_edges) + sum(mlp_senders.values())
    blocks = sum(L - layer(r) for r in model_edges) + sum(k * (L - layer(r)) for r, k in mlp_senders.items())
    refused = subprocess.run([HEADLAB, "edges", "--checkpoint", ck, "--rows", "8", "--seed", "5", "--threads", "2",
                              "--max-minutes", "1e-9", "--out", str(tmp_path / "e")], capture_output=True, text=True)
    assert refused.returncode != 0
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith(f"headlab: error: edges: exact patching of {edges} edges ({n * blocks:.3g} patched token-blocks, "), line
    assert "at this machine's rate now (" in line and line.endswith(
        "more than --max-minutes 1e-09; lower --rows or --length, or raise --max-minutes (headlab patch gives every head's and "
        "residual position's exact effect at this size in minutes)"), line
    assert not (tmp_path / "e").exists()
    said = subprocess.run([HEADLAB, "edges", "--checkpoint", ck, "--rows", "8", "--seed", "5", "--threads", "2", "--top", "1",
                           "--out", str(tmp_path / "f")], capture_output=True, text=True, check=True)
    assert f"headlab edges: exact patching of {edges} edges ({n * blocks:.3g} patched token-blocks" in said.stderr
