"""`cmake --install` puts the package where Debian's python3 looks: installed into a temporary
prefix, `import headlab` works from another folder with only that prefix's site directory, and
the layout under the prefix is the one that lands on sys.path with the default prefix /usr/local."""
import os
import subprocess
import sys
import sysconfig

import pytest

BINARY = os.environ.get("HEADLAB_BINARY", "")
BUILD = os.path.dirname(os.path.abspath(BINARY)) if BINARY else ""


@pytest.mark.skipif(not os.path.exists(os.path.join(BUILD, "CMakeCache.txt")),
                    reason="HEADLAB_BINARY is not the headlab of a CMake build tree")
def test_cmake_install_puts_an_importable_package_where_python_looks(tmp_path):
    prefix = tmp_path / "prefix"
    r = subprocess.run(["cmake", "--install", BUILD, "--prefix", str(prefix)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # the command, runnable from the prefix
    r = subprocess.run([str(prefix / "bin" / "headlab"), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "train" in r.stdout
    # the nanoGPT converter `headlab convert` runs, beside it
    assert sorted(os.listdir(prefix / "share" / "headlab" / "scripts")) == ["convert_nanogpt.py", "safetensors_np.py"]
    # the package: one directory holding the extension and the Python files
    found = [os.path.relpath(d, prefix) for d, _, files in os.walk(prefix) if "__init__.py" in files]
    assert len(found) == 1 and os.path.basename(found[0]) == "headlab", found
    site = os.path.dirname(found[0])
    files = os.listdir(prefix / found[0])
    source = os.path.join(os.environ.get("HEADLAB_SOURCE_DIR", "."), "python", "headlab")
    if os.path.isdir(source):  # every Python file of the package, beside the extension
        assert {f for f in os.listdir(source) if f.endswith(".py")} <= set(files), files
    assert {"_core.pyi", "py.typed"} <= set(files), files  # the type stub ships with the package
    assert any(f.startswith("_core") and f.endswith(".so") for f in files), files
    # with the default prefix /usr/local this directory is on this interpreter's own sys.path
    # (Debian's python3: /usr/local/lib/python3.X/dist-packages)
    if sys.executable == "/usr/bin/python3" and sysconfig.get_path("platlib").startswith("/usr/local/"):
        clean = dict(os.environ)
        clean.pop("PYTHONPATH", None)
        path = subprocess.run([sys.executable, "-c", "import sys; print('\\n'.join(sys.path))"], env=clean,
                              capture_output=True, text=True, check=True).stdout.split("\n")
        assert os.path.join("/usr/local", site) in path, (site, path)
    # imported from another folder with only the installed site directory (not build/python)
    env = dict(os.environ, PYTHONPATH=str(prefix / site))
    code = ("import headlab as hl, numpy as np\n"
            "m = hl.TransformerLM(hl.ModelConfig(d_model=16, layers=1, heads=2, d_ff=32, vocab_size=11))\n"
            "e = hl.evaluate(m, np.arange(20).reshape(2, 10) % 11)\n"
            "print(hl.__file__); print(e['tokens'])\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    where, tokens = r.stdout.split()
    assert where == str(prefix / found[0] / "__init__.py") and tokens == "18"
