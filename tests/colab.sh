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
# Prints each notebook's time. Python 3.12: python3.12 on PATH, pyenv's 3.12.x, or
# /usr/bin/python3.12; if none, it installs one (`pyenv install 3.12`, or the distro's
# python3.12 as root) under CI=true, and skips otherwise. Exit: 0 passed or skipped, 1 a notebook
# failed, 2 the environment could not be built (only under CI=true; otherwise a skip).
# Usage: bash tests/colab.sh [notebooks/NN_name.ipynb ...]   (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

skip() {  # skip REASON: fail under CI=true, else say so (to tests/run.sh's table too) and stop
  if [ "${CI:-}" = true ]; then echo "tests/colab.sh: FAILED: $1" >&2; exit 2; fi
  echo "skipped: $1" > "${EQUARX_TIER_NOTE:-/dev/null}"
  echo "tests/colab.sh: SKIPPED the Colab tier: $1"; exit 0
}

find_py312() {
  local c
  for c in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 \
           /usr/bin/python3.12 /usr/local/bin/python3.12; do
    if "$c" -c 'import sys, venv; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  return 1
}

py312=$(find_py312 || true)
if [ -z "$py312" ] && [ "${CI:-}" = true ]; then
  echo "tests/colab.sh: no Python 3.12; installing one"
  if command -v pyenv >/dev/null 2>&1; then
    pyenv install -s 3.12 >/dev/null || true
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.12 python3.12-venv \
      >/dev/null || true
  fi
  py312=$(find_py312 || true)
fi
[ -n "$py312" ] || skip "no Python 3.12 (pyenv install 3.12, or apt-get install python3.12)"

spec=$(grep -o '"jax>=[^"]*"' pyproject.toml | tr -d '"')  # e.g. jax>=0.10.2,<0.13
env=.cache/colab-env
start=$SECONDS
echo "tests/colab.sh: the runtime: $("$py312" --version) in $env, $spec at its newest"
"$py312" -m venv --clear "$env" || skip "could not make a venv with $py312"
log=$root/$env/pip.log  # pip's chatter; shown when an install fails
pip_q() { "$env/bin/python" -m pip "$@" >>"$log" 2>&1 || { tail -20 "$log" >&2; return 1; }; }
pip_q install -q --upgrade pip || skip "pip upgrade failed"
pip_q install -q "$spec" numpy matplotlib ipykernel nbval packaging ||
  skip "could not install the runtime's packages"
"$env/bin/python" -c 'import jax; print("tests/colab.sh: jax", jax.__version__)'
"$env/bin/python" -m pip freeze --exclude-editable | sed 's/[=@ ].*//' | sort > "$env/runtime.txt"

# The wheel, built once, as the notebooks' install cell tells a learner to build it; or the one
# tests/run.sh's wheel tier built from this checkout (EQUARX_COLAB_WHEEL names it).
if [ -n "${EQUARX_COLAB_WHEEL:-}" ]; then
  wheel=$(realpath "$EQUARX_COLAB_WHEEL")
else
  dist=.cache/colab-dist
  rm -rf "$dist"
  pip_q wheel -q --no-deps . -w "$dist"
  wheel=$(ls "$root/$dist"/equarx_ref-*.whl)
fi
echo "tests/colab.sh: the wheel $(basename "$wheel") ($(($(stat -c %s "$wheel") / 1024)) KiB)"

# The stand-in for google.colab, and the IPython startup file that imports it in each kernel.
stub=$root/$env/colab-stub
mkdir -p "$stub/google/colab" "$env/ipython/profile_default/startup"
cat > "$stub/google/colab/__init__.py" <<'EOF'
"""A stand-in for Colab's google.colab (tests/colab.sh): its presence is what says "Colab"."""
from . import output  # noqa: F401  (jax imports google.colab.output when it sees Colab)
EOF
cat > "$stub/google/colab/output.py" <<'EOF'
"""A stand-in for google.colab.output: nothing here is called by the course."""
EOF
cat > "$env/ipython/profile_default/startup/00-colab.py" <<EOF
import sys

sys.path.insert(0, "$stub")
import google.colab  # noqa: E402,F401
EOF

notebooks=("$@")
[ ${#notebooks[@]} -gt 0 ] || notebooks=(notebooks/[0-9][0-9]_*.ipynb)
status=0
report=()
for nb in "${notebooks[@]}"; do
  # back to the runtime's packages: what another notebook's install cell added goes
  extra=$("$env/bin/python" -m pip freeze --exclude-editable | sed 's/[=@ ].*//' | sort |
          comm -23 - "$env/runtime.txt")
  if [ -n "$extra" ]; then
    # shellcheck disable=SC2086
    pip_q uninstall -q -y $extra
  fi
  scratch=$(mktemp -d)
  if (cd "$scratch" && env -u PYTHONPATH "$root/$env/bin/python" -c 'import equarx_ref') \
       2>/dev/null; then
    echo "tests/colab.sh: equarx_ref importable before $nb's install cell" >&2; exit 1
  fi
  cp "$nb" notebooks/sanitize.cfg "$scratch"/
  t0=$SECONDS
  if (cd "$scratch" && env -u PYTHONPATH IPYTHONDIR="$root/$env/ipython" \
        EQUARX_REF_WHEEL="$wheel" "$root/$env/bin/python" -m pytest -q -p no:cacheprovider \
        --nbval-lax --nbval-current-env --nbval-sanitize-with sanitize.cfg "$(basename "$nb")")
  then result=passed; else result=FAILED; status=1; fi
  report+=("$(printf '%-34s %-7s %4d s' "$(basename "$nb")" "$result" $((SECONDS - t0)))")
  rm -rf "$scratch"
done
echo "tests/colab.sh: $("$env/bin/python" -c 'import jax; print("jax", jax.__version__)'), \
Python 3.12, from $(basename "$wheel") (install cells included):"
printf '  %s\n' "${report[@]}"
echo "tests/colab.sh: $((SECONDS - start)) s in all"
exit $status
