//! The plain-text report of `clockmesh trace collectives`.
//!
//! Instances are listed worst first (significant last arrivals by lateness,
//! then those within alignment error), not in time order: with a cap, time
//! order would show only the session's first, usually unremarkable,
//! instances. The JSON (`--json`) has every instance in time order.

use std::fmt::Write;

use super::analyse::{Analysis, Instance, UnmatchedCounts, UnmatchedReason};
use super::model::{CollectiveKind, Framework, InstanceKey};

/// Rows shown of the straggler, host, step and unmatched tables.
const MAX_ROWS: usize = 20;

/// The report: header, summary, stragglers, hosts, steps, the worst
/// `max_instances` instances, the unmatched ones and the causality
/// violations.
pub fn table(a: &Analysis, max_instances: usize) -> String {
    let mut out = String::new();
    header(&mut out, a);
    summary(&mut out, a);
    stragglers(&mut out, a);
    hosts(&mut out, a);
    steps(&mut out, a);
    instances(&mut out, a, max_instances);
    unmatched(&mut out, a, max_instances);
    violations(&mut out, a, max_instances);
    out
}

/// ns in the unit that reads best: `850 ns`, `12.3 µs`, `4.56 ms`, `1.234 s`.
pub fn human_ns(ns: u64) -> String {
    // Display only: f64 is exact far beyond any session length.
    let f = ns as f64;
    match ns {
        0..1_000 => format!("{ns} ns"),
        1_000..1_000_000 => format!("{:.1} µs", f / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2} ms", f / 1e6),
        _ => format!("{:.3} s", f / 1e9),
    }
}

/// Signed ns, through [`human_ns`].
fn human_signed(ns: i64) -> String {
    let sign = if ns < 0 { "-" } else { "" };
    format!("{sign}{}", human_ns(ns.unsigned_abs()))
}

fn bound(b: Option<u64>) -> String {
    b.map_or_else(|| "unknown".to_string(), |b| format!("±{}", human_ns(b)))
}

fn kind_name(k: CollectiveKind) -> &'static str {
    match k {
        CollectiveKind::AllReduce => "all-reduce",
        CollectiveKind::AllGather => "all-gather",
        CollectiveKind::ReduceScatter => "reduce-scatter",
        CollectiveKind::AllToAll => "all-to-all",
        CollectiveKind::Barrier => "barrier",
        CollectiveKind::Broadcast => "broadcast",
        CollectiveKind::Reduce => "reduce",
        CollectiveKind::Gather => "gather",
        CollectiveKind::Scatter => "scatter",
        CollectiveKind::CollectivePermute => "collective-permute",
        CollectiveKind::SendRecv => "send/recv",
    }
}

fn framework_name(f: Framework) -> &'static str {
    match f {
        Framework::Xla => "xla",
        Framework::PyTorch => "pytorch",
    }
}

fn key_name(k: &InstanceKey) -> String {
    format!("{}/{}#{}", k.group, k.name, k.ordinal)
}

/// `rank 3` or, when the trace names no rank, `#3` (the participant).
fn rank_name(a: &Analysis, p: usize) -> String {
    match a.participants.get(p).and_then(|p| p.rank) {
        Some(r) => format!("rank {r}"),
        None => format!("#{p}"),
    }
}

/// `rank 3@node-1`.
fn who(a: &Analysis, p: usize) -> String {
    let host = a.participants.get(p).map_or("?", |p| p.host.as_str());
    format!("{}@{host}", rank_name(a, p))
}

fn step_name(s: Option<u64>) -> String {
    s.map_or_else(|| "-".to_string(), |s| s.to_string())
}

/// Fixed-width columns, two spaces apart; `right` marks the columns to
/// right-align (numbers). The last column is not padded.
pub(crate) fn grid(out: &mut String, head: &[&str], rows: &[Vec<String>], right: &[usize]) {
    let mut width: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::from(" ");
        for (n, cell) in cells.enumerate() {
            let w = width.get(n).copied().unwrap_or(0);
            let pad = w.saturating_sub(cell.chars().count());
            text.push(' ');
            if right.contains(&n) {
                text.extend(std::iter::repeat_n(' ', pad));
                text.push_str(cell);
            } else {
                text.push_str(cell);
                if n + 1 < width.len() {
                    text.extend(std::iter::repeat_n(' ', pad));
                }
            }
            text.push(' ');
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(out, &mut head.iter().copied());
    for row in rows {
        line(out, &mut row.iter().map(String::as_str));
    }
}

pub(crate) fn more(out: &mut String, shown: usize, total: usize, what: &str) {
    if total > shown {
        let _ = writeln!(out, "  … {} more {what} (--json lists all)", total - shown);
    }
}

fn header(out: &mut String, a: &Analysis) {
    let clocks = if a.aligned {
        "aligned timeline (each rank's bound from the merge)"
    } else {
        "RAW HOST CLOCKS (--no-align): bounds unknown, taken as 0; \
         who arrived last may be a clock artefact"
    };
    let _ = writeln!(out, "Collectives across ranks: {clocks}\n");
    let _ = writeln!(out, "Participants");
    let rows: Vec<Vec<String>> = a
        .participants
        .iter()
        .enumerate()
        .map(|(n, p)| {
            vec![
                n.to_string(),
                p.host.clone(),
                p.rank.map_or_else(|| "-".to_string(), |r| r.to_string()),
                framework_name(p.framework).to_string(),
                bound(p.bound_ns),
                p.trace.clone(),
            ]
        })
        .collect();
    grid(
        out,
        &["#", "HOST", "RANK", "FRAMEWORK", "BOUND", "TRACE"],
        &rows,
        &[0, 2],
    );
}

fn summary(out: &mut String, a: &Analysis) {
    let s = &a.summary;
    let r = &s.unmatched_by_reason;
    let reasons = unmatched_reasons(r);
    let _ = writeln!(out, "\nSummary");
    let d = &s.calls_dropped;
    let dropped = d.unknown_participant + d.exit_before_enter;
    let _ = write!(out, "  calls          {}", s.calls);
    if dropped > 0 {
        let _ = write!(
            out,
            " ({} dropped: {} name no participant, {} exit before enter)",
            dropped, d.unknown_participant, d.exit_before_enter
        );
    }
    let _ = writeln!(
        out,
        "\n  instances      {}: {} matched, {} unmatched{reasons}",
        s.instances, s.matched, s.unmatched
    );
    let _ = writeln!(
        out,
        "  last arrivals  {} significant (late beyond the two ranks' bounds), {} within alignment error",
        s.significant, s.within_alignment_error
    );
    let _ = writeln!(
        out,
        "  wait caused    {} in all, by the significant last arrivals",
        human_ns(s.wait_caused_ns)
    );
    let verdict = match (s.causality_violations, a.aligned) {
        (0, _) => "consistent".to_string(),
        (n, true) => format!("{n} VIOLATIONS: the merged timeline is provably misaligned"),
        (n, false) => format!("{n} VIOLATIONS: the raw clocks disagree"),
    };
    let _ = writeln!(
        out,
        "  causality      {} checked (all-reduce, all-gather, reduce-scatter, all-to-all, barrier): {verdict}",
        s.causality_checked
    );
}

fn stragglers(out: &mut String, a: &Analysis) {
    let _ = writeln!(out, "\nStragglers (last arrivals per rank, by wait caused)");
    let listed: Vec<_> = a
        .stragglers
        .iter()
        .filter(|s| s.times_last + s.times_last_within_error > 0)
        .collect();
    if listed.is_empty() {
        let _ = writeln!(out, "  none");
        return;
    }
    let rows: Vec<Vec<String>> = listed
        .iter()
        .take(MAX_ROWS)
        .map(|s| {
            let before = match s.before.top_ops.first() {
                Some(op) => format!(
                    "{} ×{} {}; host gap {}",
                    op.name,
                    op.count,
                    human_ns(op.total_ns),
                    human_ns(s.before.host_gap_ns)
                ),
                None => "-".to_string(),
            };
            vec![
                rank_name(a, s.participant),
                s.host.clone(),
                s.times_last.to_string(),
                s.times_last_within_error.to_string(),
                human_ns(s.wait_caused_ns),
                human_ns(s.mean_late_by_ns),
                human_ns(s.max_late_by_ns),
                before,
            ]
        })
        .collect();
    grid(
        out,
        &[
            "RANK",
            "HOST",
            "LAST",
            "LAST~",
            "WAIT CAUSED",
            "MEAN LATE",
            "MAX LATE",
            "BEFORE ARRIVING (top op ×n total; host gap)",
        ],
        &rows,
        &[2, 3, 4, 5, 6],
    );
    let _ = writeln!(
        out,
        "  LAST: significant last arrivals; LAST~: last within alignment error (not counted)"
    );
    more(out, rows.len(), listed.len(), "ranks");
}

fn hosts(out: &mut String, a: &Analysis) {
    let listed: Vec<_> = a
        .hosts
        .iter()
        .filter(|h| h.times_last + h.times_last_within_error > 0)
        .collect();
    if listed.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nHosts (by wait caused)");
    let rows: Vec<Vec<String>> = listed
        .iter()
        .take(MAX_ROWS)
        .map(|h| {
            vec![
                h.host.clone(),
                h.participants.len().to_string(),
                h.times_last.to_string(),
                h.times_last_within_error.to_string(),
                human_ns(h.wait_caused_ns),
                human_ns(h.mean_late_by_ns),
                human_ns(h.max_late_by_ns),
            ]
        })
        .collect();
    grid(
        out,
        &[
            "HOST",
            "RANKS",
            "LAST",
            "LAST~",
            "WAIT CAUSED",
            "MEAN LATE",
            "MAX LATE",
        ],
        &rows,
        &[1, 2, 3, 4, 5, 6],
    );
    more(out, rows.len(), listed.len(), "hosts");
}

fn steps(out: &mut String, a: &Analysis) {
    if a.steps.is_empty() {
        return;
    }
    let mut worst: Vec<_> = a.steps.iter().collect();
    worst.sort_by(|x, y| (y.wait_caused_ns, x.step).cmp(&(x.wait_caused_ns, y.step)));
    let shown = worst.len().min(MAX_ROWS);
    let _ = writeln!(
        out,
        "\nSteps (worst {shown} of {} by wait caused)",
        a.steps.len()
    );
    let rows: Vec<Vec<String>> = worst
        .iter()
        .take(MAX_ROWS)
        .map(|s| {
            vec![
                s.step.to_string(),
                s.instances.to_string(),
                s.significant.to_string(),
                human_ns(s.wait_caused_ns),
                human_ns(s.max_arrival_spread_ns),
                s.top_straggler.map_or_else(
                    || "-".to_string(),
                    |p| {
                        format!(
                            "{} ({})",
                            who(a, p),
                            human_ns(s.top_straggler_wait_caused_ns)
                        )
                    },
                ),
            ]
        })
        .collect();
    grid(
        out,
        &[
            "STEP",
            "INSTANCES",
            "SIGNIFICANT",
            "WAIT CAUSED",
            "MAX SPREAD",
            "TOP STRAGGLER",
        ],
        &rows,
        &[0, 1, 2, 3, 4],
    );
}

/// Worst first: significant before within-error, then by lateness, then
/// in time order.
fn worst_first(a: &Analysis) -> Vec<&Instance> {
    let mut all: Vec<&Instance> = a.instances.iter().collect();
    all.sort_by(|x, y| {
        (y.significant, y.late_by_ns, x.first_enter_ns).cmp(&(
            x.significant,
            x.late_by_ns,
            y.first_enter_ns,
        ))
    });
    all
}

fn instances(out: &mut String, a: &Analysis, max: usize) {
    if a.instances.is_empty() || max == 0 {
        return;
    }
    let worst = worst_first(a);
    let shown = worst.len().min(max);
    let _ = writeln!(
        out,
        "\nInstances (worst {shown} of {} by lateness of the last arriver)",
        worst.len()
    );
    let rows: Vec<Vec<String>> = worst
        .iter()
        .take(max)
        .map(|i| {
            let verdict = if i.significant {
                format!(
                    "{} ± {}",
                    human_ns(i.late_by_ns),
                    human_ns(i.combined_bound_ns)
                )
            } else {
                format!("{} within alignment error", human_ns(i.late_by_ns))
            };
            let verdict = if i.bound_known {
                verdict
            } else {
                format!("{verdict} (bound unknown)")
            };
            vec![
                key_name(&i.key),
                kind_name(i.kind).to_string(),
                step_name(i.step),
                who(a, i.last),
                verdict,
                human_ns(i.arrival_spread_ns),
                human_ns(i.max_wait_ns),
            ]
        })
        .collect();
    grid(
        out,
        &[
            "INSTANCE",
            "KIND",
            "STEP",
            "LAST ARRIVER",
            "LATE BY ± BOUNDS",
            "SPREAD",
            "MAX WAIT",
        ],
        &rows,
        &[2, 5, 6],
    );
}

fn reason_text(a: &Analysis, r: &UnmatchedReason) -> String {
    let names = |ps: &[usize]| ps.iter().map(|&p| who(a, p)).collect::<Vec<_>>().join(", ");
    match r {
        UnmatchedReason::MissingRanks { expected, missing } if missing.is_empty() => {
            format!("missing ranks: {expected} expected, the others' traces not given")
        }
        UnmatchedReason::MissingRanks { expected, missing } => {
            format!("missing ranks ({expected} expected): {}", names(missing))
        }
        UnmatchedReason::DuplicateCall { participants } => {
            format!("called twice by {}", names(participants))
        }
        UnmatchedReason::KindDisagrees { kinds } => {
            let kinds: Vec<&str> = kinds.iter().map(|k| kind_name(*k)).collect();
            format!("kinds disagree: {}", kinds.join(" vs "))
        }
        UnmatchedReason::GroupSizeDisagrees { sizes } => {
            let sizes: Vec<String> = sizes.iter().map(u32::to_string).collect();
            format!("group sizes disagree: {}", sizes.join(" vs "))
        }
        UnmatchedReason::MoreRanksThanGroupSize { group_size } => {
            format!("more ranks than the group size {group_size}")
        }
        UnmatchedReason::SingleRank => "single rank: nothing to compare".to_string(),
        UnmatchedReason::OrderNotAligned {
            participant,
            reference,
        } => format!(
            "order not aligned: {}'s calls of the group fit {}'s at no shift",
            who(a, *participant),
            who(a, *reference)
        ),
        UnmatchedReason::OrderAmbiguous {
            participant,
            reference,
            shifts,
        } => format!(
            "order ambiguous: {}'s calls of the group fit {}'s at {shifts} shifts that steps and exit times do not tell apart",
            who(a, *participant),
            who(a, *reference)
        ),
    }
}

fn unmatched(out: &mut String, a: &Analysis, max: usize) {
    let max = max.min(MAX_ROWS);
    if a.unmatched.is_empty() || max == 0 {
        return;
    }
    let _ = writeln!(out, "\nUnmatched instances (in time order)");
    let rows: Vec<Vec<String>> = a
        .unmatched
        .iter()
        .take(max)
        .map(|u| {
            vec![
                key_name(&u.key),
                kind_name(u.kind).to_string(),
                u.participants.len().to_string(),
                reason_text(a, &u.reason),
            ]
        })
        .collect();
    grid(out, &["INSTANCE", "KIND", "RANKS", "WHY"], &rows, &[2]);
    more(out, rows.len(), a.unmatched.len(), "unmatched");
}

fn violations(out: &mut String, a: &Analysis, max: usize) {
    if a.violations.is_empty() {
        return;
    }
    let mut worst: Vec<_> = a.violations.iter().collect();
    worst.sort_by(|x, y| (y.check.excess_ns, x.instance).cmp(&(x.check.excess_ns, y.instance)));
    let _ = writeln!(
        out,
        "\nCausality violations ({}, worst first): a rank left before another entered, \
         by more than their bounds allow",
        worst.len()
    );
    let rows: Vec<Vec<String>> = worst
        .iter()
        .take(max)
        .map(|v| {
            vec![
                key_name(&v.key),
                kind_name(v.kind).to_string(),
                who(a, v.check.entered_last),
                who(a, v.check.exited_first),
                human_signed(v.check.overlap_ns),
                human_ns(v.check.combined_bound_ns),
                human_ns(v.check.excess_ns),
            ]
        })
        .collect();
    grid(
        out,
        &[
            "INSTANCE",
            "KIND",
            "ENTERED LAST",
            "EXITED FIRST",
            "ENTER − EXIT",
            "BOUNDS",
            "EXCESS",
        ],
        &rows,
        &[4, 5, 6],
    );
    more(out, rows.len(), worst.len(), "violations");
}

/// ` (3 missing ranks (usually the session's edges), 1 duplicate call)`:
/// why instances went unmatched, empty when none did.
pub fn unmatched_reasons(r: &UnmatchedCounts) -> String {
    let reasons: Vec<String> = [
        (
            r.missing_ranks,
            "missing ranks (usually the session's edges)",
        ),
        (r.duplicate_call, "duplicate call"),
        (r.kind_disagrees, "kind disagrees"),
        (r.group_size_disagrees, "group size disagrees"),
        (r.more_ranks_than_group_size, "more ranks than group size"),
        (r.single_rank, "single rank"),
        (r.order_not_aligned, "order not aligned (refused)"),
        (r.order_ambiguous, "order ambiguous (refused)"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    if reasons.is_empty() {
        String::new()
    } else {
        format!(" ({})", reasons.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectives::analyse::{AnalysisOptions, analyse};
    use crate::collectives::model::{CollectiveCall, MatchedBy, Participant};

    const MS: i64 = 1_000_000;

    fn job(aligned: bool, shift_ns: i64) -> Analysis {
        let ps: Vec<Participant> = (0..3)
            .map(|r| Participant {
                host: format!("node-{r}"),
                rank: Some(r),
                framework: Framework::PyTorch,
                trace: format!("rank{r}.json"),
                bound_ns: Some(20_000),
            })
            .collect();
        let mut calls = Vec::new();
        for o in 0..4u64 {
            let base = o as i64 * 100 * MS;
            for p in 0..3usize {
                let late = if p == 2 { 5 * MS } else { p as i64 * 1_000 };
                let shift = if p == 1 { shift_ns } else { 0 };
                calls.push(CollectiveCall {
                    participant: p,
                    kind: CollectiveKind::AllReduce,
                    key: InstanceKey {
                        group: "0".into(),
                        name: "allreduce".into(),
                        ordinal: o,
                    },
                    matched_by: MatchedBy::Sequence,
                    op: "gloo:all_reduce".into(),
                    enter_ns: base + late + shift,
                    exit_ns: base + 6 * MS + shift,
                    step: Some(o / 2),
                    group_size: Some(3),
                    elements: None,
                    preceding: None,
                    clock: crate::collectives::CallClock::Host,
                    track: None,
                });
            }
        }
        analyse(
            &ps,
            calls,
            &AnalysisOptions {
                aligned,
                ..Default::default()
            },
        )
    }

    #[test]
    fn human_units() {
        assert_eq!(human_ns(0), "0 ns");
        assert_eq!(human_ns(999), "999 ns");
        assert_eq!(human_ns(1_500), "1.5 µs");
        assert_eq!(human_ns(4_560_000), "4.56 ms");
        assert_eq!(human_ns(1_234_000_000), "1.234 s");
        assert_eq!(human_signed(-2_000_000), "-2.00 ms");
        assert_eq!(human_signed(i64::MIN), "-9223372036.855 s");
        assert_eq!(bound(None), "unknown");
    }

    #[test]
    fn report_names_the_straggler_and_the_verdicts() {
        let text = table(&job(true, 0), 10);
        assert!(text.contains("aligned timeline"), "{text}");
        assert!(text.contains("4 matched, 0 unmatched"), "{text}");
        assert!(text.contains("4 significant"), "{text}");
        assert!(text.contains(": consistent"), "{text}");
        assert!(text.contains("rank 2@node-2"), "{text}");
        assert!(text.contains("5.00 ms ± 40.0 µs"), "{text}");
        assert!(!text.contains("Causality violations"), "{text}");
        // Columns line up: every row of the instance table is as wide as
        // the widest, up to trailing spaces trimmed.
        let rows: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("Instances"))
            .skip(1)
            .take(5)
            .collect();
        let at: Vec<Option<usize>> = rows.iter().map(|r| r.find("all-reduce")).collect();
        assert!(at[1..].iter().all(|a| *a == at[1] && a.is_some()), "{text}");
    }

    #[test]
    fn report_flags_raw_clocks_and_violations() {
        let text = table(&job(false, 100 * MS), 2);
        assert!(text.contains("RAW HOST CLOCKS (--no-align)"), "{text}");
        assert!(
            text.contains("VIOLATIONS: the raw clocks disagree"),
            "{text}"
        );
        assert!(text.contains("Causality violations (4"), "{text}");
        assert!(text.contains("… 2 more violations"), "{text}");
        assert!(text.contains("(bound unknown)"), "{text}");
        assert!(text.contains("rank 1@node-1"), "{text}");
    }

    #[test]
    fn report_of_nothing() {
        let a = analyse(&[], Vec::new(), &AnalysisOptions::default());
        let text = table(&a, 10);
        assert!(text.contains("0 matched"), "{text}");
        assert!(text.contains("Stragglers"), "{text}");
        let text = table(&job(true, 0), 0);
        assert!(!text.contains("LAST ARRIVER"), "{text}");
    }
}
