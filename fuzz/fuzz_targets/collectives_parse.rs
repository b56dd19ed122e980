//! Fuzzes the collectives parsers (Kineto JSON and xplane) and the
//! analysis behind `clockmesh trace collectives`: any input must parse to
//! calls or an error, never a panic, and whatever parses must analyse
//! (alone, and as three ranks of one job) and render without panicking,
//! with every call and instance accounted for; and the job's critical
//! paths (`clockmesh trace critical-path`) with a what-if must be found and
//! rendered without panicking, one path per step.
#![no_main]

use std::path::Path;

use clockmesh_trace::collectives::critical::{
    CriticalOptions, WhatIf, WhatIfDuration, critical_paths,
};

use clockmesh_trace::collectives::{
    AnalysisOptions, Participant, StepSpan, analyse, critical_render, kineto, render, xplane,
};
use libfuzzer_sys::fuzz_target;

fn check(
    participant: Participant,
    calls: Vec<clockmesh_trace::collectives::CollectiveCall>,
    steps: Vec<StepSpan>,
) {
    let n = calls.len() as u64;
    let participants = vec![participant; 3];
    // Three ranks with the same calls: every instance is matched and
    // every check runs.
    let job: Vec<_> = (0..3)
        .flat_map(|p| {
            calls.iter().cloned().map(move |mut c| {
                c.participant = p;
                c
            })
        })
        .collect();
    for aligned in [true, false] {
        let a = analyse(
            &participants,
            job.clone(),
            &AnalysisOptions {
                aligned,
                ..AnalysisOptions::default()
            },
        );
        assert_eq!(a.summary.calls, 3 * n, "every call counted");
        assert_eq!(a.summary.matched + a.summary.unmatched, a.summary.instances);
        let _ = render::table(&a, 5);
        let what_if = calls.first().map(|c| WhatIf {
            participant: 1,
            op: c.op.clone(),
            duration: WhatIfDuration::Median,
        });
        let opts = CriticalOptions {
            what_if: what_if.into_iter().collect(),
        };
        let paths = critical_paths(&a, &job, &vec![steps.clone(); 3], &opts);
        let _ = critical_render::table(&paths, 3);
    }
}

fuzz_target!(|data: &[u8]| {
    for aligned in [true, false] {
        if let Ok(t) = kineto::parse(data, Path::new("r.pt.trace.json"), aligned) {
            check(t.participant, t.calls, t.steps);
        }
        if let Ok(t) = xplane::parse(data, Path::new("h.xplane.pb"), aligned) {
            check(t.participant, t.calls, t.steps);
        }
    }
});
