"""The package's imports go one way: a test that reads them (ast) and fails on an upward import,
a cycle or a private name taken from another module, and checks that `import equarx_ref`
stays light. The layers are `docs/gen/layout.LAYERS` (the contributing page draws them):
a module may import from its own folder and from the layers below. Every import counts, lazy
ones too: an import inside a function may keep a module light to load, never hide a cycle.
The package's `__init__` sits on top (it re-exports).
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
    """The folder or flat module a module belongs to: equarx_ref.models.cost -> models."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_unit_has_a_layer():
    units = {_unit(m) for m in MODULES} - {""}
    assert not units - set(RANK), f"place these in LAYERS: {sorted(units - set(RANK))}"


def test_imports_go_down():
    upward = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {target}"
              for m in MODULES if _unit(m)
              for target, _, line in _imports(m)
              if _unit(target) and RANK[_unit(target)] > RANK[_unit(m)]]
    assert not upward, "upward imports:\n  " + "\n  ".join(upward)


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


def test_the_package_essay_gives_the_core_and_its_size():
    """The package docstring names the core files and their lines of code (within 10%)."""
    import re

    import equarx_ref

    doc = equarx_ref.__doc__
    assert all(f"{name}.py" in doc for name in LAYOUT.CORE), doc
    stated = int(re.search(r"about ([\d,]+) lines of code", doc).group(1).replace(",", ""))
    code = sum(c for _, _, c, _ in LAYOUT.core())
    assert abs(stated - code) <= 0.1 * code, f"the essay says {stated} lines of code; now {code}"
