"""TransformerLens's conveniences on :class:`TransformerLM` that are plain Python over the
library's calls: ``model.hooks(...)`` as a ``with`` block, and text through the model's
tokenizer (``to_tokens``, ``to_str_tokens``, ``to_string``, ``to_single_token``; ``model(text)``,
``run_with_cache``, ``run_with_hooks`` and ``generate`` take a string or a list of strings).

The model's tokenizer: ``model.tokenizer``, set by ``TransformerLM.load`` from a GPT-2
directory's tokenizer files (or assigned: ``model.tokenizer = hl.Tokenizer.load(dir)``). A model
of 256 tokens without one reads text as its UTF-8 bytes, as the byte-level tasks do.
"""
import contextlib
import functools

import numpy as np

from ._core import ActivationCache, TransformerLM
from .factored import _ov, _qk

_BOS = "<|endoftext|>"


@contextlib.contextmanager
def hooks(self, fwd_hooks=(), bwd_hooks=(), reset_hooks_end=True):
    """``with model.hooks(fwd_hooks=[(name, fn)], bwd_hooks=[...]):`` every forward of the model in
    the block (``model(ids)``, ``loss``, ``run_with_cache``, ``run_with_hooks``) runs the hooks.

    ``fn(activation, name)`` returns None or a replacement of the same shape (the activation is
    read-only: edit a copy). On leaving the block the hooks added by it are removed (those added
    before stay); ``reset_hooks_end=False`` keeps them until ``model.reset_hooks()``.
    """
    kept = {attr: list(getattr(self, attr, [])) for attr in ("_fwd_hooks", "_bwd_hooks")}
    try:
        for name, fn in fwd_hooks:
            self.add_hook(name, fn, "fwd")
        for name, fn in bwd_hooks:
            self.add_hook(name, fn, "bwd")
        yield self
    finally:
        if reset_hooks_end:
            self.reset_hooks()
            for attr, before in kept.items():
                if before:
                    setattr(self, attr, before)


def tensor_hook(fn):
    """A hook ``fn(activation, name)`` that receives the activation as an :class:`hl.Tensor` in the
    autograd graph: the expression it returns (``2 * x``, ``x - mean``) is differentiable, so
    gradients flow back through it to what made ``x``. ``x`` is a copy in the graph: an edit in place
    cannot change what the model keeps, and one the hook does not return raises. A plain hook gets a read-only NumPy array
    and its returned array is a constant to autograd (no gradient reaches what is upstream)."""
    @functools.wraps(fn)
    def hook(x, name):
        return fn(x, name)
    hook._headlab_as_tensor = True
    return hook


def _tokenizer(self, what):
    tok = getattr(self, "tokenizer", None)
    if tok is None and self.cfg.d_vocab != 256:
        raise ValueError(f"{what}: the model has no tokenizer (model.tokenizer = hl.Tokenizer.load(dir)) and is not "
                         f"byte-level (256 tokens; it has {self.cfg.d_vocab})")
    return tok


def _bos_id(tok, what):
    # the tokenizer's BOS: GPT-2's <|endoftext|>, a tokenizer.json's post-processor or config bos_token
    bos = getattr(tok, "bos_token_id", None) if tok is not None else None
    if bos is None:
        raise ValueError(f"{what}: prepend_bos=True, but the model's tokenizer has no BOS token ({_BOS} or bos_token)")
    return bos


def to_tokens(self, input, prepend_bos=None, padding_side=None):
    """Token ids (1, T) of a string, or (B, T) of a list of strings.

    ``prepend_bos``: None = the tokenizer's BOS first when it has one (``tok.bos_token_id``: GPT-2's
    ``<|endoftext|>`` as TransformerLens does, a tokenizer.json's ``<s>`` or ``<|begin_of_text|>``),
    none for a byte-level model; True requires that token.

    ``padding_side``: None = the texts must have one token length; ``"right"`` or ``"left"`` pads
    the shorter ones on that side and returns ``(ids, attention_mask)`` (1 = token, 0 = padding)
    for ``model(ids, attention_mask=mask)``. TransformerLens derives the mask from a pad token in
    the forward; headlab returns it, since a byte-level model has no token free for padding.
    Padding is the BOS token when the tokenizer has one, else id 0 (never attended to).
    """
    if padding_side not in (None, "right", "left"):
        raise ValueError(f"to_tokens: padding_side must be 'right', 'left' or None, got {padding_side!r}")
    tok = _tokenizer(self, "to_tokens")
    texts = [input] if isinstance(input, str) else list(input)
    has_bos = tok is not None and getattr(tok, "bos_token_id", None) is not None
    bos = None
    if prepend_bos or (prepend_bos is None and has_bos):
        bos = _bos_id(tok, "to_tokens")
    rows = []
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"to_tokens: expected a str or a list of str, got {type(text).__name__}")
        ids = tok.encode(text, add_special_tokens=False) if tok is not None else list(text.encode("utf-8"))
        rows.append(([bos] if bos is not None else []) + list(ids))
    lengths = [len(r) for r in rows]
    if padding_side is None:
        if len(set(lengths)) > 1:
            raise ValueError("to_tokens: the texts have different token lengths (%s); pad them with "
                             "padding_side='right' or 'left' (which returns ids and attention_mask)"
                             % ", ".join(str(n) for n in lengths))
        return np.array(rows, dtype=np.int64)
    if min(lengths, default=0) == 0:
        raise ValueError("to_tokens: a text has no token (an empty string without prepend_bos)")
    pad = _bos_id(tok, "to_tokens") if has_bos else 0
    T = max(lengths)
    ids = np.full((len(rows), T), pad, dtype=np.int64)
    mask = np.zeros((len(rows), T), dtype=np.int64)
    for i, r in enumerate(rows):
        cols = slice(0, len(r)) if padding_side == "right" else slice(T - len(r), T)
        ids[i, cols] = r
        mask[i, cols] = 1
    return ids, mask


def to_string(self, tokens):
    """The text of token ids: a str for (T) ids, a list of str for (B, T)."""
    tok = _tokenizer(self, "to_string")
    a = np.asarray(tokens)
    if a.ndim == 2:
        return [to_string(self, row) for row in a]
    ids = [int(i) for i in a.reshape(-1)]
    if tok is not None:
        return tok.decode(ids)
    return bytes(ids).decode("utf-8", errors="replace")


def to_str_tokens(self, input, prepend_bos=None):
    """Each token's text: of a string (tokenized as ``to_tokens`` does) or of (T) / (1, T) ids."""
    tok = _tokenizer(self, "to_str_tokens")
    ids = to_tokens(self, input, prepend_bos)[0] if isinstance(input, str) else np.asarray(input).reshape(-1)
    if tok is not None:
        return [tok.decode([int(i)]) for i in ids]
    return [bytes([int(i)]).decode("utf-8", errors="replace") for i in ids]


def to_single_token(self, string):
    """The id of a string that is one token (TransformerLens's ``to_single_token``)."""
    ids = to_tokens(self, string, prepend_bos=False)[0]
    if len(ids) != 1:
        raise ValueError(f"to_single_token: {string!r} is {len(ids)} tokens, not one")
    return int(ids[0])


def _is_text(x):
    return isinstance(x, str) or (isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(t, str) for t in x))


def _takes_text(method, side, decode=False):
    """``method`` also taking text as its first argument, as TransformerLens's forward does: a string
    or a list of strings tokenized by ``to_tokens``, padded on ``side`` with the attention_mask
    passed when their lengths differ. ``decode``: the output ids back to text (generate)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if not args or not _is_text(args[0]):
            return method(self, *args, **kwargs)
        texts = [args[0]] if isinstance(args[0], str) else list(args[0])
        ids, mask = to_tokens(self, texts, padding_side=side)
        if (mask == 0).any() and kwargs.get("attention_mask") is None:
            kwargs["attention_mask"] = mask
        out = method(self, ids, *args[1:], **kwargs)
        if not decode:
            return out
        text = to_string(self, out)  # padding included, as the ids
        return text[0] if isinstance(args[0], str) else text
    return call


for _f in (hooks, to_tokens, to_string, to_str_tokens, to_single_token):
    setattr(TransformerLM, _f.__name__, _f)
for _name in ("__call__", "forward", "run_with_cache", "run_with_hooks"):
    setattr(TransformerLM, _name, _takes_text(getattr(TransformerLM, _name), "right"))
def _takes_tl_generate_keywords(method):
    """generate also taking TransformerLens's ``verbose`` and ``use_past_kv_cache``, which change
    nothing here: headlab's generate shows no bar and always decodes with its KV cache."""
    @functools.wraps(method)
    def call(self, *args, verbose=None, use_past_kv_cache=None, **kwargs):
        return method(self, *args, **kwargs)
    return call


TransformerLM.generate = _takes_text(_takes_tl_generate_keywords(TransformerLM.generate), "left", decode=True)


def items(self):
    """(name, activation) of every cached hook, as a dict's items (TransformerLens's cache.items())."""
    return [(name, self[name]) for name in self.keys()]


def values(self):
    """Every cached activation, in the order of keys()."""
    return [self[name] for name in self.keys()]


ActivationCache.items = items
ActivationCache.values = values
TransformerLM.tokenizer = property(
    lambda self: self.__dict__.get("_tokenizer"),
    lambda self, tok: self.__dict__.__setitem__("_tokenizer", tok),
    doc="The model's tokenizer (hl.Tokenizer) or None: set by TransformerLM.load from a GPT-2 directory, or assigned")
TransformerLM.OV = property(_ov, doc="Each head's OV circuit W_V @ W_O as a FactoredMatrix [n_layers, n_heads, d_model, d_model]")
TransformerLM.QK = property(_qk, doc="Each head's QK circuit W_Q @ W_K^T as a FactoredMatrix [n_layers, n_heads, d_model, d_model]")
