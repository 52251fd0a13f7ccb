"""`import equarx_ref` loads nothing but itself; the spec runs where jax is not installed.

The package's `__init__` re-exports lazily (PEP 562): every public name still reads as before,
`eq.quantize` is the function even after the module of the same name loads, and the
subpackages load on first use. Then the spec's promise, in a fresh virtual environment with
NumPy and ml_dtypes only (no jax, nothing of the system's site-packages): `from equarx_ref
import spec` quantizes, lays out bytes and sums a schedule, under `python -O` too, and jax
never loads. Building that environment needs pip to reach its index; without one the test
skips and says so, except under CI=true, where it fails.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import equarx_ref as eq

ROOT = Path(__file__).resolve().parent.parent


def test_every_public_name_reads_as_before():
    """`__all__` is the lazy table and the subpackages; the names the static imports (for
    readers and tools) bind are the same; each name is the object its module defines."""
    import importlib

    assert set(eq.__all__) == {*eq._EXPORTS, *eq._SUBPACKAGES}
    tree = ast.parse((ROOT / "equarx_ref" / "__init__.py").read_text(encoding="utf-8"))
    static = {alias.name: node.module for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.level == 1 for alias in node.names}
    assert static == eq._EXPORTS
    for name, module in eq._EXPORTS.items():
        assert getattr(eq, name) is getattr(importlib.import_module(f"equarx_ref.{module}"),
                                            name), name
    assert callable(eq.quantize) and eq.quantize.__module__ == "equarx_ref.quantize"
    assert eq.spec.__name__ == "equarx_ref.spec" and eq.formats.FORMAT_NAMES == eq.FORMAT_NAMES
    assert set(eq.__all__) <= set(dir(eq))
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        eq.no_such_name  # noqa: B018


def test_import_loads_no_jax_and_quantize_stays_the_function():
    """In a fresh interpreter: `import equarx_ref` and the spec load no jax; the first read of
    a name loads its module; importing `equarx_ref.quantize` (the module) keeps
    `eq.quantize` the function, as the eager `__init__` did."""
    code = textwrap.dedent("""
        import sys
        import equarx_ref as eq
        from equarx_ref import spec
        assert "jax" not in sys.modules, "import equarx_ref loaded jax"
        import equarx_ref.collectives  # loads equarx_ref.quantize, the module, on the way
        assert "jax" in sys.modules
        assert callable(eq.quantize) and eq.quantize.__name__ == "quantize", eq.quantize
        from equarx_ref import quantize, Format
        assert quantize is eq.quantize and Format is eq.Format
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["ok"], out.stderr[-3000:]


FOLDERS = ("gemma", "kernels", "models", "multihost", "outliers", "remedies", "runs", "viz")


def test_a_folders_modules_read_as_attributes():
    """In a fresh interpreter, each public module of each folder is an attribute of it,
    loaded on first read (`_lazy.submodules`): `eq.models.predict` with no import line of its
    own, as `eq.gemma` is; a name that is no module is an AttributeError naming it."""
    code = textwrap.dedent(f"""
        import pkgutil, sys
        import equarx_ref as eq
        assert "equarx_ref.models.predict" not in sys.modules
        assert eq.models.predict.__name__ == "equarx_ref.models.predict"
        for folder in {FOLDERS!r}:
            package = getattr(eq, folder)
            for m in pkgutil.iter_modules(package.__path__):
                if not m.name.startswith("_"):
                    assert getattr(package, m.name).__name__ == f"{{package.__name__}}.{{m.name}}"
        try:
            eq.models.no_such_module
        except AttributeError as e:
            assert "'equarx_ref.models' has no attribute 'no_such_module'" in str(e), e
        else:
            raise AssertionError("eq.models.no_such_module read as something")
        print("ok")
    """)
    assert {p.parent.name for p in (ROOT / "equarx_ref").glob("*/__init__.py")} - set(FOLDERS) \
        == {"cli", "data", "spec"}  # the command, the records, the spec (no package import)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.split() == ["ok"], out.stderr[-3000:]


def test_python_m_equarx_ref_runs_the_command():
    out = subprocess.run([sys.executable, "-m", "equarx_ref", "--version"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("equarx-ref "), out.stderr


# ---- the spec without jax -------------------------------------------------------------------

SPEC_WITHOUT_JAX = textwrap.dedent("""
    import sys, types
    import numpy as np
    import equarx_ref
    from equarx_ref import spec

    fmt = types.SimpleNamespace(name="int8", block_size=32, scale_dtype="bfloat16")
    x = np.random.default_rng(0).standard_normal((4, 100)).astype(np.float32)
    q = spec.quantize_blocks(spec.to_blocks(x[0], fmt.block_size), fmt)
    size = spec.canonical_bytes(q).size
    assert size == 4 * 34, size  # 4 blocks of 32 bytes and a 2-byte scale

    # one-shot over 4 devices as plain data: one all-gather, each device sums every message
    step = types.SimpleNamespace(time=0, phase="reduce", kind="all_gather", transfers=())
    one_shot = types.SimpleNamespace(p=4, chunk_count=1, owners=((0, 1, 2, 3),), steps=(step,))
    y = spec.all_reduce(x, one_shot, fmt)
    exact = x.astype(np.float64).sum(0)
    assert y.shape == (100,) and y.dtype == np.float32
    assert np.linalg.norm(y - exact) / np.linalg.norm(exact) < 0.01

    # an oracle refuses a malformed question, under python -O as well
    for call, words in [
            (lambda: spec.all_reduce(np.ones((8, 100), np.float32), one_shot, fmt),
             "one row per device"),
            (lambda: spec.quantize_blocks(np.zeros((2, 31), np.float32), fmt), "x must be"),
            (lambda: spec.quantize_blocks(np.zeros((1, 32), np.int32), fmt), "floating")]:
        try:
            call()
        except (ValueError, TypeError) as e:
            assert words in str(e), e
        else:
            raise AssertionError(f"not refused: {words}")
    try:
        equarx_ref.Format
    except ModuleNotFoundError as e:
        assert "needs jax" in str(e) and "equarx_ref.spec" in str(e), e
    else:
        raise AssertionError("equarx_ref.Format loaded without jax")
    assert not any(m == "jax" or m.startswith("jax.") for m in sys.modules), "jax loaded"
    print("ok", sys.flags.optimize)
""")


@pytest.fixture(scope="module")
def jaxless_python(tmp_path_factory) -> str:
    """A fresh virtual environment with NumPy and ml_dtypes only (no system site-packages)."""
    env_dir = tmp_path_factory.mktemp("nojax") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, timeout=300)
    python = str(env_dir / "bin" / "python")
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "numpy", "ml_dtypes"],
                         capture_output=True, text=True, timeout=600)
    if pip.returncode:
        reason = f"pip could not install numpy and ml_dtypes: {pip.stderr.strip()[-300:]}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; CI=true: this test must run in CI")
        pytest.skip(reason)
    probe = subprocess.run([python, "-c", "import importlib.util as u; "
                            "print(u.find_spec('jax') is None)"], capture_output=True, text=True)
    assert probe.stdout.strip() == "True", "the environment without jax has jax"
    return python


@pytest.mark.parametrize("optimize", [[], ["-O"]], ids=["plain", "python -O"])
@pytest.mark.slow
def test_the_spec_runs_where_jax_is_not_installed(jaxless_python, optimize, tmp_path):
    """docs/api/spec.md: "Run it where jax is not installed": the checkout on PYTHONPATH, run
    from elsewhere, in an environment whose only packages are NumPy and ml_dtypes."""
    out = subprocess.run([jaxless_python, *optimize, "-c", SPEC_WITHOUT_JAX], cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok", "1" if optimize else "0"], out.stdout
