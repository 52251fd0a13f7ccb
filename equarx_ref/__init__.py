"""equarx-ref: a reference implementation and course for quantized AllReduce in JAX.

The library you read in an afternoon is the core, flat files at the top of the package (the
contributing page counts their lines): `formats.py` (what one number costs on the wire),
`elements.py` (element codes and their packing), `scales.py` (one scale per block, exactly),
`rounding.py` (values onto the element grid, exactly), `quantize.py` (block-wise quantization),
`wire.py` (the bytes a collective sends: their layout and the codec), `program.py` (a schedule
as data, and the one walk over it), `schedule.py` (who sends which chunk to whom: the
algorithms and their rules), `execute.py` (a schedule run as shard_map collectives),
`collectives.py` (`all_reduce` and `AllReduce`), `rules.py` (their argument rules) and
`devices.py` (real or simulated devices, meshes). Everything else sits in a folder named for
its purpose: `spec/`, `models/`, `remedies/`, `kernels/`, `outliers/`, `gemma/`, `runs/`,
`viz/`, `multihost/`, `cli/`; imports go one way, the spec under the core under the rest
(docs/contributing.md). What the core needs from a folder above it (a size gate, a hop plan, a
rotation, a kernel codec) it looks up by name (`extensions.py`); `_PROVIDERS` here says where
each lives.

The public API is re-exported here; none of it is defined in this file, only how it loads: on
first use (PEP 562's module `__getattr__`), so `import equarx_ref` loads nothing else, not even
jax: `from equarx_ref import spec` runs where only NumPy and ml_dtypes are installed, and
`eq.Format`, `eq.all_reduce`, ... import their module (and jax) the first time they are read.
The subpackages load the same way: `eq.gemma` (the model), `eq.kernels` (Pallas), `eq.viz`
(matplotlib), `eq.outliers` (static int4 with bf16 outlier features), `eq.spec`; and each
folder's modules in turn (`eq.models.cost`, `eq.runs.sweep`: `_lazy.py`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the same names, for readers and tools; at run time `_EXPORTS` loads them
    from .collectives import AllReduce, all_reduce
    from .devices import describe_devices, make_mesh, setup_devices
    from .formats import FORMAT_NAMES, Format, format_label, parse_format
    from .models.cost import CHIPS, Chip, best_num_chunks, predicted_time
    from .models.error import gaussian_relative_error, quantized_sizes
    from .models.hlo import hlo_wire_bytes
    from .models.predict import predicted_relative_error, wire_bytes
    from .quantize import Quantized, dequantize, quantize
    from .schedule import (
        ALGORITHMS,
        Schedule,
        Step,
        Transfer,
        bidir_ring_schedule,
        layout,
        make_schedule,
        one_shot_schedule,
        ring_schedule,
        simulate,
        torus_schedule,
        two_shot_schedule,
    )

#: Each public name and the module (relative to this package) that defines it.
_EXPORTS = {
    **dict.fromkeys(["AllReduce", "all_reduce"], "collectives"),
    **dict.fromkeys(["describe_devices", "make_mesh", "setup_devices"], "devices"),
    **dict.fromkeys(["FORMAT_NAMES", "Format", "format_label", "parse_format"], "formats"),
    **dict.fromkeys(["CHIPS", "Chip", "best_num_chunks", "predicted_time"], "models.cost"),
    **dict.fromkeys(["gaussian_relative_error", "quantized_sizes"], "models.error"),
    "hlo_wire_bytes": "models.hlo",
    **dict.fromkeys(["predicted_relative_error", "wire_bytes"], "models.predict"),
    **dict.fromkeys(["Quantized", "dequantize", "quantize"], "quantize"),
    **dict.fromkeys(["ALGORITHMS", "Schedule", "Step", "Transfer", "bidir_ring_schedule",
                     "layout", "make_schedule", "one_shot_schedule", "ring_schedule",
                     "simulate", "torus_schedule", "two_shot_schedule"], "schedule"),
}
#: The subpackages named in `__all__` (any other submodule loads on first use too).
_SUBPACKAGES = ("gemma", "kernels", "outliers", "viz")
#: Where the core's extension points are provided (`extensions.py`): what `all_reduce` needs
#: from the folders above the core, which it looks up by name and imports only when asked.
_PROVIDERS = {
    "size_gate": "models.predict:quantizing_saves_bytes",
    "chip_gate": "models.cost:default_min_bytes",
    "hop_plan": "models.hops:hop_plan",
    "rotate": "remedies.rotation:rotate",
    "unrotate": "remedies.rotation:inverse_rotate",
    "mosaic_codec": "kernels.mosaic_codec:MosaicCodec",
    "pallas_ring": "kernels.ring:ring_all_reduce",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(_load(_EXPORTS[name], name), name)
        globals()[name] = value  # read once: later reads skip this function
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return _load(name, name)  # a submodule: eq.gemma, eq.spec
    raise AttributeError(f"module 'equarx_ref' has no attribute {name!r}")


def _load(module: str, name: str) -> types.ModuleType:
    """Import `.module` for `eq.name`; without jax, say what runs without it."""
    try:
        return importlib.import_module(f".{module}", __name__)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in ("jax", "jaxlib"):
            raise
        raise ModuleNotFoundError(f"equarx_ref.{name} needs jax, which is not installed (pip "
                                  f"install equarx-ref brings it); without jax, "
                                  f"equarx_ref.spec runs", name=e.name) from None


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """This package's module: a submodule named like the function it exports (`quantize.py`
    and `quantize`) is bound as a package attribute by the import system when it loads; the
    public name keeps the function."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name) == name \
                and value.__name__ == f"{__name__}.{name}":
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
for _point, _where in _PROVIDERS.items():  # plain Python: loads nothing until looked up
    importlib.import_module(".extensions", __name__).register(_point, _where)
del _point, _where

__all__ = [  # `_EXPORTS` and `_SUBPACKAGES` (tests/test_lazy_import.py holds them equal)
    "ALGORITHMS",
    "CHIPS",
    "FORMAT_NAMES",
    "AllReduce",
    "Chip",
    "Format",
    "Quantized",
    "Schedule",
    "Step",
    "Transfer",
    "all_reduce",
    "best_num_chunks",
    "bidir_ring_schedule",
    "dequantize",
    "describe_devices",
    "format_label",
    "gaussian_relative_error",
    "gemma",
    "hlo_wire_bytes",
    "kernels",
    "layout",
    "make_mesh",
    "make_schedule",
    "one_shot_schedule",
    "outliers",
    "parse_format",
    "predicted_relative_error",
    "predicted_time",
    "quantize",
    "quantized_sizes",
    "ring_schedule",
    "setup_devices",
    "simulate",
    "torus_schedule",
    "two_shot_schedule",
    "viz",
    "wire_bytes",
]
