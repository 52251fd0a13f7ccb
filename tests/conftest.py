"""Tests run on 8 simulated CPU devices, set up before anything starts JAX's backends.

The tests take their devices from `DEVICES` and build every mesh over them, never over the
default backend's devices (`jax.devices()`), which on a machine with one GPU or TPU are that
single chip while the collectives run on simulated CPU devices. With
EQUARX_REF_TEST_ONE_DEFAULT_DEVICE=1 (and JAX_NUM_CPU_DEVICES=9) this file makes a CPU-only
machine look like that: the default backend answers with one device, the ninth CPU device,
outside `DEVICES`, and the default device is that one (`test_device_agnostic.py` runs tests so).
"""

import importlib.util
import os
from pathlib import Path

import jax

import equarx_ref as eq

DEVICES = eq.setup_devices(8)


def _one_default_device() -> None:
    """The default backend becomes one device outside `DEVICES`, as on a one-GPU machine:
    `jax.devices()`, `jax.local_devices()` (and so `jax.make_mesh` and `pmap` without devices)
    see only it; `jax.devices("cpu")` still lists all nine."""
    from jax._src import xla_bridge

    cpu = jax.devices("cpu")
    if len(cpu) <= len(DEVICES):
        raise RuntimeError("EQUARX_REF_TEST_ONE_DEFAULT_DEVICE needs JAX_NUM_CPU_DEVICES=9")
    chip, real_devices, real_local = cpu[len(DEVICES)], xla_bridge.devices, \
        xla_bridge.local_devices

    def devices(backend=None):
        return real_devices(backend) if backend is not None else [chip]

    def local_devices(process_index=None, backend=None, host_id=None):
        if backend is not None:
            return real_local(process_index, backend, host_id)
        return [chip]

    for module in (jax, xla_bridge):
        module.devices, module.local_devices = devices, local_devices
    jax.config.update("jax_default_device", chip)


if os.environ.get("EQUARX_REF_TEST_ONE_DEFAULT_DEVICE") == "1":
    _one_default_device()


def cli_error(err: str) -> str:
    """The error line of a refused command line: one line, "equarx-ref CMD: error: ...",
    followed by nothing but, for an option the parser refused, the command's usage ("usage:
    equarx-ref CMD ..." and its indented continuation lines); never a traceback."""
    lines = err.strip().splitlines()
    assert lines and "Traceback" not in err, err
    usage = lines[1:]
    assert not usage or (usage[0].startswith("usage: equarx-ref")
                         and all(line.startswith(" ") for line in usage[1:])), err
    return lines[0]


def load_nbtool():
    """notebooks/nbtool.py, the notebooks' tool, loaded as a module (it is a script, not part
    of the package): the checks the notebook tests share with `nbtool check`."""
    path = Path(__file__).resolve().parent.parent / "notebooks" / "nbtool.py"
    spec = importlib.util.spec_from_file_location("nbtool", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
