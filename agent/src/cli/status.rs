//! `clockmesh status`: what the local agent knows, like `chronyc tracking`
//! and `chronyc sources` (reads the agent's `/status` endpoint).
use std::net::SocketAddr;

use anyhow::{Context as _, bail};
use clockmesh::runtime::{http, status::Status};

use super::config::ConfigFlags;

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Print the agent's full status as JSON.
    #[arg(long)]
    json: bool,
    /// Agent endpoint (default: the configured metrics_addr; 0.0.0.0 means this host).
    #[arg(long, value_name = "IP:PORT")]
    addr: Option<SocketAddr>,
    #[command(flatten)]
    flags: ConfigFlags,
}

pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    let addr = match args.addr {
        Some(a) => a,
        None => local_endpoint(args.flags.resolve()?.metrics_addr.value),
    };
    let body = http_get(addr, "/status")
        .with_context(|| format!("no clockmesh agent answers on {addr} (is it running?)"))?;
    if args.json {
        println!("{body}");
        return Ok(());
    }
    let s: Status = serde_json::from_str(&body).context("the agent's /status is not valid")?;
    print!("{}", render(&s));
    Ok(())
}

fn local_endpoint(a: SocketAddr) -> SocketAddr {
    if a.ip().is_unspecified() {
        SocketAddr::from(([127, 0, 0, 1], a.port()))
    } else {
        a
    }
}

fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let (code, body) = http::get(addr, path)?;
    if code != 200 {
        bail!("{path} answered HTTP {code}");
    }
    Ok(body)
}

fn signed(v: i64) -> String {
    format!("{v:+}")
}

/// The human-readable report.
pub fn render(s: &Status) -> String {
    let mut out = String::new();
    let leader = s.leader.as_deref().unwrap_or("(none)");
    out += &format!(
        "Node         : {} (id {}) probing from {}\n",
        s.node, s.node_id, s.addr
    );
    out += &format!(
        "Leader       : {leader}{}\n",
        if s.is_leader {
            " (this node: reference and solver)"
        } else {
            ""
        }
    );
    match &s.offset {
        Some(o) => {
            out += &format!(
                "Reference    : {} (window {}, {})\n",
                o.reference, o.window, o.anchor_kind
            );
            out += &format!(
                "Offset       : {} ns ± {} ns (this clock − reference, at the anchor)\n",
                signed(o.offset_ns),
                o.bound_ns
            );
            out += &format!("Drift        : {:+.3} ppb\n", o.drift_ppb);
        }
        None => out += "Offset       : not yet known (waiting for the first solved window)\n",
    }
    out += &format!(
        "Window       : {} (fits {} µs, solve {} µs)\n",
        s.window, s.timings.last_fit_us, s.timings.last_solve_us
    );
    out += &format!(
        "\n{:<16} {:>6} {:<22} {:<10} {:>4} {:>6} {:>10} {:>12} {:>10} {:>10}\n",
        "Peer",
        "Id",
        "Address",
        "State",
        "Edge",
        "Heard",
        "Pure/Pairs",
        "Offset ns",
        "± ns",
        "minRTT ns"
    );
    for p in &s.peers {
        let heard = p
            .last_heard_ms
            .map_or("-".into(), |ms| format!("{:.1}s", ms as f64 / 1e3));
        let (pure, off, bound, rtt) = match &p.edge {
            Some(e) => (
                format!("{}/{}", e.pure, e.probes),
                e.offset_ns.map_or("-".into(), signed),
                e.bound_ns.map_or("-".into(), |b| format!("{b:.0}")),
                e.min_rtt_ns.map_or("-".into(), |r| format!("{r:.0}")),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        out += &format!(
            "{:<16} {:>6} {:<22} {:<10} {:>4} {:>6} {:>10} {:>12} {:>10} {:>10}\n",
            p.name,
            p.id,
            p.addr,
            p.state,
            if p.out_edge { "out" } else { "in" },
            heard,
            pure,
            off,
            bound,
            rtt
        );
    }
    let dropped: u64 = s.dropped.values().sum();
    out += &format!(
        "\nProbes sent {}, received {}, dropped {} {:?}\n",
        s.counters.get("probes_sent").copied().unwrap_or(0),
        s.counters.get("probes_received").copied().unwrap_or(0),
        dropped,
        s.dropped
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clockmesh::runtime::status::{EdgeStatus, NodeOffsetStatus, PeerStatus};

    #[test]
    fn report_shows_offset_peers_and_drops() {
        let mut s = Status {
            node: "n1".into(),
            node_id: 7,
            leader: Some("n0".into()),
            offset: Some(NodeOffsetStatus {
                reference: "n0".into(),
                offset_ns: -42,
                bound_ns: 900,
                ..Default::default()
            }),
            ..Default::default()
        };
        s.peers.push(PeerStatus {
            name: "n0".into(),
            state: "ready".into(),
            out_edge: true,
            edge: Some(EdgeStatus {
                pure: 30,
                probes: 40,
                offset_ns: Some(42),
                ..Default::default()
            }),
            ..Default::default()
        });
        s.dropped.insert("bad_tag".into(), 3);
        let text = render(&s);
        assert!(text.contains("-42 ns ± 900 ns"), "{text}");
        assert!(text.contains("30/40"), "{text}");
        assert!(text.contains("dropped 3"), "{text}");
        s.offset = None;
        assert!(render(&s).contains("not yet known"));
    }

    #[test]
    fn unspecified_address_means_this_host() {
        assert_eq!(
            local_endpoint("0.0.0.0:9977".parse().unwrap()),
            "127.0.0.1:9977".parse().unwrap()
        );
    }
}
