#!/usr/bin/env bash
# The test command. README's "Quick start" names it; .ci/run runs exactly it on a clean clone.
#
#   bash tests/run.sh          every tier below, as CI runs them, then a table of each tier's
#                              seconds and result. Every tier runs even when one fails; the run
#                              fails if any did. About 35 min on 2 CPU cores.
#   bash tests/run.sh --fast   the contributor's loop: the main environment's tests but those
#                              marked slow (pytest -n 2 -m "not slow" tests): no notebooks, docs
#                              build, libtpu, real Gemma weights or multi-host. About 5 min.
#   bash tests/run.sh ARGS     one pytest run in the main environment (tests/test_x.py -k y).
#
# The tiers, each checking what only it can:
#   setup      the main environment (.venv with ".[dev]"). As root, also Debian's chromium for
#              the docs' browser check (said when it happens; EQUARX_NO_APT=1 leaves apt alone,
#              and the browser tests then skip, or fail under CI=true).
#   main       tests/ on the main environment's Python and jax: every test, the slow ones
#              (@pytest.mark.slow) here and nowhere else: the docs build and its browser check,
#              Gemma on real weights, multi-host. The notebooks too, when the Colab tier cannot
#              run them.
#   wheel      the wheel and sdist build; the wheel installs in a fresh environment and imports
#              from outside the checkout, stored results included. The Colab tier uses it.
#   tpu        tests/tpu_compile.sh: libtpu compiles every kernel and collective for v5e and v6e,
#              each program once; its tests read those compiles back.
#   oldest jax, newest jax
#              the tests that can change with jax's version (JAX_EDGE below), not the slow ones,
#              at both ends of pyproject's range: the oldest on this Python (unless the main suite
#              just ran on it), the newest on Python 3.12 (jax 0.11 and later need it).
#   colab      tests/colab.sh: every notebook as a Colab learner runs it, from the wheel, on
#              Python 3.12 and the newest jax, checked by nbval against its stored outputs,
#              in two lanes (a notebook's kernel keeps one core busy).
# The tpu, jax-edge and Colab environments are built in the background while the main tier runs
# (pip mostly waits on the network); each of those tiers' seconds is then its tests' own.
# Under CI=true a tier whose environment cannot be built fails; elsewhere it is skipped, and
# the table says why.
set -uo pipefail
cd "$(dirname "$0")/.."

mode=all
if [ "${1:-}" = --fast ]; then mode=fast; shift; fi
if [ $# -gt 0 ] && [ "$mode" = all ]; then mode=pytest; fi
if [ $# -gt 0 ] && [ "$mode" = fast ]; then echo "tests/run.sh: --fast takes no arguments" >&2; exit 2; fi

# ---- the table: tier, seconds, result (printed on exit, whatever happened) ---------------------
names=() seconds=() results=() status=0
notes=$(mktemp -d)
export EQUARX_TIER_NOTE=""  # where a tier says why it skipped ("skipped: ..."; colab.sh too)
run_tier() {  # run_tier NAME COMMAND...: run, time and record one tier
  local name=$1 start=$SECONDS rc=0 result
  shift
  echo "==== tests/run.sh: tier '$name'"
  EQUARX_TIER_NOTE="$notes/$name" "$@" || rc=$?
  if [ "$rc" != 0 ]; then
    result="FAILED (exit $rc)"
    [ "$status" != 0 ] || status=$rc
  elif [ -s "$notes/$name" ]; then
    result=$(head -1 "$notes/$name")  # "skipped: why", or where it ran instead
  else
    result=passed
  fi
  names+=("$name") seconds+=($((SECONDS - start))) results+=("$result")
  echo "==== tests/run.sh: tier '$name': $result, $((SECONDS - start)) s"
}
table() {
  [ "$mode" = all ] && [ ${#names[@]} -gt 0 ] || return 0
  echo
  echo "tests/run.sh: tiers (wall seconds on this machine, $(nproc) cores)"
  printf '  %-12s %7s  %s\n' tier seconds result
  local i
  for i in "${!names[@]}"; do
    printf '  %-12s %7d  %s\n' "${names[$i]}" "${seconds[$i]}" "${results[$i]}"
  done
  printf '  %-12s %7d  %s\n' total "$SECONDS" "$([ "$status" = 0 ] && echo passed || echo FAILED)"
}
skip() { echo "skipped: $1" > "$EQUARX_TIER_NOTE"; echo "tests/run.sh: SKIPPED: $1"; }
ran_in() { echo "$1" > "$EQUARX_TIER_NOTE"; echo "tests/run.sh: $1"; }
trap 'table; rm -rf "$notes"; [ -z "${prepare_pid:-}" ] || kill "$prepare_pid" 2>/dev/null' EXIT

# ---- setup -----------------------------------------------------------------------------------
chromium() {  # the docs' browser check renders pages in Debian's chromium: install it as root
  if [ -n "${EQUARX_NO_APT:-}" ] || command -v chromium >/dev/null 2>&1; then return 0; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "tests/run.sh: as root: apt-get install chromium, for the docs' browser check" \
         "(EQUARX_NO_APT=1 to leave apt alone)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
      >/dev/null || echo "tests/run.sh: could not install chromium; the browser tests will say so"
  else
    echo "tests/run.sh: no chromium and not root: the browser tests skip (fail under CI=true)"
  fi
}
main_env() {  # .venv with ".[dev]"; installed again only when pyproject.toml changed
  local stamp=.venv/.equarx-dev-installed
  if [ -x .venv/bin/python ] && [ -f "$stamp" ] && cmp -s pyproject.toml "$stamp"; then
    return 0
  fi
  python3 -m venv .venv &&
    .venv/bin/python -m pip install -q --upgrade pip &&
    .venv/bin/python -m pip install -q -e ".[dev]" &&
    cp pyproject.toml "$stamp"
}

if [ "$mode" = pytest ]; then
  main_env || exit 2
  exec .venv/bin/python -m pytest "$@"
fi
if [ "$mode" = fast ]; then
  main_env || exit 2
  start=$SECONDS
  .venv/bin/python -m pytest -n 2 -m "not slow" -p no:cacheprovider tests
  rc=$?
  echo "tests/run.sh --fast: $((SECONDS - start)) s (the tests marked slow run in the full run)"
  exit $rc
fi

setup() { chromium; rm -f .venv/.equarx-dev-installed; main_env; }
run_tier setup setup
[ "$status" = 0 ] || exit "$status"  # nothing else can run without the main environment

. tests/python312.sh  # find_py312, install_py312
py312=$(find_py312 || true)

# ---- the ends of the supported jax range ---------------------------------------------------
# What can change from one jax to the next, and so runs at both ends (not slow; the main suite
# runs everything once, on its own jax):
JAX_EDGE=(
  tests/test_jax_private.py     # the private jax names the package reads
  tests/test_autodiff.py        # custom_vjp, linear_transpose, jvp/vjp tracers, vmap, pmap
  tests/test_collectives.py     # shard_map, ppermute, all_gather(to="invarying"), check_vma
  tests/test_device_agnostic.py # meshes from setup_devices, never the default backend
  tests/test_gemma.py           # jax.make_mesh's axis types, sharding in types, the TP forward
  tests/test_kernels.py         # Pallas TPU interpret mode and its race detector
  tests/test_mosaic.py          # the Mosaic codec inside the collectives, interpret mode
  tests/test_racelog.py         # how the race detector reports (printed, or logged)
  tests/test_gpu_codec.py       # Pallas to Triton's IR (jax's private lowering rules)
  tests/test_float_env.py       # jaxprs evaluated primitive by primitive
  tests/test_reference.py       # bitwise the spec, on this jaxlib's XLA:CPU, eager and jit
  tests/test_conformance.py     # every codec bitwise the spec
  tests/test_remedies.py        # jax.random's bits behind stochastic rounding
)
spec=$(grep -o '"jax>=[^"]*"' pyproject.toml | tr -d '"')   # e.g. jax>=0.10.2,<0.13
oldest=$(echo "$spec" | sed -n 's/^jax>=\([0-9.]*\).*/\1/p')

jax_env() {  # jax_env NAME PYTHON JAX-REQUIREMENT: .cache/jax-NAME with ".[test]" and that jax
  local env=".cache/jax-$1"
  local stamp="$3 $("$2" --version 2>&1) $(sha256sum pyproject.toml | cut -c1-16) run $EQUARX_RUN_ID"
  [ -f "$env/.built" ] && [ "$(cat "$env/.built")" = "$stamp" ] && return 0  # prepared
  "$2" -m venv --clear "$env" && "$env/bin/python" -m pip install -q --upgrade pip &&
    "$env/bin/python" -m pip install -q -e ".[test]" "$3" && echo "$stamp" > "$env/.built"
}

jax_end() {  # jax_end NAME PYTHON JAX-REQUIREMENT: 0 passed, 1 failed, 2 not built (under CI)
  local env=".cache/jax-$1"
  [ -n "$oldest" ] || { echo "tests/run.sh: no 'jax>=X' lower bound in pyproject.toml" >&2; return 2; }
  echo "tests/run.sh: the jax-edge tests with $3 on $("$2" --version 2>&1) in $env"
  if ! jax_env "$@"; then
    echo "tests/run.sh: could not build the $1-jax environment ($3)" >&2
    [ "${CI:-}" = true ] && return 2
    skip "could not build the environment ($3)"; return 0
  fi
  "$env/bin/python" -c 'import jax; print("tests/run.sh: jax", jax.__version__)' || return 2
  "$env/bin/python" -m pytest -q -o addopts="-ra --strict-markers" -n 2 -p no:cacheprovider \
    -m "not slow" "${JAX_EDGE[@]}"
}

# ---- the later tiers' environments, built while the main tier runs (pip mostly waits on the
# network); each tier takes its environment as built when this run built it (EQUARX_RUN_ID),
# and builds it itself otherwise. What the builds printed is shown before the tpu tier.
export EQUARX_RUN_ID="$$-$(date +%s)"
main_jax=$(.venv/bin/python -c 'import jax; print(jax.__version__)')
prepare() {
  bash tests/tpu_compile.sh --prepare .venv/bin/python
  [ "$main_jax" = "$oldest" ] || jax_env oldest python3 "jax==$oldest"
  bash tests/colab.sh --prepare  # under CI=true it installs a Python 3.12 if there is none
  local py
  py=$(find_py312) && jax_env newest "$py" "$spec"
}
prepare_log=$(mktemp)
EQUARX_TIER_NOTE=/dev/null prepare > "$prepare_log" 2>&1 &
prepare_pid=$!
prepared() {  # wait for the builds; say what they printed, once
  [ -n "$prepare_pid" ] || return 0
  wait "$prepare_pid" || true
  prepare_pid=
  echo "tests/run.sh: the environments built beside the main tier:"
  sed 's/^/  /' "$prepare_log"
  rm -f "$prepare_log"
}

# ---- main: everything, once ------------------------------------------------------------------
# The notebooks run under nbval once: in the Colab tier, the way learners run them (it installs
# a Python 3.12 under CI=true), or here when that tier will skip.
paths=(tests notebooks)
if [ -n "$py312" ] || [ "${CI:-}" = true ]; then
  paths=(tests)
  echo "tests/run.sh: the notebooks run under nbval in the Colab tier"
fi
# --dist loadfile: a notebook runs whole on one worker, a module's fixtures (the docs build, the
# Gemma weights) are made once
run_tier main .venv/bin/python -m pytest -n 2 --dist loadfile "${paths[@]}"

# ---- wheel: the package as a learner installs it -------------------------------------------
wheel() {
  local dist=.cache/dist outside
  rm -rf "$dist" && .venv/bin/python -m build -q --outdir "$dist" . >/dev/null || return 1
  ls "$dist"/equarx_ref-*.whl "$dist"/equarx_ref-*.tar.gz || return 1
  python3 -m venv --clear .cache/wheel-env &&
    .cache/wheel-env/bin/python -m pip install -q "$dist"/equarx_ref-*.whl || return 1
  outside=$(mktemp -d)
  (cd "$outside" && "$OLDPWD/.cache/wheel-env/bin/python" -c \
     'import equarx_ref, sys; assert "site-packages" in equarx_ref.__file__, equarx_ref.__file__
from equarx_ref import data  # the stored results ship in the wheel
assert len(data.names()) >= 9 and all(data.load(n) for n in data.names()), data.names()' &&
   "$OLDPWD/.cache/wheel-env/bin/equarx-ref" --help >/dev/null)  # the command installs too
  local rc=$?
  rm -rf "$outside"
  return $rc
}
run_tier wheel wheel

# ---- tpu: libtpu's compilers for v5e:2x4 and v6e:2x4 (its own environment, jax[tpu] pinned to
# the jax under test; must build under CI=true) -----------------------------------------------
prepared
run_tier tpu bash tests/tpu_compile.sh .venv/bin/python

# ---- colab: every notebook from the wheel alone (tests/colab.sh; under CI=true it installs a
# Python 3.12 if there is none, and fails if it cannot; the newest-jax tier then uses it) ------
colab_wheel=$(ls .cache/dist/equarx_ref-*.whl 2>/dev/null | head -1)
run_tier colab env ${colab_wheel:+EQUARX_COLAB_WHEEL="$colab_wheel"} bash tests/colab.sh

if [ "$main_jax" = "$oldest" ]; then
  run_tier "oldest jax" ran_in "in main (jax $oldest is the main environment's)"
else
  run_tier "oldest jax" jax_end oldest python3 "jax==$oldest"
fi
py312=$(find_py312 || true)  # the Colab tier may have installed one
if [ -n "$py312" ]; then
  run_tier "newest jax" jax_end newest "$py312" "$spec"  # pip picks the newest jax the bound allows
elif [ "${CI:-}" = true ]; then
  run_tier "newest jax" sh -c 'echo "tests/run.sh: no Python 3.12 for the newest jax" >&2; exit 2'
else
  run_tier "newest jax" skip "no Python 3.12 interpreter on this machine"
fi

exit "$status"
