"""The package's imports go one way: a test that reads them (ast) and fails on an upward import,
a cycle or a private name taken from another module, and checks that `import equarx_ref`
stays light. The layers are `docs/gen/layout.LAYERS` (the contributing page draws them):
a module may import from its own folder and from the layers below. Every import counts, lazy
ones too: an import inside a function may keep a module light to load, never hide a cycle.
The package's `__init__` sits on top (it re-exports, and says where the core's extension
points are provided: what the core needs from above, it looks up by name, `extensions.py`).
"""

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from test_docs import _docs_gen  # tests/ is on the path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "equarx_ref"

LAYOUT = _docs_gen("layout")
RANK = {unit: i for i, (units, _) in enumerate(LAYOUT.LAYERS) for unit in units}


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _imports(module: str) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for every import of `module`, lazy or not."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub, "", node.lineno) if sub in MODULES
                             else (target, alias.name, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names]
    return [(t, n, line) for t, n, line in found if t.split(".")[0] == "equarx_ref"]


def _unit(module: str) -> str:
    """The folder or flat module a module belongs to: equarx_ref.models.cost -> models. The
    package's `__init__` and `__main__` (`python -m equarx_ref`) sit on top: ""."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] != "__main__" else ""


def test_every_unit_has_a_layer():
    units = {_unit(m) for m in MODULES} - {""}
    assert not units - set(RANK), f"place these in LAYERS: {sorted(units - set(RANK))}"


def test_imports_go_down():
    upward = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {target}"
              for m in MODULES if _unit(m)
              for target, _, line in _imports(m)
              if _unit(target) and RANK[_unit(target)] > RANK[_unit(m)]]
    assert not upward, "upward imports:\n  " + "\n  ".join(upward)


def test_the_core_imports_only_the_spec_and_itself():
    """spec <- core <- models, kernels, remedies <- runs <- cli: the core's layers come right
    after the spec's, and nothing of the core imports a folder that extends it."""
    core = {unit for units, _ in LAYOUT.LAYERS[1:5] for unit in units}
    assert {*LAYOUT.CORE, "autodiff"} <= core, core
    assert LAYOUT.LAYERS[5][0] == ("models", "remedies", "kernels"), LAYOUT.LAYERS[5]
    above = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {target}"
             for m in MODULES if _unit(m) in core
             for target, _, line in _imports(m) if _unit(target) not in core | {"spec", "data"}]
    assert not above, "the core imports from above:\n  " + "\n  ".join(above)


def test_every_extension_point_is_provided_from_above_the_core():
    """What the core looks up by name (`extensions.POINTS`) is registered by the package root,
    each from a module above the core that defines the name (read, not imported: Pallas stays
    unloaded)."""
    from equarx_ref import extensions

    where = extensions.providers()
    assert set(where) == set(extensions.POINTS), "every point provided, and no other"
    for point, spot in where.items():
        module, _, name = spot.partition(":")
        module = f"equarx_ref.{module}"
        assert module in MODULES, f"{point}: no module {module}"
        assert RANK[_unit(module)] > RANK["rules"], f"{point} is provided from {module}, " \
            "which is not above the core"
        tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
        defined = {node.name for node in tree.body
                   if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        assert name in defined, f"{point}: {module} defines no {name}"


def test_no_cycles():
    graph = defaultdict(set)
    for m in MODULES:
        for target, _, _ in _imports(m):
            if target in MODULES and target != m:
                graph[m].add(target)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*stack[stack.index(t):], t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in MODULES:
        if m not in state:
            visit(m)


def test_no_private_name_crosses_a_module():
    """`from .x import _helper` or `x._helper` from another module: the helper wants a home."""
    crossings = []
    for m, path in MODULES.items():
        modules_bound = {}
        for target, name, line in _imports(m):
            if name.startswith("_") and not name.startswith("__"):
                crossings.append(f"{path.relative_to(ROOT)}:{line} imports {target}.{name}")
            if not name and target in MODULES:
                modules_bound[target.rpartition(".")[2]] = target
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in modules_bound and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                crossings.append(f"{path.relative_to(ROOT)}:{node.lineno} uses "
                                 f"{modules_bound[node.value.id]}.{node.attr}")
    assert not crossings, "private names across modules:\n  " + "\n  ".join(crossings)


def test_import_equarx_ref_is_light():
    code = "import sys, equarx_ref\nprint(' '.join(sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.split()
    heavy = [m for m in loaded if m.split(".")[0] in ("matplotlib", "tqdm", "gguf", "tokenizers")
             or m.startswith(("equarx_ref.gemma", "equarx_ref.kernels", "equarx_ref.viz",
                              "equarx_ref.runs", "equarx_ref.multihost", "equarx_ref.outliers",
                              "jax.experimental.pallas"))]
    assert not heavy, f"import equarx_ref loads {heavy}"


def test_the_package_essay_names_the_core_and_no_size_that_rots():
    """The package docstring names every core file and claims no line count (the contributing
    page counts the lines from the files; a number in an essay goes stale), and so does the
    home page: nothing like "1,320 lines" or "a few hundred lines"."""
    import re

    import equarx_ref

    doc = equarx_ref.__doc__
    assert all(f"{name}.py" in doc for name in LAYOUT.CORE), doc
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    for where, text in (("equarx_ref/__init__.py", doc), ("docs/index.md", home)):
        claim = re.search(r"(\b[\d,]+|hundreds?|thousands?|dozens?) (?:\w+ ){0,2}lines", text)
        assert claim is None, f"{where} states a size that rots: {claim.group(0)!r}"
    files = re.search(r"(\w+) small files", home)  # the count it may give: of the files
    assert files is None or files.group(1) == LAYOUT._number(len(LAYOUT.CORE)), files


SPEC_ALLOWED = {"numpy", "ml_dtypes", "__future__", "dataclasses", "re"}


def test_the_spec_imports_numpy_and_ml_dtypes_only():
    """equarx_ref/spec imports nothing of jax nor of the rest of the package: only NumPy,
    ml_dtypes, a little of the standard library and its own modules (ast, every import)."""
    bad = []
    for path in sorted((PKG / "spec").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                continue  # its own modules
            names = ([node.module] if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            bad += [f"{path.name}:{node.lineno} {n}" for n in names
                    if n.split(".")[0] not in SPEC_ALLOWED]
    assert not bad, f"the spec imports {bad}"


def test_the_spec_runs_without_jax():
    """Loaded from its folder with jax made unimportable, the spec quantizes and sums.
    (`import equarx_ref.spec` runs the package's __init__, which imports jax; the folder
    itself needs none, so it is loaded by path here, as a user without jax can.)"""
    code = f"""
import importlib.util, sys, types
import numpy as np
sys.modules["jax"] = None
where = {str(PKG / "spec")!r}
s = importlib.util.spec_from_file_location("spec", where + "/__init__.py",
                                           submodule_search_locations=[where])
spec = importlib.util.module_from_spec(s); sys.modules["spec"] = spec; s.loader.exec_module(spec)
fmt = types.SimpleNamespace(name="int4", block_size=8, scale_dtype="bfloat16")
q = spec.quantize_blocks(np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8), fmt)
step = types.SimpleNamespace(time=0, phase="reduce", kind="all_gather", transfers=())
sched = types.SimpleNamespace(chunk_count=1, owners=((0, 1),), steps=(step,))
y = spec.all_reduce(np.ones((2, 8), np.float32), sched, fmt)
assert not any(m == "jax" or m.startswith(("jax.", "equarx_ref")) for m in sys.modules
               if sys.modules[m] is not None)
assert np.allclose(y, 2, rtol=2**-6), y  # two int4-quantized ones
print(len(spec.canonical_bytes(q)))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["12"], out.stdout  # 2 blocks of 4 payload + 2 scale bytes
