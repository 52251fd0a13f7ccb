"""`equarx-ref bench --hosts` on the site: 4 processes on capped links, measured against the
time model, from equarx_ref/data/multihost-*.json (the README's headline quotes one run).

Each file is the JSON the command wrote, and names that command (`"command"`): it needs root
(network namespaces) and minutes, so `python docs/hooks.py refresh` does not rerun it; run the
command it names. Until a file is stored the section says so instead of a table.
"""

from __future__ import annotations

from .common import Section, png, table

#: Benchmark targets of the multi-host run (issue "Speed", item 4), 4 hosts, 32 MiB per host;
#: the byte bounds are 1.88x (int8) and 3.56x (int4).
TARGETS = {("100mbit", "ring", "int8"): 1.85, ("100mbit", "ring", "int4"): 3.5,
           ("1gbit", "ring", "int8"): 1.6}
TARGET_MIB = 32  # the message size the targets, the tables' main rows and the figures take
MODEL_TOLERANCE = 0.2  # the model within 20% of every measured time


def _rate(link: str | None) -> float:
    from equarx_ref.multihost import parse_rate

    return parse_rate(link) if link else float("inf")  # loopback (uncapped) last


def runs() -> list[dict]:
    """The stored runs, slowest link first."""
    from equarx_ref import data

    found = [data.load(n) for n in data.names() if n.startswith("multihost-")]
    return sorted(found, key=lambda r: _rate(r.get("link")))


def _mib(row: dict) -> float:
    return row["message_bytes"] / 2**20


def _sizes(result: dict) -> list[float]:
    return sorted({_mib(r) for r in result["results"]})


def _ratio(row: dict) -> float:
    return row["predicted_seconds"] / row["seconds"]


def _error(row: dict) -> float:
    return _ratio(row) - 1


def setting(result: dict) -> str:
    c, sizes = result["chip"], _sizes(result)
    return (f"{result['network']}; {', '.join(f'{m:g}' for m in sizes)} MiB of bf16 per host; "
            f"measured in the same run: link {c['link_bandwidth'] * 8 / 1e6:.0f} Mbit/s, hop "
            f"latency {c['hop_latency'] * 1e3:.2f} ms, memory "
            f"{result['calibration']['memory_bytes_per_s'] / 1e9:.2f} GB/s, fresh pages "
            f"{c['fresh_bandwidth'] / 1e9:.2f} GB/s; per primitive (Mbit/s sent per host): "
            + ", ".join(
                f"{k.replace('_', ' ')} {v * 8 / 1e6:.0f}"
                for k, v in c.get("primitive_bandwidth", {}).items()) +
            "; per hop (GB/s): " + ", ".join(
                f"{k.split()[1]} {v / 1e9:.2f}" for k, v in result["calibration"].items()
                if k.startswith("codec_bytes_per_s ")) +
            " (the `Chip` the model uses, `multihost.launcher.measured_chip`). CPU timings.")


def rows_table(result: dict, mib: float | None = None) -> str:
    """Every row of the run, or only those of `mib` MiB."""
    rows = [r for r in result["results"] if mib is None or _mib(r) == mib]
    base = {_mib(r): r["wire_bytes_per_device"] for r in rows
            if (r["algorithm"], r["format"]) == ("ring", "bf16")}
    return table(
        ["link", "algorithm", "format", "message", "measured", "model", "model / measured",
         "link time", "compute", "vs bf16 ring", "bytes alone", "bitwise"],
        [[result.get("link") or "loopback", r["algorithm"], r["format"], f"{_mib(r):g} MiB",
          f"{r['seconds']:.4f} s", f"{r['predicted_seconds']:.4f} s",
          f"{_ratio(r):.2f}", f"{r['link_seconds']:.4f} s",
          f"{r['compute_seconds']:.4f} s", f"{r['speedup_vs_bf16']:.2f}x",
          f"{base[_mib(r)] / r['wire_bytes_per_device']:.2f}x",
          "yes" if r["bitwise_equal"] else "NO"] for r in rows])


def model_table(result: dict) -> str:
    """Model / measured per row and message size: where the model holds and where not."""
    sizes = _sizes(result)
    cells = {(r["algorithm"], r["format"], _mib(r)): r for r in result["results"]}
    configs = list(dict.fromkeys((r["algorithm"], r["format"]) for r in result["results"]))
    return table(["link", "algorithm", "format", *(f"{m:g} MiB" for m in sizes)],
                 [[result.get("link") or "loopback", a, f, *(
                     f"{_ratio(cells[a, f, m]):.2f}" if (a, f, m) in cells else "-"
                     for m in sizes)] for a, f in configs])


def verdicts(result: dict) -> str:
    """The targets this run can be held to, each with its measured figure."""
    main = {(r["algorithm"], r["format"]): r for r in result["results"]
            if _mib(r) == TARGET_MIB}
    out = []
    for (link, alg, fmt), target in TARGETS.items():
        if link == result.get("link") and (alg, fmt) in main:
            got = main[alg, fmt]["speedup_vs_bf16"]
            out.append(f"{alg} {fmt} {got:.2f}x over the bf16 ring at {TARGET_MIB} MiB (target "
                       f">= {target}x: {'met' if got >= target else 'not met'})")
    rows = result["results"]
    worst = max(rows, key=lambda r: abs(_error(r)))
    err = abs(_error(worst))
    out.append(f"the model within {err:.0%} of every measured time (target "
               f"{MODEL_TOLERANCE:.0%}: {'met' if err <= MODEL_TOLERANCE else 'not met'}; "
               f"worst: {worst['algorithm']} {worst['format']} at {_mib(worst):g} MiB); per size, "
               "the worst: " + ", ".join(
                   f"{m:g} MiB {max(abs(_error(r)) for r in rows if _mib(r) == m):.0%}"
                   for m in _sizes(result)))
    beyond = [r for r in rows if abs(_error(r)) > MODEL_TOLERANCE]
    if beyond:
        out.append(f"the rows beyond {MODEL_TOLERANCE:.0%} (model / measured): " + ", ".join(
            f"{r['algorithm']} {r['format']} {_mib(r):g} MiB {_ratio(r):.2f}" for r in beyond))
    rings = [(f, main["ring", f]) for f in ("bf16", "int8", "int4") if ("ring", f) in main]
    if rings:
        out.append(f"ring compute (measured minus link) against a plain add over the "
                   f"{TARGET_MIB} MiB message ({rings[0][1]['add_seconds']:.3f} s): " + ", ".join(
                       f"{f} {r['compute_seconds'] / r['add_seconds']:.1f}x" for f, r in rings))
    return "; ".join(out) + "."


def _missing() -> str:
    return ("No multi-host run is stored yet (`equarx_ref/data/multihost-*.json`). As root: "
            "`python docs/hooks.py refresh multihost-100mbit.json` (and `multihost-1gbit.json`).")


def _notes() -> str:
    return ("*measured*: median over the repeats of the slowest host's seconds per AllReduce; "
            "*model*: `eq.predicted_time` with the run's own measured figures; *link time*: the "
            "same sends on ready-made buffers; *compute*: measured minus link (XLA:CPU does not "
            "overlap them); *bytes alone*: the bf16 ring's bytes over this row's, the speedup "
            "the bytes allow; *bitwise*: every host and one process with simulated devices agree "
            "bit for bit.")


def results() -> Section:
    """The Results page: per stored run, its command, tables, verdicts and figure."""
    import matplotlib.pyplot as plt

    from equarx_ref.viz import plot_measured

    stored = runs()
    if not stored:
        return Section(_missing())
    parts, figures = [], {}
    for result in stored:
        name = result.get("link") or "loopback"
        path = f"assets/results/multihost-{name}.png"
        _, ax = plt.subplots(figsize=(7.5, 3.8))
        plot_measured([r for r in result["results"] if _mib(r) == TARGET_MIB], ax=ax,
                      title=f"{result['hosts']} hosts at {name}, {TARGET_MIB} MiB: CPU timings "
                      "against the model")
        figures[path] = png(ax.figure)
        parts += [f"```bash\n{result['command']}\n```", "", setting(result), "",
                  rows_table(result), "", "Model / measured per message size:", "",
                  model_table(result), "", verdicts(result), "",
                  f"![Measured and modelled seconds per AllReduce at {name}]({path})", ""]
    return Section("\n".join([*parts, _notes(), ""]), figures)

