"""The commands whose stored output the site shows: one per file in docs/data/.

Each file is the verbatim JSON a command wrote, run from the repository root. The pages print
the command beside what it made; `refresh` reruns them (`python docs/hooks.py refresh [FILE...]`)
with this Python, so the package of this checkout is the one measured.
"""

from __future__ import annotations

import shlex
import subprocess
import sys

from .common import ROOT

COMMANDS = {
    "demo.json": "equarx-ref demo --json docs/data/demo.json",
    "bench.json": "equarx-ref bench --json docs/data/bench.json",
    "gemma.json": "equarx-ref gemma --no-progress --json docs/data/gemma.json",
    "outliers.json": "equarx-ref outliers --no-progress --json docs/data/outliers.json",
    "sweep.json": "equarx-ref sweep --p 2 4 8 16 --algorithms ring bidir_ring two_shot one_shot "
                  "--formats int8 int4 fp8_e4m3 mxfp8 mxfp8/floor mxfp6_e2m3 mxfp4 --remedies none "
                  "sr rotate adaptive rotate+adaptive --data gaussian outliers --size 16384 "
                  "--chip v5e --json docs/data/sweep.json",
}


def command_block(name: str) -> str:
    """The command behind docs/data/NAME, as a bash block to show above its table."""
    return f"```bash\n{COMMANDS[name]}\n```"


def refresh(names: list[str]) -> None:
    """Rerun the commands behind docs/data/*.json (all of them, or the files named)."""
    unknown = sorted(set(names) - set(COMMANDS))
    if unknown:
        raise SystemExit(f"no command makes {unknown}; known: {sorted(COMMANDS)}")
    for name in names or list(COMMANDS):
        print(f"$ {COMMANDS[name]}", flush=True)
        argv = shlex.split(COMMANDS[name])
        assert argv[0] == "equarx-ref", argv
        subprocess.run([sys.executable, "-m", "equarx_ref.cli", *argv[1:]], cwd=ROOT, check=True)
