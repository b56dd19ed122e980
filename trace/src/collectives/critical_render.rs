//! The plain-text report of `clockmesh trace critical-path`: the slowest
//! steps with what topped their paths, the path of each of the slowest
//! `max_paths` steps, each rank's time summed over the steps, what topped
//! the paths most often, and the what-ifs. `--json` has every step.

use std::fmt::Write;

use super::critical::{CriticalPaths, HopOrder, Segment, SegmentKind, StepPath, WhatIfResult};
use super::render::{grid, human_ns, more};

const MAX_ROWS: usize = 20;

/// The report (see the module's header).
pub fn table(c: &CriticalPaths, max_paths: usize) -> String {
    let mut out = String::new();
    if c.steps.is_empty() {
        let _ = writeln!(out, "No step has collective calls: no critical path.");
        return out;
    }
    steps(&mut out, c);
    paths(&mut out, c, max_paths);
    ranks(&mut out, c);
    tops(&mut out, c);
    for w in &c.what_if {
        what_if(&mut out, c, w);
    }
    out
}

/// `rank 3@node-1`, else `#participant@host`.
fn who(c: &CriticalPaths, p: usize) -> String {
    match c.participants.get(p) {
        Some(q) => match q.rank {
            Some(r) => format!("rank {r}@{}", q.host),
            None => format!("#{p}@{}", q.host),
        },
        None => format!("#{p}"),
    }
}

pub(crate) fn kind_name(k: SegmentKind) -> &'static str {
    match k {
        SegmentKind::CarryOver => "carry-over",
        SegmentKind::LateStart => "late start",
        SegmentKind::Other => "other",
        SegmentKind::Work => "work",
        SegmentKind::Gap => "gap",
        SegmentKind::Collective => "collective",
        SegmentKind::Tail => "tail",
    }
}

fn slowest(c: &CriticalPaths) -> Vec<&StepPath> {
    let mut v: Vec<&StepPath> = c.steps.iter().collect();
    v.sort_by_key(|s| (std::cmp::Reverse(s.duration_ns), s.step));
    v
}

fn top_text(c: &CriticalPaths, p: &StepPath) -> String {
    p.top.and_then(|i| p.segments.get(i)).map_or_else(
        || "-".to_string(),
        |s| {
            format!(
                "{} {} {} {}",
                who(c, s.participant),
                kind_name(s.kind),
                s.op,
                human_ns(s.duration_ns)
            )
        },
    )
}

fn steps(out: &mut String, c: &CriticalPaths) {
    let listed = slowest(c);
    let _ = writeln!(out, "Steps (slowest first)");
    let rows: Vec<Vec<String>> = listed
        .iter()
        .take(MAX_ROWS)
        .map(|p| {
            vec![
                p.step.to_string(),
                human_ns(p.duration_ns),
                p.uncertain_hops.to_string(),
                top_text(c, p),
            ]
        })
        .collect();
    grid(
        out,
        &[
            "STEP",
            "DURATION",
            "UNCERTAIN",
            "TOP OF THE PATH (rank, kind, op, time)",
        ],
        &rows,
        &[0, 1, 2],
    );
    let _ = writeln!(
        out,
        "  UNCERTAIN: hops where the two last arrivers are within their combined bound"
    );
    more(out, rows.len(), listed.len(), "steps");
}

fn hop_text(c: &CriticalPaths, s: &Segment) -> String {
    let Some(h) = &s.hop else {
        return String::new();
    };
    let from = if h.from == h.to {
        "last arriver".to_string()
    } else {
        format!("released {}", who(c, h.from))
    };
    match &h.order {
        HopOrder::Certain => from,
        HopOrder::Uncertain {
            other,
            late_by_ns,
            combined_bound_ns,
        } => format!(
            "{from}; order uncertain: {} by {} within ±{}",
            who(c, *other),
            human_ns(*late_by_ns),
            human_ns(*combined_bound_ns)
        ),
    }
}

fn paths(out: &mut String, c: &CriticalPaths, max_paths: usize) {
    for p in slowest(c).into_iter().take(max_paths) {
        let _ = writeln!(
            out,
            "\nCritical path of step {} ({}, in time order)",
            p.step,
            human_ns(p.duration_ns)
        );
        let rows: Vec<Vec<String>> = p
            .segments
            .iter()
            .map(|s| {
                vec![
                    who(c, s.participant),
                    kind_name(s.kind).to_string(),
                    human_ns(s.duration_ns),
                    s.op.to_string(),
                    hop_text(c, s),
                ]
            })
            .collect();
        grid(out, &["RANK", "KIND", "TIME", "OP", "HOP"], &rows, &[2]);
    }
}

fn ranks(out: &mut String, c: &CriticalPaths) {
    let mut sum: std::collections::BTreeMap<usize, [u64; 5]> = Default::default();
    for r in c.steps.iter().flat_map(|p| &p.ranks) {
        let e = sum.entry(r.participant).or_default();
        let add = [
            r.compute_ns,
            r.other_ns,
            r.gap_ns,
            r.waiting_ns,
            r.exposed_communication_ns,
        ];
        for (t, a) in e.iter_mut().zip(add) {
            *t = t.saturating_add(a);
        }
    }
    let _ = writeln!(out, "\nPer rank (summed over the steps)");
    let rows: Vec<Vec<String>> = sum
        .iter()
        .map(|(&p, t)| {
            std::iter::once(who(c, p))
                .chain(t.iter().map(|&ns| human_ns(ns)))
                .collect()
        })
        .collect();
    grid(
        out,
        &["RANK", "WORK", "OTHER", "GAPS", "WAITING", "EXPOSED COMM"],
        &rows,
        &[1, 2, 3, 4, 5],
    );
}

fn tops(out: &mut String, c: &CriticalPaths) {
    let _ = writeln!(out, "\nTop of the path (longest segment), over the steps");
    let rows: Vec<Vec<String>> = c
        .tops
        .iter()
        .take(MAX_ROWS)
        .map(|t| {
            vec![
                who(c, t.participant),
                kind_name(t.kind).to_string(),
                t.steps.to_string(),
                human_ns(t.total_ns),
                t.op.to_string(),
            ]
        })
        .collect();
    grid(
        out,
        &["RANK", "KIND", "STEPS", "TOTAL", "OP"],
        &rows,
        &[2, 3],
    );
    more(out, rows.len(), c.tops.len(), "tops");
}

fn what_if(out: &mut String, c: &CriticalPaths, w: &WhatIfResult) {
    let who = who(c, w.what_if.participant);
    let Some(d) = w.duration_ns else {
        let _ = writeln!(
            out,
            "\nWhat if {} on {who}: it never ran before a call there; nothing to replay",
            w.what_if.op
        );
        return;
    };
    let _ = writeln!(
        out,
        "\nWhat if {} on {who} took {}",
        w.what_if.op,
        human_ns(d)
    );
    let changed: Vec<_> = w
        .steps
        .iter()
        .filter(|s| s.predicted_ns != s.measured_ns)
        .collect();
    let rows: Vec<Vec<String>> = changed
        .iter()
        .map(|s| {
            let delta = i128::from(s.predicted_ns) - i128::from(s.measured_ns);
            let sign = if delta < 0 { "-" } else { "+" };
            vec![
                s.step.to_string(),
                human_ns(s.measured_ns),
                human_ns(s.predicted_ns),
                format!("{sign}{}", human_ns(delta.unsigned_abs() as u64)),
            ]
        })
        .collect();
    grid(
        out,
        &["STEP", "MEASURED", "WOULD TAKE", "CHANGE"],
        &rows,
        &[0, 1, 2, 3],
    );
    let measured: u64 = w.steps.iter().map(|s| s.measured_ns).sum();
    let predicted: u64 = w.steps.iter().map(|s| s.predicted_ns).sum();
    let _ = writeln!(
        out,
        "  {} of {} steps change; all steps: {} → {}",
        changed.len(),
        w.steps.len(),
        human_ns(measured),
        human_ns(predicted)
    );
}
