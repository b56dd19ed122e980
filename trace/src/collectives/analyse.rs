//! Calls → instances → stragglers and the causality check.
//!
//! Definitions (all times on the analysed timeline, ns; a rank's bound is
//! its participant's `bound_ns`, unknown counted as 0):
//!
//! * **Instance**: the calls of all ranks with one framework and one
//!   [`InstanceKey`]. It is *matched* when every rank of its group took part
//!   exactly once with the same kind: `group_size` ranks when the trace
//!   states it, else every participant of the framework seen calling the
//!   group at all (a group a participant calls is one it belongs to).
//! * **Last arriver**: the rank with the latest enter (ties: the higher
//!   participant index). **Wait** of a rank: last enter − own enter.
//!   **Late by**: last enter − second-last enter; it is **significant** when
//!   it exceeds the two ranks' combined bound, otherwise the last arrival
//!   is *within alignment error* (the order of the two may be an artefact
//!   of the clocks).
//! * **Wait caused** by a straggler: over the instances where it was the
//!   significant last arriver, the sum of every other rank's wait.
//! * **Before arriving**: the straggler's `preceding` event: its duration
//!   (`compute_ns`, end − start) and the **host gap** (enter − its end,
//!   clamped at 0): time on the host between finishing the previous op and
//!   entering the collective.
//! * **Causality** (kinds with [`CollectiveKind::waits_for_all`]): no rank
//!   can leave before the last has entered, so for every pair of ranks
//!   `enter_i − exit_j ≤ bound_i + bound_j` on a correctly aligned
//!   timeline. The check takes the pair that violates most: i maximising
//!   `enter_i − bound_i` and j minimising `exit_j + bound_j` (i = j never
//!   violates), which catches every violating pair in O(ranks).
//!
//! Differences are computed in i128 and stored as u64 (non-negative) or
//! saturated i64, so no input, `i64::MIN`/`MAX` included, can overflow.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use super::align;
use super::model::{
    CollectiveCall, CollectiveKind, Framework, InstanceKey, MatchedBy, Name, Participant, Track,
};

/// How to analyse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AnalysisOptions {
    /// The calls are on the merged (aligned) timeline. `false`
    /// (`--no-align`): raw host clocks; every bound is unknown (taken as 0),
    /// whatever the participants say.
    pub aligned: bool,
    /// How many preceding op names to keep per straggler.
    pub top_preceding: usize,
}

impl Default for AnalysisOptions {
    fn default() -> Self {
        Self {
            aligned: true,
            top_preceding: 3,
        }
    }
}

/// Everything `clockmesh trace collectives` reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Analysis {
    /// `false`: raw host clocks (`--no-align`), bounds unknown (0).
    pub aligned: bool,
    /// The participants as analysed, indexed by `participant` everywhere;
    /// with `--no-align` their `bound_ns` is `null`.
    pub participants: Vec<Participant>,
    pub summary: Summary,
    /// Per participant (rank), by wait caused, descending.
    pub stragglers: Vec<Straggler>,
    /// Per host, by wait caused, descending.
    pub hosts: Vec<HostStragglers>,
    /// Per step (instances whose calls carry a step), by step.
    pub steps: Vec<StepSummary>,
    /// Matched instances in time order (first enter).
    pub instances: Vec<Instance>,
    /// Instances that are not matched, in time order, with why.
    pub unmatched: Vec<Unmatched>,
    /// The causality violations, in time order.
    pub violations: Vec<Violation>,
}

/// The session in figures.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Calls given, and those dropped before matching.
    pub calls: u64,
    pub calls_dropped: DroppedCalls,
    pub instances: u64,
    pub matched: u64,
    pub unmatched: u64,
    pub unmatched_by_reason: UnmatchedCounts,
    /// Matched instances whose last arriver was late beyond the bound.
    pub significant: u64,
    /// Matched instances whose last arrival is within alignment error.
    pub within_alignment_error: u64,
    /// Σ wait caused over the significant instances, ns.
    pub wait_caused_ns: u64,
    /// Matched instances of a kind that waits for all ranks.
    pub causality_checked: u64,
    pub causality_violations: u64,
}

/// Calls that could not take part.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DroppedCalls {
    /// `participant` is no index into the participants.
    pub unknown_participant: u64,
    /// `exit_ns` < `enter_ns`.
    pub exit_before_enter: u64,
}

/// Unmatched instances per reason (see [`UnmatchedReason`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnmatchedCounts {
    pub missing_ranks: u64,
    pub duplicate_call: u64,
    pub kind_disagrees: u64,
    pub group_size_disagrees: u64,
    pub more_ranks_than_group_size: u64,
    pub single_rank: u64,
    pub order_not_aligned: u64,
    pub order_ambiguous: u64,
}

/// One matched collective instance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    pub framework: Framework,
    pub key: InstanceKey,
    pub kind: CollectiveKind,
    /// How the first arriver's call was matched.
    pub matched_by: MatchedBy,
    /// The last arriver's step (else the first call's that has one).
    pub step: Option<u64>,
    /// Every rank's call, in arrival order (enter, then participant).
    pub ranks: Vec<RankCall>,
    pub first_enter_ns: i64,
    pub last_enter_ns: i64,
    /// max enter − min enter.
    pub arrival_spread_ns: u64,
    /// max exit − min exit.
    pub end_spread_ns: u64,
    /// The last arriver and the one before it (participant indices).
    pub last: usize,
    pub second_last: usize,
    /// last enter − second-last enter.
    pub late_by_ns: u64,
    /// bound(last) + bound(second last), unknown counted as 0.
    pub combined_bound_ns: u64,
    /// Both bounds are known.
    pub bound_known: bool,
    /// `late_by_ns > combined_bound_ns`; `false`: within alignment error.
    pub significant: bool,
    /// The longest and the total wait of the other ranks.
    pub max_wait_ns: u64,
    pub total_wait_ns: u64,
    /// What the last arriver did just before.
    pub before_last: Option<BeforeArrival>,
    /// `None`: the kind does not wait for all ranks (not checked).
    pub causality: Option<CausalityCheck>,
}

/// One rank's part of an instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankCall {
    pub participant: usize,
    pub op: Name,
    /// Enter and exit, each ± `bound_ns`.
    pub enter_ns: i64,
    pub exit_ns: i64,
    /// The host's alignment bound plus, for a GPU stamp, the profiler's
    /// conversion error (`profiler_conversion_ns`). `None`: unknown
    /// (counted as 0).
    pub bound_ns: Option<u64>,
    /// The part of `bound_ns` that is the profiler's GPU→host conversion
    /// ([`super::model::PROFILER_GPU_CONVERSION_NS`]; 0 for host stamps).
    #[serde(default)]
    pub profiler_conversion_ns: u64,
    /// last enter − own enter.
    pub wait_ns: u64,
    /// Its plane and line in an xplane trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub track: Option<Track>,
}

/// What a rank did right before entering.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BeforeArrival {
    /// The previous event on the calling thread.
    pub name: Name,
    /// Its duration (end − start).
    pub compute_ns: u64,
    /// enter − its end, clamped at 0.
    pub host_gap_ns: u64,
}

/// The causality check of one instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CausalityCheck {
    /// The rank maximising enter − bound, and the one minimising
    /// exit + bound (participant indices).
    pub entered_last: usize,
    pub exited_first: usize,
    /// enter(entered_last) − exit(exited_first); > 0: one left before the
    /// other entered.
    pub overlap_ns: i64,
    /// bound(entered_last) + bound(exited_first).
    pub combined_bound_ns: u64,
    /// `overlap_ns > combined_bound_ns`: the timeline is provably
    /// misaligned for these two ranks.
    pub violation: bool,
    /// overlap − combined bound when a violation, else 0.
    pub excess_ns: u64,
}

/// A causality violation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// Index into [`Analysis::instances`].
    pub instance: usize,
    pub framework: Framework,
    pub key: InstanceKey,
    pub kind: CollectiveKind,
    #[serde(flatten)]
    pub check: CausalityCheck,
}

/// An instance that could not be analysed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unmatched {
    pub framework: Framework,
    pub key: InstanceKey,
    /// The first call's kind.
    pub kind: CollectiveKind,
    /// The participants that did call it, sorted.
    pub participants: Vec<usize>,
    pub first_enter_ns: i64,
    #[serde(flatten)]
    pub reason: UnmatchedReason,
}

/// Why an instance is not matched. Serialized as `"reason": "snake_case"`
/// beside its fields.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum UnmatchedReason {
    /// Ranks of the group did not call it. The common case: instances at
    /// the very start or end of the session that some rank's capture
    /// window did not cover (its profiler started later or stopped
    /// earlier). `expected`: the group size (stated, or the participants
    /// seen in the group); `missing`: the known participants that are
    /// absent (fewer than expected − present when some ranks' traces were
    /// not given at all).
    MissingRanks { expected: u64, missing: Vec<usize> },
    /// These participants called the same key more than once: the key does
    /// not identify one instance (a parser or occurrence-count problem).
    DuplicateCall { participants: Vec<usize> },
    /// The ranks disagree on what the collective is.
    KindDisagrees { kinds: Vec<CollectiveKind> },
    /// The ranks state different group sizes.
    GroupSizeDisagrees { sizes: Vec<u32> },
    /// More participants called it than the stated group size: two groups
    /// share a name, or the traces overlap (the same rank twice).
    MoreRanksThanGroupSize { group_size: u32 },
    /// Only one rank is in the group (or only one trace was given): there
    /// is nothing to compare.
    SingleRank,
    /// Matched by occurrence (no sequence number, no run id), and this
    /// participant's calls of the group fit the reference participant's
    /// at no shift: a call in the middle that one of them lacks, or calls
    /// that disagree in kind, name, group size or elements. The whole
    /// group is refused (which call is which is unknown).
    OrderNotAligned {
        participant: usize,
        reference: usize,
    },
    /// Matched by occurrence, and this participant's calls fit the
    /// reference's at `shifts` shifts (the job repeats itself) that
    /// neither the steps nor the exit times tell apart. The whole group
    /// is refused.
    OrderAmbiguous {
        participant: usize,
        reference: usize,
        shifts: u64,
    },
}

/// One participant as a straggler.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Straggler {
    pub participant: usize,
    pub host: String,
    pub rank: Option<u64>,
    /// Matched instances it took part in.
    pub instances: u64,
    /// Times it was the significant last arriver.
    pub times_last: u64,
    /// Times it was last within alignment error (not counted above).
    pub times_last_within_error: u64,
    /// Σ other ranks' waits over its significant last arrivals.
    pub wait_caused_ns: u64,
    /// Mean and max `late_by_ns` over its significant last arrivals.
    pub mean_late_by_ns: u64,
    pub max_late_by_ns: u64,
    /// How long it waited for others, over all matched instances.
    pub waited_ns: u64,
    /// What it did before its significant last arrivals.
    pub before: BeforeSummary,
}

/// What a straggler did before its significant last arrivals.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BeforeSummary {
    /// Significant last arrivals with a known preceding event.
    pub arrivals: u64,
    /// Σ duration of those preceding events.
    pub compute_ns: u64,
    /// Σ host gap (enter − preceding end).
    pub host_gap_ns: u64,
    /// The preceding op names with the most total duration.
    pub top_ops: Vec<OpTime>,
}

/// One preceding op name, aggregated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpTime {
    pub name: String,
    pub count: u64,
    pub total_ns: u64,
}

/// One host as a straggler: its participants together.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostStragglers {
    pub host: String,
    pub participants: Vec<usize>,
    pub times_last: u64,
    pub times_last_within_error: u64,
    pub wait_caused_ns: u64,
    pub mean_late_by_ns: u64,
    pub max_late_by_ns: u64,
}

/// One training step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepSummary {
    pub step: u64,
    /// Matched instances in the step, and the significant ones.
    pub instances: u64,
    pub significant: u64,
    /// Σ wait caused in the step.
    pub wait_caused_ns: u64,
    pub max_arrival_spread_ns: u64,
    /// The participant that caused the most wait in the step.
    pub top_straggler: Option<usize>,
    pub top_straggler_wait_caused_ns: u64,
}

/// Analyse the calls of one session; never panics.
pub fn analyse(
    participants: &[Participant],
    calls: Vec<CollectiveCall>,
    opts: &AnalysisOptions,
) -> Analysis {
    let participants: Vec<Participant> = participants
        .iter()
        .cloned()
        .map(|mut p| {
            if !opts.aligned {
                p.bound_ns = None;
            }
            p
        })
        .collect();
    let mut summary = Summary {
        calls: calls.len() as u64,
        ..Summary::default()
    };
    let mut calls = calls;
    let clocks = if opts.aligned {
        align::Clocks::Aligned
    } else {
        align::Clocks::Raw
    };
    let refused = align::align_occurrences(&participants, &mut calls, clocks);
    let by_key = group_calls(&participants, calls, &mut summary.calls_dropped);
    let members = group_members(&by_key);

    let mut instances = Vec::new();
    let mut unmatched = Vec::new();
    let nobody = BTreeSet::new();
    for ((framework, key), calls) in by_key {
        let group = members
            .get(&(framework, key.group.clone()))
            .unwrap_or(&nobody);
        let present: BTreeSet<usize> = calls.iter().map(|c| c.participant).collect();
        let not_aligned = refused_order(&refused, framework, &key, &calls);
        match not_aligned.or_else(|| unmatched_reason(&calls, &present, group)) {
            Some(reason) => {
                unmatched.push(unmatched_instance(framework, key, &calls, present, reason))
            }
            // `instance` is `None` only below two calls, which
            // `unmatched_reason` has already turned away.
            None => instances.extend(instance(&participants, framework, key, calls)),
        }
    }
    instances.sort_by(|a, b| (a.first_enter_ns, &a.key).cmp(&(b.first_enter_ns, &b.key)));
    unmatched.sort_by(|a, b| (a.first_enter_ns, &a.key).cmp(&(b.first_enter_ns, &b.key)));

    fill_summary(&mut summary, &instances, &unmatched);
    let violations = violations(&instances);
    let stragglers = stragglers(&participants, &instances, opts.top_preceding);
    let hosts = hosts(&participants, &instances);
    let steps = steps(&instances);
    Analysis {
        aligned: opts.aligned,
        participants,
        summary,
        stragglers,
        hosts,
        steps,
        instances,
        unmatched,
        violations,
    }
}

type Calls = BTreeMap<(Framework, InstanceKey), Vec<CollectiveCall>>;

/// Calls by instance; a participant's framework is part of the key, so
/// two jobs of different frameworks never meet.
fn group_calls(
    participants: &[Participant],
    calls: Vec<CollectiveCall>,
    dropped: &mut DroppedCalls,
) -> Calls {
    let mut by_key = Calls::new();
    for call in calls {
        let Some(p) = participants.get(call.participant) else {
            dropped.unknown_participant += 1;
            continue;
        };
        if call.exit_ns < call.enter_ns {
            dropped.exit_before_enter += 1;
            continue;
        }
        by_key
            .entry((p.framework, call.key.clone()))
            .or_default()
            .push(call);
    }
    by_key
}

/// Who is in each (framework, group): everyone seen calling it.
fn group_members(by_key: &Calls) -> HashMap<(Framework, Name), BTreeSet<usize>> {
    let mut members: HashMap<(Framework, Name), BTreeSet<usize>> = HashMap::new();
    for ((framework, key), calls) in by_key {
        members
            .entry((*framework, key.group.clone()))
            .or_default()
            .extend(calls.iter().map(|c| c.participant));
    }
    members
}

fn unmatched_instance(
    framework: Framework,
    key: InstanceKey,
    calls: &[CollectiveCall],
    present: BTreeSet<usize>,
    reason: UnmatchedReason,
) -> Unmatched {
    Unmatched {
        framework,
        key,
        kind: calls.first().map_or(CollectiveKind::AllReduce, |c| c.kind),
        participants: present.into_iter().collect(),
        first_enter_ns: calls.iter().map(|c| c.enter_ns).min().unwrap_or(0),
        reason,
    }
}

/// The reason the group's order was refused, for calls matched by
/// occurrence.
fn refused_order(
    refused: &align::Refused,
    framework: Framework,
    key: &InstanceKey,
    calls: &[CollectiveCall],
) -> Option<UnmatchedReason> {
    let by_order = calls
        .iter()
        .any(|c| matches!(c.matched_by, MatchedBy::Occurrence | MatchedBy::ExitTimes));
    by_order
        .then(|| refused.get(&(framework, key.group.clone())).cloned())
        .flatten()
}

/// Why these calls are not one complete instance; `None`: they are.
fn unmatched_reason(
    calls: &[CollectiveCall],
    present: &BTreeSet<usize>,
    group: &BTreeSet<usize>,
) -> Option<UnmatchedReason> {
    if present.len() < calls.len() {
        let mut seen = BTreeSet::new();
        let twice: BTreeSet<usize> = calls
            .iter()
            .filter(|c| !seen.insert(c.participant))
            .map(|c| c.participant)
            .collect();
        return Some(UnmatchedReason::DuplicateCall {
            participants: twice.into_iter().collect(),
        });
    }
    let kinds: BTreeSet<CollectiveKind> = calls.iter().map(|c| c.kind).collect();
    if kinds.len() > 1 {
        return Some(UnmatchedReason::KindDisagrees {
            kinds: kinds.into_iter().collect(),
        });
    }
    let sizes: BTreeSet<u32> = calls.iter().filter_map(|c| c.group_size).collect();
    if sizes.len() > 1 {
        return Some(UnmatchedReason::GroupSizeDisagrees {
            sizes: sizes.into_iter().collect(),
        });
    }
    let missing: Vec<usize> = group.difference(present).copied().collect();
    let expected = match sizes.first() {
        Some(&size) if present.len() > size as usize => {
            return Some(UnmatchedReason::MoreRanksThanGroupSize { group_size: size });
        }
        Some(&size) => size as usize,
        None => group.len().max(present.len()),
    };
    if present.len() < expected {
        return Some(UnmatchedReason::MissingRanks {
            expected: expected as u64,
            missing,
        });
    }
    (present.len() < 2).then_some(UnmatchedReason::SingleRank)
}

/// later − earlier, at least 0; exact for any two i64.
fn gap(later: i64, earlier: i64) -> u64 {
    let d = i128::from(later) - i128::from(earlier);
    u64::try_from(d.max(0)).unwrap_or(u64::MAX)
}

/// a − b as i64, saturated.
fn diff(a: i64, b: i64) -> i64 {
    let d = i128::from(a) - i128::from(b);
    i64::try_from(d).unwrap_or(if d < 0 { i64::MIN } else { i64::MAX })
}

fn bound_of(participants: &[Participant], p: usize) -> Option<u64> {
    participants.get(p).and_then(|p| p.bound_ns)
}

/// A call's bound: its host's, plus the profiler's conversion for a GPU
/// stamp; unknown where the host's is.
fn call_bound(participants: &[Participant], c: &CollectiveCall) -> Option<u64> {
    bound_of(participants, c.participant).map(|b| b.saturating_add(c.clock.conversion_ns()))
}

/// A matched instance's figures; `None` when it has fewer than two calls.
fn instance(
    participants: &[Participant],
    framework: Framework,
    key: InstanceKey,
    mut calls: Vec<CollectiveCall>,
) -> Option<Instance> {
    calls.sort_by_key(|c| (c.enter_ns, c.participant));
    let n = calls.len();
    let last = calls.get(n.checked_sub(1)?)?;
    let second = calls.get(n.checked_sub(2)?)?;
    let first = calls.first()?;
    let bound = |c: &CollectiveCall| call_bound(participants, c);
    let (b_last, b_second) = (bound(last), bound(second));
    let combined_bound_ns = b_last.unwrap_or(0).saturating_add(b_second.unwrap_or(0));
    let late_by_ns = gap(last.enter_ns, second.enter_ns);
    let ranks: Vec<RankCall> = calls
        .iter()
        .map(|c| RankCall {
            participant: c.participant,
            op: c.op.clone(),
            enter_ns: c.enter_ns,
            exit_ns: c.exit_ns,
            bound_ns: bound(c),
            profiler_conversion_ns: c.clock.conversion_ns(),
            wait_ns: gap(last.enter_ns, c.enter_ns),
            track: c.track,
        })
        .collect();
    let min_exit = calls.iter().map(|c| c.exit_ns).min().unwrap_or(0);
    let max_exit = calls.iter().map(|c| c.exit_ns).max().unwrap_or(0);
    let kind = first.kind;
    Some(Instance {
        framework,
        kind,
        matched_by: first.matched_by,
        step: last.step.or_else(|| calls.iter().find_map(|c| c.step)),
        first_enter_ns: first.enter_ns,
        last_enter_ns: last.enter_ns,
        arrival_spread_ns: gap(last.enter_ns, first.enter_ns),
        end_spread_ns: gap(max_exit, min_exit),
        last: last.participant,
        second_last: second.participant,
        late_by_ns,
        combined_bound_ns,
        bound_known: b_last.is_some() && b_second.is_some(),
        significant: late_by_ns > combined_bound_ns,
        max_wait_ns: ranks.iter().map(|r| r.wait_ns).max().unwrap_or(0),
        total_wait_ns: ranks.iter().fold(0, |s, r| s.saturating_add(r.wait_ns)),
        before_last: last.preceding.as_ref().map(|p| BeforeArrival {
            name: p.name.clone(),
            compute_ns: gap(p.end_ns, p.start_ns),
            host_gap_ns: gap(last.enter_ns, p.end_ns),
        }),
        causality: kind
            .waits_for_all()
            .then(|| causality(participants, &calls))
            .flatten(),
        key,
        ranks,
    })
}

/// The most violating pair: max (enter − bound) against min (exit + bound).
fn causality(participants: &[Participant], calls: &[CollectiveCall]) -> Option<CausalityCheck> {
    let b = |c: &CollectiveCall| i128::from(call_bound(participants, c).unwrap_or(0));
    let entered = calls
        .iter()
        .max_by_key(|c| (i128::from(c.enter_ns) - b(c), c.participant))?;
    let exited = calls
        .iter()
        .min_by_key(|c| (i128::from(c.exit_ns) + b(c), c.participant))?;
    let overlap = i128::from(entered.enter_ns) - i128::from(exited.exit_ns);
    let combined = b(entered) + b(exited);
    let excess = overlap - combined;
    Some(CausalityCheck {
        entered_last: entered.participant,
        exited_first: exited.participant,
        overlap_ns: diff(entered.enter_ns, exited.exit_ns),
        combined_bound_ns: u64::try_from(combined).unwrap_or(u64::MAX),
        violation: excess > 0,
        excess_ns: u64::try_from(excess.max(0)).unwrap_or(u64::MAX),
    })
}

fn fill_summary(summary: &mut Summary, instances: &[Instance], unmatched: &[Unmatched]) {
    summary.matched = instances.len() as u64;
    summary.unmatched = unmatched.len() as u64;
    summary.instances = summary.matched + summary.unmatched;
    for u in unmatched {
        let c = &mut summary.unmatched_by_reason;
        *match u.reason {
            UnmatchedReason::MissingRanks { .. } => &mut c.missing_ranks,
            UnmatchedReason::DuplicateCall { .. } => &mut c.duplicate_call,
            UnmatchedReason::KindDisagrees { .. } => &mut c.kind_disagrees,
            UnmatchedReason::GroupSizeDisagrees { .. } => &mut c.group_size_disagrees,
            UnmatchedReason::MoreRanksThanGroupSize { .. } => &mut c.more_ranks_than_group_size,
            UnmatchedReason::SingleRank => &mut c.single_rank,
            UnmatchedReason::OrderNotAligned { .. } => &mut c.order_not_aligned,
            UnmatchedReason::OrderAmbiguous { .. } => &mut c.order_ambiguous,
        } += 1;
    }
    for i in instances {
        if i.significant {
            summary.significant += 1;
            summary.wait_caused_ns = summary.wait_caused_ns.saturating_add(i.total_wait_ns);
        } else {
            summary.within_alignment_error += 1;
        }
        if let Some(c) = &i.causality {
            summary.causality_checked += 1;
            summary.causality_violations += u64::from(c.violation);
        }
    }
}

fn violations(instances: &[Instance]) -> Vec<Violation> {
    instances
        .iter()
        .enumerate()
        .filter_map(|(n, i)| {
            let check = i.causality.as_ref().filter(|c| c.violation)?;
            Some(Violation {
                instance: n,
                framework: i.framework,
                key: i.key.clone(),
                kind: i.kind,
                check: check.clone(),
            })
        })
        .collect()
}

/// Lateness figures shared by participants and hosts.
#[derive(Default)]
struct Lateness {
    times_last: u64,
    times_last_within_error: u64,
    wait_caused_ns: u64,
    late_sum: u128,
    max_late_by_ns: u64,
}

impl Lateness {
    fn add(&mut self, i: &Instance) {
        if i.significant {
            self.times_last += 1;
            self.wait_caused_ns = self.wait_caused_ns.saturating_add(i.total_wait_ns);
            self.late_sum += u128::from(i.late_by_ns);
            self.max_late_by_ns = self.max_late_by_ns.max(i.late_by_ns);
        } else {
            self.times_last_within_error += 1;
        }
    }

    fn mean(&self) -> u64 {
        let n = u128::from(self.times_last.max(1));
        u64::try_from(self.late_sum / n).unwrap_or(u64::MAX)
    }
}

#[derive(Default)]
struct ParticipantAcc {
    instances: u64,
    waited_ns: u64,
    late: Lateness,
    before: BeforeSummary,
    ops: HashMap<Name, (u64, u64)>,
}

fn stragglers(participants: &[Participant], instances: &[Instance], top: usize) -> Vec<Straggler> {
    let mut acc: Vec<ParticipantAcc> = participants.iter().map(|_| Default::default()).collect();
    for i in instances {
        for r in &i.ranks {
            if let Some(a) = acc.get_mut(r.participant) {
                a.instances += 1;
                a.waited_ns = a.waited_ns.saturating_add(r.wait_ns);
            }
        }
        let Some(a) = acc.get_mut(i.last) else {
            continue;
        };
        a.late.add(i);
        if let (true, Some(b)) = (i.significant, &i.before_last) {
            a.before.arrivals += 1;
            a.before.compute_ns = a.before.compute_ns.saturating_add(b.compute_ns);
            a.before.host_gap_ns = a.before.host_gap_ns.saturating_add(b.host_gap_ns);
            let op = a.ops.entry(b.name.clone()).or_default();
            op.0 += 1;
            op.1 = op.1.saturating_add(b.compute_ns);
        }
    }
    let mut out: Vec<Straggler> = acc
        .into_iter()
        .zip(participants)
        .enumerate()
        .map(|(n, (a, p))| Straggler {
            participant: n,
            host: p.host.clone(),
            rank: p.rank,
            instances: a.instances,
            times_last: a.late.times_last,
            times_last_within_error: a.late.times_last_within_error,
            wait_caused_ns: a.late.wait_caused_ns,
            mean_late_by_ns: a.late.mean(),
            max_late_by_ns: a.late.max_late_by_ns,
            waited_ns: a.waited_ns,
            before: BeforeSummary {
                top_ops: top_ops(a.ops, top),
                ..a.before
            },
        })
        .collect();
    out.sort_by(|a, b| {
        (b.wait_caused_ns, b.times_last, a.participant).cmp(&(
            a.wait_caused_ns,
            a.times_last,
            b.participant,
        ))
    });
    out
}

fn top_ops(ops: HashMap<Name, (u64, u64)>, top: usize) -> Vec<OpTime> {
    let mut ops: Vec<OpTime> = ops
        .into_iter()
        .map(|(name, (count, total_ns))| OpTime {
            name: name.to_string(),
            count,
            total_ns,
        })
        .collect();
    ops.sort_by(|a, b| (b.total_ns, b.count, &a.name).cmp(&(a.total_ns, a.count, &b.name)));
    ops.truncate(top);
    ops
}

fn hosts(participants: &[Participant], instances: &[Instance]) -> Vec<HostStragglers> {
    let mut by_host: BTreeMap<&str, (Vec<usize>, Lateness)> = BTreeMap::new();
    for (n, p) in participants.iter().enumerate() {
        by_host.entry(&p.host).or_default().0.push(n);
    }
    for i in instances {
        if let Some(p) = participants.get(i.last) {
            by_host.entry(&p.host).or_default().1.add(i);
        }
    }
    let mut out: Vec<HostStragglers> = by_host
        .into_iter()
        .map(|(host, (participants, late))| HostStragglers {
            host: host.to_string(),
            participants,
            times_last: late.times_last,
            times_last_within_error: late.times_last_within_error,
            wait_caused_ns: late.wait_caused_ns,
            mean_late_by_ns: late.mean(),
            max_late_by_ns: late.max_late_by_ns,
        })
        .collect();
    out.sort_by(|a, b| {
        (b.wait_caused_ns, b.times_last, &a.host).cmp(&(a.wait_caused_ns, a.times_last, &b.host))
    });
    out
}

fn steps(instances: &[Instance]) -> Vec<StepSummary> {
    let mut by_step: BTreeMap<u64, (StepSummary, BTreeMap<usize, u64>)> = BTreeMap::new();
    for i in instances {
        let Some(step) = i.step else { continue };
        let (s, caused) = by_step.entry(step).or_insert_with(|| {
            (
                StepSummary {
                    step,
                    instances: 0,
                    significant: 0,
                    wait_caused_ns: 0,
                    max_arrival_spread_ns: 0,
                    top_straggler: None,
                    top_straggler_wait_caused_ns: 0,
                },
                BTreeMap::new(),
            )
        });
        s.instances += 1;
        s.max_arrival_spread_ns = s.max_arrival_spread_ns.max(i.arrival_spread_ns);
        if i.significant {
            s.significant += 1;
            s.wait_caused_ns = s.wait_caused_ns.saturating_add(i.total_wait_ns);
            let c = caused.entry(i.last).or_default();
            *c = c.saturating_add(i.total_wait_ns);
        }
    }
    by_step
        .into_values()
        .map(|(mut s, caused)| {
            // Most wait caused; ties: the lower participant index.
            if let Some((&p, &w)) = caused
                .iter()
                .max_by_key(|&(p, w)| (*w, std::cmp::Reverse(*p)))
            {
                s.top_straggler = Some(p);
                s.top_straggler_wait_caused_ns = w;
            }
            s
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectives::model::Preceding;

    const MS: i64 = 1_000_000;

    fn people(n: usize, bound: Option<u64>) -> Vec<Participant> {
        (0..n)
            .map(|r| Participant {
                host: format!("node-{}", r / 2),
                rank: Some(r as u64),
                framework: Framework::PyTorch,
                trace: format!("rank{r}.json"),
                bound_ns: bound,
            })
            .collect()
    }

    fn call(p: usize, ordinal: u64, enter_ns: i64, exit_ns: i64) -> CollectiveCall {
        CollectiveCall {
            participant: p,
            kind: CollectiveKind::AllReduce,
            key: InstanceKey {
                group: "0".into(),
                name: "allreduce".into(),
                ordinal,
            },
            matched_by: MatchedBy::Sequence,
            op: "gloo:all_reduce".into(),
            enter_ns,
            exit_ns,
            step: None,
            group_size: None,
            elements: None,
            preceding: None,
            clock: crate::collectives::CallClock::Host,
            track: None,
        }
    }

    /// One all-reduce per ordinal; `enters[o][p]` is rank p's enter; every
    /// rank leaves 1 ms after the last enter.
    fn job(enters: &[&[i64]]) -> Vec<CollectiveCall> {
        let mut calls = Vec::new();
        for (o, row) in enters.iter().enumerate() {
            let last = row.iter().copied().max().unwrap_or(0);
            for (p, &e) in row.iter().enumerate() {
                calls.push(call(p, o as u64, e, last + MS));
            }
        }
        calls
    }

    fn run(ps: &[Participant], calls: Vec<CollectiveCall>) -> Analysis {
        analyse(ps, calls, &AnalysisOptions::default())
    }

    #[test]
    fn a_gpu_stamp_s_bound_adds_the_profiler_s_conversion() {
        use crate::collectives::{CallClock, PROFILER_GPU_CONVERSION_NS};
        let ps = people(2, Some(100));
        let gpu = |c: CollectiveCall| CollectiveCall {
            clock: CallClock::Gpu,
            ..c
        };
        // Rank 1 enters 1,500 ns after rank 0 left: beyond the hosts'
        // bounds (200 ns), within them plus one GPU conversion each.
        let calls = vec![gpu(call(0, 0, 0, 1_000)), gpu(call(1, 0, 2_500, 3_000))];
        let a = run(&ps, calls.clone());
        let i = &a.instances[0];
        let conv = PROFILER_GPU_CONVERSION_NS;
        assert!(
            i.ranks
                .iter()
                .all(|r| r.bound_ns == Some(100 + conv) && r.profiler_conversion_ns == conv)
        );
        assert_eq!(i.combined_bound_ns, 2 * (100 + conv));
        assert_eq!(a.summary.causality_violations, 0);
        // The same stamps from the host's clock violate causality.
        let host: Vec<CollectiveCall> = calls
            .into_iter()
            .map(|c| CollectiveCall {
                clock: CallClock::Host,
                ..c
            })
            .collect();
        let a = run(&ps, host);
        assert_eq!(a.instances[0].ranks[0].profiler_conversion_ns, 0);
        assert_eq!(a.summary.causality_violations, 1);
    }

    #[test]
    fn names_the_straggler_and_its_exact_lateness() {
        let ps = people(4, Some(1_000));
        // Rank 2 arrives 5 ms after rank 1, which is 1 ms after the others.
        let a = run(&ps, job(&[&[100 * MS, 101 * MS, 106 * MS, 100 * MS]]));
        assert_eq!(a.summary.matched, 1);
        let i = &a.instances[0];
        assert_eq!((i.last, i.second_last), (2, 1));
        assert_eq!(i.late_by_ns, 5 * MS as u64);
        assert_eq!(i.combined_bound_ns, 2_000);
        assert!(i.significant && i.bound_known);
        assert_eq!(i.arrival_spread_ns, 6 * MS as u64);
        assert_eq!(i.max_wait_ns, 6 * MS as u64);
        assert_eq!(i.total_wait_ns, (6 + 5 + 6) * MS as u64);
        assert_eq!(i.end_spread_ns, 0);
        let waits: Vec<(usize, u64)> = i.ranks.iter().map(|r| (r.participant, r.wait_ns)).collect();
        assert_eq!(
            waits,
            [
                (0, 6 * MS as u64),
                (3, 6 * MS as u64),
                (1, 5 * MS as u64),
                (2, 0)
            ]
        );
        assert_eq!(a.stragglers[0].participant, 2);
        assert_eq!(a.stragglers[0].times_last, 1);
        assert_eq!(a.stragglers[0].wait_caused_ns, 17 * MS as u64);
        assert_eq!(a.stragglers[0].mean_late_by_ns, 5 * MS as u64);
        assert_eq!(a.summary.causality_checked, 1);
        assert_eq!(a.summary.causality_violations, 0);
    }

    #[test]
    fn lateness_below_the_combined_bound_is_within_alignment_error() {
        let ps = people(3, Some(50_000));
        // 80 µs late, bounds 50 µs + 50 µs.
        let a = run(&ps, job(&[&[0, 20_000, 100_000]]));
        let i = &a.instances[0];
        assert_eq!(i.late_by_ns, 80_000);
        assert_eq!(i.combined_bound_ns, 100_000);
        assert!(!i.significant);
        assert_eq!(a.summary.within_alignment_error, 1);
        assert_eq!(a.summary.significant, 0);
        let s = a.stragglers.iter().find(|s| s.participant == 2).unwrap();
        assert_eq!((s.times_last, s.times_last_within_error), (0, 1));
        assert_eq!(s.wait_caused_ns, 0);
    }

    #[test]
    fn lateness_equal_to_the_bound_is_not_significant() {
        let ps = people(2, Some(500));
        let a = run(&ps, job(&[&[0, 1_000], &[10_000, 11_001]]));
        assert!(!a.instances[0].significant);
        assert!(a.instances[1].significant);
    }

    #[test]
    fn json_names_are_stable() {
        let ps = people(3, Some(1_000));
        let mut calls = job(&[&[0, MS, 3 * MS]]);
        calls[2].step = Some(7);
        calls.push(call(0, 5, 9 * MS, 10 * MS));
        let json = serde_json::to_value(run(&ps, calls)).unwrap();
        let keys = |v: &serde_json::Value| -> Vec<String> {
            // Sorted: serde_json's `preserve_order` may be on in the workspace.
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(
            keys(&json),
            [
                "aligned",
                "hosts",
                "instances",
                "participants",
                "steps",
                "stragglers",
                "summary",
                "unmatched",
                "violations"
            ]
        );
        let i = &json["instances"][0];
        assert_eq!(i["kind"], "all_reduce");
        assert_eq!(i["framework"], "pytorch");
        assert_eq!(i["late_by_ns"], 2 * MS);
        assert_eq!(i["last"], 2);
        assert_eq!(i["step"], 7);
        assert_eq!(i["causality"]["violation"], false);
        assert_eq!(json["unmatched"][0]["reason"], "missing_ranks");
        assert_eq!(json["summary"]["unmatched_by_reason"]["missing_ranks"], 1);
        assert_eq!(json["stragglers"][0]["wait_caused_ns"], 5 * MS);
    }

    #[test]
    fn a_rank_shifted_by_100_ms_violates_causality() {
        let ps = people(4, Some(10_000));
        let mut calls = job(&[
            &[0, MS, 2 * MS, 3 * MS],
            &[50 * MS, 51 * MS, 52 * MS, 53 * MS],
        ]);
        // Consistent: every exit is 1 ms after the last enter.
        let a = run(&ps, calls.clone());
        assert_eq!(a.summary.causality_checked, 2);
        assert_eq!(a.summary.causality_violations, 0);
        assert!(a.violations.is_empty());
        // Rank 3's clock 100 ms ahead: it enters after the others left.
        for c in calls.iter_mut().filter(|c| c.participant == 3) {
            c.enter_ns += 100 * MS;
            c.exit_ns += 100 * MS;
        }
        let a = run(&ps, calls);
        assert_eq!(a.summary.causality_violations, 2);
        let v = &a.violations[0];
        assert_eq!(v.check.entered_last, 3);
        assert_eq!(v.check.exited_first, 0);
        // enter 103 ms − exit 4 ms = 99 ms, minus 20 µs of bounds.
        assert_eq!(v.check.overlap_ns, 99 * MS);
        assert_eq!(v.check.combined_bound_ns, 20_000);
        assert_eq!(v.check.excess_ns, 99 * MS as u64 - 20_000);
        assert_eq!(a.stragglers[0].participant, 3);
    }

    #[test]
    fn causality_is_not_checked_for_broadcast() {
        let ps = people(2, Some(0));
        let mut calls = job(&[&[0, 10 * MS]]);
        calls[0].exit_ns = MS; // left long before rank 1 entered
        for c in &mut calls {
            c.kind = CollectiveKind::Broadcast;
        }
        let a = run(&ps, calls);
        assert_eq!(a.summary.matched, 1);
        assert_eq!(a.instances[0].causality, None);
        assert_eq!(a.summary.causality_checked, 0);
    }

    #[test]
    fn no_align_ignores_bounds_and_says_so() {
        let ps = people(2, Some(MS as u64));
        let calls = job(&[&[0, 500_000]]);
        let aligned = run(&ps, calls.clone());
        assert!(!aligned.instances[0].significant);
        let raw = analyse(
            &ps,
            calls,
            &AnalysisOptions {
                aligned: false,
                ..Default::default()
            },
        );
        assert!(!raw.aligned);
        assert!(raw.participants.iter().all(|p| p.bound_ns.is_none()));
        let i = &raw.instances[0];
        assert!(i.significant && !i.bound_known);
        assert_eq!(i.combined_bound_ns, 0);
    }

    #[test]
    fn unmatched_instances_carry_their_reason() {
        let ps = people(3, Some(0));
        let mut calls = job(&[&[0, 1, 2], &[10, 11, 12], &[20, 21, 22], &[30, 31, 32]]);
        // Ordinal 0: rank 2 missing (its capture started later).
        calls.retain(|c| !(c.key.ordinal == 0 && c.participant == 2));
        // Ordinal 1: rank 1 twice.
        let mut dup = call(1, 1, 15, 20);
        dup.op = "again".into();
        calls.push(dup);
        // Ordinal 2: rank 0 says all-gather.
        for c in calls
            .iter_mut()
            .filter(|c| c.key.ordinal == 2 && c.participant == 0)
        {
            c.kind = CollectiveKind::AllGather;
        }
        // A group only rank 0 calls.
        let mut solo = call(0, 0, 40, 41);
        solo.key.group = "solo".into();
        calls.push(solo);
        let a = run(&ps, calls);
        assert_eq!(a.summary.matched, 1);
        assert_eq!(a.summary.unmatched, 4);
        let r = &a.summary.unmatched_by_reason;
        assert_eq!(
            (
                r.missing_ranks,
                r.duplicate_call,
                r.kind_disagrees,
                r.single_rank
            ),
            (1, 1, 1, 1)
        );
        let reasons: Vec<&UnmatchedReason> = a.unmatched.iter().map(|u| &u.reason).collect();
        assert_eq!(
            reasons,
            [
                &UnmatchedReason::MissingRanks {
                    expected: 3,
                    missing: vec![2]
                },
                &UnmatchedReason::DuplicateCall {
                    participants: vec![1]
                },
                &UnmatchedReason::KindDisagrees {
                    kinds: vec![CollectiveKind::AllReduce, CollectiveKind::AllGather]
                },
                &UnmatchedReason::SingleRank,
            ]
        );
        assert_eq!(a.unmatched[0].participants, [0, 1]);
        let json = serde_json::to_value(&a.unmatched[0]).unwrap();
        assert_eq!(json["reason"], "missing_ranks");
        assert_eq!(json["missing"], serde_json::json!([2]));
    }

    #[test]
    fn group_size_decides_completeness() {
        let ps = people(4, Some(0));
        let mut calls = job(&[&[0, 1, 2, 3]]);
        for c in &mut calls {
            c.group_size = Some(4);
        }
        // Three of four: missing, though all three participants seen are here.
        let three: Vec<CollectiveCall> = calls
            .iter()
            .filter(|c| c.participant != 3)
            .cloned()
            .collect();
        let a = run(&ps[..3], three.clone());
        assert_eq!(
            a.unmatched[0].reason,
            UnmatchedReason::MissingRanks {
                expected: 4,
                missing: vec![]
            }
        );
        // Group size 2, four callers.
        let mut four = calls.clone();
        for c in &mut four {
            c.group_size = Some(2);
        }
        let a = run(&ps, four);
        assert_eq!(
            a.unmatched[0].reason,
            UnmatchedReason::MoreRanksThanGroupSize { group_size: 2 }
        );
        // Disagreeing sizes.
        let mut mixed = calls.clone();
        mixed[0].group_size = Some(8);
        let a = run(&ps, mixed);
        assert_eq!(
            a.unmatched[0].reason,
            UnmatchedReason::GroupSizeDisagrees { sizes: vec![4, 8] }
        );
        // Group size 3 matches three callers even if a fourth is in the group.
        let mut sub = three;
        for c in &mut sub {
            c.group_size = Some(3);
        }
        sub.push({
            let mut c = call(3, 9, 0, 1);
            c.group_size = Some(3);
            c
        });
        let a = run(&ps, sub);
        assert_eq!(a.summary.matched, 1);
        assert_eq!(a.summary.unmatched_by_reason.more_ranks_than_group_size, 0);
    }

    #[test]
    fn aggregates_per_step_and_per_host() {
        let ps = people(4, Some(0)); // node-0: ranks 0, 1; node-1: ranks 2, 3
        let mut calls = job(&[
            &[0, 0, 0, 4 * MS],                    // step 1: rank 3 late by 4 ms
            &[10 * MS, 12 * MS, 10 * MS, 10 * MS], // step 1: rank 1 late by 2 ms
            &[20 * MS, 20 * MS, 23 * MS, 20 * MS], // step 2: rank 2 late by 3 ms
        ]);
        for c in &mut calls {
            c.step = Some(if c.key.ordinal < 2 { 1 } else { 2 });
        }
        let a = run(&ps, calls);
        assert_eq!(a.steps.len(), 2);
        let s1 = &a.steps[0];
        assert_eq!((s1.step, s1.instances, s1.significant), (1, 2, 2));
        assert_eq!(s1.wait_caused_ns, (12 + 6) * MS as u64);
        assert_eq!(s1.top_straggler, Some(3));
        assert_eq!(s1.top_straggler_wait_caused_ns, 12 * MS as u64);
        assert_eq!(s1.max_arrival_spread_ns, 4 * MS as u64);
        assert_eq!(a.steps[1].top_straggler, Some(2));
        let node1 = a.hosts.iter().find(|h| h.host == "node-1").unwrap();
        assert_eq!(node1.participants, [2, 3]);
        assert_eq!(node1.times_last, 2);
        assert_eq!(node1.wait_caused_ns, 21 * MS as u64);
        assert_eq!(node1.mean_late_by_ns, 3_500_000);
        assert_eq!(node1.max_late_by_ns, 4 * MS as u64);
        assert_eq!(a.hosts[0].host, "node-1");
        let order: Vec<usize> = a.stragglers.iter().map(|s| s.participant).collect();
        assert_eq!(order, [3, 2, 1, 0]);
    }

    #[test]
    fn what_the_straggler_did_before() {
        let ps = people(2, Some(0));
        let mut calls = job(&[&[0, 10 * MS], &[20 * MS, 35 * MS], &[40 * MS, 42 * MS]]);
        let pre = |name: &str, start: i64, end: i64| Preceding {
            name: name.into(),
            start_ns: start,
            end_ns: end,
        };
        calls[1].preceding = Some(pre("aten::mm", 0, 9 * MS)); // 9 ms compute, 1 ms gap
        calls[3].preceding = Some(pre("aten::mm", 25 * MS, 33 * MS)); // 8 ms, 2 ms gap
        calls[5].preceding = Some(pre("optimizer.step", 39 * MS, 41 * MS)); // 2 ms, 1 ms
        let a = run(&ps, calls);
        let s = &a.stragglers[0];
        assert_eq!(s.participant, 1);
        assert_eq!(s.before.arrivals, 3);
        assert_eq!(s.before.compute_ns, 19 * MS as u64);
        assert_eq!(s.before.host_gap_ns, 4 * MS as u64);
        assert_eq!(
            s.before.top_ops[0],
            OpTime {
                name: "aten::mm".into(),
                count: 2,
                total_ns: 17 * MS as u64
            }
        );
        assert_eq!(s.before.top_ops.len(), 2);
        let b = a.instances[0].before_last.as_ref().unwrap();
        assert_eq!((b.compute_ns, b.host_gap_ns), (9 * MS as u64, MS as u64));
    }

    #[test]
    fn frameworks_never_share_an_instance() {
        let mut ps = people(2, Some(0));
        ps[1].framework = Framework::Xla;
        let a = run(&ps, job(&[&[0, 1]]));
        assert_eq!(a.summary.matched, 0);
        assert_eq!(a.summary.unmatched_by_reason.single_rank, 2);
    }

    #[test]
    fn empty_and_single_rank_inputs() {
        let a = run(&[], Vec::new());
        assert_eq!(a.summary, Summary::default());
        assert!(a.stragglers.is_empty() && a.instances.is_empty());
        let ps = people(1, None);
        let a = run(&ps, job(&[&[0], &[5]]));
        assert_eq!(a.summary.matched, 0);
        assert_eq!(a.summary.unmatched_by_reason.single_rank, 2);
        assert_eq!(a.stragglers[0].instances, 0);
    }

    #[test]
    fn extreme_and_garbage_times_do_not_panic() {
        let ps = people(3, Some(u64::MAX));
        let mut calls = vec![
            call(0, 0, i64::MIN, i64::MIN),
            call(1, 0, i64::MAX, i64::MAX),
            call(2, 0, 0, i64::MAX),
            call(0, 1, i64::MIN, i64::MAX),
            call(1, 1, i64::MAX, i64::MAX),
            call(2, 1, i64::MIN, i64::MIN),
            call(7, 1, 0, 0),  // unknown participant
            call(0, 2, 10, 5), // exit before enter
        ];
        calls[1].preceding = Some(Preceding {
            name: "x".into(),
            start_ns: i64::MAX,
            end_ns: i64::MIN,
        });
        let a = run(&ps, calls.clone());
        assert_eq!(a.summary.calls_dropped.unknown_participant, 1);
        assert_eq!(a.summary.calls_dropped.exit_before_enter, 1);
        assert_eq!(a.summary.matched, 2);
        let i = &a.instances[0];
        assert_eq!(i.arrival_spread_ns, u64::MAX);
        assert_eq!(i.combined_bound_ns, u64::MAX);
        assert!(!i.significant);
        let b = a
            .instances
            .iter()
            .find_map(|i| i.before_last.as_ref())
            .unwrap();
        assert_eq!(b.compute_ns, 0);
        assert_eq!(b.host_gap_ns, u64::MAX);
        let raw = analyse(
            &ps,
            calls,
            &AnalysisOptions {
                aligned: false,
                top_preceding: 0,
            },
        );
        assert_eq!(raw.summary.causality_violations, 2);
        assert!(
            raw.violations
                .iter()
                .all(|v| v.check.overlap_ns == i64::MAX)
        );
        assert_eq!(raw.violations[0].check.excess_ns, u64::MAX);
        let _ = serde_json::to_string(&raw).unwrap();
        let _ = crate::collectives::render::table(&raw, 10);
    }
}
