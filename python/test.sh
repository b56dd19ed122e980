#!/usr/bin/env bash
# Python side of clockmesh: the pure-Python offsets reader, XSpace editing,
# and the JAX path (two processes as two hosts with real jax on CPU, merged
# with `clockmesh trace merge`, checked with xprof's converter).
# Creates/reuses a virtualenv at $CARGO_TARGET_DIR/pyvenv (default
# target/pyvenv) with jax, xprof and protobuf from PyPI; needs protoc
# (installed with apt-get if missing) and root (unshare --uts).
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
venv="$target/pyvenv"

if ! command -v protoc >/dev/null; then
  apt-get install -y protobuf-compiler >/dev/null ||
    { apt-get update >/dev/null && apt-get install -y protobuf-compiler >/dev/null; }
fi
# A venv left half-made (full disk, interrupted run) is rebuilt, and where
# ensurepip itself fails, the system pip installs into a pip-less venv.
make_venv() {
  rm -rf "$venv"
  if ! python3 -m venv "$venv"; then
    echo "python/test.sh: ensurepip failed; using the system pip" >&2
    rm -rf "$venv"
    python3 -m venv --without-pip "$venv"
  fi
}
pip_install() {
  if "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    "$venv/bin/python" -m pip install -q "$@"
  else
    python3 -m pip --python "$venv/bin/python" install -q "$@"
  fi
}
"$venv/bin/python" -c 'import sys' 2>/dev/null || make_venv
if ! "$venv/bin/python" -c 'import jax, xprof, google.protobuf' 2>/dev/null; then
  pip_install jax xprof protobuf
fi

export AYA_BUILD_SKIP=1
cargo build -q -p clockmesh --bin clockmesh
export CLOCKMESH_BIN="$target/debug/clockmesh"
export JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=2 GLOG_minloglevel=2

"$venv/bin/python" python/tests/test_reader_and_xspace.py
"$venv/bin/python" python/tests/test_jax_two_hosts.py
echo "python/test.sh: ok"
