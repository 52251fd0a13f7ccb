"""Time: what an AllReduce costs on a TPU slice, modelled, since no TPU is at hand to time it.

The model walks the same phases as the schedule (`predict.py` counts their bytes) and prices
each with three numbers of the chip:

    link   a message of b bytes over one hop:    alpha + b / W      (W one way, per link)
    HBM    a pass that reads and writes m bytes:  m / H              (dequantize, add, quantize)
    pipe   k pieces per hop: compute and link overlap

Phases, for n values over p chips on a ring with wraparound (a torus axis), chunk length L:

    reduce-scatter  p - 1 hops; a hop sends one encoded chunk (bidirectional ring: two half
                    chunks, one per link direction, at once) and the receiver dequantizes it,
                    adds its own chunk in f32 and quantizes the sum: one HBM pass of
                    2 x encoded(L) + L x input bytes. The first message is encoded before the
                    first hop (L x input bytes + encoded(L)), priced with the hops.
    all-gather      each owner's chunk, encoded once, reaches everyone: (p - 1) chunks arrive
                    over both link directions in ceil((p - 1) / 2) hops, each decoded as it
                    arrives (a memory pass overlapped with the next hop when pipelined); the
                    owner decodes its own encoded chunk too, so that every device holds the
                    same bits.
    all-to-all      (two-shot) floor(p^2 / 4) / 2 chunks cross the busiest link direction;
                    each owner sums the p messages of its chunk, its own included, as sent.

So the memory passes are the spec's (`spec.sums`), each array read or written once per pass:
along one ring axis, with a format, the fewest bytes the Mosaic codec's kernels can move (the
TPU tier holds XLA:TPU's own count of the program's bytes to them, runs/tpu_bytes.py). On a 2D
torus every hop is priced as a fused one on bf16 chunks; the executor's first hop along the
second axis reads the first axis's sums in f32, a little more than that.

Pipelining cuts each chunk into k pieces (`num_chunks`). With q and m the compute and link
time of one piece on one hop, S hops take

    T(k) = max(S k max(q, m) + min(q, m),  S (q + m))

the first term the busiest resource kept busy (fill and drain included), the second the chain
of one piece through all hops (at k = 1 nothing overlaps: S (q + m)). Every piece pays alpha,
so the best k balances hidden compute against added latency: `best_num_chunks`.

Hosts on a switch (`Chip(..., links=1)`, what the multi-host benchmark emulates) have one link
each: a hop costs what the host sends in total, so the link term of every algorithm is simply
`wire_bytes / W`, and a bidirectional ring or a torus gains nothing.

Each phase names the collective primitive that carries it (`PRIMITIVES`): a ring's reduce-scatter
a one-way permute (the bidirectional ring's a two-way one), two-shot's exchange an all-to-all,
and every gather an all-gather. A `Chip` may price each at its own rate
(`primitive_bandwidth`): the same bytes cost a network stack different times through different
primitives (on capped links gloo carries an all-to-all markedly slower than a one-way
permute: the stored multi-host runs), so the multi-host benchmark times each; a primitive
without its own rate runs at `link_bandwidth`.

A process that gets its memory from the operating system pays for it too: glibc's malloc serves
a request of `FRESH_BYTES` (32 MiB) or more with fresh pages and hands them back when freed, so
a CPU program whose result is that large touches new pages on every call, at a rate well below
a pass over warm memory. A `Chip` with a `fresh_bandwidth` prices that first touch for the
AllReduce's result (n values of the input dtype); the TPU presets leave it at None.

A pass is not always bound by its bytes: finding each block's maximum and rounding exactly
is vector work. On v5e and v6e the model prices each pass of the codec's kernels at the larger
of its bytes' HBM time and its kernel's static cycles as libtpu scheduled them
(`Chip.codec_price`, read from the stored record data/tpu-schedule.json: a roofline per
kernel, encode, hop, decode or reduce, per format); a format or chip the record lacks is
priced by bytes alone. These are the Mosaic codec's kernels (`impl="mosaic"`), the path to run
on a TPU; the XLA path's fusions cost more, and the read-back records their cycles beside
their bytes (runs/tpu_readback.py).

What the model leaves out: contention from other traffic, the real DMA engines and their
descriptors, XLA's own fusion choices. Its TPU figures are modelled, not measured; `Chip` also
takes measured figures (the multi-host benchmark builds one from its links) so the same
formulas can be held against a run.

The chips, their figures and where each comes from are models/chips.py's (`Chip`, `CHIPS`,
`as_chip`); they are imported here, so `cost.Chip` and `cost.CHIPS` read as before.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from .._checks import count, value_dtype
from ..formats import Format
from ..schedule import SCHEDULES, Algorithm, check_algorithm, device_shape, in_ring_family, layout
from ..wire import encoded_bytes
from .chips import CHIPS, DEVICE_KINDS, FRESH_BYTES, PRIMITIVES, Chip, as_chip

__all__ = ["CHIPS", "DEVICE_KINDS", "FRESH_BYTES", "PHASES", "PRIMITIVES", "Chip", "as_chip",
           "best_num_chunks", "crossover_bytes", "default_min_bytes", "phases", "predicted_time",
           "primitive_hops", "timeline"]


def primitive_hops(primitive: str, p: int) -> int:
    """The hops the model counts for one `primitive` over `p` devices on a ring: 1 for a
    permute; floor(p / 2) for an all-to-all, whose farthest chunk goes halfway round;
    ceil((p - 1) / 2) for an all-gather over both directions. Each hop pays the latency."""
    if primitive == "all_to_all":
        return p // 2
    return math.ceil((p - 1) / 2) if primitive == "all_gather" else 1


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase of an AllReduce as the model prices it.

    Attributes:
        name: "reduce-scatter", "all-gather", "all-to-all", "encode", "decode" ...
        hops: sequential hops (0 for a pass over memory only).
        link_bytes: bytes on the busiest link direction per hop (per piece: divide by pieces).
        hbm_bytes: bytes read and written per hop (or in total when hops == 0).
        pipelined: whether its hops are cut into `num_chunks` pieces.
        quantizes: (de)quantizing passes it runs per hop (or in total when hops == 0), each
            paying the chip's `quantize_overhead`; a pass run once in a phase of hops (a
            ring's first encode, the owner's own decode) is spread over them, as its bytes are.
        sent_bytes: bytes the device sends per hop over all its links together: what one
            network link carries when there is only one (`Chip.links == 1`). Summed over the
            phases' hops it is `wire_bytes`.
        primitive: the collective that carries its hops (`PRIMITIVES`).
        kernels: which codec kernel runs which part of `hbm_bytes`, as (kernel, bytes)
            pairs (a ring's hop runs the hop kernel on most of them and the first encode on
            the rest): each part is priced at `Chip.codec_price`.
    """

    name: str
    hops: int
    link_bytes: float
    hbm_bytes: float
    pipelined: bool = False
    quantizes: float = 0
    sent_bytes: float = 0.0
    primitive: str = "permute"
    kernels: tuple[tuple[str, float], ...] = ()


def phases(n: int, p, *, fmt: Format | None, algorithm: str, dtype="bfloat16",
           num_chunks: int = 1) -> list[Phase]:
    """The phases `predicted_time` prices, in order (a ring: its reduce-scatters, then its
    all-gathers, whose hops decode what arrives; two-shot: encode, all-to-all, sum and
    re-encode, all-gather, decode).

    `p` may be a pair (2D torus: a ring along axis 0, then along axis 1, gathers back).
    """
    n = count(n, "n (values)", minimum=0)
    dtype = value_dtype(dtype)
    shape = device_shape(p)
    check_algorithm(algorithm, fmt, shape, num_chunks)
    total = math.prod(shape)
    if algorithm not in SCHEDULES:  # psum, XLA's own AllReduce: a bidirectional ring, unquantized
        algorithm, fmt = "bidir_ring", None
    if n == 0 or total == 1:
        return []
    shape = tuple(q for q in shape if q > 1)  # an axis of one device has no hops, no passes
    return PHASES[algorithm](n, shape, fmt, dtype, SCHEDULES[algorithm])


def _ring_phases(n: int, shape: tuple[int, ...], fmt: Format | None, dtype,
                 row: Algorithm) -> list[Phase]:
    """The ring family's phases (`row.lanes` rings at once): reduce-scatters along each axis,
    then all-gathers back, whose hops decode what arrives."""
    itemsize, total, quantized = dtype.itemsize, math.prod(shape), int(fmt is not None)
    out: list[Phase] = []
    d = row.lanes
    chunk = layout(n, total * d, fmt.row if fmt else 1, 1)[0]
    # priced with the first phase's hops: each lane's first message, encoded before the
    # first hop (a pass per lane), and the owner's own sums, decoded with the gathered ones
    # (the lanes' bytes in one pass, as a gather hop decodes both lanes' arrivals in one)
    message = chunk * total // shape[0]  # a first hop's chunk: what axis 0 splits further
    first = quantized * d * (encoded_bytes(message, fmt, dtype) + message * itemsize)
    own = quantized * d * (encoded_bytes(chunk, fmt, dtype) + chunk * itemsize)
    # along each axis in turn: messages hold the chunks still to be split further
    lead = total
    for i, q in enumerate(shape):
        lead //= q
        enc = encoded_bytes(chunk * lead, fmt, dtype)
        hop, encode = d * (2 * enc + chunk * lead * itemsize), (i == 0) * first / (q - 1)
        out.append(Phase(f"reduce-scatter (axis of {q})", q - 1, enc, hop + encode,
                         pipelined=True, quantizes=quantized * d * (2 + (i == 0) / (q - 1)),
                         sent_bytes=d * enc,
                         primitive="two_way_permute" if d == 2 else "permute",
                         kernels=(("hop", hop), ("encode", encode))))
    lead = 1
    for i, q in enumerate(reversed(shape)):  # gathers run back, decoding as chunks come
        hops = primitive_hops("all_gather", q)
        arriving = (q - 1) * d * encoded_bytes(chunk * lead, fmt, dtype) / hops
        decode = quantized * (arriving + (q - 1) * d * chunk * lead * itemsize / hops) \
            + (i == 0) * own / hops
        out.append(Phase(f"all-gather (axis of {q})", hops, arriving / 2, decode,
                         pipelined=True, quantizes=quantized * (1 + (i == 0) / hops),
                         sent_bytes=arriving,
                         primitive="all_gather", kernels=(("decode", decode),)))
        lead *= q
    return out


def _two_shot_phases(n: int, shape: tuple[int, ...], fmt: Format | None, dtype,
                     row: Algorithm) -> list[Phase]:
    """Two-shot's phases: encode, all-to-all, sum and re-encode, all-gather, decode."""
    (p,), itemsize, quantized = shape, dtype.itemsize, int(fmt is not None)
    chunk = layout(n, p, fmt.row if fmt else 1, 1)[0]
    enc = encoded_bytes(chunk, fmt, dtype)
    per_link = (p * p // 4) / 2 * enc  # chunk-hops on the busiest link direction
    hops = primitive_hops("all_gather", p)
    encode, reduce, decode = n * itemsize + p * enc, p * enc + enc, p * enc + n * itemsize
    return [Phase("encode", 0, 0.0, encode, quantizes=quantized,
                  kernels=(("encode", encode),)),
            Phase("all-to-all", p // 2, per_link / (p // 2), 0.0,
                  sent_bytes=(p - 1) * enc / (p // 2), primitive="all_to_all"),
            Phase("sum and re-encode", 0, 0.0, reduce, quantizes=2 * quantized,
                  kernels=(("reduce", reduce),)),
            Phase("all-gather", hops, (p - 1) * enc / 2 / hops, 0.0,
                  sent_bytes=(p - 1) * enc / hops, primitive="all_gather"),
            Phase("decode", 0, 0.0, decode, quantizes=quantized,
                  kernels=(("decode", decode),))]


def _one_shot_phases(n: int, shape: tuple[int, ...], fmt: Format | None, dtype,
                     row: Algorithm) -> list[Phase]:
    """One-shot's phases: every input to everyone (a message of whole rows), summed
    everywhere."""
    (p,), itemsize, quantized = shape, dtype.itemsize, int(fmt is not None)
    enc_all = encoded_bytes(layout(n, 1, fmt.row if fmt else 1, 1)[0], fmt, dtype)
    hops = primitive_hops("all_gather", p)
    encode, reduce = n * itemsize + enc_all, p * enc_all + n * itemsize
    return [Phase("encode", 0, 0.0, encode, quantizes=quantized,
                  kernels=(("encode", encode),)),
            Phase("all-gather", hops, (p - 1) * enc_all / 2 / hops, 0.0,
                  sent_bytes=(p - 1) * enc_all / hops, primitive="all_gather"),
            Phase("decode and sum", 0, 0.0, reduce, quantizes=quantized,
                  kernels=(("reduce", reduce),))]


#: Each schedule's entry in the cost model: `(n, shape, fmt, dtype, row) -> phases`, with
#: `shape` its axes of more than one device and `row` its `schedule.SCHEDULES` row.
PHASES = {"ring": _ring_phases, "bidir_ring": _ring_phases, "two_shot": _two_shot_phases,
          "one_shot": _one_shot_phases}


def _phase_time(ph: Phase, chip: Chip, k: int, fmt: Format | None) -> float:
    fixed = ph.quantizes * chip.quantize_overhead
    memory = chip.codec_bandwidth if ph.quantizes and chip.codec_bandwidth else chip.hbm_bandwidth
    # the codec's kernels at their stored cycles where the chip has them (Chip.codec_price)
    priced = ph.hbm_bytes + sum(b * (chip.codec_price(fmt, kernel) - 1)
                                for kernel, b in ph.kernels if ph.quantizes)
    if ph.hops == 0:
        return priced / memory + fixed
    k = k if ph.pipelined else 1
    per_hop = ph.sent_bytes if chip.links == 1 else ph.link_bytes
    m = chip.hop_latency + per_hop / k / chip.bandwidth(ph.primitive)
    q = priced / k / memory + fixed
    s = ph.hops
    return max(s * k * max(q, m) + min(q, m), s * (q + m))


def timeline(hops: int, num_chunks: int, compute_s: float, link_s: float
             ) -> list[tuple[str, int, int, float, float]]:
    """One device's schedule of a pipelined phase: `(resource, hop, piece, start, end)` events.

    Piece j's hop s is computed (dequantize, add, quantize: `compute_s`) once its hop s - 1 has
    arrived, then sent (`link_s`); the compute unit and the link each do one thing at a time.
    Its makespan is what `predicted_time`'s formula approximates; figures draw it as a Gantt
    chart.
    """
    events, compute_free, link_free = [], 0.0, 0.0
    arrived = [0.0] * num_chunks
    for s in range(hops):
        for j in range(num_chunks):
            start = max(compute_free, arrived[j])
            compute_free = start + compute_s
            events.append(("compute", s, j, start, compute_free))
            send = max(link_free, compute_free)
            link_free = send + link_s
            events.append(("link", s, j, send, link_free))
            arrived[j] = link_free
    return events


def predicted_time(n: int, p, *, fmt: Format | None, algorithm: str, chip,
                   num_chunks: int = 1, dtype="bfloat16") -> float:
    """Modelled seconds for an AllReduce of `n` values of `dtype` over `p` chips (module essay).

    `chip` is a key of `CHIPS` ("v5e", ...) or a `Chip`. A modelled figure, not a measurement.
    """
    c = as_chip(chip)
    steps = phases(n, p, fmt=fmt, algorithm=algorithm, dtype=dtype, num_chunks=num_chunks)
    result = n * value_dtype(dtype).itemsize  # the AllReduce's output: fresh pages if large
    fresh = result / c.fresh_bandwidth if steps and c.fresh_bandwidth and result >= FRESH_BYTES \
        else 0.0
    return sum(_phase_time(ph, c, num_chunks, fmt) for ph in steps) + fresh


def best_num_chunks(n: int, p, *, fmt: Format | None, algorithm: str, chip,
                    dtype="bfloat16", max_chunks: int = 256) -> int:
    """The pipeline depth (a power of two up to `max_chunks`) the model finds fastest."""
    max_chunks = count(max_chunks, "max_chunks")
    predicted_time(n, p, fmt=fmt, algorithm=algorithm, chip=chip, dtype=dtype)  # checks all
    if not in_ring_family(algorithm):  # only rings pipeline
        return 1
    depths = [1 << i for i in range(int(math.log2(max_chunks)) + 1)]
    return min(depths, key=lambda k: predicted_time(n, p, fmt=fmt, algorithm=algorithm, chip=chip,
                                                    num_chunks=k, dtype=dtype))


def crossover_bytes(p, *, fmt: Format, algorithm: str, chip, dtype="bfloat16") -> int:
    """The smallest message (bytes of `dtype`) from which `fmt` beats the unquantized run of the
    same algorithm in the model, each at its best pipeline depth; 0 if it always wins."""
    dtype = value_dtype(dtype)
    itemsize = dtype.itemsize

    def wins(nbytes):
        n = max(1, nbytes // itemsize)
        t = {f: predicted_time(n, p, fmt=f, algorithm=algorithm, chip=chip, dtype=dtype,
                               num_chunks=best_num_chunks(n, p, fmt=f, algorithm=algorithm,
                                                          chip=chip, dtype=dtype))
             for f in (fmt, None)}
        return t[fmt] < t[None]

    lo, hi = itemsize, 1 << 34
    if wins(lo):
        return 0
    if not wins(hi):
        raise ValueError(f"{fmt} never beats the unquantized {algorithm} on {as_chip(chip).name} "
                         "in the model, up to 16 GiB")
    while hi - lo > itemsize * 64 and hi > lo * 1.01:
        mid = int(math.sqrt(lo * hi))
        lo, hi = (lo, mid) if wins(mid) else (mid, hi)
    return hi


@functools.cache
def default_min_bytes(p, *, fmt: Format, algorithm: str, device_kind: str) -> int:
    """The size gate of `all_reduce(..., min_bytes="auto")`, opt-in (the default gate reads the
    message only: `predict.quantizing_saves_bytes`): below this many bytes the message goes
    unquantized. On a known TPU it is the model's `crossover_bytes` for that chip; on anything
    else (CPU devices, simulated or not, where no link is saved) it is 0: every message is
    quantized, exactly as asked. It reads the chip, so the bits it gives depend on the chip."""
    chip = DEVICE_KINDS.get(device_kind)
    if chip is None or algorithm not in SCHEDULES:  # psum quantizes nothing
        return 0
    return crossover_bytes(p, fmt=fmt, algorithm=algorithm, chip=chip)
