//! The probe sender: one thread that sends coded pairs to every ready peer
//! on a jittered schedule and reads the kernel's TX timestamps back.
//!
//! A thread rather than a task: the two packets of a pair must leave a known
//! spacing apart, a sub-millisecond sleep the async runtime's timer cannot
//! give. Between pairs the thread sleeps (at most 50 ms), then reads the TX
//! stamps the kernel queued on the socket's error queue.
//! Probes leave from their own socket so the `OPT_ID` counter of
//! SO_TIMESTAMPING numbers probes only.

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
        wire::{AuthKey, KIND_WARMUP, Message},
    },
};

/// The `index` under which a warm-up's send is tracked (its TX report is
/// read and dropped, so the kernel's OPT_ID numbering stays in step).
const WARMUP_INDEX: u8 = u8::MAX;

/// A peer to probe (from the protocol core's `SetTargets`).
pub use clockmesh_core::node::Target;

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
    pub send_errors: AtomicU64,
    /// TX reports that did not match a probe we remember.
    pub unmatched_tx_reports: AtomicU64,
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
            schedule: HashMap::new(),
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

struct Slot {
    next_due: Instant,
    seq: u64,
}

/// Probes we sent whose TX reports may still come: (OPT_ID, peer, seq, index, sent REALTIME).
type SentId = (u32, NodeId, u64, u8, i64);
const MAX_SENT_IDS: usize = 4096;
/// A TX report further than this from the send time belongs to another packet.
const MAX_REPORT_DELAY_NS: i64 = 50_000_000;
/// Longest sleep: TX reports are read at least this often (well inside the
/// agent's settle time) and target changes and stop requests seen promptly.
const MAX_IDLE: Duration = Duration::from_millis(50);

struct Worker {
    cfg: SenderConfig,
    sock: UdpSocket,
    events: UnboundedSender<Vec<SenderEvent>>,
    /// Reported once per loop turn: one wake-up of the agent loop, not three per pair.
    batch: Vec<SenderEvent>,
    targets: Arc<Mutex<Option<Vec<Target>>>>,
    stop: Arc<AtomicBool>,
    stats: Arc<SenderStats>,
    schedule: HashMap<NodeId, (Target, Slot)>,
    sent_ids: VecDeque<SentId>,
    next_id: u32,
    rng: u64,
}

impl Worker {
    fn run(&mut self) {
        // Tight timers for the pair spacing (default slack is 50 µs).
        let _ = nix::sys::prctl::set_timerslack(1_000);
        self.rng = u64::from(self.cfg.me).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.cfg.seq_base;
        while !self.stop.load(Ordering::Relaxed) {
            self.refresh_schedule();
            let now = Instant::now();
            let due = self.schedule.values().map(|(_, s)| s.next_due).min();
            match due {
                Some(t) if t <= now => self.send_due(now),
                Some(t) => self.wait(t - now),
                None => self.wait(MAX_IDLE),
            }
            self.read_tx_reports();
            if !self.batch.is_empty() {
                let _ = self.events.send(std::mem::take(&mut self.batch));
            }
        }
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
    fn refresh_schedule(&mut self) {
        let Some(targets) = self
            .targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        // A peer whose address or capabilities changed starts a new slot.
        self.schedule
            .retain(|id, (t, _)| targets.iter().any(|n| n.id == *id && n == t));
        let cadence = self.cfg.cadence;
        for t in targets {
            if self.schedule.contains_key(&t.id) {
                continue;
            }
            // Random phase: edges added together must not fire together.
            let phase = cadence.mul_f64(self.random());
            let slot = Slot {
                next_due: Instant::now() + phase,
                seq: self.cfg.seq_base,
            };
            self.schedule.insert(t.id, (t, slot));
        }
    }

    fn send_due(&mut self, now: Instant) {
        let due: Vec<NodeId> = self
            .schedule
            .iter()
            .filter(|(_, (_, s))| s.next_due <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let jitter = 0.8 + 0.4 * self.random();
            let Some((target, slot)) = self.schedule.get_mut(&id) else {
                continue;
            };
            let (target, seq) = (*target, slot.seq);
            slot.seq += 1;
            // ±20 % jitter keeps edges from synchronising; never fall behind
            // by more than one period (after a stall, skip rather than burst).
            let next = slot.next_due + self.cfg.cadence.mul_f64(jitter);
            slot.next_due = next.max(now);
            self.send_pair(target, seq);
        }
    }

    fn send_pair(&mut self, target: Target, seq: u64) {
        let spacing_ns = u32::try_from(self.cfg.spacing.as_nanos()).unwrap_or(u32::MAX);
        let encode = |index: u8| {
            Message::Probe {
                header: ProbeHeader::probe(self.cfg.me, target.id, seq, index, spacing_ns),
            }
            .encode(self.cfg.key.as_ref())
        };
        let (first, second) = (encode(0), encode(1));
        // Untimed, over the same path just before the pair: the timed
        // packets then find it warm (docs/agent-tradeoff.md).
        if target.warmup {
            let warmup = Message::Warmup {
                header: ProbeHeader {
                    kind: KIND_WARMUP,
                    ..ProbeHeader::probe(self.cfg.me, target.id, seq, 0, spacing_ns)
                },
            }
            .encode(self.cfg.key.as_ref());
            let sent_ns = clocks::now_ns(nix::time::ClockId::CLOCK_REALTIME);
            self.send_one(&warmup, target, seq, WARMUP_INDEX, sent_ns);
        }
        let sent_ns = clocks::now_ns(nix::time::ClockId::CLOCK_REALTIME);
        let t0 = Instant::now();
        if !self.send_one(&first, target, seq, 0, sent_ns) {
            return;
        }
        self.pause_until(t0 + self.cfg.spacing);
        if !self.send_one(&second, target, seq, 1, sent_ns) {
            return;
        }
        self.stats.pairs_sent.fetch_add(1, Ordering::Relaxed);
        self.batch.push(SenderEvent::Sent {
            to: target.id,
            seq,
            sent_ns,
        });
    }

    fn send_one(&mut self, datagram: &[u8], target: Target, seq: u64, index: u8, t: i64) -> bool {
        match self.sock.send_to(datagram, target.addr) {
            Ok(_) => {
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
                false
            }
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

    /// Sleeps until the next pair is due (at most [`MAX_IDLE`]). TX reports
    /// are read after each turn; waking on each one would double the wake-ups.
    fn wait(&self, timeout: Duration) {
        thread::sleep(timeout.min(MAX_IDLE));
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

    fn match_report(&mut self, r: TxReport) {
        let found = self.sent_ids.iter().find(|s| s.0 == r.id).copied();
        let plausible = |sent: i64| {
            r.stamps.software_ns == 0 || (r.stamps.software_ns - sent).abs() < MAX_REPORT_DELAY_NS
        };
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
