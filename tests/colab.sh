#!/usr/bin/env bash
# The Colab tier: every notebook run as a Colab learner runs it, checked by nbval against its
# stored outputs. Colab has Python 3.12 and the newest jax; the learner has the notebook alone and
# the wheel, and the notebook's own install cell installs the package. So:
#   - a fresh virtual environment on Python 3.12 with the newest jax pyproject.toml allows,
#     numpy, matplotlib, ipykernel and nbval (what a Colab runtime has; nothing of the project);
#   - the wheel built once from this checkout (EQUARX_REF_WHEEL names it, as for a learner);
#   - a stand-in `google.colab` (with the `output` submodule jax imports when it sees Colab),
#     imported by an IPython startup file, so each install cell believes it is on Colab;
#   - each notebook copied alone to a scratch folder outside the checkout, the environment reset
#     to the runtime's packages before it (no package left from another notebook's install),
#     then `pytest --nbval-lax` there.
# A notebook's kernel keeps about one core busy, so the notebooks run in two lanes, each with its
# own runtime environment (.cache/colab-env-1, -2), every other notebook in each; each
# notebook's output and time are printed in the notebooks' order once both lanes are done.
# Python 3.12: python3.12 on PATH, pyenv's 3.12.x, or /usr/bin/python3.12; if none, it installs
# one (tests/python312.sh) under CI=true, and skips otherwise. Exit: 0 passed or skipped, 1 a
# notebook failed, 2 the environment could not be built (only under CI=true; otherwise a skip).
# Usage: bash tests/colab.sh [notebooks/NN_name.ipynb ...]   (default: all)
#        bash tests/colab.sh --prepare   build the lanes' environments only (tests/run.sh does,
#                                        while the main tier runs; EQUARX_RUN_ID names the run
#                                        whose environments a later call may take as they are)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. tests/python312.sh
prepare=false
if [ "${1:-}" = --prepare ]; then prepare=true; shift; fi
lanes=2

skip() {  # skip REASON: fail under CI=true, else say so (to tests/run.sh's table too) and stop
  if [ "${CI:-}" = true ]; then echo "tests/colab.sh: FAILED: $1" >&2; exit 2; fi
  echo "skipped: $1" > "${EQUARX_TIER_NOTE:-/dev/null}"
  echo "tests/colab.sh: SKIPPED the Colab tier: $1"; exit 0
}

py312=$(install_py312 || true)
[ -n "$py312" ] || skip "no Python 3.12 (pyenv install 3.12, or apt-get install python3.12)"
spec=$(grep -o '"jax>=[^"]*"' pyproject.toml | tr -d '"')  # e.g. jax>=0.10.2,<0.13
start=$SECONDS

pip_q() {  # pip_q ENV ARGS: pip in ENV, its chatter to ENV/pip.log, shown when it fails
  local env=$1; shift
  "$env/bin/python" -m pip "$@" >>"$env/pip.log" 2>&1 || { tail -20 "$env/pip.log" >&2; return 1; }
}

runtime() {  # runtime ENV: a Colab runtime in ENV (taken as it is if this run prepared it)
  local env=$1 stamp="$spec $("$py312" --version) run ${EQUARX_RUN_ID:-$$}"
  if [ -f "$env/.runtime" ] && [ "$(cat "$env/.runtime")" = "$stamp" ]; then return 0; fi
  "$py312" -m venv --clear "$env" || return 1
  pip_q "$env" install -q --upgrade pip &&
    pip_q "$env" install -q "$spec" numpy matplotlib ipykernel nbval packaging || return 1
  "$env/bin/python" -m pip freeze --exclude-editable | sed 's/[=@ ].*//' | sort > "$env/runtime.txt"
  # the stand-in for google.colab, and the IPython startup file that imports it in each kernel
  local stub=$root/$env/colab-stub
  mkdir -p "$stub/google/colab" "$env/ipython/profile_default/startup"
  cat > "$stub/google/colab/__init__.py" <<'PY'
"""A stand-in for Colab's google.colab (tests/colab.sh): its presence is what says "Colab"."""
from . import output  # noqa: F401  (jax imports google.colab.output when it sees Colab)
PY
  cat > "$stub/google/colab/output.py" <<'PY'
"""A stand-in for google.colab.output: nothing here is called by the course."""
PY
  cat > "$env/ipython/profile_default/startup/00-colab.py" <<PY
import sys

sys.path.insert(0, "$stub")
import google.colab  # noqa: E402,F401
PY
  echo "$stamp" > "$env/.runtime"
}

echo "tests/colab.sh: the runtime: $("$py312" --version), $spec at its newest, in $lanes lanes"
for k in $(seq "$lanes"); do
  runtime ".cache/colab-env-$k" || skip "could not build the runtime (.cache/colab-env-$k)"
done
echo "tests/colab.sh: $(.cache/colab-env-1/bin/python -c 'import jax; print("jax", jax.__version__)')"\
" (runtimes ready in $((SECONDS - start)) s)"
$prepare && exit 0

# The wheel, built once, as the notebooks' install cell tells a learner to build it; or the one
# tests/run.sh's wheel tier built from this checkout (EQUARX_COLAB_WHEEL names it).
if [ -n "${EQUARX_COLAB_WHEEL:-}" ]; then
  wheel=$(realpath "$EQUARX_COLAB_WHEEL")
else
  dist=.cache/colab-dist
  rm -rf "$dist"
  pip_q .cache/colab-env-1 wheel -q --no-deps . -w "$dist"
  wheel=$(ls "$root/$dist"/equarx_ref-*.whl)
fi
echo "tests/colab.sh: the wheel $(basename "$wheel") ($(($(stat -c %s "$wheel") / 1024)) KiB)"

notebook() {  # notebook ENV NB: reset ENV to the runtime, then nbval NB alone in a scratch folder
  local env=$1 nb=$2 extra scratch rc=0
  # back to the runtime's packages: what another notebook's install cell added goes
  extra=$("$env/bin/python" -m pip freeze --exclude-editable | sed 's/[=@ ].*//' | sort |
          comm -23 - "$env/runtime.txt")
  if [ -n "$extra" ]; then
    # shellcheck disable=SC2086
    pip_q "$env" uninstall -q -y $extra || return 1
  fi
  scratch=$(mktemp -d)
  if (cd "$scratch" && env -u PYTHONPATH "$root/$env/bin/python" -c 'import equarx_ref') \
       2>/dev/null; then
    echo "tests/colab.sh: equarx_ref importable before $nb's install cell"; return 1
  fi
  cp "$nb" notebooks/sanitize.cfg "$scratch"/
  (cd "$scratch" && env -u PYTHONPATH IPYTHONDIR="$root/$env/ipython" \
     EQUARX_REF_WHEEL="$wheel" "$root/$env/bin/python" -m pytest -q -p no:cacheprovider \
     --nbval-lax --nbval-current-env --nbval-sanitize-with sanitize.cfg "$(basename "$nb")") ||
    rc=$?
  rm -rf "$scratch"
  return $rc
}

notebooks=("$@")
[ ${#notebooks[@]} -gt 0 ] || notebooks=(notebooks/[0-9][0-9]_*.ipynb)
out=$(mktemp -d)
lane() {  # lane K: notebooks K-1, K-1 + lanes, ... in .cache/colab-env-K
  local k=$1 i t0
  for i in "${!notebooks[@]}"; do
    [ $((i % lanes)) = $((k - 1)) ] || continue
    t0=$SECONDS
    if notebook ".cache/colab-env-$k" "${notebooks[$i]}" > "$out/$i.log" 2>&1; then
      echo "passed $((SECONDS - t0))" > "$out/$i.result"
    else
      echo "FAILED $((SECONDS - t0))" > "$out/$i.result"
    fi
  done
}
pids=()
for k in $(seq "$lanes"); do lane "$k" & pids+=($!); done
wait "${pids[@]}"

status=0
report=()
for i in "${!notebooks[@]}"; do
  echo "---- ${notebooks[$i]}"
  cat "$out/$i.log" 2>/dev/null || true
  read -r result seconds < "$out/$i.result" 2>/dev/null || { result=FAILED seconds=0; }
  [ "$result" = passed ] || status=1
  report+=("$(printf '%-34s %-7s %4d s' "$(basename "${notebooks[$i]}")" "$result" "$seconds")")
done
rm -rf "$out"
echo "tests/colab.sh: $(.cache/colab-env-1/bin/python -c 'import jax; print("jax", jax.__version__)'), \
Python 3.12, from $(basename "$wheel") (install cells included), $lanes lanes:"
printf '  %s\n' "${report[@]}"
echo "tests/colab.sh: $((SECONDS - start)) s in all"
exit $status
