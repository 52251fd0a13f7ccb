"""The modelled report of `equarx-ref model`: speedups on one TPU chip type, and Gemma prefill.

For messages of 1 KiB to 1 GiB of bf16 (every factor of 4), the time model
(`models.cost.predicted_time`) gives the unquantized AllReduce's seconds and int8's and int4's,
each at its best pipeline depth k (`best_num_chunks`); the speedup is their ratio. The crossover
is the smallest message from which a quantized format is faster. Then Gemma 3 12B and 27B
prefill of 2048 tokens at the same tensor parallelism (`models.prefill`): matmul time beside
the AllReduce time, unquantized and int8. Every figure is modelled from the chip's published
numbers (`CHIPS[chip].source`), none is measured.
"""

from __future__ import annotations

from .._checks import count
from ..formats import Format
from ..gemma.config import PRESETS
from ..models import cost
from ..models.prefill import prefill_time

__all__ = ["PREFILL_MODELS", "model_report"]

#: The Gemma 3 sizes whose prefill the report models (the paper's two).
PREFILL_MODELS = ("12b", "27b")


def model_report(chip: str = "v5e", devices: int = 8, algorithm: str = "bidir_ring") -> dict:
    """The report `equarx-ref model` prints and writes (module essay).

    Returns:
        {"chip", "devices", "algorithm", "modelled": True, "rows", "crossover_bytes",
        "prefill"}: rows per message size with bf16_seconds and, per format, its seconds,
        speedup and num_chunks; prefill rows with compute_s, bf16/int8 AllReduce seconds and
        the speedup of the whole prefill.
    """
    if not isinstance(chip, str) or chip not in cost.CHIPS:
        raise ValueError(f"chip must be one of {sorted(cost.CHIPS)}, got {chip!r}")
    c, p = cost.CHIPS[chip], count(devices, "devices", minimum=2)
    fmts = {"int8": Format.int8(), "int4": Format.int4()}

    def best(n, fmt):
        k = cost.best_num_chunks(n, p, fmt=fmt, algorithm=algorithm, chip=c)
        return cost.predicted_time(n, p, fmt=fmt, algorithm=algorithm, chip=c, num_chunks=k), k

    rows = []
    for log2 in range(10, 31, 2):
        n = (1 << log2) // 2  # bf16 values
        base, _ = best(n, None)
        row = {"message_bytes": 1 << log2, "bf16_seconds": base}
        for name, fmt in fmts.items():
            t, k = best(n, fmt)
            row |= {f"{name}_seconds": t, f"{name}_speedup": base / t, f"{name}_num_chunks": k}
        rows.append(row)
    crossover = {name: cost.crossover_bytes(p, fmt=fmt, algorithm=algorithm, chip=c)
                 for name, fmt in fmts.items()}
    prefill = []
    for name in PREFILL_MODELS:
        base = prefill_time(PRESETS[name], 2048, p, chip=c, fmt=None, algorithm=algorithm)
        int8 = prefill_time(PRESETS[name], 2048, p, chip=c, fmt=fmts["int8"],
                            algorithm=algorithm)
        prefill.append({"model": f"Gemma 3 {name.upper()}", "tokens": 2048, "tp": p,
                        "compute_s": base.compute_s, "bf16_allreduce_s": base.allreduce_s,
                        "int8_allreduce_s": int8.allreduce_s,
                        "speedup": base.total_s / int8.total_s})
    return {"chip": chip, "devices": p, "algorithm": algorithm, "modelled": True,
            "rows": rows, "crossover_bytes": crossover, "prefill": prefill}
