"""The suite runs with a GPU or TPU as the default backend: its devices come from
`setup_devices` (conftest's `DEVICES`), never from the default backend.

On a machine with one accelerator, `setup_devices(8)` gives simulated CPU devices for the
collectives while `jax.devices()` is that one chip: a mesh or `pmap` over the default devices
then fails ("cannot select an axis to squeeze out", "Number of devices 1 must be >= ..."), as
it did on an H100. Two guards: a lint over the test files, so such a call cannot come back, and
a run of the tests that build meshes on a CPU-only machine dressed up as a one-chip machine
(conftest's EQUARX_REF_TEST_ONE_DEFAULT_DEVICE: the default backend is one CPU device outside
`DEVICES`).
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from conftest import DEVICES

TESTS = Path(__file__).resolve().parent

#: Calls that pick the default backend's devices unless told which (`devices=`); a name imported
#: from jax (`from jax import make_mesh`) is read as jax's.
NEED_DEVICES = {"jax.make_mesh", "jax.pmap", "pmap", "jax.sharding.Mesh", "Mesh"}
#: Calls that place on the default backend's first device unless given one (a second argument
#: or `device=`); a line marked DEFAULT_OK may.
NEED_DEVICE = {"jax.device_put"}
#: Calls that name the default backend's devices: a test may call them only with a backend
#: ("cpu"), or on a line marked DEFAULT_OK (it inspects the default backend on purpose).
DEFAULT_DEVICES = {"jax.devices", "jax.local_devices", "jax.local_device_count",
                   "jax.device_count"}
DEFAULT_OK = "# default backend on purpose"


def _name(node: ast.AST, imported: dict | None = None) -> str:
    if isinstance(node, ast.Name):
        return (imported or {}).get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value, imported)}.{node.attr}"
    return ""


def _from_jax(tree: ast.AST) -> dict[str, str]:
    """Local names bound by `from jax... import name [as local]`, to their jax names (a name
    of jax.sharding that jax also exports is read as jax's: `jax.make_mesh`)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "jax":
            for a in node.names:
                full = f"{node.module}.{a.name}"
                names[a.asname or a.name] = "jax.make_mesh" if a.name == "make_mesh" else full
    return names


def default_device_uses(source: str) -> list[tuple[int, str]]:
    """(line, call) for each call in `source` that runs on the default backend's devices."""
    lines = source.splitlines()
    found = []
    tree = ast.parse(source)
    imported = _from_jax(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name, keywords = _name(node.func, imported), {k.arg for k in node.keywords}
        if name in NEED_DEVICE and len(node.args) < 2 and "device" not in keywords and \
                DEFAULT_OK not in lines[node.lineno - 1]:
            found.append((node.lineno, name))
        elif name in NEED_DEVICES and "devices" not in keywords and \
                not (name.endswith("Mesh") and node.args):
            found.append((node.lineno, name))
        elif name.endswith("Mesh") and node.args and _name(getattr(node.args[0], "func", None)
                                                           or node.args[0]) in DEFAULT_DEVICES:
            found.append((node.lineno, f"{name}({_name(node.args[0].func)}())"))
        elif name in DEFAULT_DEVICES and not node.args and "backend" not in keywords and \
                DEFAULT_OK not in lines[node.lineno - 1]:
            found.append((node.lineno, name))
    return found


def test_no_test_builds_a_mesh_or_pmap_over_the_default_devices():
    bad = [f"{path.name}:{line}: {call}" for path in sorted(TESTS.glob("*.py"))
           if path.name != Path(__file__).name
           for line, call in default_device_uses(path.read_text())]
    assert not bad, ("these use the default backend's devices, which on a one-GPU or one-TPU "
                     "machine are not the simulated CPU devices the collectives run on; build "
                     "meshes with eq.make_mesh(DEVICES[:p]) or pass devices=DEVICES:\n"
                     + "\n".join(bad))


@pytest.mark.parametrize("source,found", [
    ("jax.make_mesh((2,), ('x',))", [(1, "jax.make_mesh")]),
    ("jax.make_mesh((2,), ('x',), devices=DEVICES[:2])", []),
    ("jax.pmap(f, axis_name='b')(x)", [(1, "jax.pmap")]),
    ("jax.pmap(f, axis_name='b', devices=DEVICES)(x)", []),
    ("Mesh(jax.devices(), ('x',))", [(1, "Mesh(jax.devices())"), (1, "jax.devices")]),
    ("Mesh(np.array(DEVICES), ('x',))", []),
    ("jax.devices()[:2]", [(1, "jax.devices")]),
    ("jax.local_devices()", [(1, "jax.local_devices")]),
    ("jax.devices('cpu')", []),
    ("jax.devices(backend='cpu')", []),
    (f"n = len(jax.devices())  {DEFAULT_OK}", []),
    ("from jax import make_mesh\nmake_mesh((2,), ('x',))", [(2, "jax.make_mesh")]),
    ("from jax import make_mesh as mm\nmm((2,), ('x',), devices=DEVICES[:2])", []),
    ("from equarx_ref import make_mesh\nmake_mesh(DEVICES[:2])", []),
    ("from jax.sharding import Mesh as M\nM(jax.devices(), ('x',))",
     [(2, "jax.sharding.Mesh(jax.devices())"), (2, "jax.devices")]),
    ("jax.device_put(x)", [(1, "jax.device_put")]),
    ("from jax import device_put\ndevice_put(x)", [(2, "jax.device_put")]),
    ("jax.device_put(x, NamedSharding(mesh, P('x')))", []),
    ("jax.device_put(x, device=DEVICES[0])", []),
    (f"jax.device_put(x)  {DEFAULT_OK}", []),
])
def test_the_lint_finds_default_device_uses(source, found):
    assert sorted(default_device_uses(source)) == sorted(found)


def test_devices_are_setup_devices():
    """One GPU or TPU present: `setup_devices` gives simulated CPU devices, and eq.make_mesh
    uses exactly the devices it is given."""
    import equarx_ref as eq

    assert len(DEVICES) == 8 and all(d.platform == "cpu" for d in DEVICES)
    mesh = eq.make_mesh(DEVICES[2:6])
    assert list(mesh.devices.flat) == DEVICES[2:6]


#: Tests that build meshes, pmap, compare one-device runs with mesh runs, or read the chip:
#: run on a CPU-only machine made to look like a one-chip one (conftest).
ONE_CHIP_TESTS = [
    "test_autodiff.py::test_vmap_and_pmap_axes_work_like_psum",
    "test_collectives.py::test_default_size_gate_reads_the_message_never_the_chip",
    "test_collectives.py::test_auto_size_gate_reads_the_mesh_not_the_default_backend",
    "test_cost.py::test_size_gate_at_the_edge",
    "test_cli.py::test_setup_devices",
    "test_gemma.py::test_jax_make_mesh_explicit_axes_accepted",
    "test_gemma.py::test_shard_params_reused",
    "test_gemma.py::test_every_matmul_runs_at_highest_precision_by_default",
    "test_device_agnostic.py::test_devices_are_setup_devices",
    "test_device_agnostic.py::test_the_emulation_is_a_one_chip_machine",
]


def test_the_emulation_is_a_one_chip_machine():
    """Under EQUARX_REF_TEST_ONE_DEFAULT_DEVICE the default backend is one device that is not
    one of DEVICES, and what would fail on an H100 fails here (skipped in a plain run)."""
    if os.environ.get("EQUARX_REF_TEST_ONE_DEFAULT_DEVICE") != "1":
        pytest.skip("runs inside test_tests_pass_with_one_default_device")
    default = jax.devices()  # default backend on purpose
    assert len(default) == 1 and default[0] not in DEVICES
    assert jax.numpy.ones(3).devices() == set(default)
    with pytest.raises(ValueError, match="Number of devices 1"):
        jax.make_mesh((2,), ("x",))  # what the lint forbids
    with pytest.raises(ValueError, match="cannot select an axis to squeeze out"):
        jax.pmap(lambda r: r, axis_name="b")(np.ones((8, 2)))  # what the lint forbids


@pytest.mark.slow
def test_tests_pass_with_one_default_device():
    env = {**os.environ, "EQUARX_REF_TEST_ONE_DEFAULT_DEVICE": "1", "JAX_NUM_CPU_DEVICES": "9",
           "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         *(f"tests/{t}" for t in ONE_CHIP_TESTS)], cwd=TESTS.parent, env=env,
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "skipped" not in summary, proc.stdout[-2000:]
