"""`equarx-ref bench --hosts` on the site and in the README: 4 processes on capped links,
measured against the time model, from equarx_ref/data/multihost-*.json.

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
MODEL_TOLERANCE = 0.2  # the model within 20% of every measured time


def _rate(link: str | None) -> float:
    from equarx_ref.multihost import parse_rate

    return parse_rate(link) if link else float("inf")  # loopback (uncapped) last


def runs() -> list[dict]:
    """The stored runs, slowest link first."""
    from equarx_ref import data

    found = [data.load(n) for n in data.names() if n.startswith("multihost-")]
    return sorted(found, key=lambda r: _rate(r.get("link")))


def setting(result: dict) -> str:
    c = result["chip"]
    mib = result["results"][0]["message_bytes"] / 2**20
    return (f"{result['network']}; {mib:g} MiB of bf16 per host; measured in the same run: link "
            f"{c['link_bandwidth'] * 8 / 1e6:.0f} Mbit/s, hop latency "
            f"{c['hop_latency'] * 1e3:.2f} ms, memory {c['hbm_bandwidth'] / 1e9:.2f} GB/s; "
            "per primitive (Mbit/s sent per host): " + ", ".join(
                f"{k.replace('_', ' ')} {v * 8 / 1e6:.0f}"
                for k, v in c.get("primitive_bandwidth", {}).items()) +
            "; per hop (GB/s): " + ", ".join(
                f"{k.split()[1]} {v / 1e9:.2f}" for k, v in result["calibration"].items()
                if k.startswith("codec_bytes_per_s ")) +
            " (the `Chip` the model uses, `multihost.launcher.measured_chip`). CPU timings.")


def rows_table(result: dict) -> str:
    rows = result["results"]
    base = next(r["wire_bytes_per_device"] for r in rows
                if (r["algorithm"], r["format"]) == ("ring", "bf16"))
    return table(
        ["link", "algorithm", "format", "measured", "model", "model / measured", "link time",
         "compute", "vs bf16 ring", "bytes alone", "bitwise"],
        [[result.get("link") or "loopback", r["algorithm"], r["format"],
          f"{r['seconds']:.3f} s", f"{r['predicted_seconds']:.3f} s",
          f"{r['predicted_seconds'] / r['seconds']:.2f}", f"{r['link_seconds']:.3f} s",
          f"{r['compute_seconds']:.3f} s", f"{r['speedup_vs_bf16']:.2f}x",
          f"{base / r['wire_bytes_per_device']:.2f}x", "yes" if r["bitwise_equal"] else "NO"]
         for r in rows])


def verdicts(result: dict) -> str:
    """The targets this run can be held to, each with its measured figure."""
    rows = {(r["algorithm"], r["format"]): r for r in result["results"]}
    out = []
    for (link, alg, fmt), target in TARGETS.items():
        if link == result.get("link") and (alg, fmt) in rows:
            got = rows[alg, fmt]["speedup_vs_bf16"]
            out.append(f"{alg} {fmt} {got:.2f}x over the bf16 ring (target >= {target}x: "
                       f"{'met' if got >= target else 'not met'})")
    worst = max(abs(r["predicted_seconds"] / r["seconds"] - 1) for r in rows.values())
    out.append(f"the model within {worst:.0%} of every measured time (target "
               f"{MODEL_TOLERANCE:.0%}: {'met' if worst <= MODEL_TOLERANCE else 'not met'})")
    rings = [(f, rows["ring", f]) for f in ("bf16", "int8", "int4") if ("ring", f) in rows]
    if rings:
        out.append(f"ring compute (measured minus link) against a plain add over the message "
                   f"({rings[0][1]['add_seconds']:.3f} s): " + ", ".join(
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
    """The Results page: per stored run, its command, table, verdicts and figure."""
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
        plot_measured(result["results"], ax=ax, title=f"{result['hosts']} hosts at {name}: "
                      "CPU timings against the model")
        figures[path] = png(ax.figure)
        parts += [f"```bash\n{result['command']}\n```", "", setting(result), "",
                  rows_table(result), "", verdicts(result), "",
                  f"![Measured and modelled seconds per AllReduce at {name}]({path})", ""]
    return Section("\n".join([*parts, _notes(), ""]), figures)


def readme() -> str:
    """The README's block: per stored run, its command, setting, table and verdicts."""
    stored = runs()
    if not stored:
        return _missing() + "\n"
    return "\n".join(f"`{r['command']}`: {setting(r)}\n\n{rows_table(r)}\n\n{verdicts(r)}\n"
                     for r in stored)
