"""The stored results the course and the docs read, shipped inside the package.

Some results take root, minutes or real weights to make: the multi-host runs over capped links,
Gemma 3's quality under each quantized AllReduce, the static-int4 outlier study, the sweep map.
A notebook cannot rerun them in its minute, so the package carries their output, and a learner
with the wheel alone (on Colab, say) reads the same numbers as a clone of the repository.

Each `NAME.json` here is an envelope around what one command wrote:

    {"name": ..., "command": "equarx-ref ...",          # the command that made it
     "made_with": {"jax": ..., "python": ...},          # where it was made
     "sources": {"modules": [...], "digest": "..."},    # the code that produced it
     "result": ...}                                     # the command's own JSON output

`sources.digest` fingerprints the package modules behind the command (their code, not their
docstrings, imports or file paths), so the tests can tell when that code changed after the file
was made; `python docs/hooks.py refresh NAME.json` in a clone reruns the command and stamps it.

    from equarx_ref import data
    data.names()                      # ['bench', 'demo', 'gemma', ...]
    run = data.load("multihost-1gbit")  # the command's output
    data.command("multihost-1gbit")   # 'equarx-ref bench --hosts 4 --link 1gbit ...'
"""

from __future__ import annotations

import json
from importlib import resources

__all__ = ["command", "info", "load", "names"]

_ENVELOPE = ("name", "command", "made_with", "sources", "result")


def names() -> list[str]:
    """The stored results, by name (a file NAME.json of this folder each), sorted."""
    return sorted(f.name.removesuffix(".json") for f in resources.files(__name__).iterdir()
                  if f.name.endswith(".json"))


def _read(name: str) -> dict:
    if not isinstance(name, str):
        raise TypeError(f"a stored result's name is a str such as 'demo', not {name!r}")
    known = names()
    if name not in known:
        hint = " (without '.json')" if name.removesuffix(".json") in known else ""
        raise ValueError(f"no stored result named {name!r}{hint}; "
                         f"the package ships {', '.join(known)}")
    text = resources.files(__name__).joinpath(f"{name}.json").read_text(encoding="utf-8")
    envelope = json.loads(text)
    if not isinstance(envelope, dict) or set(envelope) != set(_ENVELOPE):
        raise ValueError(f"equarx_ref/data/{name}.json is not a stamped result (keys "
                         f"{', '.join(_ENVELOPE)}); remake it: python docs/hooks.py refresh "
                         f"{name}.json")
    return envelope


def load(name: str):
    """The output of the command that made the stored result `name` (a dict or a list)."""
    return _read(name)["result"]


def command(name: str) -> str:
    """The command that made the stored result `name`, as typed in a clone of the repository."""
    return _read(name)["command"]


def info(name: str) -> dict:
    """Where the stored result `name` comes from: its command, the jax and Python it was made
    with, and the package modules (with their digest) that produced it."""
    envelope = _read(name)
    return {k: envelope[k] for k in _ENVELOPE if k != "result"}
