"""What every generator shares: paths, the `Section` it returns, tables, figures, stored data."""

from __future__ import annotations

import dataclasses
import io
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class Section:
    """Markdown to put where a marker was, and the PNG figures it links to (site path -> bytes)."""

    markdown: str
    figures: dict[str, bytes] = dataclasses.field(default_factory=dict)


def table(header: list[str], rows: list[list]) -> str:
    """A markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def png(fig) -> bytes:
    """A matplotlib figure as PNG bytes (the figure is closed)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def load(name: str):
    """The stored output NAME (e.g. "demo.json") of a command, as `equarx_ref.data` ships it."""
    from equarx_ref import data

    return data.load(name.removesuffix(".json"))


def repo_url() -> str:
    """pyproject's `[project.urls] Repository`: the one place the repository URL lives."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["urls"]["Repository"].rstrip("/")


def nbtool():
    """notebooks/nbtool.py, which makes the notebooks' install cell and, from the same facts
    (where the package is published, if anywhere; its jax range), the install instructions."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("nbtool", ROOT / "notebooks" / "nbtool.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def install() -> Section:
    """How to install the package: `nbtool.install_markdown()`, the notebooks' install facts."""
    return Section(nbtool().install_markdown())
