//! `clockmesh status`: what the local agent knows, like `chronyc tracking`
//! and `chronyc sources` (reads the agent's `/status` endpoint).
use clockmesh_core::time::LocalNs;
use std::{net::SocketAddr, path::PathBuf};

use anyhow::{Context as _, bail};
use clockmesh::{
    config::{self, Layers},
    runtime::{
        http,
        status::{PeerState, ResultStatus, Status},
    },
};

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Print the agent's full status as JSON.
    #[arg(long)]
    json: bool,
    /// Agent endpoint (default: the agent's metrics_addr from --config,
    /// CLOCKMESH_METRICS_ADDR or 127.0.0.1:9977; 0.0.0.0 means this host).
    #[arg(long, value_name = "IP:PORT")]
    addr: Option<SocketAddr>,
    /// The agent's config file, to find its metrics_addr (default from
    /// CLOCKMESH_CONFIG or XLA_DIST_PROF_CONFIG).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    let body = fetch_status(&args)?;
    if args.json {
        crate::outln!("{body}")?;
        return Ok(());
    }
    crate::out!("{}", render(&parse_status(&body)?))?;
    Ok(())
}

/// The agent's `/status` body, from the endpoint the arguments name.
pub(crate) fn fetch_status(args: &StatusArgs) -> anyhow::Result<String> {
    let addr = match args.addr {
        Some(a) => a,
        None => local_endpoint(configured_endpoint(args.config.as_deref())?),
    };
    http_get(addr, "/status")
        .with_context(|| format!("no clockmesh agent answers on {addr} (is it running?)"))
}

pub(crate) fn parse_status(body: &str) -> anyhow::Result<Status> {
    serde_json::from_str(body).context("the agent's /status is not valid")
}

/// Whether `--json` was asked for.
pub(crate) fn wants_json(args: &StatusArgs) -> bool {
    args.json
}

/// The agent's `metrics_addr` as it would resolve it (defaults, file,
/// environment); no other key is needed or checked.
fn configured_endpoint(file: Option<&std::path::Path>) -> anyhow::Result<SocketAddr> {
    let lookup = |v: &str| std::env::var(v).ok();
    let mut layers = Layers::with_defaults();
    if let Some(file) = config::config_file(file, lookup) {
        layers.apply_file(&file)?;
    }
    layers.apply_env(lookup);
    Ok(config::metrics_addr(&layers)?.value)
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

pub(crate) fn signed(v: i64) -> String {
    format!("{v:+}")
}

/// global − local in words, as chronyc says "slow"/"fast": a positive
/// offset means the global timeline is ahead, so this clock is behind.
fn offset_in_words(offset_ns: i64) -> String {
    let magnitude = duration_words(offset_ns.unsigned_abs());
    match offset_ns.signum() {
        1 => format!("this clock is {magnitude} behind the reference"),
        -1 => format!("this clock is {magnitude} ahead of the reference"),
        _ => "this clock reads the reference's time".into(),
    }
}

/// The offset's rate in words: a growing global − local means this clock
/// runs slow against the reference.
fn drift_in_words(drift_ppb: f64) -> String {
    let ppm = drift_ppb.abs() / 1e3;
    if drift_ppb > 0.0 {
        format!("this clock runs {ppm:.3} ppm slow")
    } else if drift_ppb < 0.0 {
        format!("this clock runs {ppm:.3} ppm fast")
    } else {
        "same rate as the reference".into()
    }
}

/// chronyc's "RMS offset" for a clock that is never steered: how far each
/// result moved from the previous one carried forward.
fn rms_in_words(rms_ns: Option<f64>) -> String {
    match rms_ns {
        Some(ns) => format!(
            "{} (each update against the previous result carried forward)",
            duration_words(ns.round() as u64)
        ),
        None => "not yet known (needs two updates from one reference)".into(),
    }
}

fn hops_in_words(hops: u32, reference: &str) -> String {
    match hops {
        0 => "0 (this node is the reference)".into(),
        1 => format!("1 probe-graph edge to {reference}"),
        n => format!("{n} probe-graph edges to {reference}"),
    }
}

pub(crate) fn duration_words(ns: u64) -> String {
    match ns {
        0..1_000 => format!("{ns} ns"),
        1_000..1_000_000 => format!("{:.3} µs", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.3} ms", ns as f64 / 1e6),
        _ => format!("{:.3} s", ns as f64 / 1e9),
    }
}

/// Whether the result is current, in holdover or stale (the readers'
/// rule: [`ResultStatus::state_at`]); when it was made; its bound now,
/// and how fast that grows.
fn freshness(o: &ResultStatus, now_ns: i64) -> String {
    use clockmesh::publish::ClockStatus;
    let age_ns = now_ns.saturating_sub(o.anchor_ns).max(0);
    let ceiling = duration_words(o.holdover_max_bound_ns);
    let state = match o.state_at(LocalNs(now_ns)) {
        ClockStatus::Synchronised => "synchronised".to_string(),
        ClockStatus::Holdover if now_ns > o.valid_until_ns => format!(
            "holdover (no result within its validity: readers carry it forward until the bound reaches {ceiling})"
        ),
        ClockStatus::Holdover => {
            "holdover (the reference was not reachable: carried forward)".to_string()
        }
        ClockStatus::Stale if o.holdover_max_bound_ns == 0 => {
            "stale (readers refuse it: no result within its validity, holdover off)".to_string()
        }
        ClockStatus::Stale | ClockStatus::Unknown => format!(
            "stale (readers refuse it: no result within its validity, bound past the {ceiling} holdover ceiling)"
        ),
    };
    let bound_now = o.reader_view().node.to_global(LocalNs(now_ns)).1;
    let mut out = format!("State        : {state}\n");
    out += &format!(
        "Last update  : {} ({} ago; every {})\n",
        super::trace::utc(o.anchor_ns),
        duration_words(age_ns as u64),
        duration_words(o.window_ns.max(0) as u64)
    );
    out += &format!(
        "Bound now    : ± {} ns (± {} at the update, growing {:.1} ns per s)\n",
        bound_now,
        duration_words(o.bound_ns),
        o.bound_growth_ppb
    );
    out
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
                o.reference,
                o.window,
                o.anchor_kind.as_str()
            );
            out += &freshness(o, clockmesh::publish::realtime_now_ns().0);
            out += &format!(
                "Offset       : {} ns ± {} ns (global − local: {})\n",
                signed(o.offset_ns),
                o.bound_ns,
                offset_in_words(o.offset_ns)
            );
            out += &format!(
                "Drift        : {:+.3} ppb ± {:.3} ppb ({})\n",
                o.drift_ppb,
                o.drift_bound_ppb,
                drift_in_words(o.drift_ppb)
            );
            out += &format!("RMS offset   : {}\n", rms_in_words(o.rms_update_ns));
            out += &format!("Hops         : {}\n", hops_in_words(o.hops, &o.reference));
        }
        None => out += "Offset       : not yet known (waiting for the first solved window)\n",
    }
    out += &format!(
        "Window       : {} (fits {} µs, solve {} µs)\n",
        s.window, s.timings.last_fit_us, s.timings.last_solve_us
    );
    let ready = s
        .peers
        .iter()
        .filter(|p| p.state == PeerState::Ready)
        .count();
    out += &format!(
        "Peers        : {} ({ready} ready, {} edges fitted here); `clockmesh sources` lists them\n",
        s.peers.len(),
        s.peers.iter().filter(|p| p.out_edge).count()
    );
    let dropped = s.dropped.total();
    out += &format!(
        "\nProbes sent {}, received {}, dropped {} {:?}\n",
        s.counters.node.sent.probes_sent, s.counters.node.probes_received, dropped, s.dropped
    );
    out += &render_devices(s);
    out
}

/// The GPU clocks section (only when `gpu_clock` is on).
fn render_devices(s: &Status) -> String {
    let mut out = String::new();
    if let Some(e) = &s.gpu_error {
        out += &format!("\nGPU clocks   : not sampled: {e}\n");
    }
    if s.devices.is_empty() {
        return out;
    }
    out += &format!(
        "\n{:<14} {:<28} {:>16} {:>12} {:>8} {:>8} {:>7} {:>10} {:>9}\n",
        "GPU clock",
        "Name",
        "Host−device ns",
        "Drift ppb",
        "± ns",
        "rms ns",
        "Points",
        "Bracket ns",
        "Rejected"
    );
    for d in &s.devices {
        let (off, drift, bound, rms, points) = match &d.map {
            Some(m) => (
                signed(m.offset_at_anchor_ns),
                format!("{:+.1}", m.drift_ppb),
                m.bound_ns.to_string(),
                format!("{:.0}", m.residual_rms_ns),
                m.points.to_string(),
            ),
            None => (
                "(no fit yet)".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ),
        };
        out += &format!(
            "{:<14} {:<28} {:>16} {:>12} {:>8} {:>8} {:>7} {:>10} {:>9}\n",
            d.device,
            truncate(&d.name, 28),
            off,
            drift,
            bound,
            rms,
            points,
            d.last_bracket_ns.map_or("-".into(), |b| b.to_string()),
            d.rejected
        );
        if let Some(e) = &d.last_error {
            out += &format!("  last error: {e}\n");
        }
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clockmesh::publish::history::AnchorKind;
    use clockmesh::runtime::status::{EdgeStatus, PeerStatus};

    #[test]
    fn report_shows_offset_peers_and_drops() {
        let mut s = Status {
            node: "n1".into(),
            node_id: 7,
            leader: Some("n0".into()),
            offset: Some(ResultStatus {
                reference: "n0".into(),
                offset_ns: -42,
                bound_ns: 900,
                ..Default::default()
            }),
            ..Default::default()
        };
        s.peers.push(PeerStatus {
            name: "n0".into(),
            state: PeerState::Ready,
            out_edge: true,
            edge: Some(EdgeStatus {
                pure: 30,
                probes: 40,
                offset_ns: Some(42),
                ..Default::default()
            }),
            ..Default::default()
        });
        for _ in 0..3 {
            s.dropped
                .node
                .add(clockmesh_core::tally::DropReason::BadTag);
        }
        let text = render(&s);
        assert!(text.contains("-42 ns ± 900 ns"), "{text}");
        assert!(
            text.contains("this clock is 42 ns ahead of the reference"),
            "{text}"
        );
        assert!(text.contains("1 (1 ready, 1 edges"), "{text}");
        assert!(text.contains("dropped 3"), "{text}");
        s.offset = None;
        assert!(render(&s).contains("not yet known"));
    }

    #[test]
    fn report_shows_drift_uncertainty_rms_and_hops() {
        let mut o = ResultStatus {
            reference: "n0".into(),
            drift_ppb: 12.0,
            drift_bound_ppb: 0.25,
            hops: 2,
            rms_update_ns: Some(37.4),
            ..Default::default()
        };
        let s = |o: &ResultStatus| {
            render(&Status {
                offset: Some(o.clone()),
                ..Default::default()
            })
        };
        let text = s(&o);
        assert!(text.contains("+12.000 ppb ± 0.250 ppb"), "{text}");
        assert!(text.contains("RMS offset   : 37 ns"), "{text}");
        assert!(
            text.contains("Hops         : 2 probe-graph edges to n0"),
            "{text}"
        );
        o.hops = 0;
        o.rms_update_ns = None;
        let text = s(&o);
        assert!(text.contains("0 (this node is the reference)"), "{text}");
        assert!(text.contains("RMS offset   : not yet known"), "{text}");
    }

    #[test]
    fn offset_and_drift_signs_are_said_in_words() {
        assert_eq!(
            offset_in_words(1_230),
            "this clock is 1.230 µs behind the reference"
        );
        assert_eq!(
            offset_in_words(-2_500_000),
            "this clock is 2.500 ms ahead of the reference"
        );
        assert_eq!(drift_in_words(1_500.0), "this clock runs 1.500 ppm slow");
        assert_eq!(drift_in_words(-20.0), "this clock runs 0.020 ppm fast");
    }

    #[test]
    fn report_shows_gpu_clocks() {
        use clockmesh::{devclock::PublishedDeviceMap, runtime::status::DeviceStatus};
        let mut s = Status::default();
        assert!(!render(&s).contains("GPU clock"));
        s.devices.push(DeviceStatus {
            device: "nvidia:0".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            map: Some(PublishedDeviceMap {
                device: "nvidia:0".into(),
                device_domain: "cuda-globaltimer".into(),
                source: "cuda-pingpong".into(),
                host_domain: "CLOCK_REALTIME".into(),
                anchor_device_ns: 1,
                offset_at_anchor_ns: 1234,
                drift_ppb: 21950.0,
                bound_ns: 1750,
                residual_rms_ns: 93.0,
                points: 30,
                valid_from_device_ns: 0,
                valid_until_device_ns: 2,
            }),
            last_bracket_ns: Some(1810),
            ..Default::default()
        });
        s.devices.push(DeviceStatus {
            device: "nvidia:1".into(),
            last_error: Some("device did not answer".into()),
            ..Default::default()
        });
        let text = render(&s);
        assert!(
            text.contains("+1234") && text.contains("+21950.0"),
            "{text}"
        );
        assert!(text.contains("1750") && text.contains("1810"), "{text}");
        assert!(
            text.contains("(no fit yet)") && text.contains("did not answer"),
            "{text}"
        );
        s.devices.clear();
        s.gpu_error = Some("libcuda.so not found".into());
        assert!(render(&s).contains("not sampled: libcuda.so not found"));
    }

    #[test]
    fn unspecified_address_means_this_host() {
        assert_eq!(
            local_endpoint("0.0.0.0:9977".parse().unwrap()),
            "127.0.0.1:9977".parse().unwrap()
        );
    }

    #[test]
    fn freshness_says_synchronised_holdover_or_stale_and_grows_the_bound() {
        let o = ResultStatus {
            anchor_ns: 1_700_000_000_000_000_000,
            valid_until_ns: 1_700_000_012_000_000_000,
            bound_ns: 500,
            bound_growth_ppb: 20.0,
            window_ns: 4_000_000_000,
            anchor_kind: AnchorKind::Reference,
            ..Default::default()
        };
        let two_s_later = o.anchor_ns + 2_000_000_000;
        let text = freshness(&o, two_s_later);
        assert!(text.contains("State        : synchronised"), "{text}");
        assert!(text.contains("2023-11-14 22:13:20.000000000 UTC"), "{text}");
        assert!(text.contains("± 540 ns"), "500 + 20 ns/s × 2 s: {text}");
        assert!(text.contains("every 4.000 s"), "{text}");
        let holdover = ResultStatus {
            anchor_kind: AnchorKind::Holdover,
            ..o.clone()
        };
        assert!(freshness(&holdover, two_s_later).contains("holdover"));
        assert!(freshness(&o, o.valid_until_ns + 1).contains("stale"));
        // With a ceiling (the agent's holdover_max_bound_ns): holdover past
        // the validity until the bound (500 + 20 ns/s) passes it at 25 s.
        let held = ResultStatus {
            holdover_max_bound_ns: 1_000,
            ..o.clone()
        };
        let text = freshness(&held, o.valid_until_ns + 1);
        assert!(
            text.contains("State        : holdover (no result within its validity")
                && text.contains("1.000 µs"),
            "{text}"
        );
        let text = freshness(&held, o.anchor_ns + 26_000_000_000);
        assert!(
            text.contains("State        : stale") && text.contains("1.000 µs holdover ceiling"),
            "{text}"
        );
    }
}
