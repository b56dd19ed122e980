//! The report's *Collectives* section, from what `clockmesh trace
//! collectives --json` wrote ([`Analysis`]): the summary, arrival spread
//! and the last arriver's lateness ± the combined bound per instance, the
//! wait caused per rank and host, the worst steps and instances, and the
//! causality violations. Every plotted point and bar carries its exact
//! values as `data-*` attributes, like the rest of the page. No I/O.

use std::fmt::Write as _;

use clockmesh_trace::collectives::analyse::Instance;
use clockmesh_trace::collectives::{Analysis, InstanceKey, Participant};
use serde::Serialize;

use super::svg::{Bars, Chart, Scale, escape, si};

/// A last arrival beyond the two ranks' combined bound.
pub const SIGNIFICANT: &str = "#d62728";
/// A last arrival within alignment error (its order may be the clocks').
pub const WITHIN_ERROR: &str = "#7f7f7f";
/// The arrival spread of an instance.
const SPREAD: &str = "#17becf";
/// Wait caused, in the straggler bars.
pub const WAIT: &str = "#ff7f0e";
/// Rows of the instance, step and violation tables (the JSON has all).
const TABLE_ROWS: usize = 20;
/// Bars per straggler chart.
const BAR_ROWS: usize = 30;

/// The section; `name` is the file it came from.
pub fn section(name: &str, a: &Analysis) -> String {
    let mut s = String::from("<h2>Collectives</h2>\n");
    s.push_str(&summary(name, a));
    s.push_str(&participants(a));
    s.push_str(&spread_chart(a));
    s.push_str(&straggler_charts(a));
    s.push_str(&steps_table(a));
    s.push_str(&instance_table(a));
    s.push_str(&violation_table(a));
    s
}

/// How the JSON names an enum value (`all_reduce`, `pytorch`).
pub(crate) fn json_name<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => "?".into(),
    }
}

fn key_name(k: &InstanceKey) -> String {
    format!("{}/{}#{}", k.group, k.name, k.ordinal)
}

fn host_of(a: &Analysis, p: usize) -> &str {
    a.participants.get(p).map_or("?", |p| p.host.as_str())
}

fn rank_of(a: &Analysis, p: usize) -> Option<u64> {
    a.participants.get(p).and_then(|p| p.rank)
}

/// `rank 2 · n2`, or `#2 · n2` when the trace names no rank (the
/// participant index).
fn who(a: &Analysis, p: usize) -> String {
    participant_name(&a.participants, p)
}

/// [`who`] from the participants alone (the critical-path section's).
pub(crate) fn participant_name(participants: &[Participant], p: usize) -> String {
    let host = participants.get(p).map_or("?", |x| x.host.as_str());
    match participants.get(p).and_then(|x| x.rank) {
        Some(r) => format!("rank {r} · {host}"),
        None => format!("#{p} · {host}"),
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(String::new, |v| v.to_string())
}

pub(crate) fn ns(v: u64) -> String {
    si(v as f64, "ns")
}

/// `1.2 ms ± 800 ns` or `300 ns: within alignment error (± 1.3 µs)`.
fn lateness(i: &Instance) -> String {
    let unknown = if i.bound_known {
        ""
    } else {
        ", a bound unknown"
    };
    if i.significant {
        format!(
            "{} ± {}{unknown}",
            ns(i.late_by_ns),
            ns(i.combined_bound_ns)
        )
    } else {
        format!(
            "{}: within alignment error (± {}{unknown})",
            ns(i.late_by_ns),
            ns(i.combined_bound_ns)
        )
    }
}

fn summary(name: &str, a: &Analysis) -> String {
    let s = &a.summary;
    let r = &s.unmatched_by_reason;
    let reasons = clockmesh_trace::collectives::render::unmatched_reasons(r);
    let (clocks, clocks_text) = if a.aligned {
        (
            "aligned",
            "aligned: the merged timeline, each rank ± its bound from the merge",
        )
    } else {
        (
            "raw",
            "raw host clocks (--no-align): bounds unknown, taken as 0; who arrived last may be a clock artefact",
        )
    };
    let verdict = match (s.causality_violations, a.aligned) {
        (0, _) => "consistent",
        (_, true) => "the merged timeline is provably misaligned",
        (_, false) => "the raw clocks disagree",
    };
    format!(
        "<p class=\"summary collectives\" data-clocks=\"{clocks}\">{}: {} ranks, {clocks_text}. \
         <span data-count=\"instances\">{}</span> instances: <span data-count=\"matched\">{}</span> matched, \
         <span data-count=\"unmatched\">{}</span> unmatched{reasons}. Last arrivals: \
         <span data-count=\"significant\">{}</span> significant (late beyond the two ranks' combined bound), \
         <span data-count=\"within-alignment-error\">{}</span> within alignment error; wait caused {} in all. \
         Causality: <span data-count=\"causality-checked\">{}</span> checked, \
         <span data-count=\"causality-violations\">{}</span> violations ({verdict}).</p>\n",
        escape(name),
        a.participants.len(),
        s.instances,
        s.matched,
        s.unmatched,
        s.significant,
        s.within_alignment_error,
        ns(s.wait_caused_ns),
        s.causality_checked,
        s.causality_violations,
    )
}

fn participants(a: &Analysis) -> String {
    let mut s = String::from(
        "<table class=\"participants\"><tr><th>#</th><th>host</th><th>rank</th><th>framework</th>\
         <th>bound</th><th>trace</th></tr>\n",
    );
    for (n, p) in a.participants.iter().enumerate() {
        let bound = p
            .bound_ns
            .map_or_else(|| "unknown".to_string(), |b| format!("± {}", ns(b)));
        let _ = writeln!(
            s,
            "<tr data-participant=\"{n}\" data-host=\"{}\" data-rank=\"{}\" data-bound-ns=\"{}\">\
             <td>{n}</td><td class=\"name\">{}</td><td>{}</td><td class=\"name\">{}</td><td>{bound}</td>\
             <td class=\"name\">{}</td></tr>",
            escape(&p.host),
            opt(p.rank),
            opt(p.bound_ns),
            escape(&p.host),
            p.rank.map_or_else(|| "-".to_string(), |r| r.to_string()),
            json_name(&p.framework),
            escape(&p.trace)
        );
    }
    s.push_str("</table>\n");
    s
}

/// The exact values of one instance, for its point and its table row.
fn instance_attrs(a: &Analysis, n: usize, i: &Instance) -> String {
    format!(
        r#"data-instance="{n}" data-group="{}" data-name="{}" data-ordinal="{}" data-kind="{}" data-step="{}" data-first-enter-ns="{}" data-last="{}" data-last-host="{}" data-last-rank="{}" data-second-last="{}" data-late-by-ns="{}" data-combined-bound-ns="{}" data-bound-known="{}" data-significant="{}" data-arrival-spread-ns="{}" data-max-wait-ns="{}" data-total-wait-ns="{}""#,
        escape(&i.key.group),
        escape(&i.key.name),
        i.key.ordinal,
        json_name(&i.kind),
        opt(i.step),
        i.first_enter_ns,
        i.last,
        escape(host_of(a, i.last)),
        opt(rank_of(a, i.last)),
        i.second_last,
        i.late_by_ns,
        i.combined_bound_ns,
        i.bound_known,
        i.significant,
        i.arrival_spread_ns,
        i.max_wait_ns,
        i.total_wait_ns
    )
}

/// Per matched instance, in time order (x: its index): the arrival spread,
/// and the last arriver's lateness over the second-last with a whisker of
/// ± their combined bound, red when significant, grey within alignment
/// error. Linear y: a whisker that reaches below zero is within error.
fn spread_chart(a: &Analysis) -> String {
    let mut s = String::from("<h3>Arrival spread per collective instance</h3>\n");
    if a.instances.is_empty() {
        s.push_str("<p class=\"note\">No matched instances.</p>\n");
        return s;
    }
    let _ = writeln!(
        s,
        "<p class=\"legend\"><span><i class=\"sw\" style=\"background:{SPREAD}\"></i>arrival spread (last − first enter)</span>\
         <span><i class=\"sw\" style=\"background:{SIGNIFICANT}\"></i>last arriver late by, significant (± combined bound)</span>\
         <span><i class=\"sw\" style=\"background:{WITHIN_ERROR}\"></i>late by, within alignment error</span></p>\n\
         <p class=\"note\">x: the {} matched instances in time order; y linear, ns. Whiskers: the late-by ± the two last \
         ranks' combined bound; a whisker reaching zero is within alignment error (next to late-bys of \
         hundreds of µs a whisker of ns hides behind its point: the table below gives every value).</p>",
        a.instances.len()
    );
    let y = Scale::domain_of(a.instances.iter().flat_map(|i| {
        let (late, b) = (i.late_by_ns as f64, i.combined_bound_ns as f64);
        [0.0, i.arrival_spread_ns as f64, late - b, late + b]
    }));
    let n = a.instances.len() as f64;
    let mut c = Chart::new(
        ((-0.5, n - 0.5), "", "instance (time order)"),
        (y, "ns", "arrival spread, late by ± bound"),
    )
    .integer_x();
    c.rule(0.0);
    let spreads: Vec<(f64, f64)> = a
        .instances
        .iter()
        .enumerate()
        .map(|(x, i)| (x as f64, i.arrival_spread_ns as f64))
        .collect();
    c.line(&spreads, SPREAD);
    for (x, i) in a.instances.iter().enumerate() {
        let attrs = format!(
            r#"class="pt spread" data-instance="{x}" data-arrival-spread-ns="{}" data-end-spread-ns="{}""#,
            i.arrival_spread_ns, i.end_spread_ns
        );
        let title = format!(
            "#{x} {}: arrival spread {}",
            key_name(&i.key),
            ns(i.arrival_spread_ns)
        );
        c.point(spreads[x], SPREAD, &attrs, &title);
    }
    for (x, i) in a.instances.iter().enumerate() {
        let colour = if i.significant {
            SIGNIFICANT
        } else {
            WITHIN_ERROR
        };
        let (late, b) = (i.late_by_ns as f64, i.combined_bound_ns as f64);
        c.whisker(x as f64, (late - b, late + b), colour);
        let attrs = format!(r#"class="pt late" {}"#, instance_attrs(a, x, i));
        let title = format!(
            "#{x} {} ({}{}): last {} late by {}; spread {}, max wait {}",
            key_name(&i.key),
            json_name(&i.kind),
            i.step.map_or_else(String::new, |s| format!(", step {s}")),
            who(a, i.last),
            lateness(i),
            ns(i.arrival_spread_ns),
            ns(i.max_wait_ns)
        );
        c.point((x as f64, late), colour, &attrs, &title);
    }
    s.push_str(&c.finish("collectives"));
    s
}

/// Wait caused per rank and per host, most first; the note says how often
/// each was the significant last arriver (and last within error).
#[expect(
    clippy::too_many_lines,
    reason = "two charts (per rank, per host) built side by side from one walk"
)]
fn straggler_charts(a: &Analysis) -> String {
    let mut s = String::from("<h3>Stragglers: wait caused</h3>\n");
    if a.stragglers.is_empty() {
        s.push_str("<p class=\"note\">No ranks.</p>\n");
        return s;
    }
    s.push_str(
        "<p class=\"note\">Wait caused: over a rank's significant last arrivals, the sum of every other \
         rank's wait. \"last n×\": significant last arrivals; \"+m within error\": last within alignment \
         error (not charged).</p>\n",
    );
    let shown = a.stragglers.len().min(BAR_ROWS);
    let max = a.stragglers.iter().map(|r| r.wait_caused_ns).max();
    let mut bars = Bars::new(max.unwrap_or(0) as f64, "ns", "wait caused, per rank");
    for r in &a.stragglers[..shown] {
        let attrs = format!(
            r#"class="bar rank" data-participant="{}" data-host="{}" data-rank="{}" data-wait-caused-ns="{}" data-times-last="{}" data-times-last-within-error="{}" data-mean-late-by-ns="{}" data-max-late-by-ns="{}" data-waited-ns="{}""#,
            r.participant,
            escape(&r.host),
            opt(r.rank),
            r.wait_caused_ns,
            r.times_last,
            r.times_last_within_error,
            r.mean_late_by_ns,
            r.max_late_by_ns,
            r.waited_ns
        );
        let before = r.before.top_ops.first().map_or_else(String::new, |op| {
            format!(
                "; before arriving: {} ×{} ({}), host gap {}",
                op.name,
                op.count,
                ns(op.total_ns),
                ns(r.before.host_gap_ns)
            )
        });
        let title = format!(
            "{}: caused {} of wait, last {}× (mean {} late, max {}), {} within error; waited {} itself{before}",
            who(a, r.participant),
            ns(r.wait_caused_ns),
            r.times_last,
            ns(r.mean_late_by_ns),
            ns(r.max_late_by_ns),
            r.times_last_within_error,
            ns(r.waited_ns)
        );
        let note = format!(
            "{} · last {}× +{} within error",
            ns(r.wait_caused_ns),
            r.times_last,
            r.times_last_within_error
        );
        bars.bar(
            &who(a, r.participant),
            r.wait_caused_ns as f64,
            WAIT,
            &attrs,
            &title,
            &note,
        );
    }
    s.push_str(&bars.finish("ranks"));
    more(&mut s, shown, a.stragglers.len(), "ranks");

    let shown = a.hosts.len().min(BAR_ROWS);
    let max = a.hosts.iter().map(|h| h.wait_caused_ns).max();
    let mut bars = Bars::new(max.unwrap_or(0) as f64, "ns", "wait caused, per host");
    for h in &a.hosts[..shown] {
        let attrs = format!(
            r#"class="bar host" data-host="{}" data-participants="{}" data-wait-caused-ns="{}" data-times-last="{}" data-times-last-within-error="{}" data-mean-late-by-ns="{}" data-max-late-by-ns="{}""#,
            escape(&h.host),
            h.participants
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(" "),
            h.wait_caused_ns,
            h.times_last,
            h.times_last_within_error,
            h.mean_late_by_ns,
            h.max_late_by_ns
        );
        let title = format!(
            "{} ({} rank(s)): caused {} of wait, last {}× (mean {} late, max {}), {} within error",
            h.host,
            h.participants.len(),
            ns(h.wait_caused_ns),
            h.times_last,
            ns(h.mean_late_by_ns),
            ns(h.max_late_by_ns),
            h.times_last_within_error
        );
        let note = format!(
            "{} · last {}× +{} within error",
            ns(h.wait_caused_ns),
            h.times_last,
            h.times_last_within_error
        );
        bars.bar(
            &h.host,
            h.wait_caused_ns as f64,
            WAIT,
            &attrs,
            &title,
            &note,
        );
    }
    s.push_str(&bars.finish("hosts"));
    more(&mut s, shown, a.hosts.len(), "hosts");
    s
}

fn more(s: &mut String, shown: usize, total: usize, what: &str) {
    if total > shown {
        let _ = writeln!(
            s,
            "<p class=\"note\">… {} more {what} (the JSON lists all).</p>",
            total - shown
        );
    }
}

fn steps_table(a: &Analysis) -> String {
    if a.steps.is_empty() {
        return String::new();
    }
    let mut worst: Vec<_> = a.steps.iter().collect();
    worst.sort_by(|x, y| (y.wait_caused_ns, x.step).cmp(&(x.wait_caused_ns, y.step)));
    let shown = worst.len().min(TABLE_ROWS);
    let mut s = format!(
        "<h3>Steps: worst {shown} of {} by wait caused</h3>\n<table class=\"steps\"><tr><th>step</th>\
         <th>instances</th><th>significant</th><th>wait caused</th><th>max spread</th><th>top straggler</th></tr>\n",
        worst.len()
    );
    for st in &worst[..shown] {
        let top = st.top_straggler.map_or_else(
            || "-".to_string(),
            |p| {
                format!(
                    "{} ({})",
                    escape(&who(a, p)),
                    ns(st.top_straggler_wait_caused_ns)
                )
            },
        );
        let _ = writeln!(
            s,
            "<tr data-step=\"{}\" data-wait-caused-ns=\"{}\" data-top-straggler=\"{}\"><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td class=\"name\">{top}</td></tr>",
            st.step,
            st.wait_caused_ns,
            opt(st.top_straggler),
            st.step,
            st.instances,
            st.significant,
            ns(st.wait_caused_ns),
            ns(st.max_arrival_spread_ns)
        );
    }
    s.push_str("</table>\n");
    s
}

/// Worst first, as `trace collectives` lists them: significant before
/// within-error, then by lateness, then in time order. With their index
/// in time order.
fn worst_first(a: &Analysis) -> Vec<(usize, &Instance)> {
    let mut all: Vec<(usize, &Instance)> = a.instances.iter().enumerate().collect();
    all.sort_by(|(_, x), (_, y)| {
        (y.significant, y.late_by_ns, x.first_enter_ns).cmp(&(
            x.significant,
            x.late_by_ns,
            y.first_enter_ns,
        ))
    });
    all
}

fn instance_table(a: &Analysis) -> String {
    if a.instances.is_empty() {
        return String::new();
    }
    let worst = worst_first(a);
    let shown = worst.len().min(TABLE_ROWS);
    let mut s = format!(
        "<h3>Instances: worst {shown} of {} by lateness of the last arriver</h3>\n<table class=\"instances\">\
         <tr><th>#</th><th>key</th><th>kind</th><th>step</th><th>last arriver</th><th>late by</th>\
         <th>spread</th><th>max wait</th><th>before arriving</th></tr>\n",
        worst.len()
    );
    for &(n, i) in &worst[..shown] {
        let before = i.before_last.as_ref().map_or_else(String::new, |b| {
            format!(
                "{} ({}), host gap {}",
                escape(&b.name),
                ns(b.compute_ns),
                ns(b.host_gap_ns)
            )
        });
        let _ = writeln!(
            s,
            "<tr {}><td>{n}</td><td class=\"name\">{}</td><td class=\"name\">{}</td><td>{}</td>\
             <td class=\"name\">{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"name\">{before}</td></tr>",
            instance_attrs(a, n, i),
            escape(&key_name(&i.key)),
            json_name(&i.kind),
            i.step.map_or_else(|| "-".to_string(), |s| s.to_string()),
            escape(&who(a, i.last)),
            lateness(i),
            ns(i.arrival_spread_ns),
            ns(i.max_wait_ns)
        );
    }
    s.push_str("</table>\n");
    s
}

fn violation_table(a: &Analysis) -> String {
    let mut s = String::from("<h3>Causality violations</h3>\n");
    if a.violations.is_empty() {
        let _ = writeln!(
            s,
            "<p class=\"note\">None in {} checked instances: no rank left an all-reduce, all-gather, \
             reduce-scatter, all-to-all or barrier before the last one entered, beyond their bounds.</p>",
            a.summary.causality_checked
        );
        return s;
    }
    let shown = a.violations.len().min(TABLE_ROWS);
    let _ = writeln!(
        s,
        "<p class=\"note\">A rank entered after another had left, by more than their combined bound: \
         {}. First {shown} of {} in time order.</p>",
        if a.aligned {
            "the timeline is provably misaligned for these ranks"
        } else {
            "the raw host clocks disagree"
        },
        a.violations.len()
    );
    s.push_str(
        "<table class=\"violations\"><tr><th>#</th><th>key</th><th>kind</th><th>entered last</th>\
         <th>exited first</th><th>overlap</th><th>combined bound</th><th>excess</th></tr>\n",
    );
    for v in &a.violations[..shown] {
        let c = &v.check;
        let _ = writeln!(
            s,
            "<tr data-instance=\"{}\" data-entered-last=\"{}\" data-exited-first=\"{}\" data-overlap-ns=\"{}\" \
             data-combined-bound-ns=\"{}\" data-excess-ns=\"{}\"><td>{}</td><td class=\"name\">{}</td>\
             <td class=\"name\">{}</td><td class=\"name\">{}</td><td class=\"name\">{}</td><td>{}</td><td>± {}</td><td>{}</td></tr>",
            v.instance,
            c.entered_last,
            c.exited_first,
            c.overlap_ns,
            c.combined_bound_ns,
            c.excess_ns,
            v.instance,
            escape(&key_name(&v.key)),
            json_name(&v.kind),
            escape(&who(a, c.entered_last)),
            escape(&who(a, c.exited_first)),
            si(c.overlap_ns as f64, "ns"),
            ns(c.combined_bound_ns),
            ns(c.excess_ns)
        );
    }
    s.push_str("</table>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clockmesh_trace::collectives::{
        AnalysisOptions, CollectiveCall, CollectiveKind, Framework, MatchedBy, Participant,
        Preceding, analyse,
    };

    const T0: i64 = 1_800_000_000_000_000_000;

    fn participant(host: &str, rank: u64, bound_ns: u64) -> Participant {
        Participant {
            host: host.into(),
            rank: Some(rank),
            framework: Framework::PyTorch,
            trace: format!("{rank}.pt.trace.json"),
            bound_ns: Some(bound_ns),
        }
    }

    fn call(p: usize, ordinal: u64, enter_us: i64, exit_us: i64) -> CollectiveCall {
        let enter_ns = T0 + enter_us * 1_000;
        CollectiveCall {
            participant: p,
            kind: CollectiveKind::AllReduce,
            key: InstanceKey {
                group: "default_pg".into(),
                name: "gloo:all_reduce".into(),
                ordinal,
            },
            matched_by: MatchedBy::Occurrence,
            op: "gloo:all_reduce".into(),
            enter_ns,
            exit_ns: T0 + exit_us * 1_000,
            step: Some(ordinal / 2),
            group_size: Some(3),
            elements: None,
            preceding: Some(Preceding {
                name: "aten::mm".into(),
                start_ns: enter_ns - 5_000,
                end_ns: enter_ns - 1_000,
            }),
            clock: clockmesh_trace::collectives::CallClock::Host,
            track: None,
        }
    }

    /// Three ranks (bounds 500, 800, 300 ns), `<n2&>` needing escapes:
    /// instance 0 rank 2 is 2 ms late; at 1 ranks 1 and 2 enter together
    /// (rank 2, the higher index, is last by 0: within alignment error); at
    /// 2 rank 0 enters 9 µs after rank 1 left (a causality violation); and
    /// ordinal 3 only rank 0 called (unmatched: missing ranks).
    fn analysis(aligned: bool) -> Analysis {
        let ps = [
            participant("n0", 0, 500),
            participant("n1", 1, 800),
            participant("<n2&>", 2, 300),
        ];
        let calls = vec![
            call(0, 0, 0, 2_100),
            call(1, 0, 10, 2_100),
            call(2, 0, 2_010, 2_100),
            call(0, 1, 5_000, 5_100),
            call(2, 1, 5_001, 5_100),
            call(1, 1, 5_001, 5_100),
            call(1, 2, 8_000, 8_001),
            call(2, 2, 8_000, 8_020),
            call(0, 2, 8_010, 8_030),
            call(0, 3, 9_000, 9_010),
        ];
        analyse(
            &ps,
            calls,
            &AnalysisOptions {
                aligned,
                ..AnalysisOptions::default()
            },
        )
    }

    #[test]
    fn the_analysis_reads_back_from_its_json() {
        for aligned in [true, false] {
            let a = analysis(aligned);
            let json = serde_json::to_string_pretty(&a).unwrap();
            let back: Analysis = serde_json::from_str(&json).unwrap();
            assert_eq!(back, a);
        }
    }

    #[test]
    fn every_instance_is_a_point_with_its_exact_values() {
        let a = analysis(true);
        assert_eq!((a.instances.len(), a.unmatched.len()), (3, 1));
        let html = section("c.json", &a);
        assert_eq!(html.matches(r#"class="pt late""#).count(), 3);
        assert_eq!(html.matches(r#"class="pt spread""#).count(), 3);
        assert_eq!(html.matches(r#"<path class="whisker""#).count(), 3);
        assert!(
            html.contains(
                r#"class="pt late" data-instance="0" data-group="default_pg" data-name="gloo:all_reduce" data-ordinal="0" data-kind="all_reduce" data-step="0" data-first-enter-ns="1800000000000000000" data-last="2" data-last-host="&lt;n2&amp;&gt;" data-last-rank="2" data-second-last="1" data-late-by-ns="2000000" data-combined-bound-ns="1100" data-bound-known="true" data-significant="true" data-arrival-spread-ns="2010000""#
            ),
            "{html}"
        );
        // Significant in red, within alignment error in grey.
        let point = |n: usize| {
            let at = html
                .find(&format!(r#"class="pt late" data-instance="{n}""#))
                .unwrap();
            html[at..].split("</circle>").next().unwrap().to_string()
        };
        assert!(point(0).contains(&format!(r#"fill="{SIGNIFICANT}""#)));
        let within = point(1);
        assert!(within.contains(r#"data-last="2""#) && within.contains(r#"data-late-by-ns="0""#));
        assert!(within.contains(r#"data-significant="false""#) && within.contains(WITHIN_ERROR));
        assert!(within.contains("within alignment error"), "{within}");
        assert!(
            html.contains(r#"class="pt spread" data-instance="2" data-arrival-spread-ns="10000""#)
        );
    }

    #[test]
    fn the_summary_counts_and_the_tables_name_stragglers_and_violations() {
        let a = analysis(true);
        let html = section("<c>.json", &a);
        assert!(html.contains(r#"data-clocks="aligned""#) && html.contains("&lt;c&gt;.json"));
        for (what, n) in [
            ("matched", 3),
            ("unmatched", 1),
            ("significant", a.summary.significant),
            ("causality-checked", 3),
            ("causality-violations", 1),
        ] {
            assert!(
                html.contains(&format!(r#"<span data-count="{what}">{n}</span>"#)),
                "{what}: {html}"
            );
        }
        assert!(html.contains("1 missing ranks"));
        // Rank 2 caused 2.01 ms + 2 ms of wait: the longest bar, first.
        let first_bar = html.find(r#"class="bar rank""#).unwrap();
        assert!(
            html[first_bar..].starts_with(r#"class="bar rank" data-participant="2" data-host="&lt;n2&amp;&gt;" data-rank="2" data-wait-caused-ns="4010000" data-times-last="1""#),
            "{}",
            &html[first_bar..first_bar + 300]
        );
        assert_eq!(html.matches(r#"class="bar rank""#).count(), 3);
        assert_eq!(html.matches(r#"class="bar host""#).count(), 3);
        assert!(html.contains("rank 2 · &lt;n2&amp;&gt;"));
        assert!(!html.contains("<n2&>"), "raw host name leaked");
        // The worst instance heads its table; the violation has its row.
        let table = &html[html.find("<table class=\"instances\">").unwrap()..];
        let first_row = table.find("<tr data-instance=").unwrap();
        assert!(table[first_row..].starts_with(r#"<tr data-instance="0""#));
        assert!(
            table.contains("2 ms ± 1.1 µs") && table.contains("aten::mm (4 µs), host gap 1 µs")
        );
        let v = &a.violations[0];
        assert_eq!((v.instance, v.check.entered_last), (2, 0));
        assert!(html.contains(
            r#"<tr data-instance="2" data-entered-last="0" data-exited-first="1" data-overlap-ns="9000" data-combined-bound-ns="1300" data-excess-ns="7700">"#
        ), "{html}");
        assert!(html.contains("provably misaligned"));
        assert!(html.contains("<table class=\"steps\">"));
    }

    #[test]
    fn raw_clocks_and_empty_analyses_say_so() {
        let raw = section("r.json", &analysis(false));
        assert!(raw.contains(r#"data-clocks="raw""#) && raw.contains("raw host clocks"));
        assert!(raw.contains(r#"data-combined-bound-ns="0" data-bound-known="false""#));
        assert!(raw.contains("<td>unknown</td>"));
        let empty = analyse(&[], Vec::new(), &AnalysisOptions::default());
        let html = section("e.json", &empty);
        assert!(html.contains("No matched instances."));
        assert!(html.contains("No ranks."));
        assert!(html.contains("None in 0 checked instances"));
        assert!(!html.contains("<circle"));
    }
}
