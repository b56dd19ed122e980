//! Calls matched by occurrence (no sequence number, no run id): which of
//! one rank's calls is which of another's, when their captures started
//! and stopped at different calls.
//!
//! In each (framework, group), every rank's calls are one sequence in
//! time order, each call a *signature*: kind, name, group size and input
//! elements. The rank with the most calls is the reference; another
//! rank's sequence fits it at a *shift* d (its i-th call is the
//! reference's (i + d)-th) when every call they both cover agrees. A
//! missing head or tail (a profiler started later or stopped earlier) is
//! a shift; a call in the middle that only one rank has fits no shift.
//!
//! A periodic job fits at many shifts (every step does the same calls).
//! Then, in order: the shift at which the ranks' steps agree, when exactly
//! one does and the exits do not clearly single out another; else the shift at which the ranks' exits line up, when it
//! lines them up far better (4×) than any other: every rank leaves an
//! instance together (the last arrival releases them), while the next
//! instance ends at least one call later. Exits are chosen over enters
//! because a straggler enters late by design, and a late enter can sit
//! closer to the *next* instance of an early rank than to its own.
//! Otherwise the group is refused with its reason: pairing the wrong
//! calls would report stragglers and causality violations that are
//! matching errors.

use std::collections::{BTreeMap, HashMap};

use super::analyse::UnmatchedReason;
use super::model::{CollectiveCall, CollectiveKind, Framework, MatchedBy, Name, Participant};

/// How much better the chosen shift's exits must line up than the next.
const EXIT_MARGIN: u128 = 4;
/// Calls sampled per shift to compare exits.
const EXIT_SAMPLES: usize = 33;

/// Which timeline the calls are on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Clocks {
    /// The merged timeline: ranks' exits of one instance line up.
    Aligned,
    /// Each rank's own host clock (`--no-align`).
    Raw,
}

/// Groups whose sequences could not be aligned, with why.
pub(crate) type Refused = HashMap<(Framework, Name), UnmatchedReason>;

/// Renumbers the occurrence-matched calls so equal ordinals are one
/// instance across ranks; returns the groups it refused (their calls are
/// left as they were, for the analysis to list as unmatched).
pub(crate) fn align_occurrences(
    participants: &[Participant],
    calls: &mut [CollectiveCall],
    clocks: Clocks,
) -> Refused {
    let mut refused = Refused::new();
    for ((framework, group), ranks) in sequences(participants, calls) {
        if let Err(reason) = align_group(calls, &ranks, clocks) {
            refused.insert((framework, group), reason);
        }
    }
    refused
}

/// Per (framework, group), per participant: its occurrence-matched calls
/// (indices into `calls`) in time order.
fn sequences(
    participants: &[Participant],
    calls: &[CollectiveCall],
) -> BTreeMap<(Framework, Name), BTreeMap<usize, Vec<usize>>> {
    let mut groups: BTreeMap<(Framework, Name), BTreeMap<usize, Vec<usize>>> = BTreeMap::new();
    for (i, c) in calls.iter().enumerate() {
        let Some(p) = participants.get(c.participant) else {
            continue;
        };
        if c.matched_by != MatchedBy::Occurrence || c.exit_ns < c.enter_ns {
            continue;
        }
        groups
            .entry((p.framework, c.key.group.clone()))
            .or_default()
            .entry(c.participant)
            .or_default()
            .push(i);
    }
    for ranks in groups.values_mut() {
        for seq in ranks.values_mut() {
            seq.sort_by_key(|&i| (calls[i].enter_ns, calls[i].key.ordinal));
        }
    }
    groups
}

/// What must agree between two ranks' calls of one instance.
type Signature = (CollectiveKind, Name, Option<u32>, Option<u64>);

fn signature(c: &CollectiveCall) -> Signature {
    (c.kind, c.key.name.clone(), c.group_size, c.elements)
}

/// One rank's sequence as signature ids, steps and exits.
struct Sequence {
    participant: usize,
    sigs: Vec<u32>,
    steps: Vec<Option<u64>>,
    exits: Vec<i64>,
}

/// Aligns one group's ranks to its reference and renumbers their calls.
fn align_group(
    calls: &mut [CollectiveCall],
    ranks: &BTreeMap<usize, Vec<usize>>,
    clocks: Clocks,
) -> Result<(), UnmatchedReason> {
    if ranks.len() < 2 {
        return Ok(());
    }
    let mut ids: HashMap<Signature, u32> = HashMap::new();
    let seqs: Vec<Sequence> = ranks
        .iter()
        .map(|(&participant, idx)| {
            let mut id = |c: &CollectiveCall| {
                let next = ids.len() as u32;
                *ids.entry(signature(c)).or_insert(next)
            };
            Sequence {
                participant,
                sigs: idx.iter().map(|&i| id(&calls[i])).collect(),
                steps: idx.iter().map(|&i| calls[i].step).collect(),
                exits: idx.iter().map(|&i| calls[i].exit_ns).collect(),
            }
        })
        .collect();
    // The longest sequence (the first of equals) is the reference.
    let reference = seqs
        .iter()
        .enumerate()
        .max_by_key(|(n, s)| (s.sigs.len(), std::cmp::Reverse(*n)))
        .map(|(_, s)| s)
        .ok_or(UnmatchedReason::SingleRank)?;
    let mut shifts = Vec::with_capacity(seqs.len());
    for s in &seqs {
        let (d, by_time) = if std::ptr::eq(s, reference) {
            (0, false)
        } else {
            shift(s, reference, clocks)?
        };
        shifts.push((d, by_time));
    }
    let lowest = shifts.iter().map(|(d, _)| *d).min().unwrap_or(0);
    let mut at: HashMap<i64, u32> = HashMap::new();
    for (s, &(d, _)) in seqs.iter().zip(&shifts) {
        // Heads and tails outside the reference must agree too.
        for (i, &sig) in s.sigs.iter().enumerate() {
            if *at.entry(i as i64 + d).or_insert(sig) != sig {
                return Err(UnmatchedReason::OrderNotAligned {
                    participant: s.participant,
                    reference: reference.participant,
                });
            }
        }
    }
    // One shift chosen by exit times makes the whole group's pairing rest
    // on them.
    let by_time = shifts.iter().any(|(_, t)| *t);
    for (&(d, _), idx) in shifts.iter().zip(ranks.values()) {
        for (i, &c) in idx.iter().enumerate() {
            // d ≥ lowest: every ordinal is ≥ 0.
            calls[c].key.ordinal = (i as i64 + d - lowest) as u64;
            if by_time {
                calls[c].matched_by = MatchedBy::ExitTimes;
            }
        }
    }
    Ok(())
}

/// The shift at which `s` fits `reference`, and whether exit times chose
/// it among several.
fn shift(
    s: &Sequence,
    reference: &Sequence,
    clocks: Clocks,
) -> Result<(i64, bool), UnmatchedReason> {
    let fits = fitting_shifts(&s.sigs, &reference.sigs);
    let not_aligned = || UnmatchedReason::OrderNotAligned {
        participant: s.participant,
        reference: reference.participant,
    };
    // A single fit that covers at least half the shorter sequence is
    // the shift; one that covers only a few calls at the edges may be
    // chance, and must also line up in time.
    let shorter = s.sigs.len().min(reference.sigs.len());
    let covers_half = |d: i64| 2 * overlap(s.sigs.len(), reference.sigs.len(), d).len() >= shorter;
    match fits.as_slice() {
        [] => return Err(not_aligned()),
        [d] if covers_half(*d) => return Ok((*d, false)),
        _ => {}
    }
    let by_steps: Vec<i64> = fits
        .iter()
        .copied()
        .filter(|&d| steps_agree(s, reference, d))
        .collect();
    if let [d] = by_steps.as_slice() {
        // Steps read off a device's timeline can be one off (an op run
        // after its step's span); on aligned clocks, exits that clearly
        // point elsewhere contradict them, and then neither is trusted.
        // Raw clocks' exits say nothing against steps.
        if clocks == Clocks::Raw {
            return Ok((*d, false));
        }
        return match by_exits(s, reference, &fits) {
            Exits::One(e) if e != *d => Err(UnmatchedReason::OrderAmbiguous {
                participant: s.participant,
                reference: reference.participant,
                shifts: 2,
            }),
            _ => Ok((*d, false)),
        };
    }
    let candidates = if by_steps.is_empty() {
        &fits
    } else {
        &by_steps
    };
    match by_exits(s, reference, candidates) {
        Exits::One(d) => Ok((d, true)),
        Exits::None => Err(not_aligned()),
        Exits::Several(n) => Err(UnmatchedReason::OrderAmbiguous {
            participant: s.participant,
            reference: reference.participant,
            shifts: n as u64,
        }),
    }
}

/// The calls `s` (at i) and the reference (at i + d) both cover.
fn overlap(len: usize, ref_len: usize, d: i64) -> std::ops::Range<usize> {
    let lo = (-d).max(0) as usize;
    let hi = (ref_len as i64 - d).clamp(0, len as i64) as usize;
    lo..hi.max(lo)
}

/// Every shift at which the two sequences agree wherever both have a call.
fn fitting_shifts(sigs: &[u32], reference: &[u32]) -> Vec<i64> {
    let (n, m) = (sigs.len() as i64, reference.len() as i64);
    ((1 - n)..m)
        .filter(|&d| {
            let r = overlap(sigs.len(), reference.len(), d);
            let rr = (r.start as i64 + d) as usize..(r.end as i64 + d) as usize;
            !r.is_empty() && sigs[r] == reference[rr]
        })
        .collect()
}

/// The ranks' steps are equal wherever both know a call's step, and both
/// know it for at least half the calls they both cover (calls outside
/// every step, such as a barrier before the first, say nothing).
fn steps_agree(s: &Sequence, reference: &Sequence, d: i64) -> bool {
    let both = overlap(s.steps.len(), reference.steps.len(), d);
    let mut known = 0;
    for i in both.clone() {
        if let (Some(a), Some(b)) = (s.steps[i], reference.steps[(i as i64 + d) as usize]) {
            if a != b {
                return false;
            }
            known += 1;
        }
    }
    2 * known >= both.len()
}

/// What the exits say among the shifts that fit.
enum Exits {
    /// This shift lines them up.
    One(i64),
    /// None lines them up.
    None,
    /// So many shifts line them up about as well.
    Several(usize),
}

/// The shifts at which the exits line up: each exit far closer
/// ([`EXIT_MARGIN`]) to its partner's than the reference's consecutive
/// exits are to each other (a call is paired with the one it ended with,
/// not a neighbour); one of them, when it lines them up [`EXIT_MARGIN`]
/// times closer than any other shift.
fn by_exits(s: &Sequence, reference: &Sequence, candidates: &[i64]) -> Exits {
    let mut scored: Vec<(u128, i64)> = candidates
        .iter()
        .map(|&d| (exit_distance(s, reference, d), d))
        .collect();
    scored.sort_unstable();
    let close = |x: u128, than: u128| x.saturating_mul(EXIT_MARGIN) < than;
    let spacing = exit_spacing(&reference.exits);
    let lined_up = scored.iter().filter(|(x, _)| close(*x, spacing)).count();
    match scored.as_slice() {
        _ if lined_up == 0 => Exits::None,
        [(_, d)] => Exits::One(*d),
        [(best, d), (next, _), ..] if close(*best, *next) => Exits::One(*d),
        _ => Exits::Several(lined_up.max(2)),
    }
}

/// The median time between consecutive exits of a rank's calls.
fn exit_spacing(exits: &[i64]) -> u128 {
    let mut gaps: Vec<u128> = exits
        .windows(2)
        .map(|w| (i128::from(w[1]) - i128::from(w[0])).unsigned_abs())
        .collect();
    gaps.sort_unstable();
    gaps.get(gaps.len() / 2).copied().unwrap_or(0)
}

/// The median |exit difference| over up to [`EXIT_SAMPLES`] calls both
/// cover, evenly spread.
fn exit_distance(s: &Sequence, reference: &Sequence, d: i64) -> u128 {
    let r = overlap(s.exits.len(), reference.exits.len(), d);
    let step = r.len().div_ceil(EXIT_SAMPLES).max(1);
    let mut diffs: Vec<u128> = r
        .step_by(step)
        .map(|i| {
            let theirs = reference.exits[(i as i64 + d) as usize];
            (i128::from(s.exits[i]) - i128::from(theirs)).unsigned_abs()
        })
        .collect();
    diffs.sort_unstable();
    diffs.get(diffs.len() / 2).copied().unwrap_or(u128::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectives::analyse::{Analysis, AnalysisOptions, analyse};
    use crate::collectives::model::InstanceKey;

    const MS: i64 = 1_000_000;

    fn people(n: usize) -> Vec<Participant> {
        (0..n)
            .map(|r| Participant {
                host: format!("h{r}"),
                rank: Some(r as u64),
                framework: Framework::PyTorch,
                trace: format!("rank{r}.json"),
                bound_ns: Some(1_000),
            })
            .collect()
    }

    /// One iteration's collectives: (group, name, kind, elements, ranks).
    const ITERATION: &[(&str, &str, CollectiveKind, u64, &[usize])] = &[
        (
            "0",
            "gloo:all_reduce",
            CollectiveKind::AllReduce,
            1024,
            &[0, 1, 2],
        ),
        (
            "0",
            "gloo:all_reduce",
            CollectiveKind::AllReduce,
            1024,
            &[0, 1, 2],
        ),
        (
            "0",
            "gloo:all_gather",
            CollectiveKind::AllGather,
            64,
            &[0, 1, 2],
        ),
        (
            "1",
            "gloo:all_reduce",
            CollectiveKind::AllReduce,
            8,
            &[0, 1],
        ),
    ];

    /// A job of 10 iterations, 10 ms apart, rank 2 arriving 3 ms late at
    /// each iteration's first call, the calls back to back (the next is
    /// entered as soon as the last one left); each rank's capture covers
    /// `windows[rank]` iterations. Calls are numbered by occurrence per
    /// (rank, group, name), as the parsers number them.
    fn job(windows: &[std::ops::Range<u64>], steps: bool) -> Vec<CollectiveCall> {
        let mut calls = Vec::new();
        let mut seen: HashMap<(usize, &str, &str), u64> = HashMap::new();
        for it in 0..10u64 {
            let mut t = it as i64 * 10 * MS;
            for (n, &(group, name, kind, elements, ranks)) in ITERATION.iter().enumerate() {
                let late = |r: usize| if n == 0 && r == 2 { 3 * MS } else { 0 };
                let last = ranks.iter().map(|&r| t + late(r)).max().unwrap_or(t);
                let exit = last + 100_000;
                for &r in ranks.iter().filter(|&&r| windows[r].contains(&it)) {
                    let o = seen.entry((r, group, name)).or_insert(0);
                    calls.push(CollectiveCall {
                        participant: r,
                        kind,
                        key: InstanceKey {
                            group: group.into(),
                            name: name.into(),
                            ordinal: *o,
                        },
                        matched_by: MatchedBy::Occurrence,
                        op: name.into(),
                        enter_ns: t + late(r) + r as i64 * 10_000,
                        exit_ns: exit + r as i64 * 1_000,
                        step: steps.then_some(it),
                        group_size: None,
                        elements: Some(elements),
                        preceding: None,
                        clock: crate::collectives::CallClock::Host,
                        track: None,
                    });
                    *o += 1;
                }
                t = exit + 20_000;
            }
        }
        calls
    }

    fn run(calls: Vec<CollectiveCall>) -> Analysis {
        analyse(&people(3), calls, &AnalysisOptions::default())
    }

    /// The windows the tests use: rank 1 starts 3 iterations late, rank 2
    /// stops 2 early.
    fn windows() -> Vec<std::ops::Range<u64>> {
        vec![0..10, 3..10, 0..8]
    }

    #[test]
    fn pairing_calls_by_occurrence_alone_invents_violations() {
        // What the analysis did before: the n-th call of each rank is one
        // instance. The trap the other tests must not fall into.
        let mut calls = job(&windows(), false);
        for c in &mut calls {
            c.matched_by = MatchedBy::Sequence;
        }
        assert!(run(calls).summary.causality_violations > 0);
    }

    #[test]
    fn capture_windows_that_differ_are_aligned_by_steps() {
        let a = run(job(&windows(), true));
        assert_eq!(a.summary.causality_violations, 0);
        assert_eq!(a.summary.unmatched_by_reason.order_ambiguous, 0);
        // Group 0: iterations 3..8 have all three ranks; group 1 (ranks 0,
        // 1): iterations 3..10.
        assert_eq!(a.summary.matched, 5 * 3 + 7);
        assert!(
            a.instances
                .iter()
                .all(|i| i.matched_by == MatchedBy::Occurrence)
        );
        let firsts: Vec<&_> = a
            .instances
            .iter()
            .filter(|i| i.late_by_ns > MS as u64)
            .collect();
        assert_eq!(firsts.len(), 5);
        assert!(
            firsts.iter().all(|i| i.last == 2),
            "rank 2 is the straggler"
        );
    }

    #[test]
    fn steps_one_off_on_a_rank_that_the_exits_contradict_are_refused() {
        // Rank 1's steps are read one late (its ops ran after their
        // step's span): its steps agree with the others' one call
        // iteration off, its exits where they truly belong.
        let mut calls = job(&windows(), true);
        for c in calls.iter_mut().filter(|c| c.participant == 1) {
            c.step = c.step.map(|s| s + 1);
        }
        let a = run(calls);
        assert_eq!(a.summary.causality_violations, 0);
        assert!(a.summary.unmatched_by_reason.order_ambiguous > 0);
    }

    #[test]
    fn on_raw_clocks_steps_decide_whatever_the_exits_say() {
        // Rank 1's clock one iteration ahead, so its exits line up with
        // the next iteration's: on the merged timeline that contradicts
        // the steps (refused); on raw clocks the steps decide.
        let mut calls = job(&windows(), true);
        for c in calls.iter_mut().filter(|c| c.participant == 1) {
            c.enter_ns += 10 * MS;
            c.exit_ns += 10 * MS;
        }
        let raw = AnalysisOptions {
            aligned: false,
            ..Default::default()
        };
        let a = analyse(&people(3), calls.clone(), &raw);
        assert_eq!(a.summary.matched, 5 * 3 + 7);
        assert_eq!(a.summary.unmatched_by_reason.order_ambiguous, 0);
        assert!(run(calls).summary.unmatched_by_reason.order_ambiguous > 0);
    }

    #[test]
    fn calls_outside_every_step_do_not_keep_the_steps_from_deciding() {
        // Each rank's first and last call (a barrier before the loop and
        // after it) has no step; exits that line up nowhere, so only the
        // steps can decide.
        let mut calls = job(&windows(), true);
        for p in 0..3 {
            let mine = |c: &&mut CollectiveCall| c.participant == p;
            if let Some(c) = calls.iter_mut().filter(mine).min_by_key(|c| c.enter_ns) {
                c.step = None;
            }
            if let Some(c) = calls.iter_mut().filter(mine).max_by_key(|c| c.enter_ns) {
                c.step = None;
            }
        }
        for c in calls.iter_mut().filter(|c| c.participant == 1) {
            c.exit_ns += 5 * MS;
            c.enter_ns += 5 * MS;
        }
        let a = analyse(
            &people(3),
            calls,
            &AnalysisOptions {
                aligned: false,
                ..Default::default()
            },
        );
        assert_eq!(a.summary.matched, 5 * 3 + 7);
        assert!(
            a.instances
                .iter()
                .all(|i| i.matched_by == MatchedBy::Occurrence)
        );
    }

    #[test]
    fn without_steps_the_exits_tell_the_shift() {
        let a = run(job(&windows(), false));
        assert_eq!(a.summary.causality_violations, 0);
        assert_eq!(a.summary.matched, 5 * 3 + 7);
        assert!(
            a.instances
                .iter()
                .all(|i| i.matched_by == MatchedBy::ExitTimes)
        );
        assert!(a.instances.iter().all(|i| i.end_spread_ns < 10_000));
    }

    #[test]
    fn a_rank_that_skips_a_call_gets_its_group_refused() {
        let mut calls = job(&windows(), true);
        // Rank 1 has no all-gather in iteration 5 (and its later ones are
        // numbered one lower, as a parser numbers them).
        let skipped = calls
            .iter()
            .position(|c| {
                c.participant == 1 && &*c.key.name == "gloo:all_gather" && c.step == Some(5)
            })
            .unwrap();
        calls.remove(skipped);
        for c in calls
            .iter_mut()
            .filter(|c| c.participant == 1 && &*c.key.name == "gloo:all_gather" && c.step > Some(5))
        {
            c.key.ordinal -= 1;
        }
        let a = run(calls);
        assert_eq!(a.summary.causality_violations, 0);
        // Group 1 is untouched; group 0 is refused whole, with why.
        assert_eq!(a.summary.matched, 7);
        let refused: Vec<_> = a
            .unmatched
            .iter()
            .filter(|u| &*u.key.group == "0")
            .collect();
        assert_eq!(refused.len(), 30);
        assert!(refused.iter().all(|u| u.reason
            == UnmatchedReason::OrderNotAligned {
                participant: 1,
                reference: 0
            }));
    }

    #[test]
    fn a_call_in_the_middle_that_no_shift_fits_is_refused() {
        let mut calls = job(&[0..10, 0..10, 0..10], false);
        // Rank 2 says its 6th all-gather had other sizes.
        let c = calls
            .iter_mut()
            .find(|c| c.participant == 2 && &*c.key.name == "gloo:all_gather" && c.key.ordinal == 5)
            .unwrap();
        c.elements = Some(65);
        let a = run(calls);
        assert_eq!(a.summary.causality_violations, 0);
        assert_eq!(a.summary.unmatched_by_reason.order_not_aligned, 30);
        assert!(a.unmatched.iter().any(|u| u.reason
            == UnmatchedReason::OrderNotAligned {
                participant: 2,
                reference: 0
            }));
    }

    #[test]
    fn shifts_whose_exits_do_not_line_up_are_refused() {
        // Exits that line up at no shift: rank 1's clock half an
        // iteration off (what raw clocks may look like).
        let mut calls = job(&windows(), false);
        for c in calls.iter_mut().filter(|c| c.participant == 1) {
            c.enter_ns += 5 * MS;
            c.exit_ns += 5 * MS;
        }
        let a = run(calls);
        assert_eq!(a.summary.causality_violations, 0);
        assert_eq!(a.summary.matched, 0);
        assert!(a.unmatched.iter().any(|u| matches!(
            u.reason,
            UnmatchedReason::OrderNotAligned { participant: 1, .. }
        )));
    }

    #[test]
    fn equal_windows_still_match_every_instance() {
        let a = run(job(&[0..10, 0..10, 0..10], false));
        assert_eq!(a.summary.matched, 40);
        assert_eq!(a.summary.unmatched, 0);
        assert_eq!(a.summary.causality_violations, 0);
    }

    /// Random occurrence-matched jobs (kinds, names, windows, steps and
    /// times, extremes included): never a panic, every instance has each
    /// participant at most once, every call is in one instance.
    #[test]
    fn random_jobs_align_without_panic_or_double_counting() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n.max(1)
        };
        let times = [0, 1, MS, -MS, i64::MAX, i64::MIN, 10 * MS];
        for _ in 0..300 {
            let ranks = 1 + next(4) as usize;
            let mut calls = Vec::new();
            for p in 0..ranks {
                for o in 0..next(12) {
                    let kind =
                        [CollectiveKind::AllReduce, CollectiveKind::Broadcast][next(2) as usize];
                    let enter = match next(4) {
                        0 => times[next(times.len() as u64) as usize],
                        _ => (o as i64) * MS + next(1000) as i64,
                    };
                    let exit = enter.saturating_add(next(3) as i64 * 100_000);
                    calls.push(CollectiveCall {
                        participant: p,
                        kind,
                        key: InstanceKey {
                            group: ["0", "1"][next(2) as usize].into(),
                            name: ["a", "b"][next(2) as usize].into(),
                            ordinal: o,
                        },
                        matched_by: MatchedBy::Occurrence,
                        op: "x".into(),
                        enter_ns: enter,
                        exit_ns: exit,
                        step: (next(3) > 0).then(|| next(4)),
                        group_size: None,
                        elements: (next(2) == 0).then(|| next(3)),
                        preceding: None,
                        clock: crate::collectives::CallClock::Host,
                        track: None,
                    });
                }
            }
            let n = calls.len() as u64;
            for aligned in [true, false] {
                let opts = AnalysisOptions {
                    aligned,
                    ..Default::default()
                };
                let a = analyse(&people(ranks), calls.clone(), &opts);
                let s = &a.summary;
                assert_eq!(s.matched + s.unmatched, s.instances);
                let in_instances: usize = a.instances.iter().map(|i| i.ranks.len()).sum();
                let in_unmatched: usize = a.unmatched.iter().map(|u| u.participants.len()).sum();
                assert!(in_instances + in_unmatched <= n as usize);
                for i in &a.instances {
                    let mut ps: Vec<usize> = i.ranks.iter().map(|r| r.participant).collect();
                    ps.sort_unstable();
                    ps.dedup();
                    assert_eq!(
                        ps.len(),
                        i.ranks.len(),
                        "a participant twice in {:?}",
                        i.key
                    );
                }
            }
        }
    }
}
