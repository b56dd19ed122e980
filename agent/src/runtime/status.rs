//! What the agent knows, as one snapshot: served as JSON on `/status` (read
//! by `clockmesh status`) and rendered as Prometheus text on `/metrics`.

use clockmesh_core::time::LocalNs;
use std::{collections::BTreeMap, fmt::Write as _};

pub use clockmesh_core::peers::PeerState;
use clockmesh_core::tally::{DropCounts, NodeCounters};

use crate::capture::Counters as EbpfCounters;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Status {
    pub node: String,
    pub node_id: u32,
    pub addr: String,
    pub version: String,
    pub started_at_ns: i64,
    /// Local clock when the main loop last ran (health).
    pub last_tick_ns: i64,
    pub ready: bool,
    pub leader: Option<String>,
    pub is_leader: bool,
    pub window: u64,
    /// This node's clock against the reference.
    pub offset: Option<ResultStatus>,
    pub peers: Vec<PeerStatus>,
    /// Every node's result (leader only).
    pub nodes: Vec<ResultStatus>,
    pub counters: AgentCounters,
    pub dropped: AgentDrops,
    /// The eBPF programs' counters (absent where they could not be read).
    pub ebpf: Option<EbpfCounters>,
    pub timings: Timings,
    pub config: BTreeMap<String, String>,
    /// GPU device clocks mapped onto this node's clock (`gpu_clock`).
    pub devices: Vec<DeviceStatus>,
    /// Why GPU clock sampling is not running, when it was asked for.
    pub gpu_error: Option<String>,
}

/// One GPU clock: its current map onto this node's CLOCK_REALTIME and the
/// sampler's counters.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct DeviceStatus {
    /// "nvidia:0", "amd:1", "synthetic:0".
    pub device: String,
    /// Index in the offsets file's `device_id`.
    pub index: u32,
    /// Model, UUID or PCI location.
    pub name: String,
    pub map: Option<crate::devclock::PublishedDeviceMap>,
    pub bursts: u64,
    pub accepted: u64,
    /// Pairs rejected as bad readings (too wide, invalid, non-monotonic, outlier).
    pub rejected: u64,
    pub resets: u64,
    pub sample_errors: u64,
    /// Bracket of the last burst's tightest pair (ns).
    pub last_bracket_ns: Option<u64>,
    /// Host CLOCK_REALTIME of the last burst.
    pub updated_at_ns: i64,
    pub last_error: Option<String>,
}

/// Everything the agent counts, one named field per counter: the node's
/// protocol counters, the driver's I/O, the sender's and the pairing's.
/// Served flat, under the names `/metrics` shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentCounters {
    #[serde(flatten)]
    pub node: NodeCounters,
    #[serde(flatten)]
    pub io: IoCounters,
    pub probe_send_errors: u64,
    pub unmatched_tx_reports: u64,
    pub tx_id_restarts: u64,
    pub pairs_settled: u64,
    pub probes_completed: u64,
    pub probes_evicted_incomplete: u64,
}

/// What was dropped, by reason: the node's datagrams and records, and the
/// stamps the pairing could not use.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentDrops {
    #[serde(flatten)]
    pub node: DropCounts,
    /// RX stamps never confirmed by a report.
    pub unconfirmed_rx: u64,
    /// Pending stamps evicted before they settled.
    pub evicted_pending: u64,
}

impl AgentDrops {
    pub fn total(&self) -> u64 {
        self.node.total() + self.unconfirmed_rx + self.evicted_pending
    }
}

/// What the driver counts of its own I/O, one named field per counter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IoCounters {
    /// Datagrams and UDP payload bytes sent (control and probe sockets).
    pub udp_datagrams_sent: u64,
    pub udp_payload_bytes_sent: u64,
    /// Control-socket sends that failed.
    pub send_errors: u64,
    pub discovery_errors: u64,
    pub jsonl_errors: u64,
    /// Offsets-file writes that failed.
    pub publish_errors: u64,
    /// Events read from the eBPF ring buffer.
    pub ebpf_events: u64,
    pub capabilities_dropped: u64,
    pub tracepoints_attached: u64,
    pub tracepoint_attach_errors: u64,
    /// Registrations again after this node's membership lapsed.
    pub rejoins: u64,
}

/// A node's result as `/status` shows it (the view the node's publication
/// carries).
pub use clockmesh_core::publication::ResultStatus;

impl Status {
    /// The status as `/status` serves it at `now_ns`: each result's
    /// `state` filled in.
    pub fn at(&self, now_ns: i64) -> Status {
        let mut s = self.clone();
        for o in s.offset.iter_mut().chain(s.nodes.iter_mut()) {
            o.state = Some(o.state_at(LocalNs(now_ns)));
        }
        s
    }
}

/// How much successive results disagree: each new offset against the
/// previous result extrapolated with its drift to the new anchor.
#[derive(Clone, Debug, Default)]
pub struct UpdateRms {
    squares: std::collections::VecDeque<f64>,
}

impl UpdateRms {
    pub const KEEP: usize = 64;

    /// Records `new` after `prev` and returns the RMS so far (None before
    /// two results of one reference). A change of reference restarts it.
    pub fn add(&mut self, prev: Option<&ResultStatus>, new: &ResultStatus) -> Option<f64> {
        match prev {
            Some(p) if p.reference == new.reference => {
                let dt_s = new.anchor_ns.saturating_sub(p.anchor_ns) as f64 / 1e9;
                let predicted = p.offset_ns as f64 + p.drift_ppb * dt_s;
                if self.squares.len() == Self::KEEP {
                    self.squares.pop_front();
                }
                self.squares
                    .push_back((new.offset_ns as f64 - predicted).powi(2));
            }
            _ => self.squares.clear(),
        }
        (!self.squares.is_empty())
            .then(|| (self.squares.iter().sum::<f64>() / self.squares.len() as f64).sqrt())
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct PeerStatus {
    pub id: u32,
    pub name: String,
    pub addr: String,
    pub state: PeerState,
    /// This node fits the edge to the peer (an out-edge of the graph).
    pub out_edge: bool,
    pub hello_attempts: u32,
    pub last_heard_ms: Option<u64>,
    /// Coded pairs this node sends the peer per cadence: 1, more on a
    /// NIC-stamped direction short of pure pairs (`max_pairs_per_cadence`).
    #[serde(default)]
    pub pairs_per_cadence: u32,
    pub edge: Option<EdgeStatus>,
}

/// The per-edge and timing views come from the protocol core.
pub use clockmesh_core::node::{EdgeStatus, Timings};

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Prom(String);

/// A gauge family: name, help, and how to read it from a row.
type Series<T, V> = (&'static str, &'static str, fn(&T) -> V);

/// A label value of a counter family and how to read it from a row.
type Labelled<T> = (&'static str, fn(&T) -> u64);

impl Prom {
    fn help(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        let l: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", esc(v)))
            .collect();
        let l = if l.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", l.join(","))
        };
        let _ = writeln!(self.0, "{name}{l} {v}");
    }
}

/// A counters type's fields as the exporter names them: the names come
/// from the types (their serde names), never typed out again here.
fn named_counts(counters: &impl Serialize) -> Vec<(String, u64)> {
    let Ok(serde_json::Value::Object(map)) = serde_json::to_value(counters) else {
        return Vec::new();
    };
    map.into_iter()
        .filter_map(|(k, v)| Some((k, v.as_u64()?)))
        .collect()
}

impl Status {
    /// Prometheus text exposition format 0.0.4.
    pub fn to_prometheus(&self) -> String {
        let mut p = Prom(String::new());
        let me = [("node", self.node.as_str())];
        p.help("clockmesh_up", "gauge", "1 while the agent runs");
        p.sample("clockmesh_up", &me, 1.0);
        // Its own gauge, not a label: a flipping label value would start a
        // new series each time readiness changes.
        p.help(
            "clockmesh_ready",
            "gauge",
            "1 once registered, attached and probing (as /readyz)",
        );
        p.sample("clockmesh_ready", &me, f64::from(u8::from(self.ready)));
        p.help(
            "clockmesh_is_leader",
            "gauge",
            "1 on the leader (reference clock and solver)",
        );
        p.sample(
            "clockmesh_is_leader",
            &me,
            f64::from(u8::from(self.is_leader)),
        );
        p.help("clockmesh_window", "counter", "last estimator window");
        p.sample("clockmesh_window", &me, self.window as f64);
        self.offsets(&mut p);
        self.edges(&mut p);
        self.devices(&mut p);
        p.help("clockmesh_peers", "gauge", "peers by handshake state");
        for state in [PeerState::Connecting, PeerState::Ready] {
            let n = self.peers.iter().filter(|x| x.state == state).count();
            p.sample(
                "clockmesh_peers",
                &[("node", &self.node), ("state", state.as_str())],
                n as f64,
            );
        }
        p.help(
            "clockmesh_peer_pairs_per_cadence",
            "gauge",
            "coded pairs sent to the peer per cadence (more where busy queues leave few pure)",
        );
        for x in self.peers.iter().filter(|x| x.state == PeerState::Ready) {
            p.sample(
                "clockmesh_peer_pairs_per_cadence",
                &[("node", &self.node), ("peer", &x.name)],
                f64::from(x.pairs_per_cadence.max(1)),
            );
        }
        for (name, v) in named_counts(&self.counters) {
            let metric = format!("clockmesh_{name}_total");
            p.help(&metric, "counter", &name.replace('_', " "));
            p.sample(&metric, &me, v as f64);
        }
        p.help(
            "clockmesh_dropped_total",
            "counter",
            "messages dropped, by reason",
        );
        for (reason, v) in named_counts(&self.dropped) {
            p.sample(
                "clockmesh_dropped_total",
                &[("node", &self.node), ("reason", &reason)],
                v as f64,
            );
        }
        p.help(
            "clockmesh_ebpf_total",
            "counter",
            "eBPF program counters (emitted, ringbuf_full, skipped, malformed, read_failed)",
        );
        for (c, v) in self.ebpf.iter().flat_map(named_counts) {
            p.sample(
                "clockmesh_ebpf_total",
                &[("node", &self.node), ("counter", &c)],
                v as f64,
            );
        }
        p.help(
            "clockmesh_estimator_seconds",
            "gauge",
            "duration of the last edge fits / network solve",
        );
        p.sample(
            "clockmesh_estimator_seconds",
            &[("node", &self.node), ("stage", "fit")],
            self.timings.last_fit_us as f64 / 1e6,
        );
        p.sample(
            "clockmesh_estimator_seconds",
            &[("node", &self.node), ("stage", "solve")],
            self.timings.last_solve_us as f64 / 1e6,
        );
        p.0
    }

    fn offsets(&self, p: &mut Prom) {
        let mut all: Vec<&ResultStatus> = self.nodes.iter().collect();
        if let Some(o) = &self.offset
            && !all.iter().any(|n| n.node == o.node)
        {
            all.push(o);
        }
        let series: [Series<ResultStatus, f64>; 3] = [
            (
                "clockmesh_node_offset_ns",
                "global minus local (reference clock minus this node's clock) at the anchor, ns",
                |n| n.offset_ns as f64,
            ),
            (
                "clockmesh_node_drift_ppb",
                "rate of the node offset (global minus local), ppb",
                |n| n.drift_ppb,
            ),
            (
                "clockmesh_node_bound_ns",
                "error bound of the node offset at the anchor, ns",
                |n| n.bound_ns as f64,
            ),
        ];
        for (name, help, value) in series {
            p.help(name, "gauge", help);
            for n in &all {
                p.sample(
                    name,
                    &[("node", &n.node), ("reference", &n.reference)],
                    value(n),
                );
            }
        }
    }

    fn devices(&self, p: &mut Prom) {
        let maps: Vec<(&str, &crate::devclock::PublishedDeviceMap)> = self
            .devices
            .iter()
            .filter_map(|d| d.map.as_ref().map(|m| (d.device.as_str(), m)))
            .collect();
        let series: [Series<crate::devclock::PublishedDeviceMap, f64>; 4] = [
            (
                "clockmesh_device_offset_ns",
                "host CLOCK_REALTIME minus device clock at the map's anchor, ns",
                |m| m.offset_at_anchor_ns as f64,
            ),
            (
                "clockmesh_device_drift_ppb",
                "rate of the device offset against the host clock, ppb",
                |m| m.drift_ppb,
            ),
            (
                "clockmesh_device_bound_ns",
                "error bound of the device map at its anchor, ns",
                |m| m.bound_ns as f64,
            ),
            (
                "clockmesh_device_residual_rms_ns",
                "rms residual of the device map's fit, ns",
                |m| m.residual_rms_ns,
            ),
        ];
        for (name, help, value) in series {
            p.help(name, "gauge", help);
            for (device, m) in &maps {
                p.sample(name, &[("node", &self.node), ("device", device)], value(m));
            }
        }
        let counters: [Labelled<DeviceStatus>; 4] = [
            ("bursts", |d| d.bursts),
            ("accepted", |d| d.accepted),
            ("rejected", |d| d.rejected),
            ("sample_errors", |d| d.sample_errors),
        ];
        p.help(
            "clockmesh_device_samples_total",
            "counter",
            "GPU clock sampler counters (bursts, accepted and rejected pairs, errors)",
        );
        for d in &self.devices {
            for (kind, value) in counters {
                p.sample(
                    "clockmesh_device_samples_total",
                    &[
                        ("node", &self.node),
                        ("device", &d.device),
                        ("counter", kind),
                    ],
                    value(d) as f64,
                );
            }
        }
    }

    fn edges(&self, p: &mut Prom) {
        let edges: Vec<(&PeerStatus, &EdgeStatus)> = self
            .peers
            .iter()
            .filter_map(|x| x.edge.as_ref().map(|e| (x, e)))
            .collect();
        let series: [Series<EdgeStatus, Option<f64>>; 4] = [
            (
                "clockmesh_edge_pure_ratio",
                "pure pairs over received pairs, last window",
                |e| Some(e.pure_ratio()),
            ),
            (
                "clockmesh_edge_offset_ns",
                "peer clock minus this clock, last window fit",
                |e| e.offset_ns.map(|v| v as f64),
            ),
            ("clockmesh_edge_bound_ns", "edge fit error bound, ns", |e| {
                e.bound_ns
            }),
            (
                "clockmesh_edge_min_rtt_ns",
                "best pure round trip, ns",
                |e| e.min_rtt_ns,
            ),
        ];
        for (name, help, value) in series {
            p.help(name, "gauge", help);
            for (peer, e) in &edges {
                if let Some(v) = value(e) {
                    p.sample(name, &[("node", &self.node), ("peer", &peer.name)], v);
                }
            }
        }
    }
}

/// Parses Prometheus text with a real text-format parser (tests).
#[cfg(test)]
pub(crate) fn parse_prometheus(text: &str) -> prometheus_parse::Scrape {
    let lines = text.lines().map(|l| Ok(l.to_string()));
    prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::{ClockStatus, flags, history::AnchorKind};
    use clockmesh_core::tally::DropReason;

    fn result(reference: &str, anchor_s: i64, offset_ns: i64, drift_ppb: f64) -> ResultStatus {
        ResultStatus {
            reference: reference.into(),
            anchor_ns: anchor_s * 1_000_000_000,
            offset_ns,
            drift_ppb,
            ..Default::default()
        }
    }

    #[test]
    fn state_is_the_readers_rule_over_the_published_view() {
        let o = ResultStatus {
            anchor_ns: 1_000_000_000_000,
            valid_until_ns: 1_012_000_000_000,
            offset_ns: -7,
            drift_ppb: 1.5,
            bound_ns: 500,
            bound_growth_ppb: 20.0,
            anchor_kind: AnchorKind::Reference,
            holdover_max_bound_ns: 2_000,
            ..Default::default()
        };
        let v = o.reader_view();
        assert_eq!(v.flags, flags::VALID);
        assert_eq!(v.node.drift_ps_per_s, 1_500);
        assert_eq!(v.node.bound_growth_ps_per_s, 20_000);
        // 500 ns + 20 ns/s: the ceiling of 2 µs is reached 75 s after the anchor.
        let s = |t_s: i64| o.state_at(LocalNs(1_000_000_000_000 + t_s * 1_000_000_000));
        assert_eq!(s(1), ClockStatus::Synchronised);
        assert_eq!(
            s(13),
            ClockStatus::Holdover,
            "past validity, within the ceiling"
        );
        assert_eq!(s(75), ClockStatus::Holdover);
        assert_eq!(s(76), ClockStatus::Stale, "past the ceiling");
        let carried = ResultStatus {
            anchor_kind: AnchorKind::Holdover,
            ..o.clone()
        };
        assert_eq!(carried.reader_view().flags, flags::VALID | flags::HOLDOVER);
        assert_eq!(
            carried.state_at(LocalNs(1_001_000_000_000)),
            ClockStatus::Holdover
        );
        let none = ResultStatus {
            holdover_max_bound_ns: 0,
            ..o.clone()
        };
        assert_eq!(
            none.state_at(LocalNs(1_013_000_000_000)),
            ClockStatus::Stale
        );
        // /status fills the state in when it is served.
        let st = Status {
            offset: Some(o.clone()),
            nodes: vec![o.clone(), none],
            ..Default::default()
        };
        let served = st.at(1_013_000_000_000);
        assert_eq!(
            served.offset.as_ref().unwrap().state,
            Some(ClockStatus::Holdover)
        );
        let states: Vec<_> = served.nodes.iter().map(|n| n.state).collect();
        assert_eq!(
            states,
            [Some(ClockStatus::Holdover), Some(ClockStatus::Stale)]
        );
        // Served as JSON, the state is its name.
        let json = serde_json::to_value(&served).unwrap();
        assert_eq!(json["offset"]["state"], "holdover");
        assert_eq!(json["offset"]["anchor_kind"], "reference");
    }

    #[test]
    fn update_rms_compares_each_result_with_the_last_carried_forward() {
        let mut rms = UpdateRms::default();
        let a = result("n0", 0, 1_000, 100.0);
        assert_eq!(rms.add(None, &a), None);
        // Carried 4 s at 100 ppb: 1_400 predicted; 1_430 is 30 off.
        let b = result("n0", 4, 1_430, 100.0);
        assert_eq!(rms.add(Some(&a), &b), Some(30.0));
        // Then exactly on prediction: sqrt((900 + 0) / 2).
        let c = result("n0", 8, 1_830, 100.0);
        let r = rms.add(Some(&b), &c).unwrap();
        assert!((r - 450f64.sqrt()).abs() < 1e-9, "{r}");
        // Another reference: another timeline, the RMS starts again.
        let d = result("n3", 12, 99_999, 0.0);
        assert_eq!(rms.add(Some(&c), &d), None);
        for i in 0..(UpdateRms::KEEP as i64 + 10) {
            rms.add(Some(&d), &result("n3", 12 + i, 99_999 + 10, 0.0));
        }
        assert_eq!(rms.squares.len(), UpdateRms::KEEP);
    }

    /// `clockmesh status` reads back what `/status` serves: every typed
    /// counter under its flat name, none lost in the flattening.
    #[test]
    fn status_json_reads_back_typed() {
        let mut s = Status::default();
        s.counters.node.sent.probes_sent = 10;
        s.counters.node.stamps.add(
            clockmesh_core::collector::Side::Rx,
            clockmesh_core::wire::StampSource::Kernel,
        );
        s.counters.node.leader_returns = 2;
        s.counters.io.rejoins = 3;
        s.counters.pairs_settled = 7;
        s.dropped.node.add(DropReason::Replayed);
        s.dropped.evicted_pending = 4;
        s.ebpf = Some(EbpfCounters {
            emitted: 9,
            ..Default::default()
        });
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["counters"]["probes_sent"], 10);
        assert_eq!(json["counters"]["rx_stamps_kernel"], 1);
        assert_eq!(json["counters"]["rejoins"], 3);
        assert_eq!(json["dropped"]["replayed"], 1);
        assert_eq!(json["dropped"]["evicted_pending"], 4);
        assert_eq!(json["ebpf"]["emitted"], 9);
        let back: Status = serde_json::from_value(json).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn prometheus_text_has_the_documented_series() {
        let mut s = Status {
            node: "a\"b".into(),
            ready: true,
            offset: Some(ResultStatus {
                node: "a\"b".into(),
                reference: "r".into(),
                offset_ns: -12,
                bound_ns: 80,
                ..Default::default()
            }),
            ..Default::default()
        };
        s.counters.node.sent.probes_sent = 10;
        s.dropped.node.add(DropReason::Unauthenticated);
        s.dropped.node.add(DropReason::Unauthenticated);
        s.peers.push(PeerStatus {
            name: "p".into(),
            state: PeerState::Ready,
            pairs_per_cadence: 2,
            edge: Some(EdgeStatus {
                probes: 4,
                pure: 3,
                offset_ns: Some(5),
                ..Default::default()
            }),
            ..Default::default()
        });
        let text = s.to_prometheus();
        for needle in [
            "clockmesh_node_offset_ns{node=\"a\\\"b\",reference=\"r\"} -12",
            "clockmesh_node_bound_ns{node=\"a\\\"b\",reference=\"r\"} 80",
            "clockmesh_edge_pure_ratio{node=\"a\\\"b\",peer=\"p\"} 0.75",
            "clockmesh_probes_sent_total{node=\"a\\\"b\"} 10",
            "clockmesh_dropped_total{node=\"a\\\"b\",reason=\"unauthenticated\"} 2",
            "clockmesh_peers{node=\"a\\\"b\",state=\"ready\"} 1",
            "clockmesh_peer_pairs_per_cadence{node=\"a\\\"b\",peer=\"p\"} 2",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        // Every sample line belongs to a declared metric family.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}");
        }
        // A real text-format parser reads it back (it keeps label values
        // as escaped in the text: `a\"b`).
        let scrape = parse_prometheus(&text);
        let value = |name: &str| {
            scrape
                .samples
                .iter()
                .find(|x| x.metric == name)
                .map(|x| match x.value {
                    prometheus_parse::Value::Gauge(v)
                    | prometheus_parse::Value::Counter(v)
                    | prometheus_parse::Value::Untyped(v) => v,
                    _ => f64::NAN,
                })
        };
        assert_eq!(value("clockmesh_ready"), Some(1.0));
        assert_eq!(value("clockmesh_node_offset_ns"), Some(-12.0));
        let offset = scrape
            .samples
            .iter()
            .find(|x| x.metric == "clockmesh_node_offset_ns")
            .unwrap();
        assert_eq!(offset.labels.get("node"), Some(r#"a\"b"#));
        assert!(
            scrape
                .samples
                .iter()
                .all(|x| x.metric != "clockmesh_up" || x.labels.get("ready").is_none()),
            "readiness is its own gauge"
        );
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Status>(&json).unwrap(), s);
    }
}
