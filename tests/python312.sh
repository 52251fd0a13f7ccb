# Sourced by tests/run.sh and tests/colab.sh: the Python 3.12 of the Colab tier and of the newest
# jax (Colab's Python; jax 0.11 and later need it).
#   find_py312                 prints the first Python 3.12 found (PATH, pyenv, /usr), or fails
#   install_py312              under CI=true only: pyenv install 3.12, else (as root) the
#                              distro's python3.12; then find_py312

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

install_py312() {
  find_py312 && return 0
  [ "${CI:-}" = true ] || return 1
  echo "tests/python312.sh: no Python 3.12; installing one" >&2
  if command -v pyenv >/dev/null 2>&1; then
    pyenv install -s 3.12 >/dev/null || true
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.12 python3.12-venv \
      >/dev/null || true
  fi
  find_py312
}
