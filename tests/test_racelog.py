"""`kernels.RaceLog` captures the race detector's reports whichever way jax emits them (jax 0.10
prints them; jax 0.12 logs a read race through its module's logger and a write race through
the root logger), keeps them from the screen, and holds the text of each one."""

import logging
import re

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref import kernels

REPORT = "RACE DETECTED\n  write of ('vmem', 1)[0:4] from 1, x.py:10:1\n  read of ... x.py:7:2\n"


class _Seen(logging.Handler):
    """Everything that reaches a handler on the root logger, as a learner's screen would."""

    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _watch_root():
    seen = _Seen()
    logging.getLogger().addHandler(seen)
    return seen


def test_every_channel_is_captured_and_kept_off_the_screen(capsys):
    seen = _watch_root()
    try:
        module_logger = logging.getLogger("jax._src.pallas.mosaic.interpret.race_detection_state")
        with kernels.RaceLog() as log:
            print(REPORT.replace("1)", "2)"))               # jax 0.10
            module_logger.warning(REPORT.replace("1)", "3)"))  # jax 0.12, a read race
            logging.warning(REPORT.replace("1)", "4)"))        # jax 0.12, a write race
            logging.getLogger("elsewhere").warning("an unrelated warning")
    finally:
        logging.getLogger().removeHandler(seen)
    assert sorted(re.findall(r"'vmem', (\d)", "".join(log.reports))) == ["2", "3", "4"]
    assert all(r.startswith("RACE DETECTED\n  write of ('vmem', ") for r in log.reports)
    assert log.count == 3 and log.found
    assert seen.messages == ["an unrelated warning"], seen.messages
    assert "RACE" not in capsys.readouterr().out
    assert not any(f is not None for f in logging.getLogger().filters)  # nothing left behind


@pytest.mark.slow
def test_the_broken_ring_reports_its_two_accesses():
    """The sabotaged ring (no capacity wait): each report names a write and a read of the same
    VMEM receive slot, with the lines of ring.py they come from. On jax 0.12 a run can, rarely,
    report nothing (tests/test_kernels.py), so up to three runs."""
    mesh = eq.make_mesh(DEVICES[:4], ("ring",))
    x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    xs = jax.device_put(x, NamedSharding(mesh, P("ring")))
    body = lambda rows: kernels.ring_all_reduce(  # noqa: E731
        rows[0], "ring", fmt=eq.Format.int8(), num_chunks=2,
        interpret=kernels.race_detecting(), sabotage="capacity")
    run = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("ring"), out_specs=P()))
    seen = _watch_root()
    try:
        for _ in range(3):
            with kernels.RaceLog() as log:
                jax.block_until_ready(run(xs))
            if log.reports:
                break
    finally:
        logging.getLogger().removeHandler(seen)
    assert log.reports and log.found and log.count == len(log.reports)
    access = re.compile(r"(write|read) of \('vmem'.*? from .*?(\S+\.py):(\d+):\d+")
    for report in log.reports:
        assert report.startswith("RACE DETECTED\n"), report
        found = access.findall(report)
        assert len(found) == 2 and {f[0] for f in found} <= {"write", "read"}, report
        assert all(f[1].endswith("ring.py") for f in found), report
    assert not [m for m in seen.messages if "RACE" in m], seen.messages[:1]
