# Sourced by the test scripts: they install no system packages. Each
# `require_*` checks one prerequisite and, when it is missing, exits with
# one line that names `cargo xtask setup` (the only install path).
# Usage: . scripts/require.sh; require_cmd protoc; require_file /usr/include/google/protobuf/message.h libprotobuf-dev

require_fail() {
  echo "${0##*/}: $1 is missing: run \`cargo xtask setup\` (installs every prerequisite)" >&2
  exit 1
}

# require_cmd COMMAND [PACKAGE]
require_cmd() {
  command -v "$1" >/dev/null 2>&1 || require_fail "${2:-$1} ($1)"
}

# require_file PATH PACKAGE
require_file() {
  [ -e "$1" ] || require_fail "$2 ($1)"
}

# The test venvs are made from Debian's python3 (TOOLCHAIN.md), never from a
# python3 that comes first on PATH (pyenv, a conda env): a pin that installs
# on another minor release (3.11.7 here) can fail on a new machine's 3.11.2,
# and once did (soupsieve 4.1.2 needs >= 3.11.5).
VENV_PYTHON=${VENV_PYTHON:-/usr/bin/python3}

# require_venv: Debian's python3 can make virtual environments with pip (python3-venv)
require_venv() {
  [ -x "$VENV_PYTHON" ] || require_fail "python3 ($VENV_PYTHON)"
  "$VENV_PYTHON" -c 'import ensurepip, venv' 2>/dev/null || require_fail "python3-venv ($VENV_PYTHON -m venv)"
}

# make_venv DIR REQUIREMENTS...: (re)creates DIR as a virtual environment
# holding exactly the pinned requirements. A venv left half-made (full disk,
# interrupted run) or made from other pins is rebuilt; the pins' hash is
# kept in DIR/.pins (with the interpreter's version).
make_venv() {
  local venv=$1
  shift
  local pins
  pins=$({ "$VENV_PYTHON" --version 2>&1; cat "$@"; } | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$venv/.pins" 2>/dev/null)" = "$pins" ] && "$venv/bin/python" -c 'import sys' 2>/dev/null; then
    return 0
  fi
  require_venv
  rm -rf "$venv"
  if ! "$VENV_PYTHON" -m venv "$venv"; then
    # Seen once on a CI machine: ensurepip failed inside `venv`. The venv is
    # then made without pip and python3's own pip installs into it.
    echo "${0##*/}: ensurepip failed; installing with python3's pip" >&2
    rm -rf "$venv"
    "$VENV_PYTHON" -m venv --without-pip "$venv"
  fi
  local req
  for req in "$@"; do
    venv_pip "$venv" install -q --no-deps -r "$req"
  done
  "$venv/bin/python" -m pip check >/dev/null
  echo "$pins" >"$venv/.pins"
}

# venv_pip DIR ARGS...: the venv's pip, or python3's pip aimed at the venv.
venv_pip() {
  local venv=$1
  shift
  if "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    "$venv/bin/python" -m pip "$@"
  else
    python3 -m pip --python "$venv/bin/python" "$@"
  fi
}
