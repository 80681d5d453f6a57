"""The type stub headlab/_core.pyi against the module: the same public names, the same argument
names for every function and method, and every binding with named arguments and a docstring
(scripts/python_stub.py rewrites the stub after a binding changes)."""
import ast
import inspect
import os
import re

import headlab as hl
import headlab._core as core

STUB = os.path.join(os.path.dirname(core.__file__), "_core.pyi")
KEPT_DUNDERS = {"__init__", "__call__", "__getitem__", "__len__", "__iter__", "__contains__", "__eq__", "__repr__",
                "__add__", "__sub__", "__mul__", "__rmul__", "__matmul__"}


def stub_tree():
    with open(STUB) as f:
        return ast.parse(f.read())


def stub_args(fn):
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    return names + ([a.vararg.arg] if a.vararg else []) + ([a.kwarg.arg] if a.kwarg else [])


def module_args(name, obj):
    """The argument names of each of pybind11's signatures of obj (or a Python function's)."""
    obj = inspect.unwrap(obj)  # the binding behind headlab's wrappers (_arguments, lens's text input)
    if inspect.isfunction(obj):
        return [list(inspect.signature(obj).parameters)]
    sigs = []
    overloaded = "Overloaded function." in (obj.__doc__ or "")
    for line in (obj.__doc__ or "").splitlines():
        if overloaded and not re.match(r"^\d+\. ", line.strip()):
            continue  # an overloaded function's first line is (*args, **kwargs)
        m = re.match(r"^(?:\d+\. )?" + re.escape(name) + r"\((.*)\)(?: -> .+)?$", line.strip())
        if m:
            depth, names, cur = 0, [], ""
            for ch in m.group(1) + ",":
                depth += ch in "[(<{"
                depth -= ch in "])>}"
                if ch == "," and depth == 0:
                    if cur.strip() not in ("", "*", "/"):  # a bare * or / separates kinds of arguments
                        names.append(cur.strip().split(":")[0].lstrip("*"))
                    cur = ""
                else:
                    cur += ch
            sigs.append(names)
    return sigs


def public_members(cls):
    for name, m in vars(cls).items():
        if (name.startswith("_") and name not in KEPT_DUNDERS) or type(m).__name__ == "wrapper_descriptor":
            continue  # private, or Python's own slot (a class without a bound constructor)
        yield name, m


def test_the_stub_has_the_modules_public_names_and_argument_names():
    tree = stub_tree()
    top = {}
    for n in tree.body:
        if isinstance(n, (ast.ClassDef, ast.FunctionDef)):
            top.setdefault(n.name, []).append(n)  # a function's overloads in order
    assert sorted(top) == sorted(n for n in dir(core) if not n.startswith("_"))
    for name, nodes in top.items():
        obj, node = getattr(core, name), nodes[0]
        if isinstance(node, ast.FunctionDef):
            assert [stub_args(d) for d in nodes] == module_args(name, obj), name
            continue
        if issubclass(obj, BaseException):
            continue
        stub_members = {}
        for n in node.body:
            if isinstance(n, ast.FunctionDef):
                stub_members.setdefault(n.name, []).append(n)
        members = dict(public_members(obj))
        assert sorted(stub_members) == sorted(m for m, v in members.items()
                                              if isinstance(v, property) or callable(v) or inspect.isfunction(v)), name
        for mname, defs in stub_members.items():
            m = members[mname]
            if isinstance(m, property):
                continue
            assert [stub_args(d) for d in defs] == module_args(mname, getattr(obj, mname)), f"{name}.{mname}"


def documented(name, obj):
    lines = [ln for ln in (obj.__doc__ or "").splitlines()
             if ln.strip() and not re.match(r"^(?:\d+\. )?" + re.escape(name) + r"\(", ln.strip())
             and ln.strip() != "Overloaded function."]
    return bool(lines)


def test_every_binding_has_argument_names_and_a_docstring():
    missing = []
    for name in (n for n in dir(core) if not n.startswith("_")):
        obj = getattr(core, name)
        if inspect.isclass(obj):
            if not (obj.__doc__ or "").strip():
                missing.append(f"{name}: no docstring")
            for mname, m in public_members(obj):
                if mname in ("__repr__", "__len__", "__iter__", "__contains__", "__eq__", "__add__", "__sub__", "__mul__",
                             "__rmul__", "__matmul__"):
                    continue  # Python's own protocol: its meaning is the operator's
                if isinstance(m, property):
                    if not (m.__doc__ or "").strip():
                        missing.append(f"{name}.{mname}: no docstring")
                    continue
                f = getattr(obj, mname)
                if any(re.fullmatch(r"arg\d+", a) for sig in module_args(mname, f) for a in sig):
                    missing.append(f"{name}.{mname}: unnamed arguments")
                if not documented(mname, f):
                    missing.append(f"{name}.{mname}: no docstring")
        elif callable(obj):
            if any(re.fullmatch(r"arg\d+", a) for sig in module_args(name, obj) for a in sig):
                missing.append(f"{name}: unnamed arguments")
            if not documented(name, obj):
                missing.append(f"{name}: no docstring")
    assert missing == []


def test_help_shows_argument_names_and_docs():
    text = hl.TransformerLM.__doc__ + "".join(m.__doc__ or "" for m in vars(hl.TransformerLM).values() if callable(m))
    assert "A decoder-only transformer language model" in text
    assert ("run_with_cache(self: object, ids: object, names_filter: object = None, incl_bwd: bool = False, "
            "attention_mask: object = None, return_type: object = 'logits')") in text
    assert hl.edge_patching.__doc__.startswith("edge_patching(model: headlab._core.TransformerLM, ")
    assert "arg0" not in hl.qk_singular_values.__doc__
