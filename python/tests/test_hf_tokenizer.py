"""hl.Tokenizer with Hugging Face tokenizer.json files, exact against the tokenizers library itself
(its Node binding, the npm package @anush008/tokenizers, fetched once per build tree and run
under node): for each kind (byte-level BPE with GPT-NeoX's, Qwen2's and Llama 3's split patterns;
SentencePiece-style BPE with byte fallback, as Llama 2, Mistral and Gemma lay it out) a tokenizer.json
written by hf_tokenizer_files.py, a few hundred hostile strings encoded with and without the
special tokens and decoded; round trips; the refusals. Skips, saying why, when npm cannot fetch the
package or node is missing."""
import json
import os
import random
import re
import shutil
import subprocess
import unicodedata

import pytest

import headlab as hl
import hf_tokenizer_files as files
from test_tokenizer import comparison_strings

HEADLAB = os.environ.get("HEADLAB_BINARY", "headlab")
BUILD = os.path.dirname(os.path.abspath(HEADLAB))
PACKAGE = "@anush008/tokenizers@0.6.0"  # pinned: the tokenizers library the expectations come from
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def library():
    """build/npm/hf-tokenizers/node_modules/@anush008/tokenizers (installed once)."""
    prefix = os.path.join(BUILD, "npm", "hf-tokenizers")
    module = os.path.join(prefix, "node_modules", "@anush008", "tokenizers")
    if not shutil.which("node") and not shutil.which("nodejs"):
        pytest.skip("node is not installed (Debian's nodejs): cannot run the tokenizers library's Node binding")
    if os.path.isfile(os.path.join(module, "package.json")):
        return module
    npm = shutil.which("npm")
    if not npm:
        pytest.skip(f"npm is not installed (Debian's npm): cannot fetch {PACKAGE}")
    os.makedirs(prefix, exist_ok=True)
    try:
        r = subprocess.run([npm, "install", "--prefix", prefix, "--no-audit", "--no-fund", "--no-save", PACKAGE],
                           capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.skip(f"npm install {PACKAGE} took more than 240 s (no network?)")
    if r.returncode != 0 or not os.path.isfile(os.path.join(module, "package.json")):
        pytest.skip(f"npm install {PACKAGE} failed (no network or registry?): {(r.stderr or r.stdout).strip()[-300:]}")
    return module


def reference(library, tokenizer_json, texts, tmp_path, id_lists=()):
    """The library's encodings of texts, and its decodes of id_lists."""
    src, ids = tmp_path / "texts.json", tmp_path / "ids.json"
    src.write_text(json.dumps(texts), encoding="utf-8")
    ids.write_text(json.dumps(list(id_lists)), encoding="utf-8")
    node = shutil.which("node") or shutil.which("nodejs")
    r = subprocess.run([node, os.path.join(HERE, "hf_tokenizers_reference.js"), library, tokenizer_json, str(src), str(ids)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    return out["texts"], out["decoded"]


SPECIALS = ["<|endoftext|>", "<|padding|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|eot_id|>", "<s>", "</s>",
            "<unk>", "<bos>", "<eos>", "<pad>", "[WORD]", "[INST]", "   ", "<|mask|>"]


def hostile_strings():
    """GPT-2's comparison strings, then each kind's added tokens inside words, at the ends and
    side by side, and text the Prepend / Metaspace handling treats apart (leading spaces)."""
    extra = []
    for s in SPECIALS:
        extra += [s, "a" + s + "b", " " + s + " x", s + s, "word" + s + "word " + s, "\n" + s + "\n", s[:-1], s[1:]]
    extra += ["<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", "[INST] What's 2+2? [/INST] 4</s>",
              "<s>[INST]x[/INST]", "▁already▁metaspace", "▁", "▁▁ ▁", " leading", "  two", "\u00e9 vs e\u0301",
              "ﬁ ligature ① circled", "Å Å", "한국어 ᄒᆞᆫ", "1 22 333 4444 55555 666666", "'S 'LL 'Re", "a\r\nb\rc",
              "x\u0085y", "\u2000\u2001spaces", "a \u3000<|mask|>\u00a0 b", "\t<|mask|>\n", "x  <|mask|><|mask|>  y", "😀" * 5, "🏳️‍🌈 👩🏽‍💻", "ZWJ\u200d\u200d"]
    return comparison_strings() + extra


@pytest.mark.parametrize("kind", sorted(files.KINDS))
def test_same_ids_and_text_as_the_tokenizers_library(kind, library, tmp_path):
    path = files.write(kind, str(tmp_path / kind))
    tok = hl.Tokenizer.load(str(tmp_path / kind))
    texts = hostile_strings()
    assert len(texts) > 400
    rng = random.Random(1)  # any ids, specials included: every decoder step, cut characters, U+FFFD
    id_lists = [[rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 8))] for _ in range(300)]
    double = tok.token_to_id("▁▁")  # "▁▁" first and later: where the decoders differ
    if double is not None:
        id_lists += [[double], [double, double], [tok.token_to_id("a"), double], [double, tok.token_to_id("<0x41>")]]
    expected, decoded = reference(library, path, texts, tmp_path, id_lists)
    wrong = [(ids, d) for ids, d in zip(id_lists, decoded) if tok.decode(ids) != d]
    assert not wrong, f"{kind}: {len(wrong)} of {len(id_lists)} id lists decode differently, e.g. {wrong[:3]}"
    wrong = [(t, tok.encode(t), e["ids"]) for t, e in zip(texts, expected) if tok.encode(t) != e["ids"]]
    assert not wrong, f"{kind}: {len(wrong)} of {len(texts)} differ (add_special_tokens), e.g. {wrong[:3]}"
    wrong = [(t, e["plain"]) for t, e in zip(texts, expected) if tok.encode(t, add_special_tokens=False) != e["plain"]]
    assert not wrong, f"{kind}: {len(wrong)} of {len(texts)} differ (no special tokens), e.g. {wrong[:3]}"
    wrong = [(t, e["decoded"]) for t, e in zip(texts, expected) if tok.decode(e["plain"]) != e["decoded"]]
    assert not wrong, f"{kind}: {len(wrong)} of {len(texts)} decode differently, e.g. {wrong[:3]}"
    # the comparison can fail: the expectations are long and use merges, added tokens and fallbacks
    assert sum(len(e["plain"]) for e in expected) > 3000
    assert len({i for e in expected for i in e["plain"]}) > 200
    # decode(encode(s)) == s where the tokenizer promises it: byte-level BPE keeps every byte of
    # an NFC text without lstrip/rstrip tokens; the SentencePiece layouts keep a text without added tokens or "▁" (the space
    # their encoding adds at the start is stripped again)
    for t in texts:
        keeps = unicodedata.normalize("NFC", t) == t if kind in ("neox", "qwen2") else True
        keeps = keeps and "<|mask|>" not in t  # it takes the spaces around it
        if kind in ("llama2", "metaspace", "gemma"):
            keeps = not any(s in t for s in SPECIALS + ["▁"]) and (kind == "llama2" or not t.startswith(" "))
        if keeps:
            assert tok.decode(tok.encode(t, add_special_tokens=False)) == t, (kind, t)


def test_what_the_files_say_about_bos_and_specials(tmp_path):
    for kind in files.KINDS:
        files.write(kind, str(tmp_path / kind))
    neox, llama3, llama2 = (hl.Tokenizer.load(str(tmp_path / k)) for k in ("neox", "llama3", "llama2"))
    assert neox.special_tokens == ["<|endoftext|>", "<|padding|>"] and neox.bos_token_id is None
    assert llama3.bos_token_id == llama3.token_to_id("<|begin_of_text|>") == llama3.encode("")[0]
    assert llama2.bos_token_id == 1 and llama2.encode("hi")[0] == 1 and llama2.encode("hi", add_special_tokens=False)[0] != 1
    assert llama2.decode([1, *llama2.encode("hi there", add_special_tokens=False)], skip_special_tokens=True) == "hi there"
    assert llama2.token_text(llama2.token_to_id("<0x0A>")) == "\\n"  # a fallback byte shown as its byte
    assert neox.token_text(neox.token_to_id("Ġ")) == " " and "tokenizer.json BPE" in repr(neox)
    # tokenizer_config.json: Pythia's bos_token serves prepend_bos; add_eos_token appends </s>
    (tmp_path / "neox" / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|endoftext|>"}))
    assert hl.Tokenizer.load(str(tmp_path / "neox")).bos_token_id == 0
    config = {"add_bos_token": True, "add_eos_token": True, "bos_token": "<s>", "eos_token": "</s>"}
    (tmp_path / "llama2" / "tokenizer_config.json").write_text(json.dumps(dict(config, tokenizer_class="LlamaTokenizerFast")))
    ids = hl.Tokenizer.load(str(tmp_path / "llama2")).encode("hi")
    assert ids[0] == 1 and ids[-1] == 2
    # a class that does not rebuild its post-processor from the flags keeps the file's template
    (tmp_path / "llama2" / "tokenizer_config.json").write_text(json.dumps(dict(config, tokenizer_class="PreTrainedTokenizerFast")))
    assert hl.Tokenizer.load(str(tmp_path / "llama2")).encode("hi")[-1] != 2


def refusal(tmp_path, name, edit):
    d = tmp_path / name
    j = files.KINDS["llama2"]()
    edit(j)
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps(j) if isinstance(j, dict) else j, encoding="utf-8")
    with pytest.raises(ValueError) as e:
        hl.Tokenizer.load(str(d))
    return str(e.value)


def test_refusals_name_the_field_and_cause(tmp_path):
    m = refusal(tmp_path, "unigram", lambda j: j["model"].update(type="Unigram"))
    assert 'tokenizer.json: the model type "Unigram" is not supported' in m and "\n" not in m
    m = refusal(tmp_path, "wordpiece", lambda j: j["model"].update(type="WordPiece"))
    assert 'the model type "WordPiece" is not supported' in m
    m = refusal(tmp_path, "merge", lambda j: j["model"]["merges"].insert(3, "zz\u2581 q\u00e9x"))
    assert 'tokenizer.json: model.merges[3]: the token "zz\u2581" is not in model.vocab' in m
    m = refusal(tmp_path, "made", lambda j: j["model"]["vocab"].pop("\u2581t" if "\u2581t" in j["model"]["vocab"] else "th"))
    assert "model.merges[" in m and "which is not in model.vocab" in m
    m = refusal(tmp_path, "pre", lambda j: j.update(pre_tokenizer={"type": "BertPreTokenizer"}))
    assert 'pre_tokenizer: the pre-tokenizer type "BertPreTokenizer" is not supported' in m
    m = refusal(tmp_path, "norm", lambda j: j.update(normalizer={"type": "Sequence", "normalizers": [{"type": "Lowercase"}]}))
    assert 'normalizer.normalizers[0]: the normalizer type "Lowercase" is not supported' in m
    m = refusal(tmp_path, "dec", lambda j: j.update(decoder={"type": "WordPiece"}))
    assert 'decoder: the decoder type "WordPiece" is not supported' in m
    d = tmp_path / "broken"
    d.mkdir()
    (d / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {"a": 0}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken/tokenizer.json: not JSON"):
        hl.Tokenizer.load(str(d))


def test_text_task_and_view_take_a_tokenizer_json(tmp_path):
    files.write("llama3", str(tmp_path / "tok"))
    tok = hl.Tokenizer.load(str(tmp_path / "tok"))
    text = files.CORPUS * 4
    data = tmp_path / "book.txt"
    data.write_text(text, encoding="utf-8")
    task = hl.Task("text", data=str(data), tokenizer=str(tmp_path / "tok"), length=8)
    assert task.vocab_size == tok.vocab_size
    assert task.token_text(tok.token_to_id("Ġthe")) == " the"
    out = tmp_path / "run"
    r = subprocess.run([HEADLAB, "train", "--task", "text", "--data", str(data), "--tokenizer", str(tmp_path / "tok"),
                        "--d-model", "16", "--layers", "1", "--heads", "2", "--d-ff", "32", "--length", "8", "--batch", "4",
                        "--eval-size", "4", "--steps", "2", "--threads", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    page = tmp_path / "page.html"
    r = subprocess.run([HEADLAB, "view", str(out), "--text", "the quick fox", "--out", str(page)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    labels = [json.loads(m) for m in re.findall(r'"tokens":(\[.*?\])', page.read_text(encoding="utf-8"))]
    assert labels[0] == [tok.token_text(i) for i in tok.encode("the quick fox")]  # its BOS, then the tokens' text
    assert labels[0][0] == "<|begin_of_text|>" and " quick" in labels[0]
    # a Hugging Face model directory with tokenizer.json beside config.json: model.tokenizer,
    # to_tokens with its BOS, to_str_tokens; dla --text and view --text encode with it
    hf = tmp_path / "hf"
    r = subprocess.run([HEADLAB, "export", str(out), "--out", str(hf)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    shutil.copy(tmp_path / "tok" / "tokenizer.json", hf / "tokenizer.json")
    model = hl.TransformerLM.load(str(hf))
    assert "tokenizer.json BPE" in repr(model.tokenizer)
    assert model.to_tokens("the quick fox").tolist() == [tok.encode("the quick fox")]
    assert model.to_tokens("the quick fox", prepend_bos=False).tolist() == [tok.encode("the quick fox", add_special_tokens=False)]
    assert model.to_str_tokens("the quick fox")[:2] == ["<|begin_of_text|>", "t"]
    r = subprocess.run([HEADLAB, "dla", "--checkpoint", str(hf), "--text", "the quick brown fox", "--out", str(tmp_path / "dla")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    dla = json.loads((tmp_path / "dla" / "dla.json").read_text())
    # every position but the last is attributed its next token: <|begin_of_text|> and the text's
    assert dla["positions"] + 1 == len(tok.encode("the quick brown fox")) == 1 + len(tok.encode("the quick brown fox", False))
