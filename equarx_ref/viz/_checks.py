"""What every figure function checks first: the Axes to draw on, the title, the data and the
file to save to, each refused in one line naming the argument.

The data of a figure are loosely typed (rows of `runs.demo.Row`, dicts of a JSON report): here
only their shape at the top is checked (a non-empty list, a dict with the keys drawn), so that
`None`, a number or an empty list is refused by name instead of failing deep in matplotlib.
"""

from __future__ import annotations

from os import PathLike

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

__all__ = ["axes", "items", "mapping", "path", "title"]


def axes(ax, figsize: tuple[float, float]) -> Axes:
    """`ax` if it is a matplotlib Axes, a new figure's Axes of `figsize` if None, else an error."""
    if ax is None:
        return plt.subplots(figsize=figsize)[1]
    if not isinstance(ax, Axes):
        raise TypeError(f"ax must be a matplotlib Axes or None, got {type(ax).__name__}")
    return ax


def title(value) -> str | None:
    """`value` if it is None or a str, else a TypeError naming `title`."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f"title must be a str or None, got {type(value).__name__}")
    return value


def items(value, what: str) -> list:
    """`value` as a list if it is a non-empty list or tuple, else an error naming `what`."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{what} must be a list, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} is empty: nothing to draw")
    return list(value)


def mapping(value, what: str, keys: tuple[str, ...]) -> dict:
    """`value` if it is a dict holding `keys`, else an error naming `what` and the keys."""
    if not isinstance(value, dict) or not set(keys) <= set(value):
        got = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise (ValueError if isinstance(value, dict) else TypeError)(
            f"{what} must be a dict with keys {list(keys)}, got {got}")
    return value


def path(value) -> str | PathLike | None:
    """`value` if it is None or a non-empty file name (str or os.PathLike), else an error."""
    if value is not None and (not isinstance(value, (str, PathLike)) or not str(value)):
        raise TypeError(f"path must be a file name (str or os.PathLike) or None, got {value!r}")
    return value
