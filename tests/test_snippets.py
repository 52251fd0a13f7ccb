"""Every Python snippet a reader can copy from the docs runs as written.

Every fenced ```python block of the site's pages (docs/*.md, docs/api/*.md) and of the README
is executed, each in a fresh namespace, in this process (its 8 simulated devices are what a
snippet's `eq.setup_devices(8)` returns). A block that cannot run here says so on the line
above its fence, `<!-- snippet: not run (why) -->`, and is reported as skipped with that reason;
none is skipped silently. (No docs generator writes Python blocks: checked below, so the pages'
own text is every block there is.) A block that only prints the package's stored or measured
figures is held to nothing more than running; the README's "Use" block, whose comments state
its printed values, is also compared with them in tests/test_docs.py.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import matplotlib
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [*sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "api").glob("*.md")),
         ROOT / "README.md"]
FENCE = re.compile(r"^(?P<mark><!-- snippet: not run \((?P<why>[^)]*)\) -->\n)?```python\n"
                   r"(?P<code>.*?)^```", re.M | re.S)


def _blocks() -> list:
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for i, m in enumerate(FENCE.finditer(text)):
            line = text.count("\n", 0, m.start("code"))
            out.append(pytest.param(m.group("code"), m.group("why"), f"{page.name}:{line}",
                                    id=f"{page.relative_to(ROOT)}-{i}"))
    return out


BLOCKS = _blocks()


def test_the_pages_have_snippets():
    where = {b.values[2].split(":")[0] for b in BLOCKS}
    assert {"spec.md", "index.md", "README.md"} <= where, where


def test_no_generator_writes_a_python_block():
    """The `<!-- gen:... -->` sections are tables, figures and shell commands: if one wrote a
    Python block, this test would have to render the pages first."""
    found = [p.name for p in sorted((ROOT / "docs" / "gen").glob("*.py"))
             if re.search(r"```py", p.read_text(encoding="utf-8"))]
    assert not found, f"docs/gen writes Python blocks: {found}"


@pytest.mark.parametrize(("code", "why", "where"), BLOCKS)
def test_snippet_runs_as_written(code, why, where):
    if why is not None:
        pytest.skip(f"{where}: marked not run ({why})")
    matplotlib.use("Agg")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, where, "exec"), {"__name__": "__snippet__"})
    print(out.getvalue())
