"""Progress on stderr, with or without tqdm.

tqdm comes with the `gemma` extra only, and the commands that show progress (`sweep`,
`bench --hosts`) must work on a base install. So a run asks for a callback, `bar(message)` once
per finished step and `bar(None)` at the end; it is a tqdm bar when tqdm is installed and a
one-line counter (`\\r  3/12 ring int8`) when it is not, and does nothing when progress is off.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

__all__ = ["progress_bar"]


def progress_bar(total: int, enabled: bool = True, *, unit: str = "config",
                 desc: str | None = None) -> Callable[[str | None], None]:
    """A callback: `bar(message)` counts one step done and shows `message`; `bar(None)` ends."""
    if not enabled:
        return lambda _message: None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        bar = tqdm(total=total, unit=unit, leave=False, file=sys.stderr, desc=desc)

        def step(message):
            if message is None:
                bar.close()
            else:
                bar.set_postfix_str(message, refresh=False)
                bar.update()
        return step
    done = [0]
    prefix = f"{desc}: " if desc else ""

    def count(message):
        if message is None:
            if done[0]:
                print(file=sys.stderr, flush=True)
            return
        done[0] += 1
        print(f"\r  {prefix}{done[0]}/{total} {message:<50}", end="", file=sys.stderr,
              flush=True)
    return count
