#!/usr/bin/env bash
# Makes the real GPU traces of trace/tests/data/gpu/ on a machine with 2+
# NVIDIA GPUs, PyTorch (NCCL) and JAX (CUDA): run from the repository root,
# `bash python/gpu/make_fixtures.sh OUTDIR`. Both jobs run two processes on
# one host, one per GPU, whose profilers start at different steps; process 1
# is a planted straggler (20 ms before its collectives in steps 5 and 6).
set -euo pipefail
out=${1:?usage: make_fixtures.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out/torch" "$out/jax"
# NVLink multicast off (the lending machine's rule); NCCL's own transports.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1

port=$((29500 + RANDOM % 1000))
pids=()
for r in 0 1; do
  # rank 0 profiles steps 2-7, rank 1 steps 4-9: capture windows that differ.
  python3 "$here/torch_nccl_job.py" --rank $r --world 2 --init tcp://127.0.0.1:$port --gpu $r \
    --out "$out/torch/rank$r.pt.trace.json" --steps 12 --profile-from $((1 + 2 * r)) --profile-steps 6 \
    --straggler 1 --delay-ms 20 --delay-steps 5,6 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done

port=$((30500 + RANDOM % 1000))
pids=()
for p in 0 1; do
  JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false \
    python3 "$here/jax_gpu_job.py" --process $p --processes 2 --coordinator 127.0.0.1:$port \
    --logdir "$out/jax/process$p" --steps 12 --profile-from $((2 + 2 * p)) --profile-steps 5 \
    --straggler 1 --delay-ms 20 --delay-steps 5,6 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
find "$out" -type f -printf '%s %p\n'
