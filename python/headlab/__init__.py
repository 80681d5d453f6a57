"""headlab from Python: models, hooks, tasks, training and head analyses of the C++ library.

Arrays: ``np.asarray(t)`` of a :class:`Tensor` is a view of its float32 memory (writes show in
the tensor, the array keeps it alive); ``headlab.tensor(array)`` always copies (float64 is
rounded to float32; other dtypes raise ``TypeError``). Activations in a cache and in hooks are
read-only views. Errors from C++ are :class:`HeadlabError` (a ``ValueError``) with the same
one-line message as the command line.

See docs/python.md for a worked example.
"""
import sys
import time

from ._core import (  # noqa: F401
    ActivationCache, Batches, HeadlabError, ModelConfig, NonFiniteError, Task, Tensor, TransformerLM,
    activation_patching, attention_statistics, composition_scores, cross_entropy, detect_heads, evaluate,
    grad_enabled, head_gradient_norms, head_importance, head_importance_per_token, hook_points, live_tensors, num_threads,
    ov_singular_values, prune_curve, qk_singular_values, repeated_random_tokens, set_num_threads, varied_repeat_probe,
    single_head_ablation, softmax, tensor, train_settings,
)
from ._core import Tokenizer  # noqa: F401
from . import _core
from .views import View, grid_view, token_view, view  # noqa: F401

__all__ = [
    "ActivationCache", "Batches", "HeadlabError", "ModelConfig", "NonFiniteError", "Task", "Tensor",
    "Trainer", "TransformerLM", "activation_patching", "attention_statistics", "composition_scores",
    "cross_entropy", "detect_heads", "evaluate", "grad_enabled", "repeated_random_tokens", "varied_repeat_probe",
    "head_gradient_norms", "head_importance", "head_importance_per_token", "hook_points", "no_grad", "num_threads",
    "ov_singular_values", "prune_curve", "qk_singular_values", "set_num_threads",
    "single_head_ablation", "softmax", "tensor", "train", "train_settings", "Tokenizer", "View", "view", "token_view", "grid_view",
]


class no_grad:
    """``with headlab.no_grad():`` no op inside records a graph (as torch.no_grad)."""

    def __enter__(self):
        self._guard = _core._NoGradGuard()
        return self

    def __exit__(self, *exc):
        del self._guard
        return False


class _Progress:
    """A progress bar on a terminal, a line per evaluation elsewhere (notebooks, logs)."""

    def __init__(self, total, enabled):
        self.total, self.enabled = total, enabled
        self.tty = enabled and sys.stderr.isatty()
        self.last_draw, self.acc = 0.0, None

    def step(self, step, total, loss, tokens_per_s):
        if not self.tty:
            return
        now = time.monotonic()
        if now - self.last_draw < 0.1 and step != total:
            return
        self.last_draw = now
        width = 30
        done = int(width * step / max(total, 1))
        acc = "-" if self.acc is None else f"{100 * self.acc:.2f}%"
        sys.stderr.write(f"\rtrain [{'#' * done}{'.' * (width - done)}] {step}/{total} "
                         f"loss {loss:.4f} acc {acc} {tokens_per_s / 1000:.1f}k tok/s")
        if step == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    def eval(self, step, ev):
        self.acc = ev["token_acc"]
        if self.enabled and not self.tty:
            print(f"step {step}/{self.total}  held-out loss {ev['loss']:.4f}  "
                  f"token_acc {100 * ev['token_acc']:.2f}%  exact {100 * ev['exact_match']:.2f}%",
                  file=sys.stderr, flush=True)


class Trainer:
    """Training with the command line's settings, by keyword (``d_model=32``, ``task="varcopy"``).

    ``train_settings()`` lists the keywords (the CLI's flags with ``_`` for ``-``); what is not
    given takes the CLI's default, and a task's preset applies as in ``headlab train``. Also:
    ``out`` (a run directory: checkpoints, metrics.jsonl, summary.json, as the CLI writes them),
    ``resume=True``, ``init`` (a checkpoint to start from), ``quiet=True`` (no progress bar by
    default), ``log_grads=N`` and ``dump_grads_at=[steps]`` (the gradient atlas, written to
    ``out`` as ``headlab train --log-grads`` writes it), and for ``task="tokens"`` ``data`` /
    ``eval_data`` as a file name, an int array (N, T) of input_ids, or a dict with
    ``input_ids``, optional ``targets`` and ``loss_mask``.

    ``run()`` trains to ``steps`` as ``headlab train`` does (the same numbers); ``step()`` takes
    one optimisation step for a loop of your own. A trainer does one or the other.
    """

    def __init__(self, quiet=False, **settings):
        self._quiet = bool(quiet)
        self._t = _core._Trainer(**settings)

    def run(self, callback=None, progress=None):
        """Trains to ``steps``; returns a dict (final_eval, curve, steps, wall_s, ...).

        ``callback(step, total, loss, tokens_per_s)`` is called after every step. Ctrl-C stops
        at the next step with the checkpoint written (when ``out`` is set) and raises
        KeyboardInterrupt; ``resume=True`` continues.
        """
        bar = _Progress(self._t.args["steps"], not self._quiet if progress is None else progress)

        def on_step(step, total, loss, tps):
            bar.step(step, total, loss, tps)
            if callback is not None:
                callback(step, total, loss, tps)

        return self._t.run(on_step=on_step, on_eval=bar.eval)

    def step(self):
        """One optimisation step on the next training batch: returns (loss, gradient norm)."""
        return self._t.step()

    def evaluate(self, autoregressive=False):
        """Held-out loss, token accuracy and exact match of the current model."""
        return self._t.evaluate(autoregressive)

    def save(self, path):
        """Writes the model as a checkpoint the CLI reads (with the task's description)."""
        self._t.save(path)

    @property
    def model(self):
        return self._t.model

    @property
    def task(self):
        return self._t.task

    @property
    def held_out(self):
        return self._t.held_out

    @property
    def args(self):
        return self._t.args

    @property
    def steps_done(self):
        return self._t.steps_done


def train(callback=None, progress=True, **settings):
    """``headlab.train(d_model=32, steps=300)``: builds a Trainer, runs it, returns (trainer, result)."""
    t = Trainer(**settings)
    return t, t.run(callback=callback, progress=progress)
