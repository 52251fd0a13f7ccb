"""Where a TPU program's memory traffic goes: XLA:TPU's "bytes accessed", taken apart.

`compiled.cost_analysis()["bytes accessed"]` is one number: for every instruction the program
runs (outside fusions), the bytes of its operands plus the bytes of its results. On a TPU an
array's bytes are those of its *tiled* layout, which the compiled HLO prints with each shape:

    u8[32768,34]{1,0:T(8,128)(4,1)S(1)}   rows of 34 bytes in tiles of 8 x 128: each row takes
                                          128 bytes (3.8x its data); S(1): it lives in VMEM

`memory_traffic(hlo_text)` redoes that count from the program text, op by op, and says what
each byte is for, so a large count can be explained rather than guessed at:

    fusion      compute: XLA's fused loops (the quantize / dequantize / add work)
    copy        a relayout (transpose between tiled layouts) or a move between HBM and VMEM
    reshape     a reshape that is not a bitcast: on tiled layouts, another relayout copy
    slice       slices, dynamic slices and updates, concatenates, pads
    collective  what collectives read and write locally (not the wire: see `hlo_wire_bytes`)
    other       reductions, selects, converts left unfused...

and which bytes stay on chip: an op whose operands and results all carry `S(1)` works in VMEM
(the core's vector memory, no HBM bandwidth spent); everything else is counted as HBM traffic.
The tally is an estimate of the compiler's own (the same rule; tpu.json's read-backs store
both side by side for the XLA path's compiled AllReduces), and like it, it counts a while
loop's body once.

A Pallas TPU kernel is one custom call, which both counts treat as free (XLA:TPU cannot see
inside it). `kernel_io(hlo_text)` is what such a kernel moves when its grid visits every tile
of every operand and result once, as the Mosaic codec's kernels do (`kernels/codec.py`): its
operands' and results' tiled bytes, each once.

Trade-off: this reads the layout XLA chose and nothing deeper (no cache, no DMA overlap); it
says how many bytes the program moves and through which memory, not how long that takes.
"""

from __future__ import annotations

import dataclasses
import math
import re

__all__ = ["KINDS", "MemoryTraffic", "kernel_io", "largest_arrays", "memory_traffic",
           "op_bytes", "tiled_bytes"]

#: The categories of `MemoryTraffic.by_kind`.
KINDS = ("fusion", "copy", "reshape", "slice", "collective", "other")

_SHAPE = re.compile(r"\b(pred|[a-z]+\d+[a-z0-9]*)\[([\d,]*)\](\{[^}]*\})?")
_BITS = {"pred": 8, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "bf16": 16, "f16": 16, "s16": 16,
         "u16": 16, "f32": 32, "s32": 32, "u32": 32, "f64": 64, "s64": 64, "u64": 64}
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_CALL = re.compile(r"\s([a-z][a-z0-9\-]*)\((.*?)\)(?:,|$)")
_HEADER = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
_SUB = re.compile(r"(?:body|condition|true_computation|false_computation)=%([\w.\-]+)")
# ops that move no bytes of their own (views, bookkeeping, the second half of an async pair)
_FREE = {"parameter", "constant", "get-tuple-element", "bitcast", "tuple", "while",
         "custom-call", "partition-id", "replica-id", "copy-done", "collective-permute-done",
         "all-reduce-done", "all-gather-done", "after-all", "opt-barrier", "conditional", "call"}
_KIND = {"fusion": "fusion", "copy": "copy", "copy-start": "copy", "transpose": "copy",
         "reshape": "reshape", "slice": "slice", "dynamic-slice": "slice",
         "dynamic-update-slice": "slice", "concatenate": "slice", "pad": "slice",
         "collective-permute": "collective", "collective-permute-start": "collective",
         "all-reduce": "collective", "all-reduce-start": "collective",
         "all-gather": "collective", "all-gather-start": "collective",
         "all-to-all": "collective", "reduce-scatter": "collective"}


@dataclasses.dataclass(frozen=True)
class MemoryTraffic:
    """Bytes accessed by one compiled program, by kind of op and by memory.

    Attributes:
        total: operand + result bytes of every op, in their tiled layouts.
        by_kind: `total` split over `KINDS`.
        vmem: the part done by ops that touch VMEM only (no HBM bandwidth).
        logical: `total` with every array at its data size (no tile padding).
    """

    total: float
    by_kind: dict[str, float]
    vmem: float
    logical: float

    @property
    def hbm(self) -> float:
        """The part that reads or writes HBM (or could: no memory space marked)."""
        return self.total - self.vmem

    @property
    def padding(self) -> float:
        """How much the tiled layouts inflate the count: total / logical."""
        return self.total / self.logical if self.logical else 1.0


def _array_bytes(dtype: str, dims: str, layout: str | None) -> tuple[float, float, bool]:
    """(tiled bytes, data bytes, in VMEM) of one array shape as XLA:TPU prints it."""
    shape = [int(d) for d in dims.split(",") if d]
    bits = _BITS.get(dtype, 0)
    data = bits * math.prod(shape) / 8
    vmem = bool(layout) and "S(1)" in layout
    tiled = re.search(r"\{([\d,]*):T\((\d+(?:,\d+)*)\)", layout or "")
    if not tiled or not shape:
        return data, data, vmem
    order = [int(x) for x in tiled.group(1).split(",") if x]  # minor to major
    padded = list(shape)
    for i, t in enumerate(reversed([int(x) for x in tiled.group(2).split(",")])):
        if i < len(order):  # the tile's last dimension covers the most minor axis, and so on
            padded[order[i]] = -(-padded[order[i]] // t) * t
    return bits * math.prod(padded) / 8, data, vmem


def tiled_bytes(shape: str) -> tuple[float, float]:
    """(bytes in its tiled layout, bytes of data) of one array as XLA:TPU prints it:
    `tiled_bytes("u8[32768,34]{1,0:T(8,128)(4,1)}")` is (4194304.0, 1114112.0), each row of 34
    bytes taking a tile row of 128."""
    found = _SHAPE.fullmatch(shape.strip())
    if not found:
        raise ValueError(f"not an array shape as XLA prints it: {shape!r} (e.g. "
                         "'u8[32768,34]{1,0:T(8,128)(4,1)}')")
    tiled, data, _ = _array_bytes(*found.groups())
    return tiled, data


def largest_arrays(hlo_text: str, count: int = 4) -> list[dict]:
    """The `count` largest distinct array shapes of a compiled program, by tiled bytes: each
    {"shape" (as XLA printed it, with its layout), "tiled", "data"}."""
    seen = {}
    for found in _SHAPE.finditer(hlo_text):
        if found.group(3) and found.group(2):  # an array with its layout, not a scalar
            tiled, data, _ = _array_bytes(*found.groups())
            seen[found.group(0)] = {"shape": found.group(0), "tiled": tiled, "data": data}
    return sorted(seen.values(), key=lambda a: (-a["tiled"], a["shape"]))[:count]


def _computations(hlo_text: str) -> tuple[str, dict[str, list[str]]]:
    comps: dict[str, list[str]] = {}
    entry, current = "", None
    for line in hlo_text.splitlines():
        head = _HEADER.match(line)
        if head:
            current = head.group(2)
            comps[current] = []
            entry = current if head.group(1) else entry
        elif line.startswith("}"):
            current = None
        elif current is not None:
            comps[current].append(line)
    return entry, comps


def _ops(lines: list[str], named: bool = False):
    """Each instruction of a computation that calls an op: (opcode, its text, the arrays it
    touches: its operands' and its results', each (tiled bytes, data bytes, in VMEM)); with
    `named`, its name first."""
    arrays: dict[str, list[tuple[float, float, bool]]] = {}
    for line in lines:
        instr = _INSTR.match(line)
        if not instr:
            continue
        target, rest = instr.groups()
        call = _CALL.search(rest)
        result = rest[:call.start()] if call else rest
        arrays[target] = [_array_bytes(*s.groups()) for s in _SHAPE.finditer(result)]
        if call:
            operands = re.findall(r"%([\w.\-]+)", call.group(2))
            touched = [a for op in operands for a in arrays.get(op, [])] + arrays[target]
            yield (target, call.group(1), rest, touched) if named else \
                (call.group(1), rest, touched)


def _entry(hlo_text: str) -> tuple[str, dict[str, list[str]]]:
    entry, comps = _computations(hlo_text)
    if not entry:
        raise ValueError("no ENTRY computation in this text: pass compiled.as_text()")
    return entry, comps


def memory_traffic(hlo_text: str) -> MemoryTraffic:
    """Bytes accessed by a compiled program (`compiled.as_text()`), op by op: the ENTRY
    computation and the loop bodies and branches it runs (fusions count at their boundary)."""
    entry, comps = _entry(hlo_text)
    todo, seen = [entry], []
    while todo:
        name = todo.pop()
        seen.append(name)
        for line in comps[name]:
            todo += [c for c in _SUB.findall(line) if c in comps and c not in seen + todo]
    by_kind = dict.fromkeys(KINDS, 0.0)
    vmem = logical = 0.0
    for name in seen:
        for opcode, _, touched in _ops(comps[name]):
            if opcode in _FREE:
                continue
            size = sum(a[0] for a in touched)
            by_kind[_KIND.get(opcode, "other")] += size
            logical += sum(a[1] for a in touched)
            if touched and all(a[2] for a in touched):
                vmem += size
    return MemoryTraffic(sum(by_kind.values()), by_kind, vmem, logical)


def kernel_io(hlo_text: str) -> float:
    """Bytes that every Pallas TPU kernel (a custom call to "tpu_custom_call") in the program's
    ENTRY computation moves through HBM. A kernel that declares it (`pl.CostEstimate`'s
    bytes_accessed, as `kernels/codec.py`'s do: each block its grid moves, once; XLA:TPU's
    own count takes the same figure) is counted at that; any other at the tiled bytes of its
    operands and results, what it moves if its grid visits every tile of each once. A kernel
    that DMAs by hand (`kernels/ring.py`) moves what its program says, which this does not
    read."""
    entry, comps = _entry(hlo_text)
    total = 0.0
    for opcode, text, touched in _ops(comps[entry]):
        if opcode != "custom-call" or '"tpu_custom_call"' not in text:
            continue
        declared = _DECLARED.search(text)
        declared = float(declared.group(1)) if declared else 0.0
        total += declared if declared > 0 else sum(a[0] for a in touched)
    return total


def op_bytes(hlo_text: str) -> dict[str, tuple[float, bool]]:
    """Per instruction of the ENTRY computation that moves bytes: (its HBM bytes, declared).
    A Pallas kernel's are what it declares (`pl.CostEstimate`: the blocks its grid moves,
    each once), and say so (declared True); any other op's, its operands' and results' tiled
    bytes outside VMEM (0 for an op in VMEM only). Keyed by the instruction's name, which is
    also its bundle listing's (`models/bundles.py`)."""
    entry, comps = _entry(hlo_text)
    out: dict[str, tuple[float, bool]] = {}
    for name, opcode, text, touched in _ops(comps[entry], named=True):
        if opcode in _FREE and opcode != "custom-call":
            continue
        if opcode == "custom-call" and '"tpu_custom_call"' in text:
            declared = _DECLARED.search(text)
            if declared and float(declared.group(1)) > 0:
                out[name] = (float(declared.group(1)), True)
                continue
        out[name] = (sum(a[0] for a in touched if not a[2]), False)
    return out


#: A Pallas kernel's declared bytes, in its backend config.
_DECLARED = re.compile(r'"cost_estimate":\{[^}]*"bytes_accessed":"(\d+)"')
