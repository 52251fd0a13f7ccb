"""The "#wrong" matrix: every format x algorithm pair, every device count and every length class
(rotated over the cells rather than their full product: `_f32_cells`, where every pair of
those axes still meets, and bf16/f16 inputs in `_16_bit_cells`) x every input class, checked
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


def _block(fmt_name: str) -> int:
    return eq.parse_format(fmt_name).block_size if fmt_name != "bf16" else 32


def _f32_cells(fmt_name: str) -> list[tuple]:
    """The format's f32 cells: every algorithm it runs (psum: bf16 only), one cell each, with
    the device count and the length class rotating together so the format sees every p and
    every length once. A quantized format has 4 algorithms: a fifth cell (an algorithm that
    rotates with the format) takes the p and length left over. Over the 7 formats the offset
    between p and length takes every value, so every (p, length class) pair, every
    (algorithm, p) and every (algorithm, length class) pair occurs somewhere in the matrix."""
    k = FORMATS.index(fmt_name)
    lengths = _lengths(_block(fmt_name))
    if fmt_name == "bf16":
        algorithms = ALGORITHMS
    else:
        algorithms = [*ALGORITHMS[1:], ALGORITHMS[1 + k % 4]]
    cells = [(fmt_name, a, DEVICE_COUNTS[(j + k) % 5], lengths[(j + 2 * k) % 5], "float32")
             for j, a in enumerate(algorithms)]
    if fmt_name == "bf16":  # psum runs with no other format: every p for it too (the first
        # cell has p = 1 and length 0), and with it every length
        cells += [(fmt_name, "psum", DEVICE_COUNTS[j], lengths[j], "float32") for j in range(1, 5)]
    return cells


@pytest.mark.parametrize("fmt_name", FORMATS)
@pytest.mark.slow
def test_wrong_count_is_zero_f32(fmt_name):
    """f32 inputs: each format with every algorithm, every device count [1, 2, 3, 5, 8] and
    every length class [0, 1, block - 1, block + 1, 1001] (`_f32_cells`: rotated, not the full
    product; psum, bf16 only, at every p)."""
    cells = _f32_cells(fmt_name)
    assert {c[1] for c in cells} == set(ALGORITHMS if fmt_name == "bf16" else ALGORITHMS[1:])
    assert {c[2] for c in cells} == set(DEVICE_COUNTS)
    assert {c[3] for c in cells} == set(_lengths(_block(fmt_name)))
    _matrix(cells)


def test_f32_cells_cover_every_pair():
    """The rotation in `_f32_cells` leaves no (algorithm, p), (algorithm, length class) or
    (p, length class) pair out of the f32 matrix (length classes by index: 0 .. 4)."""
    assert all(len(set(_f32_cells(f))) == len(_f32_cells(f)) for f in FORMATS)
    cells = [(a, p, _lengths(_block(f)).index(n)) for f in FORMATS
             for _, a, p, n, _ in _f32_cells(f)]
    every = {(a, p) for a in ALGORITHMS for p in DEVICE_COUNTS}
    assert {(a, p) for a, p, _ in cells} == every
    assert {(a, i) for a, _, i in cells} == {(a, i) for a in ALGORITHMS for i in range(5)}
    assert {(p, i) for _, p, i in cells} == {(p, i) for p in DEVICE_COUNTS for i in range(5)}


def _16_bit_cells(fmt_name: str, dtype: str) -> list[tuple]:
    """p = 5, block + 1 values a device: psum (bf16 only) with both dtypes, and one other
    algorithm for each (format, dtype), rotating with the format (of ring, bidir_ring,
    two_shot, one_shot, bf16 takes number k and f16 number k + 2, mod 4, for the format's
    index k), so that every algorithm meets both dtypes and each format two algorithms."""
    k, d = FORMATS.index(fmt_name), ["bfloat16", "float16"].index(dtype)
    algorithms = (["psum"] if fmt_name == "bf16" else []) + [ALGORITHMS[1 + (k + 2 * d) % 4]]
    return [(fmt_name, a, 5, _block(fmt_name) + 1, dtype) for a in algorithms]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("fmt_name", FORMATS)
@pytest.mark.slow
def test_wrong_count_is_zero_16_bit_inputs(fmt_name, dtype):
    """bf16 and f16 inputs (p = 5, block + 1 values): every format with each dtype, every
    algorithm with each dtype (`_16_bit_cells`; every format with every algorithm is the f32
    test's)."""
    _matrix(_16_bit_cells(fmt_name, dtype))


def test_16_bit_cells_cover_every_pair():
    cells = [c for f in FORMATS for d in ("bfloat16", "float16") for c in _16_bit_cells(f, d)]
    assert {(f, d) for f, *_, d in cells} == {(f, d) for f in FORMATS
                                              for d in ("bfloat16", "float16")}
    assert {(a, d) for _, a, _, _, d in cells} == {(a, d) for a in ALGORITHMS
                                                   for d in ("bfloat16", "float16")}
    assert all(len({a for f, a, *_ in cells if f == g}) >= 2 for g in FORMATS)


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
