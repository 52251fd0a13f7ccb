#!/usr/bin/env bash
# Install everything the tests need into a fresh virtual environment, then run them all:
# unit tests, the notebooks (nbval), the docs build and its browser check, Gemma on real weights.
set -euo pipefail
cd "$(dirname "$0")/.."

# The browser check renders the docs in Debian's Chromium; install it where we can (root).
if ! command -v chromium >/dev/null 2>&1; then
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
exec .venv/bin/python -m pytest "$@"
