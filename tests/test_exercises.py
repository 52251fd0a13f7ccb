"""Every exercise of the course passes its own reference solution, and chapter 01 reads in order.

An exercise's check cell prints its verdict on the reference solution ("reference solution:
True", or "right"), and nbval re-runs that cell and compares what it prints with the stored
output. So the stored verdict is what CI holds the run to: a stored "False" made nbval pass an
exercise whose reference solution fails its own check (chapter 01's exercise 2, 02's first and
04's second did). Here every exercise of every notebook, found by parsing the notebooks:
its check cell is one nbval compares, and its stored verdict passes. `nbtool check` reports the
same (`nbtool.exercise_problems`), shown failing on a stored False.

Chapter 01 is where a newcomer starts: each term it leans on is said in bold, where it is first
used, before any other use of it. And the Colab badge, which cannot open a notebook of a
repository that is not public, is followed by a line that says so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import load_nbtool

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


nbtool = load_nbtool()


def _src(cell) -> str:
    return "".join(cell["source"])


def _exercises():
    out = []
    for nb in NOTEBOOKS:
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        for i, cell in enumerate(cells):
            if cell["cell_type"] == "code" and _src(cell).startswith(nbtool.SOLUTION_TITLE):
                out.append(pytest.param(cells[i], cells[i + 1] if i + 1 < len(cells) else None,
                                        id=f"{nb.stem}-cell{i + 1}"))
    return out


EXERCISES = _exercises()


def test_every_notebook_has_exercises():
    notebooks = {p.id.split("-cell")[0] for p in EXERCISES}
    assert notebooks == {nb.stem for nb in NOTEBOOKS}, notebooks
    assert len(EXERCISES) >= 2 * len(NOTEBOOKS)


@pytest.mark.parametrize(("solution", "check"), EXERCISES)
def test_the_reference_solution_passes_its_check(solution, check):
    """The check cell follows the solution, nbval compares its output, and that stored output
    says the reference solution passed: one verdict line, ending in True or "right"."""
    assert check is not None and check["cell_type"] == "code", "no check cell"
    assert _src(check).startswith("# NBVAL_CHECK_OUTPUT"), "nbval does not compare this check"
    shown = "".join("".join(o.get("text", "")) for o in check.get("outputs", []))
    verdicts = [line for line in shown.splitlines() if line.startswith("reference solution")]
    assert len(verdicts) == 1, f"the stored check output has no one verdict line: {shown!r}"
    assert re.search(r": (True|right)$", verdicts[0]), \
        f"the reference solution fails its own check: {verdicts[0]!r}"


@pytest.mark.parametrize("verdict", ["reference solution: False",
                                     "reference solution: not right: try again",
                                     "reference solution, bitwise: False", "no verdict"])
def test_nbtool_reports_a_stored_failing_verdict(tmp_path, verdict):
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": "## Exercises"},
        {"cell_type": "markdown", "metadata": {}, "source": "### Exercise 1\n\nWhat is 1 + 1?"},
        {"cell_type": "code", "metadata": {}, "execution_count": 1, "outputs": [],
         "source": f"answer_1 = None  {nbtool.LEARNER_MARK}"},
        {"cell_type": "code", "metadata": nbtool.SOLUTION_METADATA, "execution_count": 2,
         "outputs": [], "source": f"{nbtool.SOLUTION_TITLE}\nsolution_1 = 3"},
        {"cell_type": "code", "metadata": {}, "execution_count": 3,
         "source": f"{nbtool.CHECKED}\ndef exercise_1(x):\n    return x == 2\n\n\n"
                   "print('reference solution:', exercise_1(solution_1))\n"
                   "print('your answer:', 'not yet' if answer_1 is None else "
                   "exercise_1(answer_1))",
         "outputs": [{"output_type": "stream", "name": "stdout",
                      "text": f"{verdict}\nyour answer: not yet\n"}]},
    ]
    path = tmp_path / "01_t.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    problems = nbtool.exercise_problems(path)
    assert any("does not pass the reference solution" in p for p in problems), problems


#: The terms chapter 01 leans on, each said in bold where it is first used.
TERMS = ("AllReduce", "bf16", "pytree", "binade", "e4m3", "e2m1")


@pytest.mark.parametrize("term", TERMS)
def test_chapter_01_says_what_a_term_is_before_using_it(term):
    cells = json.loads((ROOT / "notebooks" / "01_quantization.ipynb").read_text("utf-8"))["cells"]
    text = "\n".join(_src(c) for i, c in enumerate(cells) if i != 1)  # not the install cell
    first = re.search(rf"(?i)(?<![\w-]){re.escape(term)}", text)
    assert first is not None, term
    said = text.find(f"**{term}**")
    assert said != -1 and said + 2 == first.start(), (
        f"chapter 01 uses {term!r} first at {text[max(0, first.start() - 60):first.end()]!r}, "
        f"before saying what it is (in bold, **{term}**)")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[nb.stem for nb in NOTEBOOKS])
def test_the_badge_says_it_cannot_work_yet(nb):
    first = _src(json.loads(nb.read_text(encoding="utf-8"))["cells"][0])
    badge = first.index("[![Open In Colab]")
    after = first[badge:].split("\n\n")[1]
    if not nbtool.REPOSITORY_PUBLIC:
        assert after.startswith("*The repository is not public yet"), after
        assert "upload the notebook" in after
