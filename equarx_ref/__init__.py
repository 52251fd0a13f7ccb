"""equarx-ref: a reference implementation and course for quantized AllReduce in JAX.

The library you read in an afternoon is ten flat files, about 1,320 lines of code (the contributing
page's layout counts them): `formats.py` (what one number costs on the wire), `elements.py` (element
codes and their packing), `scales.py` (one scale per block, exactly), `quantize.py` (block-wise
quantization), `wire.py` (the bytes a collective sends: their layout and the codec),
`schedule.py` (who sends which chunk to whom, the algorithms and their rules, the one walk over
a schedule), `execute.py` (a schedule run as shard_map collectives), `collectives.py`
(`all_reduce` and `AllReduce`), `rules.py` (their argument rules) and `devices.py` (real or
simulated devices, meshes). Everything else sits in a folder named for its purpose: `models/`,
`remedies/`, `kernels/`, `outliers/`, `gemma/`, `runs/`, `viz/`, `multihost/`, `cli/`; imports
go one way (docs/contributing.md).

The public API is re-exported here; nothing is defined in this file. The heavy parts, `gemma`
(the model), `kernels` (Pallas) and `viz` (matplotlib), load on first use, so `import
equarx_ref` stays quick; so does `outliers` (static int4 with bf16 outlier features), a
module of its own namespace.
"""

import importlib

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

_LAZY = ("gemma", "kernels", "outliers", "viz")


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'equarx_ref' has no attribute {name!r}")


__all__ = [
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
