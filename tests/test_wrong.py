"""The "#wrong" matrix: every format x algorithm x device count x length x input class, checked
against a float64 reference with the documented policy, in the spirit of nccl-tests' #wrong
column. A cell is wrong when any of these fails:

- error within the bound the quantizer guarantees: each quantization of a partial sum moves a
  value by at most half a grid step (ints: amax / (2 qmax), floats: 2^-(m+1) amax; an E8M0 scale
  may be up to 2x coarse, a bf16 scale 2^-7), and each partial sum is at most p max|x|;
- finite where the exact sum is finite and no input in the block is poisoned; non-finite where an
  input is NaN/Inf (only in that value's block) or where the exact sum overflows f32;
- all-zero inputs give exact zeros;
- bitwise the same on every device;
- the bytes in the compiled program equal `eq.wire_bytes`.

Input classes share one compiled program (`vmap` over them); the count of wrong cells must be 0,
and the matrix is printed when it is not.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import equarx_ref as eq
from conftest import DEVICES

FORMATS = ["bf16", *eq.FORMAT_NAMES]
ALGORITHMS = ["psum", "ring", "bidir_ring", "two_shot", "one_shot"]
DEVICE_COUNTS = [1, 2, 3, 5, 8]
CLASSES = ["gaussian", "zeros", "constant", "near_max", "overflow", "subnormal", "nan", "inf"]


def _lengths(block: int) -> list[int]:
    return [0, 1, block - 1, block + 1, 1001]


def _inputs(p: int, n: int, dtype, seed: int) -> np.ndarray:
    """[classes, p, n] inputs in `dtype` (as float64 values)."""
    rng = np.random.default_rng(seed)
    big = float(jnp.finfo(dtype).max)
    tiny = float(jnp.finfo(dtype).smallest_normal) / 4  # subnormal in dtype
    rows = {
        "gaussian": rng.standard_normal((p, n)),
        "zeros": np.zeros((p, n)),
        "constant": np.full((p, n), 1.5),
        "near_max": 0.9 * big / p * np.sign(rng.standard_normal((p, n))),
        "overflow": np.full((p, n), 0.9 * big),
        "subnormal": tiny * rng.integers(-3, 4, (p, n)),
        "nan": rng.standard_normal((p, n)),
        "inf": rng.standard_normal((p, n)),
    }
    if n:
        rows["nan"][p // 2, n // 2] = np.nan
        rows["inf"][0, n - 1] = -np.inf
    x = np.stack([rows[c] for c in CLASSES])
    return np.asarray(x.astype(dtype), np.float64)


@functools.cache
def _program(fmt_name: str, algorithm: str, p: int, n: int, dtype: str):
    mesh = eq.make_mesh(DEVICES[:p])
    # min_bytes=0: short padded messages are the cases this matrix is for; the default gate
    # would send them unquantized (test_default_gate_cell)
    ar = eq.AllReduce(fmt=eq.parse_format(fmt_name), algorithm=algorithm, min_bytes=0)

    def body(x):  # x: [classes, 1, n] on each device
        return jax.vmap(lambda row: ar(row, "tp"))(x[:, 0])[None]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(None, "tp"), out_specs=P("tp"),
                              check_vma=True))
    return f.lower(jax.ShapeDtypeStruct((len(CLASSES), p, n), jnp.dtype(dtype))).compile()


def _unit(fmt: eq.Format | None, dtype) -> float:
    """Largest error of one rounding, relative to the block's (or value's) magnitude."""
    if fmt is None:
        return 2.0 ** -(jnp.finfo(dtype).nmant + 1)
    u = 1 / (2 * fmt.elem_max) if fmt.is_int else 2.0 ** -(fmt.mant_bits + 1)
    return u * (2 if fmt.is_mx else 1 + 2**-7)


def _check_cell(fmt_name, algorithm, p, n, dtype) -> list[str]:
    """Run one cell (all input classes); return what is wrong with it."""
    if algorithm == "psum" and fmt_name != "bf16":
        return []
    fmt = eq.parse_format(fmt_name)
    program = _program(fmt_name, algorithm, p, n, dtype)
    x = _inputs(p, n, jnp.dtype(dtype), seed=p * 1000 + n)
    y = np.asarray(program(jnp.asarray(x, dtype)), np.float64)  # [p, classes, n]
    wrong = []
    if not all(np.array_equal(y[0], y[d], equal_nan=True) for d in range(1, p)):
        wrong.append("devices differ")
    hlo = sum(eq.hlo_wire_bytes(program.as_text(), p).values()) / len(CLASSES)
    wire_dtype = "float32" if algorithm == "psum" and dtype == "bfloat16" else dtype  # XLA:CPU
    model = eq.wire_bytes(n, p, fmt=fmt, algorithm=algorithm, dtype=wire_dtype, min_bytes=0)
    if abs(hlo - model) >= 1:  # the psum model rounds down to whole bytes
        wrong.append(f"bytes {hlo:g} != wire_bytes {model}")
    block = fmt.block_size if fmt else 1
    hops = 0 if p == 1 else len(eq.quantized_sizes(p, algorithm=algorithm)) if \
        algorithm != "psum" else 1
    info = jnp.finfo(dtype)
    for c, name in enumerate(CLASSES):
        exact = x[c].sum(axis=0)
        got = y[0, c]
        poisoned = ~np.isfinite(x[c]).all(axis=0)
        if poisoned.any():  # its whole block may go non-finite, nothing else
            blocks = np.unique(np.flatnonzero(poisoned) // block)
            poisoned = np.isin(np.arange(n) // block, blocks) if fmt else poisoned
        m = np.abs(np.where(np.isfinite(x[c]), x[c], 0)).max(initial=0.0)
        floor = p * hops * 2e-36 + float(info.smallest_subnormal)
        bound = hops * p * m * _unit(fmt, dtype) + p * p * m * 2.0**-23 + \
            np.abs(np.nan_to_num(exact)) * 2.0 ** -(info.nmant + 1) + floor
        # f32 accumulates the partial sums: past its maximum they overflow, as in psum. That is
        # allowed where the exact sum, give or take the format's error, is out of range.
        with np.errstate(over="ignore"):
            may_overflow = np.abs(np.nan_to_num(exact)) + bound > float(info.max)
        must_fail = ~np.isfinite(exact) | (np.abs(exact) > float(info.max))
        if (~np.isfinite(got) & ~poisoned & ~may_overflow).any():
            wrong.append(f"{name}: {(~np.isfinite(got) & ~poisoned & ~may_overflow).sum()} "
                         "values non-finite")
        if np.isfinite(got[must_fail]).any():
            wrong.append(f"{name}: a poisoned or overflowing sum came back finite")
        if name == "zeros" and np.any(got != 0):
            wrong.append("zeros: not exact zeros")
        ok = ~must_fail & ~poisoned & np.isfinite(got)
        err = np.abs(got[ok] - exact[ok])
        if np.any(err > bound[ok]):
            k = int(np.argmax(err - bound[ok]))
            wrong.append(f"{name}: error {err[k]:.3g} > bound {bound[ok][k]:.3g}")
    return wrong


def _matrix(cells) -> None:
    """Check every cell; fail with the table of wrong ones."""
    wrong = {}
    for cell in cells:
        problems = _check_cell(*cell)
        if problems:
            wrong[cell] = problems
    if wrong:
        lines = [f"{len(wrong)} wrong of {len(cells)} cells (format, algorithm, p, n, dtype):"]
        lines += [f"  {cell}: {'; '.join(problems)}" for cell, problems in wrong.items()]
        pytest.fail("\n".join(lines), pytrace=False)


@pytest.mark.parametrize("fmt_name", FORMATS)
@pytest.mark.slow
def test_wrong_count_is_zero_f32(fmt_name):
    """Every algorithm x p x length in f32; lengths rotate over the cells, all of them seen."""
    block = eq.parse_format(fmt_name).block_size if fmt_name != "bf16" else 32
    cells, i = [], 0
    for algorithm in ALGORITHMS:
        for p in DEVICE_COUNTS:
            lengths = _lengths(block)
            cells.append((fmt_name, algorithm, p, lengths[i % len(lengths)], "float32"))
            i += 1
    cells += [(fmt_name, "ring", 8, n, "float32") for n in _lengths(block)]
    _matrix(list(dict.fromkeys(cells)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("fmt_name", FORMATS)
@pytest.mark.slow
def test_wrong_count_is_zero_16_bit_inputs(fmt_name, dtype):
    block = eq.parse_format(fmt_name).block_size if fmt_name != "bf16" else 32
    _matrix([(fmt_name, algorithm, 5, block + 1, dtype) for algorithm in ALGORITHMS])


def test_matrix_bites():
    """The checker itself: a collective that drops one device's input is caught."""
    x = _inputs(4, 40, jnp.dtype("float32"), seed=0)[0]
    exact = x.sum(axis=0)
    wrong = exact - x[3]
    unit = _unit(eq.Format.int8(), jnp.dtype("float32"))
    bound = 4 * 4 * np.abs(x).max() * unit
    assert np.any(np.abs(wrong - exact) > bound)
    assert math.isclose(_unit(eq.Format.int8(), jnp.dtype("float32")), (1 + 2**-7) / 254)


BAD_FLAGS = [
    "demo --devices 0", "demo --devices -1", "demo --devices 1", "demo --size 0",
    "demo --size -5", "demo --size abc", "demo --repeats 0", "demo --json /no/such/dir/x.json",
    "demo --plot /no/such/dir/x.png", "bench --mib -1", "bench --mib 0", "bench --repeats 0",
    "bench --json /no/such/dir/x.json", "gemma --tp 0", "gemma --tokens -1",
    "gemma --json /no/such/dir/x.json", "gemma --algorithms tree", "nosuchcommand", "",
    # accepted by the parser's type, but not by the packaged model: refused before it loads
    "gemma --tp 3", "outliers --tp 3", "outliers --tp 8", "outliers --outliers 641",
    "kernels --compile v5e:2x4 --bytes 0", "kernels --compile v5e:2x4 --bytes 0.001",
    "kernels --compile v5e:2x4 --bytes x",
]


@pytest.mark.parametrize("argv", BAD_FLAGS)
def test_cli_bad_flags_one_clear_line(argv, capsys):
    from equarx_ref import cli

    with pytest.raises(SystemExit) as e:
        cli.main(argv.split())
    assert e.value.code == 2
    from conftest import cli_error

    assert "error:" in cli_error(capsys.readouterr().err)
