"""headlab from Python: models, hooks, tasks, training and head analyses of the C++ library.

Arrays: ``np.asarray(t)`` of a :class:`Tensor` is a view of its float32 memory (writes show in
the tensor, the array keeps it alive); ``headlab.tensor(array)`` always copies (float64 is
rounded to float32; other dtypes raise ``TypeError``). Activations in a cache and in hooks are
read-only views. Errors from C++ are :class:`HeadlabError` (a ``ValueError``) with the same
one-line message as the command line.

See docs/python.md for a worked example.
"""

from . import _core
from ._arguments import install as _install_short_argument_errors

_install_short_argument_errors(_core)  # one line for arguments that do not convert, before the names are taken

from ._core import (  # noqa: F401,E402
    ActivationCache, Batches, HeadlabError, ModelConfig, NonFiniteError, Task, Tensor, TransformerLM,
    activation_patching, attention_statistics, composition_baseline, composition_scores, copying_score, corrupt_one_symbol,
    cross_entropy, detect_heads, edge_patching, evaluate, hungarian, match_heads, mean_activation, path_patching,
    permute_heads,
    get_act_name, grad_enabled, head_gradient_norms, head_importance, head_importance_per_token, hook_points, live_tensors,
    load_safetensors, num_threads,
    ov_eigenvalues, ov_singular_values, per_token_loss, prune_curve, qk_singular_values, repeated_random_tokens,
    set_num_threads, varied_repeat_probe, single_head_ablation, softmax, tensor, train_settings,
)
from ._core import head_analyses  # noqa: F401
from ._core import Tokenizer  # noqa: F401
from ._core import qk_attribution  # noqa: F401
from ._core import SAE, evaluate_sae, train_sae  # noqa: F401  (sparse autoencoders)
from ._core import (  # noqa: F401  (what an SAE's features mean)
    feature_ablation, feature_attribution, feature_final_scale, feature_head_outputs, feature_logit_effects,
    feature_presence, match_sae_features, top_activating_examples,
)
from ._core import precision  # noqa: F401  (with hl.precision("bf16"): ...)
from . import _core
from . import lens as _lens  # noqa: F401  (hooks(), to_tokens, to_str_tokens, to_string on TransformerLM)
from .factored import FactoredMatrix  # noqa: F401
from .lens import tensor_hook  # noqa: F401
from .progress import Progress, notice
from .results import (  # noqa: F401
    AblationResult, CompositionBaseline, CompositionScores, EdgeResult, EvalResult, HeadAnalysis, HeadGradientNorms,
    HeadMatch, HeadStats, KnockoutResult, PatchingInputs, PatchingResult, PathPatchingResult, PruneCurve, Result,
    ScoresOverTraining, TrainResult,
)
from .results import QkAttribution  # noqa: F401
from .views import View, feature_view, grid_view, token_view, view  # noqa: F401

__all__ = [
    "ActivationCache", "Batches", "HeadlabError", "ModelConfig", "NonFiniteError", "Task", "Tensor",
    "Trainer", "TransformerLM", "ablate", "ablation_hook", "activation_patching", "attention_statistics",
    "composition_baseline", "composition_scores", "corrupt_one_symbol", "mean_activation", "scores_over_training",
    "cross_entropy", "detect_heads", "edge_patching", "evaluate", "path_patching", "get_act_name", "grad_enabled",
    "hungarian",
    "match_heads", "permute_heads",
    "repeated_random_tokens", "varied_repeat_probe",
    "head_gradient_norms", "head_importance", "head_importance_per_token", "hook_points", "load_safetensors", "no_grad",
    "num_threads",
    "ov_eigenvalues", "ov_singular_values", "per_token_loss", "prune_curve", "qk_singular_values", "set_num_threads",
    "copying_score", "qk_attribution", "single_head_ablation", "softmax", "tensor", "train", "train_settings", "Tokenizer",
    "View", "view", "token_view", "grid_view",
    "FactoredMatrix", "tensor_hook", "head_analyses",
    "SAE", "evaluate_sae", "train_sae",
    "feature_ablation", "feature_attribution", "feature_final_scale", "feature_head_outputs", "feature_logit_effects",
    "feature_presence", "match_sae_features", "top_activating_examples", "feature_view",
    "precision",
    "QkAttribution",
    "Result", "AblationResult", "CompositionBaseline", "CompositionScores", "EdgeResult", "EvalResult", "HeadAnalysis",
    "HeadGradientNorms", "HeadMatch", "HeadStats", "KnockoutResult", "PatchingInputs", "PatchingResult",
    "PathPatchingResult", "PruneCurve", "ScoresOverTraining", "TrainResult",
]


class no_grad:
    """``with headlab.no_grad():`` no op inside records a graph (as torch.no_grad)."""

    def __enter__(self):
        self._guard = _core._NoGradGuard()
        return self

    def __exit__(self, *exc):
        del self._guard
        return False


def _trainer_field(name, doc):
    """A read-only attribute of Trainer that is its C++ trainer's."""
    return property(lambda self: getattr(self._t, name), doc=doc)


class Trainer:
    """Training with the command line's settings, by keyword (``d_model=32``, ``task="varcopy"``).

    ``train_settings()`` lists the keywords (the CLI's flags with ``_`` for ``-``); what is not
    given takes the CLI's default, and a task's preset applies as in ``headlab train``. Also:
    ``out`` (a run directory: checkpoints, metrics.jsonl, summary.json, as the CLI writes them),
    ``resume=True``, ``init`` (a checkpoint to start from), ``quiet=True`` (no progress bar by
    default), ``log_grads=N`` and ``dump_grads_at=[steps]`` (the gradient atlas, written to
    ``out`` as ``headlab train --log-grads`` writes it), ``snapshot_every=N`` and
    ``snapshot_at=[steps]`` (the full resume state kept as ``out/snapshots/step_NNNNNNNN.safetensors``,
    step 0 = the initial weights, as ``headlab train --snapshot-every`` keeps it), and for ``task="tokens"`` ``data`` /
    ``eval_data`` as a file name, an int array (N, T) of input_ids, or a dict with
    ``input_ids``, optional ``targets`` and ``loss_mask``. A counterfactual fork, as
    ``headlab train --fork RUN --at STEP``: ``fork=RUN, at=STEP`` (or ``fork_from``, a snapshot or
    checkpoint.safetensors with the training state; the settings come from it) with ``gate=["1.0=0"]``, ``freeze=["0.1"]``,
    ``reinit=["1.1"]`` (LAYER.HEAD) and ``out``.

    The run is planned as ``headlab train`` plans it (one library function): the same refusals
    in the same words, and without ``threads`` the busy-machine rule's count, said on stderr
    (``notices``) unless ``quiet``.

    ``run()`` trains to ``steps`` as ``headlab train`` does (the same numbers); ``step()`` takes
    one optimisation step for a loop of your own. A trainer does one or the other.
    """

    def __init__(self, quiet=False, **settings):
        self._quiet = bool(quiet)
        self._logged = settings.get("out") is not None  # evaluations go to out/metrics.jsonl
        self._t = _core._Trainer(**settings)
        if not self._quiet:  # what the run plan chose, as `headlab train` says it up front
            for line in self._t.notices:
                notice("headlab: " + line)

    @property
    def notices(self):
        """The lines the run plan said before the run (threads lowered on a busy machine, the
        snapshots' disk), shown unless ``quiet``."""
        return self._t.notices

    @property
    def snapshot_plan(self):
        """(steps, bytes_each): the snapshots this trainer will still write and the size of each."""
        return self._t.snapshot_plan

    def run(self, callback=None, progress=None):
        """Trains to ``steps``; returns a :class:`TrainResult` (final_eval, curve, steps, wall_s, ...).

        ``callback(step, total, loss, tokens_per_s)`` is called after every step. ``progress``
        (default: not ``quiet``): in a Jupyter cell a bar updated in place, on a terminal a
        ``\r`` line, elsewhere (logs) one line per evaluation (headlab.progress). Ctrl-C stops
        at the next step with the checkpoint written (when ``out`` is set) and raises
        KeyboardInterrupt; ``resume=True`` continues.
        """
        bar = Progress(self._t.args["steps"], not self._quiet if progress is None else progress,
                       logged=self._logged)

        def on_step(step, total, loss, tps):
            bar.step(step, total, loss, tps)
            if callback is not None:
                callback(step, total, loss, tps)

        result = self._t.run(on_step=on_step, on_eval=bar.eval)
        bar.finish(result)
        return result

    def step(self):
        """One optimisation step on the next training batch: returns (loss, gradient norm)."""
        return self._t.step()

    def evaluate(self, autoregressive=False):
        """Held-out loss, token accuracy and exact match of the current model."""
        return self._t.evaluate(autoregressive)

    def save(self, path):
        """Writes the model as a checkpoint the CLI reads (with the task's description)."""
        self._t.save(path)

    model = _trainer_field("model", "The model being trained (a TransformerLM)")
    task = _trainer_field("task", "The task it trains on (a Task)")
    held_out = _trainer_field("held_out", "The held-out Batches its evaluations read")
    args = _trainer_field("args", "The run's settings as the run directory records them (a dict)")
    steps_done = _trainer_field("steps_done", "Optimisation steps taken so far")


def train(callback=None, progress=True, **settings):
    """``headlab.train(d_model=32, steps=300)``: builds a Trainer, runs it, returns (trainer, result)."""
    t = Trainer(**settings)
    return t, t.run(callback=callback, progress=progress)


def scores_over_training(run, analysis="detect", examples=None, seed=1234, data=None, length=0, bos=None,
                         exclude_bos=False, exclude_current_token=False, normalize=False, task="copy", threads=None,
                         corrupt="source", out=None, quiet=False):
    """Each head's scores of ``analysis`` at every snapshot of ``run`` and at its final checkpoint, on the same
    inputs at each step: what ``headlab ANALYSIS --run RUN`` writes, without a loop of your own.

    ``analysis``: ``"detect"`` (previous_token, duplicate_token, induction), ``"patch"`` (exact,
    attribution), ``"importance"`` (Michel et al.), ``"dla"`` or ``"compose"`` (q/k/v_composition: the largest
    score into the head from the layer before; NaN in layer 0). ``examples`` defaults to the command's (detect,
    dla 200, patch 64, importance prune's --eval-size); ``seed``, ``data``, ``length``, ``bos``, ``exclude_bos``,
    ``exclude_current_token`` as detect's flags; ``normalize`` as prune's; ``corrupt`` as patch's
    (``"source"`` or ``"previous"``). ``data`` defaults to the command's: detect's ``"probe"``, patch's
    ``"task"``; ``"probe"`` patches the repeat probe, which any model reads (a Hugging Face model's revisions). Returns a :class:`ScoresOverTraining`: ``steps`` (S,),
    ``checkpoints`` (the file read at each step) and ``scores``: {name: array (S, layers, heads)}.
    ``out``: a directory to write ``ANALYSIS_over_training.csv`` and ``.json`` into, as the command does, or
    ``True`` for ``RUN/over_training/ANALYSIS``, where ``headlab view RUN``'s over-training panel reads them
    (the result then has ``out``). ``head_analyses()`` lists the analyses, their scores and defaults.
    A run keeps snapshots when trained with ``snapshot_every`` / ``snapshot_at``. ``threads`` defaults to 2, fewer
    when other processes keep cores busy, said as :class:`Trainer` says it (a line on stderr, in a notebook the
    cell's output) unless ``quiet``.
    """
    return _core._scores_over_training(str(run), analysis, examples, seed, data or "", length, -1 if bos is None else bos,
                                       exclude_bos, exclude_current_token, normalize, task, threads, corrupt, out,
                                       bool(quiet))


def ablate(model, data, hook, head=None, kind="zero", positions=None, mean_data=None, per_position=False, seed=0,
           permutation=None):
    """Ablate one hook point by name on held-out ``data`` (a :class:`Batches`) and compare with the clean run.

    ``kind``: ``"zero"``, ``"mean"`` (the mean over ``mean_data``, default ``data``; per position with
    ``per_position=True``, else over every position) or ``"resample"`` (example i takes example
    ``permutation[i]``'s activation; by default a random cycle from ``seed``). ``head``: one head of a
    hook with a head axis (None: all); ``positions``: a list (None: all; with a padded ``Batches``, a
    position counts each row's tokens from its first, as every analysis left-aligns its rows). Returns a :class:`KnockoutResult`: ``clean_loss``,
    ``ablated_loss``, ``clean_token_acc``, ``ablated_token_acc`` (floats, over every counted target),
    ``clean_losses``, ``ablated_losses``, ``clean_accs``, ``ablated_accs``, ``counted`` (arrays (N,), per
    example), ``ci95`` (95% bootstrap intervals (lo, hi), including the differences ``d_loss`` and
    ``d_token_acc``) and, for resample, ``permutation`` (N,).
    """
    positions = [] if positions is None else [int(p) for p in positions]
    return _core._ablate(model, data, hook, -1 if head is None else head, kind, positions, mean_data,
                         per_position, seed, list(permutation) if permutation is not None else [])


def ablation_hook(model, hook, kind="zero", head=None, positions=None, value=None):
    """A forward hook ``fn(activation, name)`` for ``model.run_with_hooks`` that ablates ``hook``.

    ``kind="zero"``: zeros. ``"mean"``: ``value`` from :func:`mean_activation` (broadcast over the batch,
    and the positions when averaged over them). ``"resample"``: ``value`` the same hook's activation on
    other prompts, of the activation's shape (e.g. from ``run_with_cache`` on them). Only ``head`` (None:
    all) and ``positions`` (None: all) are replaced; everything else is kept bit for bit.
    """
    import numpy as np
    if kind not in ("zero", "mean", "resample"):
        raise ValueError(f"unknown ablation kind '{kind}' (expected zero, mean or resample)")
    if kind == "zero":
        value = None
    elif value is None:
        raise ValueError(f"a {kind} ablation hook needs its value (mean_activation(...) or another prompt's activation)")
    config = model.config if isinstance(model, TransformerLM) else model
    head = -1 if head is None else head
    positions = [] if positions is None else [int(p) for p in positions]
    _core._check_ablation_site(config, hook, head, positions)  # a misspelt hook fails here, not in the forward

    def fn(activation, name):
        return np.asarray(_core._ablated_activation(config, hook, activation, head, positions, value))
    return fn
