"""The course notebooks: consistent openings, stored executed and clean, all collected by nbval.

nbval itself runs the notebooks (pytest collects `notebooks/*.ipynb` with `--nbval-lax`); these
tests check what nbval does not: the Colab badge and install cell agree with the one repository
URL in pyproject.toml, outputs are stored with their execution counts, volatile metadata is gone,
and no notebook is left out of the run.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _nbtool():
    spec = importlib.util.spec_from_file_location("nbtool", ROOT / "notebooks" / "nbtool.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


nbtool = _nbtool()


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 3, [p.name for p in NOTEBOOKS]


def test_repository_url_lives_in_pyproject():
    with open(ROOT / "pyproject.toml", "rb") as f:
        url = tomllib.load(f)["project"]["urls"]["Repository"]
    assert url.startswith("https://github.com/"), url
    assert nbtool.repo_url() == url.rstrip("/")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_opening_and_cleanliness(nb):
    """Badge + Colab-only install from pyproject's URL; executed; nbstripout-clean."""
    problems = nbtool.problems(nb)
    assert not problems, f"{nb.name}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_has_checked_cells_and_exercises(nb):
    import json

    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert any(s.startswith("# NBVAL_CHECK_OUTPUT") for s in code), "no checked cell"
    assert "## Summary" in text and "## Exercises" in text, "no summary / exercises section"
    for c in cells:
        if c["cell_type"] == "code" and "".join(c["source"]).startswith("# NBVAL_CHECK_OUTPUT"):
            assert c["outputs"], "a checked cell has no stored output to compare"


def test_default_run_collects_every_notebook_once():
    """The README's plain `python -m pytest` (pyproject's addopts and testpaths) collects every
    notebook in notebooks/ exactly once: not skipped, not excluded, not twice through docs/."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        ini = tomllib.load(f)["tool"]["pytest"]["ini_options"]
    assert "notebooks" in ini["testpaths"], ini["testpaths"]
    assert not any(p.startswith("docs") for p in ini["testpaths"]), ini["testpaths"]
    assert "--nbval-lax" in ini.get("addopts", ""), f"addopts lacks --nbval-lax: {ini}"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    collected = [line.split("::")[0] for line in out.splitlines() if "::" in line]
    notebooks = {path for path in collected if path.endswith(".ipynb")}
    assert notebooks == {f"notebooks/{nb.name}" for nb in NOTEBOOKS}, notebooks
    assert not any("nbtool" in path for path in collected), "nbtool.py collected as a test"


def test_sanitize_file_parses():
    """nbval reads `regex: ...` / `replace: ...` pairs; each section must yield one pair (an empty
    replacement needs its trailing space, which an editor may strip)."""
    import configparser

    from nbval.plugin import get_sanitize_patterns

    path = ROOT / "notebooks" / "sanitize.cfg"
    pairs = get_sanitize_patterns(path.read_text(encoding="utf-8"))
    cfg = configparser.ConfigParser()
    cfg.read(path)
    assert len(pairs) == len(cfg.sections()), (pairs, cfg.sections())
    import re

    for rx, _ in pairs:
        re.compile(rx)
