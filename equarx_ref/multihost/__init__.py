"""Multi-host: the same AllReduce as N processes of one JAX job, over real sockets and links.

Simulated devices share memory, so they time the quantizer, never a link. Here every emulated
host is its own process, joined into one JAX job; XLA:CPU runs the collectives through gloo
over TCP, on loopback or, as root, over links capped by `tc` in a network namespace per host.
The program is unchanged, so the results are checked to be bitwise those of one process.

    network.py   link rates, namespaces, veths, the tbf cap, the cleanup guardian
    launcher.py  `run`: checks, spawning and watching the workers, the report and its Chip
    worker.py    one host's program and calibration; the single-process reference

Run it from the command line: `equarx-ref bench --hosts 4 --link 1gbit --mib 32`; draw a run
with `equarx_ref.viz.plot_measured`.
"""

from .._lazy import submodules
from .launcher import DEFAULT_ALGORITHMS, DEFAULT_FORMATS, DEFAULT_SIZES, run
from .network import leftovers, parse_rate

__all__ = ["DEFAULT_ALGORITHMS", "DEFAULT_FORMATS", "DEFAULT_SIZES", "leftovers", "parse_rate",
           "run"]

__getattr__ = submodules(__name__)  # eq.multihost.MODULE loads MODULE on first read
