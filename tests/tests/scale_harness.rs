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
    // The relay runs alongside, in the same process (as at 10,000 in
    // docs/coordination.md): it carries every result while etcd runs.
    let v = bench_scale(&[
        "--exchange",
        "relay",
        "--path",
        "both",
        "--relay-alongside-after-s",
        "1",
    ]);
    let relay = &v["relay"];
    assert_eq!(relay["missed_share"], 0.0, "{relay}");
    assert_eq!(relay["coverage"], 1.0, "{relay}");
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
    // The leader handed every member without a seat its place: the edges
    // the whole graph gives it.
    assert_eq!(etcd["seat_holders"], 2, "{etcd}");
    assert_eq!(etcd["members_placed_right"], 17, "{etcd}");
    assert_eq!(etcd["members_placed_wrong"], 0, "{etcd}");
}

/// The leader's agent killed: its lease runs out, a seat holder takes
/// over and hands the places out again; every member keeps a place
/// throughout and all end on the new leader.
#[test]
fn a_killed_leader_s_successor_hands_the_places_out() {
    let v = bench_scale(&[
        "--exchange",
        "relay",
        "--path",
        "etcd",
        "--windows",
        "18",
        "--kill-leader-at",
        "2",
    ]);
    let etcd = &v["etcd"][0];
    let fault = &etcd["faults"][0];
    assert_eq!(fault["placed_share_after"], 1.0, "{fault}");
    let leader = fault["final_leader"].as_str().expect("a leader at the end");
    assert_ne!(leader, "node-00000", "the killed leader");
    // Its lease (10 s) runs out, then every member's next refresh (2 s).
    let switched = fault["all_on_final_leader_after_s"].as_f64().unwrap();
    assert!(switched < 16.0, "{fault}");
    assert!(
        etcd["successor_hand_out_ms"]["n"].as_u64().unwrap() >= 1,
        "{etcd}"
    );
    assert_eq!(etcd["members_placed_wrong"], 0, "{etcd}");
}

/// `clockmesh-demo bench-scale` at 20 members, 4 windows, with `extra`.
fn bench_scale(extra: &[&str]) -> Value {
    let windows = if extra.contains(&"--windows") {
        &[][..]
    } else {
        &["--windows", "4"][..]
    };
    let out = Command::new(env!("CARGO_BIN_EXE_clockmesh-demo"))
        .args(["bench-scale", "--members", "20", "--relay-members", "20"])
        .args(windows)
        .args(["--warmup", "2", "--json"])
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

/// The relay's leader killed: member 1 leads after the takeover and
/// continues the timeline from its own last result; every member's reader
/// answers throughout, within its bound of the first leader's clock.
#[test]
fn readers_answer_through_a_killed_leader_within_bound_of_its_timeline() {
    let v = bench_scale(&[
        "--path",
        "relay",
        "--windows",
        "10",
        "--kill-leader-at",
        "2",
        "--takeover-s",
        "3",
    ]);
    let readers = &v["relay"]["readers"];
    assert_eq!(readers["available"], 1.0, "{readers}");
    assert_eq!(readers["coverage"], 1.0, "{readers}");
    assert!(
        readers["successor_results"].as_u64().unwrap() > 0,
        "{readers}"
    );
}
