"""One timer for every measurement: wall time of whole calls, round-robin, the median kept.

A CPU timing says little on its own (the machine is shared, its clock drifts with load), so the
runs report ratios of times measured side by side in one run. `time_calls` makes that the only
way to time: it takes every contender at once, warms each up (the first call compiles), then
calls them in turn, `repeats` rounds, so a drift in load hits all of them alike:

    round r:  t[a][r], t[b][r], ...      kept:  median_r t[x][r]   (or every t, for a max)

Each call's result is waited for (`jax.block_until_ready`: JAX dispatches asynchronously, and
a timer that stops at dispatch measures nothing). `before`, when given, runs before each timed
call and is not timed: the multi-host workers pass a barrier there, so every host starts a call
together and the slowest host's time is the collective's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

__all__ = ["medians", "time_calls"]


def time_calls(calls: dict[str, Callable[[], object]], repeats: int, *,
               before: Callable[[], object] | None = None) -> dict[str, list[float]]:
    """Seconds of each of `repeats` calls of every thunk in `calls`, round-robin, after one
    untimed warm-up call each. Returns {name: [seconds, ...]} in call order."""
    import jax

    for call in calls.values():
        jax.block_until_ready(call())  # compile, warm up
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            if before is not None:
                before()
            start = time.perf_counter()
            jax.block_until_ready(call())
            times[name].append(time.perf_counter() - start)
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    """{name: median seconds} of `time_calls`' result."""
    return {name: statistics.median(ts) for name, ts in times.items()}
