"""Every Python snippet a reader can copy from the docs runs as written.

Every fenced ```python block of the site's pages (docs/*.md, docs/api/*.md) and of the README
is executed, each in a fresh namespace, in this process (its 8 simulated devices are what a
snippet's `eq.setup_devices(8)` returns). A block that cannot run here says so on the line
above its fence, `<!-- snippet: not run (why) -->`, and is reported as skipped with that reason;
none is skipped silently. (No docs generator writes Python blocks: checked below, so the pages'
own text is every block there is.) A one-line `print(...)` whose comment starts with a value
(`print(q.size)  # 1088 bytes`, `# True: ...`) must print that value (a number to the digits the
comment gives); other prints are held to nothing more than running.
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
    said = {b.values[2].split(":")[0]: len(SAID.findall(b.values[0])) for b in BLOCKS}
    assert said["spec.md"] >= 1 and said["README.md"] == 3, said  # values the tests compare
    assert _agrees("7.998047", "7.9980469") and not _agrees("1904", "1905")
    assert not _agrees("True", "False")


def test_no_generator_writes_a_python_block():
    """The `<!-- gen:... -->` sections are tables, figures and shell commands: if one wrote a
    Python block, this test would have to render the pages first."""
    found = [p.name for p in sorted((ROOT / "docs" / "gen").glob("*.py"))
             if re.search(r"```py", p.read_text(encoding="utf-8"))]
    assert not found, f"docs/gen writes Python blocks: {found}"


#: A one-line print whose comment begins with the value it prints.
SAID = re.compile(r"^(?P<indent>[ \t]*)print\((?P<args>.*)\)[ \t]+"
                  r"(?P<comment># (?P<value>-?[\d.]+|True|False)\b.*)$", re.M)


def _agrees(said: str, printed: str) -> bool:
    if said in ("True", "False"):
        return printed == said
    decimals = len(said.partition(".")[2])
    return round(float(printed), decimals) == float(said)


@pytest.mark.parametrize(("code", "why", "where"), BLOCKS)
def test_snippet_runs_as_written(code, why, where):
    if why is not None:
        pytest.skip(f"{where}: marked not run ({why})")
    matplotlib.use("Agg")
    said = []

    def print_said(value, *args):  # the print as written, and what it printed
        text = " ".join(map(str, args))
        said.append((value, text))
        print(text)

    checked = SAID.sub(lambda m: f"{m['indent']}__print_said__({m['value']!r}, {m['args']})"
                                 f"  {m['comment']}", code)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(checked, where, "exec"), {"__name__": "__snippet__",
                                               "__print_said__": print_said})
    print(out.getvalue())
    assert len(said) == len(SAID.findall(code))
    for value, text in said:
        assert _agrees(value, text), f"{where}: a comment says {value}, the code prints {text}"
