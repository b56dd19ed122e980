#!/usr/bin/env bash
# End-to-end test (tests/tests/end_to_end.rs): agents on two netns hosts
# with really skewed clocks, real JAX programs under the skew shim, and
# `clockmesh trace merge`, checked against the truth. Needs root and the
# Python venv with jax that python/test.sh makes (run this after it;
# `cargo xtask test` does).
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
export CLOCKMESH_PYTHON=$(realpath -ms "${CLOCKMESH_PYTHON:-$target/pyvenv/bin/python}")
[ -x "$CLOCKMESH_PYTHON" ] || { echo "no $CLOCKMESH_PYTHON: run python/test.sh first" >&2; exit 1; }
cargo build -q -p clockmesh --bin clockmesh
CLOCKMESH_REQUIRE_ROOT=1 cargo test -q -p clockmesh-testbed --test end_to_end -- --ignored --nocapture
echo "tests/end_to_end.sh: ok"
