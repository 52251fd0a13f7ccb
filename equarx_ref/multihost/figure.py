"""The figure of a multi-host run (to move to `viz/` with the other figures).

Left: measured seconds per AllReduce (markers) and the model's, with this run's own `Chip`
(lines), against the message size per host, log-log. Right: each configuration's speedup over
the unquantized bf16 ring, measured. Drawing only: every number comes from `run`'s result.
"""

from __future__ import annotations

__all__ = ["plot"]


def plot(result: dict, path: str) -> None:
    """Measured seconds (markers) and the model's (lines) against message size; speedups."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    keys = dict.fromkeys((r["algorithm"], r["format"]) for r in result["results"])
    for i, key in enumerate(keys):
        rs = [r for r in result["results"] if (r["algorithm"], r["format"]) == key]
        mib = [r["message_bytes"] / 2**20 for r in rs]
        colour = f"C{i % 10}"
        ax.loglog(mib, [r["seconds"] for r in rs], "o", color=colour, label=" ".join(key))
        ax.loglog(mib, [r["predicted_seconds"] for r in rs], "-", color=colour, alpha=0.6)
        ax2.semilogx(mib, [r["speedup_vs_bf16"] for r in rs], "o-", color=colour)
    ax.set(xlabel="message per host (MiB)", ylabel="seconds per AllReduce",
           title="measured (dots) and modelled (lines)")
    ax2.set(xlabel="message per host (MiB)", ylabel="speedup over the bf16 ring",
            title=result["network"][:60])
    ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        fig.savefig(path)
    finally:
        plt.close(fig)
