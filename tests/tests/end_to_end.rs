//! End to end, as a user runs it, against a known truth: two netns hosts,
//! each running an agent at the shipped defaults with a clock really skewed
//! (`--inject-skew`: host n1 123 ms ahead and 50 ppm fast) and a real JAX
//! program whose CLOCK_REALTIME the skew shim skews exactly as its agent's,
//! traced for 11 s with `clockmesh.jax_profiler`; then `clockmesh trace
//! merge` of both hosts' traces, with the agents' history and with only the
//! hook's start and stop records. Every traced step must land within its
//! stated bound of its true global time, checked two ways: against the true
//! times the program read around each step (a raw syscall the shim does not
//! see), and exactly, by undoing the injected skew on the step's own stamp.
//!
//! Needs root, and a Python with jax and the clockmesh package
//! (`CLOCKMESH_PYTHON`, default `target/pyvenv/bin/python`, which
//! `python/test.sh` makes): `tests/end_to_end.sh` runs it, as part of
//! `cargo xtask test`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use clockmesh_proto::prost::Message;
use clockmesh_proto::xplane::{XPlane, XSpace, x_event, x_stat};
use clockmesh_testbed::cluster::{
    Backend, Cluster, ClusterConfig, agent_binary, true_time, wait_at_most,
};
use clockmesh_testbed::netns::HOST_IFACE;
use clockmesh_testbed::{root_or_skip, shim};
use nix::sys::signal::Signal;

const SESSION_S: &str = "11";
/// n1: 123 ms ahead, 50 ppm fast (the issue's case); n0 runs true.
const SKEWS: [(i64, f64); 2] = [(0, 0.0), (123_000_000, 50_000.0)];

fn python() -> PathBuf {
    let p = std::env::var_os("CLOCKMESH_PYTHON").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/pyvenv/bin/python"),
        PathBuf::from,
    );
    assert!(
        p.exists(),
        "{}: no Python with jax; run python/test.sh first (tests/end_to_end.sh does)",
        p.display()
    );
    p
}

/// Starts the hosts' agents at the shipped defaults (100 ms pairs, 4 s
/// windows) and waits until every one publishes offsets.
fn cluster(cfg: ClusterConfig) -> Cluster {
    let mut c = Cluster::start(ClusterConfig {
        cadence_us: 100_000,
        window_s: 4,
        ..cfg
    })
    .unwrap();
    let n = c.cfg.nodes;
    c.wait_for(Duration::from_secs(90), "every node's offsets", |c| {
        (0..n).all(|i| c.node_lines(i).len() >= 3)
    })
    .unwrap();
    c
}

/// A traced program on one host: (host index, output directory, process).
type Running = Vec<(usize, PathBuf, std::process::Child)>;

/// The workloads each host runs at once.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Workload {
    Jax,
    Torch,
    /// One distributed JAX job across the hosts (`e2e/jax_job.py`).
    JaxJob,
    /// One distributed PyTorch job across the hosts (`e2e/torch_job.py`).
    TorchJob,
}

impl Workload {
    fn is_xla(self) -> bool {
        matches!(self, Self::Jax | Self::JaxJob)
    }
}

const TORCH_PORT: u16 = 29_600;
const TORCH_JOB_PORT: u16 = 29_610;
const JAX_JOB_PORT: u16 = 29_620;
/// Steps of each distributed job: ≥ 500 collective instances in all.
const JOB_STEPS: &str = "150";
/// The rank (host index) that waits a known delay before each step.
const STRAGGLER: usize = 2;

/// Starts `workload` on `hosts` at once, each under its host's skew and
/// host name (torch: rank k on `hosts[k]`, rendezvous at the first).
fn start(c: &Cluster, out: &Path, workload: Workload, hosts: &[usize]) -> Running {
    std::fs::create_dir_all(out).unwrap();
    let shim = shim::build(out).unwrap();
    let e2e = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e");
    hosts
        .iter()
        .enumerate()
        .map(|(rank, &i)| {
            let name = Cluster::name(i);
            let dir = out.join(format!("{workload:?}-{name}").to_lowercase());
            std::fs::create_dir_all(&dir).unwrap();
            let offsets = c.node_dir(i).join("offsets");
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", &c.bed.host(i).netns])
                .args(["unshare", "--uts", "sh", "-c"])
                .arg(r#"hostname "$0" && exec env LD_PRELOAD="$CM_SHIM" "$@""#)
                .arg(&name)
                .arg(python());
            match workload {
                Workload::Jax => cmd
                    .arg(e2e.join("jax_host.py"))
                    .arg(&dir)
                    .arg(SESSION_S)
                    .arg(&offsets),
                Workload::Torch => cmd
                    .arg(e2e.join("torch_host.py"))
                    .arg(rank.to_string())
                    .arg(hosts.len().to_string())
                    .arg(c.bed.host(hosts[0]).addr.to_string())
                    .arg(TORCH_PORT.to_string())
                    .arg(SESSION_S)
                    .arg(&offsets)
                    .arg(&name)
                    .arg(&dir),
                Workload::JaxJob => cmd
                    .arg(e2e.join("jax_job.py"))
                    .arg(rank.to_string())
                    .arg(hosts.len().to_string())
                    .arg(c.bed.host(hosts[0]).addr.to_string())
                    .arg(JAX_JOB_PORT.to_string())
                    .arg(JOB_STEPS)
                    .arg(STRAGGLER.to_string())
                    .arg(&offsets)
                    .arg(&dir),
                Workload::TorchJob => cmd
                    .arg(e2e.join("torch_job.py"))
                    .arg(rank.to_string())
                    .arg(hosts.len().to_string())
                    .arg(c.bed.host(hosts[0]).addr.to_string())
                    .arg(TORCH_JOB_PORT.to_string())
                    .arg(JOB_STEPS)
                    .arg(STRAGGLER.to_string())
                    .arg(&offsets)
                    .arg(&name)
                    .arg(&dir),
            };
            let child = cmd
                .env("PYTHONPATH", &e2e)
                .env("GLOO_SOCKET_IFNAME", HOST_IFACE)
                .env("CM_SHIM", &shim)
                .env("CLOCKMESH_SKEW", shim::spec(&c.skews[i]))
                .env("JAX_PLATFORMS", "cpu")
                .env("TF_CPP_MIN_LOG_LEVEL", "2")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
                .spawn()
                .unwrap();
            (i, dir, child)
        })
        .collect()
}

/// A finished traced program: its host, trace file and the true times it read.
struct Traced {
    host: usize,
    workload: Workload,
    trace: PathBuf,
    markers: PathBuf,
}

/// Waits for the programs.
fn wait(running: Running, workload: Workload) -> Vec<Traced> {
    running
        .into_iter()
        .map(|(host, dir, mut child)| {
            let status = wait_at_most(&mut child, Duration::from_secs(180)).unwrap();
            assert!(
                status.is_some_and(|s| s.success()),
                "{}: {status:?}: {}",
                dir.display(),
                std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default()
            );
            let name = Cluster::name(host);
            let trace = match workload {
                Workload::Jax | Workload::JaxJob => std::fs::read_dir(dir.join("plugins/profile"))
                    .unwrap()
                    .next()
                    .unwrap()
                    .unwrap()
                    .path()
                    .join(format!("{name}.xplane.pb")),
                Workload::Torch | Workload::TorchJob => dir.join(format!("{name}.pt.trace.json")),
            };
            Traced {
                host,
                workload,
                trace,
                markers: dir.join("markers.json"),
            }
        })
        .collect()
}

/// `clockmesh trace merge` as a user runs it; returns the run directory.
fn merge(inputs: &[PathBuf], out: &Path, run: &str, extra: &[&str]) -> PathBuf {
    let o = Command::new(agent_binary().unwrap())
        .args(["trace", "merge"])
        .args(inputs)
        .arg("-o")
        .arg(out)
        .args(["--run", run])
        .args(extra)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!("merge {run}:\n{text}");
    out.join("plugins/profile").join(run)
}

/// Every agent's JSONL in one history file.
fn history(c: &Cluster, out: &Path) -> PathBuf {
    let p = out.join("history.jsonl");
    let all: String = (0..c.cfg.nodes)
        .map(|i| std::fs::read_to_string(c.node_dir(i).join("clockmesh.jsonl")).unwrap())
        .collect();
    std::fs::write(&p, all).unwrap();
    p
}

fn decode(p: &Path) -> XSpace {
    XSpace::decode(std::fs::read(p).unwrap().as_slice()).unwrap()
}

fn plane<'a>(s: &'a XSpace, name: &str) -> &'a XPlane {
    s.planes.iter().find(|p| p.name == name).unwrap()
}

fn stat(p: &XPlane, name: &str) -> Option<i64> {
    let id = p.stat_metadata.values().find(|m| m.name == name)?.id;
    p.stats
        .iter()
        .find(|s| s.metadata_id == id)
        .and_then(|s| match s.value {
            Some(x_stat::Value::Uint64Value(v)) => Some(v as i64),
            Some(x_stat::Value::Int64Value(v)) => Some(v),
            _ => None,
        })
}

/// Every `cm_marker_*` event of an xprof trace: (name, start ps, end ps),
/// absolute (session start + line timestamp + offset), in trace order.
fn xplane_markers(space: &XSpace) -> Vec<(String, i128, i128)> {
    let start = stat(plane(space, "Task Environment"), "profile_start_time").unwrap();
    let mut out = Vec::new();
    for p in &space.planes {
        for line in &p.lines {
            let base = (i128::from(start) + i128::from(line.timestamp_ns)) * 1000;
            for ev in &line.events {
                let Some(m) = p.event_metadata.get(&ev.metadata_id) else {
                    continue;
                };
                let Some(x_event::Data::OffsetPs(off)) = ev.data else {
                    continue;
                };
                if m.name.starts_with("cm_marker_") {
                    let s = base + i128::from(off);
                    out.push((m.name.clone(), s, s + i128::from(ev.duration_ps)));
                }
            }
        }
    }
    out
}

/// The same for a PyTorch (Kineto JSON) trace: base + ts, in µs with ns digits.
fn torch_markers(doc: &serde_json::Value) -> Vec<(String, i128, i128)> {
    let base = i128::from(doc["baseTimeNanoseconds"].as_i64().unwrap());
    let ns = |us: f64| {
        let whole = us.trunc();
        i128::from(whole as i64) * 1000 + ((us - whole) * 1000.0).round() as i128
    };
    doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["ph"] == "X"
                && e["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("cm_marker_"))
        })
        .map(|e| {
            let s = base + ns(e["ts"].as_f64().unwrap());
            let d = ns(e["dur"].as_f64().unwrap());
            (
                e["name"].as_str().unwrap().to_string(),
                s * 1000,
                (s + d) * 1000,
            )
        })
        .collect()
}

/// A trace's markers and, for a merged one, its stated worst bound.
fn read_markers(path: &Path, workload: Workload) -> (Vec<(String, i128, i128)>, Option<i64>) {
    if workload.is_xla() {
        let space = decode(path);
        let bound = space
            .planes
            .iter()
            .find(|p| p.name == "/host:CPU")
            .and_then(|p| stat(p, "clock_alignment_bound_ns"));
        (xplane_markers(&space), bound)
    } else {
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let bound = doc["clockmesh"]["alignment_bound_ns"].as_i64();
        (torch_markers(&doc), bound)
    }
}

/// How one merged host compares with the truth.
#[derive(Debug, Default)]
struct Score {
    markers: usize,
    /// Largest |placed − true global| over every marker start and end,
    /// the truth from the marker's own stamp with the skew undone.
    worst_exact_ns: f64,
    /// Largest distance by which a marker was placed outside the true
    /// times read around it (0 when every one is inside).
    worst_outside_ns: f64,
    /// The merge's stated bound for the host's events.
    bound_ns: i64,
}

/// Scores one traced program in a merged run against the truth: the
/// global timeline is reference `r`'s clock.
fn score(c: &Cluster, t: &Traced, r: usize, run: &Path) -> Score {
    let i = t.host;
    let (input, _) = read_markers(&t.trace, t.workload);
    let (merged, bound) = read_markers(&run.join(t.trace.file_name().unwrap()), t.workload);
    let told: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&t.markers).unwrap()).unwrap();
    assert_eq!(input.len(), merged.len());
    assert!(
        merged.len() >= 50,
        "{}: {} markers",
        t.trace.display(),
        merged.len()
    );
    // In ps, as i128: epoch ps in f64 would round to 262 ns.
    let global_ps = |t: i64| i128::from(t + c.skews[r].at(t)) * 1000;
    let mut s = Score {
        bound_ns: bound.expect("the merge states the bound"),
        ..Score::default()
    };
    for ((name, ls, le), (mname, gs, ge)) in input.iter().zip(&merged) {
        assert_eq!(name, mname);
        s.markers += 1;
        for (local_ps, placed_ps) in [(ls, gs), (le, ge)] {
            let local = local_ps.div_euclid(1000) as i64;
            let truth = global_ps(true_time(&c.skews[i], local)) + local_ps.rem_euclid(1000);
            let err = (placed_ps - truth).abs() as f64 / 1e3;
            s.worst_exact_ns = s.worst_exact_ns.max(err);
        }
        let m = told.iter().find(|m| m["name"] == name.as_str()).unwrap();
        let (before, after) = (
            global_ps(m["true_before_ns"].as_i64().unwrap()),
            global_ps(m["true_after_ns"].as_i64().unwrap()),
        );
        let outside = (before - gs).max(ge - after).max(0) as f64 / 1e3;
        s.worst_outside_ns = s.worst_outside_ns.max(outside);
    }
    s
}

/// The node whose clock the global timeline started from.
fn first_reference(c: &Cluster) -> usize {
    let name = (0..c.cfg.nodes)
        .flat_map(|i| c.node_lines(i))
        .min_by_key(|l| l.anchor_ns)
        .and_then(|l| l.reference)
        .expect("a reference");
    (0..c.cfg.nodes)
        .find(|&i| Cluster::name(i) == name)
        .unwrap()
}

/// Merges every trace with the history and with the helpers' records
/// only; every marker must be within its stated bound of its true time on
/// reference `r`'s timeline. Returns the scores.
fn merge_and_score(c: &Cluster, r: usize, traced: &[Traced], out: &Path) -> Vec<Score> {
    let hist = history(c, out);
    let inputs: Vec<PathBuf> = traced.iter().map(|t| t.trace.clone()).collect();
    let with_history = merge(
        &inputs,
        out,
        "history",
        &["--history", hist.to_str().unwrap()],
    );
    let hook_only = merge(&inputs, out, "hook", &[]);
    let mut scores = Vec::new();
    for t in traced {
        for (how, run) in [("history", &with_history), ("hook records", &hook_only)] {
            let s = score(c, t, r, run);
            let what = format!(
                "{} {:?} via {how}: {s:?}",
                Cluster::name(t.host),
                t.workload
            );
            eprintln!("{what}");
            assert!(s.worst_exact_ns <= s.bound_ns as f64, "{what}");
            assert!(s.worst_outside_ns <= s.bound_ns as f64, "{what}");
            scores.push(s);
        }
    }
    scores
}

/// Runs JAX and PyTorch on `hosts` at once; `during` runs meanwhile.
fn trace_hosts(c: &mut Cluster, hosts: &[usize], during: impl FnOnce(&mut Cluster)) -> Vec<Traced> {
    let out = c.dir.join("e2e");
    let jax = start(c, &out, Workload::Jax, hosts);
    let torch = start(c, &out, Workload::Torch, hosts);
    during(c);
    let mut traced = wait(jax, Workload::Jax);
    traced.extend(wait(torch, Workload::Torch));
    traced
}

#[test]
#[ignore = "needs a Python with jax and torch: tests/end_to_end.sh (cargo xtask test) runs it"]
fn traces_of_skewed_hosts_land_within_their_bounds() {
    if !root_or_skip("end_to_end") {
        return;
    }
    let mut c = cluster(ClusterConfig {
        nodes: 2,
        backend: Backend::Static,
        direct_pair: true,
        skews: SKEWS.to_vec(),
        ..ClusterConfig::default()
    });
    let traced = trace_hosts(&mut c, &[0, 1], |_| {});
    // Two more windows, so the history covers the sessions' end.
    std::thread::sleep(Duration::from_secs(8));
    let out = c.dir.join("e2e");
    let scores = merge_and_score(&c, first_reference(&c), &traced, &out);
    // The goal: ≤ 1 µs through the history for the skewed host, JAX and
    // PyTorch (one offset per host would be 550 µs off at the end).
    for (t, pair) in traced.iter().zip(scores.chunks(2)) {
        let via_history = &pair[0];
        assert!(
            via_history.worst_exact_ns <= 1_000.0,
            "{:?}: {via_history:?}",
            t.workload
        );
    }
}

#[test]
#[ignore = "needs a Python with jax and torch: tests/end_to_end.sh (cargo xtask test) runs it"]
fn a_leader_killed_during_the_session_leaves_every_event_within_its_bound() {
    if !root_or_skip("end_to_end_leader_kill") {
        return;
    }
    let mut c = cluster(ClusterConfig {
        nodes: 3,
        backend: Backend::Etcd,
        skews: vec![SKEWS[0], SKEWS[1], (-40_000_000, -20_000.0)],
        ..ClusterConfig::default()
    });
    let leader = c.status(0).unwrap().leader.expect("a leader");
    let l: usize = leader.trim_start_matches('n').parse().unwrap();
    let r = first_reference(&c);
    let traced = trace_hosts(&mut c, &[l, (l + 1) % 3], |c| {
        std::thread::sleep(Duration::from_secs(6));
        c.stop_agent(l, Signal::SIGKILL).unwrap();
    });
    c.wait_for(Duration::from_secs(60), "the new leader's hand-over", |c| {
        (0..3).any(|i| i != l && c.hand_over_step(i, l).is_some())
    })
    .unwrap();
    std::thread::sleep(Duration::from_secs(8));
    let out = c.dir.join("e2e");
    let scores = merge_and_score(&c, r, &traced, &out);
    let new = (0..3)
        .find(|&i| i != l && c.hand_over_step(i, l).is_some())
        .unwrap();
    eprintln!(
        "leader n{l} killed; n{new} took over: {:?}",
        c.hand_overs(new)
            .into_iter()
            .filter(|h| h.is_hand_over())
            .collect::<Vec<_>>()
    );
    assert_eq!(scores.len(), 8);
}

/// `clockmesh trace collectives --json` as a user runs it: the exit code
/// and the analysis.
fn collectives(inputs: &[PathBuf], extra: &[&str]) -> (Option<i32>, serde_json::Value) {
    let o = Command::new(agent_binary().unwrap())
        .args(["trace", "collectives", "--json"])
        .args(inputs)
        .args(extra)
        .output()
        .unwrap();
    let doc = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "trace collectives {extra:?}: {e}: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    (o.status.code(), doc)
}

/// Holistic Trace Analysis loads the merged PyTorch ranks as one run: all
/// three ranks, as many steps per rank as it finds in the unmerged traces
/// (HTA drops each rank's last ProfilerStep either way), and its
/// comm/comp overlap per rank.
fn check_hta(merged: &[PathBuf], unmerged: &[PathBuf], dir: &Path) {
    let merged = hta(merged, &dir.join("merged"));
    let unmerged = hta(unmerged, &dir.join("unmerged"));
    eprintln!("HTA merged: {merged}\nHTA unmerged: {unmerged}");
    assert_eq!(merged["ranks"], serde_json::json!([0, 1, 2]));
    assert_eq!(merged["overlap_ranks"], serde_json::json!([0, 1, 2]));
    assert_eq!(merged["steps"], unmerged["steps"], "the merge lost steps");
    let least = JOB_STEPS.parse::<u64>().unwrap() - 1;
    for rank in ["0", "1", "2"] {
        let n = merged["steps"][rank].as_u64().unwrap_or(0);
        assert!(n >= least, "rank {rank}: {n} steps: {merged}");
    }
}

/// What tests/e2e/hta_check.py prints for the `traces` (copied into `dir`).
fn hta(traces: &[PathBuf], dir: &Path) -> serde_json::Value {
    std::fs::create_dir_all(dir).unwrap();
    for p in traces {
        std::fs::copy(p, dir.join(p.file_name().unwrap())).unwrap();
    }
    let o = Command::new(python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/hta_check.py"))
        .arg(dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // HTA may log to stdout too: the report is the last line.
    let stdout = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap()
}

/// The merged Chrome JSON links every XLA instance across its ranks: one
/// flow per instance, each point inside its rank's call (same process and
/// thread), ending on the host the analysis names as the last arriver; and
/// every process is labelled with its host's offset, drift and bound.
fn check_perfetto_flows(json: &Path, aligned: &serde_json::Value) {
    use std::collections::{BTreeMap, HashMap};
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let us = |e: &serde_json::Value, k: &str| e[k].as_f64().unwrap_or(0.0);
    let mut slices: HashMap<(u64, i64), Vec<(f64, f64)>> = HashMap::new();
    let mut process_host: HashMap<u64, String> = HashMap::new();
    let mut labelled = 0;
    let mut critical_named = false;
    let mut flows: BTreeMap<u64, Vec<&serde_json::Value>> = BTreeMap::new();
    for e in events {
        let pid = e["pid"].as_u64().unwrap_or(0);
        match (
            e["ph"].as_str().unwrap_or(""),
            e["name"].as_str().unwrap_or(""),
        ) {
            ("X", _) => slices
                .entry((pid, e["tid"].as_i64().unwrap_or(0)))
                .or_default()
                .push((us(e, "ts"), us(e, "ts") + us(e, "dur"))),
            // The critical paths' own process (pid 1) is no host's.
            ("M", "process_name") if pid == 1 => critical_named = true,
            ("M", "process_name") => {
                let name = e["args"]["name"].as_str().unwrap();
                process_host.insert(pid, name.split(' ').next().unwrap().to_string());
            }
            ("M", "process_labels") => {
                let l = e["args"]["labels"].as_str().unwrap();
                assert!(
                    l.contains("offset") && l.contains("drift") && l.contains("bound ±"),
                    "{l}"
                );
                labelled += 1;
            }
            ("s" | "t" | "f", _) => flows.entry(e["id"].as_u64().unwrap()).or_default().push(e),
            _ => {}
        }
    }
    assert_eq!(labelled, process_host.len(), "every process labelled");
    // Written only with steps, then with every step's segments.
    assert_eq!(critical_named, slices.keys().any(|&(p, _)| p == 1));
    // Every matched instance, XLA and PyTorch alike, has its flow.
    let last_of: HashMap<String, String> = aligned["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let k = &i["key"];
            let key = format!(
                "{}/{}#{}",
                k["group"].as_str().unwrap(),
                k["name"].as_str().unwrap(),
                k["ordinal"]
            );
            let last = i["last"].as_u64().unwrap() as usize;
            (
                key,
                aligned["participants"][last]["host"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(flows.len(), last_of.len(), "one flow per instance");
    for points in flows.values() {
        let phases: String = points.iter().map(|p| p["ph"].as_str().unwrap()).collect();
        assert_eq!(phases, "stf", "three ranks, in arrival order: {points:?}");
        for p in points {
            let key = (p["pid"].as_u64().unwrap(), p["tid"].as_i64().unwrap());
            let ts = us(p, "ts");
            let inside = slices[&key].iter().any(|&(s, e)| s <= ts && ts <= e);
            assert!(inside, "flow point outside every call of its thread: {p}");
        }
        let last_host = &process_host[&points[2]["pid"].as_u64().unwrap()];
        let instance = points[0]["args"]["instance"].as_str().unwrap();
        assert_eq!(&last_of[instance], last_host, "{instance}");
        assert_eq!(
            points[0]["args"]["last_arriver"].as_str(),
            Some(last_host.as_str())
        );
    }
    eprintln!(
        "perfetto: {} flows, {} labelled processes",
        flows.len(),
        labelled
    );
}

/// An instance's identity, the same in every analysis of the same traces.
fn instance_id(i: &serde_json::Value) -> String {
    format!("{}/{}", i["framework"], i["key"])
}

/// The host of each participant of an analysis.
fn participant_hosts(a: &serde_json::Value) -> Vec<String> {
    a["participants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["host"].as_str().unwrap().to_string())
        .collect()
}

/// How the aligned analysis of one framework's job compares with the truth.
#[derive(Debug, Default)]
struct JobScore {
    matched: u64,
    unmatched: u64,
    /// Instances whose true last arrival beat the second by more than the
    /// combined bound, and of those, how many the analysis named right.
    decided: u64,
    last_right: u64,
    /// The straggler's delayed collectives (each step's all-reduce), and
    /// how often it truly arrived last at them.
    delayed: u64,
    straggler_last: u64,
    /// Largest |stated lateness − true lateness| and the largest share of
    /// the combined bound it used.
    worst_late_err_ns: i64,
    worst_late_err_share: f64,
}

/// Scores the aligned analysis against the truth: each rank's enter, read
/// on its raw host clock by the `--no-align` analysis of the inputs, with
/// the injected skew undone and put on reference `r`'s timeline.
fn score_job(
    c: &Cluster,
    r: usize,
    aligned: &serde_json::Value,
    raw: &serde_json::Value,
) -> Vec<(String, JobScore)> {
    let raw_by_id: std::collections::HashMap<String, &serde_json::Value> = raw["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (instance_id(i), i))
        .collect();
    let (hosts, raw_hosts) = (participant_hosts(aligned), participant_hosts(raw));
    let node = |h: &str| (0..c.cfg.nodes).find(|&i| Cluster::name(i) == h).unwrap();
    let true_global = |i: usize, local: i64| {
        let t = true_time(&c.skews[i], local);
        t + c.skews[r].at(t)
    };
    let mut scores: std::collections::BTreeMap<String, JobScore> = Default::default();
    for a in aligned["instances"].as_array().unwrap() {
        let s = scores
            .entry(a["framework"].as_str().unwrap().to_string())
            .or_default();
        s.matched += 1;
        let Some(raw_i) = raw_by_id.get(&instance_id(a)) else {
            continue;
        };
        let mut truth: Vec<(i64, String)> = raw_i["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|rc| {
                let h = &raw_hosts[rc["participant"].as_u64().unwrap() as usize];
                (
                    true_global(node(h), rc["enter_ns"].as_i64().unwrap()),
                    h.clone(),
                )
            })
            .collect();
        truth.sort();
        let (last, second) = (&truth[truth.len() - 1], &truth[truth.len() - 2]);
        let true_late = last.0 - second.0;
        let bound = a["combined_bound_ns"].as_i64().unwrap();
        let stated_last = &hosts[a["last"].as_u64().unwrap() as usize];
        let err = (a["late_by_ns"].as_i64().unwrap() - true_late).abs();
        s.worst_late_err_ns = s.worst_late_err_ns.max(err);
        s.worst_late_err_share = s.worst_late_err_share.max(err as f64 / bound.max(1) as f64);
        if true_late > bound {
            s.decided += 1;
            s.last_right += u64::from(*stated_last == last.1);
        }
        if a["kind"] == "all_reduce" {
            s.delayed += 1;
            s.straggler_last += u64::from(last.1 == Cluster::name(STRAGGLER));
        }
    }
    for u in aligned["unmatched"].as_array().unwrap() {
        scores
            .entry(u["framework"].as_str().unwrap().to_string())
            .or_default()
            .unmatched += 1;
    }
    scores.into_iter().collect()
}

/// The issue's case: one distributed JAX job and one distributed PyTorch
/// job across three hosts, each host's clock skewed its own way (n1 123
/// ms ahead and 50 ppm fast, n2 40 ms behind and 20 ppm slow), rank 2
/// delaying each step by a known 1–4 ms. `clockmesh trace collectives`
/// over the merged run must name the true last arriver wherever the truth
/// is decided beyond the bounds, state every lateness within 1 µs and
/// within the combined bound of the truth, find no causality violation
/// (`--strict` exits 0), and rank n2 first; over the raw inputs
/// (`--no-align`) the same check must flag violations and blame n1's clock.
#[test]
#[ignore = "needs a Python with jax and torch: tests/end_to_end.sh (cargo xtask test) runs it"]
fn a_distributed_job_s_straggler_is_found_and_its_collectives_line_up() {
    if !root_or_skip("end_to_end_distributed_job") {
        return;
    }
    let c = cluster(ClusterConfig {
        nodes: 3,
        backend: Backend::Static,
        skews: vec![SKEWS[0], SKEWS[1], (-40_000_000, -20_000.0)],
        ..ClusterConfig::default()
    });
    let r = first_reference(&c);
    let out = c.dir.join("job");
    let hosts = [0, 1, 2];
    // One job at a time: two jobs on two cores would make every rank a
    // straggler by turns.
    let mut traced = wait(start(&c, &out, Workload::JaxJob, &hosts), Workload::JaxJob);
    traced.extend(wait(
        start(&c, &out, Workload::TorchJob, &hosts),
        Workload::TorchJob,
    ));
    // Two more windows, so the history covers the sessions' end.
    std::thread::sleep(Duration::from_secs(8));
    let hist = history(&c, &out);
    let inputs: Vec<PathBuf> = traced.iter().map(|t| t.trace.clone()).collect();
    let perfetto = out.join("job.perfetto.json");
    let run = merge(
        &inputs,
        &out,
        "job",
        &[
            "--history",
            hist.to_str().unwrap(),
            "--perfetto",
            perfetto.to_str().unwrap(),
        ],
    );
    let (code, aligned) = collectives(std::slice::from_ref(&run), &["--strict"]);
    check_perfetto_flows(&perfetto, &aligned);
    let (raw_code, raw) = collectives(&inputs, &["--no-align", "--strict"]);
    // Per-host inputs with the history give the same analysis as the merged run.
    let (_, in_memory) = collectives(&inputs, &["--history", hist.to_str().unwrap()]);
    eprintln!("aligned: {}", aligned["summary"]);
    eprintln!("raw: {}", raw["summary"]);
    assert_eq!(aligned["summary"], in_memory["summary"]);
    assert_eq!(code, Some(0), "aligned: {}", aligned["violations"]);
    assert_eq!(aligned["summary"]["causality_violations"], 0);
    assert!(aligned["summary"]["matched"].as_u64().unwrap() >= 500);
    assert_eq!(
        raw_code,
        Some(3),
        "raw clocks 100+ ms apart must violate causality"
    );
    assert!(raw["summary"]["causality_violations"].as_u64().unwrap() >= 100);
    let top = |a: &serde_json::Value| a["hosts"][0]["host"].as_str().unwrap().to_string();
    assert_eq!(top(&aligned), Cluster::name(STRAGGLER));
    assert_eq!(
        top(&raw),
        Cluster::name(1),
        "raw clocks blame the clock that runs ahead"
    );
    let torch_traces = |dir: &Path| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(".pt.trace.json"))
            .collect();
        v.sort();
        v
    };
    let unmerged: Vec<PathBuf> = inputs
        .iter()
        .filter(|p| p.to_string_lossy().ends_with(".pt.trace.json"))
        .cloned()
        .collect();
    check_hta(&torch_traces(&run), &unmerged, &out.join("hta"));
    for (framework, s) in score_job(&c, r, &aligned, &raw) {
        eprintln!("{framework}: {s:?}");
        assert!(
            s.matched >= 250 && s.unmatched * 20 <= s.matched,
            "{framework}: {s:?}"
        );
        assert_eq!(s.last_right, s.decided, "{framework}: {s:?}");
        assert!(
            s.worst_late_err_ns <= 1_000 && s.worst_late_err_share <= 1.0,
            "{framework}: {s:?}"
        );
        // The designed delay decides most steps; scheduling noise on two
        // shared cores decides the rest (the truth says which, and the
        // analysis must agree with it everywhere: `last_right` above).
        assert!(s.straggler_last * 10 >= s.delayed * 6, "{framework}: {s:?}");
    }
}
