"""Writes python/headlab/_core.pyi, the type stub of the extension, from the built module's
pybind11 signatures: run after changing a binding (python/tests/test_stub.py holds the stub equal
to the module's public names and argument names).

  PYTHONPATH=build/python /usr/bin/python3 scripts/python_stub.py python/headlab/_core.pyi
"""
import ast
import inspect
import re
import sys

import headlab._core as core

HEADER = '''"""Type stub of headlab._core (written by scripts/python_stub.py from the module's signatures)."""
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union, overload

import numpy
'''


def annotation(text):
    """A pybind11 type as a stub annotation: the module's own classes by name; what Python cannot
    parse as an expression becomes Any."""
    t = text.strip().replace("headlab._core.", "")
    t = re.sub(r"numpy\.ndarray\[[^\]]*\]", "numpy.ndarray", t)
    t = re.sub(r"\bkwargs\b", "Any", t)
    try:
        ast.parse(t, mode="eval")
        return t
    except SyntaxError:
        return "Any"


def split_args(text):
    """'a: int, b: list[int] = [1, 2]' -> ['a: int', 'b: list[int] = [1, 2]'] (commas inside brackets kept)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[(<{":
            depth += 1
        elif ch in "])>}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def signatures(name, doc):
    """(args text, return text) of each of pybind11's signature lines for `name` in doc."""
    found = []
    overloaded = "Overloaded function." in (doc or "")
    for line in (doc or "").splitlines():
        if overloaded and not re.match(r"^\d+\. ", line.strip()):
            continue  # the first line of an overloaded function is (*args, **kwargs)
        m = re.match(r"^(?:\d+\. )?" + re.escape(name) + r"\((.*)\)(?: -> (.+))?$", line.strip())
        if m:
            found.append((m.group(1), m.group(2) or "None"))
    return found


def doc_text(name, doc):
    lines = [ln for ln in (doc or "").splitlines() if not signatures(name, ln) and ln.strip() != "Overloaded function."]
    return "\n".join(lines).strip()


def quoted(body, indent):
    body = body.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return f'{indent}    """{body}"""' if body else f"{indent}    ..."


def python_function(name, fn, indent):
    """A method written in Python (headlab/lens.py puts them on TransformerLM): its own signature."""
    params = []
    for p in inspect.signature(fn).parameters.values():
        text = p.name if p.name == "self" else f"{p.name}: Any"
        params.append(text + (" = ..." if p.default is not inspect.Parameter.empty else ""))
    return [f"{indent}def {name}({', '.join(params)}) -> Any:", quoted(inspect.getdoc(fn) or "", indent)]


def function(name, obj, indent, method):
    obj = inspect.unwrap(obj)  # the binding behind headlab's wrappers (_arguments, lens's text input)
    if inspect.isfunction(obj):
        return python_function(name, obj, indent)
    out = []
    sigs = signatures(name, obj.__doc__)
    for args, ret in sigs:
        params = []
        for a in split_args(args):
            if a.startswith("*"):
                params.append(a.split(":")[0] if not a.startswith("**") else "**kwargs: Any")
                continue
            pname, _, rest = a.partition(":")
            typ, eq, _default = rest.partition("=")
            params.append(f"{pname.strip()}: {annotation(typ)}" + (" = ..." if eq else ""))
        if method and params and params[0].startswith("self"):
            params[0] = "self"
        deco = [f"{indent}@overload"] if len(sigs) > 1 else []
        body = doc_text(name, obj.__doc__)
        out += deco + [f"{indent}def {name}({', '.join(params)}) -> {annotation(ret)}:"]
        out.append(quoted(body if len(sigs) == 1 else "", indent))
    return out


def prop(name, p, indent):
    ret = "Any"
    if p.fget is not None:
        m = re.search(r"\) -> (.+)$", (p.fget.__doc__ or "").splitlines()[0] if p.fget.__doc__ else "")
        if m:
            ret = annotation(m.group(1))
    body = (p.__doc__ or "").strip()
    return [f"{indent}@property", f"{indent}def {name}(self) -> {ret}:", quoted(body, indent)]


def main(path):
    lines = [HEADER]
    for name in sorted(n for n in dir(core) if not n.startswith("_")):
        obj = getattr(core, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            base = obj.__bases__[0].__name__
            lines += [f"class {name}({base}):", quoted((obj.__doc__ or "").strip(), ""), ""]
        elif inspect.isclass(obj):
            lines += [f"class {name}:", quoted((obj.__doc__ or "").strip(), "")]
            for mname, m in vars(obj).items():
                if type(m).__name__ == "wrapper_descriptor":  # Python's own slot (no constructor bound)
                    continue
                if mname.startswith("_") and mname not in ("__init__", "__call__", "__getitem__", "__len__", "__iter__",
                                                           "__contains__", "__eq__", "__repr__", "__add__", "__sub__",
                                                           "__mul__", "__rmul__", "__matmul__"):
                    continue
                if isinstance(m, property):
                    lines += prop(mname, m, "    ")
                elif isinstance(m, staticmethod) or type(m).__name__ == "staticmethod":
                    lines += ["    @staticmethod"] + function(mname, getattr(obj, mname), "    ", False)
                elif callable(m) or inspect.isfunction(m):
                    lines += function(mname, m, "    ", True)
            lines.append("")
        elif callable(obj):
            lines += function(name, obj, "", False) + [""]
    with open(path, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
