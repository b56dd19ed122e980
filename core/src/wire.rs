//! clockmesh messages: encoding and a pure parser (`parse` is a function of
//! bytes only, fuzzed by `fuzz/fuzz_targets/wire_parse.rs`).
//!
//! Every message is the 32-byte [`ProbeHeader`] followed by a kind-specific
//! body, and, when authentication is on (`flags & FLAG_AUTH`), a 16-byte
//! HMAC-SHA256 tag over everything before it. Layout: `docs/protocol.md`.

/// Every message kind, in one place (`clockmesh_common::kind`, which the
/// eBPF programs share).
pub use clockmesh_common::kind;
use clockmesh_common::{MAX_PROBE_PAYLOAD, PROBE_HEADER_LEN, ProbeHeader, header_is_valid};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use thiserror::Error;

/// A record's or a batch's length for its u16 length field: the callers
/// cap it first (`MAX_RECORD_LEN`, `MAX_BATCH_ENTRIES`, both below 2^16).
fn length_u16(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

/// `ProbeHeader::flags` bit: an HMAC tag follows the body.
pub const FLAG_AUTH: u8 = 1;
/// Truncated HMAC-SHA256 tag length (128 bits, as in many IPsec suites).
pub const TAG_LEN: usize = 16;
/// Probes are padded to this size (before any tag).
pub const PROBE_LEN: usize = 64;
/// Capability bits announced in hellos.
pub mod capability {
    /// RX stamps from the NIC (PHC domain).
    pub const HW_RX: u32 = 1;
    /// TX stamps from the NIC (PHC domain).
    pub const HW_TX: u32 = 2;
    /// Understands warm-up datagrams (`kind::WARMUP`): only such peers get them.
    pub const WARMUP: u32 = 4;
    /// Understands stamp batches (`kind::STAMP_BATCH`): only such peers get
    /// their follow-ups and RX reports batched.
    pub const STAMP_BATCH: u32 = 8;
}

/// Where a timestamp carried in a message came from (all REALTIME ns on the
/// wire; the source says how good it is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum StampSource {
    Missing = 0,
    /// NIC hardware stamp mapped to REALTIME.
    Hardware = 1,
    /// Kernel driver / RX software stamp (SO_TIMESTAMPING, skb tstamp).
    Kernel = 2,
    /// eBPF tracepoint stamp mapped MONOTONIC → REALTIME.
    Tracepoint = 3,
    /// tc program stamp mapped MONOTONIC → REALTIME.
    Tc = 4,
}

impl StampSource {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Missing,
            1 => Self::Hardware,
            2 => Self::Kernel,
            3 => Self::Tracepoint,
            4 => Self::Tc,
            _ => return None,
        })
    }
}

/// A timestamp as carried in follow-ups and RX reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireStamp {
    /// Node-local REALTIME, ns since the Unix epoch (exact integer).
    pub realtime_ns: i64,
    /// Error added by the clock-domain map that produced it, ns.
    pub bound_ns: u32,
    pub source: StampSource,
}

impl WireStamp {
    pub const MISSING: WireStamp = WireStamp {
        realtime_ns: 0,
        bound_ns: 0,
        source: StampSource::Missing,
    };
    const LEN: usize = 16;

    fn write(&self, out: &mut Vec<u8>) {
        out.extend(self.realtime_ns.to_le_bytes());
        out.extend(self.bound_ns.to_le_bytes());
        out.extend([self.source as u8, 0, 0, 0]);
    }

    fn read(b: &[u8]) -> Result<Self, WireError> {
        let source = StampSource::from_u8(b[12]).ok_or(WireError::BadField("stamp source"))?;
        Ok(WireStamp {
            realtime_ns: i64::from_le_bytes(b[0..8].try_into().map_err(|_| WireError::Truncated)?),
            bound_ns: u32::from_le_bytes(b[8..12].try_into().map_err(|_| WireError::Truncated)?),
            source,
        })
    }
}

/// A parsed message. `header.seq` is the pair (probe, follow-up, RX report)
/// or handshake nonce (hello, hello-ack) the message is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// A timed probe; body is zero padding.
    Probe { header: ProbeHeader },
    /// Sender → receiver after a pair: the sender's TX stamps of both probes.
    FollowUp {
        header: ProbeHeader,
        tx: [WireStamp; 2],
    },
    /// Receiver → sender: the receiver's RX stamps of both probes of a pair,
    /// so the sender also holds complete pairs for that direction.
    RxReport {
        header: ProbeHeader,
        rx: [WireStamp; 2],
    },
    /// Handshake: "I speak versions up to `max_version`, here is how".
    Hello { header: ProbeHeader, hello: Hello },
    /// Handshake answer with the version both will use.
    HelloAck { header: ProbeHeader, hello: Hello },
    /// Member → leader: one protobuf `clockmesh.v1.EdgeFit` of a window.
    EdgeFit {
        header: ProbeHeader,
        payload: Vec<u8>,
    },
    /// Leader → member: its protobuf `clockmesh.v1.NodeOffset`.
    Result {
        header: ProbeHeader,
        payload: Vec<u8>,
    },
    /// Sent just before a coded pair over the same path, untimed: it warms
    /// the sender's network path (caches, branch predictors) so the timed
    /// probes after it take the fast, steady path. Receivers drop it.
    Warmup { header: ProbeHeader },
    /// Follow-ups and RX reports for one peer, batched per tick: one
    /// datagram (and one receive) instead of one per pair. `header.seq`
    /// numbers the batches (replay protection), each entry names its pair.
    StampBatch {
        header: ProbeHeader,
        entries: Vec<BatchEntry>,
    },
}

/// The kind of a message the node sends, derived from its body: what
/// it is counted under once sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sent {
    Probe,
    /// A single follow-up or RX report.
    Report,
    Hello,
    HelloAck,
    EdgeFit,
    Result,
    Warmup,
    StampBatch,
}

impl Sent {
    pub fn of(msg: &Message) -> Self {
        match msg {
            Message::Probe { .. } => Self::Probe,
            Message::FollowUp { .. } | Message::RxReport { .. } => Self::Report,
            Message::Hello { .. } => Self::Hello,
            Message::HelloAck { .. } => Self::HelloAck,
            Message::EdgeFit { .. } => Self::EdgeFit,
            Message::Result { .. } => Self::Result,
            Message::Warmup { .. } => Self::Warmup,
            Message::StampBatch { .. } => Self::StampBatch,
        }
    }

    /// The counter `/status` and `/metrics` show for it.
    pub fn counter_name(self) -> &'static str {
        match self {
            Self::Probe => "probes_sent",
            Self::Report => "report_datagrams_sent",
            Self::Hello => "hellos_sent",
            Self::HelloAck => "hello_acks_sent",
            Self::EdgeFit => "edge_fits_sent",
            Self::Result => "results_sent",
            Self::Warmup => "warmups_sent",
            Self::StampBatch => "stamp_batches_sent",
        }
    }
}

/// What a stamp-batch entry reports about pair `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Report {
    /// The batch's sender's TX stamps of its pair `seq` to the receiver.
    FollowUp = 1,
    /// The batch's sender's RX stamps of the receiver's pair `seq`.
    RxReport = 2,
}

/// One follow-up or RX report inside a [`Message::StampBatch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchEntry {
    pub report: Report,
    pub seq: u64,
    pub stamps: [WireStamp; 2],
}

impl BatchEntry {
    /// seq (8), report (1), padding (3), two stamps.
    const LEN: usize = 12 + 2 * WireStamp::LEN;

    fn write(&self, out: &mut Vec<u8>) {
        out.extend(self.seq.to_le_bytes());
        out.extend([self.report as u8, 0, 0, 0]);
        self.stamps.iter().for_each(|st| st.write(out));
    }

    fn read(b: &[u8]) -> Result<Self, WireError> {
        let seq = u64::from_le_bytes(b[0..8].try_into().map_err(|_| WireError::Truncated)?);
        let report = match b[8] {
            1 => Report::FollowUp,
            2 => Report::RxReport,
            _ => return Err(WireError::BadField("batch entry")),
        };
        Ok(BatchEntry {
            report,
            seq,
            stamps: [WireStamp::read(&b[12..28])?, WireStamp::read(&b[28..44])?],
        })
    }
}

/// Most entries in one stamp batch (the datagram stays within
/// `MAX_PROBE_PAYLOAD`, tag included).
pub const MAX_BATCH_ENTRIES: usize =
    (MAX_PROBE_PAYLOAD as usize - PROBE_HEADER_LEN - TAG_LEN - 2) / BatchEntry::LEN;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub max_version: u8,
    pub capabilities: u32,
    pub probe_port: u16,
}

/// Largest protobuf payload of an edge fit or result message.
pub const MAX_RECORD_LEN: usize = MAX_PROBE_PAYLOAD as usize - PROBE_HEADER_LEN - TAG_LEN - 2;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum WireError {
    #[error("datagram too short for its kind")]
    Truncated,
    #[error("datagram longer than {MAX_PROBE_PAYLOAD} bytes")]
    Oversized,
    #[error("not a clockmesh message of a supported version")]
    NotClockmesh,
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    #[error("invalid {0}")]
    BadField(&'static str),
    #[error("authentication required but the message has no tag")]
    Unauthenticated,
    #[error("authentication tag does not match")]
    BadTag,
}

/// The shared key for HMAC authentication (from the file the DaemonSet mounts).
#[derive(Clone)]
pub struct AuthKey(Vec<u8>);

impl AuthKey {
    /// A key of at least 16 bytes (shorter keys are refused: too guessable).
    pub fn new(bytes: Vec<u8>) -> Option<Self> {
        (bytes.len() >= 16).then_some(AuthKey(bytes))
    }

    fn tag(&self, data: &[u8]) -> [u8; TAG_LEN] {
        // HMAC accepts keys of any length; `new_from_slice` cannot fail here.
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(data);
        let full = mac.finalize().into_bytes();
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&full[..TAG_LEN]);
        tag
    }
}

impl std::fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthKey(…)") // never log the key
    }
}

/// Body length of kind `k`; records carry their own (u16 LE, then the bytes).
fn body_len(k: u8, body: &[u8]) -> Result<usize, WireError> {
    if matches!(k, kind::EDGE_FIT | kind::RESULT) {
        let n = body.get(..2).ok_or(WireError::Truncated)?;
        let n = usize::from(u16::from_le_bytes([n[0], n[1]]));
        if n > MAX_RECORD_LEN {
            return Err(WireError::BadField("record length"));
        }
        return Ok(2 + n);
    }
    if k == kind::STAMP_BATCH {
        let n = body.get(..2).ok_or(WireError::Truncated)?;
        let n = usize::from(u16::from_le_bytes([n[0], n[1]]));
        if n == 0 || n > MAX_BATCH_ENTRIES {
            return Err(WireError::BadField("batch length"));
        }
        return Ok(2 + n * BatchEntry::LEN);
    }
    fixed_body_len(k).ok_or(WireError::UnknownKind(k))
}

fn fixed_body_len(k: u8) -> Option<usize> {
    Some(match k {
        kind::PROBE | kind::WARMUP => PROBE_LEN - PROBE_HEADER_LEN,
        kind::FOLLOW_UP | kind::RX_REPORT => 2 * WireStamp::LEN,
        kind::HELLO | kind::HELLO_ACK => 8,
        _ => return None,
    })
}

impl Message {
    pub fn header(&self) -> &ProbeHeader {
        match self {
            Message::Probe { header }
            | Message::FollowUp { header, .. }
            | Message::RxReport { header, .. }
            | Message::Hello { header, .. }
            | Message::HelloAck { header, .. }
            | Message::EdgeFit { header, .. }
            | Message::Result { header, .. }
            | Message::Warmup { header }
            | Message::StampBatch { header, .. } => header,
        }
    }

    /// The kind on the wire, from the body: a header's `kind` never
    /// decides it.
    pub fn kind(&self) -> u8 {
        match self {
            Message::Probe { .. } => kind::PROBE,
            Message::FollowUp { .. } => kind::FOLLOW_UP,
            Message::RxReport { .. } => kind::RX_REPORT,
            Message::Hello { .. } => kind::HELLO,
            Message::HelloAck { .. } => kind::HELLO_ACK,
            Message::EdgeFit { .. } => kind::EDGE_FIT,
            Message::Result { .. } => kind::RESULT,
            Message::Warmup { .. } => kind::WARMUP,
            Message::StampBatch { .. } => kind::STAMP_BATCH,
        }
    }

    /// Encodes the message; with `key`, sets `FLAG_AUTH` and appends the tag.
    /// The header's kind is the body's ([`Message::kind`]), whatever the
    /// caller put there.
    pub fn encode(&self, key: Option<&AuthKey>) -> Vec<u8> {
        let mut header = *self.header();
        header.kind = self.kind();
        header.flags = if key.is_some() {
            header.flags | FLAG_AUTH
        } else {
            header.flags & !FLAG_AUTH
        };
        let mut out = header.to_bytes().to_vec();
        match self {
            Message::Probe { .. } | Message::Warmup { .. } => out.resize(PROBE_LEN, 0),
            Message::FollowUp { tx: s, .. } | Message::RxReport { rx: s, .. } => {
                s.iter().for_each(|st| st.write(&mut out))
            }
            Message::EdgeFit { payload, .. } | Message::Result { payload, .. } => {
                let n = payload.len().min(MAX_RECORD_LEN);
                out.extend(length_u16(n).to_le_bytes());
                out.extend(&payload[..n]);
            }
            Message::StampBatch { entries, .. } => {
                let n = entries.len().min(MAX_BATCH_ENTRIES);
                out.extend(length_u16(n).to_le_bytes());
                entries[..n].iter().for_each(|e| e.write(&mut out));
            }
            Message::Hello { hello, .. } | Message::HelloAck { hello, .. } => {
                out.push(hello.max_version);
                out.push(0);
                out.extend(hello.probe_port.to_le_bytes());
                out.extend(hello.capabilities.to_le_bytes());
            }
        }
        if let Some(key) = key {
            let tag = key.tag(&out);
            out.extend(tag);
        }
        out
    }
}

/// Parses one datagram. With `key`, messages without a valid tag are errors.
pub fn parse(datagram: &[u8], key: Option<&AuthKey>) -> Result<Message, WireError> {
    if datagram.len() > usize::from(MAX_PROBE_PAYLOAD) {
        return Err(WireError::Oversized);
    }
    let header = ProbeHeader::from_bytes(datagram).ok_or(WireError::Truncated)?;
    if !header_is_valid(&header) {
        return Err(WireError::NotClockmesh);
    }
    let len = body_len(header.kind, &datagram[PROBE_HEADER_LEN..])?;
    let body_end = PROBE_HEADER_LEN + len;
    let authed = header.flags & FLAG_AUTH != 0;
    let expected = body_end + if authed { TAG_LEN } else { 0 };
    if datagram.len() < expected {
        return Err(WireError::Truncated);
    }
    check_tag(
        &datagram[..body_end],
        datagram.get(body_end..expected),
        authed,
        key,
    )?;
    let body = &datagram[PROBE_HEADER_LEN..body_end];
    decode_body(header, body)
}

fn check_tag(
    signed: &[u8],
    tag: Option<&[u8]>,
    authed: bool,
    key: Option<&AuthKey>,
) -> Result<(), WireError> {
    match (key, authed) {
        (None, _) => Ok(()),
        (Some(_), false) => Err(WireError::Unauthenticated),
        (Some(key), true) => {
            let expected = key.tag(signed);
            let got = tag.ok_or(WireError::Truncated)?;
            // Constant-time comparison: no early exit on the first mismatch.
            let diff = expected
                .iter()
                .zip(got)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if diff == 0 {
                Ok(())
            } else {
                Err(WireError::BadTag)
            }
        }
    }
}

fn decode_body(header: ProbeHeader, body: &[u8]) -> Result<Message, WireError> {
    let stamps = || -> Result<[WireStamp; 2], WireError> {
        Ok([
            WireStamp::read(&body[..16])?,
            WireStamp::read(&body[16..32])?,
        ])
    };
    Ok(match header.kind {
        kind::PROBE => Message::Probe { header },
        kind::WARMUP => Message::Warmup { header },
        kind::FOLLOW_UP => Message::FollowUp {
            header,
            tx: stamps()?,
        },
        kind::RX_REPORT => Message::RxReport {
            header,
            rx: stamps()?,
        },
        kind::EDGE_FIT => Message::EdgeFit {
            header,
            payload: body[2..].to_vec(),
        },
        kind::RESULT => Message::Result {
            header,
            payload: body[2..].to_vec(),
        },
        kind::STAMP_BATCH => Message::StampBatch {
            header,
            entries: body[2..]
                .chunks_exact(BatchEntry::LEN)
                .map(BatchEntry::read)
                .collect::<Result<_, _>>()?,
        },
        kind::HELLO | kind::HELLO_ACK => {
            let hello = Hello {
                max_version: body[0],
                probe_port: u16::from_le_bytes([body[2], body[3]]),
                capabilities: u32::from_le_bytes([body[4], body[5], body[6], body[7]]),
            };
            if hello.max_version == 0 || hello.probe_port == 0 {
                return Err(WireError::BadField("hello"));
            }
            if header.kind == kind::HELLO {
                Message::Hello { header, hello }
            } else {
                Message::HelloAck { header, hello }
            }
        }
        other => return Err(WireError::UnknownKind(other)),
    })
}

/// Replay protection for authenticated messages: per (sender, kind), the
/// highest sequence seen and a 64-wide window below it (as IPsec does), so
/// late but unseen messages pass and repeats do not. Memory is bounded by
/// `max_senders`; the stalest sender is forgotten first.
pub struct ReplayWindow {
    max_senders: usize,
    state: std::collections::HashMap<(u32, u8), (u64, u64, u64)>,
    clock: u64,
}

impl ReplayWindow {
    pub fn new(max_senders: usize) -> Self {
        ReplayWindow {
            max_senders: max_senders.max(1),
            state: Default::default(),
            clock: 0,
        }
    }

    /// `true` if (sender, kind, seq) is new; records it.
    pub fn accept(&mut self, h: &ProbeHeader) -> bool {
        // Both probes of a pair share `seq`: count the pair index in.
        let seq = h.seq.saturating_mul(2) + u64::from(h.pair_index);
        self.clock += 1;
        let key = (h.sender, h.kind);
        if !self.state.contains_key(&key) && self.state.len() >= self.max_senders {
            self.evict_stalest();
        }
        let (top, bits, used) = self.state.entry(key).or_insert((seq, 0, 0));
        *used = self.clock;
        if seq > *top || *bits == 0 && seq == *top {
            let shift = seq - *top;
            *bits = if shift >= 64 { 0 } else { *bits << shift };
            *bits |= 1;
            *top = seq;
            return true;
        }
        let back = *top - seq;
        if back >= 64 || *bits & (1 << back) != 0 {
            return false;
        }
        *bits |= 1 << back;
        true
    }

    fn evict_stalest(&mut self) {
        if let Some(&k) = self.state.iter().min_by_key(|(_, v)| v.2).map(|(k, _)| k) {
            self.state.remove(&k);
        }
    }

    pub fn senders(&self) -> usize {
        self.state.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_on_the_wire_is_the_body_s() {
        let wrong = ProbeHeader {
            kind: kind::PROBE,
            ..h(kind::RESULT, 1, 0)
        };
        let m = Message::Result {
            header: wrong,
            payload: vec![1, 2, 3],
        };
        assert_eq!(m.kind(), kind::RESULT);
        let parsed = parse(&m.encode(None), None).unwrap();
        assert!(matches!(parsed, Message::Result { ref payload, .. } if payload == &[1, 2, 3]));
        assert_eq!(parsed.header().kind, kind::RESULT);
    }

    fn h(k: u8, seq: u64, idx: u8) -> ProbeHeader {
        ProbeHeader {
            kind: k,
            ..ProbeHeader::probe(7, 9, seq, idx, 100_000)
        }
    }

    fn stamp(ns: i64) -> WireStamp {
        WireStamp {
            realtime_ns: ns,
            bound_ns: 31,
            source: StampSource::Kernel,
        }
    }

    fn all_kinds() -> Vec<Message> {
        let hello = Hello {
            max_version: 1,
            capabilities: capability::HW_RX,
            probe_port: 31_900,
        };
        vec![
            Message::Probe {
                header: h(kind::PROBE, 1, 1),
            },
            Message::FollowUp {
                header: h(kind::FOLLOW_UP, 2, 0),
                tx: [stamp(1_700_000_000_000_000_001), stamp(-5)],
            },
            Message::RxReport {
                header: h(kind::RX_REPORT, 3, 0),
                rx: [stamp(i64::MAX), WireStamp::MISSING],
            },
            Message::Hello {
                header: h(kind::HELLO, 4, 0),
                hello,
            },
            Message::HelloAck {
                header: h(kind::HELLO_ACK, 4, 0),
                hello,
            },
            Message::EdgeFit {
                header: h(kind::EDGE_FIT, 5, 0),
                payload: vec![1, 2, 3, 250],
            },
            Message::Result {
                header: h(kind::RESULT, 6, 0),
                payload: Vec::new(),
            },
            Message::Warmup {
                header: h(kind::WARMUP, 7, 0),
            },
            Message::StampBatch {
                header: h(kind::STAMP_BATCH, 8, 0),
                entries: vec![
                    BatchEntry {
                        report: Report::FollowUp,
                        seq: u64::MAX,
                        stamps: [stamp(1), stamp(2)],
                    },
                    BatchEntry {
                        report: Report::RxReport,
                        seq: 3,
                        stamps: [WireStamp::MISSING, stamp(-4)],
                    },
                ],
            },
        ]
    }

    #[test]
    fn a_full_batch_fits_a_signed_datagram_and_bad_counts_are_refused() {
        let key = AuthKey::new(vec![0x42; 32]).unwrap();
        let entry = BatchEntry {
            report: Report::RxReport,
            seq: 1,
            stamps: [stamp(1), stamp(2)],
        };
        let full = Message::StampBatch {
            header: h(kind::STAMP_BATCH, 1, 0),
            entries: vec![entry; MAX_BATCH_ENTRIES],
        };
        let signed = full.encode(Some(&key));
        assert!(signed.len() <= usize::from(MAX_PROBE_PAYLOAD));
        assert!(parse(&signed, Some(&key)).is_ok());
        let mut bytes = full.encode(None);
        for bad in [0, MAX_BATCH_ENTRIES + 1] {
            bytes[PROBE_HEADER_LEN..PROBE_HEADER_LEN + 2]
                .copy_from_slice(&(bad as u16).to_le_bytes());
            assert_eq!(
                parse(&bytes, None),
                Err(WireError::BadField("batch length"))
            );
        }
        let mut wrong_report = full.encode(None);
        wrong_report[PROBE_HEADER_LEN + 2 + 8] = 3;
        assert_eq!(
            parse(&wrong_report, None),
            Err(WireError::BadField("batch entry"))
        );
    }

    #[test]
    fn record_lengths_are_checked() {
        let m = Message::EdgeFit {
            header: h(kind::EDGE_FIT, 1, 0),
            payload: vec![7; 10],
        };
        let mut bytes = m.encode(None);
        bytes[PROBE_HEADER_LEN] = 11; // claims one byte more than present
        assert_eq!(parse(&bytes, None), Err(WireError::Truncated));
        bytes[PROBE_HEADER_LEN..PROBE_HEADER_LEN + 2].copy_from_slice(&600u16.to_le_bytes());
        assert_eq!(
            parse(&bytes, None),
            Err(WireError::BadField("record length"))
        );
    }

    #[test]
    fn every_kind_round_trips_with_and_without_auth() {
        let key = AuthKey::new(vec![0x42; 32]).unwrap();
        for m in all_kinds() {
            assert_eq!(parse(&m.encode(None), None), Ok(m.clone()));
            let signed = m.encode(Some(&key));
            let mut expected = m.clone();
            match &mut expected {
                Message::Probe { header }
                | Message::FollowUp { header, .. }
                | Message::RxReport { header, .. }
                | Message::Hello { header, .. }
                | Message::HelloAck { header, .. }
                | Message::EdgeFit { header, .. }
                | Message::Result { header, .. }
                | Message::Warmup { header }
                | Message::StampBatch { header, .. } => header.flags |= FLAG_AUTH,
            }
            assert_eq!(parse(&signed, Some(&key)), Ok(expected));
        }
        assert_eq!(all_kinds()[0].encode(None).len(), PROBE_LEN);
    }

    #[test]
    fn forged_unsigned_or_truncated_messages_are_rejected() {
        let key = AuthKey::new(b"0123456789abcdef".to_vec()).unwrap();
        let other = AuthKey::new(b"fedcba9876543210".to_vec()).unwrap();
        let m = &all_kinds()[1];
        assert_eq!(
            parse(&m.encode(None), Some(&key)),
            Err(WireError::Unauthenticated)
        );
        assert_eq!(
            parse(&m.encode(Some(&other)), Some(&key)),
            Err(WireError::BadTag)
        );
        let mut flipped = m.encode(Some(&key));
        flipped[40] ^= 1;
        assert_eq!(parse(&flipped, Some(&key)), Err(WireError::BadTag));
        let signed = m.encode(Some(&key));
        for cut in 0..signed.len() {
            assert!(parse(&signed[..cut], Some(&key)).is_err(), "cut at {cut}");
        }
        assert!(AuthKey::new(vec![1; 15]).is_none());
    }

    #[test]
    fn bad_fields_are_errors_not_panics() {
        let mut probe = all_kinds()[0].encode(None);
        probe[5] = 99;
        assert_eq!(parse(&probe, None), Err(WireError::UnknownKind(99)));
        let mut follow = all_kinds()[1].encode(None);
        follow[32 + 12] = 77;
        assert_eq!(
            parse(&follow, None),
            Err(WireError::BadField("stamp source"))
        );
        assert_eq!(parse(&[0u8; 600], None), Err(WireError::Oversized));
        assert_eq!(parse(b"CMPB", None), Err(WireError::Truncated));
        assert_eq!(parse(&[0u8; 64], None), Err(WireError::NotClockmesh));
    }

    #[test]
    fn replay_window_accepts_new_and_late_rejects_repeats() {
        let mut w = ReplayWindow::new(8);
        assert!(w.accept(&h(kind::PROBE, 10, 0)));
        assert!(
            w.accept(&h(kind::PROBE, 10, 1)),
            "second packet of the pair"
        );
        assert!(!w.accept(&h(kind::PROBE, 10, 1)), "replay");
        assert!(w.accept(&h(kind::PROBE, 12, 0)));
        assert!(w.accept(&h(kind::PROBE, 11, 0)), "late but new");
        assert!(!w.accept(&h(kind::PROBE, 11, 0)));
        assert!(
            w.accept(&h(kind::FOLLOW_UP, 10, 0)),
            "kinds count separately"
        );
        assert!(w.accept(&h(kind::PROBE, 1000, 0)));
        assert!(!w.accept(&h(kind::PROBE, 12, 0)), "fell out of the window");
    }

    #[test]
    fn replay_state_is_bounded() {
        let mut w = ReplayWindow::new(100);
        for sender in 0..10_000u32 {
            let mut header = h(kind::PROBE, 1, 0);
            header.sender = sender;
            assert!(w.accept(&header));
        }
        assert_eq!(w.senders(), 100);
    }
}
