"""Views of heads for notebooks: the page of ``headlab view`` and two small views, shown inline.

Each function returns a :class:`View`: Jupyter displays it in the cell (an ``<iframe>`` whose
``srcdoc`` holds the whole page, so its script and style cannot touch the notebook's page, and no
network is needed), and ``view.save(path)`` writes the same page as a standalone HTML file.
"""
import html as _html
import os

import numpy as np

from . import _core


# The host side of the pages' size messages (views/pages.cpp post_height): the frame whose page sent
# the message takes its height. One listener per notebook page, set by the first view shown.
_RESIZE = ("<script>if(!window.__headlab_views){window.__headlab_views=1;window.addEventListener('message',e=>{"
           "const h=e.data&&e.data.headlab_height;if(!(h>0))return;"
           "for(const f of document.querySelectorAll('iframe.headlab-view'))"
           "if(f.contentWindow===e.source)f.style.height=Math.min(h,20000)+'px';});}</script>")


class View:
    """A self-contained HTML page: ``.html`` is the page, ``.save(path)`` writes it, and Jupyter
    shows it inline (``_repr_html_``) in an iframe sized to its content: the page reports its
    height to the notebook; ``height`` pixels until it does (or where scripts do not run)."""

    def __init__(self, page, height, notes=()):
        self.html, self.height, self.notes = page, int(height), list(notes)

    def _repr_html_(self):
        return (_RESIZE + f'<iframe class="headlab-view" srcdoc="{_html.escape(self.html, quote=True)}" '
                f'style="width: 100%; height: {self.height}px; border: 1px solid #ddd" sandbox="allow-scripts"></iframe>')

    def save(self, path):
        """Writes the page to ``path`` (whole or not at all) and returns the path. An existing
        ``path`` that is not a regular file (a device, a FIFO, a symbolic link) is refused."""
        path = os.fspath(path)
        _core._write_file_atomic(path, self.html)
        return path

    def __repr__(self):
        return f"<headlab View: {len(self.html)} bytes of HTML; .save(path) writes it>"


def _token_texts(ids, tokens, task, byte_text):
    if tokens is not None:
        if callable(tokens):
            return [str(tokens(int(i))) for i in ids]
        tokens = [str(t) for t in tokens]
        if len(tokens) != len(ids):
            raise ValueError(f"view: {len(tokens)} token texts for {len(ids)} tokens")
        return tokens
    if task is not None:
        return [task.token_text(int(i)) for i in ids]
    if byte_text:
        return [_core._byte_token_text(int(i)) for i in ids]
    return [str(int(i)) for i in ids]


def _rows(data, examples):
    """(name, ids) of the sequences to show: text, ids (T) or (N, T), Batches or a Task."""
    if isinstance(data, str):
        raw = data.encode("utf-8")
        if not raw:
            raise ValueError("view: the text is empty")
        return [("text", list(raw))], True
    if isinstance(data, _core.Task):
        data = data.held_out(n=examples, batch=examples)
    if isinstance(data, _core.Batches):
        return [(f"example {k}", r) for k, r in enumerate(_core._rows_of(data, examples))], False
    ids = np.asarray(data)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"view: token ids must be integers, got {ids.dtype}")
    if ids.ndim == 1:
        ids = ids[None, :]
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ValueError(f"view: token ids must be (T) or (N, T), got shape {ids.shape}")
    return [(f"example {k}", [int(v) for v in row]) for k, row in enumerate(ids[:examples])], False


def view(model, data, tokens=None, task=None, examples=4, title=None, height=720):
    """The head view of ``model`` on ``data`` (as ``headlab view`` draws it): for each example
    the attention of every head (lines between query and key tokens; hover a token for its
    weights) and every head's pattern as a thumbnail.

    data: a string (byte-level models: 256 tokens), token ids (T) or (N, T), ``Batches``, or a
    ``Task`` (its held-out rows). tokens: the text of each token (a list, or a function of the
    id); by default the task's names, bytes for text, else the ids. At most ``examples`` rows.
    """
    # a count of rows: ids[:-1] would silently drop the last row and 0 would make an empty page
    if isinstance(examples, bool) or not isinstance(examples, (int, np.integer)):
        raise TypeError(f"view: examples must be a whole number, got {type(examples).__name__}")
    if examples < 1:
        raise ValueError(f"view: examples must be at least 1, got {examples}")
    rows, byte_text = _rows(data, examples)
    if byte_text and model.config.d_vocab != 256:
        raise ValueError(f"view: text needs a byte-level model (256 tokens); this model has {model.config.d_vocab}")
    if isinstance(data, _core.Task) and task is None:
        task = data
    named = [(name, ids, _token_texts(ids, tokens, task, byte_text)) for name, ids in rows]
    c = model.config
    subtitle = f"{c.n_layers} layers x {c.n_heads} heads, d_model {c.d_model}; {len(named)} example(s)"
    page, notes = _core._head_view_page(model, named, title or "headlab view", subtitle, True)
    return View(page, height, notes)


_SCALE_DOC = """vmin, vmax: the colour scale's ends (both or neither; values beyond are clamped): the same
    bounds give several views one scale, so 0.03 and 0.95 differ in colour across grids. Without
    them the view's own range: diverging (white at 0, red above, blue below) when the values have
    both signs, white to red (or blue) when they have one, scaled by the largest |value|."""


def token_view(tokens, values, title="", value_name="value", height=None, vmin=None, vmax=None):
    """Tokens coloured by one value each (a loss, a direct logit attribution, a patching effect):
    red above 0, blue below, white at 0; hover a token for its value. tokens: a list of texts
    (or of ids); values: (T) numbers, NaN for none. """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"token_view: values must be one per token (T), got shape {values.shape}")
    tokens = [str(t) for t in tokens]
    page = _core._token_values_page(title, tokens, values.tolist(), value_name, vmin, vmax)
    return View(page, height or 90 + 26 * (1 + len(tokens) // 24))


def grid_view(scores, title="", value_name="score", row_labels=None, col_labels=None, height=None, vmin=None, vmax=None):
    """A grid of scores, e.g. layers x heads of a detector, importance or patching effect; hover a
    cell for its value. scores: (rows, cols); labels default to L0.. and H0.. """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2:
        raise ValueError(f"grid_view: scores must be (rows, cols), got shape {scores.shape}")
    rows, cols = scores.shape
    row_labels = [f"L{r}" for r in range(rows)] if row_labels is None else [str(r) for r in row_labels]
    col_labels = [f"H{c}" for c in range(cols)] if col_labels is None else [str(c) for c in col_labels]
    page = _core._grid_page(title, rows, cols, scores.ravel().tolist(), row_labels, col_labels, value_name, vmin, vmax)
    return View(page, height or 100 + 24 * rows)


token_view.__doc__ += _SCALE_DOC
grid_view.__doc__ += _SCALE_DOC


def feature_view(model, sae, data, features=None, task=None, tokens=None, top_features=8, examples=5, before=8, after=2,
                 ablate=True, title=None, height=720):
    """The feature view of an SAE's features on ``model`` over ``data`` (as ``headlab features``
    writes it): per feature its top-activating examples with tokens coloured by its activation,
    the source-position attribution of each example's largest activation, its decoder's split
    over the heads, the tokens its direct logit effect promotes and suppresses, and its ablation
    effect on the loss (``ablate``: one pass over data per feature).

    data: ``Batches`` or token ids (N, T). features: the features to show (default: the
    ``top_features`` most often firing). tokens: each token's text (a list over the vocabulary
    or a function of the id); by default the task's names, else the ids.
    """
    vocab = model.config.d_vocab
    if tokens is not None:
        texts = [str(tokens(i)) for i in range(vocab)] if callable(tokens) else [str(t) for t in tokens]
    elif task is not None:
        texts = [task.token_text(i) for i in range(vocab)]
    else:
        texts = [str(i) for i in range(vocab)]
    page = _core._feature_page(model, sae, data, [int(f) for f in (features or [])], int(top_features), int(examples),
                               int(before), int(after), bool(ablate), texts, title or "headlab features")
    return View(page, height)
