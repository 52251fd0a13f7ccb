#!/usr/bin/env bash
# Remake everything the repository stores from its own code, in one command, in the order the
# pieces depend on each other (run as root, from a checkout whose tests/run.sh has built .venv):
#   1. the libtpu compile records (tpu-schedule.json, tpu.json, tpu-bytes.json) with the Python
#      of a jax[tpu] environment (.cache/tpu-env, as tests/tpu_compile.sh builds it; nothing runs
#      on a TPU): the time model prices the codec's kernels with tpu-schedule.json, so first,
#   2. the stored results the pages read (docs/hooks.py refresh: demo, bench, gemma, model,
#      outliers, sweep, train, train-hops), then
#   3. the multi-host runs (4 processes in network namespaces with capped links: needs root),
#   4. every notebook, executed and stored (notebooks/nbtool.py run),
#   5. the README's generated blocks.
# Timing runs (bench, multi-host) want a quiet machine: run nothing else beside this.
# Usage: bash docs/remake.sh [STEP ...]   STEP: tpu results multihost notebooks readme (default all)
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
tpu_py=.cache/tpu-env/bin/python
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(tpu results multihost notebooks readme)
for step in "${steps[@]}"; do
  start=$SECONDS
  case $step in
    results) "$py" docs/hooks.py refresh ;;
    tpu)
      [ -x "$tpu_py" ] || { echo "docs/remake.sh: no $tpu_py: run bash tests/tpu_compile.sh" >&2
                            exit 2; }
      # docs/hooks.py imports mkdocs (its page hooks live there too)
      "$tpu_py" -c 'import mkdocs' 2>/dev/null || "$tpu_py" -m pip install -q 'mkdocs>=1.6,<2'
      TPU_SKIP_MDS_QUERY=1 TPU_WORKER_ID=0 TPU_WORKER_HOSTNAMES=localhost JAX_PLATFORMS=cpu \
        TPU_ACCELERATOR_TYPE=v5litepod-8 "$tpu_py" docs/hooks.py refresh tpu-schedule.json tpu.json \
        tpu-bytes.json ;;
    multihost)
      [ "$(id -u)" = 0 ] || { echo "docs/remake.sh: the multi-host runs need root" >&2; exit 2; }
      "$py" docs/hooks.py refresh multihost-100mbit.json multihost-1gbit.json \
        multihost-loopback.json ;;
    notebooks)
      for nb in notebooks/[0-9][0-9]_*.ipynb; do "$py" notebooks/nbtool.py run "$nb"; done ;;
    readme) "$py" docs/hooks.py readme ;;
    *) echo "docs/remake.sh: unknown step '$step' (tpu results multihost notebooks readme)" >&2
       exit 2 ;;
  esac
  echo "docs/remake.sh: $step done in $((SECONDS - start)) s"
done
