//! `clockmesh-demo bench-scale`'s harness logic, small: 20 members on a
//! real etcd, once through the agent's etcd store (`--exchange store`, the
//! per-window exchange through etcd) and once for membership only (the
//! relay exchange the agent ships), and 20 relay senders, a few windows.
//! The truth → fits → solve → results path must recover every member's
//! offset within its bound, and every member must get each window's
//! result. No timings are asserted (the bench reports them).

use std::process::Command;

use serde_json::Value;

#[test]
fn truth_fits_solve_and_results_recover_every_offset_through_etcd_and_the_relay() {
    let v = bench_scale(&["--exchange", "store"]);
    let etcd = &v["etcd"][0];
    // 19 members besides the leader, 2 scored windows each.
    assert_eq!(etcd["member_windows"], 38, "{etcd}");
    assert_eq!(etcd["missed_share"], 0.0, "{etcd}");
    assert_eq!(etcd["coverage"], 1.0, "{etcd}");
    assert_eq!(etcd["request_errors"], 0, "{etcd}");
    // Fits are within ~1.5 µs bounds of the truth; the solve combines them.
    assert!(
        etcd["abs_error_ns"]["max"].as_f64().unwrap() < 1_500.0,
        "{etcd}"
    );
    let relay = &v["relay"];
    assert_eq!(relay["coverage"], 1.0, "{relay}");
    assert_eq!(
        relay["fits_received_per_window"], relay["fits_sent_per_window"],
        "{relay}"
    );
}

/// With the relay exchange etcd carries membership only: no puts a window,
/// and every member's refresh (the member list and the leader, through
/// the watches) answered.
#[test]
fn with_the_relay_etcd_carries_membership_only() {
    let v = bench_scale(&["--exchange", "relay", "--path", "etcd"]);
    let etcd = &v["etcd"][0];
    assert_eq!(etcd["exchange"], "relay", "{etcd}");
    assert_eq!(etcd["request_errors"], 0, "{etcd}");
    assert_eq!(etcd["put_edges_ms"]["n"], 0, "{etcd}");
    let by_method = &etcd["etcd_requests_by_method_per_window"];
    assert!(by_method.get("Put").is_none_or(|p| p == 0.0), "{etcd}");
    assert!(
        etcd["members_refresh_ms"]["n"].as_u64().unwrap() >= 19,
        "{etcd}"
    );
}

/// `clockmesh-demo bench-scale` at 20 members, 4 windows, with `extra`.
fn bench_scale(extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_clockmesh-demo"))
        .args(["bench-scale", "--members", "20", "--relay-members", "20"])
        .args(["--windows", "4", "--warmup", "2", "--json"])
        .args(extra)
        .output()
        .expect("running clockmesh-demo bench-scale");
    assert!(
        out.status.success(),
        "bench-scale failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}
