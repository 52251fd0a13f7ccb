"""Which code made each stored result, and whether that code has changed since.

A stored result (`equarx_ref/data/NAME.json`) is stamped with the package modules behind its
command and a digest of their code. The modules are the closure, over the package's own imports
(lazy ones inside functions included, and the providers of the core's extension points, which
the core looks up by name), of the entry modules `PRODUCERS` names for the file:
the module the command's work lives in (runs/, multihost/, outliers/, gemma/); the core comes in
through their imports. The command's own module in cli/ is left out: it parses the arguments and
writes what the work returns, so a new flag or help text does not make every result stale.

The digest must survive what does not change a result: a file moved to another folder, an import
line rewritten, a docstring or a comment edited, a function moved from one producing module to
another. So it is taken over code, not files: every top-level statement of every module in the
closure, parsed, with docstrings, import statements and `__all__` removed, dumped without line
numbers and hashed; the sorted statement hashes are hashed again. Renaming a function, or
changing a line of code, changes it. A module that reads a stored result as it runs (the time
model reads the codec's stored cycles: `READS`) adds that result's hash, so what it made goes
stale with the record as with code.

`stale(name)` compares a file's stamp with the code of this checkout; tests/test_provenance.py
fails for a stale file, naming the command that remakes it.
"""

from __future__ import annotations

import ast
import hashlib
import json
import platform
from pathlib import Path

from .common import ROOT

PACKAGE = "equarx_ref"
SRC = ROOT / PACKAGE
DATA = SRC / "data"

#: The modules a command's work lives in, per stored result (the closure adds what they import).
PRODUCERS: dict[str, tuple[str, ...]] = {
    "demo": ("equarx_ref.runs.demo",),
    "bench": ("equarx_ref.runs.bench",),
    "gemma": ("equarx_ref.gemma.quality", "equarx_ref.gemma.report"),
    "model-v5e": ("equarx_ref.runs.model",),
    "outliers": ("equarx_ref.outliers.calibration", "equarx_ref.outliers.wire",
                 "equarx_ref.outliers.collective", "equarx_ref.gemma.calibrate",
                 "equarx_ref.gemma.report"),
    "sweep": ("equarx_ref.runs.sweep",),
    "train": ("equarx_ref.runs.train",),
    "train-hops": ("equarx_ref.runs.train", "equarx_ref.runs.hopstats"),
    "multihost-100mbit": ("equarx_ref.multihost.launcher", "equarx_ref.multihost.worker"),
    "multihost-1gbit": ("equarx_ref.multihost.launcher", "equarx_ref.multihost.worker"),
    "multihost-loopback": ("equarx_ref.multihost.launcher", "equarx_ref.multihost.worker"),
    "tpu": ("equarx_ref.runs.tpu_matrix",),
    "tpu-bytes": ("equarx_ref.runs.tpu_matrix", "equarx_ref.runs.tpu_bytes"),
    "tpu-schedule": ("equarx_ref.runs.tpu_matrix", "equarx_ref.runs.tpu_schedule"),
}

#: The stored results a module reads as it runs (`data.load`): a result made with it depends on
#: them as on code, so their results join its digest.
READS: dict[str, tuple[str, ...]] = {"equarx_ref.models.chips": ("tpu-schedule",)}


def _path(module: str) -> Path:
    rel = Path(*module.split(".")[1:])
    package = SRC / rel / "__init__.py"
    return package if package.is_file() else (SRC / rel).with_suffix(".py")


def _exists(module: str) -> bool:
    return module.split(".")[0] == PACKAGE and _path(module).is_file()


def _is_package(module: str) -> bool:
    return _path(module).name == "__init__.py"


def _from_package(package: str, name: str) -> str:
    """The module that `from package import name` really reaches: the submodule `name`, or the
    one the package's __init__ re-exports `name` from, or the __init__ itself."""
    if _exists(f"{package}.{name}"):
        return f"{package}.{name}"
    tree = ast.parse(_path(package).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module \
                and any((a.asname or a.name) == name for a in node.names):
            return f"{package}.{node.module}"
    return package


def _imports(module: str) -> set[str]:
    """The package modules `module` imports, anywhere in its code. A name imported from a
    package counts as the submodule that defines it, not as the whole package."""
    tree = ast.parse(_path(module).read_text(encoding="utf-8"))
    here = module.split(".") if _is_package(module) else module.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            parent = ".".join(base + (node.module.split(".") if node.module else []))
            if parent.split(".")[0] != PACKAGE:
                continue
            while parent and not _exists(parent):  # `a.b.c` may name an attribute of `a.b`
                parent = parent.rpartition(".")[0]
            if parent == PACKAGE:  # the root re-exports lazily, by its table
                found.update(_root_table("_EXPORTS", a.name) for a in node.names)
            elif _is_package(parent):
                found.update(_from_package(parent, a.name) for a in node.names)
            else:
                found.add(parent)
    if module == f"{PACKAGE}.extensions":  # the core's extension points: what provides them
        found.update(_root_table("_PROVIDERS", point) for point in _root_tables()["_PROVIDERS"])
    return {m for m in found if _exists(m) and m != PACKAGE}


def _root_tables() -> dict[str, dict]:
    """The root's tables of where things live (equarx_ref/__init__.py), read, not imported:
    `_EXPORTS` (public name -> module) and `_PROVIDERS` (extension point -> "module:name")."""
    tables = {}
    for node in ast.parse(_path(PACKAGE).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in ("_EXPORTS", "_PROVIDERS"):
            tables[node.targets[0].id] = _literal(node.value)
    return tables


def _literal(node) -> dict:
    """A dict display of string constants, `**dict.fromkeys([...], "module")` entries
    included (how `_EXPORTS` is written)."""
    out = {}
    for key, value in zip(node.keys, node.values, strict=True):
        if key is None:  # **dict.fromkeys([names], module)
            names, module = value.args
            out.update(dict.fromkeys(ast.literal_eval(names), ast.literal_eval(module)))
        else:
            out[ast.literal_eval(key)] = ast.literal_eval(value)
    return out


def _root_table(table: str, name: str) -> str:
    """The module the root's `table` names for `name` (a submodule `eq.gemma` as itself)."""
    where = _root_tables()[table].get(name, name)
    return f"{PACKAGE}.{where.partition(':')[0]}"


def modules(name: str) -> list[str]:
    """The package modules behind the stored result `name`: `PRODUCERS` and their closure."""
    if name not in PRODUCERS:
        raise ValueError(f"no producing modules are named for {name!r} (docs/gen/provenance.py "
                         f"PRODUCERS: {sorted(PRODUCERS)})")
    todo, seen = list(PRODUCERS[name]), set()
    for m in todo:
        if not _exists(m):
            raise ValueError(f"PRODUCERS[{name!r}] names {m}, which is not a module of "
                             f"{SRC}: where did it move?")
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(_imports(m) - seen)
    return sorted(seen)


class _Strip(ast.NodeTransformer):
    """Docstrings and imports out: what a result does not depend on."""

    def _body(self, node):
        self.generic_visit(node)
        body = [s for s in node.body if not isinstance(s, ast.Import | ast.ImportFrom)]
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]
        node.body = body or [ast.Pass()]
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _body

    def visit_If(self, node):
        self.generic_visit(node)
        node.body = [s for s in node.body if not isinstance(s, ast.Import | ast.ImportFrom)] \
            or [ast.Pass()]
        return node

    visit_Try = visit_With = visit_For = visit_While = visit_If


def _statements(module: str) -> list[str]:
    tree = _Strip()._body(ast.parse(_path(module).read_text(encoding="utf-8")))
    out = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Pass):
            continue
        targets = getattr(stmt, "targets", None) or [getattr(stmt, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            continue
        out.append(hashlib.sha256(ast.dump(stmt).encode()).hexdigest())
    return out


def digest(mods: list[str], own: str = "") -> str:
    """sha256 over the code of `mods` (module essay), independent of paths and order, and
    over the stored results they read (`READS`) but `own`, the result being stamped."""
    hashes = sorted(h for m in mods for h in _statements(m))
    hashes += sorted(hashlib.sha256(json.dumps(json.loads(path(name).read_text(
        encoding="utf-8"))["result"], sort_keys=True).encode()).hexdigest()
        for name in {n for m in mods for n in READS.get(m, ())} - {own})
    return "sha256:" + hashlib.sha256("\n".join(hashes).encode()).hexdigest()


def path(name: str) -> Path:
    return DATA / f"{name}.json"


def stamp(name: str, command: str, result) -> dict:
    """The envelope `equarx_ref.data` reads: `result` with where it came from."""
    import jax

    mods = modules(name)
    return {"name": name, "command": command,
            "made_with": {"jax": jax.__version__, "python": platform.python_version()},
            "sources": {"modules": mods, "digest": digest(mods, name)},
            "result": result}


def write(name: str, envelope: dict) -> None:
    path(name).write_text(json.dumps(envelope, indent=1) + "\n", encoding="utf-8")


def stale(name: str) -> str | None:
    """Why the stored result `name` is older than its code, or None when it is not."""
    envelope = json.loads(path(name).read_text(encoding="utf-8"))
    mods = modules(name)
    now = digest(mods, name)
    if envelope["sources"]["digest"] == now:
        return None
    was, now_mods = set(envelope["sources"]["modules"]), set(mods)
    what = (f"modules added {sorted(now_mods - was)}, gone {sorted(was - now_mods)}"
            if was != now_mods else f"the code of one of its {len(mods)} modules changed")
    return (f"equarx_ref/data/{name}.json is older than its code ({what}; digest "
            f"{envelope['sources']['digest'][:15]}... now {now[:15]}...): remake it with "
            f"`python docs/hooks.py refresh {name}.json`, which runs `{envelope['command']}`")
