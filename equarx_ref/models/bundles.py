"""The TPU's own schedule: static cycles read off libtpu's final bundle listings.

A TPU TensorCore is an in-order VLIW machine. libtpu schedules every kernel and fusion into
*bundles*, each one cycle's worth of scalar, vector-load, vector-store, vector-ALU, cross-lane
(XLU), transcendental and matrix slots, and it prints that schedule on request, with no chip:

    LIBTPU_INIT_ARGS="--xla_jf_dump_to=DIR --xla_jf_dump_llo_text=true
                      --xla_jf_dump_llo_pass_label_regex=final_bundles"

set before libtpu loads (`runs/tpu_schedule.py` does it). Each compiled program then leaves one
`*-final_bundles.txt` per kernel, fusion and top-level program (TLP), a bundle a line (a
DMA's bundle runs its window's bounds over a few lines of comment, read as one):

    0x27   : > { %p8_p4 = scmp.ge.s32.totalorder %s11_s6, 258 /* loop exit test */ }
    0x28   :  { %10 = sbr.rel (!%p8_p4) target = $region54 }

A loop is a run of bundles from the one marked `LB:` (it opens a region) to the branch back to
that region; its trip count is in the exit test (an induction variable, its start and step
from the `sphi` and `sadd` that define it, against a bound). A Pallas grid is one such loop,
its bound the grid's steps plus the software pipeline's two extra turns. The TLP reaches each
kernel and fusion by an `inlined_call` naming its HLO instruction.

    cycles(listing) = sum over bundles of the product of the trips of the loops around it
                      + for each inlined call, that multiplicity times the callee's cycles

That is a *static* count: a bundle is at least a cycle, and nothing here sees a stall (a DMA
the program waits on, a bank conflict). So it is a lower bound on compute time, the price of
the work the compiler had to schedule, and it is what a chip's clock turns into seconds
(`Chip.clock_hz`). Memory is priced apart, as the fewest bytes at the chip's HBM bandwidth; a
kernel's roofline price is the larger of the two (`roofline`).

Trust it only as far as its yardsticks (`runs/tpu_schedule.py`, stored in
equarx_ref/data/tpu-schedule.json): an MXU matmul must come out near the chip's peak flops,
a Pallas copy and XLA's own `x + 1` fusion at or under their HBM time.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

__all__ = ["Listing", "ProgramSchedule", "body_ops", "parse_listing", "read_dump", "roofline"]

_BUNDLE = re.compile(r"^\s*(0x[0-9a-f]+|0)\s+([A-Z]{2})?:\s*>?\s*\{(.*)\}(.*)$")
_OPENS = re.compile(r"^\s*(0x[0-9a-f]+|0)\s+([A-Z]{2})?:\s*>?\s*\{")
# an operation's mnemonic: `vrot.slane`, `vmax.xlane`, `vadd` (of `vadd.f32`), `sbr.rel`
_OP = re.compile(r"^\s*(?:%[\w.]+ = )?([a-z][\w]*)(?:\.([a-z][\w]*))?")
_TYPE = re.compile(r"(?:[subf]|bf)\d+")
_START = re.compile(r"Start(?:/End empty)? region (\d+)")
_BRANCH = re.compile(r"sbr\.rel \((!?)%(p\w+)\) target = \$region(\d+)")
_EXIT = re.compile(r"%(p\w+) = scmp\.(\w+)\.s32\.totalorder %(s\w+), (-?\d+)")
_DEF = re.compile(r"%(s\w+) = (sadd\.s32|smov|sphi|sld) ([^;]*?)(?:/\*|;;|$)")
_SPILL = re.compile(r"= sst \[smem:\[#(allocation\d+_spill)\]\] %(s\w+)")
_CALL = re.compile(r"inlined_call[^/]*/\* (?:%([\w.\-]+) = |(<[\w\-]+>) \*/)")
_FILE = re.compile(r"^\d+-(.+)-\d+-final_bundles\.txt$")
# a matrix-unit multiply: `vmatmul.<type>....mxuN`; it pushes a register's rows through MXU N,
# one row a cycle: 16 of a packed 16-bit register, 8 of a 32-bit one
_MATMUL = re.compile(r"= vmatmul\.(?:[a-z]+\.)*?(bf16|f32|s8|u8|f16|fp8)[a-z0-9_.]*\.mxu(\d+)")
_ROWS = {"bf16": 16, "f16": 16, "f32": 8, "s8": 32, "u8": 32, "fp8": 32}


def _int(text: str) -> int:
    value = int(text)
    return value - (1 << 32) if value >= 1 << 31 else value  # s32 immediates print unsigned


@dataclasses.dataclass(frozen=True)
class Listing:
    """One final bundle listing: its bundles, its loops and its calls.

    Attributes:
        name: the kernel, fusion or program it lists ("TLP" for the top level).
        bundles: the number of bundles, each at least one cycle.
        loops: `(first, last, trips)` per loop: bundle indices, both ends included; trips
            None where the listing does not say (a loop whose bound is data: the runtime's
            own checks in a top-level program), counted once.
        calls: `(index, callee)` per inlined call: the bundle and the HLO instruction it runs.
        weight: per bundle, how many times it runs (the trips of the loops around it).
        mxu_stall: cycles the matrix units add beyond the bundles: where a loop body (or the
            code outside loops) pushes more rows through one MXU than it has bundles, the
            difference, times its trips (a bundle issues a multiply; the unit takes a cycle
            per row: XLA's own matmul would otherwise come out faster than the chip's peak).
    """

    name: str
    bundles: int
    loops: tuple[tuple[int, int, int | None], ...]
    calls: tuple[tuple[int, str], ...]
    weight: tuple[int, ...]
    mxu_stall: int = 0

    @property
    def unknown(self) -> int:
        """Loops whose trip count the listing does not give (each counted once)."""
        return sum(trips is None for _, _, trips in self.loops)

    @property
    def cycles(self) -> int:
        """Its own static cycles: every bundle times the trips around it, and the matrix
        units' stalls (calls not included)."""
        return sum(self.weight) + self.mxu_stall

    def body(self) -> int:
        """Bundles a turn of its outermost loop takes (0 without a loop): a grid step."""
        outer = [last - first + 1 for first, last, _ in self.loops
                 if not any(f < first and last <= l for f, l, _ in self.loops)]
        return max(outer, default=0)


def _source(defs: dict[str, str], reg: str) -> str:
    """What defines register `reg`, through spills to scalar memory and back."""
    for _ in range(8):
        d = defs.get(reg, "").strip()
        m = re.fullmatch(r"sld \[smem:\[#(allocation\d+_spill)\]\]", d)
        if not m or m.group(1) not in defs:
            return d
        reg = defs[m.group(1)]
    return ""


def _trips(defs: dict[str, str], counter: str, cond: str, bound: int, where: str) -> int:
    """A loop's trip count from its exit test `counter cond bound` (checked after each turn)."""
    step_def = _source(defs, counter)
    m = re.fullmatch(r"sadd\.s32 (-?\d+), %(s\w+)", step_def)
    if not m:
        raise ValueError(f"{where}: cannot read the loop counter %{counter} ({step_def!r})")
    step, phi = _int(m.group(1)), m.group(2)
    m = re.fullmatch(r"sphi %(s\w+), %(s\w+)", _source(defs, phi))
    if not m:
        raise ValueError(f"{where}: cannot read the start of loop counter %{phi}")
    start_def = _source(defs, m.group(1))
    m = re.fullmatch(r"smov (-?\d+)", start_def)
    if not m:
        raise ValueError(f"{where}: the loop starts at a value not known statically "
                         f"({start_def!r})")
    start = _int(m.group(1))
    # after turn t (1-based) the counter is start + t step; the loop exits at the first t
    # whose counter passes the test
    if step > 0 and cond in ("ge", "gt", "eq"):
        past = bound + (cond == "gt")
        return max(1, -(-(past - start) // step))
    if step < 0 and cond in ("le", "lt", "eq"):
        past = bound - (cond == "lt")
        return max(1, -(-(start - past) // -step))
    raise ValueError(f"{where}: an exit test {cond} with step {step} is not read here")


def _lines(text: str):
    """The listing's lines, a bundle whose comment runs over several lines (a DMA's window
    bounds) joined into one."""
    pending = None
    for line in text.splitlines():
        if pending is None and _OPENS.match(line) and line.count("{") > line.count("}"):
            pending = line
        elif pending is not None:
            pending += " " + line
            if pending.count("{") <= pending.count("}"):
                yield pending
                pending = None
        else:
            yield line
    if pending is not None:
        yield pending


def parse_listing(text: str, name: str = "") -> Listing:
    """Parse one `*-final_bundles.txt`: bundles, loops (with trips), inlined calls."""
    bundles: list[tuple[str | None, str, str]] = []  # (flag, ops, comment)
    for line in _lines(text):
        m = _BUNDLE.match(line)
        if m:
            bundles.append((m.group(2), m.group(3), m.group(4)))
    starts: dict[str, int] = {}
    defs: dict[str, str] = {}
    for i, (_, ops, comment) in enumerate(bundles):
        for region in _START.findall(comment):
            starts.setdefault(region, i)
        for op in ops.split(";;"):
            d = _DEF.search(op)
            if d:
                defs[d.group(1)] = f"{d.group(2)} {d.group(3)}"
            spill = _SPILL.search(op)
            if spill and spill.group(1) not in defs:
                defs[spill.group(1)] = spill.group(2)  # a slot's first store: the start
    loops = []
    exits: dict[str, tuple[str, str, int]] = {}
    for i, (_, ops, _) in enumerate(bundles):
        for e in _EXIT.finditer(ops):
            exits[e.group(1)] = (e.group(3), e.group(2), int(e.group(4)))
        for b in _BRANCH.finditer(ops):
            first = starts.get(b.group(3))
            if first is None or first > i:
                continue  # a forward branch
            last = i
            while last + 1 < len(bundles) and not bundles[last + 1][1].strip() \
                    and last - i < 4:
                last += 1  # the branch's delay slots run with every turn
            trips = None
            if b.group(2) in exits and b.group(1) == "!":  # loops until the test holds
                try:
                    trips = _trips(defs, *exits[b.group(2)], f"{name}:{i}")
                except ValueError:
                    trips = None
            loops.append((first, last, trips))
    weight = [1] * len(bundles)
    for first, last, trips in loops:
        for i in range(first, last + 1):
            weight[i] *= trips or 1
    calls = tuple((i, c.group(1) or c.group(2)) for i, (_, ops, _) in enumerate(bundles)
                  for c in _CALL.finditer(ops))
    return Listing(name, len(bundles), tuple(loops), calls, tuple(weight),
                   _mxu_stall(bundles, loops, weight))


def body_ops(text: str) -> dict[str, int]:
    """The operations one turn of a listing's outermost loop issues (a Pallas kernel's grid
    step; the whole listing where it has no loop), counted by mnemonic, most frequent first:
    `vrot.slane` (rotate sublanes), `vmax.xlane` (a maximum across lanes), `vadd` (of any
    type) ... What a body spends its bundles on."""
    listing = parse_listing(text)
    outer = [(f, l) for f, l, _ in listing.loops
             if not any(f2 < f and l <= l2 for f2, l2, _ in listing.loops)]
    first, last = max(outer, key=lambda fl: fl[1] - fl[0], default=(0, listing.bundles - 1))
    counts: dict[str, int] = {}
    rows = [m.group(3) for m in map(_BUNDLE.match, _lines(text)) if m]
    for ops in rows[first:last + 1]:
        for op in ops.split(";;"):
            m = _OP.match(op)
            if m:
                name = m.group(1) if not m.group(2) or _TYPE.fullmatch(m.group(2)) \
                    else f"{m.group(1)}.{m.group(2)}"
                counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _mxu_stall(bundles, loops, weight) -> int:
    """Cycles the MXUs add beyond the bundles, per innermost loop body and outside loops."""
    rows = [{} for _ in bundles]  # per bundle: rows pushed per MXU
    for i, (_, ops, _) in enumerate(bundles):
        for m in _MATMUL.finditer(ops):
            rows[i][m.group(2)] = rows[i].get(m.group(2), 0) + _ROWS[m.group(1)]
    if not any(rows):
        return 0
    inner = [(f, l) for f, l, _ in loops
             if not any(f <= f2 and l2 <= l and (f2, l2) != (f, l) for f2, l2, _ in loops)]
    covered = set()
    stall = 0
    for f, l in inner:
        busy: dict[str, int] = {}
        for i in range(f, l + 1):
            covered.add(i)
            for unit, r in rows[i].items():
                busy[unit] = busy.get(unit, 0) + r
        stall += max(0, max(busy.values(), default=0) - (l - f + 1)) * weight[f]
    busy = {}
    outside = [i for i in range(len(bundles)) if i not in covered and
               not any(f <= i <= l for f, l, _ in loops)]
    for i in outside:
        for unit, r in rows[i].items():
            busy[unit] = busy.get(unit, 0) + r
    return stall + max(0, max(busy.values(), default=0) - len(outside))


@dataclasses.dataclass(frozen=True)
class ProgramSchedule:
    """A compiled program's static schedule: each listing, and the cycles of the whole.

    Attributes:
        listings: by name, the TLP's and every kernel's and fusion's listing.
    """

    listings: dict[str, Listing]

    def cycles(self, name: str = "TLP") -> int:
        """Static cycles of `name` with everything it calls, each call at its multiplicity."""
        listing = self.listings[name]
        total = listing.cycles
        for index, callee in listing.calls:
            if callee in self.listings:
                total += listing.weight[index] * self.cycles(callee)
        return total

    def called(self) -> dict[str, int]:
        """Each kernel or fusion the TLP calls: its static cycles times its calls."""
        top = self.listings["TLP"]
        out: dict[str, int] = {}
        for index, callee in top.calls:
            if callee in self.listings:
                out[callee] = out.get(callee, 0) + top.weight[index] * self.cycles(callee)
        return out


def read_dump(folder) -> ProgramSchedule:
    """The listings libtpu wrote into `folder` for one compiled program."""
    listings = {}
    for path in sorted(pathlib.Path(folder).glob("*-final_bundles.txt")):
        m = _FILE.match(path.name)
        if not m or "schedule-analysis" in path.name:
            continue
        name = m.group(1)
        listings[name] = parse_listing(path.read_text(encoding="utf-8"), name)
    if "TLP" not in listings:
        raise ValueError(f"no top-level program listing (*-TLP-*-final_bundles.txt) in {folder}")
    return ProgramSchedule(listings)


def roofline(cycles: int, clock_hz: float, nbytes: float, hbm_bytes_per_s: float) -> float:
    """A kernel's roofline price in seconds: the larger of its static compute time (cycles at
    the clock) and its fewest bytes' time at HBM bandwidth."""
    return max(cycles / clock_hz, nbytes / hbm_bytes_per_s)

