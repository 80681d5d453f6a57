"""One line for a call whose arguments do not convert.

pybind11 answers a call that matches none of a binding's signatures with every signature and the
repr of every argument ("Invoked with: ..."), pages long for an array or a model. Each binding of
headlab._core (module functions and the classes' methods) is wrapped here once, at import: such a
TypeError becomes one line naming the function, the argument that did not convert, its Python
type and the type the binding takes. The wrapper keeps the binding as ``__wrapped__`` (its
signatures and docstring, which help() and the stub read).
"""
import functools
import numbers
import os
import re

_INCOMPATIBLE = re.compile(r"^[\w.]+\(\): incompatible (?:function|constructor) arguments")
_SIGNATURE = re.compile(r"^\s*\d+\. (?:[\w.]+)?\((.*)\)(?: -> .*)?$")


def _split(text):
    """'a: int, b: list[int] = [1, 2]' -> ['a: int', 'b: list[int] = [1, 2]'] (commas in brackets kept)."""
    out, depth, cur = [], 0, ""
    for ch in text + ",":
        depth += ch in "[(<{"
        depth -= ch in "])>}"
        if ch == "," and depth == 0:
            if cur.strip():
                out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out


def _params(sig):
    """[(name, type text, has default, kind)] of one signature; kind '', '*', '**' or the bare '*'."""
    out = []
    for p in _split(sig):
        if p in ("*", "/"):
            out.append((p, "", False, p))
            continue
        head, _, default = p.partition("=")
        name, _, typ = head.partition(":")
        name = name.strip()
        kind = "**" if name.startswith("**") else "*" if name.startswith("*") else ""
        out.append((name.lstrip("*"), typ.strip(), bool(default.strip()), kind))
    return out


def _accepts(typ, value, core):
    """Whether pybind11 could convert value to typ (as far as the type's name tells; unknown: yes)."""
    typ = typ.replace("headlab._core.", "").strip()
    m = re.fullmatch(r"(?:Optional|typing\.Optional)\[(.*)\]", typ)
    if m:
        return value is None or _accepts(m.group(1), value, core)
    if "|" in typ:
        return any(_accepts(t, value, core) for t in _split(typ.replace("|", ",")))
    base = re.split(r"[\[(]", typ)[0]
    if base in ("", "object", "Any", "typing.Any", "kwargs", "args"):
        return True
    if base == "None":
        return value is None
    if base == "bool":
        return isinstance(value, bool) or type(value).__name__ == "bool_"
    if base == "int":
        return hasattr(value, "__index__") and not isinstance(value, float)
    if base == "float":
        return isinstance(value, numbers.Real) or hasattr(value, "__float__") and not isinstance(value, str)
    if base == "str":
        return isinstance(value, str)
    if base in ("list", "List", "tuple", "Tuple", "Sequence", "typing.Sequence", "set", "Set"):
        return isinstance(value, (list, tuple, set, frozenset, range)) or hasattr(value, "__array__")
    if base in ("dict", "Dict"):
        return isinstance(value, dict)
    if base in ("Callable", "typing.Callable", "function"):
        return callable(value)
    if base in ("os.PathLike", "PathLike"):
        return isinstance(value, (str, os.PathLike))
    cls = getattr(core, base, None)
    return isinstance(value, cls) if isinstance(cls, type) else True


def _problem(sig, args, kwargs, core):
    """What keeps (args, kwargs) from this signature, in words; None when nothing visible does."""
    params = _params(sig)
    positional = [p for p in params if p[3] == "" and p[0] not in ("*", "/")]
    star = next((i for i, p in enumerate(params) if p[3] == "*" or p[0] == "*"), len(params))
    takes_more = any(p[3] == "*" and p[0] != "*" for p in params)
    named = {p[0]: p for p in params if p[3] == ""}
    before_star = [p for p in params[:star] if p[3] == "" and p[0] != "/"]
    if len(args) > len(before_star) and not takes_more:
        return f"takes {len(before_star)} positional argument{'s' if len(before_star) != 1 else ''}, got {len(args)}"
    given = dict(zip([p[0] for p in before_star], args))
    for k, v in kwargs.items():
        if k not in named:
            if any(p[3] == "**" for p in params):
                continue
            return f"has no argument '{k}' (its arguments: {', '.join(p[0] for p in positional if p[0] != 'self')})"
        if k in given:
            return f"argument '{k}' is given twice"
        given[k] = v
    for name, typ, has_default, _ in positional:
        if name in given and not _accepts(typ, given[name], core):
            return f"argument '{name}' is {type(given[name]).__name__}, expected {typ.replace('headlab._core.', '')}"
    for name, typ, has_default, _ in positional:
        if name not in given and not has_default:
            return f"argument '{name}' is missing"
    return None


def short_message(what, message, args, kwargs, core):
    """The one line for pybind11's 'incompatible function arguments' message of a call of `what`."""
    sigs = [m.group(1) for m in map(_SIGNATURE.match, message.splitlines()) if m]
    problems = [p for p in (_problem(s, args, kwargs, core) for s in sigs) if p]
    if problems and len(problems) == len(sigs):
        return f"{what}: {problems[0]}" + (f" (and {len(sigs) - 1} other signatures fail)" if len(sigs) > 1 else "")
    types = ", ".join([type(a).__name__ for a in args] + [f"{k}={type(v).__name__}" for k, v in kwargs.items()])
    return f"{what}: the arguments ({types}) match none of its signatures (help({what}) lists them)"


def _wrap(fn, what, core):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            text = str(e)
            if not _INCOMPATIBLE.match(text):
                raise
            # a method's signatures start with self, as its args do; a constructor's leave it out
            shown = args[1:] if "incompatible constructor" in text else args
            raise TypeError(short_message(what, text, shown, kwargs, core)) from None
    return call


def install(core):
    """Wraps every binding of the module `core` and of its classes, once."""
    if getattr(core, "_arguments_wrapped", False):
        return
    for name, obj in list(vars(core).items()):
        if type(obj).__name__ == "builtin_function_or_method":
            setattr(core, name, _wrap(obj, f"hl.{name}", core))
        elif isinstance(obj, type) and not issubclass(obj, BaseException):
            for mname, m in list(vars(obj).items()):
                what = f"hl.{name}" if mname == "__init__" else f"{name}.{mname}"
                if type(m).__name__ == "instancemethod":
                    setattr(obj, mname, _wrap(m.__func__, what, core))
                elif isinstance(m, staticmethod) and type(m.__func__).__name__ == "builtin_function_or_method":
                    setattr(obj, mname, staticmethod(_wrap(m.__func__, what, core)))
    core._arguments_wrapped = True
