//! What the node counts that decides behaviour, typed: settled stamps by
//! side and source (the driver attaches the eBPF stamp programs and drops
//! privileges on them), and why a datagram was dropped. The names that
//! `/status` and `/metrics` show are derived here, once; nothing reads a
//! formatted name back, so a misspelt one cannot read as a silent zero.

use serde::{Deserialize, Serialize, ser::SerializeMap};

use crate::collector::Side;
use crate::wire::{Sent, StampSource};

/// What the node counts, one named field per counter: the field's name is
/// the counter `/status` and `/metrics` show. Tests and the driver read
/// fields; nothing is looked up by a formatted name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeCounters {
    pub probes_received: u64,
    pub warmups_received: u64,
    pub follow_ups_received: u64,
    pub rx_reports_received: u64,
    pub stamp_batches_received: u64,
    pub hellos_received: u64,
    pub edge_fits_received: u64,
    pub results_received: u64,
    /// Coded pairs whose two probes left (from the sender's reports).
    pub pairs_sent: u64,
    /// Reports queued for peers (each goes alone or in a batch).
    pub follow_ups_sent: u64,
    pub rx_reports_sent: u64,
    pub results_published: u64,
    /// New results not published because the one held (published before,
    /// or kept from before a restart) still had the smaller bound.
    pub results_withheld: u64,
    pub solve_errors: u64,
    /// This node passed a silent leader over, or saw it return (static
    /// succession).
    pub leader_failovers: u64,
    /// Of those, passed over because a probe peer leader sent nothing for
    /// a window while other members were heard (sooner than its results'
    /// silence would).
    pub leader_failovers_on_peer_silence: u64,
    pub leader_returns: u64,
    /// Taking the timeline over as leader: with a carry, or a new one.
    pub timelines_continued: u64,
    pub timelines_started: u64,
    /// A carried timeline steered toward its origin's clock, measured by
    /// this leader's solve (the origin still a member): once a window.
    pub timelines_steered: u64,
    /// Datagrams the driver sent, by kind.
    #[serde(flatten)]
    pub sent: SentCounts,
    /// Settled stamps by side and source (`tx_stamps_kernel`, …).
    #[serde(flatten)]
    pub stamps: StampTally,
}

/// Datagrams sent, by the kind their body has ([`Sent`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SentCounts {
    pub probes_sent: u64,
    /// Single follow-ups and RX reports (peers that take no batches).
    pub report_datagrams_sent: u64,
    pub hellos_sent: u64,
    pub hello_acks_sent: u64,
    pub edge_fits_sent: u64,
    pub results_sent: u64,
    pub warmups_sent: u64,
    pub stamp_batches_sent: u64,
}

impl NodeCounters {
    /// Adds `other`'s counts to these (a cluster's total). Every field is
    /// named, so a new counter cannot be left out of the sum.
    pub fn merge(&mut self, other: &NodeCounters) {
        let NodeCounters {
            probes_received,
            warmups_received,
            follow_ups_received,
            rx_reports_received,
            stamp_batches_received,
            hellos_received,
            edge_fits_received,
            results_received,
            pairs_sent,
            follow_ups_sent,
            rx_reports_sent,
            results_published,
            results_withheld,
            solve_errors,
            leader_failovers,
            leader_failovers_on_peer_silence,
            leader_returns,
            timelines_continued,
            timelines_started,
            timelines_steered,
            sent,
            stamps,
        } = other;
        for (mine, theirs) in [
            (&mut self.probes_received, probes_received),
            (&mut self.warmups_received, warmups_received),
            (&mut self.follow_ups_received, follow_ups_received),
            (&mut self.rx_reports_received, rx_reports_received),
            (&mut self.stamp_batches_received, stamp_batches_received),
            (&mut self.hellos_received, hellos_received),
            (&mut self.edge_fits_received, edge_fits_received),
            (&mut self.results_received, results_received),
            (&mut self.pairs_sent, pairs_sent),
            (&mut self.follow_ups_sent, follow_ups_sent),
            (&mut self.rx_reports_sent, rx_reports_sent),
            (&mut self.results_published, results_published),
            (&mut self.results_withheld, results_withheld),
            (&mut self.solve_errors, solve_errors),
            (&mut self.leader_failovers, leader_failovers),
            (
                &mut self.leader_failovers_on_peer_silence,
                leader_failovers_on_peer_silence,
            ),
            (&mut self.leader_returns, leader_returns),
            (&mut self.timelines_continued, timelines_continued),
            (&mut self.timelines_started, timelines_started),
            (&mut self.timelines_steered, timelines_steered),
        ] {
            *mine += theirs;
        }
        self.sent.merge(sent);
        self.stamps.merge(stamps);
    }
}

impl SentCounts {
    fn merge(&mut self, other: &SentCounts) {
        let SentCounts {
            probes_sent,
            report_datagrams_sent,
            hellos_sent,
            hello_acks_sent,
            edge_fits_sent,
            results_sent,
            warmups_sent,
            stamp_batches_sent,
        } = other;
        for (mine, theirs) in [
            (&mut self.probes_sent, probes_sent),
            (&mut self.report_datagrams_sent, report_datagrams_sent),
            (&mut self.hellos_sent, hellos_sent),
            (&mut self.hello_acks_sent, hello_acks_sent),
            (&mut self.edge_fits_sent, edge_fits_sent),
            (&mut self.results_sent, results_sent),
            (&mut self.warmups_sent, warmups_sent),
            (&mut self.stamp_batches_sent, stamp_batches_sent),
        ] {
            *mine += theirs;
        }
    }

    pub fn add(&mut self, sent: Sent) {
        *match sent {
            Sent::Probe => &mut self.probes_sent,
            Sent::Report => &mut self.report_datagrams_sent,
            Sent::Hello => &mut self.hellos_sent,
            Sent::HelloAck => &mut self.hello_acks_sent,
            Sent::EdgeFit => &mut self.edge_fits_sent,
            Sent::Result => &mut self.results_sent,
            Sent::Warmup => &mut self.warmups_sent,
            Sent::StampBatch => &mut self.stamp_batches_sent,
        } += 1;
    }
}

const SOURCES: [StampSource; 5] = [
    StampSource::Missing,
    StampSource::Hardware,
    StampSource::Kernel,
    StampSource::Tracepoint,
    StampSource::Tc,
];

/// Stamps of settled pairs, by side and source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StampTally {
    counts: [[u64; SOURCES.len()]; 2],
}

impl StampTally {
    fn slot(side: Side, source: StampSource) -> (usize, usize) {
        let s = match side {
            Side::Tx => 0,
            Side::Rx => 1,
        };
        (s, source as usize)
    }

    pub fn add(&mut self, side: Side, source: StampSource) {
        let (s, k) = Self::slot(side, source);
        self.counts[s][k] += 1;
    }

    pub fn get(&self, side: Side, source: StampSource) -> u64 {
        let (s, k) = Self::slot(side, source);
        self.counts[s][k]
    }

    /// Stamps settled on `side`: (from the socket, kernel or NIC; in all).
    fn merge(&mut self, other: &StampTally) {
        for (mine, theirs) in self
            .counts
            .iter_mut()
            .flatten()
            .zip(other.counts.iter().flatten())
        {
            *mine += theirs;
        }
    }

    pub fn settled(&self, side: Side) -> (u64, u64) {
        let socket = self.get(side, StampSource::Kernel) + self.get(side, StampSource::Hardware);
        let all = SOURCES.iter().map(|&s| self.get(side, s)).sum();
        (socket, all)
    }

    /// The counter name `/status` and `/metrics` show (`tx_stamps_kernel`).
    fn counter_name(side: Side, source: StampSource) -> &'static str {
        match (side, source) {
            (Side::Tx, StampSource::Hardware) => "tx_stamps_hardware",
            (Side::Tx, StampSource::Kernel) => "tx_stamps_kernel",
            (Side::Tx, StampSource::Tracepoint) => "tx_stamps_tracepoint",
            (Side::Tx, StampSource::Tc) => "tx_stamps_tc",
            (Side::Tx, StampSource::Missing) => "tx_stamps_missing",
            (Side::Rx, StampSource::Hardware) => "rx_stamps_hardware",
            (Side::Rx, StampSource::Kernel) => "rx_stamps_kernel",
            (Side::Rx, StampSource::Tracepoint) => "rx_stamps_tracepoint",
            (Side::Rx, StampSource::Tc) => "rx_stamps_tc",
            (Side::Rx, StampSource::Missing) => "rx_stamps_missing",
        }
    }
}

/// Every (side, source) under its counter name.
/// Read back by name (`clockmesh status` reads `/status`); names it does
/// not know are someone else's counters in the same flattened object (all
/// counts: u64).
impl<'de> Deserialize<'de> for StampTally {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let named = std::collections::BTreeMap::<String, u64>::deserialize(deserializer)?;
        let mut t = StampTally::default();
        for side in [Side::Tx, Side::Rx] {
            for source in SOURCES {
                let (s, k) = Self::slot(side, source);
                let value = named.get(Self::counter_name(side, source));
                t.counts[s][k] = value.copied().unwrap_or(0);
            }
        }
        Ok(t)
    }
}

impl Serialize for StampTally {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2 * SOURCES.len()))?;
        for side in [Side::Tx, Side::Rx] {
            for source in SOURCES {
                map.serialize_entry(Self::counter_name(side, source), &self.get(side, source))?;
            }
        }
        map.end()
    }
}

/// Why the node dropped a datagram or record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// Did not parse.
    Malformed,
    /// No or a wrong HMAC tag where a key is configured.
    Unauthenticated,
    BadTag,
    /// Addressed to another node.
    WrongReceiver,
    /// A member's id from another address.
    SourceMismatch,
    /// Not a member.
    UnknownSender,
    /// Seen before (replay window).
    Replayed,
    /// A fit or result that breaks its rules (not the sender's own edge, not
    /// about this node).
    BadRecord,
    /// A result from a member that does not lead.
    NotFromLeader,
}

impl DropReason {
    pub const ALL: [DropReason; 9] = [
        Self::Malformed,
        Self::Unauthenticated,
        Self::BadTag,
        Self::WrongReceiver,
        Self::SourceMismatch,
        Self::UnknownSender,
        Self::Replayed,
        Self::BadRecord,
        Self::NotFromLeader,
    ];

    /// The name `/status` and `/metrics` show.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Unauthenticated => "unauthenticated",
            Self::BadTag => "bad_tag",
            Self::WrongReceiver => "wrong_receiver",
            Self::SourceMismatch => "source_mismatch",
            Self::UnknownSender => "unknown_sender",
            Self::Replayed => "replayed",
            Self::BadRecord => "bad_record",
            Self::NotFromLeader => "not_from_leader",
        }
    }
}

/// Datagrams and records dropped, by reason: shown under each reason's
/// name, read back by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropCounts {
    counts: [u64; DropReason::ALL.len()],
}

impl DropCounts {
    pub fn add(&mut self, reason: DropReason) {
        self.counts[reason as usize] += 1;
    }

    pub fn get(&self, reason: DropReason) -> u64 {
        self.counts[reason as usize]
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds `other`'s drops to these.
    pub fn merge(&mut self, other: &DropCounts) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts) {
            *mine += theirs;
        }
    }
}

impl Serialize for DropCounts {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(DropReason::ALL.len()))?;
        for reason in DropReason::ALL {
            map.serialize_entry(reason.as_str(), &self.get(reason))?;
        }
        map.end()
    }
}

/// Read back by reason; other names in a flattened object are not ours.
impl<'de> Deserialize<'de> for DropCounts {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let named = std::collections::BTreeMap::<String, u64>::deserialize(deserializer)?;
        let mut d = DropCounts::default();
        for reason in DropReason::ALL {
            let value = named.get(reason.as_str());
            d.counts[reason as usize] = value.copied().unwrap_or(0);
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settled_counts_socket_stamps_apart_from_the_others() {
        let mut t = StampTally::default();
        for _ in 0..3 {
            t.add(Side::Tx, StampSource::Tc);
        }
        t.add(Side::Tx, StampSource::Kernel);
        t.add(Side::Rx, StampSource::Hardware);
        t.add(Side::Rx, StampSource::Missing);
        assert_eq!(t.settled(Side::Tx), (1, 4));
        assert_eq!(t.settled(Side::Rx), (1, 2));
        assert_eq!(t.get(Side::Tx, StampSource::Tc), 3);
        let named = serde_json::to_value(t).unwrap();
        assert_eq!(named["rx_stamps_tc"], 0);
        assert_eq!(named["tx_stamps_tc"], 3);
        assert_eq!(named["rx_stamps_hardware"], 1);
        assert_eq!(named.as_object().unwrap().len(), 10);
    }

    /// The counters keep the names `/status` and `/metrics` have always
    /// shown: flattened, one level, the sent kinds and stamps included.
    #[test]
    fn counters_serialise_flat_under_their_names() {
        let mut c = NodeCounters::default();
        c.sent.add(Sent::Hello);
        c.sent.add(Sent::Report);
        c.stamps.add(Side::Tx, StampSource::Kernel);
        c.results_published = 2;
        let v = serde_json::to_value(&c).unwrap();
        let map = v.as_object().unwrap();
        assert_eq!(map["hellos_sent"], 1);
        assert_eq!(map["report_datagrams_sent"], 1);
        assert_eq!(map["tx_stamps_kernel"], 1);
        assert_eq!(map["results_published"], 2);
        assert!(map.values().all(serde_json::Value::is_u64), "{v}");
    }

    #[test]
    fn drop_reasons_keep_their_metric_names() {
        let json = serde_json::to_string(&DropReason::NotFromLeader).unwrap();
        assert_eq!(json, format!("\"{}\"", DropReason::NotFromLeader.as_str()));
        for (i, reason) in DropReason::ALL.into_iter().enumerate() {
            assert_eq!(reason as usize, i, "ALL in declaration order");
        }
    }

    #[test]
    fn counters_and_drops_read_back_what_they_show() {
        let mut d = DropCounts::default();
        d.add(DropReason::Replayed);
        d.add(DropReason::Replayed);
        d.add(DropReason::BadRecord);
        let json = serde_json::to_value(d).unwrap();
        assert_eq!(json["replayed"], 2);
        assert_eq!(json["malformed"], 0);
        assert_eq!(serde_json::from_value::<DropCounts>(json).unwrap(), d);
        assert_eq!(d.total(), 3);

        let mut c = NodeCounters::default();
        c.stamps.add(Side::Rx, StampSource::Tc);
        c.sent.add(Sent::Result);
        c.leader_returns = 4;
        let back: NodeCounters = serde_json::from_value(serde_json::to_value(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        let mut sum = c.clone();
        sum.merge(&c);
        assert_eq!(sum.leader_returns, 8);
        assert_eq!(sum.sent.results_sent, 2);
        assert_eq!(sum.stamps.get(Side::Rx, StampSource::Tc), 2);
        let mut drops = d;
        drops.merge(&d);
        assert_eq!(drops.get(DropReason::Replayed), 4);
    }
}
