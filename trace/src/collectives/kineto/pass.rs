//! The passes over the events: the first keeps what the calls need as
//! the events stream by, the second answers what the first could not.

use std::collections::HashMap;

use super::event::{Args, Event, Text};
use super::lanes::{Lane, LaneKey, Threads, Work, is_gpu};
use super::link::{CommsOp, Launch};
use super::{CallArgs, Found, Step, Tier, malformed, tier};
use crate::TraceError;
use crate::collectives::classify::{classify, classify_comms_arg};
use crate::collectives::model::CollectiveKind;
use crate::kineto::us_to_ps;

/// Distinct event names whose classification is remembered.
const NAME_CACHE: usize = 4096;

/// The first pass over the events: the candidate calls, the steps and what
/// each thread did.
#[derive(Default)]
pub(super) struct Pass {
    pub(super) threads: Threads,
    pub(super) lanes: Vec<Lane>,
    /// One lane a device: its GPU events on every stream, for the GPU
    /// calls' work.
    pub(super) devices: Vec<Lane>,
    /// Spare name buffers (what a lane lets go of).
    pool: Vec<String>,
    /// Names already classified.
    names: Names,
    pub(super) found: Vec<Found>,
    /// The `record_param_comms` ops: which collective each call is.
    pub(super) comms: Vec<CommsOp>,
    /// Kernel launches by correlation id.
    pub(super) launches: HashMap<u64, Launch>,
    pub(super) steps: Vec<Step>,
    /// Timed `X` events so far (the next one's index in file order).
    pub(super) seen: u64,
    /// The earliest and latest start (relative ns).
    pub(super) range: Option<(i128, i128)>,
}

/// A timed `X` event (with a name and a time): its name, its span
/// (relative ns) and its number in file order, which `seen` counts.
struct Timed<'a> {
    name: Text<'a>,
    start: i128,
    end: i128,
    idx: u64,
}

/// `ev` as a [`Timed`] event, taking its name; `None` for any other event
/// (both passes number the same events).
fn timed<'a>(ev: &mut Event<'a>, seen: &mut u64) -> Result<Option<Timed<'a>>, TraceError> {
    if ev.ph.as_deref() != Some("X") {
        return Ok(None);
    }
    let (Some(ts), Some(name)) = (ev.ts, ev.name.take()) else {
        return Ok(None);
    };
    let start = us_to_ps(ts)?.div_euclid(1000);
    let dur = i64::try_from(us_to_ps(ev.dur.unwrap_or(0.0))?.div_euclid(1000))
        .map_err(|_| malformed("an event time is out of range"))?;
    let idx = *seen;
    *seen += 1;
    Ok(Some(Timed {
        name,
        start,
        end: start + i128::from(dur),
        idx,
    }))
}

impl Pass {
    pub(super) fn event(&mut self, mut ev: Event) -> Result<(), TraceError> {
        let Some(Timed {
            name,
            start,
            end,
            idx,
        }) = timed(&mut ev, &mut self.seen)?
        else {
            return Ok(());
        };
        self.range = Some(match self.range {
            Some((lo, hi)) => (lo.min(start), hi.max(start)),
            None => (start, start),
        });
        let thread = self.threads.index(ev.pid.as_ref(), ev.tid.as_ref());
        if thread == self.lanes.len() {
            self.lanes.push(Lane::default());
        }
        let cat = ev.cat.as_deref();
        let device = is_gpu(cat).then(|| self.threads.device(thread, ev.pid.as_ref()));
        if let Some(d) = device
            && d == self.devices.len()
        {
            self.devices.push(Lane::default());
        }
        let lane = &mut self.lanes[thread];
        if let Some(launch) = Launch::of(cat, thread, start, ev.args.as_ref()) {
            self.launches.insert(launch.0, launch.1);
        }
        if &*name == "record_param_comms" {
            self.comms.push(CommsOp {
                thread,
                start,
                end,
                args: CallArgs::of(ev.args.take()),
            });
        }
        if let Some(kind) = classify_event(&mut self.names, &name, ev.args.as_ref()) {
            // A call may be issued here: what this thread did before it
            // is asked now (the spans that end before it may all be known
            // already) and completed by the spans still to come.
            lane.ask_now(start);
            let tier = tier(&name, cat);
            if let (Tier::Kernel, Some(d)) = (tier, device) {
                // A kernel's work is the device's (see `work_point`).
                self.devices[d].ask_now(start);
            }
            self.found.push(Found {
                name: name.to_string(),
                kind,
                tier,
                thread,
                device,
                start,
                end,
                args: CallArgs::of(ev.args),
            });
        }
        match name.strip_prefix("ProfilerStep#") {
            Some(n) => {
                // Kineto repeats each step on the GPU rows
                // (`gpu_user_annotation`): the CPU's step is the one that
                // holds the launches.
                if let (Ok(n), false) = (n.parse(), is_gpu_annotation(cat)) {
                    self.steps.push(Step { n, start, end });
                }
            }
            None => {
                let w = Work {
                    end,
                    start,
                    idx,
                    name: String::new(),
                };
                if let Some(d) = device {
                    self.devices[d].work(w.clone(), &name, &mut self.pool);
                }
                self.lanes[thread].work(w, &name, &mut self.pool);
            }
        }
        Ok(())
    }
}

fn is_gpu_annotation(cat: Option<&str>) -> bool {
    cat == Some("gpu_user_annotation")
}

/// The second pass: only what came before the calls the first could not
/// answer.
pub(super) struct Again<'a> {
    pub(super) threads: &'a mut Threads,
    pub(super) lanes: &'a mut HashMap<LaneKey, Lane>,
    pub(super) seen: u64,
}

impl Again<'_> {
    pub(super) fn event(&mut self, mut ev: Event) -> Result<(), TraceError> {
        let Some(Timed {
            name,
            start,
            end,
            idx,
        }) = timed(&mut ev, &mut self.seen)?
        else {
            return Ok(());
        };
        let Some(thread) = self.threads.find(ev.pid.as_ref(), ev.tid.as_ref()) else {
            return Err(TraceError::Changed);
        };
        if name.starts_with("ProfilerStep#") {
            return Ok(());
        }
        let w = Work {
            end,
            start,
            idx,
            name: String::new(),
        };
        if let Some(lane) = self.lanes.get_mut(&LaneKey::Thread(thread)) {
            lane.answer(&w, &name);
        }
        if is_gpu(ev.cat.as_deref()) {
            let d = self.threads.device(thread, ev.pid.as_ref());
            if let Some(lane) = self.lanes.get_mut(&LaneKey::Device(d)) {
                lane.answer(&w, &name);
            }
        }
        Ok(())
    }
}

/// Event names already classified.
type Names = HashMap<Box<str>, Option<CollectiveKind>, NameHash>;

/// A hash for event names: a multiply-rotate over 8 bytes at a time
/// (SipHash was a few percent of reading a trace), seeded per process.
#[derive(Clone, Copy)]
struct NameHash(u64);

impl Default for NameHash {
    fn default() -> Self {
        use std::hash::BuildHasher;
        Self(std::collections::hash_map::RandomState::new().hash_one(0u8) | 1)
    }
}

impl std::hash::BuildHasher for NameHash {
    type Hasher = NameHasher;
    fn build_hasher(&self) -> NameHasher {
        NameHasher(self.0)
    }
}

struct NameHasher(u64);

impl NameHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl std::hash::Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes(w.try_into().unwrap_or_default()));
        }
        let rest = words.remainder();
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        self.add(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 59));
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

fn classify_event(names: &mut Names, name: &str, args: Option<&Args>) -> Option<CollectiveKind> {
    if name == "record_param_comms" {
        // Wraps the dispatcher op; the backend's span or kernel is the call.
        return None;
    }
    let kind = match names.get(name) {
        Some(k) => *k,
        None => {
            let k = classify(name);
            if names.len() < NAME_CACHE {
                names.insert(name.into(), k);
            }
            k
        }
    };
    kind.or_else(|| {
        // Kernels named by the backend only (RCCL builds) carry the
        // collective's name in their args.
        let a = args?;
        a.collective
            .as_deref()
            .filter(|_| a.seq.is_some())
            .and_then(classify_comms_arg)
    })
}
