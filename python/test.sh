#!/usr/bin/env bash
# Python side of clockmesh: the pure-Python offsets reader, XSpace editing,
# the JAX path (two processes as two hosts with real jax on CPU, merged
# with `clockmesh trace merge`, checked with xprof's converter) and the
# PyTorch path (two real torch.distributed ranks, one under the skew shim,
# merged, read back by Holistic Trace Analysis).
#
# The tests run against the *installed* package: `pip install ./python` into
# a virtualenv at $CARGO_TARGET_DIR/pyvenv (default target/pyvenv) that holds
# exactly the pins of python/requirements-test.txt and
# python/requirements-torch.txt (rebuilt when they change; torch brings
# ~5.8 GB of CUDA libraries, so the venv is kept between runs), never
# against the source tree.
# Needs python3-venv, protoc, gcc and root for `unshare --uts` (`cargo xtask setup`).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/require.sh
require_cmd protoc protobuf-compiler
require_cmd unshare util-linux
require_cmd gcc build-essential
target=${CARGO_TARGET_DIR:-target}
venv="$target/pyvenv"

make_venv "$venv" python/requirements-test.txt python/requirements-torch.txt
# The package itself, built from the source tree with the pinned setuptools
# (no build isolation: nothing fetched beyond the pins).
venv_pip "$venv" install -q --no-deps --no-build-isolation --force-reinstall ./python
rm -rf python/build python/*.egg-info

export AYA_BUILD_SKIP=1
cargo build -q -p clockmesh --bin clockmesh
export CLOCKMESH_BIN="$target/debug/clockmesh"
export JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=2 GLOG_minloglevel=2
# The test harness's skew shim (tests/skew_shim), for the skewed torch rank.
export CLOCKMESH_SKEW_SHIM="$(realpath -ms "$target")/clockmesh_skew.so"
gcc -O2 -Wall -Wextra -Werror -shared -fPIC -o "$CLOCKMESH_SKEW_SHIM" tests/skew_shim/clockmesh_skew.c -lm

# -P: the tests' own directory is not put first on sys.path either, so
# `import clockmesh` can only find the installed package.
"$venv/bin/python" -P python/tests/test_reader_and_xspace.py
"$venv/bin/python" -P python/tests/test_reader_v2.py
"$venv/bin/python" -P python/tests/test_jax_two_hosts.py
"$venv/bin/python" -P python/tests/test_torch_two_ranks.py
"$venv/bin/python" -P python/tests/test_critical_path.py
echo "python/test.sh: ok"
