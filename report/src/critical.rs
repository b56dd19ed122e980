//! The report's *Critical path* section, from what `clockmesh trace
//! critical-path --json` wrote ([`CriticalPaths`]): what topped the steps'
//! paths, the slowest steps with their top segment, each rank's time over
//! the steps, and the what-ifs. Every row carries its exact values as
//! `data-*` attributes, like the rest of the page. No I/O.

use std::fmt::Write as _;

use clockmesh_trace::collectives::Participant;
use clockmesh_trace::collectives::critical::{
    CriticalPaths, RankTime, Segment, StepPath, WhatIfDuration, WhatIfResult,
};

use super::collectives::{json_name, ns, participant_name as who};
use super::svg::escape;

/// Rows of the step table (the JSON has all).
const TABLE_ROWS: usize = 20;

/// The section; `name` is the file it came from.
pub fn section(name: &str, p: &CriticalPaths) -> String {
    let mut s = String::from("<h2>Critical path</h2>\n");
    s.push_str(&summary(name, p));
    s.push_str(&tops_table(p));
    s.push_str(&steps_table(p));
    s.push_str(&ranks_table(p));
    s.push_str(&what_if_tables(p));
    s
}

fn summary(name: &str, p: &CriticalPaths) -> String {
    let uncertain: u64 = p.steps.iter().map(|s| s.uncertain_hops).sum();
    let total: u64 = p.steps.iter().map(|s| s.duration_ns).sum();
    format!(
        "<p class=\"note\" data-steps=\"{}\" data-uncertain-hops=\"{uncertain}\">From <code>{}</code>: \
         {} steps of {} participants, {} in all; {uncertain} hops where the order of the two last \
         arrivers is within their bounds (the path says so there instead of guessing). \
         Definitions: docs/trace-merge.md, \"Critical path\".</p>\n",
        p.steps.len(),
        escape(name),
        p.steps.len(),
        p.participants.len(),
        ns(total)
    )
}

fn tops_table(p: &CriticalPaths) -> String {
    if p.tops.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "<h3>What topped the paths</h3>\n<table class=\"tops\"><tr><th>rank</th><th>kind</th>\
         <th>op</th><th>steps topped</th><th>its time in them</th></tr>\n",
    );
    for t in &p.tops {
        let _ = writeln!(
            s,
            "<tr data-participant=\"{}\" data-kind=\"{}\" data-steps=\"{}\" data-total-ns=\"{}\">\
             <td class=\"name\">{}</td><td class=\"name\">{}</td><td class=\"name\">{}</td><td>{}</td><td>{}</td></tr>",
            t.participant,
            json_name(&t.kind),
            t.steps,
            t.total_ns,
            escape(&who(&p.participants, t.participant)),
            json_name(&t.kind),
            escape(&t.op),
            t.steps,
            ns(t.total_ns)
        );
    }
    s.push_str("</table>\n");
    s
}

fn top_segment(st: &StepPath) -> Option<&Segment> {
    st.top.and_then(|i| st.segments.get(i))
}

fn steps_table(p: &CriticalPaths) -> String {
    if p.steps.is_empty() {
        return String::new();
    }
    let mut slowest: Vec<&StepPath> = p.steps.iter().collect();
    slowest.sort_by(|x, y| (y.duration_ns, x.step).cmp(&(x.duration_ns, y.step)));
    let shown = slowest.len().min(TABLE_ROWS);
    let mut s = format!(
        "<h3>Steps: slowest {shown} of {}</h3>\n<table class=\"critical-steps\"><tr><th>step</th>\
         <th>duration</th><th>segments</th><th>uncertain hops</th><th>top of the path</th></tr>\n",
        slowest.len()
    );
    for st in &slowest[..shown] {
        let top = top_segment(st).map_or_else(
            || "-".to_string(),
            |g| {
                format!(
                    "{} {} {} ({})",
                    escape(&who(&p.participants, g.participant)),
                    json_name(&g.kind),
                    escape(&g.op),
                    ns(g.duration_ns)
                )
            },
        );
        let _ = writeln!(
            s,
            "<tr data-step=\"{}\" data-duration-ns=\"{}\" data-top-participant=\"{}\" data-top-ns=\"{}\">\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"name\">{top}</td></tr>",
            st.step,
            st.duration_ns,
            top_segment(st).map_or_else(String::new, |g| g.participant.to_string()),
            top_segment(st).map_or(0, |g| g.duration_ns),
            st.step,
            ns(st.duration_ns),
            st.segments.len(),
            st.uncertain_hops
        );
    }
    s.push_str("</table>\n");
    if slowest.len() > shown {
        let _ = writeln!(
            s,
            "<p class=\"note\">… {} more steps (the JSON lists all).</p>",
            slowest.len() - shown
        );
    }
    s
}

/// Each participant's time summed over the steps.
fn rank_totals(p: &CriticalPaths) -> Vec<RankTime> {
    let mut totals: Vec<RankTime> = (0..p.participants.len())
        .map(|participant| RankTime {
            participant,
            ..RankTime::default()
        })
        .collect();
    for r in p.steps.iter().flat_map(|st| &st.ranks) {
        let Some(t) = totals.get_mut(r.participant) else {
            continue;
        };
        t.compute_ns += r.compute_ns;
        t.other_ns += r.other_ns;
        t.gap_ns += r.gap_ns;
        t.waiting_ns += r.waiting_ns;
        t.exposed_communication_ns += r.exposed_communication_ns;
    }
    totals
}

fn ranks_table(p: &CriticalPaths) -> String {
    if p.steps.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "<h3>Each rank's time over the steps</h3>\n<table class=\"rank-times\"><tr><th>rank</th>\
         <th>work</th><th>other</th><th>gaps</th><th>waiting for others</th>\
         <th>exposed communication</th></tr>\n",
    );
    for t in rank_totals(p) {
        let _ = writeln!(
            s,
            "<tr data-participant=\"{}\" data-compute-ns=\"{}\" data-waiting-ns=\"{}\" data-exposed-ns=\"{}\">\
             <td class=\"name\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            t.participant,
            t.compute_ns,
            t.waiting_ns,
            t.exposed_communication_ns,
            escape(&who(&p.participants, t.participant)),
            ns(t.compute_ns),
            ns(t.other_ns),
            ns(t.gap_ns),
            ns(t.waiting_ns),
            ns(t.exposed_communication_ns)
        );
    }
    s.push_str("</table>\n");
    s
}

fn what_if_tables(p: &CriticalPaths) -> String {
    p.what_if
        .iter()
        .map(|w| what_if_table(&p.participants, w))
        .collect()
}

fn what_if_table(participants: &[Participant], w: &WhatIfResult) -> String {
    let asked = match w.what_if.duration {
        WhatIfDuration::Median => "its median".to_string(),
        WhatIfDuration::Ns(d) => ns(d),
    };
    let Some(given) = w.duration_ns else {
        return format!(
            "<h3>What if {} on {} took {asked}</h3>\n<p class=\"note\">That rank never ran the op \
             before a call: nothing to replay.</p>\n",
            escape(&w.what_if.op),
            escape(&who(participants, w.what_if.participant))
        );
    };
    let measured: u64 = w.steps.iter().map(|x| x.measured_ns).sum();
    let predicted: u64 = w.steps.iter().map(|x| x.predicted_ns).sum();
    let mut s = format!(
        "<h3>What if {} on {} took {asked} ({})</h3>\n<p class=\"note\" data-measured-ns=\"{measured}\" \
         data-predicted-ns=\"{predicted}\">Replayed over every step: {} measured, {} predicted \
         (the other ranks' calls and the collectives' own times kept, so the saving is what they \
         allow).</p>\n<table class=\"what-if\"><tr><th>step</th><th>measured</th><th>predicted</th>\
         <th>saved</th></tr>\n",
        escape(&w.what_if.op),
        escape(&who(participants, w.what_if.participant)),
        ns(given),
        ns(measured),
        ns(predicted)
    );
    for x in w.steps.iter().filter(|x| x.predicted_ns != x.measured_ns) {
        let _ = writeln!(
            s,
            "<tr data-step=\"{}\" data-measured-ns=\"{}\" data-predicted-ns=\"{}\"><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td></tr>",
            x.step,
            x.measured_ns,
            x.predicted_ns,
            x.step,
            ns(x.measured_ns),
            ns(x.predicted_ns),
            saved(x.measured_ns, x.predicted_ns)
        );
    }
    s.push_str("</table>\n");
    s
}

/// `2.1 ms`, or `−300 µs` where the replay is slower.
fn saved(measured: u64, predicted: u64) -> String {
    if predicted <= measured {
        ns(measured - predicted)
    } else {
        format!("−{}", ns(predicted - measured))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real NCCL fixture's paths, as `trace critical-path --json`
    /// prints them for its two ranks, with a what-if.
    fn fixture_paths() -> CriticalPaths {
        use clockmesh_trace::collectives::critical::{CriticalOptions, WhatIf, critical_paths};
        use clockmesh_trace::collectives::{AnalysisOptions, analyse, inputs::read_rank};
        let data =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../trace/tests/data/gpu/torch");
        let mut participants = Vec::new();
        let mut calls = Vec::new();
        let mut steps = Vec::new();
        for (i, f) in ["rank0.pt.trace.json", "rank1.pt.trace.json"]
            .iter()
            .enumerate()
        {
            let r = read_rank(&data.join(f), false).unwrap();
            participants.push(r.participant);
            steps.push(r.steps);
            calls.extend(r.calls.into_iter().map(|mut c| {
                c.participant = i;
                c
            }));
        }
        let a = analyse(&participants, calls.clone(), &AnalysisOptions::default());
        let opts = CriticalOptions {
            what_if: vec![WhatIf {
                participant: 0,
                op: "aten::mm".into(),
                duration: WhatIfDuration::Median,
            }],
        };
        critical_paths(&a, &calls, &steps, &opts)
    }

    #[test]
    fn the_section_reads_back_from_the_json_and_names_the_straggler() {
        let p = fixture_paths();
        let back: CriticalPaths =
            serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        let html = section("paths.json", &back);
        assert!(html.contains("<h2>Critical path</h2>"));
        let rows: Vec<&str> = html
            .lines()
            .filter(|l| l.starts_with("<tr data-step=") && l.contains("data-top-ns"))
            .collect();
        assert_eq!(rows.len(), p.steps.len().min(TABLE_ROWS));
        // Steps 5 and 6: rank 1 slept 20 ms before its collectives.
        for step in [5, 6] {
            let row = rows
                .iter()
                .find(|r| r.contains(&format!("data-step=\"{step}\" ")))
                .unwrap();
            assert!(row.contains("rank 1 · rank1"), "{row}");
            assert!(row.contains("data-top-participant=\"1\""), "{row}");
        }
        // Each rank's totals are the sums of its per-step times.
        let waiting_0: u64 = p
            .steps
            .iter()
            .flat_map(|s| &s.ranks)
            .filter(|r| r.participant == 0)
            .map(|r| r.waiting_ns)
            .sum();
        assert!(html.contains("data-participant=\"0\" data-compute-ns"));
        assert!(html.contains(&format!("data-waiting-ns=\"{waiting_0}\"")));
        assert!(html.contains("What if aten::mm on rank 0 · rank0 took its median"));
    }

    #[test]
    fn an_empty_analysis_says_so_without_tables() {
        let empty = CriticalPaths {
            participants: Vec::new(),
            steps: Vec::new(),
            tops: Vec::new(),
            what_if: Vec::new(),
        };
        let html = section("none.json", &empty);
        assert!(html.contains("0 steps of 0 participants"));
        assert!(!html.contains("<table"));
    }
}
