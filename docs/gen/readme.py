"""The README's generated blocks: its results tables, made from equarx_ref/data/*.json like the
site's, and its install instructions, made by notebooks/nbtool.py like the notebooks' cell.

The README marks each generated block `<!-- gen:readme-NAME -->` ... `<!-- /gen:readme-NAME -->`;
`render` fills every block from the stored data, `python docs/hooks.py readme` writes the result
(`refresh` does it after rerunning the commands) and tests/test_docs.py checks that the README
equals its rendering, so its numbers are the data's.
"""

from __future__ import annotations

import re

from . import bench, beyond, demo, gemma, layout, model, multihost
from .commands import COMMANDS
from .common import ROOT, load, nbtool

README = ROOT / "README.md"
BLOCK = re.compile(r"(<!-- gen:readme-([a-z0-9-]+) -->\n)(.*?)(<!-- /gen:readme-\2 -->)", re.S)


def _demo() -> str:
    data, rows = demo.rows()
    return f"`{COMMANDS['demo.json']}`: {demo.setting(data)}\n\n{demo.full_table(rows)}\n"


def _bench() -> str:
    return f"`{COMMANDS['bench.json']}`:\n\n{bench.bench_table(load('bench.json'))}\n"


def _gemma() -> str:
    report = load("gemma.json")
    return (f"`{COMMANDS['gemma.json']}`: {gemma.setting(report['meta'])} Each cell: ΔNLL ± "
            "its paired standard error (nats per token; \"~\": within noise) / top-1 agreement "
            f"with the exact run.\n\n{gemma.pivot_table(report)}\n")


def _install() -> str:
    return nbtool().install_markdown() + "\n"


def _beyond() -> str:
    return beyond.readme_block()


BLOCKS = {"demo": _demo, "bench": _bench, "gemma": _gemma, "model": model.readme,
          "multihost": multihost.readme, "beyond": _beyond, "install": _install,
          "layout": layout.readme_block}


def render(text: str) -> str:
    """`text` with every generated block made anew from the data."""
    def fill(m):
        if m.group(2) not in BLOCKS:
            raise KeyError(f"README: no block named {m.group(2)!r}; known: {sorted(BLOCKS)}")
        return m.group(1) + BLOCKS[m.group(2)]() + m.group(4)
    return BLOCK.sub(fill, text)


def update() -> bool:
    """Rewrite README.md's generated blocks; True if anything changed."""
    old = README.read_text(encoding="utf-8")
    new = render(old)
    if new != old:
        README.write_text(new, encoding="utf-8")
    return new != old
