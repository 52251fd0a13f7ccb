"""Chips: the figures the time model prices an AllReduce with, one `Chip` per kind.

A `Chip` holds what models/cost.py needs of one device: the bandwidth of a link one way and the
latency of a hop over it, the bandwidth of a pass over memory, the bf16 FLOP/s and the matrix
units that give its clock, how many links it has (4 on a 2D torus, 6 on a 3D one, 1 for hosts
on a switch), and, where measured, what quantizing and first touching memory cost and the rate
of each collective primitive (`PRIMITIVES`). The TPU presets are `CHIPS`; the multi-host
benchmark builds a `Chip` from what it measured on its links, so the same formulas can be held
against a run. `as_chip` reads a preset's name or takes a `Chip`; `DEVICE_KINDS` maps jax's
device kinds to the presets (the size gate, models/cost.py's `default_min_bytes`).

On v5e and v6e a pass of the codec's kernels is priced at the larger of its bytes' HBM time and
its kernel's static cycles as libtpu scheduled them (`Chip.codec_price`, read from the stored
record data/tpu-schedule.json); a format or chip the record lacks is priced by bytes alone.

Chip figures: jax-ml/scaling-book, "How to Scale Your Model", part 2 (TPUs): HBM bandwidth and
bf16 FLOP/s per chip, ICI bandwidth per link one way; pod shapes from the same table. The per-hop
latency of about 1 us is the book's part 3 (sharding) rule of thumb: an estimate.
"""

from __future__ import annotations

import dataclasses
import functools

from .. import data
from .._checks import count, number
from ..formats import Format

__all__ = ["CHIPS", "DEVICE_KINDS", "FRESH_BYTES", "PRIMITIVES", "Chip", "as_chip"]


#: The collective primitives that carry the phases (`Phase.primitive`).
PRIMITIVES = ("permute", "two_way_permute", "all_to_all", "all_gather")


_OPTIONAL = ("codec_bandwidth", "fresh_bandwidth")  # Chip fields that may be None


@dataclasses.dataclass(frozen=True)
class Chip:
    """The figures the time model needs, each per chip.

    Attributes:
        name: e.g. "TPU v5e".
        link_bandwidth: bytes/s one way over one link (ICI).
        hop_latency: seconds per hop (alpha).
        hbm_bandwidth: bytes/s of an elementwise pass over memory.
        peak_flops: bf16 FLOP/s (for compute-bound work such as a model's matmuls).
        links: links per chip (4 on a 2D torus, 6 on a 3D one). 1 means hosts on a switch, each
            with one network link: everything a device sends shares that link, whichever
            neighbour it goes to, so a bidirectional ring gains nothing and an all-gather
            pays for every byte (the multi-host benchmark's emulated hosts).
        torus: the largest slice's shape.
        source: where the figures come from.
        codec_bandwidth: bytes/s of a pass that quantizes or dequantizes, counted in the same
            bytes as a memory pass. None (the TPU presets): as fast as a memory pass, since a
            fused kernel that reads and writes each byte once is memory bound on a TPU (an
            assumption: EQuARX's kernels are not public). On a CPU the exact rounding makes
            the pass compute bound, so the multi-host benchmark measures it.
        quantize_overhead: fixed seconds each (de)quantizing pass costs beyond its memory
            traffic (kernel launch, the latency of finding each block's scale; a reduce hop
            runs two passes per lane, `Phase.quantizes`). No public figure exists for
            TPUs, so their presets say 0 and quantizing then never loses in the model; set it
            from a measurement to get a real crossover (`crossover_bytes`).
        fresh_bandwidth: bytes/s of first touching memory fresh from the operating system,
            paid for a result of at least `FRESH_BYTES` (module essay). None (the TPU
            presets): not modelled. The multi-host benchmark measures it.
        mxus: matrix units per chip, and `mxu_width` their width (128 x 128, 256 x 256): with
            `peak_flops` they give the clock (`clock_hz`) a static bundle schedule is priced
            at (models/bundles.py). 0: not known.
        schedule: the chip whose stored static schedule prices the codec's kernels
            (`codec_price`; "" for none): each (de)quantizing pass of a format the TPU tier
            read back costs the larger of its bytes' HBM time and its kernel's bundles at the
            clock, as libtpu scheduled them (data/tpu-schedule.json). The v5e and v6e presets
            name themselves; a format or chip without stored cycles is priced by bytes alone.
        primitive_bandwidth: bytes/s sent per device through each collective primitive that
            was timed on its own, as (primitive, bytes/s) pairs (a dict is taken too), the
            primitives those of `PRIMITIVES`; a phase whose primitive has no rate here runs at
            `link_bandwidth` (the TPU presets: one ICI rate for all).
    """

    name: str
    link_bandwidth: float
    hop_latency: float
    hbm_bandwidth: float
    peak_flops: float
    links: int = 4
    torus: tuple[int, ...] = ()
    source: str = ""
    quantize_overhead: float = 0.0
    codec_bandwidth: float | None = None
    fresh_bandwidth: float | None = None
    primitive_bandwidth: tuple[tuple[str, float], ...] = ()
    mxus: int = 0
    mxu_width: int = 0
    schedule: str = ""

    def __post_init__(self):
        for field in ("name", "source", "schedule"):
            if not isinstance(getattr(self, field), str):
                raise TypeError(f"Chip.{field} must be a string, got {getattr(self, field)!r}")
        for field in ("link_bandwidth", "hbm_bandwidth", "peak_flops", "hop_latency",
                      "quantize_overhead", "codec_bandwidth", "fresh_bandwidth"):
            if getattr(self, field) is not None or field not in _OPTIONAL:
                number(getattr(self, field), f"Chip.{field}",
                       positive=field not in ("hop_latency", "quantize_overhead"))
        count(self.links, "Chip.links")
        count(self.mxus, "Chip.mxus (0: not known)", minimum=0)
        count(self.mxu_width, "Chip.mxu_width (0: not known)", minimum=0)
        if not isinstance(self.torus, tuple):
            raise TypeError(f"Chip.torus must be a tuple of chips per axis, got {self.torus!r}")
        for q in self.torus:
            count(q, "Chip.torus (chips per axis)")
        rates = self.primitive_bandwidth
        pairs = list(rates.items()) if isinstance(rates, dict) else rates
        if not isinstance(pairs, (tuple, list)) or not all(
                isinstance(pair, (tuple, list)) and len(pair) == 2 for pair in pairs):
            raise TypeError("Chip.primitive_bandwidth must be (primitive, bytes/s) pairs or a "
                            f"dict, got {rates!r}")
        for name, rate in pairs:
            if name not in PRIMITIVES:
                raise ValueError(f"Chip.primitive_bandwidth: unknown primitive {name!r}; "
                                 f"choose from {list(PRIMITIVES)}")
            number(rate, f"Chip.primitive_bandwidth[{name!r}]")
        object.__setattr__(self, "primitive_bandwidth",
                           tuple(sorted((name, float(rate)) for name, rate in pairs)))

    @property
    def clock_hz(self) -> float:
        """Cycles a second, from public figures: peak bf16 FLOP/s over the MXUs' multiply-adds
        a cycle, mxus x width^2 x 2 (one row of each MXU a cycle)."""
        if not (self.mxus and self.mxu_width):
            raise ValueError(f"{self.name}: no MXU figures, so no clock to price cycles at")
        return self.peak_flops / (self.mxus * self.mxu_width ** 2 * 2)

    def codec_price(self, fmt: Format | None, kernel: str) -> float:
        """How many times its bytes' HBM time one pass of the codec's `kernel` ("encode",
        "hop", "decode", "reduce") costs for `fmt` on this chip: its static cycles at the clock
        over that time, at least 1 (bytes bound) and 1 where nothing is stored."""
        if fmt is None or not self.schedule:
            return 1.0
        return max(1.0, _stored_codec(self.schedule).get((fmt, kernel), 1.0))

    def bandwidth(self, primitive: str) -> float:
        """Bytes/s of `primitive`: its own rate if measured, else `link_bandwidth`."""
        return dict(self.primitive_bandwidth).get(primitive, self.link_bandwidth)


@functools.cache
def _stored_codec(chip: str) -> dict:
    """(format, kernel) -> compute time over fewest bytes' HBM time, from the stored static
    schedule of `chip` (the TPU tier: `equarx-ref kernels --compile ... --schedule`)."""
    rows = data.load("tpu-schedule")["schedule"]["codec"]
    return {(Format.parse(r["format"]), r["kernel"]): r["ratio"] for r in rows
            if r["topology"].split(":")[0] == chip}


#: Requests this large get fresh pages from glibc's malloc on every call (mmap, returned on
#: free): its dynamic mmap threshold rises with what is freed, but never above 32 MiB on a
#: 64-bit machine (DEFAULT_MMAP_THRESHOLD_MAX).
FRESH_BYTES = 32 << 20


_BOOK = "jax-ml/scaling-book, How to Scale Your Model, part 2 (TPUs), tables of chip figures"
_HOP = "hop latency ~1 us: an estimate (scaling-book part 3)"
_MXU = ("MXUs per chip: Google Cloud's TPU pages and jax's Pallas `TpuInfo` (v5e 4 of 128 x "
        "128; v6e 2 of 256 x 256; v4 and v5p 2 TensorCores of 4 of 128 x 128)")
_CYCLES = "codec passes: libtpu's static schedule of the kernels (data/tpu-schedule.json)"
CHIPS = {
    # name: ICI one way per link, hop latency, HBM bandwidth, bf16 FLOP/s; links; pod shape;
    # MXUs and their width (the clock: `Chip.clock_hz`)
    "v4": Chip("TPU v4", 4.5e10, 1e-6, 1.2e12, 2.75e14, 6, (16, 16, 16),
               f"{_BOOK}; {_HOP}; {_MXU}", mxus=8, mxu_width=128),
    "v5e": Chip("TPU v5e", 5e10, 1e-6, 8.1e11, 1.97e14, 4, (16, 16),
                f"{_BOOK}; {_HOP}; {_MXU}; {_CYCLES}", mxus=4, mxu_width=128,
                schedule="v5e"),
    "v5p": Chip("TPU v5p", 1e11, 1e-6, 2.8e12, 4.59e14, 6, (16, 20, 28),
                f"{_BOOK}; {_HOP}; {_MXU}", mxus=8, mxu_width=128),
    "v6e": Chip("TPU v6e", 1e11, 1e-6, 1.6e12, 9.2e14, 4, (16, 16),
                f"{_BOOK}; {_HOP}; {_MXU}; {_CYCLES}", mxus=2, mxu_width=256,
                schedule="v6e"),
}


# jax's device_kind of each chip (as printed by jax.devices()[0].device_kind)
DEVICE_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5": "v5p",
                 "TPU v5p": "v5p", "TPU v6 lite": "v6e", "TPU v6e": "v6e"}


def as_chip(chip) -> Chip:
    if isinstance(chip, Chip):
        return chip
    if not isinstance(chip, str):
        raise TypeError(f"chip must be a name in CHIPS {sorted(CHIPS)} or a Chip, got {chip!r}")
    if chip not in CHIPS:
        raise ValueError(f"unknown chip {chip!r}; choose one of {sorted(CHIPS)} or pass a Chip")
    return CHIPS[chip]
