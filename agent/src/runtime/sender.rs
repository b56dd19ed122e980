//! The probe sender: one thread that sends coded pairs to every ready peer
//! in rounds and reads the kernel's TX timestamps back.
//!
//! A thread rather than a task: the two packets of a pair must leave a known
//! spacing apart, a sub-millisecond sleep the async runtime's timer cannot
//! give. Every peer is probed in the same round (one wake-up for all of
//! them, not one per peer: wake-ups, not packets, dominate an idle agent's
//! CPU); rounds are jittered ±20 % around the cadence, or around a part
//! of it when a peer short of pure pairs gets several pairs a cadence
//! (`clockmesh_core::probe_rate`; the others skip rounds). Probes leave from
//! their own socket so the `OPT_ID` counter of SO_TIMESTAMPING numbers
//! probes only.

use std::{
    collections::{HashMap, VecDeque},
    net::{SocketAddr, UdpSocket},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use clockmesh_estimator::NodeId;
use tokio::sync::mpsc::UnboundedSender;

use tracing::{debug, warn};

use crate::{
    capture::{
        clocks,
        timestamping::{self, StampMode, Stamps, TxReport},
    },
    probe::{
        ProbeHeader,
        wire::{AuthKey, Message, kind},
    },
};

/// The `index` under which a warm-up's send is tracked (its TX report is
/// read and dropped, so the kernel's OPT_ID numbering stays in step).
const WARMUP_INDEX: u8 = u8::MAX;

/// A peer to probe (from the protocol core's `SetTargets`).
pub use clockmesh_core::node::Target;
use clockmesh_core::{node::targets_in_round, probe_rate::rounds_per_cadence};

#[derive(Clone, Debug)]
pub struct SenderConfig {
    pub me: NodeId,
    pub cadence: Duration,
    pub spacing: Duration,
    pub key: Option<AuthKey>,
    /// First sequence number (e.g. start time in µs, so a restarted agent
    /// never reuses sequence numbers a peer's replay window has seen).
    pub seq_base: u64,
    pub stamp_mode: StampMode,
}

/// What the sender reports to the agent loop.
#[derive(Clone, Copy, Debug)]
pub enum SenderEvent {
    /// Both packets of pair `seq` to `to` left; `sent_ns` is REALTIME at the first.
    Sent { to: NodeId, seq: u64, sent_ns: i64 },
    /// The kernel's TX stamps of one packet.
    TxStamp {
        to: NodeId,
        seq: u64,
        index: u8,
        stamps: Stamps,
    },
}

#[derive(Debug, Default)]
pub struct SenderStats {
    pub pairs_sent: AtomicU64,
    pub warmups_sent: AtomicU64,
    /// Every datagram the probe socket sent, and their UDP payload bytes.
    pub datagrams_sent: AtomicU64,
    pub payload_bytes_sent: AtomicU64,
    pub send_errors: AtomicU64,
    /// TX reports that did not match a probe we remember.
    pub unmatched_tx_reports: AtomicU64,
    /// Times the TX report numbering restarted after a failed send.
    pub tx_id_restarts: AtomicU64,
}

/// Handle to the running sender; dropping it stops the thread.
pub struct Sender {
    /// A new peer list, until the thread takes it.
    targets: Arc<Mutex<Option<Vec<Target>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
    pub stats: Arc<SenderStats>,
}

impl Sender {
    /// Binds the probe socket (to `bind`, port 0) and starts the thread.
    pub fn start(
        cfg: SenderConfig,
        bind: SocketAddr,
        events: UnboundedSender<Vec<SenderEvent>>,
    ) -> std::io::Result<Self> {
        let sock = UdpSocket::bind(bind)?;
        timestamping::enable(&sock, cfg.stamp_mode)?;
        sock.set_nonblocking(true)?;
        let targets = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(SenderStats::default());
        let mut worker = Worker {
            cfg,
            sock,
            events,
            batch: Vec::new(),
            targets: targets.clone(),
            stop: stop.clone(),
            stats: stats.clone(),
            peers: Vec::new(),
            seqs: HashMap::new(),
            next_round: Instant::now(),
            rounds: 0,
            awaiting_reports: 0,
            report_retries: 0,
            sent_ids: VecDeque::new(),
            next_id: 0,
            rng: 0,
        };
        let thread = thread::Builder::new()
            .name("clockmesh-sender".into())
            .spawn(move || worker.run())?;
        Ok(Sender {
            targets,
            stop,
            thread: Some(thread),
            stats,
        })
    }

    /// Replaces the set of peers to probe.
    pub fn set_targets(&self, targets: Vec<Target>) {
        *self.targets.lock().unwrap_or_else(|e| e.into_inner()) = Some(targets);
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Probes we sent whose TX reports may still come: (OPT_ID, peer, seq, index, sent REALTIME).
type SentId = (u32, NodeId, u64, u8, i64);
const MAX_SENT_IDS: usize = 4096;
/// A TX report further than this from the send time belongs to another packet.
const MAX_REPORT_DELAY_NS: i64 = 50_000_000;
/// Longest sleep: target changes and stop requests are seen this promptly.
const MAX_IDLE: Duration = Duration::from_millis(200);
/// TX stamps a round still lacks are looked for again after 1, 2, 4, 8 and
/// 16 ms (NIC stamps come at transmit completion; software stamps are
/// queued during the send itself and need no second look).
const REPORT_RETRIES: u32 = 5;

struct Worker {
    cfg: SenderConfig,
    sock: UdpSocket,
    events: UnboundedSender<Vec<SenderEvent>>,
    /// Reported once per loop turn: one wake-up of the agent loop, not three per pair.
    batch: Vec<SenderEvent>,
    targets: Arc<Mutex<Option<Vec<Target>>>>,
    stop: Arc<AtomicBool>,
    stats: Arc<SenderStats>,
    /// Probed every round.
    peers: Vec<Target>,
    /// Next sequence number per peer, kept when a peer leaves and comes
    /// back (its replay window has seen the old numbers).
    seqs: HashMap<NodeId, u64>,
    next_round: Instant,
    rounds: u64,
    /// Datagrams of the last round whose TX reports have not come yet.
    awaiting_reports: usize,
    report_retries: u32,
    sent_ids: VecDeque<SentId>,
    next_id: u32,
    rng: u64,
}

impl Worker {
    fn run(&mut self) {
        // The socket is bound and configured: this thread needs no privilege.
        if let Err(e) = super::privileges::drop_all() {
            warn!("sender: dropping capabilities: {e}");
        }
        // Tight timers for the pair spacing (default slack is 50 µs).
        let _ = nix::sys::prctl::set_timerslack(1_000);
        self.rng = u64::from(self.cfg.me).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.cfg.seq_base;
        // Random phase: agents started together must not probe together.
        self.next_round = Instant::now() + self.cfg.cadence.mul_f64(self.random());
        while !self.stop.load(Ordering::Relaxed) {
            self.refresh_targets();
            let now = Instant::now();
            if now >= self.next_round {
                self.send_round();
                // ±20 % jitter keeps nodes from synchronising; never fall
                // behind by more than one period (after a stall, skip
                // rather than burst).
                let jitter = 0.8 + 0.4 * self.random();
                self.next_round = (self.next_round + self.round_period().mul_f64(jitter)).max(now);
            }
            self.read_tx_reports();
            if !self.batch.is_empty() {
                let _ = self.events.send(std::mem::take(&mut self.batch));
            }
            thread::sleep(self.sleep_time());
        }
    }

    /// The cadence shared by the rounds a cadence the fastest peer needs
    /// (a peer short of pure pairs gets several pairs a cadence).
    fn round_period(&self) -> Duration {
        self.cfg.cadence / self.rounds_per_cadence()
    }

    fn rounds_per_cadence(&self) -> u32 {
        rounds_per_cadence(self.peers.iter().map(|t| t.pairs_per_cadence))
    }

    /// Until the next round, or a short while if TX stamps are still due.
    fn sleep_time(&mut self) -> Duration {
        let until_round = self.next_round.saturating_duration_since(Instant::now());
        if self.awaiting_reports > 0 && self.report_retries < REPORT_RETRIES {
            let retry = Duration::from_millis(1 << self.report_retries);
            self.report_retries += 1;
            return retry.min(until_round);
        }
        until_round.min(MAX_IDLE)
    }

    /// Uniform in [0, 1).
    fn random(&mut self) -> f64 {
        // splitmix64: cheap, good enough for schedule jitter.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Applies a new peer list, if one was set since the last turn.
    fn refresh_targets(&mut self) {
        let Some(targets) = self
            .targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        for t in &targets {
            self.seqs.entry(t.id).or_insert(self.cfg.seq_base);
        }
        self.peers = targets;
    }

    /// One coded pair to every peer: the warm-ups, every first packet, the
    /// spacing, every second packet. The starting peer rotates so that no
    /// peer always waits behind the others' packets.
    fn send_round(&mut self) {
        if self.peers.is_empty() {
            return;
        }
        self.rounds += 1;
        self.awaiting_reports = 0;
        self.report_retries = 0;
        let round: Vec<(Target, u64)> = targets_in_round(&self.peers, self.rounds)
            .into_iter()
            .map(|t| {
                let seq = self.seqs.entry(t.id).or_insert(self.cfg.seq_base);
                *seq += 1;
                (t, *seq - 1)
            })
            .collect();
        if round.is_empty() {
            return;
        }
        // Untimed, over the same path just before the pair: the timed
        // packets then find it warm (docs/agent-tradeoff.md).
        for &(t, seq) in round.iter().filter(|(t, _)| t.warmup) {
            let sent_ns = clocks::now_ns(nix::time::ClockId::CLOCK_REALTIME);
            if self.send_one(&self.warmup(t, seq), t, seq, WARMUP_INDEX, sent_ns) {
                self.stats.warmups_sent.fetch_add(1, Ordering::Relaxed);
            }
        }
        let sent_ns = clocks::now_ns(nix::time::ClockId::CLOCK_REALTIME);
        let t0 = Instant::now();
        let firsts: Vec<bool> = round
            .iter()
            .map(|&(t, seq)| self.send_one(&self.probe(t, seq, 0), t, seq, 0, sent_ns))
            .collect();
        self.pause_until(t0 + self.cfg.spacing);
        for (&(t, seq), first_sent) in round.iter().zip(firsts) {
            if first_sent && self.send_one(&self.probe(t, seq, 1), t, seq, 1, sent_ns) {
                self.stats.pairs_sent.fetch_add(1, Ordering::Relaxed);
                self.batch.push(SenderEvent::Sent {
                    to: t.id,
                    seq,
                    sent_ns,
                });
            }
        }
    }

    fn probe(&self, target: Target, seq: u64, index: u8) -> Vec<u8> {
        let header = ProbeHeader::probe(self.cfg.me, target.id, seq, index, self.spacing_ns());
        Message::Probe { header }.encode(self.cfg.key.as_ref())
    }

    fn warmup(&self, target: Target, seq: u64) -> Vec<u8> {
        let header = ProbeHeader {
            kind: kind::WARMUP,
            ..ProbeHeader::probe(self.cfg.me, target.id, seq, 0, self.spacing_ns())
        };
        Message::Warmup { header }.encode(self.cfg.key.as_ref())
    }

    fn spacing_ns(&self) -> u32 {
        u32::try_from(self.cfg.spacing.as_nanos()).unwrap_or(u32::MAX)
    }

    fn send_one(&mut self, datagram: &[u8], target: Target, seq: u64, index: u8, t: i64) -> bool {
        match self.sock.send_to(datagram, target.addr) {
            Ok(n) => {
                self.stats.datagrams_sent.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .payload_bytes_sent
                    .fetch_add(n as u64, Ordering::Relaxed);
                self.awaiting_reports += 1;
                self.sent_ids
                    .push_back((self.next_id, target.id, seq, index, t));
                self.next_id = self.next_id.wrapping_add(1);
                if self.sent_ids.len() > MAX_SENT_IDS {
                    self.sent_ids.pop_front();
                }
                true
            }
            Err(e) => {
                self.stats.send_errors.fetch_add(1, Ordering::Relaxed);
                debug!(peer = target.id, "probe send failed: {e}");
                self.restart_tx_ids();
                false
            }
        }
    }

    /// After a failed send, the kernel may have used a TX report number or
    /// not: the reports queued so far are matched under the old numbers,
    /// then both sides count from 0 again. Otherwise every later report
    /// would be matched to the probe before its own.
    fn restart_tx_ids(&mut self) {
        // Software stamps are queued during the send itself: all of them
        // are in. A NIC stamp still to come is lost (not mismatched: its
        // probe is forgotten).
        self.read_tx_reports();
        match timestamping::restart_tx_ids(&self.sock, self.cfg.stamp_mode) {
            Ok(()) => {
                self.next_id = 0;
                self.sent_ids.clear();
                self.awaiting_reports = 0;
                self.stats.tx_id_restarts.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => warn!("sender: restarting TX report numbers: {e}"),
        }
    }

    /// Sleeps (no spin: the gap is measured by the TX stamps anyway, and
    /// the estimator accepts gaps up to twice the nominal spacing).
    fn pause_until(&self, t: Instant) {
        let now = Instant::now();
        if t > now {
            thread::sleep(t - now);
        }
    }

    fn read_tx_reports(&mut self) {
        let mut reports: Vec<TxReport> = Vec::new();
        if let Err(e) = timestamping::drain_tx_reports(&self.sock, &mut reports) {
            warn!("reading TX timestamps: {e}");
        }
        for r in reports.into_iter().filter(|r| r.tstype == 0) {
            self.match_report(r);
        }
    }

    /// The probe the kernel numbered `id`. Ids are consecutive (one per
    /// sent datagram), so it is found by position; a search from the newest
    /// end covers a kernel that numbered differently.
    fn sent(&self, id: u32) -> Option<SentId> {
        let front = self.sent_ids.front()?.0;
        let at = id.wrapping_sub(front) as usize;
        match self.sent_ids.get(at) {
            Some(s) if s.0 == id => Some(*s),
            _ => self.sent_ids.iter().rev().find(|s| s.0 == id).copied(),
        }
    }

    fn match_report(&mut self, r: TxReport) {
        let found = self.sent(r.id);
        let plausible = |sent: i64| {
            r.stamps.software_ns == 0 || (r.stamps.software_ns - sent).abs() < MAX_REPORT_DELAY_NS
        };
        if found.is_some() {
            self.awaiting_reports = self.awaiting_reports.saturating_sub(1);
        }
        match found {
            // The warm-up's stamp times nothing.
            Some((.., WARMUP_INDEX, _)) => {}
            Some((_, to, seq, index, sent)) if plausible(sent) => {
                self.batch.push(SenderEvent::TxStamp {
                    to,
                    seq,
                    index,
                    stamps: r.stamps,
                });
            }
            _ => {
                self.stats
                    .unmatched_tx_reports
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Over loopback: a peer given four pairs a cadence gets about four
    /// times the pairs of one at the cadence, within the same rounds.
    #[test]
    fn a_peer_short_of_pure_pairs_gets_several_pairs_a_cadence() {
        let cfg = SenderConfig {
            me: 1,
            cadence: Duration::from_millis(40),
            spacing: Duration::from_micros(100),
            key: None,
            seq_base: 0,
            stamp_mode: StampMode::Software,
        };
        let (events, _keep) = tokio::sync::mpsc::unbounded_channel();
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let sender = Sender::start(cfg, loopback, events).unwrap();
        let peer = |id, pairs_per_cadence| {
            let sock = UdpSocket::bind(loopback).unwrap();
            sock.set_read_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            let target = Target {
                id,
                addr: sock.local_addr().unwrap(),
                warmup: false,
                pairs_per_cadence,
            };
            (sock, target)
        };
        let (fast, fast_target) = peer(2, 4);
        let (slow, slow_target) = peer(3, 1);
        sender.set_targets(vec![fast_target, slow_target]);
        thread::sleep(Duration::from_millis(1_200));
        drop(sender);
        // The sockets' buffers hold every datagram of the run.
        let received = |sock: &UdpSocket| {
            let mut buf = [0u8; 256];
            std::iter::from_fn(|| sock.recv(&mut buf).ok()).count()
        };
        let (to_fast, to_slow) = (received(&fast) as u32, received(&slow) as u32);
        // 30 cadences: about 60 datagrams to the slow peer, 240 to the fast.
        assert!(to_slow >= 20, "slow peer: {to_slow} datagrams");
        assert!(
            f64::from(to_fast) >= 3.0 * f64::from(to_slow),
            "fast peer {to_fast}, slow peer {to_slow} datagrams"
        );
    }
}
