"""Validates `clockmesh trace critical-path` against jobs whose answer is
known (issue 35): each run draws a rank, an op and some steps at random
(seeded), runs critical_job.py with that op slowed on that rank in those
steps, then re-runs the same job without the delay (`--reruns K` times:
the re-run's step time is then the median of the K). The analysis sees only
the traces. Scored:

- top: the planted rank and op top the step's critical path (its longest
  segment is that op's work on that rank), per planted step; beside it,
  how often the top is at least on the planted rank (any kind);
- what-if: `--what-if RANK:OP` (the op at its median) predicts each
  planted step's time; the re-run measures it. Error = |predicted −
  re-run| / re-run, per planted step;
- the re-run's own noise: the unplanted steps, planted run vs re-run
  (median |ratio − 1| per run), and with K ≥ 2 the spread of the K re-runs
  of each planted step ((max − min) / median).

All ranks run on this host (one clock: the merge is given offset 0), as
processes of one host, named `<host>.r<rank>.pt.trace.json`.

`--framework jax` (GPU only) runs critical_job_jax.py instead: one JAX
process per GPU, NCCL, xplane traces named `<host>@<rank>.xplane.pb`. There
the analysis names an op by its kernel's XLA op name (`jit(forward)/
dot_general`): the planted op tops the path when the top segment is work on
the planted rank whose op is in the region (`jit(forward)`, or a
`forward` scope); the what-if names that op as the analysis does (found in
the planted run's analysis: the planted rank's work of that region).

usage: critical_validate.py --clockmesh BIN [--framework torch|jax]
       [--device cpu|cuda] [--gpu-wait] [--nccl-stream]
       [--runs 20] [--reruns 1] [--seed 1] [--world 2] [--plant-ms 25]
       [--out DIR] [--json FILE]
Exit status 0 when every run produced an analysis; the figures are printed
(and written as JSON); judging them is the caller's.
"""

import argparse
import datetime
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OPS = ("forward", "backward", "optimizer")
STEPS = 12
HOST = "vm"


def parse():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clockmesh", required=True, help="the clockmesh binary")
    ap.add_argument("--framework", choices=("torch", "jax"), default="torch")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--gpu-wait", action="store_true",
                    help="cuda: each op's region waits for its kernels (critical_job.py)")
    ap.add_argument("--nccl-stream", action="store_true",
                    help="cuda: all-reduces on NCCL's own stream, as DDP's (critical_job.py)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--reruns", type=int, default=1, help="re-runs per run (their median is scored)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--plant-ms", type=float, default=25.0)
    ap.add_argument("--out", default="", help="keep traces here (default: a temporary dir)")
    ap.add_argument("--json", default="", help="write the figures here")
    a = ap.parse_args()
    if a.framework == "jax":
        a.device = "cuda"
    return a


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jax_env():
    """The JAX job's environment: one GPU per process (chosen by the job),
    cuBLAS matmuls without autotuning (the same kernel every compile),
    no preallocation, NVLink multicast off."""
    env = dict(os.environ)
    env.update(JAX_PLATFORMS="cuda", XLA_PYTHON_CLIENT_PREALLOCATE="false", NCCL_NVLS_ENABLE="0",
               XLA_FLAGS=(env.get("XLA_FLAGS", "") +
                          " --xla_gpu_enable_triton_gemm=false --xla_gpu_autotune_level=0").strip())
    return env


def run_job_jax(a, out_dir, plant):
    out_dir.mkdir(parents=True, exist_ok=True)
    coordinator = f"127.0.0.1:{free_port()}"
    traces, procs = [], []
    for rank in range(a.world):
        trace = out_dir / f"{HOST}@{rank}.xplane.pb"
        cmd = [sys.executable, str(HERE / "critical_job_jax.py"), "--process", str(rank),
               "--processes", str(a.world), "--coordinator", coordinator, "--out", str(trace),
               "--steps", str(STEPS), "--ms-per-k", repr(a.ms_per_k)]
        cmd += plant_args(a, plant)
        procs.append(subprocess.Popen(cmd, env=jax_env()))
        traces.append(trace)
    wait_all(procs, "critical_job_jax.py")
    return traces


def plant_args(a, plant):
    """The job's arguments for the planted delay (none for a re-run)."""
    if not plant:
        return []
    return ["--plant-rank", str(plant["rank"]), "--plant-op", plant["op"],
            "--plant-ms", str(a.plant_ms),
            "--plant-steps", ",".join(map(str, plant["steps"]))]


def wait_all(procs, script):
    """Every rank's process finished well, or the run stops here."""
    for p in procs:
        if p.wait(timeout=300) != 0:
            raise SystemExit(f"{script} exited {p.returncode}")


def run_job(a, out_dir, plant):
    """Runs every rank of one job; returns the trace paths by rank."""
    if a.framework == "jax":
        return run_job_jax(a, out_dir, plant)
    out_dir.mkdir(parents=True, exist_ok=True)
    init = f"tcp://127.0.0.1:{free_port()}"
    traces, procs = [], []
    for rank in range(a.world):
        trace = out_dir / f"{HOST}.r{rank}.pt.trace.json"
        cmd = [sys.executable, str(HERE / "critical_job.py"), "--rank", str(rank),
               "--world", str(a.world), "--init", init, "--out", str(trace),
               "--device", a.device, "--steps", str(STEPS)]
        if a.device == "cuda":
            cmd += ["--cycles-per-ms", str(a.cycles_per_ms)] + (["--gpu-wait"] if a.gpu_wait else [])
            cmd += ["--nccl-stream"] if a.nccl_stream else []
        cmd += plant_args(a, plant)
        env = dict(os.environ)
        if a.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = str(rank)
            env["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off
        procs.append(subprocess.Popen(cmd, env=env))
        traces.append(trace)
    wait_all(procs, "critical_job.py")
    return traces


def calibrate_jax(a):
    """The GPU's ms per unit of the matmuls' K, measured once for the whole
    batch: every run then runs the same matmuls."""
    env = dict(jax_env(), CUDA_VISIBLE_DEVICES="0")
    done = subprocess.run([sys.executable, str(HERE / "critical_job_jax.py"), "--calibrate"],
                          env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def calibrate(a):
    """The GPU's `_sleep` cycles per ms, measured once for the whole batch:
    every run then queues the same kernels."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
    done = subprocess.run([sys.executable, str(HERE / "critical_job.py"), "--calibrate"],
                          env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def analyse(a, traces, what_if=None):
    cmd = [a.clockmesh, "trace", "critical-path", "--json", "--offset", f"{HOST}=0"]
    if what_if:
        cmd += ["--what-if", what_if]
    cmd += [str(t) for t in traces]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return json.loads(done.stdout)


def participant_rank(paths):
    """The trace's rank of each participant index (a JAX trace without
    clockmesh's process index: the rank in its file name, `<host>@<rank>`)."""
    ranks = []
    for p in paths["participants"]:
        r = p.get("rank")
        if r is None and "@" in Path(p.get("trace", "")).name:
            r = int(Path(p["trace"]).name.split("@")[1].split(".")[0])
        ranks.append(r)
    return ranks


def op_is(name, op):
    """Whether the analysis's op `name` is the region `op`: the name itself
    (torch's `record_function`), or XLA's op name within it
    (`jit(forward)/dot_general`, `jit(step)/forward/dot_general`)."""
    if name == op:
        return True
    parts = (name or "").split("/")
    return f"jit({op})" in parts or op in parts[:-1]


def what_if_op(paths, rank, op):
    """The analysis's name of the planted rank's work of region `op` (the
    most frequent), or `op` itself."""
    ranks = participant_rank(paths)
    seen = {}
    for s in paths["steps"]:
        for seg in s["segments"]:
            if ranks[seg["participant"]] == rank and seg["kind"] == "work" and op_is(seg["op"], op):
                seen[seg["op"]] = seen.get(seg["op"], 0) + 1
    return max(seen, key=seen.get) if seen else op


def top_segment(step):
    return step["segments"][step["top"]] if step.get("top") is not None else None


def top_of(step, ranks):
    seg = top_segment(step)
    if seg is None:
        return None
    return ranks[seg["participant"]], seg["kind"], seg["op"]


def one_run(a, rng, index, root):
    rank = rng.randrange(a.world)
    op = rng.choice(OPS)
    # The profiled steps are 2 .. STEPS-1 (schedule: skip 1, warm up 1).
    steps = sorted(rng.sample(range(3, STEPS - 1), 3))
    plant = {"rank": rank, "op": op, "steps": steps}
    traces = run_job(a, root / f"run{index}/planted", plant)
    op_name = op
    if a.framework == "jax":
        op_name = what_if_op(analyse(a, traces), rank, op)
    # A JAX trace has no rank of its own (no clockmesh helper): the what-if
    # names the input, given in rank order.
    who = f"#{rank}" if a.framework == "jax" else str(rank)
    planted = analyse(a, traces, f"{who}:{op_name}")
    reruns = [analyse(a, run_job(a, root / f"run{index}/rerun{k}", None)) for k in range(a.reruns)]
    ranks = participant_rank(planted)
    by_step = {s["step"]: s for s in planted["steps"]}
    rerun_all = {}
    for r in reruns:
        for s in r["steps"]:
            rerun_all.setdefault(s["step"], []).append(s["duration_ns"])
    rerun_ns = {n: statistics.median(v) for n, v in rerun_all.items() if len(v) == a.reruns}
    predicted = {s["step"]: s["predicted_ns"] for s in planted["what_if"][0]["steps"]}
    rows = []
    for n in steps:
        s = by_step.get(n)
        top = top_of(s, ranks) if s else None
        seg = top_segment(s) if s else None
        v = rerun_all.get(n, [])
        rows.append({
            "step": n,
            "top": top,
            "top_ns": seg["duration_ns"] if seg else None,
            "hit": top is not None and top[:2] == (rank, "work") and op_is(top[2], op),
            "rank_hit": top is not None and top[0] == rank,
            "measured_ns": s["duration_ns"] if s else None,
            "predicted_ns": predicted.get(n),
            "rerun_ns": rerun_ns.get(n),
            "reruns_ns": v,
            "rerun_spread": (max(v) - min(v)) / statistics.median(v) if len(v) > 1 else None,
        })
    return {"plant": plant, "what_if_op": op_name, "steps": rows,
            "unplanted_rerun_ratio": unplanted_ratio(by_step, rerun_ns, steps),
            "unplanted_rerun_ratios": unplanted_ratios(by_step, rerun_ns, steps)}


def unplanted_ratios(by_step, rerun_ns, planted):
    """Planted run / re-run of each step not planted."""
    return [by_step[n]["duration_ns"] / rerun_ns[n] for n in sorted(by_step)
            if n not in planted and n in rerun_ns and rerun_ns[n] > 0]


def unplanted_ratio(by_step, rerun_ns, planted):
    """Median of (planted run / re-run) over the steps not planted: how alike
    the two runs are where nothing differs (the noise floor of the what-if)."""
    r = unplanted_ratios(by_step, rerun_ns, planted)
    return statistics.median(r) if r else None


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def figures(runs):
    rows = [r for run in runs for r in run["steps"]]
    unplanted = [abs(x - 1) for run in runs for x in run.get("unplanted_rerun_ratios", [])]
    spreads = [r["rerun_spread"] for r in rows if r["rerun_spread"] is not None]
    errors = [abs(r["predicted_ns"] - r["rerun_ns"]) / r["rerun_ns"] for r in rows
              if r["predicted_ns"] and r["rerun_ns"]]
    return {
        "runs": len(runs),
        "planted_steps": len(rows),
        "top_hits": sum(r["hit"] for r in rows),
        "top_rank_hits": sum(r["rank_hit"] for r in rows),
        "what_if_scored": len(errors),
        "what_if_error_median": statistics.median(errors) if errors else None,
        "what_if_error_p90": quantile(errors, 0.9),
        "what_if_error_max": max(errors) if errors else None,
        "noise_floor_median": statistics.median(
            [abs(r["unplanted_rerun_ratio"] - 1) for r in runs if r["unplanted_rerun_ratio"]]
        ) if runs else None,
        "unplanted_step_p90": quantile(unplanted, 0.9),
        "rerun_spread_median": statistics.median(spreads) if spreads else None,
        "rerun_spread_max": max(spreads) if spreads else None,
    }


def pct(x):
    return "-" if x is None else f"{100 * x:.1f} %"


def main():
    a = parse()
    rng = random.Random(a.seed)
    root = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="critical-"))
    a.cycles_per_ms = a.ms_per_k = 0.0
    if a.framework == "jax":
        a.ms_per_k = calibrate_jax(a)
        print(f"jax: matmul {a.ms_per_k * 1e3:.3f} ms per 1000 of K", flush=True)
    elif a.device == "cuda":
        a.cycles_per_ms = calibrate(a)
        print(f"cuda: torch.cuda._sleep {a.cycles_per_ms:.1f} cycles per ms", flush=True)
    began = time.time()
    runs = []
    for i in range(a.runs):
        t0 = time.time()
        run = one_run(a, rng, i, root)
        runs.append(run)
        p = run["plant"]
        hits = sum(r["hit"] for r in run["steps"])
        errs = ", ".join(
            pct(abs(r["predicted_ns"] - r["rerun_ns"]) / r["rerun_ns"])
            if r["predicted_ns"] and r["rerun_ns"] else "-" for r in run["steps"])
        tops = "; ".join(f"{r['top'][0]} {r['top'][1]} {r['top'][2][:40]} {r['top_ns'] / 1e6:.2f} ms"
                         if r["top"] else "-" for r in run["steps"])
        if a.json:  # so far, in case the batch is cut short
            Path(a.json).write_text(json.dumps({"figures": figures(runs), "runs": runs}, indent=1))
        print(f"run {i} ({time.time() - t0:.0f} s): rank {p['rank']} {p['op']} steps {p['steps']}: "
              f"top {hits}/{len(run['steps'])} ({tops}), what-if error {errs}", flush=True)
    f = figures(runs)
    f.update(framework=a.framework, ms_per_k=a.ms_per_k, device=a.device, gpu_wait=a.gpu_wait, reruns=a.reruns, plant_ms=a.plant_ms,
             seed=a.seed, cycles_per_ms=a.cycles_per_ms, seconds=round(time.time() - began),
             date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    spread = (f"; the {a.reruns} re-runs of a planted step, spread median "
              f"{pct(f['rerun_spread_median'])}, max {pct(f['rerun_spread_max'])}") if a.reruns > 1 else ""
    print(f"{a.framework} {a.device}{' --gpu-wait' if a.gpu_wait else ''}: {f['runs']} runs, planted rank and op top "
          f"the path in {f['top_hits']} of {f['planted_steps']} planted steps (the planted rank: "
          f"{f['top_rank_hits']}); what-if vs re-run error median "
          f"{pct(f['what_if_error_median'])}, p90 {pct(f['what_if_error_p90'])}, max "
          f"{pct(f['what_if_error_max'])} (n = {f['what_if_scored']}); unplanted steps, run vs "
          f"re-run, median |ratio − 1| {pct(f['noise_floor_median'])} (per step: p90 "
          f"{pct(f['unplanted_step_p90'])}){spread}")
    if a.json:
        Path(a.json).write_text(json.dumps({"figures": f, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
