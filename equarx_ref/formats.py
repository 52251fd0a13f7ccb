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

Other integer widths, `int2` ... `int12` (`int6`, `int9`, ...), are bit-packed: a block's codes
form one little-endian bit stream (element i in bits [i N, (i + 1) N) of the block's payload), so
int6 costs 6 bits and int9 9 bits, plus the scale; the block must fill whole bytes (B N % 8 == 0).
The hop-aware ring plans of `hops.py` send such widths.

Microscaling (OCP MX v1.0: `mxfp8`, `mxfp6_e2m3`, `mxfp6_e3m2`, `mxfp4`, `mxint8`) fixes the scale
to a bare power of two, stored as an E8M0 exponent byte, one per 32 values (8.25, 6.25 and 4.25
bits; six-bit elements are bit-packed like int6). Two rules choose the exponent (`scale_rule`):

- "floor" (default): the specification's 2^(floor(log2(amax)) - emax_elem), emax_elem the
  exponent of the element format's largest normal (e4m3: 8, e2m1: 2, e2m3: 2, e3m2: 4; mxint8:
  6 in integer units, the spec's 1.6 fixed point times 2^6), as torchao's `to_mx` and hardware
  converters compute it: the bytes other MX implementations send. It is one step finer than
  "ceil" on the blocks whose amax mantissa exceeds elem_max's, and saturates (clips) their
  largest values to +-elem_max, by design;
- "ceil", on request: 2^ceil(log2(amax / elem_max)), the smallest power of two with which no
  element clips (error within half a grid step everywhere, like the other formats).
  `str(Format("mxfp8", scale_rule="ceil"))` is "mxfp8/ceil".
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from ._checks import count, natural_sorted
from .spec.formats import ELEMENTS, MX

__all__ = ["FORMAT_NAMES", "SCALE_DTYPES", "SCALE_RULES", "UNQUANTIZED", "Format", "format_label",
           "parse_format"]

# Scale types: name -> bits on the wire. "e8m0" is a power-of-two exponent byte (MX).
SCALE_DTYPES = {"bfloat16": 16, "float32": 32, "e8m0": 8}


@functools.cache
def _float_element(dtype) -> tuple[str, int, int, int, float]:
    """A float element type's grid as `Format` reads it, from ml_dtypes' `finfo`: (its name
    "eXmY", exponent bits, mantissa bits, smallest normal exponent, largest finite value);
    e4m3fn: ("e4m3", 4, 3, -6, 448.0), no infinities (480 would be NaN)."""
    info = ml_dtypes.finfo(dtype)
    return f"e{info.nexp}m{info.nmant}", info.nexp, info.nmant, info.minexp, float(info.max)


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


# The format names and their elements are the spec's tables (spec/formats.py): `ELEMENTS`,
# each name's ml_dtypes element type (None: a symmetric integer) and bits, and `MX`, the
# presets whose scale is always E8M0. Read where used, so a row added there is a format here.
#: How an E8M0 (power-of-two) scale is chosen: "ceil" never clips, "floor" is OCP MX v1.0's.
SCALE_RULES = ("ceil", "floor")
_SCALE_SHORT = {"bf16": "bfloat16", "f32": "float32", "e8m0": "e8m0"}
_SCALE_LONG = {v: k for k, v in _SCALE_SHORT.items()}
MAX_BLOCK_SIZE = 1 << 16  # far beyond any useful block; keeps buffers sane

#: Names `Format.parse` accepts without options, in the order tables list them.
FORMAT_NAMES = ("int8", "int4", "fp8_e4m3", "fp8_e5m2", "mxfp8", "mxfp4")
#: The name of "no quantization" wherever a format is named (CLI, tables): the input's own
#: 16-bit float travels as is.
UNQUANTIZED = "bf16"
#: The formats compared side by side (the demo, Gemma's quality table): none, then one of each
#: family at its usual block size.
COMPARED_FORMATS = (UNQUANTIZED, "int8", "int4", "fp8_e4m3")
#: Bytes halving at each step: the multi-host runs and the baselines of the outliers command.
BYTE_LADDER = (UNQUANTIZED, "int8", "int4")


@dataclasses.dataclass(frozen=True)
class Format:
    """A block-wise quantized wire format: element type, block size, scale type (and rule).

    `Format("int8")`, `Format("int4", 16)`, `Format("fp8_e4m3", 32, "float32")`,
    `Format("mxfp8", scale_rule="floor")`, or the presets `Format.int8()`, `Format.int4()`,
    `Format.fp8_e4m3()`, `Format.fp8_e5m2()`, `Format.mxfp8()`, `Format.mxfp6()`,
    `Format.mxfp4()`. `str(fmt)` is a short name that `Format.parse` reads back: "int8",
    "int4/b16", "fp8_e4m3/f32", "mxfp8", "mxfp6_e2m3/ceil".

    Attributes:
        name: the element type: "int8", "int4", another integer width "int2" ... "int12"
            (bit-packed), "fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp6_e3m2", "fp4_e2m1", or an MX
            preset name "mxfp8", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", "mxint8" (whose scale is
            always E8M0).
        block_size: values sharing one scale.
        scale_dtype: "bfloat16", "float32" or "e8m0" (a power-of-two exponent byte, as in MX).
        scale_rule: for E8M0 scales, "floor" (default: OCP MX v1.0, clips by design; module
            essay) or "ceil" (no element clips). Other scale types take "ceil" only (their
            scale is the smallest covering value); None picks the scale type's default.
    """

    name: str
    block_size: int = 32
    scale_dtype: str | None = None  # None: bfloat16, or e8m0 for the MX names
    scale_rule: str | None = None  # None: "floor" for E8M0 scales, else "ceil"

    def __post_init__(self):
        if not isinstance(self.name, str) or self.name not in ELEMENTS:
            hint = (" (Format's fields are name, block_size, scale_dtype: e.g. "
                    "Format('int8', 32, 'bfloat16'))" if not isinstance(self.name, str) else "")
            raise ValueError(f"unknown format name {self.name!r}; choose one of "
                             f"{natural_sorted(ELEMENTS)}{hint}")
        object.__setattr__(self, "block_size", count(self.block_size, "block_size",
                                                       maximum=MAX_BLOCK_SIZE))
        default = "e8m0" if self.name in MX else "bfloat16"
        scale = default if self.scale_dtype is None else _scale_name(self.scale_dtype)
        if self.name in MX and scale != "e8m0":
            raise ValueError(f"{self.name} is an MX format: its scale is e8m0, "
                             f"got scale_dtype={self.scale_dtype!r}")
        object.__setattr__(self, "scale_dtype", scale)
        if self.block_size * self.elem_bits % 8:
            unit = 8 // math.gcd(8, self.elem_bits)
            rule = "even" if unit == 2 else f"a multiple of {unit}"
            raise ValueError(f"{self.elem_bits}-bit elements are bit-packed: a block must fill "
                             f"whole bytes, so block_size must be {rule}, got {self.block_size}")
        if self.scale_rule is None:
            object.__setattr__(self, "scale_rule", "floor" if scale == "e8m0" else "ceil")
        if self.scale_rule not in SCALE_RULES:
            raise ValueError(f"scale_rule must be one of {SCALE_RULES}, got {self.scale_rule!r}")
        if self.scale_rule != "ceil" and scale != "e8m0":
            raise ValueError(f"scale_rule={self.scale_rule!r} is for power-of-two (E8M0, MX) "
                             f"scales; a {scale} scale is always the smallest that covers amax")

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
    def mxfp8(cls, block_size: int = 32, scale_rule: str = "floor") -> Format:
        """OCP MXFP8: e4m3 elements, one power-of-two E8M0 scale per 32 values (8.25 bits)."""
        return cls("mxfp8", block_size, "e8m0", scale_rule)

    @classmethod
    def mxfp4(cls, block_size: int = 32, scale_rule: str = "floor") -> Format:
        """OCP MXFP4: e2m1 elements, one power-of-two E8M0 scale per 32 values (4.25 bits)."""
        return cls("mxfp4", block_size, "e8m0", scale_rule)

    @classmethod
    def mxfp6(cls, element: str = "e2m3", block_size: int = 32,
              scale_rule: str = "floor") -> Format:
        """OCP MXFP6: e2m3 (default) or e3m2 elements, bit-packed, one E8M0 scale per 32
        values (6.25 bits)."""
        if not isinstance(element, str) or f"mxfp6_{element}" not in MX:
            raise ValueError(f"mxfp6 element must be 'e2m3' or 'e3m2', got {element!r}")
        return cls(f"mxfp6_{element}", block_size, "e8m0", scale_rule)

    # ---- names ---------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> Format:
        """Read a format name as `str(fmt)` writes it: "int8", "int4/b16", "fp8_e4m3/f32",
        "mxfp8/ceil".

        Options after the name, separated by "/": "bN" (block size N), a scale type
        ("bf16", "f32", "e8m0") and a scale rule ("floor", "ceil"). Raises ValueError naming
        what it could not read.
        """
        if not isinstance(text, str):
            raise TypeError(f"Format.parse reads a format's text such as 'int4/b16', got "
                            f"{type(text).__name__}")
        name, *options = text.strip().lower().split("/")
        block, scale, rule = 32, None, None
        for opt in options:
            if re.fullmatch(r"b\d+", opt):
                block = int(opt[1:])
            elif opt in _SCALE_SHORT:
                scale = _SCALE_SHORT[opt]
            elif opt in SCALE_RULES:
                rule = opt
            else:
                raise ValueError(f"cannot read {opt!r} in format {text!r}: options are bN "
                                 f"(block size), a scale type {sorted(_SCALE_SHORT)} and a "
                                 f"scale rule {list(SCALE_RULES)}")
        if name == UNQUANTIZED:
            raise ValueError(f"format {text!r}: {UNQUANTIZED!r} means no quantization, which "
                             f"is no Format (parse_format reads it as None) and takes no options")
        try:
            return cls(name, block, scale, rule)
        except ValueError as e:  # name the text read, not only the field it made
            raise ValueError(f"format {text!r}: {e}") from None

    def __str__(self) -> str:
        default_scale = "e8m0" if self.name in MX else "bfloat16"
        parts = [self.name]
        if self.block_size != 32:
            parts.append(f"b{self.block_size}")
        if self.scale_dtype != default_scale:
            parts.append(_SCALE_LONG[self.scale_dtype])
        if self.scale_rule != ("floor" if self.scale_dtype == "e8m0" else "ceil"):
            parts.append(self.scale_rule)
        return "/".join(parts)

    def describe(self) -> str:
        """A longer label: 'int8 (block 32, bfloat16 scale, 8.5 bits)'."""
        scale = "" if self.is_mx else f", {self.scale_dtype} scale"
        scale += (", ceil scale rule: no clipping" if self.scale_dtype == "e8m0" and
                  self.scale_rule == "ceil" else "")
        return f"{self} (block {self.block_size}{scale}, {self.bits_per_element:g} bits)"

    # ---- derived facts -------------------------------------------------------------------
    @property
    def element(self) -> str:
        """The element grid: "int" (symmetric integers), or a float grid "e4m3", "e5m2", "e2m1"."""
        dtype = ELEMENTS[MX.get(self.name, self.name)][0]
        return "int" if dtype is None else _float_element(dtype)[0]

    @property
    def elem_bits(self) -> int:
        """Bits of one element on the wire (4-bit elements travel two a byte)."""
        return ELEMENTS[MX.get(self.name, self.name)][1]

    def _float(self) -> tuple[str, int, int, int, float]:
        """The float element's grid (`_float_element`); ValueError for integer elements."""
        dtype = ELEMENTS[MX.get(self.name, self.name)][0]
        if dtype is None:
            raise ValueError(f"{self.name} has integer elements")
        return _float_element(dtype)

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
        return self._float()[4]

    @property
    def mant_bits(self) -> int:
        """Mantissa bits of a float element (ValueError for integer elements)."""
        return self._float()[2]

    @property
    def min_exponent(self) -> int:
        """Smallest normal exponent of a float element; below it the grid is evenly spaced."""
        return self._float()[3]

    @property
    def scale_bits(self) -> int:
        return SCALE_DTYPES[self.scale_dtype]

    @property
    def scale_bytes(self) -> int:
        return self.scale_bits // 8

    @property
    def emax_elem(self) -> int:
        """floor(log2(elem_max)): the exponent of the largest element (OCP's floor rule)."""
        return math.floor(math.log2(self.elem_max))

    @property
    def payload_bytes_per_block(self) -> int:
        return self.block_size * self.elem_bits // 8

    @property
    def bytes_per_block(self) -> int:
        """Payload plus scale of one block, as sent."""
        return self.payload_bytes_per_block + self.scale_bytes

    @property
    def blocks_per_row(self) -> int:
        """G: blocks in one row of a message (wire.py): 128 / block_size when the block
        divides 128, else 1."""
        return 128 // self.block_size if 128 % self.block_size == 0 else 1

    @property
    def row(self) -> int:
        """Values in one row of a message: 128 when the block divides 128, else one block.
        The collectives cut their chunks in whole rows."""
        return self.blocks_per_row * self.block_size

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
        _, _, m, emin, vmax = self._float()
        values = {0.0}
        e = emin
        while 2.0**e <= vmax:
            values.update(2.0**e * (1 + k / 2**m) for k in range(2**m))
            e += 1
        values.update(2.0**emin * k / 2**m for k in range(2**m))  # subnormals
        return np.array(sorted(v for v in values if v <= vmax))


def parse_format(text: str) -> Format | None:
    """`Format.parse`, plus "bf16" for no quantization (None), as the CLI and tables name it.
    Names are read trimmed and in any case (" INT8 " is int8)."""
    if not isinstance(text, str):
        raise TypeError(f"parse_format takes a format name such as 'int8' or {UNQUANTIZED!r}, "
                        f"got {text!r}")
    return None if text.strip().lower() == UNQUANTIZED else Format.parse(text)


def format_label(fmt: Format | None) -> str:
    """The name `parse_format` reads back: `str(fmt)`, or "bf16" for None."""
    if fmt is not None and not isinstance(fmt, Format):
        raise TypeError(f"fmt must be an equarx_ref.Format or None, got {fmt!r}")
    return UNQUANTIZED if fmt is None else str(fmt)
