//! The test harness's skew shim (`tests/skew_shim/clockmesh_skew.c`): a real
//! Python process under it reads CLOCK_REALTIME exactly as the agent's
//! `--inject-skew` skews the agent's own stamps, while sleeps and waits
//! (MONOTONIC) still behave. The end-to-end tests rely on both.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use clockmesh::config::InjectedSkew;

/// Built once per test run (the tests run in parallel).
fn shim() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            clockmesh_testbed::shim::build(Path::new(env!("CARGO_TARGET_TMPDIR"))).unwrap()
        })
        .clone()
}

fn now_ns() -> i64 {
    clockmesh::publish::realtime_now_ns().0
}

#[test]
fn a_shimmed_process_reads_realtime_as_the_agent_skews_it() {
    let skew = InjectedSkew {
        offset_ns: 123_000_000,
        drift_ppb: 50_000.0,
        epoch_ns: now_ns() - 1_000_000_000_000,
        wander_ppb_per_sqrt_s: 0.0,
        wander_seed: 0,
    };
    let spec = clockmesh_testbed::shim::spec(&skew);
    let out = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/skew_shim/probe.py"))
        .env("LD_PRELOAD", shim())
        .env("CLOCKMESH_SKEW", &spec)
        .output()
        .expect("python3 (cargo xtask setup installs it)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let reads: Vec<_> = lines.iter().filter(|l| l.get("seen").is_some()).collect();
    assert_eq!(reads.len(), 20);
    let mut brackets = Vec::new();
    for r in reads {
        let field = |k: &str| r[k].as_i64().unwrap();
        let (before, seen, after) = (field("before"), field("seen"), field("after"));
        brackets.push(after - before);
        // The agent's local time of the true instants that bracket the read.
        let (lo, hi) = (before + skew.at(before), after + skew.at(after));
        assert!(
            lo <= seen && seen <= hi,
            "read {seen} outside [{lo}, {hi}] (skew ≈ {} ns)",
            skew.at(before)
        );
    }
    // A bracket is a few µs, so the check resolves errors that small; a busy
    // machine may preempt the interpreter inside one, not inside most.
    brackets.sort_unstable();
    assert!(brackets[10] < 1_000_000, "brackets {brackets:?} ns");
    let waited = lines.last().unwrap()["waited_s"].as_f64().unwrap();
    assert!(
        (0.39..2.0).contains(&waited),
        "sleep and Event.wait took {waited} s"
    );
}

#[test]
fn without_a_skew_nothing_changes() {
    let out = Command::new("python3")
        .args(["-c", "import time; print(time.time_ns())"])
        .env("LD_PRELOAD", shim())
        .env_remove("CLOCKMESH_SKEW")
        .output()
        .unwrap();
    let seen: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!((seen - now_ns()).abs() < 5_000_000_000, "{seen}");
}
