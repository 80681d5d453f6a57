"""What an SAE's features mean from Python: the source-position attribution's identity against
the SAE's own encoder in NumPy, top examples against the cached hook_z, the ablation splice, the
decoder match of an SAE with itself, and the feature view page holding the numbers."""
import json
import re

import numpy as np
import pytest

import headlab as hl


def tiny(seed=0):
    cfg = dict(d_model=16, n_layers=2, n_heads=4, d_mlp=32, d_vocab=11, n_ctx=16)
    return hl.TransformerLM(hl.ModelConfig(**cfg), seed=seed)


IDS = np.random.default_rng(0).integers(0, 11, size=(8, 12))
HOOK = "blocks.1.attn.hook_z"


@pytest.fixture(scope="module")
def model_and_sae():
    m = tiny()
    sae = hl.train_sae(m, HOOK, IDS, architecture="topk", expansion=2, k=3, steps=40, batch=32, lr=1e-2, warmup=5, buffer=96)
    return m, sae


def encoded(m, sae, ids):
    _, cache = m.run_with_cache(ids)
    x = np.asarray(cache[HOOK]).reshape(-1, 16).astype(np.float64)
    pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
    return pre, np.asarray(sae.encode(x.astype(np.float32)))


def test_source_attribution_sums_to_the_pre_activation(model_and_sae):
    m, sae = model_and_sae
    pre, f = encoded(m, sae, IDS[:3])
    for j in (0, 5):
        a = hl.feature_attribution(m, sae, IDS[:3], j)
        assert a["contribution"].shape == (3, 12, 4, 12)
        total = a["contribution"].sum(axis=(2, 3)) + a["bias"]
        np.testing.assert_allclose(total.reshape(-1), pre[:, j], atol=1e-5)
        np.testing.assert_allclose(a["activation"].reshape(-1), f[:, j], atol=0)
        assert np.all(np.triu(a["contribution"].sum(axis=2)[0], 1) == 0)  # no source after the query
    assert hl.feature_head_outputs(m, sae).shape == (32, 4, 16)
    le = hl.feature_logit_effects(m, sae, [0], scale=hl.feature_final_scale(m, IDS), top_k=3)[0]
    assert le["promoted"][0] == int(np.argmax(le["logits"])) and le["suppressed"][0] == int(np.argmin(le["logits"]))


def test_top_examples_presence_and_ablation(model_and_sae):
    m, sae = model_and_sae
    _, f = encoded(m, sae, IDS)
    f = f.reshape(8, 12, -1)
    live = int(np.argmax((f > 0).mean(axis=(0, 1))))
    top = hl.top_activating_examples(m, sae, IDS, [live], k=2, before=3, after=1)[0]["examples"]
    assert top[0]["max_activation"] == pytest.approx(float(f[:, :, live].max()), abs=0)
    e = top[0]
    assert e["tokens"] == [int(t) for t in IDS[e["row"], e["window_start"]:e["position"] + 2]]
    p = hl.feature_presence(m, sae, IDS)
    np.testing.assert_allclose(p["firing_frequency"], (f > 0).mean(axis=(0, 1)), atol=1e-12)
    targets = np.roll(IDS, -1, axis=1)
    ab = hl.feature_ablation(m, sae, hl.Batches(IDS, targets), [live])
    assert ab["base_loss"] == pytest.approx(hl.evaluate(m, hl.Batches(IDS, targets)).loss, abs=1e-6)
    assert ab["loss_change"][0] != 0


def test_matching_an_sae_with_itself_and_the_feature_view(model_and_sae, tmp_path):
    m, sae = model_and_sae
    r = hl.match_sae_features(sae, sae)
    assert r["partner"] == list(range(32)) and r["mean_cosine"] == pytest.approx(1.0, abs=1e-6)
    v = hl.feature_view(m, sae, IDS, features=[1, 2], examples=2, tokens=lambda i: f"t{i}")
    data = json.loads(re.search(r'<script id="headlab-data" type="application/json">(.*?)</script>', v.html, re.S).group(1))
    assert [c["feature"] for c in data["features"]] == [1, 2]
    assert "http" not in v.html.replace("http-equiv", "")  # nothing fetched
    p = hl.feature_presence(m, sae, IDS)
    assert data["features"][0]["firing_frequency"] == pytest.approx(p["firing_frequency"][1])
    assert len(data["features"][0]["head_fraction"]) == 4
    v.save(tmp_path / "f.html")


def test_the_feature_view_renders_in_chromium_without_errors(model_and_sae, tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (Debian's python3-selenium)")
    import shutil
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.skip("chromium and chromium-driver are not installed")
    m, sae = model_and_sae
    path = hl.feature_view(m, sae, IDS, features=[1, 2], examples=2, tokens=lambda i: f"<t{i}>").save(tmp_path / "f.html")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    try:
        d.get("file://" + str(path))
        WebDriverWait(d, 30).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
        assert [e for e in d.get_log("browser") if e["level"] in ("SEVERE", "WARNING")] == []
        cards = d.find_elements(By.CSS_SELECTOR, ".card")
        assert [c.get_attribute("id") for c in cards] == ["feature-1", "feature-2"]
        assert len(d.find_elements(By.CSS_SELECTOR, "table.heads tr")) == 2 * 5  # a title row and 4 heads each
        toks = d.find_elements(By.CSS_SELECTOR, ".ex .tok")
        assert toks and all(t.text.startswith("<t") for t in toks)  # token text shown literally
        assert d.find_elements(By.CSS_SELECTOR, "script:not([id])")[0] is not None
    finally:
        d.quit()
