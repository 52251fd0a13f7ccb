"""Where a kernel runs, and what TPU interpret mode's race detector saw.

On a TPU, Pallas compiles a kernel with Mosaic and runs it on the chip. Anywhere else, TPU
interpret mode (`pltpu.InterpretParams`) runs the same kernel on CPU devices: every device is a
thread, VMEM, HBM, DMAs and semaphores are simulated, and with `detect_races=True` each read and
write carries a vector clock, so two accesses to one buffer that no semaphore orders are
reported, whether or not they collided in this run.

The detector keeps its result in jax's private module state (`races.races_found`, a flag) and
reports each race as a "RACE DETECTED" text: jax 0.10 prints it; jax 0.12 logs it as a warning
(with `on_race="warn"`, which `interpret_params` sets; its default, "raise", stops the kernel at
the first race), a read race through its module's logger and a write race through the root
logger (`logging.warning`). `RaceLog` resets the state and captures the reports whichever way
they come: stdout, and a filter on the root logger and on every logger under `jax` that takes
each "RACE DETECTED" record and keeps it from any handler, so none reaches the screen.
Where the state lives moved between jax versions; `_race_state` looks where each supported
version keeps it and says so clearly when it cannot find it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import io
import logging

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._jax_private import private

__all__ = ["RaceLog", "interpret_params", "on_tpu", "race_detecting", "result_type", "varying"]

_MARK = "RACE DETECTED"  # how every report begins, printed or logged

_ABSENT = object()  # a name jax lacks (the state itself may be None)

#: Where jax keeps the interpreter's shared state, newest first (listed in `PRIVATE_JAX`).
_RACE_NAMES = ("jax._src.pallas.mosaic.interpret.interpret_pallas_call:races",
               "jax._src.pallas.mosaic.interpret:races")


def on_tpu() -> bool:
    """True when the default backend is a TPU: kernels then run natively."""
    return jax.default_backend() == "tpu"


def _mesh_platform() -> str | None:
    """The platform of the mesh being traced over (inside `shard_map`), or None outside one.
    It decides, not the default backend: on a single-chip TPU (free Colab) the default backend
    is the TPU, but a ring runs on a mesh of simulated CPU devices, where only interpret mode
    works."""
    try:
        device = jax.sharding.get_abstract_mesh().abstract_device
    except Exception:  # no mesh context, or a jax without abstract devices
        return None
    if device is None:
        return None
    platform = getattr(device, "platform", None)  # jax >= 0.10.2; before: from the kind
    return platform or ("tpu" if device.device_kind.lower().startswith("tpu") else
                        device.device_kind.lower())


def interpret_params(interpret=None):
    """`interpret=` for `pallas_call`: None picks native on a TPU (the mesh's devices inside
    `shard_map`, else the default backend), else interpret mode with the race detector on;
    True means interpret mode with the detector; False or a `pltpu.InterpretParams` is passed
    on; anything else is refused."""
    if not (interpret is None or isinstance(interpret, (bool, pltpu.InterpretParams))):
        raise TypeError(f"interpret must be None, True, False or a pltpu.InterpretParams, got "
                        f"{interpret!r}")
    if interpret is None:
        platform = _mesh_platform()
        if (platform == "tpu") if platform is not None else on_tpu():
            return False
    if interpret is None or interpret is True:
        return race_detecting()
    return interpret


def race_detecting(**options) -> pltpu.InterpretParams:
    """`pltpu.InterpretParams(detect_races=True, **options)`, reporting races without stopping
    the kernel (jax >= 0.11 raises at the first race unless `on_race="warn"`)."""
    fields = {f.name for f in dataclasses.fields(pltpu.InterpretParams)}
    if "on_race" in fields:
        options.setdefault("on_race", "warn")
    return pltpu.InterpretParams(detect_races=True, **options)


def _race_state():
    for name in _RACE_NAMES:
        if private(name, _ABSENT) is not _ABSENT:  # races is None until a kernel runs
            return importlib.import_module(name.partition(":")[0])
    raise RuntimeError(f"cannot find TPU interpret mode's race detector state in jax "
                       f"{jax.__version__} (looked for {', '.join(_RACE_NAMES)})")


class RaceLog:
    """`with RaceLog() as log: ...run kernels...`; then `log.count`, `log.found`, `log.reports`.

    Resets interpret mode's shared state on entry (also after a failed kernel, which leaves it
    set) and captures the detector's reports from stdout and from logging (module essay); each
    report is one string starting "RACE DETECTED", naming the two unordered accesses.
    """

    def __init__(self):
        self.reports: list[str] = []
        self.found = False
        self._out = io.StringIO()
        self._redirect = contextlib.redirect_stdout(self._out)
        self._logged: list[str] = []
        self._loggers: list[logging.Logger] = []
        self._quiet = logging.NullHandler()  # so logging.warning does not call basicConfig

    def _take(self, record: logging.LogRecord) -> bool:
        """A logging filter: keep a race report for us (False: no handler sees it)."""
        message = record.getMessage()
        if _MARK in message:
            self._logged.append(message)
            return False
        return True

    def __enter__(self) -> RaceLog:
        pltpu.reset_tpu_interpret_mode_state()
        self._redirect.__enter__()
        # A filter on a logger sees only records logged there, not those its children pass up:
        # put it on the root logger and on every logger jax has made.
        names = [n for n in logging.Logger.manager.loggerDict if n.split(".")[0] == "jax"]
        self._loggers = [logging.getLogger(), *map(logging.getLogger, names)]
        for logger in self._loggers:
            logger.addFilter(self._take)
        logging.getLogger().addHandler(self._quiet)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger().removeHandler(self._quiet)
        for logger in self._loggers:
            logger.removeFilter(self._take)
        self._redirect.__exit__(*exc)
        text = "".join(self._logged) + self._out.getvalue()
        self.reports = [_MARK + r for r in text.split(_MARK)[1:]]
        races = _race_state().races
        self.found = bool(self.reports) or bool(races is not None and races.races_found)
        pltpu.reset_tpu_interpret_mode_state()

    @property
    def count(self) -> int:
        """Races reported (0 when the kernel is race-free)."""
        return len(self.reports) if self.reports else int(self.found)


def varying(x: jax.Array) -> frozenset:
    """Mesh axes over which `x` may differ between devices (shard_map's check_vma types);
    jax 0.10 keeps them in `manual_axis_type.varying`, earlier versions in `vma`."""
    aval = jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None and hasattr(mat, "varying"):
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", ()) or ())


def result_type(shape, dtype, varying: frozenset, *, in_hbm: bool = False):
    """A kernel's output type for shard_map's check_vma: varying over `varying` only (jax
    0.10 says `manual_axis_type`, earlier versions `vma`). `in_hbm`: the result is placed in
    HBM (a `pl.MemoryRef`), where XLA:TPU would otherwise keep a large result in VMEM and copy
    it out after the kernel, a second pass over it."""
    params = inspect.signature(jax.ShapeDtypeStruct).parameters
    if "manual_axis_type" in params:
        from jax.sharding import ManualAxisType

        kind = {"manual_axis_type": ManualAxisType(varying=varying)}
    elif "vma" in params:
        kind = {"vma": varying}
    else:
        kind = {}
    shaped = private("jax._src.core:ShapedArray", None) if in_hbm else None
    if shaped is None:
        return jax.ShapeDtypeStruct(shape, dtype, **kind)
    return pl.MemoryRef(shaped(shape, jnp.dtype(dtype), **kind), pltpu.HBM)
