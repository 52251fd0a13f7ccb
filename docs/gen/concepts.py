"""The Concepts page's tables and figure, computed by the package when the site is built."""

from __future__ import annotations

import equarx_ref as eq

from .common import Section, png, table

#: Two variants of the names in `eq.FORMAT_NAMES`, to show what block size and scale type cost.
VARIANTS = ("int8/f32", "int4/b16")
#: The algorithms that quantize (psum sends x as it is).
QUANTIZING = tuple(a for a in eq.ALGORITHMS if a != "psum")


def formats_table() -> Section:
    """Every format's bits per element and one-quantization error, from the package."""
    rows = []
    for name in (*eq.FORMAT_NAMES, *VARIANTS):
        f = eq.parse_format(name)
        scale = "E8M0 (power of two)" if f.is_mx else f.scale_dtype
        rows.append([f"`{f}`", f.element, f.block_size, scale, f"{f.bits_per_element:g}",
                     f"{16 / f.bits_per_element:.2f}x",
                     f"{eq.gaussian_relative_error(f):.2%}"])
    return Section(
        table(["format", "element", "block", "scale", "bits / element", "vs bf16",
               "relative RMS error of one quantization (Gaussian data)"], rows)
        + "\n\n*`eq.FORMAT_NAMES` and two variants (`str(fmt)` names: \"/f32\" a float32 "
        "scale, \"/b16\" blocks of 16), read with `eq.parse_format`; `fmt.bits_per_element` and "
        "`eq.gaussian_relative_error(fmt)`, computed when this site was built.*")


def wire_bytes_table(n: int = 1 << 20, p: int = 8) -> Section:
    """Bytes per device and predicted error of every algorithm, from the package."""
    base = eq.wire_bytes(n, p, fmt=None, algorithm="ring", dtype="bfloat16")
    rows = []
    for name in ("bf16", "int8", "int4"):
        fmt = eq.parse_format(name)
        for alg in QUANTIZING:
            b = eq.wire_bytes(n, p, fmt=fmt, algorithm=alg, dtype="bfloat16")
            err = eq.predicted_relative_error(p, fmt=fmt, algorithm=alg)
            rows.append([f"`{alg}`", f"`{eq.format_label(fmt)}`", f"{b:,}", f"{b / base:.3f}",
                         "rounding of bf16 only" if fmt is None else f"{err:.2%}"])
    formula = 2 * (p - 1) * n * 2 // p
    return Section(
        table(["algorithm", "on the wire", "bytes sent per device", "vs bf16 ring",
               "predicted relative error"], rows)
        + f"\n\n*`eq.wire_bytes(n={n:,}, p={p}, fmt=fmt, algorithm=algorithm, "
        f"dtype=\"bfloat16\")` and `eq.predicted_relative_error(p, fmt=fmt, "
        f"algorithm=algorithm)`, computed when this site was built. The ring formula "
        f"$2(p-1)/p \\cdot n \\cdot 2$ bytes gives {formula:,} for the bf16 ring.*")


def error_model_table(ps=(2, 4, 8, 16, 64, 256)) -> Section:
    """Predicted int8 error of every algorithm for several device counts, and a 2D torus."""
    fmt = eq.parse_format("int8")
    rows = [[f"`{alg}`"] + [f"{eq.predicted_relative_error(p, fmt=fmt, algorithm=alg):.2%}"
                            for p in ps] for alg in QUANTIZING]
    sizes = {alg: eq.quantized_sizes(4, algorithm=alg) for alg in QUANTIZING}
    torus = (2, 2)
    sizes[f"ring over a {torus[0]}x{torus[1]} torus"] = eq.quantized_sizes(torus,
                                                                          algorithm="ring")
    listed = "; ".join(f"{what}: `{s}`" for what, s in sizes.items())
    return Section(
        table(["algorithm"] + [f"p = {p}" for p in ps], rows)
        + "\n\n*`eq.predicted_relative_error(p, fmt=eq.Format.int8(), algorithm=algorithm)`, "
        f"computed when this site was built. The sizes it sums, `eq.quantized_sizes(4, "
        f"algorithm=...)` on 4 devices: {listed}.*")


def schedules_figure() -> Section:
    """The schedules drawn by the package's own figure code."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schedules = (eq.ring_schedule(4), eq.bidir_ring_schedule(4), eq.two_shot_schedule(4))
    # one above the other, each as wide as its steps need: the labels stay readable on the page
    fig, axes = plt.subplots(3, 1, figsize=(7.5, 9.5), height_ratios=[1, 1.5, 1])
    for ax, sched in zip(axes, schedules, strict=True):
        eq.viz.draw_schedule(sched, ax=ax)
    fig.tight_layout()
    path = "assets/concepts/schedules.png"
    return Section(
        f"![Ring, bidirectional ring and two-shot schedules on 4 devices]({path})\n\n"
        "*Drawn by `eq.viz.draw_schedule` from `eq.ring_schedule(4)`, "
        "`eq.bidir_ring_schedule(4)` and `eq.two_shot_schedule(4)`: one row per device, one "
        "column per step, each cell what that device sends then (\"c3 → 1\": its copy of "
        "chunk 3, to device 1; \"→ 3\" in a collective: to 3 devices).*",
        {path: png(fig)})


def time_model_table(p: int = 8, algorithm: str = "bidir_ring", overhead: float = 1e-6) -> Section:
    """Per TPU chip: the modelled int8 and int4 speedups at a few sizes, and the crossover."""
    import dataclasses

    from equarx_ref.models import cost

    fmts = {"int8": eq.parse_format("int8"), "int4": eq.parse_format("int4")}
    sizes = {"1 MiB": 1 << 20, "64 MiB": 1 << 26, "1 GiB": 1 << 30}

    def best(n, fmt, chip):
        k = eq.best_num_chunks(n, p, fmt=fmt, algorithm=algorithm, chip=chip)
        return eq.predicted_time(n, p, fmt=fmt, algorithm=algorithm, chip=chip, num_chunks=k)

    def size(nbytes):
        return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 1024:.0f} KiB"

    rows = []
    for chip in eq.CHIPS.values():
        speedups = [f"{best(b // 2, None, chip) / best(b // 2, fmts[f], chip):.2f}x"
                    for f in fmts for b in sizes.values()]
        slow = dataclasses.replace(chip, quantize_overhead=overhead)
        rows.append([f"{chip.name}", f"{chip.link_bandwidth / 1e9:g}",
                     f"{chip.hbm_bandwidth / 1e9:g}", *speedups,
                     size(cost.crossover_bytes(p, fmt=fmts["int8"], algorithm=algorithm,
                                               chip=slow))])
    header = ["chip", "ICI GB/s", "HBM GB/s",
              *(f"{f} {s}" for f in fmts for s in sizes),
              f"int8 crossover, {overhead * 1e6:g} µs per pass"]
    return Section(
        table(header, rows)
        + f"\n\n*Modelled speedup over the unquantized `{algorithm}` on {p} chips, each at its "
        "best pipeline depth (`eq.predicted_time`, `eq.best_num_chunks`), for messages of bf16; "
        f"the last column assumes a fixed cost of {overhead * 1e6:g} µs per quantizing pass "
        "(`Chip.quantize_overhead`; no public figure exists) and gives "
        "`cost.crossover_bytes`. Computed when this site was built.*")
