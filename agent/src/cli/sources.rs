//! `clockmesh sources`: the local agent's peers, like `chronyc sources`:
//! each peer's state, when it was last heard, the stamps its edge uses,
//! min RTT, the share of pure pairs, and the edge's last fit.
use clockmesh::runtime::status::{PeerStatus, Status};

use super::status::{StatusArgs, fetch_status, parse_status, signed, wants_json};

pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    let s = parse_status(&fetch_status(&args)?)?;
    if wants_json(&args) {
        let peers: Vec<serde_json::Value> = s.peers.iter().map(peer_json).collect();
        crate::outln!("{}", serde_json::to_string_pretty(&peers)?)?;
        return Ok(());
    }
    crate::out!("{}", render(&s))?;
    Ok(())
}

/// A peer as `/status` has it, plus its pure ratio (documented in
/// docs/agent.md, `clockmesh sources --json`).
fn peer_json(p: &PeerStatus) -> serde_json::Value {
    let mut v = serde_json::to_value(p).unwrap_or_default();
    if let (Some(obj), Some(e)) = (v.as_object_mut(), &p.edge) {
        obj.insert("pure_ratio".into(), serde_json::json!(e.pure_ratio()));
    }
    v
}

const HEADER: [&str; 12] = [
    "Peer",
    "Id",
    "Address",
    "State",
    "Edge",
    "Heard",
    "Rate",
    "Stamps",
    "Pure",
    "minRTT ns",
    "Fit",
    "Offset ± bound ns",
];

/// The table.
pub fn render(s: &Status) -> String {
    let mut out = format!(
        "{:<16} {:>5} {:<22} {:<10} {:<4} {:>6} {:>4} {:<8} {:>10} {:>9} {:>7} {:>24} {:>12}\n",
        HEADER[0],
        HEADER[1],
        HEADER[2],
        HEADER[3],
        HEADER[4],
        HEADER[5],
        HEADER[6],
        HEADER[7],
        HEADER[8],
        HEADER[9],
        HEADER[10],
        HEADER[11],
        "Drift ppb"
    );
    for p in &s.peers {
        out += &row(p, s.window);
    }
    if s.peers.is_empty() {
        out += "(no peers yet)\n";
    }
    out += "\nState: connecting (hello sent) or ready. Edge: out = this node fits it, in = the peer does.\n\
             Heard: since the last datagram. Rate: pairs sent to the peer per cadence (more where busy queues leave few pure).\n\
             Pure: pure pairs / pairs (%). Fit: windows since the edge's last fit.\n\
             Offset: the peer's clock minus this one's, as the edge fit sees it.\n";
    out
}

fn row(p: &PeerStatus, window: u64) -> String {
    let heard = p
        .last_heard_ms
        .map_or("-".into(), |ms| format!("{:.1}s", ms as f64 / 1e3));
    let dash = || "-".to_string();
    let (stamps, pure, rtt, fit, offset, drift) = match &p.edge {
        Some(e) => (
            e.stamps.clone(),
            format!("{}/{} {:.0}%", e.pure, e.probes, 100.0 * e.pure_ratio()),
            e.min_rtt_ns.map_or_else(dash, |r| format!("{r:.0}")),
            match &e.error {
                Some(_) => "failed".into(),
                None => format!("{}", window.saturating_sub(e.window)),
            },
            match (e.offset_ns, e.bound_ns) {
                (Some(o), Some(b)) => format!("{} ± {b:.0}", signed(o)),
                (Some(o), None) => signed(o),
                _ => dash(),
            },
            e.drift_ppb.map_or_else(dash, |d| format!("{d:+.1}")),
        ),
        None => (dash(), dash(), dash(), dash(), dash(), dash()),
    };
    format!(
        "{:<16} {:>5} {:<22} {:<10} {:<4} {:>6} {:>4} {:<8} {:>10} {:>9} {:>7} {:>24} {:>12}\n",
        p.name,
        p.id,
        p.addr,
        p.state.as_str(),
        if p.out_edge { "out" } else { "in" },
        heard,
        format!("×{}", p.pairs_per_cadence.max(1)),
        stamps,
        pure,
        rtt,
        fit,
        offset,
        drift
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clockmesh::runtime::status::{EdgeStatus, PeerState};

    fn status() -> Status {
        let mut s = Status {
            window: 12,
            ..Default::default()
        };
        s.peers.push(PeerStatus {
            name: "n0".into(),
            id: 3,
            addr: "198.18.0.1:31900".into(),
            state: PeerState::Ready,
            out_edge: true,
            last_heard_ms: Some(1500),
            pairs_per_cadence: 4,
            edge: Some(EdgeStatus {
                window: 11,
                pure: 30,
                probes: 40,
                offset_ns: Some(-42),
                bound_ns: Some(900.0),
                min_rtt_ns: Some(21_345.0),
                drift_ppb: Some(-12.5),
                stamps: "software".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        s.peers.push(PeerStatus {
            name: "n2".into(),
            state: PeerState::Connecting,
            ..Default::default()
        });
        s
    }

    #[test]
    fn each_peer_shows_state_stamps_rtt_purity_and_its_last_fit() {
        let text = render(&status());
        let n0 = text.lines().find(|l| l.starts_with("n0")).unwrap();
        for want in [
            "ready",
            "out",
            "1.5s",
            "×4",
            "software",
            "30/40 75%",
            "21345",
            "-42 ± 900",
            "-12.5",
        ] {
            assert!(n0.contains(want), "{want} in {n0}");
        }
        // Fitted one window ago.
        assert!(n0.split_whitespace().any(|w| w == "1"), "{n0}");
        let n2 = text.lines().find(|l| l.starts_with("n2")).unwrap();
        assert!(n2.contains("connecting") && n2.contains(" in "), "{n2}");
        assert!(n2.contains("×1"), "{n2}");
        assert!(render(&Status::default()).contains("(no peers yet)"));
    }

    #[test]
    fn json_adds_the_pure_ratio() {
        let v = peer_json(&status().peers[0]);
        assert_eq!(v["pure_ratio"], serde_json::json!(0.75));
        assert_eq!(v["edge"]["stamps"], "software");
        assert!(peer_json(&status().peers[1]).get("pure_ratio").is_none());
    }
}
