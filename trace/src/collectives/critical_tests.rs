//! Synthetic jobs whose every duration is known: a planted slow op tops
//! the path where planted and only there, a what-if recovers the step time
//! of the same job run without the delay, and an arrival within the bounds
//! is said to be uncertain.

use std::sync::Arc;

use super::*;
use crate::collectives::analyse;
use crate::collectives::analyse::AnalysisOptions;
use crate::collectives::model::{
    CallClock, CollectiveKind, Framework, MatchedBy, Participant, Preceding,
};

const US: i64 = 1_000;
const MS: i64 = 1_000_000;
const OPS: [&str; 2] = ["aten::mm", "aten::softmax"];

/// A job of `ranks` ranks and `steps` steps, each step two all-reduces,
/// each preceded by one op. Every rank starts a step together (1 ms after
/// the previous step's last end); `op_ns(rank, step, k)` is the op's
/// duration before the k-th call.
struct Built {
    participants: Vec<Participant>,
    calls: Vec<CollectiveCall>,
    steps: Vec<Vec<StepSpan>>,
    /// Each step's duration, as simulated.
    durations: BTreeMap<u64, i64>,
}

fn participant(rank: u64, bound_ns: u64) -> Participant {
    Participant {
        host: format!("n{rank}"),
        rank: Some(rank),
        framework: Framework::PyTorch,
        trace: format!("n{rank}.pt.trace.json"),
        bound_ns: Some(bound_ns),
    }
}

#[allow(clippy::too_many_arguments)]
fn call(
    p: usize,
    step: u64,
    k: usize,
    enter: i64,
    exit: i64,
    op: &str,
    work: (i64, i64),
) -> CollectiveCall {
    CollectiveCall {
        participant: p,
        kind: CollectiveKind::AllReduce,
        key: crate::collectives::InstanceKey {
            group: Arc::from("0"),
            name: Arc::from("allreduce"),
            ordinal: step * 2 + k as u64,
        },
        matched_by: MatchedBy::Sequence,
        op: Arc::from("ncclDevKernel_AllReduce"),
        enter_ns: enter,
        exit_ns: exit,
        step: Some(step),
        group_size: None,
        elements: None,
        preceding: Some(Preceding {
            name: Arc::from(op),
            start_ns: work.0,
            end_ns: work.1,
        }),
        clock: CallClock::Host,
        track: None,
    }
}

fn build(ranks: usize, steps: u64, op_ns: impl Fn(usize, u64, usize) -> i64) -> Built {
    let mut b = Built {
        participants: (0..ranks as u64).map(|r| participant(r, 500)).collect(),
        calls: Vec::new(),
        steps: vec![Vec::new(); ranks],
        durations: BTreeMap::new(),
    };
    let mut start = 1_700_000_000 * 1_000 * MS;
    for step in 0..steps {
        let mut t = vec![start; ranks];
        for (k, op) in OPS.iter().enumerate() {
            // other 100 µs, the op, a gap of 50 µs, then the call.
            let works: Vec<(i64, i64)> = t
                .iter()
                .enumerate()
                .map(|(r, &at)| (at + 100 * US, at + 100 * US + op_ns(r, step, k)))
                .collect();
            let enters: Vec<i64> = works.iter().map(|w| w.1 + 50 * US).collect();
            let exit = enters.iter().max().unwrap() + 200 * US;
            for (r, (&enter, &work)) in enters.iter().zip(&works).enumerate() {
                b.calls.push(call(r, step, k, enter, exit, op, work));
            }
            t = vec![exit; ranks];
        }
        let ends: Vec<i64> = t.iter().map(|e| e + 100 * US).collect();
        for (spans, &end_ns) in b.steps.iter_mut().zip(&ends) {
            spans.push(StepSpan {
                step,
                start_ns: start,
                end_ns,
            });
        }
        let end = *ends.iter().max().unwrap();
        b.durations.insert(step, end - start);
        start = end + MS;
    }
    b
}

fn paths(b: &Built, what_if: Vec<WhatIf>) -> CriticalPaths {
    let a = analyse(
        &b.participants,
        b.calls.clone(),
        &AnalysisOptions::default(),
    );
    critical_paths(&a, &b.calls, &b.steps, &CriticalOptions { what_if })
}

/// Rank 0 is the slowest by nature (its mm 1.3 ms); rank 2's mm is 1 ms,
/// 6 ms in the planted steps.
const PLANTED: [u64; 2] = [3, 5];

fn op_ns(planted: bool) -> impl Fn(usize, u64, usize) -> i64 {
    move |r, step, k| {
        let jitter = ((r as i64 * 7 + step as i64 * 5 + k as i64 * 3) % 11) * 10 * US;
        match (r, k) {
            (2, 0) if planted && PLANTED.contains(&step) => 6 * MS,
            (2, 0) => MS,
            (0, 0) => 1300 * US + jitter,
            _ => 400 * US + jitter,
        }
    }
}

fn top(p: &StepPath) -> (usize, SegmentKind, &str) {
    let s = &p.segments[p.top.unwrap()];
    (s.participant, s.kind, &*s.op)
}

#[test]
fn a_planted_slow_op_tops_the_path_of_its_steps_and_only_there() {
    let b = build(4, 8, op_ns(true));
    let c = paths(&b, Vec::new());
    assert_eq!(c.steps.len(), 8);
    for p in &c.steps {
        assert_eq!(
            p.duration_ns, b.durations[&p.step] as u64,
            "step {}",
            p.step
        );
        if PLANTED.contains(&p.step) {
            assert_eq!(
                top(p),
                (2, SegmentKind::Work, "aten::mm"),
                "step {}",
                p.step
            );
            assert_eq!(p.segments[p.top.unwrap()].duration_ns, 6 * MS as u64);
        } else {
            assert_eq!(
                top(p),
                (0, SegmentKind::Work, "aten::mm"),
                "step {}",
                p.step
            );
        }
        // The path covers the step: its segments tile [start, end].
        let sum: u64 = p.segments.iter().map(|s| s.duration_ns).sum();
        assert_eq!(sum, p.duration_ns, "step {}", p.step);
        assert_eq!(p.uncertain_hops, 0);
    }
    assert_eq!(c.tops[0].participant, 0);
    assert_eq!(c.tops[0].steps, 6);
    assert_eq!((c.tops[1].participant, c.tops[1].steps), (2, 2));
    // Rank 0 waits, in each call of a planted step, for the last enter.
    let planted = &c.steps[3];
    let rank0 = planted.ranks.iter().find(|r| r.participant == 0).unwrap();
    let in_step_3 = |k: u64| b.calls.iter().filter(move |c| c.key.ordinal == 3 * 2 + k);
    let waited: i64 = (0..2)
        .map(|k| {
            let last = in_step_3(k).map(|c| c.enter_ns).max().unwrap();
            last - in_step_3(k).find(|c| c.participant == 0).unwrap().enter_ns
        })
        .sum();
    assert_eq!(rank0.waiting_ns, waited as u64);
    assert!(rank0.waiting_ns > 4 * MS as u64);
    assert_eq!(
        rank0.compute_ns,
        (1300 * US + 40 * US + 400 * US + 70 * US) as u64
    );
    assert_eq!(rank0.gap_ns, 100 * US as u64);
    // Its calls after the release are 2 × 200 µs, no work overlapping.
    assert_eq!(rank0.exposed_communication_ns, 400 * US as u64);
}

#[test]
fn what_if_the_planted_op_took_its_median_gives_the_job_without_it() {
    let slow = build(4, 8, op_ns(true));
    let truth = build(4, 8, op_ns(false));
    let what_if = WhatIf {
        participant: 2,
        op: Arc::from("aten::mm"),
        duration: WhatIfDuration::Median,
    };
    let c = paths(&slow, vec![what_if]);
    let w = &c.what_if[0];
    assert_eq!(w.duration_ns, Some(MS as u64));
    for s in &w.steps {
        assert_eq!(s.measured_ns, slow.durations[&s.step] as u64);
        assert_eq!(
            s.predicted_ns, truth.durations[&s.step] as u64,
            "step {}",
            s.step
        );
    }
    // Planted steps do get faster, by less than the 5 ms removed: rank 0
    // is next slowest. Subtracting would have said 5 ms.
    let saved = |n: u64| w.steps[n as usize].measured_ns - w.steps[n as usize].predicted_ns;
    assert!(saved(3) < 5 * MS as u64 && saved(3) > 4 * MS as u64);
    // A given duration: rank 0's mm at 1 ms everywhere shortens every
    // unplanted step.
    let faster = WhatIf {
        participant: 0,
        op: Arc::from("aten::mm"),
        duration: WhatIfDuration::Ns(MS as u64),
    };
    let c = paths(&truth, vec![faster]);
    for s in &c.what_if[0].steps {
        assert!(s.predicted_ns < s.measured_ns, "step {}", s.step);
    }
    // An op the rank never ran: nothing to replay.
    let none = WhatIf {
        participant: 0,
        op: Arc::from("nope"),
        duration: WhatIfDuration::Median,
    };
    let c = paths(&truth, vec![none]);
    assert_eq!(c.what_if[0].duration_ns, None);
    assert!(
        c.what_if[0]
            .steps
            .iter()
            .all(|s| s.predicted_ns == s.measured_ns)
    );
}

#[test]
fn arrivals_within_the_bounds_make_the_hop_uncertain() {
    // Rank 1's mm 0.5 µs longer than rank 0's, bounds 0.5 µs each: which
    // rank released the all-reduce is not known.
    let b = build(2, 1, |r, _, _| MS + r as i64 * 500);
    let c = paths(&b, Vec::new());
    let p = &c.steps[0];
    assert_eq!(p.uncertain_hops, 2);
    let hop = p.segments.iter().find_map(|s| s.hop.as_ref()).unwrap();
    assert_eq!(hop.to, 1);
    assert_eq!(
        hop.order,
        HopOrder::Uncertain {
            other: 0,
            late_by_ns: 500,
            combined_bound_ns: 1_000
        }
    );
    // Beyond the bounds (5 µs), it is certain.
    let b = build(2, 1, |r, _, _| MS + r as i64 * 5 * US);
    let p = &paths(&b, Vec::new()).steps[0];
    assert_eq!(p.uncertain_hops, 0);
    assert!(
        p.segments
            .iter()
            .filter_map(|s| s.hop.as_ref())
            .all(|h| h.order == HopOrder::Certain)
    );
}

#[test]
fn no_steps_no_calls_no_panic() {
    let b = build(2, 0, |_, _, _| MS);
    let c = paths(&b, Vec::new());
    assert!(c.steps.is_empty() && c.tops.is_empty());
    // Calls on participants the analysis does not know, exits before enters.
    let mut b = build(2, 2, |_, _, _| MS);
    b.calls[0].participant = 9;
    b.calls[1].exit_ns = b.calls[1].enter_ns - 1;
    b.steps.truncate(1);
    let c = paths(&b, Vec::new());
    assert_eq!(c.steps.len(), 2);
}

/// A tiny deterministic generator (xorshift64*), for the random jobs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// A time: mostly near each other, sometimes at the extremes.
    fn time(&mut self) -> i64 {
        match self.below(20) {
            0 => i64::MIN,
            1 => i64::MAX,
            _ => self.below(10_000) as i64,
        }
    }
}

fn random_call(rng: &mut Rng, ranks: u64) -> CollectiveCall {
    let (enter, exit) = (rng.time(), rng.time());
    let (ws, we) = (rng.time(), rng.time());
    let mut c = call(
        rng.below(ranks + 1) as usize,
        rng.below(3),
        0,
        enter,
        exit,
        OPS[rng.below(2) as usize],
        (ws, we),
    );
    c.key.ordinal = rng.below(4);
    if rng.below(4) == 0 {
        c.preceding = None;
    }
    if rng.below(5) == 0 {
        c.step = None;
    }
    c
}

/// Random jobs (overlapping calls, exits before enters, calls of unknown
/// participants, extreme stamps, steps missing): no panic, and each step's
/// what-if measures the step as its path does.
#[test]
fn random_jobs_never_panic_and_measure_their_steps_alike() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for _ in 0..300 {
        let ranks = 1 + rng.below(4);
        let participants: Vec<Participant> = (0..ranks)
            .map(|r| participant(r, rng.below(3) * 500))
            .collect();
        let calls: Vec<CollectiveCall> = (0..rng.below(24))
            .map(|_| random_call(&mut rng, ranks))
            .collect();
        let steps: Vec<Vec<StepSpan>> = (0..rng.below(ranks + 1))
            .map(|_| {
                (0..rng.below(3))
                    .map(|step| StepSpan {
                        step,
                        start_ns: rng.time(),
                        end_ns: rng.time(),
                    })
                    .collect()
            })
            .collect();
        let b = Built {
            participants,
            calls,
            steps,
            durations: BTreeMap::new(),
        };
        let what_if =
            [WhatIfDuration::Median, WhatIfDuration::Ns(rng.below(5_000))].map(|duration| WhatIf {
                participant: rng.below(ranks) as usize,
                op: Arc::from(OPS[0]),
                duration,
            });
        let c = paths(&b, what_if.to_vec());
        for w in &c.what_if {
            let measured: Vec<u64> = w.steps.iter().map(|s| s.measured_ns).collect();
            let of_paths: Vec<u64> = c.steps.iter().map(|p| p.duration_ns).collect();
            assert_eq!(measured, of_paths);
        }
    }
}

/// Two ranks whose second call is issued while their first still runs
/// (asynchronous collectives): the second call's anchor is the first's
/// enter. The path still tiles the step, a what-if that changes nothing
/// predicts the step as measured, and one that shortens the slow rank's op
/// shortens the step by what the other rank allows.
#[test]
fn overlapping_calls_are_anchored_at_the_previous_enter() {
    let start = 1_000 * MS;
    let mm = [MS, 3 * MS];
    let mut calls = Vec::new();
    let enter_a: Vec<i64> = mm.iter().map(|d| start + 100 * US + d + 50 * US).collect();
    let exit_a = enter_a.iter().max().unwrap() + 5 * MS;
    let enter_b: Vec<i64> = enter_a.iter().map(|e| e + 350 * US).collect();
    let exit_b = enter_b.iter().max().unwrap() + MS;
    for r in 0..2 {
        let work = (start + 100 * US, start + 100 * US + mm[r]);
        calls.push(call(r, 0, 0, enter_a[r], exit_a, "aten::mm", work));
        let work = (enter_a[r] + 100 * US, enter_a[r] + 300 * US);
        calls.push(call(r, 0, 1, enter_b[r], exit_b, "aten::add", work));
    }
    let end = exit_a.max(exit_b) + 100 * US;
    let b = Built {
        participants: (0..2).map(|r| participant(r, 500)).collect(),
        calls,
        steps: (0..2)
            .map(|_| {
                vec![StepSpan {
                    step: 0,
                    start_ns: start,
                    end_ns: end,
                }]
            })
            .collect(),
        durations: BTreeMap::new(),
    };
    let same = WhatIf {
        participant: 1,
        op: Arc::from("aten::mm"),
        duration: WhatIfDuration::Ns(3 * MS as u64),
    };
    let faster = WhatIf {
        duration: WhatIfDuration::Ns(MS as u64 / 2),
        ..same.clone()
    };
    let c = paths(&b, vec![same, faster]);
    let p = &c.steps[0];
    assert_eq!(p.duration_ns, (end - start) as u64);
    let sum: u64 = p.segments.iter().map(|s| s.duration_ns).sum();
    assert_eq!(sum, p.duration_ns);
    assert_eq!(
        top(p),
        (1, SegmentKind::Collective, "ncclDevKernel_AllReduce")
    );
    assert_eq!(c.what_if[0].steps[0].predicted_ns, p.duration_ns);
    // Rank 1's mm at 0.5 ms: rank 0 (1 ms) now releases both calls, 2 ms
    // earlier.
    let faster = c.what_if[1].steps[0];
    assert_eq!(faster.measured_ns - faster.predicted_ns, 2 * MS as u64);
}

/// A DDP-style Kineto trace of one rank: per step, `fwd` and `bwd` kernels
/// on the compute stream (7), each followed by an all-reduce kernel on
/// NCCL's own stream (20) that waited (through a CUDA event) for it; the
/// next compute overlaps the all-reduce. `bwd_us(rank, step)` is the
/// backward's duration; every rank's times come from one simulation, so
/// the ranks' kernels wait for each other as NCCL's would.
fn ddp_traces(
    ranks: usize,
    steps: u64,
    bwd_us: impl Fn(usize, u64) -> f64,
) -> Vec<serde_json::Value> {
    use serde_json::json;
    let nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)";
    let mut events: Vec<Vec<serde_json::Value>> = vec![Vec::new(); ranks];
    let kernel = |name: &str, tid: u64, ts: f64, dur: f64, seq: Option<u64>| {
        let mut ev = json!({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": tid,
            "ts": ts, "dur": dur});
        if let Some(seq) = seq {
            ev["args"] = json!({"Process Group Name": "0", "Collective name": "allreduce",
                "Seq": seq, "Group size": ranks});
        }
        ev
    };
    let mut start = 1000.0;
    for step in 0..steps {
        let fwd_end: Vec<f64> = (0..ranks).map(|_| start + 100.0 + 1000.0).collect();
        // The first all-reduce: each rank's kernel starts 20 µs after its
        // forward (the event wait), all leave 200 µs after the last.
        let enter1: Vec<f64> = fwd_end.iter().map(|e| e + 20.0).collect();
        let exit1 = enter1.iter().cloned().fold(f64::MIN, f64::max) + 200.0;
        let bwd_end: Vec<f64> = (0..ranks)
            .map(|r| fwd_end[r] + 10.0 + bwd_us(r, step))
            .collect();
        let enter2: Vec<f64> = bwd_end.iter().map(|e| e.max(exit1) + 20.0).collect();
        let exit2 = enter2.iter().cloned().fold(f64::MIN, f64::max) + 200.0;
        for r in 0..ranks {
            let ev = &mut events[r];
            ev.push(
                json!({"ph": "X", "cat": "user_annotation", "name": format!("ProfilerStep#{step}"),
                "pid": 100, "tid": 1, "ts": start, "dur": exit2 + 50.0 - start}),
            );
            ev.push(kernel("fwd_kernel", 7, start + 100.0, 1000.0, None));
            ev.push(kernel(
                "bwd_kernel",
                7,
                fwd_end[r] + 10.0,
                bwd_us(r, step),
                None,
            ));
            ev.push(kernel(
                nccl,
                20,
                enter1[r],
                exit1 - enter1[r],
                Some(step * 2),
            ));
            ev.push(kernel(
                nccl,
                20,
                enter2[r],
                exit2 - enter2[r],
                Some(step * 2 + 1),
            ));
        }
        start = exit2 + 1000.0;
    }
    events
        .into_iter()
        .enumerate()
        .map(|(r, ev)| {
            json!({"distributedInfo": {"backend": "nccl", "rank": r, "world_size": ranks},
                "baseTimeNanoseconds": 1_700_000_000_000_000_000i64, "traceEvents": ev})
        })
        .collect()
}

/// NCCL on its own stream (DDP): what preceded an all-reduce is the
/// compute kernel the NCCL stream waited for on the compute stream, not
/// the previous all-reduce on its own stream (nor a gap): rank 1's slow
/// backward in step 2 tops the path as its work.
#[test]
fn a_gpu_call_s_work_is_the_device_s_last_span_on_any_stream() {
    const PLANTED: u64 = 2;
    let traces = ddp_traces(2, 5, |r, step| {
        if r == 1 && step == PLANTED {
            12_000.0
        } else {
            2_000.0 + r as f64 * 30.0
        }
    });
    let dir = std::env::temp_dir().join(format!("cm-crit-ddp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let files: Vec<std::path::PathBuf> = traces
        .iter()
        .enumerate()
        .map(|(r, t)| {
            let p = dir.join(format!("rank{r}.pt.trace.json"));
            std::fs::write(&p, serde_json::to_vec(t).unwrap()).unwrap();
            p
        })
        .collect();
    let job = crate::collectives::inputs::read_job(&files, false).unwrap();
    assert_eq!(job.calls.len(), 2 * 5 * 2);
    // Read alike whatever the order of the streams in the file (Kineto
    // need not interleave them in time: a stream's events all before the
    // other's needs the second pass).
    for by_stream in [false, true] {
        let files: Vec<std::path::PathBuf> = traces
            .iter()
            .enumerate()
            .map(|(r, t)| {
                let mut t = t.clone();
                let events = t["traceEvents"].as_array_mut().unwrap();
                events.sort_by_key(|e| {
                    let tid = e["tid"].as_i64().unwrap();
                    if by_stream { tid } else { -tid }
                });
                let p = dir.join(format!("rank{r}.{by_stream}.pt.trace.json"));
                std::fs::write(&p, serde_json::to_vec(&t).unwrap()).unwrap();
                p
            })
            .collect();
        let again = crate::collectives::inputs::read_job(&files, false).unwrap();
        let preceding = |j: &crate::collectives::inputs::Job| -> Vec<_> {
            j.calls.iter().map(|c| c.preceding.clone()).collect()
        };
        assert_eq!(preceding(&again), preceding(&job), "by stream {by_stream}");
    }
    // Every all-reduce followed the compute kernel it waited for.
    for c in &job.calls {
        let before = c.preceding.as_ref().map(|p| &*p.name);
        let want = if c.key.ordinal % 2 == 0 {
            "fwd_kernel"
        } else {
            "bwd_kernel"
        };
        assert_eq!(before, Some(want), "{:?}", c.key);
    }
    let a = analyse(
        &job.participants,
        job.calls.clone(),
        &AnalysisOptions {
            aligned: false,
            ..Default::default()
        },
    );
    let c = critical_paths(&a, &job.calls, &job.steps, &CriticalOptions::default());
    assert_eq!(c.steps.len(), 5);
    for p in &c.steps {
        let (rank, kind, op) = top(p);
        let s = &p.segments[p.top.unwrap()];
        if p.step == PLANTED {
            assert_eq!((rank, kind, op), (1, SegmentKind::Work, "bwd_kernel"));
            // From the first all-reduce's exit (the anchor), 210 µs
            // after the backward began, to its end.
            assert_eq!(s.duration_ns, (12 * MS - 210 * US) as u64);
        } else {
            assert_eq!(kind, SegmentKind::Work, "step {}", p.step);
            assert!(s.duration_ns < 3 * MS as u64, "step {}", p.step);
        }
        let sum: u64 = p.segments.iter().map(|s| s.duration_ns).sum();
        assert_eq!(sum, p.duration_ns);
    }
}
