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
import re

import jax.numpy as jnp
import numpy as np

from ._checks import count

__all__ = ["FORMAT_NAMES", "SCALE_DTYPES", "UNQUANTIZED", "Format", "format_label", "parse_format"]

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


# Element types by format name: (element grid, bits). "int" is symmetric integer.
_ELEMENTS = {
    "int8": ("int", 8),
    "int4": ("int", 4),
    "fp8_e4m3": ("e4m3", 8),
    "fp8_e5m2": ("e5m2", 8),
    "fp4_e2m1": ("e2m1", 4),
}
# MX presets: element name and the fixed E8M0 scale (OCP MX v1.0).
_MX = {"mxfp8": "fp8_e4m3", "mxfp4": "fp4_e2m1", "mxint8": "int8"}
_SCALE_SHORT = {"bf16": "bfloat16", "f32": "float32", "e8m0": "e8m0"}
_SCALE_LONG = {v: k for k, v in _SCALE_SHORT.items()}
MAX_BLOCK_SIZE = 1 << 16  # far beyond any useful block; keeps buffers sane

#: Names `Format.parse` accepts without options, in the order tables list them.
FORMAT_NAMES = ("int8", "int4", "fp8_e4m3", "fp8_e5m2", "mxfp8", "mxfp4")
#: The name of "no quantization" wherever a format is named (CLI, tables): the input's own
#: 16-bit float travels as is.
UNQUANTIZED = "bf16"


@dataclasses.dataclass(frozen=True)
class Format:
    """A block-wise quantized wire format: element type, block size, scale type.

    `Format("int8")`, `Format("int4", 16)`, `Format("fp8_e4m3", 32, "float32")`, or the presets
    `Format.int8()`, `Format.int4()`, `Format.fp8_e4m3()`, `Format.fp8_e5m2()`, `Format.mxfp8()`,
    `Format.mxfp4()`. `str(fmt)` is a short name that `Format.parse` reads back: "int8",
    "int4/b16", "fp8_e4m3/f32", "mxfp8".

    Attributes:
        name: the element type: "int8", "int4", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", or an MX
            preset name "mxfp8", "mxfp4", "mxint8" (whose scale is always E8M0).
        block_size: values sharing one scale.
        scale_dtype: "bfloat16", "float32" or "e8m0" (a power-of-two exponent byte, as in MX).
    """

    name: str
    block_size: int = 32
    scale_dtype: str | None = None  # None: bfloat16, or e8m0 for the MX names

    def __post_init__(self):
        if not isinstance(self.name, str) or (self.name not in _ELEMENTS and
                                              self.name not in _MX):
            hint = (" (Format's fields are name, block_size, scale_dtype: e.g. "
                    "Format('int8', 32, 'bfloat16'))" if not isinstance(self.name, str) else "")
            raise ValueError(f"unknown format name {self.name!r}; choose one of "
                             f"{sorted([*_ELEMENTS, *_MX])}{hint}")
        object.__setattr__(self, "block_size", count(self.block_size, "block_size",
                                                       maximum=MAX_BLOCK_SIZE))
        default = "e8m0" if self.name in _MX else "bfloat16"
        scale = default if self.scale_dtype is None else _scale_name(self.scale_dtype)
        if self.name in _MX and scale != "e8m0":
            raise ValueError(f"{self.name} is an MX format: its scale is e8m0, "
                             f"got scale_dtype={self.scale_dtype!r}")
        object.__setattr__(self, "scale_dtype", scale)
        if self.elem_bits == 4 and self.block_size % 2:
            raise ValueError(f"4-bit formats pack two values a byte: block_size must be even, "
                             f"got {self.block_size}")

    # ---- presets -------------------------------------------------------------------------
    @classmethod
    def int8(cls, block_size: int = 32, scale_dtype: str = "bfloat16") -> Format:
        """Symmetric int8, grid {-127..127}: 8.5 bits per element with a bf16 scale per 32."""
        return cls("int8", block_size, scale_dtype)

    @classmethod
    def int4(cls, block_size: int = 32, scale_dtype: str = "bfloat16") -> Format:
        """Symmetric int4, grid {-7..7}, two values per byte: 4.5 bits with a bf16 scale per 32."""
        return cls("int4", block_size, scale_dtype)

    @classmethod
    def fp8_e4m3(cls, block_size: int = 32, scale_dtype: str = "bfloat16") -> Format:
        """float8 e4m3fn elements (max 448, 3 mantissa bits) with a block scale."""
        return cls("fp8_e4m3", block_size, scale_dtype)

    @classmethod
    def fp8_e5m2(cls, block_size: int = 32, scale_dtype: str = "bfloat16") -> Format:
        """float8 e5m2 elements (max 57344, 2 mantissa bits) with a block scale."""
        return cls("fp8_e5m2", block_size, scale_dtype)

    @classmethod
    def mxfp8(cls, block_size: int = 32) -> Format:
        """OCP MXFP8: e4m3 elements, one power-of-two E8M0 scale per 32 values (8.25 bits)."""
        return cls("mxfp8", block_size, "e8m0")

    @classmethod
    def mxfp4(cls, block_size: int = 32) -> Format:
        """OCP MXFP4: e2m1 elements, one power-of-two E8M0 scale per 32 values (4.25 bits)."""
        return cls("mxfp4", block_size, "e8m0")

    # ---- names ---------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> Format:
        """Read a format name as `str(fmt)` writes it: "int8", "int4/b16", "fp8_e4m3/f32".

        Options after the name, separated by "/": "bN" (block size N) and a scale type
        ("bf16", "f32", "e8m0"). Raises ValueError naming what it could not read.
        """
        if not isinstance(text, str):
            raise TypeError(f"Format.parse takes a string, got {type(text).__name__}")
        name, *options = text.strip().split("/")
        block, scale = 32, None
        for opt in options:
            if re.fullmatch(r"b\d+", opt):
                block = int(opt[1:])
            elif opt in _SCALE_SHORT:
                scale = _SCALE_SHORT[opt]
            else:
                raise ValueError(f"cannot read {opt!r} in format {text!r}: options are bN "
                                 f"(block size) and a scale type {sorted(_SCALE_SHORT)}")
        if name == UNQUANTIZED:
            raise ValueError(f"{UNQUANTIZED!r} means no quantization: use parse_format, which "
                             "returns None for it")
        return cls(name, block, scale)

    def __str__(self) -> str:
        default_scale = "e8m0" if self.name in _MX else "bfloat16"
        parts = [self.name]
        if self.block_size != 32:
            parts.append(f"b{self.block_size}")
        if self.scale_dtype != default_scale:
            parts.append(_SCALE_LONG[self.scale_dtype])
        return "/".join(parts)

    def describe(self) -> str:
        """A longer label: 'int8 (block 32, bfloat16 scale, 8.5 bits)'."""
        scale = "" if self.is_mx else f", {self.scale_dtype} scale"
        return f"{self} (block {self.block_size}{scale}, {self.bits_per_element:g} bits)"

    # ---- derived facts -------------------------------------------------------------------
    @property
    def element(self) -> str:
        """The element grid: "int" (symmetric integers), or a float grid "e4m3", "e5m2", "e2m1"."""
        return _ELEMENTS[_MX.get(self.name, self.name)][0]

    @property
    def elem_bits(self) -> int:
        """Bits of one element on the wire (4-bit elements travel two a byte)."""
        return _ELEMENTS[_MX.get(self.name, self.name)][1]

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

    def nbytes(self, n: int) -> int:
        """Bytes `n` values occupy encoded: whole blocks of payload plus scale."""
        return -(-count(n, "n", minimum=0) // self.block_size) * self.bytes_per_block

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


def parse_format(text: str) -> Format | None:
    """`Format.parse`, plus "bf16" for no quantization (None), as the CLI and tables name it."""
    return None if text == UNQUANTIZED else Format.parse(text)


def format_label(fmt: Format | None) -> str:
    """The name `parse_format` reads back: `str(fmt)`, or "bf16" for None."""
    return UNQUANTIZED if fmt is None else str(fmt)
