#!/usr/bin/env bash
# The TPU compile tier: libtpu's own compilers (XLA:TPU and Mosaic) run on this CPU machine for
# v5e:2x4 and v6e:2x4. Nothing executes on a TPU; what compiles, compiles for the chip.
#
# Builds .cache/tpu-env with jax[tpu] pinned to the jax under test (the main .venv's), then in
# one process (libtpu allows one process at a time: never run two at once):
#   equarx-ref kernels --compile v5e:2x4,v6e:2x4   every algorithm x format (XLA path, bf16 and f32
#                                           input), the torus, the remedies, every Pallas kernel
#                                           x format, the Gemma TP forward; prints a table and
#                                           fails on any error;
# then tests/test_tpu_compile.py: wire bytes read from the TPU program, what XLA:TPU overlaps,
# bytes accessed against the time model (the ratio held to the stored equarx_ref/data/tpu.json),
# and the codec's and the AllReduces' bytes accessed over their floors (runs/tpu_bytes.py: held
# to today's figures +10%, the 2x target printed beside them).
# Under CI=true the environment must build. Cost (jax 0.10.2, libtpu 0.0.42.1): 7.9 CPU-minutes
# (install, 216 compiles, tests); 10.1 min wall on a shared 2-core machine at load 6-10.
# Usage: bash tests/tpu_compile.sh [PYTHON]   (default: .venv/bin/python, the jax under test)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-.venv/bin/python}
start=$SECONDS
jaxv=$("$python" -c 'import jax; print(jax.__version__)')
env=.cache/tpu-env
echo "tests/tpu_compile.sh: jax[tpu]==$jaxv into $env"
if ! { "$python" -m venv --clear "$env" && "$env/bin/python" -m pip install -q --upgrade pip &&
       "$env/bin/python" -m pip install -q -e ".[test]" "jax[tpu]==$jaxv"; }; then
  echo "tests/tpu_compile.sh: could not build the TPU compile environment (jax[tpu]==$jaxv)" >&2
  [ "${CI:-}" = true ] && exit 2
  echo "tests/tpu_compile.sh: SKIPPED the TPU compile tier (not under CI=true)"
  exit 0
fi
export TPU_SKIP_MDS_QUERY=1 TPU_WORKER_ID=0 TPU_WORKER_HOSTNAMES=localhost JAX_PLATFORMS=cpu
export TPU_ACCELERATOR_TYPE=v5litepod-8
status=0
# One process for both topologies (libtpu's lock file allows one process at a time); the
# compilers run on 2 threads.
t=$SECONDS
"$env/bin/equarx-ref" kernels --compile v5e:2x4,v6e:2x4 --jobs 2 --json .cache/tpu-compile.json ||
  status=1
echo "tests/tpu_compile.sh: v5e:2x4 and v6e:2x4 compiled in $((SECONDS - t)) s"
EQUARX_REQUIRE_LIBTPU=1 "$env/bin/python" -m pytest -q -p no:cacheprovider -o addopts="-ra" \
  tests/test_tpu_compile.py || status=1
echo "tests/tpu_compile.sh: $((SECONDS - start)) s in all (install, compiles, tests)"
exit $status
