#!/usr/bin/env bash
# Install everything the tests need into a fresh virtual environment, then run them all:
# unit tests, the docs build and its browser check, Gemma on real weights (and the notebooks
# under nbval here only when the Colab tier below cannot run them). Then the TPU compile tier
# (tests/tpu_compile.sh: libtpu compiles every kernel and collective for v5e and v6e, no TPU
# needed). Then the two ends of the supported jax range (pyproject.toml: jax>=OLDEST,<NEXT):
# the unit tests again with the oldest supported jax on this Python (unless the main suite just
# ran on it), and with the newest on Python 3.12 when this machine has one (jax 0.11 and later
# need 3.12). Under CI=true the oldest-jax environment must build. Last, the Colab tier
# (tests/colab.sh): every notebook as a Colab learner runs it, from the wheel, on Python 3.12
# and the newest jax, checked by nbval against its stored outputs.
# With arguments (bash tests/run.sh tests/test_x.py -k y), only that pytest run, main env.
set -euo pipefail
cd "$(dirname "$0")/.."

# The browser check renders the docs in Debian's Chromium; install it where we can (root).
if [ $# -eq 0 ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
      >/dev/null || echo "tests/run.sh: could not install chromium; the browser test will say so"
  else
    echo "tests/run.sh: no chromium and not root: the browser test will skip (fails under CI=true)"
  fi
fi

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[dev]"
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi

py312=""  # the Colab tier's and the newest jax's Python
for candidate in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 \
                 /usr/bin/python3.12 /usr/local/bin/python3.12; do
  if "$candidate" -c 'import sys, venv; assert sys.version_info[:2] == (3, 12)' 2>/dev/null
  then py312=$candidate; break; fi
done
# The notebooks run under nbval once: in the Colab tier, the way learners run them (it installs
# a Python 3.12 under CI=true), or here when that tier will skip.
paths=(tests notebooks)
if [ -n "$py312" ] || [ "${CI:-}" = true ]; then
  paths=(tests)
  echo "tests/run.sh: the notebooks run under nbval in the Colab tier, last"
fi
# --dist loadfile: a notebook runs whole, on one worker
.venv/bin/python -m pytest -n 2 --dist loadfile "${paths[@]}"

# ---- the package as a learner installs it: wheel and sdist built, the wheel installed in a
# fresh environment and imported from outside the checkout, with its stored results (the Colab
# tier runs every notebook from the wheel) ------------------------------------------------------
dist=.cache/dist
rm -rf "$dist" && .venv/bin/python -m build -q --outdir "$dist" . >/dev/null
ls "$dist"/equarx_ref-*.whl "$dist"/equarx_ref-*.tar.gz
python3 -m venv --clear .cache/wheel-env
.cache/wheel-env/bin/python -m pip install -q "$dist"/equarx_ref-*.whl
outside=$(mktemp -d)
(cd "$outside" && "$OLDPWD/.cache/wheel-env/bin/python" -c \
   'import equarx_ref, sys; assert "site-packages" in equarx_ref.__file__, equarx_ref.__file__
from equarx_ref import data  # the stored results ship in the wheel
assert len(data.names()) >= 9 and all(data.load(n) for n in data.names()), data.names()' &&
 "$OLDPWD/.cache/wheel-env/bin/equarx-ref" --help >/dev/null)  # the command installs too
rm -rf "$outside"

# ---- the TPU compile tier: libtpu's compilers for v5e:2x4 and v6e:2x4, its own environment
# (jax[tpu] pinned to the jax under test; must build under CI=true), a table, fails on any error
bash tests/tpu_compile.sh .venv/bin/python

# ---- the ends of the supported jax range: unit tests only ----------------------------------
# (test_autodiff: the derivative and vmap/pmap differ most between jax lines)
UNIT=(tests/test_quantize.py tests/test_reference.py tests/test_float_env.py
      tests/test_conformance.py tests/test_collectives.py tests/test_schedule.py
      tests/test_counting.py tests/test_cost.py tests/test_cli.py tests/test_gemma.py
      tests/test_kernels.py tests/test_arguments.py tests/test_racelog.py
      tests/test_device_agnostic.py tests/test_autodiff.py tests/test_jax_private.py
      tests/test_mosaic.py tests/test_gpu_codec.py)
spec=$(grep -o '"jax>=[^"]*"' pyproject.toml | tr -d '"')   # e.g. jax>=0.10.2,<0.13
oldest=$(echo "$spec" | sed -n 's/^jax>=\([0-9.]*\).*/\1/p')
[ -n "$oldest" ] || { echo "tests/run.sh: no 'jax>=X' lower bound in pyproject.toml" >&2; exit 1; }

unit_tests() {  # unit_tests NAME PYTHON JAX-REQUIREMENT: 0 passed, 1 failed, 2 not built
  local env=".cache/jax-$1" start=$SECONDS
  echo "tests/run.sh: unit tests with $3 on $("$2" --version 2>&1) in $env"
  "$2" -m venv --clear "$env" && "$env/bin/python" -m pip install -q --upgrade pip &&
    "$env/bin/python" -m pip install -q -e ".[test]" "$3" || return 2
  "$env/bin/python" -c 'import jax; print("tests/run.sh: jax", jax.__version__)' || return 2
  "$env/bin/python" -m pytest -q -o addopts="-ra" -n 2 -p no:cacheprovider "${UNIT[@]}" ||
    return 1
  echo "tests/run.sh: $1 jax: $((SECONDS - start)) s (install and tests)"
}

run_end() {  # run_end NAME PYTHON JAX-REQUIREMENT: a failed test always fails the run
  local status=0
  unit_tests "$@" || status=$?
  if [ "$status" = 2 ]; then
    echo "tests/run.sh: could not build the $1-jax environment ($3)" >&2
    [ "${CI:-}" = true ] && exit 2
    echo "tests/run.sh: SKIPPED the $1-jax run (not under CI=true)"
  elif [ "$status" != 0 ]; then
    exit "$status"
  fi
}

main_jax=$(.venv/bin/python -c 'import jax; print(jax.__version__)')
if [ "$main_jax" = "$oldest" ]; then
  echo "tests/run.sh: the oldest supported jax ($oldest) is the main suite's: ran above"
else
  run_end oldest python3 "jax==$oldest"
fi

if [ -z "$py312" ]; then
  echo "tests/run.sh: SKIPPED the newest-jax run: no Python 3.12 interpreter on this machine"
else
  run_end newest "$py312" "$spec"  # pip picks the newest jax the bound allows
fi

# ---- the Colab tier: every notebook from the wheel alone, on Python 3.12 and the newest jax,
# each installed by its own install cell outside the checkout (tests/colab.sh; under CI=true it
# installs a Python 3.12 if there is none, and fails if it cannot) ---------------------------
bash tests/colab.sh
