"""The tutorial notebooks of docs/tutorials run green through a real Jupyter kernel (Debian's
python3-nbclient and python3-ipykernel), their key outputs are what the tutorials say, and the
induction notebook, turned into HTML (python3-nbconvert), shows its inline head view in headless
Chromium, where hovering a token shows its weights.

Run by ctest as `notebooks` (once per test command, not under every OpenBLAS kernel set)."""
import base64
import html
import json
import os
import re
import shutil
import warnings

import numpy as np
import pytest

pytestmark = pytest.mark.notebooks
nbformat = pytest.importorskip("nbformat", reason="Debian's python3-nbformat is not installed")
nbclient = pytest.importorskip("nbclient", reason="Debian's python3-nbclient is not installed")

TUTORIALS = os.path.join(os.environ.get("HEADLAB_SOURCE_DIR", "."), "docs", "tutorials")


def run_notebook(name, tmp_path):
    nb = nbformat.read(os.path.join(TUTORIALS, name), as_version=4)
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # the kernel's debugger note about frozen modules
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    text, html_outputs = "", []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out["output_type"] != "error", f"{name}: {out.get('ename')}: {out.get('evalue')}"
            if out["output_type"] == "stream" and out["name"] == "stdout":
                text += out["text"]
            if "data" in out and '<iframe class="headlab-view" srcdoc=' in str(out["data"].get("text/html", "")):
                html_outputs.append(out["data"]["text/html"])  # the inline views (not the progress display)
    return nb, text, html_outputs


def number(pattern, text):
    m = re.search(pattern, text)
    assert m, f"not in the notebook's output: {pattern}\n{text[-2000:]}"
    return float(m.group(1))


@pytest.fixture(scope="module")
def induction(tmp_path_factory):
    return run_notebook("induction.ipynb", tmp_path_factory.mktemp("induction"))


def test_the_induction_tutorial_forms_and_finds_the_circuit(induction):
    _, text, frames = induction
    assert number(r"token accuracy (\d\.\d+)", text) >= 0.9
    assert number(r"previous-token head: L0H\d \((\d\.\d+)\)", text) >= 0.5
    assert number(r"induction head: L1H\d \((\d\.\d+)\)", text) >= 0.4
    # two detector grids, the head view, the patching grid and one head's attribution per token
    assert len(frames) == 5
    # the answer's logit is written directly by a layer-1 (induction) head
    assert re.search(r"largest direct attribution: L1H\d", text), text[-1500:]
    # the previous-token head composes with the induction head's keys more than random weights do
    assert number(r"K-composition L0H\d -> L1H\d: (\d\.\d+)", text) > number(r"in \[\d\.\d+, (\d\.\d+)\]\)", text)


def test_the_head_count_tutorial_compares_sizes_and_prunes(tmp_path):
    _, text, frames = run_notebook("head_count.ipynb", tmp_path)
    for heads in (1, 2, 4):
        assert number(rf"{heads} head\(s\): token accuracy (\d\.\d+)", text) > 0.5
    pruned = number(r"pruned -> token accuracy (\d\.\d+)", text)
    assert pruned < number(r"\(unpruned (\d\.\d+)\)", text)
    assert len(frames) == 1


def test_the_gradients_tutorial_reads_the_atlas(tmp_path):
    _, text, _ = run_notebook("gradients.ipynb", tmp_path)
    assert "640 rows: 40 logged steps x 4 heads x 4 matrices" in text
    assert len(re.findall(r"L\dH\d: W_K gradient norm peaks at step \d+", text)) == 4


# ---- the executed notebook as HTML, in a real browser --------------------------------------------

def test_the_converted_notebook_shows_the_head_view_and_hovering_shows_weights(induction, tmp_path):
    nbconvert = pytest.importorskip("nbconvert", reason="Debian's python3-nbconvert is not installed")
    webdriver = pytest.importorskip("selenium.webdriver", reason="Debian's python3-selenium is not installed")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.skip("chromium and chromium-driver are not installed")

    nb, _, frames = induction
    with warnings.catch_warnings():  # Debian's nbconvert calls a deprecated nbformat argument
        warnings.simplefilter("ignore", DeprecationWarning)
        body, _ = nbconvert.HTMLExporter().from_notebook_node(nb)
    page = tmp_path / "induction.html"
    page.write_text(body, encoding="utf-8")
    # the head view's own data, to compare what the page shows with
    head_view = html.unescape(re.search(r'srcdoc="([^"]*)"', frames[2]).group(1))
    data = json.loads(re.search(r'<script id="headlab-data" type="application/json">(.*?)</script>', head_view, re.S).group(1))
    ex, L, H = data["examples"][0], data["layers"], data["heads"]
    raw = np.frombuffer(base64.b64decode(ex["patterns"]), dtype="<u2") / 65535
    tri, i = ex["T"] * (ex["T"] + 1) // 2, 20

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,900",
              "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    try:
        driver.get("file://" + str(page))
        iframes = driver.find_elements(By.TAG_NAME, "iframe")
        assert len(iframes) == 5
        driver.execute_script("arguments[0].scrollIntoView()", iframes[2])  # the mouse reaches only what is on screen
        driver.switch_to.frame(iframes[2])
        WebDriverWait(driver, 30).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
        assert driver.find_element(By.TAG_NAME, "body").get_attribute("class") == "compact"
        Select(driver.find_element(By.ID, "layer")).select_by_value("1")
        token = driver.find_element(By.CSS_SELECTOR, f'#left-tokens .tok[data-index="{i}"]')
        ActionChains(driver).move_to_element(token).perform()
        shown = [[float(c.text) for c in driver.find_elements(By.CSS_SELECTOR, f'#weights td[data-head="{h}"]')] for h in range(H)]
    finally:
        driver.quit()
    want = [[raw[(1 * H + h) * tri + i * (i + 1) // 2 + j] for j in range(i + 1)] for h in range(H)]
    assert np.abs(np.array(shown) - np.array(want)).max() <= 0.0005 + 1e-9


def test_the_transformerlens_names_tutorial_uses_them(tmp_path):
    _, text, frames = run_notebook("transformerlens_names.ipynb", tmp_path)
    assert "n_layers 2, n_heads 4, d_head 8, d_vocab 13" in text
    assert "headlab.ActivationCache(6 activations" in text and "blocks.1.attn.hook_pattern: (2, 4, 12, 12)" in text
    assert "pattern rows sum to 1: True" in text and "gradient at hook_q of layer 1: (2, 12, 4, 8)" in text
    assert "the loss is the next tokens' cross-entropy: True" in text
    assert "W_Q (2, 4, 32, 8) W_O (2, 4, 8, 32) W_E (13, 32) W_U (32, 13)" in text
    assert "einsum with W_Q gives hook_q: True" in text
    assert "W_in (2, 32, 64) W_out (2, 64, 32) ; einsum with W_in gives hook_pre: True" in text
    assert number(r"the last position's logits moved by (\d+\.\d+)", text) > 0
    assert "earlier positions unchanged: True" in text and "hooks removed after the block: True" in text
    assert re.search(r"greedy: \[(\d+, ){10}\d+\]", text) and "sampled twice alike: True" in text
    assert "padded rows as alone (left, right): True True" in text and "generated as alone: True" in text
    assert "detector scores of the padded batch are the mean of each row's alone: True" in text
    assert "OV of L1H0: shape (32, 32), rank 8; norm and singular values as the dense product: True True" in text
    assert "gradient through 2 * x is twice the one at the replacement: True" in text
    assert "a constant replacement passes no gradient: True" in text
    assert len(frames) == 1
