"""The commands whose stored output the site shows: one per file in equarx_ref/data/.

Each file holds the verbatim JSON a command wrote, run from the repository root, inside the
envelope `equarx_ref.data` reads (the command, the jax and Python it ran with, the modules that
produced it and their digest: `provenance`). The pages print the command beside what it made;
`refresh` reruns them (`python docs/hooks.py refresh [FILE...]`) with this Python, so the
package of this checkout is the one measured, and stamps each file.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

from . import provenance
from .common import ROOT

_MULTIHOST = ("--mib 1 8 32 64 --algorithms ring bidir_ring two_shot --formats bf16 int8 int4 "
              "--repeats 5")
COMMANDS = {
    "demo.json": "equarx-ref demo --json equarx_ref/data/demo.json",
    "bench.json": "equarx-ref bench --json equarx_ref/data/bench.json",
    "gemma.json": "equarx-ref gemma --no-progress --json equarx_ref/data/gemma.json",
    "model-v5e.json": "equarx-ref model --chip v5e --json equarx_ref/data/model-v5e.json",
    "outliers.json": "equarx-ref outliers --no-progress --json equarx_ref/data/outliers.json",
    "sweep.json": "equarx-ref sweep --p 2 4 8 16 --algorithms ring bidir_ring two_shot one_shot "
                  "--formats int8 int4 fp8_e4m3 mxfp8 mxfp8/ceil mxfp6_e2m3 mxfp4 --remedies none "
                  "sr rotate adaptive rotate+adaptive --data gaussian outliers --size 16384 "
                  "--chip v5e --json equarx_ref/data/sweep.json",
    "train.json": "equarx-ref train --no-progress --json equarx_ref/data/train.json",
    "train-hops.json": "equarx-ref train --hops --json equarx_ref/data/train-hops.json",
    # as root: 4 processes, each in a network namespace with its link capped (multihost.py)
    "multihost-100mbit.json": (f"equarx-ref bench --hosts 4 --link 100mbit {_MULTIHOST} "
                               "--timeout 2400 --json equarx_ref/data/multihost-100mbit.json"),
    "multihost-1gbit.json": (f"equarx-ref bench --hosts 4 --link 1gbit {_MULTIHOST} "
                             "--json equarx_ref/data/multihost-1gbit.json"),
    "multihost-loopback.json": (f"equarx-ref bench --hosts 4 {_MULTIHOST} "
                                "--json equarx_ref/data/multihost-loopback.json"),
    # needs libtpu (jax[tpu] of the jax under test): its compilers, run from a CPU machine
    "tpu.json": ("equarx-ref kernels --compile v5e:2x4,v6e:2x4 --read-back --jobs 2 "
                 "--json equarx_ref/data/tpu.json"),
    # libtpu's static schedule of the codec's kernels and the AllReduces (runs/tpu_schedule.py):
    # the time model prices the kernels' passes with it (models/cost.py, Chip.codec_price)
    "tpu-schedule.json": ("equarx-ref kernels --compile v5e:2x4,v6e:2x4 --only none --schedule "
                          "--json equarx_ref/data/tpu-schedule.json"),
    # the same compilers' bytes accessed by the codec and the AllReduces (runs/tpu_bytes.py)
    "tpu-bytes.json": ("equarx-ref kernels --compile v5e:2x4,v6e:2x4 --only none --bytes 1 "
                       "--json equarx_ref/data/tpu-bytes.json"),
}


def command_block(name: str) -> str:
    """The command behind equarx_ref/data/NAME, as a bash block to show above its table."""
    return f"```bash\n{COMMANDS[name]}\n```"


#: Files rerun only when named: the multi-host runs need root (network namespaces), the TPU
#: compile record libtpu (run it with the Python of a jax[tpu] environment).
ON_REQUEST = frozenset(name for name in COMMANDS if name.startswith(("multihost-", "tpu")))


def refresh(names: list[str]) -> None:
    """Rerun the commands behind equarx_ref/data/*.json (all but `ON_REQUEST`, or the files
    named) and stamp each output with its provenance."""
    unknown = sorted(set(names) - set(COMMANDS))
    if unknown:
        raise SystemExit(f"no command makes {unknown}; known: {sorted(COMMANDS)}")
    for name in names or [n for n in COMMANDS if n not in ON_REQUEST]:
        print(f"$ {COMMANDS[name]}", flush=True)
        argv = shlex.split(COMMANDS[name])
        assert argv[0] == "equarx-ref", argv
        subprocess.run([sys.executable, "-m", "equarx_ref.cli", *argv[1:]], cwd=ROOT, check=True)
        stem = name.removesuffix(".json")
        result = json.loads(provenance.path(stem).read_text(encoding="utf-8"))
        provenance.write(stem, provenance.stamp(stem, COMMANDS[name], result))
