"""Inline views (hl.view, hl.token_view, hl.grid_view): the page holds the model's attention
patterns, the notebook's HTML is an isolated iframe holding exactly the page, nothing is fetched,
and in a real browser hovering a token inside the iframe shows its weights."""
import base64
import html
import json
import os
import re
import shutil

import numpy as np
import pytest

import headlab as hl


def small_model(vocab=20, layers=2, heads=3, seed=0):
    return hl.TransformerLM(hl.ModelConfig(vocab_size=vocab, layers=layers, heads=heads, d_model=24, d_ff=32), seed)


def page_data(page):
    m = re.search(r'<script id="headlab-data" type="application/json">(.*?)</script>', page, re.S)
    assert m, "no data element"
    return json.loads(m.group(1))


def patterns_of(example, layers, heads):
    """The page's quantised patterns back as (layers, heads, T, T) (0 above the diagonal)."""
    raw = np.frombuffer(base64.b64decode(example["patterns"]), dtype="<u2").astype(np.float64) / 65535
    T = example["T"]
    out, k = np.zeros((layers, heads, T, T)), 0
    for l in range(layers):
        for h in range(heads):
            for i in range(T):
                out[l, h, i, :i + 1] = raw[k:k + i + 1]
                k += i + 1
    assert k == raw.size
    return out


def test_the_view_holds_the_models_patterns_for_each_form_of_input():
    m = small_model()
    ids = np.random.default_rng(0).integers(0, 20, size=(3, 11))
    names = [f"blocks.{l}.attn.hook_pattern" for l in range(2)]
    _, cache = m.run_with_cache(ids, names_filter=names)
    want = np.stack([np.asarray(cache[n]) for n in names], axis=1)  # (N, L, H, T, T)
    for data, rows in ((ids, 3), (ids[1], 1), (ids.tolist(), 3)):
        v = hl.view(m, data)
        d = page_data(v.html)
        assert d["compact"] is True and d["layers"] == 2 and d["heads"] == 3
        assert len(d["examples"]) == rows
        for k, ex in enumerate(d["examples"]):
            row = k if rows == 3 else 1
            assert ex["tokens"] == [str(int(t)) for t in ids[row]]
            got = patterns_of(ex, 2, 3)
            assert np.abs(got - want[row]).max() <= 0.5 / 65535 + 1e-7
    # at most `examples` rows, and token texts given by a function
    d = page_data(hl.view(m, ids, examples=2, tokens=lambda i: f"t{i}").html)
    assert len(d["examples"]) == 2 and d["examples"][0]["tokens"][0] == f"t{ids[0, 0]}"


def test_a_task_or_its_batches_give_its_rows_with_its_token_names():
    task = hl.Task("copy", alphabet=10)
    m = small_model(vocab=13)
    d = page_data(hl.view(m, task, examples=2).html)
    held = task.held_out(n=2, batch=2)[0]["input_ids"]
    assert len(d["examples"]) == 2
    assert d["examples"][0]["tokens"] == [task.token_text(int(t)) for t in held[0]]
    assert d["examples"][0]["tokens"][0] == "BOS"
    d2 = page_data(hl.view(m, task.held_out(n=2, batch=2), task=task).html)
    assert d2["examples"] == d["examples"]


def test_text_needs_a_byte_model_and_shows_bytes():
    with pytest.raises(ValueError, match="256"):
        hl.view(small_model(), "hello")
    d = page_data(hl.view(small_model(vocab=256), "a <b>").html)
    assert d["examples"][0]["tokens"] == ["a", " ", "<", "b", ">"]


def test_bad_input_is_refused_with_a_clear_message():
    m = small_model()
    with pytest.raises(hl.HeadlabError, match="outside the vocabulary"):
        hl.view(m, [1, 2, 99])
    with pytest.raises(TypeError, match="integers"):
        hl.view(m, np.zeros(4))
    with pytest.raises(ValueError, match="shape"):
        hl.view(m, np.zeros((2, 2, 2), np.int64))
    with pytest.raises(ValueError, match="2 token texts for 3 tokens"):
        hl.view(m, [1, 2, 3], tokens=["a", "b"])
    with pytest.raises(hl.HeadlabError, match="max_seq_len"):
        hl.view(m, np.zeros(m.config.n_ctx + 1, np.int64))
    with pytest.raises(hl.HeadlabError, match="one value per token"):
        hl.token_view(["a", "b"], [1.0])
    with pytest.raises(ValueError, match="rows, cols"):
        hl.grid_view([1.0, 2.0])


def test_the_notebook_html_is_an_isolated_iframe_holding_the_page_and_fetches_nothing(tmp_path):
    v = hl.view(small_model(), np.arange(8))
    frame = v._repr_html_()
    # the frame, after the notebook side of the pages' size messages (no network either)
    m = re.fullmatch(r'<script>[^<]*</script><iframe class="headlab-view" srcdoc="([^"]*)" style="[^"]*" '
                     r'sandbox="allow-scripts"></iframe>', frame)
    assert m, frame[:200]
    assert html.unescape(m.group(1)) == v.html
    # nothing from the network: no external script, style, image or font
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', v.html)
    assert "@import" not in v.html and "url(http" not in v.html
    # the same page saved whole
    path = v.save(tmp_path / "view.html")
    assert open(path, encoding="utf-8").read() == v.html
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".view-")]
    assert os.stat(path).st_mode & 0o777 == 0o644  # readable by others, as the command's pages


def test_view_save_never_replaces_a_device_a_fifo_or_a_link(tmp_path):
    import stat
    v = hl.view(small_model(), np.arange(8))
    os.mkfifo(tmp_path / "fifo.html")
    nodes = {"fifo.html": stat.S_ISFIFO}
    if os.geteuid() == 0:  # a character device of our own (the numbers of /dev/null), never /dev itself
        os.mknod(tmp_path / "dev.html", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        nodes["dev.html"] = stat.S_ISCHR
    (tmp_path / "secret").write_text("secret")
    os.symlink(tmp_path / "secret", tmp_path / "link.html")
    nodes["link.html"] = stat.S_ISLNK
    for name, is_kind in nodes.items():
        with pytest.raises(ValueError, match=re.escape(name) + ".*not a regular file"):
            v.save(tmp_path / name)
        assert is_kind(os.lstat(tmp_path / name).st_mode), name
    assert (tmp_path / "secret").read_text() == "secret"


def test_small_views_carry_their_values():
    t = hl.token_view(["a", "</script>", "c"], [0.25, -1.0, float("nan")], title="loss", value_name="nats")
    d = page_data(t.html)
    assert d["kind"] == "tokens" and d["tokens"] == ["a", "</script>", "c"] and d["values"] == [0.25, -1.0, None]
    assert "</script>\"" not in t.html  # the token is escaped inside the script element
    scores = np.array([[0.1, 0.9], [-0.5, np.inf]])
    d = page_data(hl.grid_view(scores, title="induction", row_labels=["a", "b"]).html)
    assert d["rows"] == 2 and d["cols"] == 2 and d["values"] == [0.1, 0.9, -0.5, None]
    assert d["row_labels"] == ["a", "b"] and d["col_labels"] == ["H0", "H1"]


# ---- in a real browser -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (Debian's python3-selenium)")
    from selenium.webdriver.chrome.service import Service
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.skip("chromium and chromium-driver are not installed")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,900",
              "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    yield d
    d.quit()


def test_hovering_a_token_in_the_inline_view_shows_its_weights(browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    m = small_model()
    ids = np.random.default_rng(1).integers(0, 20, size=9)
    host = tmp_path / "notebook_like.html"
    host.write_text("<!DOCTYPE html><html><body><h1>a notebook</h1>" + hl.view(m, ids)._repr_html_() + "</body></html>")
    browser.get("file://" + str(host))
    frame = browser.find_element(By.TAG_NAME, "iframe")
    browser.switch_to.frame(frame)
    try:
        WebDriverWait(browser, 30).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
        ActionChains(browser).move_to_element(browser.find_element(By.CSS_SELECTOR, '#left-tokens .tok[data-index="4"]')).perform()
        shown = [[float(c.text) for c in browser.find_elements(By.CSS_SELECTOR, f'#weights td[data-head="{h}"]')] for h in range(3)]
    finally:
        browser.switch_to.default_content()
    _, cache = m.run_with_cache(ids, names_filter=["blocks.0.attn.hook_pattern"])
    want = np.asarray(cache["blocks.0.attn.hook_pattern"])[0, :, 4, :5]  # (H, keys 0..4)
    assert np.abs(np.array(shown) - want).max() <= 0.0005 + 1e-6, (shown, want)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


def test_a_grid_of_more_than_125k_values_renders(browser, tmp_path):
    # Math.min(...values) over a page's values overflowed the stack above about 125k of them
    scores = np.arange(360 * 360, dtype=np.float64).reshape(360, 360) - 1000
    page = tmp_path / "grid.html"
    page.write_text(hl.grid_view(scores, value_name="score").html)
    browser.get("file://" + str(page))
    legend = browser.execute_script("return document.getElementById('legend').textContent")
    assert legend == "score: -1000 .. 128600 (red > 0, blue < 0, white 0)"  # 128599 to 4 digits
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_grid_colour_scales_with_vmin_vmax_and_diverging_values(browser, tmp_path):
    def backgrounds(v):
        page = tmp_path / "scale.html"
        page.write_text(v.html)
        browser.get("file://" + str(page))
        cells = browser.execute_script(
            "return [...document.querySelectorAll('td')].map(td => getComputedStyle(td).backgroundColor)")
        return cells, browser.execute_script("return document.getElementById('legend').textContent")

    faint = np.array([[0.03, 0.0]])
    # its own scale: 0.03 is the grid's maximum and as red as any maximum
    assert backgrounds(hl.grid_view(faint))[0] == ["rgb(255, 51, 51)", "rgb(255, 255, 255)"]
    # one scale for several grids: 0.03 of 0..1 is nearly white
    cells, legend = backgrounds(hl.grid_view(faint, vmin=0, vmax=1))
    assert cells == ["rgb(255, 249, 249)", "rgb(255, 255, 255)"]
    assert legend == "score: 0 .. 0.03 (red > 0, blue < 0, white 0); colour scale 0 .. 1"
    # signed values: diverging around 0, clamped to the bounds
    cells, _ = backgrounds(hl.grid_view([[-0.5, 0.5, 3.0]], vmin=-1, vmax=1))
    assert cells == ["rgb(153, 153, 255)", "rgb(255, 153, 153)", "rgb(255, 51, 51)"]
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_colour_scale_bounds_are_checked():
    d = page_data(hl.grid_view([[1.0]], vmin=-2, vmax=2).html)
    assert (d["vmin"], d["vmax"]) == (-2, 2)
    assert page_data(hl.token_view(["a"], [1.0]).html)["vmin"] is None
    with pytest.raises(ValueError, match="grid view: give both vmin and vmax, or neither"):
        hl.grid_view([[1.0]], vmin=0)
    with pytest.raises(ValueError, match="token view: vmin 1 must be below vmax 1"):
        hl.token_view(["a"], [1.0], vmin=1, vmax=1)


def test_inline_views_are_sized_to_their_content(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    views = [hl.grid_view(np.arange(40 * 3, dtype=float).reshape(40, 3), height=200),  # taller than its start
             hl.view(small_model(), np.arange(6) % 20)]                                 # shorter than 720 px
    host = tmp_path / "notebook_like.html"
    host.write_text("<!DOCTYPE html><html><body>" + "".join(v._repr_html_() for v in views) + "</body></html>")
    browser.get("file://" + str(host))
    frames = browser.find_elements(By.TAG_NAME, "iframe")
    def inside(frame, script):
        browser.switch_to.frame(frame)
        try:
            return browser.execute_script(script)
        finally:
            browser.switch_to.default_content()

    def content(frame):
        return inside(frame, "return Math.ceil(document.body.getBoundingClientRect().bottom)")

    for frame, start in zip(frames, (200, 720)):
        # as a reader scrolls to it: Chromium lays out an offscreen frame of another origin only
        # once it is on screen (before, the page measured 0 and once shrank its frame to nothing)
        browser.execute_script("arguments[0].scrollIntoView()", frame)
        # the page may post its height more than once as it lays out (its ResizeObserver): wait for
        # the frame to fit the content, not for the first change
        WebDriverWait(browser, 30).until(lambda d: content(frame) <= frame.size["height"] <= content(frame) + 40)
        clipped = inside(frame, "return document.documentElement.scrollHeight > window.innerHeight")
        assert not clipped and frame.size["height"] != start + 2, (start, content(frame), frame.size)  # 2: the border
