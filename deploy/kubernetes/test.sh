#!/usr/bin/env bash
# Offline checks of the Kubernetes manifests (deploy/kubernetes, the
# overlays deploy/overlays/gpu-nodes and deploy/overlays/privileged,
# examples/training-pod.yaml):
# rendering, schema validation with kubernetes-validate --strict against
# Kubernetes 1.30 and 1.37 (K8S_VERSIONS overrides), our own invariants,
# negative tests, and the agent's configuration parser on the ConfigMap and
# the DaemonSet's environment. Details: validate.py.
#
# Creates/reuses a virtualenv at $CARGO_TARGET_DIR/k8s-venv (default
# target/k8s-venv) holding the pins of deploy/kubernetes/requirements.txt
# (kubernetes-validate bundles the schemas: no network needed after the
# install). Uses kubectl for `kubectl kustomize` where present (it is no
# Debian package, so `cargo xtask setup` does not install it; without it the
# project's own renderer is checked alone). CLOCKMESH_BIN names the clockmesh binary
# for the configuration checks; otherwise a debug build is made: without the
# eBPF programs (AYA_BUILD_SKIP=1, the checks need none) unless the caller
# set AYA_BUILD_SKIP or has bpf-linker (`cargo xtask test` after its setup),
# so that it reuses the caller's build instead of replacing it.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/require.sh
target=${CARGO_TARGET_DIR:-target}
venv="$target/k8s-venv"
make_venv "$venv" deploy/kubernetes/requirements.txt

if [ -z "${CLOCKMESH_BIN:-}" ]; then
  if [ -z "${AYA_BUILD_SKIP+set}" ] && ! command -v bpf-linker >/dev/null 2>&1; then
    export AYA_BUILD_SKIP=1
  fi
  cargo build -q -p clockmesh --bin clockmesh
  CLOCKMESH_BIN="$target/debug/clockmesh"
fi

"$venv/bin/python" deploy/kubernetes/validate.py \
  --kubernetes-validate "$venv/bin/kubernetes-validate" \
  --clockmesh "$CLOCKMESH_BIN"
echo "deploy/kubernetes/test.sh: ok"
