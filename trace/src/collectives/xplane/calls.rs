//! Which events are collective calls, and each call's instance key: its run id, or the n-th execution of its op.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::event::{Ev, lossy, str_of};
use super::plane::{PlaneHead, Role};
use crate::collectives::classify::classify;
use crate::collectives::model::{
    CallClock, CollectiveCall, CollectiveKind, InstanceKey, Interner, MatchedBy, Name,
};

/// At most this many distinct `hlo_op` strings keep their classification.
const OP_CACHE_MAX: usize = 1 << 16;

/// FNV-1a, for the short op names of the classification cache.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// What each `hlo_op` string names (bounded: past `OP_CACHE_MAX` names,
/// classified each time).
#[derive(Default)]
pub(super) struct OpCache(
    HashMap<Box<[u8]>, Option<CollectiveKind>, BuildHasherDefault<Fnv>>,
    /// The calls' names, shared.
    pub(super) Interner,
);

impl OpCache {
    #[inline]
    fn classify(&mut self, op: &[u8]) -> Option<CollectiveKind> {
        if let Some(k) = self.0.get(op) {
            return *k;
        }
        let k = classify(&String::from_utf8_lossy(op));
        if self.0.len() < OP_CACHE_MAX {
            self.0.insert(op.into(), k);
        }
        k
    }
}

/// The call an event is, if a collective (times, step, track and
/// preceding filled in later).
#[inline]
pub(super) fn call_of(
    head: &PlaneHead,
    cache: &mut OpCache,
    ev: &Ev<'_>,
) -> Option<CollectiveCall> {
    let meta = head.events.get(ev.meta);
    if meta.is_some_and(|m| m.end_marker) {
        return None;
    }
    let op = str_of(head, ev.stats[Role::HloOp as usize]);
    let kind = match (op, meta) {
        // XLA names a thunk's event by its op: no lookup.
        (Some(b), Some(m)) if b == m.name.as_bytes() => m.class,
        (Some(b), _) => cache.classify(b),
        (None, _) => meta.and_then(|m| m.class),
    }?;
    let name = meta.map_or("", |m| m.name.as_str());
    let module =
        str_of(head, ev.stats[Role::HloModule as usize]).map_or_else(|| "xla".into(), lossy);
    let group = match ev.stats[Role::ProgramId as usize].as_i64() {
        Some(id) => format!("{module}#{id}"),
        None => module,
    };
    let run = ev.stats[Role::RunId as usize].as_i64();
    Some(CollectiveCall {
        participant: 0,
        kind,
        key: InstanceKey {
            group: cache.1.name(&group),
            name: match op {
                Some(b) => cache.1.name(&String::from_utf8_lossy(b)),
                None => cache.1.name(name),
            },
            // Run ids are i64 in XLA; kept bit for bit.
            ordinal: run.map_or(0, |r| r as u64),
        },
        matched_by: if run.is_some() {
            MatchedBy::RunId
        } else {
            MatchedBy::Occurrence
        },
        op: cache.1.name(name),
        enter_ns: 0,
        exit_ns: 0,
        step: None,
        group_size: None,
        elements: None,
        preceding: None,
        clock: CallClock::Host,
        track: None,
    })
}

/// Calls without a run id: the n-th execution of each op, in time order.
pub(super) fn number_occurrences(calls: &mut [CollectiveCall]) {
    // Mostly in order already (one line): no sort, and no sort's buffer.
    if !calls.is_sorted_by_key(|c| c.enter_ns) {
        calls.sort_by_key(|c| c.enter_ns);
    }
    let mut seen: HashMap<(Name, Name), u64> = HashMap::new();
    for c in calls
        .iter_mut()
        .filter(|c| c.matched_by == MatchedBy::Occurrence)
    {
        let n = seen
            .entry((c.key.group.clone(), c.key.name.clone()))
            .or_insert(0);
        c.key.ordinal = *n;
        *n += 1;
    }
}
