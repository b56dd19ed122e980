//! The real GPU traces of `tests/data/gpu/` (see its README): PyTorch 2.11
//! NCCL (2 ranks) and JAX 0.11 GPU (2 processes on one host), profiler
//! windows that differ per rank (torch: rank 0 steps 2–7, rank 1 steps
//! 4–9; JAX: 2–6 and 4–8), rank/process 1 sleeping 20 ms before steps 5
//! and 6. Both processes of each job ran on one host, so their raw clocks
//! are the truth.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod common;

use clockmesh_trace::collectives::{
    Analysis, AnalysisOptions, CollectiveCall, CollectiveKind, MatchedBy, Participant, analyse,
    inputs,
};
use clockmesh_trace::{MergeOptions, merge};

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gpu")
        .join(rel)
}

fn raw(participants: &[Participant], calls: Vec<CollectiveCall>) -> Analysis {
    let opts = AnalysisOptions {
        aligned: false,
        ..Default::default()
    };
    analyse(participants, calls, &opts)
}

/// The instances of `kind` in `steps`: (step, last arriver's rank, late by).
fn lateness(a: &Analysis, kind: CollectiveKind) -> Vec<(Option<u64>, Option<u64>, u64)> {
    a.instances
        .iter()
        .filter(|i| i.kind == kind)
        .map(|i| (i.step, a.participants[i.last].rank, i.late_by_ns))
        .collect()
}

const MS: u64 = 1_000_000;

/// Rank 1 is last, by more than its 20 ms sleep less 1 ms, in steps 5
/// and 6 and nowhere by as much.
fn straggler_is_rank_1_in_steps_5_and_6(a: &Analysis, kind: CollectiveKind, rank_1: Option<u64>) {
    let late = lateness(a, kind);
    for (step, last, by) in &late {
        if matches!(step, Some(5 | 6)) {
            assert_eq!(*last, rank_1, "step {step:?}");
            assert!(*by > 19 * MS, "step {step:?}: {by} ns");
        }
    }
    assert_eq!(
        late.iter().filter(|l| matches!(l.0, Some(5 | 6))).count(),
        2
    );
}

#[test]
fn real_nccl_ranks_whose_windows_differ_are_matched_by_step_and_order() {
    let files = [
        data("torch/rank0.pt.trace.json"),
        data("torch/rank1.pt.trace.json"),
    ];
    let job = inputs::read_job(&files, false).unwrap();
    // Every call is an NCCL kernel, and every one has its step (from the
    // CPU op that launched it: the kernels run after their step's span).
    assert!(job.calls.iter().all(|c| c.op.starts_with("ncclDevKernel")));
    assert!(job.calls.iter().all(|c| c.step.is_some()));
    assert_eq!(job.calls.len(), 2 * (6 * 2 + 2));
    let groups: std::collections::BTreeSet<&str> =
        job.calls.iter().map(|c| &*c.key.group).collect();
    assert_eq!(groups, ["0", "1"].into());
    let a = raw(&job.participants, job.calls.clone());
    assert_eq!(a.summary.causality_violations, 0);
    // Steps 4–7 on both: all_reduce and all_gather each, a broadcast in 6.
    assert_eq!(a.summary.matched, 4 * 2 + 1);
    assert_eq!(
        a.summary.unmatched,
        a.summary.unmatched_by_reason.missing_ranks
    );
    assert!(
        a.instances
            .iter()
            .all(|i| i.matched_by == MatchedBy::Occurrence)
    );
    let steps: std::collections::BTreeSet<u64> =
        a.instances.iter().filter_map(|i| i.step).collect();
    assert_eq!(steps, [4, 5, 6, 7].into());
    straggler_is_rank_1_in_steps_5_and_6(&a, CollectiveKind::AllReduce, Some(1));
    // Paired n-th with n-th, as before: false violations.
    let mut naive = job.calls;
    for c in &mut naive {
        c.matched_by = MatchedBy::Sequence;
    }
    assert!(raw(&job.participants, naive).summary.causality_violations > 0);
}

fn copy_as(from: &str, dir: &Path, name: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let to = dir.join(name);
    std::fs::copy(data(from), &to).unwrap();
    to
}

#[test]
fn real_jax_processes_of_one_host_merge_and_match() {
    let dir = std::env::temp_dir().join(format!("clockmesh-gpu-fixtures-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // As JAX wrote them: `vm.xplane.pb`, each under its process's log dir.
    let inputs_ = [
        copy_as("jax/process0.vm.xplane.pb", &dir.join("p0"), "vm.xplane.pb"),
        copy_as("jax/process1.vm.xplane.pb", &dir.join("p1"), "vm.xplane.pb"),
    ];
    let opts = MergeOptions {
        out_dir: dir.join("out"),
        run_name: "run".into(),
        offsets: [("vm".to_string(), 0)].into(),
        ..MergeOptions::default()
    };
    let report = merge(&inputs_, &opts, &mut |_| {}).unwrap();
    assert!(report.hosts.iter().all(|h| h.host == "vm"));
    let merged = [
        report.run_dir.join("vm@1.xplane.pb"),
        report.run_dir.join("vm@2.xplane.pb"),
    ];
    let job = inputs::read_job(&merged, true).unwrap();
    assert!(job.participants.iter().all(|p| p.host == "vm"));
    assert!(job.calls.iter().all(|c| c.step.is_some()));
    let a = analyse(
        &job.participants,
        job.calls.clone(),
        &AnalysisOptions::default(),
    );
    assert_eq!(a.summary.causality_violations, 0);
    // Steps 4–6 on both: psum and all_gather each.
    assert_eq!(a.summary.matched, 3 * 2);
    assert_eq!(
        a.summary.unmatched,
        a.summary.unmatched_by_reason.missing_ranks
    );
    // The processes carry no index (no clockmesh helper): participant 1
    // is the second file.
    let a = {
        let mut a = a;
        for (n, p) in a.participants.iter_mut().enumerate() {
            p.rank = Some(n as u64);
        }
        a
    };
    straggler_is_rank_1_in_steps_5_and_6(&a, CollectiveKind::AllReduce, Some(1));
    let mut naive = job.calls;
    for c in &mut naive {
        c.matched_by = MatchedBy::Sequence;
    }
    let naive = analyse(&job.participants, naive, &AnalysisOptions::default());
    assert!(naive.summary.causality_violations > 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--perfetto` of PyTorch ranks: one process per rank, a thread per
/// Kineto (pid, tid), and one flow per matched instance whose points sit
/// inside each rank's call and end on the last arriver.
#[test]
fn real_nccl_ranks_are_in_the_chrome_json_with_their_collective_flows() {
    let dir = std::env::temp_dir().join(format!("clockmesh-gpu-perfetto-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let files = [
        data("torch/rank0.pt.trace.json"),
        data("torch/rank1.pt.trace.json"),
    ];
    let json = dir.join("merged.json");
    let opts = MergeOptions {
        out_dir: dir.join("out"),
        run_name: "run".into(),
        offsets: [("rank0".to_string(), 0), ("rank1".to_string(), 0)].into(),
        perfetto: Some(json.clone()),
        ..MergeOptions::default()
    };
    merge(&files, &opts, &mut |_| {}).unwrap();
    let (v, names) = common::chrome_json(&json);
    let events = v["traceEvents"].as_array().unwrap();
    assert_eq!(
        names,
        [
            "rank0 rank0.pt.trace.json",
            "rank1 rank1.pt.trace.json",
            "Critical path of each step (clockmesh)"
        ]
    );
    let slices: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] != "critical_path")
        .collect();
    let timed_in = |f: &PathBuf| {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap();
        let n = v["traceEvents"].as_array().unwrap().iter();
        n.filter(|e| e["ph"] == "X" && e["ts"].is_number() && e["name"].is_string())
            .count()
    };
    assert_eq!(slices.len(), files.iter().map(timed_in).sum::<usize>());
    let flows: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["cat"] == "collective").collect();
    // 9 matched instances of 2 ranks: a start and a finish each.
    assert_eq!(flows.iter().filter(|f| f["ph"] == "s").count(), 9);
    assert_eq!(flows.iter().filter(|f| f["ph"] == "f").count(), 9);
    let us = |v: &serde_json::Value| v.as_f64().unwrap();
    for f in &flows {
        let inside = slices.iter().any(|s| {
            s["pid"] == f["pid"]
                && s["tid"] == f["tid"]
                && us(&s["ts"]) <= us(&f["ts"])
                && us(&f["ts"]) <= us(&s["ts"]) + us(&s["dur"])
                && s["name"].as_str().unwrap().starts_with("ncclDevKernel")
        });
        assert!(inside, "{f}");
    }
    // Steps 5 and 6: the chain ends on rank 1 (pid 2000).
    let late: Vec<&&serde_json::Value> = flows
        .iter()
        .filter(|f| f["ph"] == "s" && f["args"]["late_by_ns"].as_u64().unwrap() > 19_000_000)
        .collect();
    assert_eq!(late.len(), 2);
    for s in late {
        let end = flows
            .iter()
            .find(|f| f["ph"] == "f" && f["id"] == s["id"])
            .unwrap();
        assert_eq!(end["pid"], 2000);
    }
    critical_path_slices_tile_each_step_and_top_it_on_the_straggler(events);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The critical path's slices (pid 1): each step's segments follow one
/// another without a hole, and the top of steps 5 and 6 is rank 1's 20 ms.
fn critical_path_slices_tile_each_step_and_top_it_on_the_straggler(events: &[serde_json::Value]) {
    let path: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["cat"] == "critical_path")
        .collect();
    assert!(events.iter().any(|e| {
        e["pid"] == 1
            && e["name"] == "process_name"
            && e["args"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("Critical path"))
    }));
    let mut by_step: BTreeMap<u64, Vec<&serde_json::Value>> = BTreeMap::new();
    for e in &path {
        assert_eq!(e["pid"], 1);
        by_step
            .entry(e["args"]["step"].as_u64().unwrap())
            .or_default()
            .push(e);
    }
    assert!(by_step.len() >= 6, "{:?}", by_step.keys());
    let us = |v: &serde_json::Value| v.as_f64().unwrap();
    for (step, segs) in &by_step {
        for pair in segs.windows(2) {
            let end = us(&pair[0]["ts"]) + us(&pair[0]["dur"]);
            assert!(
                (us(&pair[1]["ts"]) - end).abs() < 0.01,
                "step {step}: {pair:?}"
            );
        }
        assert_eq!(segs[0]["tid"], step % 2);
        let tops: Vec<_> = segs.iter().filter(|e| e["args"]["top"] == true).collect();
        assert_eq!(tops.len(), 1, "step {step}");
        if matches!(step, 5 | 6) {
            assert_eq!(tops[0]["args"]["host"], "rank1", "{}", tops[0]);
            assert!(us(&tops[0]["dur"]) > 19_000.0, "{}", tops[0]);
        }
    }
}

/// The critical path of steps 5 and 6 goes through rank 1's 20 ms before
/// its call (a gap, or the late start of its step where it slept between
/// steps: no op of its runs then), which tops the path; in `quiet` steps
/// no gap of rank 1 on the path is as long.
fn path_goes_through_rank_1_s_sleep(files: [&str; 2], quiet: &[u64]) {
    use clockmesh_trace::collectives::critical::{
        CriticalOptions, SegmentKind, StepPath, critical_paths,
    };
    let job = inputs::read_job(&files.map(data), false).unwrap();
    let a = &raw(&job.participants, job.calls.clone());
    let rank_1 = 1;
    let c = critical_paths(a, &job.calls, &job.steps, &CriticalOptions::default());
    let is_gap = |k| matches!(k, SegmentKind::Gap | SegmentKind::LateStart);
    let gap_on_1 = |p: &StepPath| {
        p.segments
            .iter()
            .filter(|s| s.participant == rank_1 && is_gap(s.kind))
            .map(|s| s.duration_ns)
            .max()
            .unwrap_or(0)
    };
    let slept: Vec<u64> = c
        .steps
        .iter()
        .filter(|p| matches!(p.step, 5 | 6))
        .map(|p| {
            let top = &p.segments[p.top.unwrap()];
            assert_eq!(top.participant, rank_1, "step {}", p.step);
            assert!(is_gap(top.kind), "step {}: {:?}", p.step, top.kind);
            gap_on_1(p)
        })
        .collect();
    assert_eq!(slept.len(), 2);
    assert!(
        slept.iter().all(|&g| g > 19 * MS && g < 22 * MS),
        "{slept:?}"
    );
    for p in c.steps.iter().filter(|p| quiet.contains(&p.step)) {
        assert!(gap_on_1(p) < 19 * MS, "step {}: {}", p.step, gap_on_1(p));
    }
}

#[test]
fn real_nccl_steps_5_and_6_are_bound_by_rank_1_s_sleep() {
    let files = ["torch/rank0.pt.trace.json", "torch/rank1.pt.trace.json"];
    path_goes_through_rank_1_s_sleep(files, &[2, 3, 4, 7, 8, 9]);
}

#[test]
fn real_jax_steps_5_and_6_are_bound_by_process_1_s_sleep() {
    // Step 4 is process 1's first traced step, which it began 26 ms after
    // process 0: a late start too, not the planted sleep.
    let files = ["jax/process0.vm.xplane.pb", "jax/process1.vm.xplane.pb"];
    path_goes_through_rank_1_s_sleep(files, &[2, 3, 7, 8]);
}

/// NCCL on its own stream (real PyTorch 2.11 traces, see the README): what
/// preceded each all-reduce kernel is the compute the NCCL stream waited
/// for on the compute stream, so the planted `optimizer` of rank 0 (25 ms
/// longer in steps 3–5) tops those steps as its work, and no step is
/// topped by a gap (read on the kernel's own stream, every top was the gap
/// before an all-reduce: 28.9 ms in the planted steps).
#[test]
fn real_nccl_on_its_own_stream_steps_are_topped_by_the_compute_it_waited_for() {
    use clockmesh_trace::collectives::critical::{CriticalOptions, SegmentKind, critical_paths};
    let files = [
        data("torch_stream/rank0.pt.trace.json"),
        data("torch_stream/rank1.pt.trace.json"),
    ];
    let job = inputs::read_job(&files, false).unwrap();
    let a = &raw(&job.participants, job.calls.clone());
    // Every all-reduce kernel followed a region of the compute stream.
    for c in &job.calls {
        let before = c.preceding.as_ref().map(|p| &*p.name);
        assert!(
            matches!(before, Some("forward" | "backward" | "optimizer")),
            "{:?} step {:?}: {before:?}",
            c.key,
            c.step
        );
    }
    let c = critical_paths(a, &job.calls, &job.steps, &CriticalOptions::default());
    assert_eq!(c.steps.len(), 10);
    for p in &c.steps {
        let top = &p.segments[p.top.unwrap()];
        assert_eq!(top.kind, SegmentKind::Work, "step {}", p.step);
        if matches!(p.step, 3..=5) {
            assert_eq!(
                (top.participant, &*top.op),
                (0, "optimizer"),
                "step {}",
                p.step
            );
            assert!(
                top.duration_ns > 28 * MS,
                "step {}: {}",
                p.step,
                top.duration_ns
            );
        } else {
            assert!(
                top.duration_ns < 17 * MS,
                "step {}: {}",
                p.step,
                top.duration_ns
            );
        }
    }
}
