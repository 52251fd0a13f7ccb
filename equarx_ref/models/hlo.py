"""Bytes read back from a compiled program: what XLA really sends, to check `wire_bytes`.

`jax.jit(f).lower(x).compile().as_text()` is the HLO the backend runs. Every collective in it
names its operand and result shapes with element types, so the bytes a device puts on the wire
follow from the op alone, by the standard cost of each collective:

    collective-permute   its operand            (one message to one peer)
    all-to-all           (g - 1) / g x operand  (keeps its own slice)
    all-gather           (g - 1) x shard        (receives everyone else's, sends its own g - 1 times
                                                 on a ring network: the same count)
    all-reduce           2 (g - 1) / g x operand  (modelled as a ring)

with g the replica-group size, read from `replica_groups` in any of the notations XLA prints
(explicit groups, iota `[groups,size]`, or by mesh axes `mesh['a'=2,'b'=4] {'b'}`).

This is where XLA:CPU's habits show: a bf16 psum is an f32 all-reduce, an fp8 ppermute travels
as f16; the collectives of this package bitcast their payloads to uint8 so that what is counted
is what is sent.
"""

from __future__ import annotations

import math
import re

from .._checks import count

__all__ = ["hlo_wire_bytes"]

_HLO_OP = re.compile(r"=\s*(\(.*?\)|\S+)\s+(collective-permute|all-to-all|all-gather|all-reduce)"
                     r"(-start)?\(")
_HLO_SHAPE = re.compile(r"(pred|[a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_HLO_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s4": 1, "u4": 1, "bf16": 2, "f16": 2, "s16": 2,
              "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}


def _group_size(line: str, default: int) -> int:
    m = re.search(r"replica_groups=\{\{([\d,]+)\}", line)
    if m:
        return len(m.group(1).split(","))
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]", line)
    if m:
        return int(m.group(2))
    # newer XLA names the groups by mesh axes: replica_groups=mesh['a'=2,'b'=4] {'b'}
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if m:
        sizes = dict(re.findall(r"'?(\w+)'?=(\d+)", m.group(1)))
        return math.prod(int(sizes[a]) for a in re.findall(r"'?(\w+)'?", m.group(2)))
    return default


def hlo_wire_bytes(hlo_text: str, p: int) -> dict[str, float]:
    """Bytes one device sends, read from compiled HLO text, by collective kind.

    collective-permute: its operand; all-to-all: (g-1)/g of it; all-gather: (g-1) shards of
    its result; all-reduce: 2 (g-1)/g of its operand (a ring model). g: the replica group size
    (`p` if the op names none). Element bytes come from the HLO types (f8 = 1, bf16 = 2...).
    Asynchronous forms (`*-start`, as on TPU and GPU) return a tuple (operands, results,
    scalar contexts): the operand half counts for collective-permute, the result half for
    all-gather. A collective inside a loop body is counted once, not once per trip.
    """
    p = count(p, "p (devices)")
    out: dict[str, float] = {}
    for line in hlo_text.splitlines():
        m = _HLO_OP.search(line)
        if not m:
            continue
        shapes, kind = m.group(1), m.group(2)
        found = _HLO_SHAPE.findall(shapes)
        if m.group(3) and shapes.startswith("(") and kind != "all-reduce":
            found = [(dt, dims) for dt, dims in found if dims]  # drop scalar contexts
            half = len(found) // 2  # (operands..., results...)
            found = found[half:] if kind == "all-gather" else found[:half]
        sizes = [_HLO_BYTES.get(dt, 1 if dt.startswith("f8") else 4)
                 * math.prod(int(d) for d in dims.split(",") if d) for dt, dims in found]
        size = sum(sizes)
        g = _group_size(line, p)
        sent = {"collective-permute": size, "all-to-all": size * (g - 1) / g,
                "all-gather": size * (g - 1) / g, "all-reduce": 2 * size * (g - 1) / g}[kind]
        out[kind] = out.get(kind, 0.0) + sent
    return out
