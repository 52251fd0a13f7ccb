"""equarx-ref: a reference implementation and course for quantized AllReduce in JAX.

The public API is re-exported here; nothing is defined in this file.
"""

from .devices import describe_devices, make_mesh, setup_devices

__all__ = ["setup_devices", "describe_devices", "make_mesh"]
