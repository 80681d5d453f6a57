"""Progress of Trainer.run(), fed by its step and evaluation callbacks (the C++ library prints
nothing; this is the Python door's own display).

Three places, chosen when the run starts:

- a Jupyter cell: one bar that updates in place (IPython's ``display(..., display_id=True)``
  and ``handle.update``), and under it at the end the run's final table; the evaluations go to
  the run's log (``out/metrics.jsonl``), not under the bar, or, for a run without a log, into a
  folded list under the bar (a ``<details>`` element; the text form lists them after the table);
- a terminal (stderr is a tty): one ``\\r`` line redrawn at most ten times a second;
- anything else (a log, a pipe): one line per evaluation, nothing per step.
"""
import html
import sys
import time


def notebook_display():
    """IPython's ``display`` when running inside a Jupyter kernel, else None (IPython is not
    imported here: in a kernel it already is)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        shell = ipython.get_ipython()
    except Exception:  # an IPython too old or half set up: no notebook display
        return None
    if shell is None or "IPKernelApp" not in getattr(shell, "config", {}):
        return None  # plain IPython in a terminal: the \r line works there
    from IPython.display import display
    return display


def _bar(step, total, width):
    done = int(width * step / max(total, 1))
    return "#" * done + "." * (width - done)


def eval_line(step, total, ev):
    """One evaluation as the log shows it."""
    return (f"step {step}/{total}  held-out loss {ev['loss']:.4f}  "
            f"token_acc {100 * ev['token_acc']:.2f}%  exact {100 * ev['exact_match']:.2f}%")


def notice(line):
    """A line of what a run chose (threads, snapshots' disk): on stderr as the command line says it,
    but in a notebook a plain line on stdout (Jupyter shows stderr in red, as for an error)."""
    print(line, file=sys.stdout if notebook_display() is not None else sys.stderr, flush=True)


def final_table(result):
    """(metric, value) rows of a finished run, as `headlab train` prints them."""
    ev = result["final_eval"]
    rows = [("steps", str(result["steps"])), ("train time", f"{result['wall_s']:.1f} s"),
            ("held-out loss", f"{ev['loss']:.6f}"), ("token accuracy", f"{100 * ev['token_acc']:.2f}%"),
            ("exact match (teacher-forced)", f"{100 * ev['exact_match']:.2f}%")]
    first = result["first_step_99"]
    rows += [("first step >= 99% token acc", str(first) if first >= 0 else "never"), ("parameters", str(result["params"]))]
    return rows


class _Cell:
    """What a notebook shows: HTML for the cell, text for consoles and tests."""

    def __init__(self, text, fraction, table=(), evals=()):
        self.text, self.fraction, self.table, self.evals = text, fraction, list(table), list(evals)

    def __repr__(self):
        width = max((len(k) for k, _ in self.table), default=0)
        return "\n".join([self.text] + [f"{k:<{width}}  {v}" for k, v in self.table] + self.evals)

    def _repr_html_(self):
        pct = f"{100 * self.fraction:.1f}%"
        rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in self.table)
        table = f"<table>{rows}</table>" if rows else ""
        evals = ""
        if self.evals:
            lines = "<br>".join(html.escape(e) for e in self.evals)
            evals = f"<details><summary>{len(self.evals)} evaluations</summary>{lines}</details>"
        return (f"<div style='font-family:monospace'>"
                f"<progress value='{self.fraction:.4f}' max='1' style='width:20em'></progress> {pct} "
                f"{html.escape(self.text)}{table}{evals}</div>")


class Progress:
    """Training progress for ``total`` steps; ``enabled`` False shows nothing.

    ``display``: the notebook's display function (found when None; tests give a fake one);
    ``stream``: where the terminal line and the log lines go (stderr when None). ``logged``: the
    run writes its evaluations to a log (``out``); without one a notebook keeps them under the bar.
    """

    def __init__(self, total, enabled, display=None, stream=None, min_interval=0.1, logged=True):
        self.total, self.enabled = total, bool(enabled)
        self.stream = stream if stream is not None else sys.stderr
        self.display = (display if display is not None else notebook_display()) if self.enabled else None
        self.mode = ("off" if not self.enabled else "notebook" if self.display is not None
                     else "tty" if _isatty(self.stream) else "log")
        self.min_interval = min_interval
        self.last_draw = None  # monotonic time of the last redraw
        self.handle = None     # the notebook's display handle
        self.acc = None
        self.last_step = (0, total, float("nan"), 0.0)
        self.logged = logged
        self.evals = []  # the evaluation lines a notebook shows folded (a run without a log)

    def _text(self, step, total, loss, tokens_per_s):
        acc = "-" if self.acc is None else f"{100 * self.acc:.2f}%"
        return (f"train [{_bar(step, total, 30)}] {step}/{total} loss {loss:.4f} acc {acc} "
                f"{tokens_per_s / 1000:.1f}k tok/s")

    def step(self, step, total, loss, tokens_per_s):
        self.last_step = (step, total, loss, tokens_per_s)
        if self.mode not in ("notebook", "tty"):
            return
        now = time.monotonic()
        if self.last_draw is not None and now - self.last_draw < self.min_interval and step != total:
            return
        self.last_draw = now
        self._draw(step, total, loss, tokens_per_s)

    def _draw(self, step, total, loss, tokens_per_s, table=()):
        text = self._text(step, total, loss, tokens_per_s)
        if self.mode == "notebook":
            cell = _Cell(text, step / max(total, 1), table, self.evals)
            if self.handle is None:
                self.handle = self.display(cell, display_id=True)
            else:
                self.handle.update(cell)
        else:
            self.stream.write("\r" + text)
            if step == total:
                self.stream.write("\n")
            self.stream.flush()

    def eval(self, step, ev):
        self.acc = ev["token_acc"]
        line = eval_line(step, self.total, ev)
        if self.mode == "log":
            print(line, file=self.stream, flush=True)
        elif self.mode == "notebook":
            if not self.logged:  # no run log to hold it: folded under the bar
                self.evals.append(line)
            self._draw(*self.last_step)  # the bar's accuracy

    def finish(self, result):
        """The run's final table: in a notebook under the bar, in the same cell."""
        if self.mode == "notebook":
            self._draw(*self.last_step, table=final_table(result))


def _isatty(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
