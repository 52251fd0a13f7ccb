"""The course: every notebook in notebooks/, in order, titled by its first heading."""

from __future__ import annotations

import json

from .common import ROOT, Section

NOTEBOOKS = ROOT / "notebooks"


def notebooks() -> list[tuple[str, str]]:
    """(title, path under docs/) of each `NN_*.ipynb`, the title from its first markdown line."""
    out = []
    for nb in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        first = "".join(cells[0]["source"]).split("\n", 1)[0] if cells else ""
        out.append((first.lstrip("# ").strip() or nb.stem, f"notebooks/{nb.name}"))
    return out


def course_list() -> Section:
    """The notebooks as a list of links, in the order to run them."""
    return Section("\n".join(f"1. [{title}]({path})" for title, path in notebooks()))
