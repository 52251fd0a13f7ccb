"""Formats: what one number costs on the wire.

A block-wise quantized tensor is cut into blocks of `block_size` consecutive values. Each block
travels as `block_size` small elements plus one shared scale:

    x[i] ~= scale * q[i],        scale = amax(block) / elem_max   (rounded *up* to the scale dtype)

so the cost per value is

    bits_per_element = elem_bits + scale_bits / block_size

int8 with a bf16 scale per 32 values costs 8 + 16/32 = 8.5 bits, a ratio of 16/8.5 = 1.88 against
bf16; int4 costs 4.5 bits (3.56x). Smaller blocks follow the data more closely (smaller error) but
pay more scale bits; a float32 scale costs 9.0 bits with int8.

Two families of elements:

- *integer* (`int8`, `int4`): symmetric, no zero point; the grid is {-qmax, ..., qmax} with
  qmax = 2^(bits-1) - 1 (127, 7), evenly spaced. Error is at most half a step, scale / 2.
- *float* (`fp8_e4m3`, `fp8_e5m2`, `fp4_e2m1`): the grid is a tiny floating-point format with
  `mant_bits` mantissa bits, so the relative error is at most half an ULP, 2^-(mant_bits+1) of the
  value, whatever its size: small values in a block keep more precision than with integers.

Microscaling (OCP MX: `mxfp8`, `mxfp4`) fixes the block at 32 and makes the scale a bare power of
two, stored as an E8M0 exponent byte (8.25 and 4.25 bits). This package picks the exponent as
2^ceil(log2(amax / elem_max)) so that no element clips; the OCP specification's rule is
2^(floor(log2(amax)) - emax_elem), which is one step finer on some blocks but saturates (clips) the
largest values of those blocks by design. We prefer the documented no-clip rule for a reference.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

__all__ = ["SCALE_DTYPES", "Format"]

# Scale types: name -> bits on the wire. "e8m0" is a power-of-two exponent byte (MX).
SCALE_DTYPES = {"bfloat16": 16, "float32": 32, "e8m0": 8}

# Float element grids: (exponent bits, mantissa bits, smallest normal exponent, largest value).
_FLOAT_ELEMENTS = {
    "e4m3": (4, 3, -6, 448.0),  # float8_e4m3fn: no infinities, 480 would be NaN
    "e5m2": (5, 2, -14, 57344.0),  # float8_e5m2
    "e2m1": (2, 1, 0, 6.0),  # fp4: {0, 0.5, 1, 1.5, 2, 3, 4, 6}
}


def _scale_name(scale_dtype) -> str:
    if isinstance(scale_dtype, str) and scale_dtype in SCALE_DTYPES:
        return scale_dtype
    try:
        name = jnp.dtype(scale_dtype).name
    except TypeError:
        name = str(scale_dtype)
    if name == "float8_e8m0fnu":
        name = "e8m0"
    if name not in SCALE_DTYPES:
        raise ValueError(f"scale_dtype must be one of {sorted(SCALE_DTYPES)}, got {scale_dtype!r}")
    return name


@dataclasses.dataclass(frozen=True)
class Format:
    """A block-wise quantized wire format.

    Build one with a preset: `Format.int8()`, `Format.int4()`, `Format.fp8_e4m3()`,
    `Format.fp8_e5m2()`, `Format.mxfp8()`, `Format.mxfp4()`.

    Attributes:
        name: short label, e.g. "int8".
        element: "int" for symmetric integers, or a float grid "e4m3", "e5m2", "e2m1".
        elem_bits: bits of one element on the wire (8 or 4; 4-bit elements are packed two a byte).
        block_size: values sharing one scale.
        scale_dtype: "bfloat16", "float32" or "e8m0" (power-of-two exponent byte, MX).
    """

    name: str
    element: str
    elem_bits: int
    block_size: int = 32
    scale_dtype: str = "bfloat16"

    def __post_init__(self):
        object.__setattr__(self, "scale_dtype", _scale_name(self.scale_dtype))
        widths = {"int": (4, 8), **{e: (1 + sum(_FLOAT_ELEMENTS[e][:2]),) for e in
                                    _FLOAT_ELEMENTS}}
        if self.element not in widths:
            raise ValueError(f"unknown element type {self.element!r}; choose one of "
                             f"{sorted(widths)}")
        if self.elem_bits not in widths[self.element]:
            raise ValueError(f"{self.element} elements are {widths[self.element]} bits wide, "
                             f"got elem_bits={self.elem_bits!r}")
        if type(self.block_size) is not int or self.block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {self.block_size!r}")
        if self.elem_bits == 4 and self.block_size % 2:
            raise ValueError(f"4-bit formats pack two values a byte: block_size must be even, "
                             f"got {self.block_size}")

    # ---- presets -------------------------------------------------------------------------
    @classmethod
    def int8(cls, block_size: int = 32, scale_dtype="bfloat16") -> Format:
        """Symmetric int8, grid {-127..127}: 8.5 bits per element with a bf16 scale per 32."""
        return cls("int8", "int", 8, block_size, scale_dtype)

    @classmethod
    def int4(cls, block_size: int = 32, scale_dtype="bfloat16") -> Format:
        """Symmetric int4, grid {-7..7}, two values per byte: 4.5 bits with a bf16 scale per 32."""
        return cls("int4", "int", 4, block_size, scale_dtype)

    @classmethod
    def fp8_e4m3(cls, block_size: int = 32, scale_dtype="bfloat16") -> Format:
        """float8 e4m3fn elements (max 448, 3 mantissa bits) with a block scale."""
        return cls("fp8_e4m3", "e4m3", 8, block_size, scale_dtype)

    @classmethod
    def fp8_e5m2(cls, block_size: int = 32, scale_dtype="bfloat16") -> Format:
        """float8 e5m2 elements (max 57344, 2 mantissa bits) with a block scale."""
        return cls("fp8_e5m2", "e5m2", 8, block_size, scale_dtype)

    @classmethod
    def mxfp8(cls, block_size: int = 32) -> Format:
        """OCP MXFP8: e4m3 elements, one power-of-two E8M0 scale per 32 values (8.25 bits)."""
        return cls("mxfp8", "e4m3", 8, block_size, "e8m0")

    @classmethod
    def mxfp4(cls, block_size: int = 32) -> Format:
        """OCP MXFP4: e2m1 elements, one power-of-two E8M0 scale per 32 values (4.25 bits)."""
        return cls("mxfp4", "e2m1", 4, block_size, "e8m0")

    # ---- derived facts -------------------------------------------------------------------
    @property
    def is_int(self) -> bool:
        return self.element == "int"

    @property
    def is_mx(self) -> bool:
        """Microscaling: the scale is a bare power of two (an E8M0 byte)."""
        return self.scale_dtype == "e8m0"

    @property
    def elem_max(self) -> float:
        """Largest magnitude an element can hold (qmax for integers)."""
        if self.is_int:
            return float(2 ** (self.elem_bits - 1) - 1)
        return _FLOAT_ELEMENTS[self.element][3]

    @property
    def mant_bits(self) -> int:
        """Mantissa bits of a float element (ValueError for integer elements)."""
        if self.is_int:
            raise ValueError(f"{self.name} has integer elements")
        return _FLOAT_ELEMENTS[self.element][1]

    @property
    def min_exponent(self) -> int:
        """Smallest normal exponent of a float element; below it the grid is evenly spaced."""
        if self.is_int:
            raise ValueError(f"{self.name} has integer elements")
        return _FLOAT_ELEMENTS[self.element][2]

    @property
    def scale_bits(self) -> int:
        return SCALE_DTYPES[self.scale_dtype]

    @property
    def scale_bytes(self) -> int:
        return self.scale_bits // 8

    @property
    def payload_bytes_per_block(self) -> int:
        return self.block_size * self.elem_bits // 8

    @property
    def bytes_per_block(self) -> int:
        """Payload plus scale of one block, as sent."""
        return self.payload_bytes_per_block + self.scale_bytes

    @property
    def bits_per_element(self) -> float:
        """Element bits plus the block's scale bits spread over its values, e.g. 8.5 for int8."""
        return self.elem_bits + self.scale_bits / self.block_size

    @property
    def grid(self) -> np.ndarray:
        """All non-negative element values the format can represent (before scaling)."""
        if self.is_int:
            return np.arange(int(self.elem_max) + 1, dtype=np.float64)
        _, m, emin, vmax = _FLOAT_ELEMENTS[self.element]
        values = {0.0}
        e = emin
        while 2.0**e <= vmax:
            values.update(2.0**e * (1 + k / 2**m) for k in range(2**m))
            e += 1
        values.update(2.0**emin * k / 2**m for k in range(2**m))  # subnormals
        return np.array(sorted(v for v in values if v <= vmax))

    def __str__(self) -> str:
        scale = "" if self.is_mx else f", {self.scale_dtype} scale"
        return f"{self.name} (block {self.block_size}{scale}, {self.bits_per_element:g} bits)"
