"""Keep the course notebooks consistent, executed and clean.

    python notebooks/nbtool.py new    notebooks/05_topic.ipynb "Title"  # skeleton + opening cells
    python notebooks/nbtool.py header notebooks/*.ipynb                 # refresh badge, install
    python notebooks/nbtool.py run    notebooks/01_quantization.ipynb   # header, execute, strip
    python notebooks/nbtool.py strip  notebooks/*.ipynb                 # strip volatile metadata
    python notebooks/nbtool.py check  notebooks/*.ipynb                 # what the tests check

Every notebook opens the same way (DESIGN.md): a markdown cell with the title, the Colab badge and
the learning goals; a code cell that installs the package only on Colab; then
`eq.setup_devices(8)` with the device report under `# NBVAL_IGNORE_OUTPUT`. The badge and the
install cell are generated from the one place the repository URL lives, pyproject's
`[project.urls] Repository`; `header` rewrites them, `check` verifies them.

Notebooks are stored executed (nbval compares the `# NBVAL_CHECK_OUTPUT` cells, the docs site
renders the outputs) and stripped with `nbstripout --keep-output --keep-count`: without
`--keep-count` the execution counts become null and nbval fails every cell that has output.

Run it with the project's Python (the kernel is that interpreter's own `python3`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BADGE_SVG = "https://colab.research.google.com/assets/colab-badge.svg"
BADGE_RE = re.compile(r"\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)")
INSTALL_MARK = "# On Colab only: install the package from its repository."
SETUP_SOURCE = (
    "# NBVAL_IGNORE_OUTPUT\n"
    "import equarx_ref as eq\n"
    "\n"
    "devices = eq.setup_devices(8)  # 8 real chips if present, else 8 CPU devices\n"
    "print(eq.describe_devices(devices))"
)
# Notebook-level metadata that is allowed to stay; everything else is volatile.
KEEP_NB_METADATA = {"kernelspec", "language_info"}
TIMEOUT_S = 600


def repo_url() -> str:
    """The repository URL, from pyproject's `[project.urls] Repository` (the one place it lives)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["urls"]["Repository"].rstrip("/")


def colab_url(nb_path: Path, url: str | None = None) -> str:
    url = url or repo_url()
    rel = Path(nb_path).resolve().relative_to(ROOT).as_posix()
    return url.replace("https://github.com/", "https://colab.research.google.com/github/") + (
        f"/blob/main/{rel}"
    )


def badge(nb_path: Path, url: str | None = None) -> str:
    return f"[![Open In Colab]({BADGE_SVG})]({colab_url(nb_path, url)})"


def install_source(url: str | None = None) -> str:
    url = url or repo_url()
    return (
        "# NBVAL_IGNORE_OUTPUT\n"
        f"{INSTALL_MARK}\n"
        "import sys\n"
        "\n"
        'if "google.colab" in sys.modules:\n'
        f'    %pip install --quiet "equarx-ref @ git+{url}"'
    )


def _src(cell) -> str:
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


def _load(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _save(path: Path, nb: dict) -> None:
    import nbformat

    nbformat.write(nbformat.from_dict(nb), str(path))


def apply_header(path: Path) -> bool:
    """Rewrite the badge in cell 1 and the install cell 2; insert cells 2-3 if absent."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    cells = nb.cells
    if not cells or cells[0].cell_type != "markdown":
        raise SystemExit(f"{path}: the first cell must be markdown (title, badge, goals)")
    first = cells[0].source
    new_badge = badge(path)
    if BADGE_RE.search(first):
        first = BADGE_RE.sub(lambda _: new_badge, first, count=1)
    else:  # badge goes right under the title line
        lines = first.split("\n")
        first = "\n".join([lines[0], "", new_badge, *lines[1:]])
    changed = first != cells[0].source
    cells[0].source = first
    if len(cells) > 1 and INSTALL_MARK in cells[1].source:
        if cells[1].source != install_source():
            cells[1].source = install_source()
            changed = True
    else:
        cells.insert(1, nbformat.v4.new_code_cell(install_source()))
        changed = True
    if len(cells) < 3 or "eq.setup_devices(" not in cells[2].source:
        cells.insert(2, nbformat.v4.new_code_cell(SETUP_SOURCE))
        changed = True
    if changed:
        nbformat.write(nb, str(path))
    return changed


def new(path: Path, title: str) -> None:
    import nbformat

    path = Path(path)
    if path.exists():
        raise SystemExit(f"{path} exists")
    num = path.name.split("_")[0]
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell(
            f"# {num} · {title}\n\n{badge(path)}\n\n**You will learn**\n\n- ...\n"),
        nbformat.v4.new_code_cell(install_source()),
        nbformat.v4.new_code_cell(SETUP_SOURCE),
        nbformat.v4.new_markdown_cell("## Summary\n\n## Exercises\n"),
    ]
    nbformat.write(nb, str(path))


def strip(paths: list[Path]) -> None:
    """nbstripout --keep-output --keep-count: drop volatile metadata, keep outputs and counts."""
    subprocess.run([sys.executable, "-m", "nbstripout", "--keep-output", "--keep-count",
                    *map(str, paths)], check=True)


def run(path: Path) -> float:
    """Refresh the header, execute the notebook in place (in its folder), strip it."""
    import time

    import nbformat
    from nbclient import NotebookClient

    path = Path(path).resolve()
    apply_header(path)
    nb = nbformat.read(str(path), as_version=4)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    t0 = time.perf_counter()
    client = NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    finally:
        nbformat.write(nb, str(path))
    dt = time.perf_counter() - t0
    strip([path])
    print(f"{path.relative_to(ROOT)}: executed in {dt:.1f} s")
    return dt


def problems(path: Path, url: str | None = None) -> list[str]:
    """What is wrong with a stored notebook (empty list: nothing). Used by the tests."""
    path = Path(path)
    url = url or repo_url()
    nb = _load(path)
    out = []
    cells = nb.get("cells", [])
    if len(cells) < 3:
        return [f"{path.name}: fewer than three cells"]
    c0, c1, c2 = cells[:3]
    if c0["cell_type"] != "markdown" or not re.match(r"# \d\d · \S", _src(c0)):
        out.append("cell 1 is not a markdown cell starting '# NN · Title'")
    if badge(path, url) not in _src(c0):
        out.append(f"cell 1 has no Colab badge pointing at {colab_url(path, url)}")
    if c1["cell_type"] != "code" or _src(c1) != install_source(url):
        out.append(f"cell 2 is not the Colab-only install cell for {url} "
                   "(run: python notebooks/nbtool.py header <notebook>)")
    if c2["cell_type"] != "code" or "eq.setup_devices(8)" not in _src(c2) \
            or "eq.describe_devices(" not in _src(c2):
        out.append("cell 3 does not call eq.setup_devices(8) and print eq.describe_devices")
    extra = set(nb.get("metadata", {})) - KEEP_NB_METADATA
    if extra:
        out.append(f"volatile notebook metadata {sorted(extra)} (run nbtool.py strip)")
    for i, c in enumerate(cells, 1):
        if c.get("metadata"):
            out.append(f"cell {i}: volatile cell metadata {sorted(c['metadata'])}")
        if c["cell_type"] != "code":
            continue
        if _src(c).lstrip().startswith("# NBVAL_SKIP"):
            out.append(f"cell {i}: # NBVAL_SKIP (every cell runs under nbval; none is skipped)")
        if c.get("execution_count") is None:
            out.append(f"cell {i}: not executed (execution_count is null)")
        for o in c.get("outputs", []):
            if o.get("output_type") == "error":
                out.append(f"cell {i}: stored error output {o.get('ename')}")
    # nbstripout must have nothing left to do
    proc = subprocess.run([sys.executable, "-m", "nbstripout", "--keep-output", "--keep-count",
                           "--verify", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        out.append("nbstripout --keep-output --keep-count would still change it "
                   "(run: python notebooks/nbtool.py strip <notebook>)")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd, args = argv[0], [Path(a) for a in argv[1:]]
    if cmd == "new":
        new(args[0], " ".join(map(str, args[1:])) or "Title")
    elif cmd == "header":
        for p in args:
            print(f"{p}: {'updated' if apply_header(p) else 'ok'}")
    elif cmd == "run":
        for p in args:
            run(p)
    elif cmd == "strip":
        strip(args)
    elif cmd == "check":
        bad = 0
        for p in args:
            for msg in problems(p):
                print(f"{p}: {msg}")
                bad += 1
        print("ok" if not bad else f"{bad} problem(s)")
        return 1 if bad else 0
    else:
        print(f"unknown command {cmd!r}\n{__doc__}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
