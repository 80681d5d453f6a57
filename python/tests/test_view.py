"""`headlab view` in a real browser (Debian's chromium + chromedriver through selenium): the
page opens with no console errors, shows every head, the hovered row's weights equal the
attention tensor, user text renders literally and runs no script, runs without atlas or
pruning data still render, the Edges panel draws the top edges of an edges.json, and bad input
writes nothing."""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

import headlab as hl

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")
BUILD = os.path.dirname(os.path.abspath(HEADLAB))
GPL = "/usr/share/common-licenses/GPL-3"

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (Debian's python3-selenium)")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium")
    driver_path = shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.skip("chromium and chromium-driver are not installed")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    yield d
    d.quit()


def view(*args, cwd=None):
    return subprocess.run([HEADLAB, "view", *args], capture_output=True, text=True, cwd=cwd)


def open_page(driver, path):
    driver.get("file://" + os.path.abspath(path))
    WebDriverWait(driver, 30).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    # named as `scripts/run.sh` names it: the page's title (and the README's screenshot) shows it
    run = str(tmp_path_factory.mktemp("view") / "runs" / "copy-20261123-101500")
    subprocess.run([HEADLAB, "train", "--quiet", "--steps", "200", "--eval-every", "50", "--eval-size", "200",
                    "--log-grads", "50", "--out", run], check=True, capture_output=True)
    return run


def test_the_head_view_shows_the_attention_tensor(browser, copy_run):
    r = view("runs/" + os.path.basename(copy_run), cwd=os.path.dirname(os.path.dirname(copy_run)))
    assert r.returncode == 0, r.stderr
    page = os.path.join(copy_run, "view.html")
    assert os.path.getsize(page) < 2e6
    assert open_page(browser, page) == []
    # every head in the model view
    assert len(browser.find_elements(By.CSS_SELECTOR, "canvas.thumb")) == 2 * 4
    # layer 1, head 2 alone, hover query token 5
    Select(browser.find_element(By.ID, "layer")).select_by_value("1")
    browser.find_element(By.ID, "heads-none").click()
    browser.find_element(By.ID, "head-2").click()
    token5 = browser.find_element(By.CSS_SELECTOR, '#left-tokens .tok[data-index="5"]')
    ActionChains(browser).move_to_element(token5).perform()
    cells = browser.find_elements(By.CSS_SELECTOR, '#weights td[data-head="2"]')
    shown = [float(c.text) for c in cells]
    assert len(shown) == 6 and not browser.find_elements(By.CSS_SELECTOR, '#weights td[data-head="1"]')
    # the same example from the library: held-out row 0 of the run's task and seed
    model = hl.TransformerLM.load(os.path.join(copy_run, "model.safetensors"))
    ids = hl.Task("copy").held_out(n=4, seed=1234, batch=4)[0]["input_ids"][:1]
    _, cache = model.run_with_cache(ids, names_filter=["blocks.1.attn.hook_pattern"])
    want = cache["blocks.1.attn.hook_pattern"][0, 2, 5, :6]
    assert np.all(np.abs(np.array(shown) - want) <= 0.0005 + 1e-6), (shown, want)
    # the token texts are the task's
    left = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#left-tokens .tok")]
    assert left[0] == "BOS" and len(left) == 33  # [BOS x SEP x] without its last token
    # run panels present: training curves and the gradient atlas; no pruning data
    assert browser.find_element(By.ID, "panel-training").is_displayed()
    assert browser.find_element(By.ID, "panel-atlas").is_displayed()
    assert not browser.find_element(By.ID, "panel-prune").is_displayed()
    assert browser.find_element(By.TAG_NAME, "h1").text == "headlab view: runs/copy-20261123-101500"
    # all heads again, still hovering: the screenshot (README, docs/results/view.png) shows the lines and the weights
    browser.find_element(By.ID, "heads-all").click()
    ActionChains(browser).move_to_element(browser.find_element(By.CSS_SELECTOR, '#left-tokens .tok[data-index="20"]')).perform()
    browser.save_screenshot(os.path.join(BUILD, "view_screenshot.png"))
    assert os.path.getsize(os.path.join(BUILD, "view_screenshot.png")) > 10000
    # click a thumbnail to enlarge it
    browser.find_element(By.CSS_SELECTOR, 'canvas.thumb[data-layer="1"][data-head="3"]').click()
    assert browser.find_element(By.ID, "enlarged-title").text.startswith("layer 1 head 3")


def test_user_text_renders_literally_and_runs_no_script(browser, tmp_path):
    ckpt = str(tmp_path / "text.safetensors")
    hl.TransformerLM(hl.ModelConfig(vocab_size=256, max_seq_len=96, d_model=16, layers=1, heads=2, d_ff=32)).save(ckpt)
    text = "<script>alert(1)</script> \"q\" 'a' & <img src=x onerror=\"document.title='pwned'\">"
    r = view("--checkpoint", ckpt, "--text", text, "--out", str(tmp_path / "t.html"))
    assert r.returncode == 0, r.stderr
    assert open_page(browser, str(tmp_path / "t.html")) == []
    assert browser.title == "headlab view"
    alerts = browser.execute_script("return typeof window.alert")  # the page still works and no alert is open
    assert alerts == "function"
    shown = "".join(e.get_attribute("textContent") for e in browser.find_elements(By.CSS_SELECTOR, "#left-tokens .tok"))
    assert shown == text
    assert not browser.find_elements(By.CSS_SELECTOR, "#left-tokens img, #left-tokens script")


def test_a_run_without_atlas_or_prune_data_renders_with_those_panels_hidden(browser, tmp_path):
    run = str(tmp_path / "plain")
    subprocess.run([HEADLAB, "train", "--quiet", "--steps", "20", "--eval-size", "50", "--out", run], check=True,
                   capture_output=True)
    os.remove(os.path.join(run, "metrics.jsonl"))
    assert view(run).returncode == 0
    assert open_page(browser, os.path.join(run, "view.html")) == []
    for panel in ("panel-training", "panel-atlas", "panel-entropy", "panel-prune", "panel-over-training"):
        assert not browser.find_element(By.ID, panel).is_displayed(), panel
    assert len(browser.find_elements(By.CSS_SELECTOR, "canvas.thumb")) == 8


def test_heads_over_training_draw_a_chart_per_score_with_a_line_per_head(browser, tmp_path):
    run = str(tmp_path / "snap")
    subprocess.run([HEADLAB, "train", "--quiet", "--d-model", "16", "--layers", "2", "--heads", "2", "--length", "6",
                    "--steps", "20", "--eval-size", "32", "--snapshot-every", "10", "--out", run], check=True, capture_output=True)
    for command in ("detect", "compose"):  # into RUN/over_training/, where the view looks
        subprocess.run([HEADLAB, command, "--run", run, "--examples", "16"], check=True, capture_output=True)
    assert view(run).returncode == 0
    assert open_page(browser, os.path.join(run, "view.html")) == []
    assert browser.find_element(By.ID, "panel-over-training").is_displayed()
    charts = [c.get_attribute("id") for c in browser.find_elements(By.CSS_SELECTOR, "#over-training-charts canvas")]
    assert charts == ["over-detect-" + s for s in ("previous_token", "duplicate_token", "induction")] + \
        ["over-compose-" + s for s in ("q_composition", "k_composition", "v_composition")]
    # the page holds the CSV's rows: steps 0, 10, 20 x 4 heads; compose's layer 0 has no score
    assert browser.execute_script("return D.over_training.map(o => o.table.rows.length)") == [12, 12]
    legend = browser.execute_script("""
      const c = document.getElementById('over-compose-k_composition'), g = c.getContext('2d');
      const px = g.getImageData(0, 0, c.width, c.height).data; let coloured = 0;
      for (let i = 0; i < px.length; i += 4) if (Math.abs(px[i] - px[i + 1]) > 60 || Math.abs(px[i + 1] - px[i + 2]) > 60) coloured++;
      return coloured;""")
    assert legend > 50  # coloured lines were drawn
    assert browser.execute_script("return document.getElementById('over-training-log').checked") is False  # 0..20


def test_the_over_training_axis_is_log_when_the_steps_span_more_than_two_decades(browser, tmp_path):
    run = str(tmp_path / "long")
    subprocess.run([HEADLAB, "train", "--quiet", "--d-model", "16", "--layers", "2", "--heads", "2", "--length", "6",
                    "--steps", "202", "--eval-every", "202", "--eval-size", "16", "--snapshot-at", "1", "--out", run],
                   check=True, capture_output=True)
    # Python writes what the page reads (steps 1 and 202)
    assert hl.scores_over_training(run, analysis="compose", threads=2, out=True)["steps"].tolist() == [1, 202]
    assert view(run).returncode == 0
    assert open_page(browser, os.path.join(run, "view.html")) == []
    box = browser.find_element(By.ID, "over-training-log")
    assert box.is_selected()
    pixels = "const c = document.getElementById('over-compose-k_composition'); return c.toDataURL();"
    log_chart = browser.execute_script(pixels)
    box.click()  # back to a linear axis: the chart is drawn again, differently
    assert not box.is_selected() and browser.execute_script(pixels) != log_chart


def test_missing_or_corrupt_input_is_one_line_and_writes_nothing(tmp_path):
    r = view(str(tmp_path / "nothing"))
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "not a directory" in r.stderr
    run = tmp_path / "run"
    run.mkdir()
    (run / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken")
    r = view(str(run))
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "model.safetensors" in r.stderr
    assert not os.path.exists(run / "view.html")
    good = tmp_path / "good"
    subprocess.run([HEADLAB, "train", "--quiet", "--steps", "10", "--eval-size", "20", "--out", str(good)], check=True,
                   capture_output=True)
    (good / "grad_atlas.csv").write_text("step,layer,head,matrix,grad_norm,weight_norm\n10,0,1\n")
    r = view(str(good))
    assert r.returncode != 0 and "grad_atlas.csv:2: 3 fields, expected 6" in r.stderr
    assert not os.path.exists(good / "view.html")
    assert not [f for f in os.listdir(good) if f.startswith(".view.html")]


@pytest.mark.skipif(not os.path.exists(GPL), reason="no " + GPL)
def test_a_12_layer_12_head_128_token_page_stays_under_20_mb(browser, tmp_path):
    t = hl.Trainer(task="text", data=GPL, length=128, layers=12, heads=12, d_model=96, d_ff=128, steps=1, batch=2,
                   eval_size=8)
    ckpt = str(tmp_path / "big.safetensors")
    t.save(ckpt)
    r = view("--checkpoint", ckpt, "--out", str(tmp_path / "big.html"))
    assert r.returncode == 0, r.stderr
    size = os.path.getsize(tmp_path / "big.html")
    assert size < 20e6
    assert open_page(browser, str(tmp_path / "big.html")) == []
    assert len(browser.find_elements(By.CSS_SELECTOR, "canvas.thumb")) == 144
    ms = browser.execute_script("return +document.body.dataset.renderMs")
    print(f"\n12x12 heads, 128 tokens: {size / 1e6:.1f} MB, rendered in {ms:.0f} ms")


def every_edge(layers, heads, has_mlp=True):
    """edges.json of `headlab edges` for a model of that shape, every edge in the file's order, with
    exact = +-((5 i) % 17 + 1) / 4 (ties and both signs; values the page prints exactly)."""
    edges = []

    def add(sender, receiver):
        i = len(edges)
        exact = (-1) ** i * ((5 * i) % 17 + 1) / 4
        edges.append({"sender": sender, "receiver": receiver, "exact": exact, "attribution": exact / 2,
                      "linearisation_error": -exact / 2})
    for layer in range(layers + 1):
        readers = ([f"L{layer}H{h}.{c}" for h in range(heads) for c in "qkv"] + ([f"mlp{layer}"] if has_mlp else [])
                   if layer < layers else ["logits"])
        for r in readers:
            before = layer + 1 if r.startswith("mlp") else layer
            for s in ["embed"] + [f"L{l}H{h}" for l in range(before) for h in range(heads)]:
                add(s, r)
    return {"metric": "logit_difference", "clean_metric": 3.5, "corrupted_metric": -0.75, "n_layers": layers,
            "n_heads": heads, "has_mlp": has_mlp, "edges": edges}


def test_the_edges_panel_draws_the_top_edges(browser, tmp_path):
    ckpt = str(tmp_path / "m.safetensors")
    hl.TransformerLM(hl.ModelConfig(vocab_size=13, max_seq_len=16, d_model=24, layers=2, heads=3, d_ff=32)).save(ckpt)
    data = every_edge(2, 3)
    (tmp_path / "edges.json").write_text(json.dumps(data))
    page = str(tmp_path / "e.html")
    r = view("--checkpoint", ckpt, "--tokens", "1 2 3 4", "--edges", str(tmp_path / "edges.json"), "--edges-top", "7",
             "--out", page)
    assert r.returncode == 0, r.stderr
    assert open_page(browser, page) == []
    assert browser.find_element(By.ID, "panel-edges").is_displayed()
    top = sorted(data["edges"], key=lambda e: -abs(e["exact"]))[:7]  # stable: ties in file order
    lines = browser.find_elements(By.CSS_SELECTOR, "#edge-graph line.edge")
    assert len(lines) == 7
    drawn = [(e.get_attribute("data-sender"), e.get_attribute("data-receiver")) for e in lines]
    assert drawn == [(e["sender"], e["receiver"]) for e in reversed(top)]  # the largest drawn last, on top
    largest = lines[-1]
    title = largest.find_element(By.TAG_NAME, "title").get_attribute("textContent")
    assert title == (f"{top[0]['sender']} \u2192 {top[0]['receiver']}: exact {top[0]['exact']:g}, "
                     f"attribution {top[0]['attribution']:g}")
    for line, e in zip(lines, reversed(top)):  # sign by colour, the receiver's input by dash
        assert line.get_attribute("stroke") == ("#2166ac" if e["exact"] >= 0 else "#b2182b")
        dash = {"q": None, "k": "7 4", "v": "2 3"}.get(e["receiver"][-1]) if "." in e["receiver"] else None
        assert line.get_attribute("stroke-dasharray") == dash, e
    nodes = [n.get_attribute("data-node") for n in browser.find_elements(By.CSS_SELECTOR, "#edge-graph g.node")]
    assert sorted(nodes) == sorted(["embed", "logits", "mlp0", "mlp1"] + [f"L{l}H{h}" for l in range(2) for h in range(3)])
    assert f"top 7 of {len(data['edges'])} edges" in browser.find_element(By.ID, "edges-note").text
    box = browser.find_element(By.ID, "edges-top")
    box.clear()
    box.send_keys("3")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#edge-graph line.edge")) == 3


def test_edges_of_another_model_or_not_json_write_no_page(tmp_path):
    ckpt = str(tmp_path / "m.safetensors")
    hl.TransformerLM(hl.ModelConfig(vocab_size=13, max_seq_len=16, d_model=24, layers=2, heads=3, d_ff=32)).save(ckpt)
    (tmp_path / "other.json").write_text(json.dumps(every_edge(3, 3)))
    (tmp_path / "bad.json").write_text("{\"edges\": [")
    for name, message in (("other.json", "edges of 3 layers x 3 heads, the model has 2 x 3"), ("bad.json", "not JSON")):
        r = view("--checkpoint", ckpt, "--tokens", "1 2", "--edges", str(tmp_path / name), "--out", str(tmp_path / "v.html"))
        assert r.returncode != 0 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
        assert not os.path.exists(tmp_path / "v.html")
