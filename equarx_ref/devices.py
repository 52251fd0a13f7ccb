"""Devices: real accelerators when there are enough, simulated CPU devices otherwise.

Every collective in this package runs inside `jax.shard_map` over a mesh of devices. On a TPU
slice those are real chips joined by ICI links; on a laptop or a Colab CPU runtime they are
*simulated*: XLA:CPU splits the host into `n` devices and runs each collective in memory. The
numerics are identical (the same HLO, the same integer and float arithmetic); only time differs.

`setup_devices(n)` must run before anything else touches JAX's backends, because the number of
CPU devices is fixed when the CPU backend starts. It asks for `n` CPU devices first (harmless on
an accelerator machine), then looks at the default backend: if it has `n` or more devices (a TPU
slice, several GPUs) those are used; otherwise (no accelerator, or today's single-chip free Colab
TPU) the `n` simulated CPU devices are, named explicitly with `jax.devices("cpu")`.

Simulated devices are bounded: at most `MAX_SIMULATED_DEVICES` (256, a TPU v5e or v6e pod, the
largest ring along one torus axis and the most a hop-aware plan takes). Beyond it one CPU
compiles a ring of thousands of hops for minutes or hours and shows nothing a smaller one does
not; real chips are not bounded.

A collective's devices are its mesh's, not the default backend's: `mesh_device_kind()` names
them inside `shard_map` (simulated CPU devices on a single-chip TPU runtime are CPU devices),
and `all_reduce`'s chip-derived size gate (`min_bytes="auto"`) reads it.
"""

from __future__ import annotations

import math

import jax
from jax.sharding import AxisType, Mesh

from ._checks import count

__all__ = ["MAX_SIMULATED_DEVICES", "describe_devices", "make_mesh", "setup_devices"]

#: The most simulated CPU devices `setup_devices` sets up (module essay).
MAX_SIMULATED_DEVICES = 256


def setup_devices(n: int = 8) -> list[jax.Device]:
    """Return `n` devices to run collectives on: real accelerators if `n` are present, else CPU.

    Call it first, right after `import jax`: the count of simulated CPU devices can only be set
    before JAX initialises its backends.

    Raises:
        ValueError: `n` is not a positive integer, or more than `MAX_SIMULATED_DEVICES` when
            fewer than `n` real chips are present (refused before any device is made).
        RuntimeError: JAX already started with fewer than `n` devices on every backend.
    """
    n = count(n, "setup_devices(n): n")
    try:  # more than the bound: only real chips can serve, and a smaller call must still work
        wanted = min(n, MAX_SIMULATED_DEVICES)
        if jax.config.jax_num_cpu_devices < wanted:
            jax.config.update("jax_num_cpu_devices", wanted)
    except RuntimeError:
        pass  # backends already up: fine if they have enough devices, checked below
    default = jax.devices()
    if default[0].platform != "cpu" and len(default) >= n:
        return list(default[:n])
    if n > MAX_SIMULATED_DEVICES:
        chips = "" if default[0].platform == "cpu" else \
            f"; {len(default)} {default[0].platform.upper()} device(s) present, fewer than {n}"
        raise ValueError(f"setup_devices(n): n must be at most MAX_SIMULATED_DEVICES = "
                         f"{MAX_SIMULATED_DEVICES} simulated CPU devices, got {n}{chips}")
    cpu = jax.devices("cpu")
    if len(cpu) < n:
        accel = "" if default[0].platform == "cpu" else \
            f" and {len(default)} {default[0].platform.upper()} device(s)"
        raise RuntimeError(
            f"JAX already started with {len(cpu)} CPU device(s){accel}; {n} are needed. Call "
            f"equarx_ref.setup_devices({n}) first, before any other JAX operation (in a "
            "notebook: restart the runtime), or set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={n} before starting Python."
        )
    return list(cpu[:n])


def _check_devices(devices) -> list[jax.Device]:
    """A non-empty list of jax devices (as `setup_devices` returns), else an error naming it."""
    if isinstance(devices, (str, bytes)) or not hasattr(devices, "__len__") or not devices or \
            not all(isinstance(d, jax.Device) for d in devices):
        raise TypeError(f"devices must be a non-empty list of jax devices (setup_devices(n) "
                        f"returns one), got {devices!r}"[:200])
    return list(devices)


def describe_devices(devices: list[jax.Device]) -> str:
    """One line saying what the devices are, e.g. '8 simulated CPU devices (...)'."""
    devices = _check_devices(devices)
    kinds = {d.device_kind for d in devices}
    platform = devices[0].platform
    if platform == "cpu":
        accel = [d for d in jax.devices() if d.platform != "cpu"]
        if not accel:
            return f"{len(devices)} simulated CPU devices (no accelerator present)"
        return (f"{len(devices)} simulated CPU devices: {len(accel)} {accel[0].device_kind} "
                f"present, fewer than {len(devices)}, so the collectives run on CPU (same "
                f"numerics, CPU timings); single-chip work can still use the "
                f"{accel[0].platform.upper()} via jax.devices()[0]")
    return f"{len(devices)} x {', '.join(sorted(kinds))} ({platform})"


def make_mesh(devices: list[jax.Device], axis_names: tuple[str, ...] = ("tp",),
              shape: tuple[int, ...] | None = None) -> Mesh:
    """A mesh over `devices` (1-D by default; pass `shape` for a 2-D torus such as (2, 4)).

    Built with `jax.make_mesh`, which orders real TPU chips so that mesh neighbours are ICI
    neighbours (a ring along an axis is a ring of links). The axes are `Auto`, so plain arrays
    can be passed to a jitted `shard_map` as they are.
    """
    devices = _check_devices(devices)
    if isinstance(axis_names, str) or not isinstance(axis_names, (tuple, list)) or \
            not axis_names or not all(isinstance(a, str) and a for a in axis_names) or \
            len(set(axis_names)) != len(axis_names):
        raise ValueError(f"axis_names must be a tuple of distinct, non-empty names such as "
                         f"('tp',), got {axis_names!r}")
    if shape is not None and not isinstance(shape, (tuple, list)):
        raise TypeError(f"shape must be a tuple of devices per axis or None, got {shape!r}")
    shape = (len(devices),) if shape is None else \
        tuple(count(q, "shape (devices per axis)") for q in shape)
    if math.prod(shape) != len(devices) or len(shape) != len(axis_names):
        raise ValueError(f"mesh shape {shape} with axes {axis_names} does not fit "
                         f"{len(devices)} devices")
    return jax.make_mesh(shape, tuple(axis_names), devices=list(devices),
                         axis_types=(AxisType.Auto,) * len(shape))


def mesh_device_kind() -> str:
    """The kind of the devices the collective runs on: the mesh's (inside shard_map), not the
    default backend's. On a single-chip TPU runtime (free Colab) a ring runs on simulated CPU
    devices, and must not be gated as if it crossed TPU links."""
    try:
        device = jax.sharding.get_abstract_mesh().abstract_device
    except Exception:  # no mesh context, or a jax without abstract devices
        device = None
    kind = getattr(device, "device_kind", None)
    return kind if kind else jax.devices()[0].device_kind
