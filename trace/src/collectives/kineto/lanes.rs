//! Per thread: its spans still open and what came before each call.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use super::event::{Id, IdKey};

/// Threads (pid, tid) numbered in order of appearance, and the devices
/// (a GPU event's pid: Kineto's GPU rows are `pid` device, `tid` stream)
/// numbered apart: a device's lane is no thread, and the threads' numbers
/// are the calls' [`crate::collectives::model::Track`] lines.
#[derive(Default)]
pub(super) struct Threads {
    map: HashMap<(Option<IdKey>, Option<IdKey>), usize>,
    /// The last one looked up (events of one thread come in runs).
    last: Option<(Option<IdKey>, Option<IdKey>, usize)>,
    devices: HashMap<Option<IdKey>, usize>,
    /// Per thread, its device, once a GPU event was seen on it.
    device_of: Vec<Option<usize>>,
}

/// Which lane a span is kept in, or a call asks: a thread's (its number),
/// or a device's, every stream of it together (its number).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum LaneKey {
    Thread(usize),
    Device(usize),
}

/// Whether an event of category `cat` ran on a GPU (what a GPU call's work
/// may be, on any stream of its device): kernels, copies, sets, and the
/// GPU's copies of the annotated regions.
pub(super) fn is_gpu(cat: Option<&str>) -> bool {
    matches!(
        cat,
        Some("kernel" | "gpu_memcpy" | "gpu_memset" | "gpu_user_annotation")
    )
}

impl Threads {
    pub(super) fn index(&mut self, pid: Option<&Id>, tid: Option<&Id>) -> usize {
        if let Some(i) = self.cached(pid, tid) {
            return i;
        }
        let key = (IdKey::of(pid), IdKey::of(tid));
        let next = self.map.len();
        let i = *self.map.entry(key.clone()).or_insert(next);
        self.last = Some((key.0, key.1, i));
        i
    }

    pub(super) fn find(&mut self, pid: Option<&Id>, tid: Option<&Id>) -> Option<usize> {
        if let Some(i) = self.cached(pid, tid) {
            return Some(i);
        }
        let key = (IdKey::of(pid), IdKey::of(tid));
        let i = *self.map.get(&key)?;
        self.last = Some((key.0, key.1, i));
        Some(i)
    }

    /// The device of `thread` (whose pid is `pid`), numbered on first use.
    pub(super) fn device(&mut self, thread: usize, pid: Option<&Id>) -> usize {
        if let Some(Some(d)) = self.device_of.get(thread) {
            return *d;
        }
        let next = self.devices.len();
        let d = *self.devices.entry(IdKey::of(pid)).or_insert(next);
        if self.device_of.len() <= thread {
            self.device_of.resize(thread + 1, None);
        }
        self.device_of[thread] = Some(d);
        d
    }

    fn cached(&self, pid: Option<&Id>, tid: Option<&Id>) -> Option<usize> {
        let (p, t, i) = self.last.as_ref()?;
        (IdKey::is(p.as_ref(), pid) && IdKey::is(t.as_ref(), tid)).then_some(*i)
    }
}

/// A span that may be what a thread did before a call (relative ns).
#[derive(Clone)]
pub(super) struct Work {
    pub(super) end: i128,
    pub(super) start: i128,
    /// Its place in the file.
    pub(super) idx: u64,
    pub(super) name: String,
}

impl Work {
    /// What came before a time is the span that ended last before it; of
    /// those that ended together, the longest (it encloses the others),
    /// then the first in the file.
    fn rank(&self) -> (i128, Reverse<i128>, Reverse<u64>) {
        (self.end, Reverse(self.start), Reverse(self.idx))
    }
}

/// Puts `w` (its name is `name`) into `slot` if it comes later than what
/// is there; reuses the slot's name buffer.
fn offer(slot: &mut Option<Work>, w: &Work, name: &str) {
    match slot {
        Some(s) if s.rank() >= w.rank() => {}
        Some(s) => {
            s.end = w.end;
            s.start = w.start;
            s.idx = w.idx;
            s.name.clear();
            s.name.push_str(name);
        }
        None => {
            let mut w = w.clone();
            w.name = name.to_string();
            *slot = Some(w);
        }
    }
}

/// A span that had not ended at the latest start seen on its thread.
struct Open(Work);

impl PartialEq for Open {
    fn eq(&self, other: &Self) -> bool {
        self.0.end == other.0.end
    }
}

impl Eq for Open {}

impl PartialOrd for Open {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Open {
    /// The heap's top is the one that ends first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.end.cmp(&self.0.end)
    }
}

/// A time a call was issued at, and the latest span known to have ended
/// at or before it (among those ending after the previous asked time, or
/// all, see [`Lane::before`]).
struct Ask {
    t: i128,
    best: Option<Work>,
}

/// One thread's spans, as far as "what came before a call" needs them.
///
/// A call at `t` needs the span that ended last at or before `t`. Spans
/// are kept as: those still open at the latest start seen on the thread
/// (`mark`; a handful: the ops that enclose it), and of the others only
/// the latest (`closed`): every span dropped ended no later than it. A
/// call is answered when it is seen, from these (exact when `closed`
/// ended at or before it, as it does when the thread's events come in
/// time order), and its answer is completed by the spans that come after
/// it in the file, each offered to the first asked time at or after its
/// end (`asks`, sorted). The answer for `asks[j]` is the latest over
/// `asks[..=j]`.
#[derive(Default)]
pub(super) struct Lane {
    mark: Option<i128>,
    closed: Option<Work>,
    open: BinaryHeap<Open>,
    asks: Vec<Ask>,
}

impl Lane {
    /// A call issued at `t`, seen now (before any span after it).
    pub(super) fn ask_now(&mut self, t: i128) {
        let fresh = self.asks.last().is_none_or(|a| a.t < t);
        if !fresh || self.closed.as_ref().is_some_and(|c| c.end > t) {
            // Asked already, or not answerable from what is kept: a
            // second pass will tell (see `before`).
            return;
        }
        let mut best = self.closed.clone();
        for o in &self.open {
            if o.0.end <= t {
                offer(&mut best, &o.0, &o.0.name);
            }
        }
        self.asks.push(Ask { t, best });
    }

    /// A call issued at `t`, for a second pass (before it starts).
    pub(super) fn ask(&mut self, t: i128) {
        if let Err(i) = self.asks.binary_search_by_key(&t, |a| a.t) {
            self.asks.insert(i, Ask { t, best: None });
        }
    }

    /// Offers a span to the asked time it may precede.
    pub(super) fn answer(&mut self, w: &Work, name: &str) {
        if self.asks.last().is_some_and(|a| w.end <= a.t) {
            let j = self.asks.partition_point(|a| a.t < w.end);
            offer(&mut self.asks[j].best, w, name);
        }
    }

    /// A span of this thread (not a step), in file order.
    pub(super) fn work(&mut self, mut w: Work, name: &str, pool: &mut Vec<String>) {
        self.answer(&w, name);
        let mark = match self.mark {
            Some(m) if m >= w.start => m,
            _ => {
                // Spans that ended by this start can only matter to later
                // calls as the latest of them.
                while let Some(top) = self.open.peek()
                    && top.0.end <= w.start
                {
                    let Some(Open(done)) = self.open.pop() else {
                        break;
                    };
                    close(&mut self.closed, done, pool);
                }
                self.mark = Some(w.start);
                w.start
            }
        };
        if w.end <= mark {
            offer(&mut self.closed, &w, name);
        } else {
            let mut buf = pool.pop().unwrap_or_default();
            buf.clear();
            buf.push_str(name);
            w.name = buf;
            self.open.push(Open(w));
        }
    }

    /// After the last span: each asked time's answer becomes the latest
    /// over it and the times before it.
    pub(super) fn finish(&mut self) {
        for j in 1..self.asks.len() {
            let (done, rest) = self.asks.split_at_mut(j);
            if let Some(prev) = &done[j - 1].best
                && rest[0].best.as_ref().is_none_or(|w| w.rank() < prev.rank())
            {
                rest[0].best = Some(prev.clone());
            }
        }
    }

    /// How many spans are open (kept whole).
    #[cfg(test)]
    pub(super) fn open_len(&self) -> usize {
        self.open.len()
    }

    /// What came before a call issued at `t` (after [`Lane::finish`]).
    pub(super) fn before(&self, t: i128) -> Before<'_> {
        match self.asks.binary_search_by_key(&t, |a| a.t) {
            Ok(j) => self.asks[j]
                .best
                .as_ref()
                .map_or(Before::Nothing, Before::Span),
            Err(_) => Before::Unknown,
        }
    }
}

/// What a [`Lane`] says came before a call.
pub(super) enum Before<'a> {
    /// Not asked, or not answerable from what the first pass kept (a
    /// second pass tells).
    Unknown,
    /// Nothing on the thread ended at or before the call.
    Nothing,
    /// The span that ended last at or before the call.
    Span(&'a Work),
}

impl<'a> Before<'a> {
    /// The span, when there is one (none when [`Before::Unknown`]).
    pub(super) fn span(self) -> Option<&'a Work> {
        match self {
            Self::Span(w) => Some(w),
            Self::Unknown | Self::Nothing => None,
        }
    }
}

/// Keeps the later of `closed` and `w`; the other's name buffer goes back
/// to `pool`.
fn close(closed: &mut Option<Work>, w: Work, pool: &mut Vec<String>) {
    match closed {
        Some(c) if c.rank() >= w.rank() => pool.push(w.name),
        _ => {
            if let Some(old) = closed.replace(w) {
                pool.push(old.name);
            }
        }
    }
}
