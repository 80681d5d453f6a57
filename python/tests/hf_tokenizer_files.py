"""tokenizer.json files of each kind headlab reads, written from scratch: a small BPE trained here
on a fixed corpus (merges by pair count), laid out as the tokenizers library writes them for
GPT-NeoX/Pythia, Qwen2, Llama 3 (byte-level BPE with their split patterns) and Llama 2/TinyLlama,
Mistral (SentencePiece-style BPE with byte fallback). Used by test_hf_tokenizer.py."""
import collections
import json
import re

# The pre-tokenizers' split patterns, as in the models' published tokenizer.json files.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
                 r"\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
                  r"\s+(?!\S)|\s+")

CORPUS = """The quick brown fox jumps over the lazy dog. It's the induction head that copies the
token after the previous occurrence; they're attention heads, and we've seen them form. I'll say
it: don't think they'd stop. Numbers 1234567890 and 3.14159, 2,718, 1e10 appear in 2024 and 1999.
def forward(self, x):
    return self.attn(x) + x  # residual
Naïve café owners in Zürich; résumé, façade, Ångström. Привет, мир! Γειά σου κόσμε. 你好世界。
    indented    lines	with	tabs
and trailing spaces   
""" * 3


def byte_symbols():
    """GPT-2's byte-to-unicode map (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def train_merges(words, n_merges):
    """BPE merges of lists of symbols: the most frequent adjacent pair first (ties: the smaller
    pair), each merge applied everywhere before the next is counted."""
    words = collections.Counter(tuple(w) for w in words if w)
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = collections.Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += c
        words = merged
    return merges


def added(id, content, special, normalized=None):
    return {"id": id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def byte_level(kind, n_merges=300):
    """A byte-level BPE tokenizer.json: kind "neox" (GPT-2's pattern inside ByteLevel, NFC, added
    whitespace-run tokens), "qwen2" (Split with Qwen2's pattern, NFC, merges as pairs, an lstrip/rstrip token) or "llama3"
    (Split with Llama 3's pattern, ignore_merges, <|begin_of_text|> prepended)."""
    sym = byte_symbols()
    words = [[sym[b] for b in w.encode()] for w in re.findall(r" ?\S+|\s+", CORPUS)]
    merges = train_merges(words, n_merges)
    specials = {"neox": ["<|endoftext|>", "<|padding|>"], "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]}[kind]
    vocab = {}
    if kind == "neox":  # GPT-NeoX's specials come first
        for s in specials:
            vocab[s] = len(vocab)
    for b in range(256):
        vocab[sym[b]] = len(vocab)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    added_tokens = []
    if kind != "neox":
        for s in specials:
            vocab[s] = len(vocab)
    for s in specials:
        added_tokens.append(added(vocab[s], s, True))
    if kind == "qwen2":  # a special token that takes the spaces on both sides with it
        vocab["<|mask|>"] = len(vocab)
        added_tokens.append(dict(added(vocab["<|mask|>"], "<|mask|>", True), lstrip=True, rstrip=True))
    # added tokens that are not special: NeoX's whitespace runs (normalized) and one matched raw
    for content, normalized in (("   ", True), ("[WORD]", False)):
        vocab[content] = len(vocab)
        added_tokens.append(added(vocab[content], content, False, normalized))
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
             "fuse_unk": False, "byte_fallback": False, "vocab": vocab}
    if kind == "neox":
        model["merges"] = [f"{a} {b}" for a, b in merges]
        normalizer, pre, post = {"type": "NFC"}, bl, bl
    else:
        model["merges"] = [[a, b] for a, b in merges]
        pattern = QWEN2_PATTERN if kind == "qwen2" else LLAMA3_PATTERN
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            dict(bl, use_regex=False)]}
        normalizer = {"type": "NFC"} if kind == "qwen2" else None
        post = dict(bl, trim_offsets=False)
        if kind == "llama3":
            model["ignore_merges"] = True
            bos = "<|begin_of_text|>"
            post = {"type": "Sequence", "processors": [post, {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos: {"id": bos, "ids": [vocab[bos]], "tokens": [bos]}}}]}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens, "normalizer": normalizer,
            "pre_tokenizer": pre, "post_processor": post, "decoder": bl, "model": model}


def sentencepiece(kind, n_merges=300):
    """A SentencePiece-style BPE tokenizer.json with byte fallback: kind "llama2" (TinyLlama/Llama
    2: Prepend + Replace normalizer, <s> prepended, the Replace/ByteFallback/Fuse/Strip decoder),
    "metaspace" (the Metaspace pre-tokenizer and decoder) or "gemma" (Replace
    normalizer without a prefix, Split(" ", MergedWithPrevious), <bos> prepended, no Strip).
    Characters the corpus lacks (emoji, CJK beyond it) become <0xXX> tokens."""
    sp = "\u2581"
    text = CORPUS.replace(" ", sp)
    words = [list(w) for w in re.findall(sp + "?[^" + sp + "]+|" + sp, sp + text)]
    merges = train_merges(words, n_merges)
    names = ["<pad>", "<eos>", "<bos>", "<unk>"] if kind == "gemma" else ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(names)}
    unk, bos = names[-1] if kind == "gemma" else names[0], names[2] if kind == "gemma" else names[1]
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in sorted(set(text) | {sp}):
        vocab.setdefault(ch, len(vocab))
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    vocab.setdefault(sp + sp, len(vocab))  # no merge makes it; decoding its id shows how "▁" is read
    added_tokens = [added(i, t, True, False) for i, t in enumerate(names)]
    vocab["[INST]"] = len(vocab)
    added_tokens.append(added(vocab["[INST]"], "[INST]", False, False))
    model = {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None, "end_of_word_suffix": None,
             "fuse_unk": True, "byte_fallback": True, "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]}
    post = {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [vocab[bos]], "tokens": [bos]}}}
    if kind == "llama2":
        normalizer = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": sp},
                                                          {"type": "Replace", "pattern": {"String": " "}, "content": sp}]}
        pre = None
        decoder = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": sp}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    elif kind == "gemma":
        normalizer = {"type": "Replace", "pattern": {"String": " "}, "content": sp}
        pre = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
        decoder = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": sp}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]}
    else:
        normalizer = None
        pre = {"type": "Metaspace", "replacement": sp, "prepend_scheme": "first", "split": False}
        decoder = {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"}, {"type": "Metaspace", "replacement": sp, "prepend_scheme": "first", "split": False}]}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens, "normalizer": normalizer,
            "pre_tokenizer": pre, "post_processor": post, "decoder": decoder, "model": model}


KINDS = {"neox": lambda: byte_level("neox"), "qwen2": lambda: byte_level("qwen2"), "llama3": lambda: byte_level("llama3"),
         "llama2": lambda: sentencepiece("llama2"), "metaspace": lambda: sentencepiece("metaspace"),
         "gemma": lambda: sentencepiece("gemma")}


def write(kind, directory):
    """Writes KINDS[kind]'s tokenizer.json into directory; returns its path."""
    import os
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(KINDS[kind](), f, ensure_ascii=False, indent=1)
    return path
