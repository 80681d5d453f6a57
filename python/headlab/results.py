"""The results of the analyses and of training: typed objects with named fields.

``r = hl.edge_patching(...)`` gives an :class:`EdgeResult`: ``r.exact`` (a NumPy array),
``r.clean_metric`` (a float), ``r.to_dict()`` (plain dicts all the way down), and a repr that
says what it holds. Each is also read as the dict earlier versions returned (``r["exact"]``,
``r.keys()``, ``dict(r)``, ``**r``), so code written against the dicts keeps working. Fields
are read-only.

The names are the C++ library's (``analysis/*.h``, ``train/trainer.h``), so a result has one
name in both doors.
"""
from collections.abc import Mapping

import numpy as np


def _float_text(x):
    """A float to 4 significant digits, always read as a float: 1.0 (not 1), 0.1235, 1.235e+04, nan."""
    s = f"{float(x):.4g}"
    return s if any(c in s for c in ".en") else s + ".0"  # 'e': exponent; 'n': nan, inf


def _short(v):
    """A field's value in a repr: arrays by shape and dtype, floats to 4 significant digits (with a
    decimal point), long lists by length."""
    if isinstance(v, np.ndarray):
        return f"array{v.shape} {v.dtype}"
    if isinstance(v, (float, np.floating)):
        return _float_text(v)
    if isinstance(v, np.integer):
        return str(int(v))
    if isinstance(v, (list, tuple)) and len(v) > 4:
        return f"[{len(v)} items]"
    if isinstance(v, dict) and not isinstance(v, Result):
        return "{" + ", ".join(f"{k}: {_short(x)}" for k, x in v.items()) + "}"
    return repr(v)


def _plain(v):
    if isinstance(v, Result):
        return v.to_dict()
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


class Result(Mapping):
    """Named fields, read as attributes (``r.loss``) or as a mapping (``r["loss"]``)."""

    __slots__ = ("_fields",)

    def __init__(self, **fields):
        object.__setattr__(self, "_fields", fields)

    def __getattr__(self, name):
        fields = object.__getattribute__(self, "_fields")
        if name in fields:
            return fields[name]
        raise AttributeError(f"{type(self).__name__} has no field '{name}' (fields: {', '.join(fields)})")

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is read-only (to_dict() gives a plain dict to change)")

    def __getitem__(self, key):
        try:
            return self._fields[key]
        except KeyError:
            raise KeyError(f"{type(self).__name__} has no field '{key}' (fields: {', '.join(self._fields)})") from None

    def __iter__(self):
        return iter(self._fields)

    def __len__(self):
        return len(self._fields)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._fields))

    def to_dict(self):
        """The fields as a plain dict (nested results as dicts too); arrays are the same objects."""
        return {k: _plain(v) for k, v in self._fields.items()}

    def __repr__(self):
        return f"{type(self).__name__}(" + ", ".join(f"{k}={_short(v)}" for k, v in self._fields.items()) + ")"


class EvalResult(Result):
    """Held-out evaluation (evaluate, Trainer.evaluate): loss, token_acc, exact_match (teacher-forced),
    ar_exact_match (with autoregressive=True), tokens and sequences counted."""


class TrainResult(Result):
    """Trainer.run(): final_eval (EvalResult), curve (an EvalResult with its step per evaluation), steps,
    wall_s, train_s, params, skipped_steps, first_step_99 (-1: never)."""


class AblationResult(Result):
    """single_head_ablation: d_loss, d_acc (zero ablation) and d_loss_mean, d_acc_mean (mean ablation),
    arrays (layers, heads) of the change from base (EvalResult)."""


class HeadStats(Result):
    """attention_statistics, arrays (layers, heads) over non-padding queries: entropy, entropy_norm,
    confidence, argmax_distance."""


class PruneCurve(Result):
    """prune_curve, one entry per step: fraction removed, loss, token_acc (arrays) and removed (the heads
    removed at each step, (layer, head) pairs)."""


class HeadGradientNorms(Result):
    """head_gradient_norms: grad_W_Q .. grad_W_O and weight_W_Q .. weight_W_O, arrays (layers, heads or kv heads)."""


class HeadMatch(Result):
    """match_heads: by, pairs (layer_a, head_a, layer_b, head_b, similarity), unmatched_a, unmatched_b,
    similarity (heads of A x heads of B, layer-major), mean_similarity."""


class PatchingResult(Result):
    """activation_patching(model, task, data): z_exact, z_attribution (layers, heads), resid_exact,
    resid_attribution (layers, positions), normalised clean = 1, corrupted = 0; clean_metric,
    corrupted_metric, z_correlation, resid_correlation; clean_ids, corrupted_ids."""


class PatchingInputs(Result):
    """corrupt_one_symbol: clean and corrupted ids (rows, T), answers (rows, 4) of (row, pos, clean token,
    corrupted token), source_pos (rows,): the position changed."""


class EdgeResult(Result):
    """edge_patching: senders, receivers (names, in edge order), exact, attribution, linearisation_error
    (arrays, one entry per edge), clean_metric, corrupted_metric."""


class QkAttribution(Result):
    """qk_attribution: components (names), pairs (C, C) [query side, key side] and score (the model's), both
    the mean or sum over sites (S, 3) of (row, query, key); query_totals, key_totals (C); aggregate, layer, head."""


class PathPatchingResult(Result):
    """path_patching: path, activation, clean_metric, corrupted_metric (floats)."""


class KnockoutResult(Result):
    """ablate: clean_loss, ablated_loss, clean_token_acc, ablated_token_acc (floats); clean_losses,
    ablated_losses, clean_accs, ablated_accs, counted (per example); ci95 (95% bootstrap intervals (lo, hi));
    permutation (resample)."""


class CompositionScores(Result):
    """composition_scores: q, k, v, arrays [head of layer_a][head of layer_b]."""


class CompositionBaseline(Result):
    """composition_baseline: q, k, v, each a dict with mean, lo and hi (the 2.5th and 97.5th percentiles)."""


class ScoresOverTraining(Result):
    """scores_over_training: steps (S,), checkpoints (the file read at each step), scores ({name: array
    (S, layers, heads)}), out (when files were written)."""


class HeadAnalysis(Result):
    """One row of head_analyses(): name, command, scores (the names of the grids it returns), help,
    default_examples."""
