//! What each call followed: the work event that ended last at or before
//! its enter, on its line (host planes) or on any line of its device
//! (device planes: every stream).

use super::event::{Ev, lossy, parse_event, span, str_of};
use super::plane::{PlaneHead, Role};
use super::source::Src;
use super::walk::{Item, walk_line};
use crate::TraceError;
use crate::collectives::model::{CollectiveCall, Interner, Name, Preceding};
use crate::collectives::{Timed, preceding_before};

/// A work event that may have preceded calls: `seq` is its place among
/// the lines walked.
#[derive(Clone)]
struct Cand {
    seq: u64,
    meta: i64,
    start: i64,
    end: i64,
    /// Its XLA op name (device planes), else `None`: named by `meta`.
    op: Option<Name>,
}

/// Whether `a` is what preceded rather than `b`: the later end, then the
/// earlier start (the enclosing op), then the earlier in the plane.
fn better(a: &Cand, b: Option<&Cand>) -> bool {
    use std::cmp::Reverse;
    b.is_none_or(|b| {
        (a.end, Reverse(a.start), Reverse(a.seq)) > (b.end, Reverse(b.start), Reverse(b.seq))
    })
}

/// Fills in what each of `calls` followed: the work event of `lines`
/// (each `(pos, len, line start)`) that ended last at or before its enter
/// (as [`crate::collectives::preceding_before`]): a host plane's call's
/// own line; a device plane's every stream, for a GPU call waits for
/// work on other streams (XLA may run collectives on a stream of their
/// own). Each event goes to the first call entered at or after its end,
/// where only the best of each call's events is kept: memory of the calls
/// only.
///
/// With `op_names` (device planes), an event that carries XLA's op name
/// (the `name` stat: `jit(step)/forward/dot_general`, the framework op
/// with its name scopes) is named by it rather than by its kernel
/// (`void cutlass::Kernel2<cutlass_80_simt_sgemm_…>`, the same for every
/// matmul of a shape, whatever op it computes).
pub(super) fn preceding_pass<R: Src>(
    r: &mut R,
    head: &PlaneHead,
    lines: &[(u64, u64, i64)],
    calls: &mut [CollectiveCall],
    scratch: &mut Vec<u8>,
    names: &mut Interner,
    op_names: bool,
) -> Result<(), TraceError> {
    let mut enters: Vec<i64> = calls.iter().map(|c| c.enter_ns).collect();
    enters.sort_unstable();
    let mut best: Vec<Option<Cand>> = vec![None; enters.len()];
    let (mut seq, mut hint) = (0u64, 0usize);
    for &(pos, len, line_start) in lines {
        walk_line(r, (pos, len), scratch, |item| {
            let Item::Event(c) = item else {
                return Ok(());
            };
            let mut ev = Ev::new();
            parse_event(c, op_names.then_some(&head.roles), &mut ev)?;
            seq += 1;
            let Some(off) = ev.offset_ps else {
                return Ok(());
            };
            let (start, end) = span(line_start, off, ev.duration_ps);
            if end <= start || head.events.get(ev.meta).is_some_and(|m| m.marker) {
                return Ok(());
            }
            // Lines are mostly in time order: the last event's bucket first.
            let fits = |i: usize| {
                i.checked_sub(1).is_none_or(|p| enters[p] < end)
                    && enters.get(i).is_none_or(|&t| t >= end)
            };
            if !fits(hint) {
                hint = enters.partition_point(|&t| t < end);
            }
            let i = hint;
            if let Some(slot) = best.get_mut(i) {
                let mut c = Cand {
                    seq,
                    meta: ev.meta,
                    start,
                    end,
                    op: None,
                };
                if better(&c, slot.as_ref()) {
                    c.op = str_of(head, ev.stats[Role::OpName as usize])
                        .filter(|b| !b.is_empty())
                        .map(|b| names.name(&lossy(b)));
                    *slot = Some(c);
                }
            }
            Ok(())
        })?;
    }
    // The buckets' winners: for a call, those of its own and earlier
    // buckets are exactly the ones that ended by its enter.
    let mut winners: Vec<Timed<(u64, i64, Option<Name>)>> = best
        .into_iter()
        .flatten()
        .map(|c| Timed {
            name: (c.seq, c.meta, c.op),
            start_ns: c.start,
            end_ns: c.end,
        })
        .collect();
    winners.sort_by_key(|t| (t.end_ns, t.start_ns, t.name.0));
    for c in calls.iter_mut() {
        c.preceding = preceding_before(&winners, c.enter_ns).map(|t| Preceding {
            name: match &t.name.2 {
                Some(op) => op.clone(),
                None => names.name(head.event_name(t.name.1)),
            },
            start_ns: t.start_ns,
            end_ns: t.end_ns,
        });
    }
    Ok(())
}
