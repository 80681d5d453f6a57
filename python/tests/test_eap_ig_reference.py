"""`headlab edges --method eap-ig` against the PyTorch script written the way hannamw/EAP-IG computes
it (scripts/reference/eap_ig_torch.py, the other side of scripts/bench_eap_ig.sh): on a briefly
trained model and the inputs headlab wrote, the same edges in the same order, and every score
within float32 rounding of the script's float64 run: headlab's deviation from float64 at most a
few times the float32 PyTorch script's own (both sum the same terms in float32, in other orders),
far below the scores that matter."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian's python3-torch)")

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")
SCRIPTS = os.path.join(os.environ.get("HEADLAB_SOURCE_DIR", "."), "scripts")
sys.path.insert(0, SCRIPTS)
sys.path.insert(0, os.path.join(SCRIPTS, "reference"))
import eap_ig_torch  # noqa: E402
from edge_patching_tl import edge_list, read_inputs  # noqa: E402
from gpt import load_headlab  # noqa: E402


def torch_scores(ck, inputs, steps, dtype):
    torch.set_num_threads(2)
    model = load_headlab(ck, dtype=dtype)
    clean, corrupted, answers = read_inputs(inputs, model)
    scores, graph = eap_ig_torch.eap_ig(model, clean, corrupted, answers, steps)
    return [(s, r) for s, r in edge_list(model)], np.array(
        [float(scores[graph.forward_index(s), graph.backward_index(r)]) for s, r in edge_list(model)])


@pytest.mark.parametrize("steps", [1, 4])
def test_headlab_eap_ig_equals_the_reference_scores(tmp_path, steps):
    ck = str(tmp_path / "run")
    subprocess.run([HEADLAB, "train", "--task", "copy", "--d-model", "16", "--layers", "2", "--heads", "2", "--d-ff", "32",
                    "--steps", "40", "--threads", "2", "--quiet", "--out", ck], check=True, capture_output=True)
    ck += "/model.safetensors"
    out = str(tmp_path / "edges")
    subprocess.run([HEADLAB, "edges", "--checkpoint", ck, "--rows", "12", "--seed", "3", "--threads", "2", "--method", "eap-ig",
                    "--ig-steps", str(steps), "--out", out], check=True, capture_output=True)
    j = json.load(open(os.path.join(out, "edges.json")))
    hl_edges = [(e["sender"], e["receiver"]) for e in j["edges"]]
    hl = np.array([e["eap-ig"] for e in j["edges"]])
    edges32, pt32 = torch_scores(ck, os.path.join(out, "inputs.safetensors"), steps, torch.float32)
    edges64, pt64 = torch_scores(ck, os.path.join(out, "inputs.safetensors"), steps, torch.float64)
    assert hl_edges == edges32 == edges64
    scale = np.abs(pt64).max()
    hl_err, pt_err = np.abs(hl - pt64).max() / scale, np.abs(pt32 - pt64).max() / scale
    print(f"steps {steps}: max |headlab - float64| / max |score| {hl_err:.2e}, PyTorch float32's {pt_err:.2e}")
    assert hl_err <= max(8 * pt_err, 1e-6), (hl_err, pt_err)
    # one step is edge attribution (the gradient at the clean run), in both
    if steps == 1:
        assert np.array_equal(hl, np.array([e["attribution"] for e in j["edges"]]))
