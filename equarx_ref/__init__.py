"""equarx-ref: a reference implementation and course for quantized AllReduce in JAX.

The public API is re-exported here; nothing is defined in this file.
"""

from . import gemma, viz
from .collectives import (
    ALGORITHMS,
    all_reduce,
    hlo_wire_bytes,
    predicted_relative_error,
    quantized_sizes,
    wire_bytes,
)
from .devices import describe_devices, make_mesh, setup_devices
from .formats import Format
from .quantize import Quantized, dequantize, gaussian_relative_error, quantize
from .schedule import (
    Schedule,
    Step,
    Transfer,
    bidir_ring_schedule,
    make_schedule,
    one_shot_schedule,
    ring_schedule,
    simulate,
    torus_schedule,
    two_shot_schedule,
)

__all__ = [
    "ALGORITHMS",
    "Format",
    "Quantized",
    "Schedule",
    "Step",
    "Transfer",
    "all_reduce",
    "bidir_ring_schedule",
    "dequantize",
    "describe_devices",
    "gaussian_relative_error",
    "gemma",
    "hlo_wire_bytes",
    "make_mesh",
    "make_schedule",
    "one_shot_schedule",
    "predicted_relative_error",
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
