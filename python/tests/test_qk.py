"""QK attribution over a task's answers through both doors: `headlab qk` and hl.qk_attribution(answers=)
give the same matrix bit for bit, the aggregated pairs sum to the aggregated scores the model computed
(hook_attn_scores at the sites), the page of `headlab view --qk` holds the matrix, and bad input gets
one line."""
import json
import os
import re
import subprocess

import numpy as np
import pytest

import headlab as hl
from test_view import browser, open_page, view  # noqa: F401  (the browser fixture)

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("qk")
    ck = str(d / "run")
    subprocess.run([HEADLAB, "train", "--task", "induction", "--d-model", "16", "--layers", "2", "--heads", "2", "--d-ff", "32",
                    "--length", "6", "--alphabet", "12", "--steps", "30", "--threads", "2", "--quiet", "--out", ck],
                   check=True, capture_output=True)
    out = {}
    for key in ("source", "max"):
        out[key] = str(d / key)
        r = subprocess.run([HEADLAB, "qk", "--checkpoint", ck + "/model.safetensors", "--head", "1.1", "--examples", "12",
                            "--seed", "5", "--key", key, "--threads", "2", "--out", out[key]], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    return ck + "/model.safetensors", out


def test_cli_and_python_give_the_same_matrix_and_it_sums_to_the_scores(run):
    ck, out = run
    hl.set_num_threads(2)
    m = hl.TransformerLM.load(ck)
    for key in ("source", "max"):
        j = json.load(open(os.path.join(out[key], "qk.json")))
        ids = np.array(j["ids"], dtype=np.int32)
        sites = np.array(j["sites"])
        # the command's sites as answers (row, pos, -, -) with their keys as the source positions
        answers = [(int(r), int(q), 0, 1) for r, q, _ in sites]
        a = hl.qk_attribution(m, ids, layer=1, head=1, answers=answers, source_pos=[int(k) for k in sites[:, 2]],
                              key_rule="source")
        assert type(a) is hl.QkAttribution and a.aggregate == "mean"
        assert a.components == j["components"]
        assert np.array_equal(a.pairs, np.array(j["pairs"])), key
        assert a.score == j["score"]
        assert np.array_equal(a.sites, sites)
        # the model's own scores at the sites, from its hook point
        _, cache = m.run_with_cache(ids)
        s = np.asarray(cache["blocks.1.attn.hook_attn_scores"])  # (B, H, T, T)
        mean = float(np.mean([s[r, 1, q, k] for r, q, k in sites], dtype=np.float64))
        assert a.score == pytest.approx(mean, abs=1e-6)
        assert a.pairs.sum() == pytest.approx(mean, abs=1e-4 * max(1.0, abs(mean)))
        assert a.query_totals.sum() == pytest.approx(a.pairs.sum()) and a.key_totals.sum() == pytest.approx(a.pairs.sum())
        if key == "max":  # each key is where the head attends most
            p = np.asarray(cache["blocks.1.attn.hook_pattern"])
            assert all(k == int(np.argmax(p[r, 1, q, :q + 1])) for r, q, k in sites)
        # summed: the mean times the number of sites
        total = hl.qk_attribution(m, ids, layer=1, head=1, answers=answers, source_pos=[int(k) for k in sites[:, 2]],
                                  aggregate="sum")
        assert np.allclose(total.pairs, a.pairs * len(sites), rtol=1e-12, atol=1e-12)


def test_the_page_holds_the_matrix(browser, run, tmp_path):  # noqa: F811
    ck, out = run
    page = str(tmp_path / "qk.html")
    r = view("--checkpoint", ck, "--tokens", "1 2 3 1 2", "--qk", out["source"], "--out", page)
    assert r.returncode == 0, r.stderr
    assert open_page(browser, page) == []
    from selenium.webdriver.common.by import By
    assert browser.find_element(By.ID, "panel-qk").is_displayed()
    j = json.load(open(os.path.join(out["source"], "qk.json")))
    C = len(j["components"])
    cells = browser.find_elements(By.CSS_SELECTOR, "#qk-matrix td")
    assert len(cells) == (C + 1) * (C + 1)  # the matrix and each side's totals
    shown = {(c.get_attribute("data-q"), c.get_attribute("data-k")): c.get_attribute("title") for c in cells}
    for i, q in enumerate(j["components"]):
        for k, key in enumerate(j["components"]):
            # the hover text carries the full number, the cell four digits
            assert float(shown[(q, key)].rsplit(": ", 1)[1]) == j["pairs"][i][k]
    total = float(shown[("total", "total")].rsplit(": ", 1)[1])
    assert total == pytest.approx(j["score"], abs=1e-4 * max(1.0, abs(j["score"])))
    note = browser.find_element(By.ID, "qk-note").text
    assert f"L1H1's score, mean over {len(j['sites'])} (query, key) sites of task induction (key: source)" in note


def test_bad_input_gets_one_line(run, tmp_path):
    ck, out = run
    m = hl.TransformerLM.load(ck)
    ids = np.array([[1, 2, 3, 1, 2]], dtype=np.int32)
    for kw, message in ((dict(), "qk_attribution: give query and key (one site), or answers"),
                        (dict(query=3, key=1, answers=[(0, 3, 0, 1)]), "give query and key (one site) or answers"),
                        (dict(answers=[(0, 3, 0, 1)]), "key_rule 'source' needs source_pos"),
                        (dict(answers=[(0, 3, 0, 1)], key_rule="first"), "unknown key rule 'first' (expected source, previous or max)"),
                        (dict(answers=[(0, 3, 0, 1)], key_rule="max", aggregate="median"),
                         "unknown aggregate 'median' (expected mean or sum)")):
        with pytest.raises(Exception, match=re.escape(message)):
            hl.qk_attribution(m, ids, layer=1, head=0, **kw)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"layer": 5, "head": 0, "components": ["tok"], "pairs": [[1.0]], "score": 1.0, "sites": []}))
    r = view("--checkpoint", ck, "--tokens", "1 2", "--qk", str(bad), "--out", str(tmp_path / "v.html"))
    assert r.returncode != 0 and "head L5H0 is not in the model's 2 layers x 2 heads" in r.stderr
    assert not (tmp_path / "v.html").exists()
    r = subprocess.run([HEADLAB, "qk", "--checkpoint", ck, "--head", "1.0", "--key", "first", "--out", str(tmp_path / "q")],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "--key: first not in {source,previous,max}" in r.stderr
