//! What the node counts that decides behaviour, typed: settled stamps by
//! side and source (the driver attaches the eBPF stamp programs and drops
//! privileges on them), and why a datagram was dropped. The names that
//! `/status` and `/metrics` show are derived here, once; nothing reads a
//! formatted name back, so a misspelt one cannot read as a silent zero.

use serde::Serialize;

use crate::collector::Side;
use crate::wire::StampSource;

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
    pub fn settled(&self, side: Side) -> (u64, u64) {
        let socket = self.get(side, StampSource::Kernel) + self.get(side, StampSource::Hardware);
        let all = SOURCES.iter().map(|&s| self.get(side, s)).sum();
        (socket, all)
    }

    /// The counter name `/status` and `/metrics` show (`tx_stamps_kernel`).
    pub fn counter_name(side: Side, source: StampSource) -> &'static str {
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

/// Why the node dropped a datagram or record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
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
        assert_eq!(
            StampTally::counter_name(Side::Rx, StampSource::Tc),
            "rx_stamps_tc"
        );
    }

    #[test]
    fn drop_reasons_keep_their_metric_names() {
        let json = serde_json::to_string(&DropReason::NotFromLeader).unwrap();
        assert_eq!(json, format!("\"{}\"", DropReason::NotFromLeader.as_str()));
    }
}
