#!/usr/bin/env bash
# The TPU compile tier: libtpu's own compilers (XLA:TPU and Mosaic) run on this CPU machine for
# v5e:2x4 and v6e:2x4. Nothing executes on a TPU; what compiles, compiles for the chip.
#
# Builds .cache/tpu-env with jax[tpu] pinned to the jax under test (the main .venv's), then:
#   1. equarx-ref kernels --compile v5e:2x4,v6e:2x4 --json .cache/tpu-compile.json
#      every algorithm x format (XLA path, bf16 and f32 input), the torus, the remedies, every
#      Pallas kernel x format, the Gemma TP forward; prints a table and fails on any error. The
#      report keeps what the tests read off those programs (`CompileResult.read`: each
#      AllReduce's arguments and the bytes its collectives send).
#   2. tests/test_tpu_compile.py, reading that report (EQUARX_TPU_COMPILE_JSON) instead of
#      compiling the matrix's programs again, and compiling only what the matrix does not: wire
#      bytes read from the TPU program, what XLA:TPU overlaps, bytes accessed against the time
#      model (the ratio held to the stored equarx_ref/data/tpu.json), and the codec's and the
#      AllReduces' bytes accessed over their floors (runs/tpu_bytes.py: held to today's figures
#      +10%, the 2x target printed beside them). Each program is compiled once in the tier.
#   3. tests/test_tpu_schedule.py: libtpu's static bundle schedule of the codec's kernels and of
#      the bidirectional ring, compiled afresh and held to their bytes (the stored
#      tpu-schedule.json is held the same way in the main suite).
# libtpu takes a lock file for one process at a time; ALLOW_MULTIPLE_LIBTPU_LOAD=1 lifts it
# (nothing here opens a chip), so the tests run on 2 pytest workers.
# Under CI=true the environment must build. Where the time goes (jax 0.10.2, libtpu 0.0.42.1):
# the matrix (186 programs), then the tests' own compiles, half of them in
# test_codec_bytes_accessed_held_to_today (64 programs at 1/4 MiB, on v5e).
# Usage: bash tests/tpu_compile.sh [PYTHON]   (default: .venv/bin/python, the jax under test)
#        bash tests/tpu_compile.sh --prepare [PYTHON]   build the environment only (tests/run.sh
#        does, while the main tier runs; EQUARX_RUN_ID names the run whose environment a later
#        call may take as it is)
set -euo pipefail
cd "$(dirname "$0")/.."
prepare=false
if [ "${1:-}" = --prepare ]; then prepare=true; shift; fi
python=${1:-.venv/bin/python}
start=$SECONDS
jaxv=$("$python" -c 'import jax; print(jax.__version__)')
env=.cache/tpu-env
stamp="jax[tpu]==$jaxv $(sha256sum pyproject.toml | cut -c1-16) run ${EQUARX_RUN_ID:-$$}"
build() {
  [ -f "$env/.built" ] && [ "$(cat "$env/.built")" = "$stamp" ] && return 0  # this run's
  "$python" -m venv --clear "$env" && "$env/bin/python" -m pip install -q --upgrade pip &&
    "$env/bin/python" -m pip install -q -e ".[test]" "jax[tpu]==$jaxv" &&
    echo "$stamp" > "$env/.built"
}
echo "tests/tpu_compile.sh: jax[tpu]==$jaxv into $env"
if ! build; then
  echo "tests/tpu_compile.sh: could not build the TPU compile environment (jax[tpu]==$jaxv)" >&2
  [ "${CI:-}" = true ] && exit 2
  echo "skipped: could not build the environment (jax[tpu]==$jaxv)" > "${EQUARX_TIER_NOTE:-/dev/null}"
  echo "tests/tpu_compile.sh: SKIPPED the TPU compile tier (not under CI=true)"
  exit 0
fi
echo "tests/tpu_compile.sh: environment ready in $((SECONDS - start)) s"
$prepare && exit 0
export TPU_SKIP_MDS_QUERY=1 TPU_WORKER_ID=0 TPU_WORKER_HOSTNAMES=localhost JAX_PLATFORMS=cpu
export TPU_ACCELERATOR_TYPE=v5litepod-8 ALLOW_MULTIPLE_LIBTPU_LOAD=1
status=0
report=.cache/tpu-compile.json
rm -f "$report"
# One process for both topologies; the compilers run on 2 threads.
t=$SECONDS
"$env/bin/equarx-ref" kernels --compile v5e:2x4,v6e:2x4 --jobs 2 --json "$report" || status=1
echo "tests/tpu_compile.sh: v5e:2x4 and v6e:2x4 compiled in $((SECONDS - t)) s"
t=$SECONDS
EQUARX_REQUIRE_LIBTPU=1 EQUARX_TPU_COMPILE_JSON=$report "$env/bin/python" -m pytest -q -n 2 \
  -p no:cacheprovider -o addopts="-ra --strict-markers" --durations=5 tests/test_tpu_compile.py \
  tests/test_tpu_schedule.py ||
  status=1
echo "tests/tpu_compile.sh: tests in $((SECONDS - t)) s; $((SECONDS - start)) s in all"
exit $status
