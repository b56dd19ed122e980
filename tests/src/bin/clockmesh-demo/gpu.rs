//! `clockmesh-demo gpu-e2e` (`cargo xtask gpu-e2e`): a real multi-host GPU
//! job against a known truth, on a machine with 2+ NVIDIA GPUs.
//!
//! Two network-namespace hosts on one veth pair run agents at the shipped
//! defaults with injected skews (n1 37 ms ahead, 20 ppm fast) and GPU maps;
//! a PyTorch NCCL job and then a JAX job run one process per host and GPU,
//! NCCL between the namespaces over their veth sockets, every process under
//! the skew shim (its CLOCK_REALTIME, and so its profiler's GPU stamps, read
//! as its agent's). Profilers start and stop at different steps per rank,
//! and rank 1 sleeps before its collectives in some steps (the straggler).
//! The traces are merged with the agents' histories and analysed with
//! `trace collectives`, aligned and with `--no-align`; the truth of each
//! GPU stamp is the stamp with its host's injected skew undone.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use clockmesh_proto::xplane::XSpace;
use clockmesh_testbed::{
    cluster::{Backend, Cluster, ClusterConfig, agent_binary, quantile, true_time, wait_at_most},
    netns::HOST_IFACE,
    shim,
};
use prost::Message as _;
use serde::Serialize;
use serde_json::Value;

/// n0 runs true (the reference); n1 is 37 ms ahead and 20 ppm fast.
const SKEWS: [(i64, f64); 2] = [(0, 0.0), (37_000_000, 20_000.0)];
const STRAGGLER: usize = 1;
const TORCH_PORT: u16 = 29_710;
const JAX_PORT: u16 = 29_720;

#[derive(clap::Args, Debug)]
pub struct GpuArgs {
    /// Steps of each job.
    #[arg(long, default_value_t = 40)]
    steps: u32,
    /// The straggler's sleep before its collectives, ms (in every step
    /// whose number is 1 mod 3).
    #[arg(long, default_value_t = 3.0)]
    delay_ms: f64,
    /// Python with torch and jax (CUDA builds).
    #[arg(long, default_value = "python3")]
    python: PathBuf,
    /// A prebuilt skew shim (`tests/skew_shim/clockmesh_skew.c`); default:
    /// build it with gcc.
    #[arg(long)]
    shim: Option<PathBuf>,
    /// Where traces, histories and logs go: a new or empty directory
    /// (default: a new temporary one).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the figures as JSON.
    #[arg(long)]
    json: bool,
}

/// The two jobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Job {
    Torch,
    Jax,
}

/// Each rank's profiler window (first step, steps): they differ, as
/// per-rank profiler schedules make them.
fn window(job: Job, rank: usize) -> (u32, u32) {
    match (job, rank) {
        (Job::Torch, 0) => (2, 30),
        (Job::Torch, _) => (6, 30),
        (Job::Jax, 0) => (2, 25),
        (Job::Jax, _) => (5, 25),
    }
}

fn delayed(step: u64) -> bool {
    step % 3 == 1
}

/// Figures of one job, as the issue states its goals.
#[derive(Debug, Default, Serialize)]
struct JobFigures {
    job: Option<Job>,
    instances_matched: usize,
    unmatched_by_reason: Value,
    /// Matched instances with a step.
    steps_assigned: usize,
    /// First collective of each step where the straggler slept.
    delayed_instances: usize,
    straggler_last: usize,
    /// Lateness (last − second-last enter) against the GPU stamps' truth.
    lateness_error_p50_ns: Option<f64>,
    lateness_error_max_ns: Option<f64>,
    lateness_within_combined_bound: usize,
    lateness_scored: usize,
    /// Lateness against the ranks' true CPU call instants (includes the
    /// launch latency difference of the two ranks).
    lateness_vs_calls_p50_ns: Option<f64>,
    lateness_vs_calls_max_ns: Option<f64>,
    /// PyTorch: the straggler's launch latency (kernel start − its
    /// `cudaLaunchKernel`/`cuLaunchKernelEx`) less the other rank's, in the
    /// delayed instances: the launch term of the comparison with the calls.
    launch_term_p50_ns: Option<f64>,
    launch_term_max_ns: Option<f64>,
    /// Lateness against the ranks' calls as the framework recorded them
    /// (PyTorch: each rank's `record_param_comms` start; XLA: the host op
    /// that launched the kernel, e.g. `psum.7.2`), each skew undone.
    lateness_vs_recorded_calls_p50_ns: Option<f64>,
    lateness_vs_recorded_calls_max_ns: Option<f64>,
    /// Every enter/exit of the skewed host's GPU collectives against the
    /// truth: how many within the host map's bound (the stated bound less
    /// the profiler's conversion term, which this truth cannot see).
    skewed_events: usize,
    skewed_within_bound: usize,
    skewed_error_max_ns: Option<f64>,
    skewed_bound_max_ns: Option<f64>,
    violations_aligned: u64,
    violations_raw: u64,
}

pub fn run(args: GpuArgs) -> anyhow::Result<()> {
    let gpus = gpu_count()?;
    ensure!(
        gpus >= 2,
        "gpu-e2e needs 2 NVIDIA GPUs (one per host); nvidia-smi lists {gpus}"
    );
    let out = match &args.out {
        Some(p) => p.clone(),
        None => std::env::temp_dir().join(format!("clockmesh-gpu-e2e-{}", std::process::id())),
    };
    // A second run into the same directory would meet the first one's
    // merged runs, which `trace merge` never overwrites.
    ensure!(
        !std::fs::read_dir(&out).is_ok_and(|mut d| d.next().is_some()),
        "{} is not empty: give --out a new directory",
        out.display()
    );
    std::fs::create_dir_all(&out)?;
    let shim = match &args.shim {
        Some(p) => p.clone(),
        None => shim::build(&out)?,
    };
    let started = Instant::now();
    let cluster = start_cluster()?;
    eprintln!(
        "gpu-e2e: agents publishing after {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let mut figures = Vec::new();
    for job in [Job::Torch, Job::Jax] {
        let inputs = run_job(&cluster, &args, &shim, &out, job)?;
        let history = history(&cluster, &out)?;
        figures.push(score_job(&cluster, &out, job, &inputs, &history)?);
    }
    print_figures(&figures, args.json)?;
    Ok(())
}

fn gpu_count() -> anyhow::Result<usize> {
    let o = Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .context("nvidia-smi (gpu-e2e runs on a machine with NVIDIA GPUs)")?;
    Ok(String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with("GPU "))
        .count())
}

/// Two hosts on one veth pair, static membership, the shipped cadence and
/// window, GPU maps of each host's GPU.
fn start_cluster() -> anyhow::Result<Cluster> {
    let mut c = Cluster::start(ClusterConfig {
        nodes: 2,
        backend: Backend::Static,
        cadence_us: 100_000,
        window_s: 1,
        degree: 1,
        direct_pair: true,
        skews: SKEWS.to_vec(),
        extra_args: vec!["--gpu-clock".into(), "cuda".into()],
        ..ClusterConfig::default()
    })?;
    // 30 results each: past the first windows' young fits, as a job that
    // starts after the DaemonSet has run a while.
    c.wait_for(Duration::from_secs(180), "30 results on every node", |c| {
        (0..2).all(|i| c.node_lines(i).len() >= 30)
    })?;
    Ok(c)
}

/// Runs one job, a process per host and GPU; returns its trace files.
fn run_job(
    c: &Cluster,
    args: &GpuArgs,
    shim: &Path,
    out: &Path,
    job: Job,
) -> anyhow::Result<Vec<PathBuf>> {
    let dir = out.join(format!("{job:?}").to_lowercase());
    std::fs::create_dir_all(&dir)?;
    let children = (0..2)
        .map(|rank| spawn_rank(c, args, shim, &dir, job, rank))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for (rank, mut child) in children.into_iter().enumerate() {
        let status = wait_at_most(&mut child, Duration::from_secs(300))?;
        ensure!(
            status.is_some_and(|s| s.success()),
            "{job:?} rank {rank}: {status:?}; see {}",
            dir.join(format!("rank{rank}.log")).display()
        );
    }
    trace_files(&dir, job)
}

fn spawn_rank(
    c: &Cluster,
    args: &GpuArgs,
    shim: &Path,
    dir: &Path,
    job: Job,
    rank: usize,
) -> anyhow::Result<Child> {
    let host = Cluster::name(rank);
    let master = c.bed.host(0).addr;
    let (from, steps) = window(job, rank);
    let delay_steps: Vec<String> = (0..u64::from(args.steps))
        .filter(|s| delayed(*s))
        .map(|s| s.to_string())
        .collect();
    let scripts = python_dir()?;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &c.bed.host(rank).netns])
        .args(["unshare", "--uts", "sh", "-c"])
        .arg(r#"hostname "$0" && exec env LD_PRELOAD="$CM_SHIM" "$@""#)
        .arg(&host)
        .arg(&args.python);
    let common = [
        "--steps".to_string(),
        args.steps.to_string(),
        "--profile-from".into(),
        from.to_string(),
        "--profile-steps".into(),
        steps.to_string(),
        "--straggler".into(),
        STRAGGLER.to_string(),
        "--delay-ms".into(),
        args.delay_ms.to_string(),
        "--delay-steps".into(),
        delay_steps.join(","),
        "--truth".into(),
        dir.join(format!("truth{rank}.json")).display().to_string(),
    ];
    match job {
        Job::Torch => cmd
            .arg(scripts.join("gpu/torch_nccl_job.py"))
            .args(["--rank", &rank.to_string(), "--world", "2"])
            .arg(format!("--init=tcp://{master}:{TORCH_PORT}"))
            .args(["--gpu", &rank.to_string(), "--host", &host])
            .arg("--out")
            .arg(dir.join(format!("{host}.rank{rank}.pt.trace.json"))),
        Job::Jax => cmd
            .arg(scripts.join("gpu/jax_gpu_job.py"))
            .args(["--process", &rank.to_string(), "--processes", "2"])
            .arg(format!("--coordinator={master}:{JAX_PORT}"))
            .arg("--logdir")
            .arg(dir.join(format!("p{rank}")))
            .arg("--offsets")
            .arg(c.node_dir(rank).join("offsets")),
    };
    let log = std::fs::File::create(dir.join(format!("rank{rank}.log")))?;
    cmd.args(common)
        .env("PYTHONPATH", &scripts)
        .env("CM_SHIM", shim)
        .env("CLOCKMESH_SKEW", shim::spec(&c.skews[rank]))
        .env("NCCL_SOCKET_IFNAME", HOST_IFACE)
        .env("NCCL_P2P_DISABLE", "1")
        .env("NCCL_SHM_DISABLE", "1")
        .env("NCCL_IB_DISABLE", "1")
        .env("NCCL_NVLS_ENABLE", "0")
        .env("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        .env("NVSHMEM_DISABLE_NVLS", "1")
        .env("JAX_PLATFORMS", "cuda")
        .env("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        .env("TF_CPP_MIN_LOG_LEVEL", "2")
        .env("PYTHONUNBUFFERED", "1")
        .stdout(log.try_clone()?)
        .stderr(log);
    cmd.spawn()
        .with_context(|| format!("starting {job:?} rank {rank}"))
}

/// The repository's `python/` (the jobs and the clockmesh package): under
/// the working directory where the binary was carried to another machine,
/// else beside the crate it was built from.
fn python_dir() -> anyhow::Result<PathBuf> {
    let here = Path::new("python");
    let dir = if here.join("gpu").is_dir() {
        here.to_path_buf()
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../python")
    };
    dir.canonicalize()
        .with_context(|| format!("{}: run from the repository root", dir.display()))
}

/// The job's per-rank traces, in rank order.
fn trace_files(dir: &Path, job: Job) -> anyhow::Result<Vec<PathBuf>> {
    (0..2)
        .map(|rank| {
            let host = Cluster::name(rank);
            match job {
                Job::Torch => Ok(dir.join(format!("{host}.rank{rank}.pt.trace.json"))),
                Job::Jax => {
                    let runs = dir.join(format!("p{rank}/plugins/profile"));
                    let run = std::fs::read_dir(&runs)
                        .with_context(|| format!("{}", runs.display()))?
                        .next()
                        .context("no profile run")??;
                    Ok(run.path().join(format!("{host}.xplane.pb")))
                }
            }
        })
        .collect()
}

/// Every agent's JSONL history in one file (as `--history` reads it).
fn history(c: &Cluster, out: &Path) -> anyhow::Result<PathBuf> {
    let p = out.join("history.jsonl");
    let mut all = String::new();
    for i in 0..2 {
        all += &std::fs::read_to_string(c.node_dir(i).join("clockmesh.jsonl"))?;
    }
    std::fs::write(&p, all)?;
    Ok(p)
}

fn clockmesh(args: &[&std::ffi::OsStr]) -> anyhow::Result<std::process::Output> {
    let o = Command::new(agent_binary()?).args(args).output()?;
    Ok(o)
}

/// `trace merge` of the inputs with the history; returns the run dir.
fn merge(out: &Path, job: Job, inputs: &[PathBuf], history: &Path) -> anyhow::Result<PathBuf> {
    let logdir = out.join("merged");
    let run = format!("{job:?}").to_lowercase();
    let mut args: Vec<&std::ffi::OsStr> = vec!["trace".as_ref(), "merge".as_ref()];
    args.extend(inputs.iter().map(|p| p.as_os_str()));
    args.extend([
        "-o".as_ref(),
        logdir.as_os_str(),
        "--run".as_ref(),
        run.as_ref(),
        "--history".as_ref(),
        history.as_os_str(),
    ]);
    let o = clockmesh(&args)?;
    ensure!(
        o.status.success(),
        "trace merge: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&o.stdout));
    Ok(logdir.join("plugins/profile").join(run))
}

fn collectives(inputs: &[&std::ffi::OsStr], no_align: bool) -> anyhow::Result<Value> {
    let mut args: Vec<&std::ffi::OsStr> = vec!["trace".as_ref(), "collectives".as_ref()];
    args.extend(inputs);
    args.push("--json".as_ref());
    if no_align {
        args.push("--no-align".as_ref());
    }
    let o = clockmesh(&args)?;
    // Exit 1 reports violations; the JSON is printed either way.
    serde_json::from_slice(&o.stdout).with_context(|| {
        format!(
            "trace collectives printed no JSON: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// The reference's clock at true time `t`: the global timeline's truth.
fn true_global(c: &Cluster, reference: usize, t: i64) -> i64 {
    t + c.skews[reference].at(t)
}

/// The reference named by the agents' last result.
fn reference_index(c: &Cluster) -> anyhow::Result<usize> {
    let line = c.node_lines(0).pop().context("no result of n0")?;
    let reference = line
        .reference
        .context("n0's last result names no reference")?;
    (0..2)
        .find(|&i| Cluster::name(i) == reference)
        .with_context(|| format!("unknown reference {reference}"))
}

/// Per participant index: its host's index (n<i>).
fn participant_hosts(a: &Value) -> Vec<Option<usize>> {
    a["participants"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    let host = p["host"].as_str()?;
                    (0..2).find(|&i| Cluster::name(i) == host)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn instance_key(i: &Value) -> String {
    i["key"].to_string()
}

/// One rank's call in an instance: (host index, enter, exit, its host's
/// alignment bound: the stated bound less the profiler's GPU conversion
/// term, which the truth here (the stamp itself) shares).
fn calls(i: &Value, hosts: &[Option<usize>]) -> Vec<(usize, i64, i64, Option<i64>)> {
    i["ranks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let p = r["participant"].as_u64()? as usize;
            Some((
                (*hosts.get(p)?)?,
                r["enter_ns"].as_i64()?,
                r["exit_ns"].as_i64()?,
                r["bound_ns"]
                    .as_i64()
                    .map(|b| b - r["profiler_conversion_ns"].as_i64().unwrap_or(0)),
            ))
        })
        .collect()
}

/// Where a call sits in a rank's trace, whatever the analysis numbered its
/// instance: (host, step, op, its order among that op's calls in the step).
type Place = (usize, u64, String, usize);

/// Every matched call by its place: (enter, exit) on the analysed timeline.
fn calls_by_place(a: &Value, hosts: &[Option<usize>]) -> BTreeMap<Place, (i64, i64)> {
    let mut by_op: BTreeMap<(usize, u64, String), Vec<(i64, i64)>> = BTreeMap::new();
    for inst in a["instances"].as_array().into_iter().flatten() {
        let Some(step) = inst["step"].as_u64() else {
            continue;
        };
        for r in inst["ranks"].as_array().into_iter().flatten() {
            let (Some(p), Some(op), Some(e), Some(x)) = (
                r["participant"].as_u64(),
                r["op"].as_str(),
                r["enter_ns"].as_i64(),
                r["exit_ns"].as_i64(),
            ) else {
                continue;
            };
            let Some(h) = hosts.get(p as usize).copied().flatten() else {
                continue;
            };
            by_op
                .entry((h, step, op.to_string()))
                .or_default()
                .push((e, x));
        }
    }
    let mut places = BTreeMap::new();
    for ((h, step, op), mut v) in by_op {
        v.sort_unstable();
        for (k, ex) in v.into_iter().enumerate() {
            places.insert((h, step, op.clone(), k), ex);
        }
    }
    places
}

/// Each rank's true call instant per step (truth files).
fn call_truth(dir: &Path) -> anyhow::Result<BTreeMap<(usize, u64), i64>> {
    let mut m = BTreeMap::new();
    for rank in 0..2 {
        let doc: Value =
            serde_json::from_slice(&std::fs::read(dir.join(format!("truth{rank}.json")))?)?;
        for s in doc["steps"].as_array().into_iter().flatten() {
            if let (Some(step), Some(t)) = (s["step"].as_u64(), s["true_call_ns"].as_i64()) {
                m.insert((rank, step), t);
            }
        }
    }
    Ok(m)
}

/// What scoring one job's instances needs.
struct Ctx<'a> {
    c: &'a Cluster,
    reference: usize,
    hosts: Vec<Option<usize>>,
    /// Every matched call on the raw clocks, by its place.
    raw_calls: BTreeMap<Place, (i64, i64)>,
    /// Each aligned call's place, to find the same call on the raw clocks.
    aligned_places: BTreeMap<(usize, i64), Place>,
    launches: BTreeMap<(usize, i64), KernelOrigin>,
    truth_calls: BTreeMap<(usize, u64), i64>,
    firsts: BTreeMap<u64, String>,
}

/// The samples behind a job's figures.
#[derive(Default)]
struct Samples {
    late_err: Vec<f64>,
    late_vs_calls: Vec<f64>,
    launch_terms: Vec<f64>,
    late_vs_recorded: Vec<f64>,
    skew_err: Vec<f64>,
    bounds: Vec<f64>,
}

fn score_job(
    c: &Cluster,
    out: &Path,
    job: Job,
    inputs: &[PathBuf],
    history: &Path,
) -> anyhow::Result<JobFigures> {
    let run = merge(out, job, inputs, history)?;
    let aligned = collectives(&[run.as_os_str()], false)?;
    let raw_inputs: Vec<&std::ffi::OsStr> = inputs.iter().map(|p| p.as_os_str()).collect();
    let raw = collectives(&raw_inputs, true)?;
    for (name, analysis) in [("aligned", &aligned), ("raw", &raw)] {
        std::fs::write(
            out.join(format!("{job:?}-{name}.json").to_lowercase()),
            serde_json::to_vec_pretty(analysis)?,
        )?;
    }
    let instances: Vec<&Value> = aligned["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let hosts = participant_hosts(&aligned);
    let ctx = Ctx {
        c,
        reference: reference_index(c)?,
        raw_calls: calls_by_place(&raw, &participant_hosts(&raw)),
        aligned_places: calls_by_place(&aligned, &hosts)
            .into_iter()
            .map(|(place, (enter, _))| ((place.0, enter), place))
            .collect(),
        hosts,
        launches: match job {
            Job::Torch => launch_latencies(inputs)?,
            Job::Jax => xla_kernel_origins(inputs)?,
        },
        truth_calls: call_truth(&out.join(format!("{job:?}").to_lowercase()))?,
        firsts: first_instance_per_step(&instances),
    };
    let mut f = JobFigures {
        job: Some(job),
        instances_matched: instances.len(),
        unmatched_by_reason: aligned["summary"]["unmatched_by_reason"].clone(),
        steps_assigned: instances.iter().filter(|i| i["step"].is_u64()).count(),
        violations_aligned: aligned["summary"]["causality_violations"]
            .as_u64()
            .unwrap_or(0),
        violations_raw: raw["summary"]["causality_violations"].as_u64().unwrap_or(0),
        ..JobFigures::default()
    };
    let mut samples = Samples::default();
    for inst in &instances {
        score_instance(&ctx, inst, &mut f, &mut samples);
    }
    f.launch_term_p50_ns = quantile(&samples.launch_terms, 0.5);
    f.launch_term_max_ns = quantile(&samples.launch_terms, 1.0);
    f.lateness_vs_recorded_calls_p50_ns = quantile(&samples.late_vs_recorded, 0.5);
    f.lateness_vs_recorded_calls_max_ns = quantile(&samples.late_vs_recorded, 1.0);
    f.lateness_error_p50_ns = quantile(&samples.late_err, 0.5);
    f.lateness_error_max_ns = quantile(&samples.late_err, 1.0);
    f.lateness_vs_calls_p50_ns = quantile(&samples.late_vs_calls, 0.5);
    f.lateness_vs_calls_max_ns = quantile(&samples.late_vs_calls, 1.0);
    f.skewed_error_max_ns = quantile(&samples.skew_err, 1.0);
    f.skewed_bound_max_ns = quantile(&samples.bounds, 1.0);
    Ok(f)
}

/// One instance: the skewed host's stamps against the truth and, for the
/// first collective of a delayed step, the straggler figures.
fn score_instance(ctx: &Ctx<'_>, inst: &Value, f: &mut JobFigures, s: &mut Samples) {
    let mine = calls(inst, &ctx.hosts);
    let raw_of = |h: usize, e: i64| ctx.raw_calls.get(ctx.aligned_places.get(&(h, e))?);
    let truth: BTreeMap<usize, (i64, i64)> = mine
        .iter()
        .filter_map(|&(h, e, _, _)| {
            let &(re, rx) = raw_of(h, e)?;
            let g = |t| true_global(ctx.c, ctx.reference, true_time(&ctx.c.skews[h], t));
            Some((h, (g(re), g(rx))))
        })
        .collect();
    for &(h, e, x, b) in &mine {
        let (Some(&(te, tx)), true) = (truth.get(&h), h != ctx.reference) else {
            continue;
        };
        let bound = b.unwrap_or(0);
        for err in [e - te, x - tx] {
            f.skewed_events += 1;
            f.skewed_within_bound += usize::from(err.abs() <= bound);
            s.skew_err.push(err.abs() as f64);
            s.bounds.push(bound as f64);
        }
    }
    let Some(step) = inst["step"].as_u64() else {
        return;
    };
    if !(delayed(step) && ctx.firsts.get(&step) == Some(&instance_key(inst))) {
        return;
    }
    f.delayed_instances += 1;
    let last = inst["last"].as_u64().map(|p| p as usize);
    let last_host = last.and_then(|p| ctx.hosts.get(p).copied().flatten());
    f.straggler_last += usize::from(last_host == Some(STRAGGLER));
    let (Some(late), Some(&(ts, _)), Some(&(to, _))) = (
        inst["late_by_ns"].as_i64(),
        truth.get(&STRAGGLER),
        truth.get(&(1 - STRAGGLER)),
    ) else {
        return;
    };
    let err = (late - (ts - to)).abs();
    f.lateness_scored += 1;
    let combined = inst["combined_bound_ns"].as_i64().unwrap_or(0);
    f.lateness_within_combined_bound += usize::from(err <= combined);
    s.late_err.push(err as f64);
    let call = |h: usize| ctx.truth_calls.get(&(h, step));
    if let (Some(cs), Some(co)) = (call(STRAGGLER), call(1 - STRAGGLER)) {
        s.late_vs_calls.push((late - (cs - co)).abs() as f64);
    }
    // The kernel's raw start and where it came from.
    let origin = |h: usize| {
        let &(_, e, _, _) = mine.iter().find(|m| m.0 == h)?;
        let start = raw_of(h, e)?.0;
        Some((start, origin_near(&ctx.launches, h, start)?))
    };
    let (Some((ks, os)), Some((ko, oo))) = (origin(STRAGGLER), origin(1 - STRAGGLER)) else {
        return;
    };
    s.launch_terms
        .push((os.since_launch_ns - oo.since_launch_ns) as f64);
    let recorded_call = |h: usize, start: i64, o: &KernelOrigin| {
        let raw = start - o.since_call_ns?;
        Some(true_global(
            ctx.c,
            ctx.reference,
            true_time(&ctx.c.skews[h], raw),
        ))
    };
    if let (Some(cs), Some(co)) = (
        recorded_call(STRAGGLER, ks, &os),
        recorded_call(1 - STRAGGLER, ko, &oo),
    ) {
        s.late_vs_recorded.push((late - (cs - co)).abs() as f64);
    }
}

/// Where an NCCL kernel came from, on its rank's raw clock.
#[derive(Clone, Copy)]
struct KernelOrigin {
    /// Its start − the runtime or driver call that launched it (same
    /// `correlation`).
    since_launch_ns: i64,
    /// Its start − the rank's call as the framework recorded it (PyTorch:
    /// its `record_param_comms` op, same `External id`; XLA: the host op
    /// around its launch).
    since_call_ns: Option<i64>,
}

/// Per rank (= host index), each NCCL kernel's start (raw epoch ns) and
/// where it came from.
fn launch_latencies(inputs: &[PathBuf]) -> anyhow::Result<BTreeMap<(usize, i64), KernelOrigin>> {
    let mut out = BTreeMap::new();
    for (rank, path) in inputs.iter().enumerate() {
        let doc: Value = serde_json::from_slice(&std::fs::read(path)?)?;
        let base = doc["baseTimeNanoseconds"].as_i64().unwrap_or(0);
        let epoch_ns = |e: &Value| {
            e["ts"]
                .as_f64()
                .map(|us| base + (us * 1000.0).round() as i64)
        };
        let events: Vec<&Value> = doc["traceEvents"]
            .as_array()
            .into_iter()
            .flatten()
            .collect();
        let launch: BTreeMap<i64, i64> = events
            .iter()
            .filter(|e| matches!(e["cat"].as_str(), Some("cuda_runtime" | "cuda_driver")))
            .filter_map(|e| Some((e["args"]["correlation"].as_i64()?, epoch_ns(e)?)))
            .collect();
        let calls: BTreeMap<i64, i64> = events
            .iter()
            .filter(|e| e["name"] == "record_param_comms")
            .filter_map(|e| Some((e["args"]["External id"].as_i64()?, epoch_ns(e)?)))
            .collect();
        for e in events.iter().filter(|e| {
            e["cat"] == "kernel"
                && e["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("ncclDevKernel"))
        }) {
            let (Some(start), Some(corr)) = (epoch_ns(e), e["args"]["correlation"].as_i64()) else {
                continue;
            };
            if let Some(l) = launch.get(&corr) {
                let call = e["args"]["External id"]
                    .as_i64()
                    .and_then(|x| calls.get(&x));
                let origin = KernelOrigin {
                    since_launch_ns: start - l,
                    since_call_ns: call.map(|c| start - c),
                };
                out.insert((rank, start), origin);
            }
        }
    }
    Ok(out)
}

/// Per rank (= host index), each NCCL kernel's start (raw epoch ns) in an
/// XLA trace and where it came from: the host-side launch with the same
/// `correlation_id`, and the op around that launch on the host line — the
/// collective as XLA recorded its call (its thunk, e.g. `psum.7.2`).
fn xla_kernel_origins(inputs: &[PathBuf]) -> anyhow::Result<BTreeMap<(usize, i64), KernelOrigin>> {
    let mut out = BTreeMap::new();
    for (rank, path) in inputs.iter().enumerate() {
        let space = XSpace::decode(std::fs::read(path)?.as_slice())
            .with_context(|| format!("{}: not an xplane file", path.display()))?;
        let start = xla::profile_start(&space)
            .with_context(|| format!("{}: no profile_start_time", path.display()))?;
        let host = xla::host_spans(&space, start);
        for (corr, kernel) in xla::nccl_kernels(&space, start) {
            let Some(launch) = host.iter().find(|s| s.correlation == Some(corr)) else {
                continue;
            };
            // The innermost span around the launch that is not a launch.
            let thunk = host
                .iter()
                .filter(|s| s.correlation.is_none())
                .filter(|s| s.start <= launch.start && s.end >= launch.end)
                .max_by_key(|s| s.start);
            let origin = KernelOrigin {
                since_launch_ns: kernel - launch.start,
                since_call_ns: thunk.map(|t| kernel - t.start),
            };
            out.insert((rank, kernel), origin);
        }
    }
    Ok(out)
}

/// Reading what `xla_kernel_origins` needs from an XSpace.
mod xla {
    use clockmesh_proto::xplane::{XPlane, XSpace, XStat, x_event, x_stat};

    /// A host event: its span (epoch ns) and the CUDA correlation id of a
    /// launch.
    pub struct Span {
        pub start: i64,
        pub end: i64,
        pub correlation: Option<i64>,
    }

    fn stat(p: &XPlane, stats: &[XStat], name: &str) -> Option<i64> {
        let s = stats.iter().find(|s| {
            p.stat_metadata
                .get(&s.metadata_id)
                .is_some_and(|m| m.name == name)
        })?;
        match s.value.as_ref()? {
            x_stat::Value::Int64Value(v) => Some(*v),
            x_stat::Value::Uint64Value(v) => i64::try_from(*v).ok(),
            _ => None,
        }
    }

    pub fn profile_start(space: &XSpace) -> Option<i64> {
        let env = space.planes.iter().find(|p| p.name == "Task Environment")?;
        stat(env, &env.stats, "profile_start_time")
    }

    /// Every event of the planes `keep` accepts: (name, span).
    fn spans<'a>(
        space: &'a XSpace,
        start: i64,
        keep: impl Fn(&str) -> bool + 'a,
    ) -> impl Iterator<Item = (&'a str, Span)> + 'a {
        space
            .planes
            .iter()
            .filter(move |p| keep(&p.name))
            .flat_map(move |p| {
                p.lines.iter().flat_map(move |l| {
                    l.events.iter().filter_map(move |e| {
                        let Some(x_event::Data::OffsetPs(off)) = e.data else {
                            return None;
                        };
                        let begin = start + l.timestamp_ns + off.div_euclid(1000);
                        let span = Span {
                            start: begin,
                            end: begin + e.duration_ps.div_euclid(1000),
                            correlation: stat(p, &e.stats, "correlation_id"),
                        };
                        let name = p.event_metadata.get(&e.metadata_id)?.name.as_str();
                        Some((name, span))
                    })
                })
            })
    }

    pub fn host_spans(space: &XSpace, start: i64) -> Vec<Span> {
        spans(space, start, |n| n == "/host:CPU")
            .map(|(_, s)| s)
            .collect()
    }

    /// (correlation id, start) of each NCCL kernel on the GPU planes.
    pub fn nccl_kernels(space: &XSpace, start: i64) -> Vec<(i64, i64)> {
        spans(space, start, |n| n.starts_with("/device:GPU:"))
            .filter(|(name, _)| name.starts_with("ncclDevKernel"))
            .filter_map(|(_, s)| Some((s.correlation?, s.start)))
            .collect()
    }
}

/// Where rank `h`'s kernel that started at `start` came from (±2 ns: the
/// trace's µs with three decimals, read as a float here).
fn origin_near(
    launches: &BTreeMap<(usize, i64), KernelOrigin>,
    h: usize,
    start: i64,
) -> Option<KernelOrigin> {
    launches
        .range((h, start - 2)..=(h, start + 2))
        .next()
        .map(|(_, o)| *o)
}

/// Per step, the key of its instance that began first (the straggler's
/// sleep delays that one; the step's later collectives queue behind it).
fn first_instance_per_step(instances: &[&Value]) -> BTreeMap<u64, String> {
    let mut first: BTreeMap<u64, (i64, String)> = BTreeMap::new();
    for i in instances {
        let (Some(step), Some(t)) = (i["step"].as_u64(), i["first_enter_ns"].as_i64()) else {
            continue;
        };
        let e = first.entry(step).or_insert((t, instance_key(i)));
        if t < e.0 {
            *e = (t, instance_key(i));
        }
    }
    first.into_iter().map(|(s, (_, k))| (s, k)).collect()
}

fn pct(n: usize, of: usize) -> String {
    if of == 0 {
        return "n/a".into();
    }
    format!("{:.1} %", 100.0 * n as f64 / of as f64)
}

fn ns(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.0} ns"))
}

fn print_figures(figures: &[JobFigures], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(figures)?);
        return Ok(());
    }
    for f in figures {
        let Some(job) = f.job else {
            bail!("a job without a name")
        };
        println!("gpu-e2e {job:?}: n1 37 ms ahead, 20 ppm fast; rank 1 the planted straggler");
        println!(
            "  instances matched {}, unmatched by reason {}",
            f.instances_matched, f.unmatched_by_reason
        );
        println!(
            "  steps assigned: {} of {} ({})",
            f.steps_assigned,
            f.instances_matched,
            pct(f.steps_assigned, f.instances_matched)
        );
        println!(
            "  straggler last in {} of {} delayed instances ({})",
            f.straggler_last,
            f.delayed_instances,
            pct(f.straggler_last, f.delayed_instances)
        );
        println!(
            "  lateness vs GPU-stamp truth: p50 {} max {}, within the combined bound {} of {}; vs true CPU calls p50 {} max {}",
            ns(f.lateness_error_p50_ns),
            ns(f.lateness_error_max_ns),
            f.lateness_within_combined_bound,
            f.lateness_scored,
            ns(f.lateness_vs_calls_p50_ns),
            ns(f.lateness_vs_calls_max_ns),
        );
        if f.launch_term_p50_ns.is_some() {
            println!(
                "  launch term (straggler's launch latency − the other's) p50 {} max {}; vs the calls as recorded (record_param_comms / XLA's host op, skew undone) p50 {} max {}",
                ns(f.launch_term_p50_ns),
                ns(f.launch_term_max_ns),
                ns(f.lateness_vs_recorded_calls_p50_ns),
                ns(f.lateness_vs_recorded_calls_max_ns),
            );
        }
        println!(
            "  skewed host's GPU collective stamps within the host map's bound of the truth: {} of {} ({}), max |error| {}, max bound {}",
            f.skewed_within_bound,
            f.skewed_events,
            pct(f.skewed_within_bound, f.skewed_events),
            ns(f.skewed_error_max_ns),
            ns(f.skewed_bound_max_ns),
        );
        println!(
            "  causality violations: aligned {}, --no-align {}",
            f.violations_aligned, f.violations_raw
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a real JAX GPU trace every NCCL kernel is traced back to its
    /// launch and to the collective op that made it, in that order.
    #[test]
    fn xla_kernels_are_traced_to_their_launch_and_op() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../trace/tests/data/gpu/jax/process1.vm.xplane.pb");
        let origins = xla_kernel_origins(&[fixture]).unwrap();
        // Process 1 traced steps 4–8: an all-reduce and an all-gather each.
        assert_eq!(origins.len(), 10);
        for o in origins.values() {
            let call = o.since_call_ns.expect("each launch sits in its op");
            let launch = o.since_launch_ns;
            assert!(0 < launch && launch < call, "{launch}, {call}");
            // A kernel not queued behind another was made by its op, not by
            // the step around it (hundreds of µs earlier).
            if launch < 1_000_000 {
                assert!(call < 200_000, "{launch}, {call}");
            }
        }
    }
}
