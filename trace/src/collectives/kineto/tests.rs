use super::event::{Event, Id, Text};
use super::json::one;
use super::quick::quick_event;
use super::*;
use serde_json::{Value, json};

fn write(name: &str, v: &Value) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cm-coll-kineto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_vec(v).unwrap()).unwrap();
    p
}

/// The shape PyTorch 2.15 writes for gloo: the dispatcher op on the
/// main thread, the work on a gloo thread, no sequence numbers.
#[test]
fn gloo_spans_are_the_calls_and_the_main_thread_says_what_came_before() {
    let base = 1_000_000_000_000i64;
    let doc = json!({
        "baseTimeNanoseconds": base,
        "distributedInfo": {"backend": "gloo", "rank": 2, "world_size": 3,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 3}]},
        "clockmesh": {"host": "n2", "alignment_bound_ns": 900, "merged_source": "history"},
        "traceEvents": [
            {"ph": "X", "name": "ProfilerStep#7", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::sum", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0},
            {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 10.0, "dur": 1.0},
            {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 9, "ts": 10.5, "dur": 20.25},
            {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 40.0, "dur": 1.0},
            {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 8, "ts": 40.5, "dur": 5.0},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 9, "args": {"name": "x"}}
        ]
    });
    let t = read(&write("n2.pt.trace.json", &doc), true).unwrap();
    assert_eq!(t.participant.host, "n2");
    assert_eq!(t.participant.rank, Some(2));
    assert_eq!(t.participant.bound_ns, Some(900));
    assert_eq!(
        t.calls.len(),
        2,
        "one call per gloo span, none for c10d ops"
    );
    let c = &t.calls[0];
    assert_eq!(c.kind, CollectiveKind::AllReduce);
    // The rank arrived when it called (the c10d op), not when gloo's
    // worker started; it left when the work completed.
    assert_eq!((c.enter_ns, c.exit_ns), (base + 10_000, base + 30_750));
    assert_eq!(&*c.key.group, "default_pg");
    assert_eq!((c.key.ordinal, t.calls[1].key.ordinal), (0, 1));
    assert_eq!(c.matched_by, MatchedBy::Occurrence);
    assert_eq!(c.group_size, Some(3));
    assert_eq!(c.step, Some(7));
    let p = c.preceding.as_ref().unwrap();
    assert_eq!((&*p.name, p.end_ns), ("aten::sum", base + 3_000));
    // The second call's issuing op came after the first dispatcher op.
    assert_eq!(
        t.calls[1].preceding.as_ref().unwrap().name.as_ref(),
        "c10d::allreduce_"
    );
    // Raw clocks: no bound.
    let raw = read(&write("n2b.pt.trace.json", &doc), false).unwrap();
    assert_eq!(raw.participant.bound_ns, None);
}

#[test]
fn nccl_kernels_with_sequence_metadata_are_matched_by_sequence() {
    let doc = json!({
        "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "c10d::allgather_", "pid": 1, "tid": 1, "ts": 5.0, "dur": 1.0},
            {"ph": "X", "cat": "user_annotation", "name": "nccl:all_gather", "pid": 1, "tid": 1, "ts": 5.2, "dur": 0.5},
            {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
             "pid": 0, "tid": 7, "ts": 9.0, "dur": 3.0,
             "args": {"Collective name": "_allgather_base", "Process Group Name": "1", "Seq": 41, "Group size": 8}}
        ]
    });
    let t = read(&write("h.pt.trace.json", &doc), true).unwrap();
    assert_eq!(t.calls.len(), 1, "the kernel tier wins");
    let c = &t.calls[0];
    assert_eq!(c.matched_by, MatchedBy::Sequence);
    assert_eq!(&*c.key.group, "1");
    assert_eq!(c.key.ordinal, 41);
    assert_eq!(c.group_size, Some(8));
    assert_eq!(c.kind, CollectiveKind::AllGather);
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    for v in [
        json!([1, 2]),
        json!({"traceEvents": 3}),
        json!({"traceEvents": [{"ph": "X", "name": "a", "ts": 1e300}]}),
    ] {
        assert!(read(&write("bad.pt.trace.json", &v), true).is_err(), "{v}");
    }
    let p = write("trunc.pt.trace.json", &json!({}));
    std::fs::write(&p, b"{\"traceEvents\": [{\"ph\": \"X\", \"na").unwrap();
    assert!(read(&p, true).is_err());
}

/// Deterministic pseudo-random numbers (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

/// A random trace of every shape the parser must read alike: threads
/// by number and by name, nested and overlapping spans, events out of
/// time order, zero and equal durations, steps, every tier of call,
/// metadata as numbers and strings, escapes, exponents; the trace's
/// fields before or after its events.
fn random_trace(seed: u64, most: u64) -> Vec<u8> {
    let mut r = Rng(seed);
    let events = random_events(&mut r, most);
    let events = serde_json::to_string(&events).unwrap();
    let pg = if r.below(4) == 0 {
        json!([{"pg_name": "0"}, {"pg_name": "1"}])
    } else {
        json!([{"pg_name": "0", "pg_desc": "default_pg"}])
    };
    let fields = format!(
        "\"baseTimeNanoseconds\": {}, \"distributedInfo\": {}, \"clockmesh\": {}, \"host_name\": \"h{}\", \"schemaVersion\": 1",
        1_700_000_000_000_000_000i64 + r.below(1 << 40) as i64,
        json!({"rank": r.below(4), "world_size": 4, "pg_config": pg}),
        json!({"host": "n1", "alignment_bound_ns": 700, "merged_source": "history"}),
        r.below(9),
    );
    let text = if r.below(2) == 0 {
        format!("{{{fields}, \"traceEvents\": {events}}}")
    } else {
        format!("{{\"traceEvents\": {events}, {fields}}}")
    };
    if r.below(2) == 0 {
        let v: Value = serde_json::from_str(&text).unwrap();
        serde_json::to_vec_pretty(&v).unwrap()
    } else {
        text.into_bytes()
    }
}

/// The events of [`random_trace`] (up to `most`).
fn random_events(r: &mut Rng, most: u64) -> Vec<Value> {
    let threads = [
        (json!(1), json!(1)),
        (json!(1), json!(9)),
        (json!(0), json!(7)),
        (json!("Spans"), json!("PyTorch Profiler")),
        (json!(1), Value::Null),
    ];
    let names = [
        "aten::mm",
        "aten::add",
        "aten::mm",
        "aten::sum",
        "c10d::allreduce_",
        "c10d::allgather_",
        "c10d::barrier",
        "gloo:all_reduce",
        "gloo:all_gather",
        "nccl:all_reduce",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)",
        "ncclDevKernel_Generic",
        "record_param_comms",
        "record_param_comms",
        "cudaLaunchKernel",
        "aten::\"quoted\"",
        "ProfilerStep#x",
    ];
    let mut events = Vec::new();
    let mut t = 0.0f64;
    let mut step = 0;
    let n = r.below(most);
    for _ in 0..n {
        let (pid, tid) = r.pick(&threads).clone();
        // Mostly forward, now and then back in time.
        t += match r.below(10) {
            0 => -(r.below(40) as f64),
            1 => 0.0,
            _ => r.below(9) as f64 + r.below(1000) as f64 / 1000.0,
        };
        let dur = match r.below(6) {
            0 => 0.0,
            1 => 1.0,
            _ => r.below(30) as f64 + r.below(8) as f64 / 8.0,
        };
        let mut ev = json!({"ph": "X", "pid": pid, "tid": tid, "ts": t, "dur": dur});
        let name = if r.below(12) == 0 {
            step += 1;
            format!("ProfilerStep#{step}")
        } else {
            r.pick(&names).to_string()
        };
        ev["name"] = json!(name);
        if name.starts_with("ncclDev") || r.below(8) == 0 {
            ev["cat"] = json!("kernel");
        } else if name == "cudaLaunchKernel" {
            ev["cat"] = json!("cuda_runtime");
        } else if name.starts_with("ProfilerStep") && r.below(3) == 0 {
            ev["cat"] = json!("gpu_user_annotation");
        } else {
            ev["cat"] = json!("cpu_op");
        }
        if r.below(3) == 0 {
            let seq = r.below(5);
            ev["args"] = json!({
                "External id": r.below(12),
                "correlation": r.below(12),
                "In msg nelems": r.below(3) * 64,
                "Collective name": *r.pick(&["allreduce", "allgather", "_allgather_base", "broadcast", "bogus"]),
                "Process Group Name": *r.pick(&["0", "1"]),
                "Seq": r.pick(&[json!(seq), json!(seq.to_string()), json!(-1), json!(1.5), Value::Null]).clone(),
                "Group size": 4,
                "Input Dims": [[8, 8], []],
                // Numbers nobody reads, in every shape serde skips
                // (a chunk may end inside any of them).
                "Scale": [-1, -0.5, 1.5e-7, -2.5E+10, 0, 10],
            });
        }
        match r.below(20) {
            0 => ev["ph"] = json!("M"),
            1 => {
                ev.as_object_mut().unwrap().remove("ts");
            }
            2 => {
                ev.as_object_mut().unwrap().remove("dur");
            }
            3 => ev["ts"] = json!(t + 1e-9),
            _ => {}
        }
        events.push(ev);
    }
    events
}

fn same(a: &Result<RankTrace, TraceError>, b: &Result<RankTrace, TraceError>) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => a.participant == b.participant && a.calls == b.calls,
        (Err(_), Err(_)) => true,
        _ => false,
    }
}

/// Streaming reads what reading the whole document read, call for
/// call (the preceding op included), whatever the order of the file.
#[test]
fn the_calls_are_those_of_the_whole_document() {
    let path = Path::new("r.pt.trace.json");
    let (mut second, mut ok, mut before) = (0, 0, 0);
    for seed in 0..600 {
        let bytes = random_trace(seed, 120);
        let want = reference::parse(&bytes, path, true);
        let mut opened = 0;
        let got = read_with(
            || {
                opened += 1;
                Ok(&bytes[..])
            },
            CHUNK,
            path,
            true,
        );
        assert!(
            same(&got, &want),
            "seed {seed}: {got:?}\nwant {want:?}\n{}",
            String::from_utf8_lossy(&bytes)
        );
        if opened > 1 {
            second += 1;
        }
        if let Ok(t) = &want {
            ok += usize::from(!t.calls.is_empty());
            before += t.calls.iter().filter(|c| c.preceding.is_some()).count();
        }
        // And alike in chunks of any size.
        for chunk in [1, 7, 64] {
            let small = read_with(|| Ok(&bytes[..]), chunk, path, true);
            assert!(same(&small, &want), "seed {seed}, chunk {chunk}");
        }
    }
    assert!(
        second > 10,
        "out-of-order traces take a second pass ({second})"
    );
    assert!(
        ok > 400 && before > 2000,
        "{ok} traces with calls, {before} calls with what came before"
    );
}

#[test]
fn in_time_order_one_pass_is_enough() {
    // The bench's shape: compute, the dispatcher op, the backend span
    // on gloo's thread, steps; in time order.
    let mut events = Vec::new();
    let mut t = 0.0;
    for s in 0..50 {
        events.push(json!({"ph": "X", "name": format!("ProfilerStep#{s}"), "pid": 1, "tid": 1, "ts": t, "dur": 400.0}));
        for k in 0..3 {
            for i in 0..20 {
                events.push(
                    json!({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                    "ts": t + f64::from(i) * 5.0, "dur": 4.0 + f64::from(k)}),
                );
            }
            t += 100.0;
            events.push(json!({"ph": "X", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": t, "dur": 8.0}));
            events.push(json!({"ph": "X", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": t + 1.0, "dur": 5.0,
                "args": {"Collective name": "allreduce", "Seq": s * 3 + k, "Process Group Name": "0"}}));
            events.push(json!({"ph": "X", "name": "gloo:all_reduce", "pid": 1, "tid": 9, "ts": t + 2.0, "dur": 30.0}));
            t += 35.0;
        }
        t += 20.0;
    }
    let bytes =
        serde_json::to_vec(&json!({"traceEvents": events, "baseTimeNanoseconds": 5})).unwrap();
    let path = Path::new("r.pt.trace.json");
    let mut opened = 0;
    let got = read_with(
        || {
            opened += 1;
            Ok(&bytes[..])
        },
        CHUNK,
        path,
        false,
    )
    .unwrap();
    assert_eq!(opened, 1);
    assert_eq!(got.calls.len(), 150);
    let want = reference::parse(&bytes, path, false).unwrap();
    assert_eq!(got.calls, want.calls);
    assert_eq!(
        got.calls[0].preceding.as_ref().unwrap().name.as_ref(),
        "aten::mm"
    );
}

#[test]
fn a_thread_keeps_only_what_is_still_open() {
    // Nested spans in time order: the lane holds the enclosing ones,
    // however many spans there were, and answers as a full sort does.
    let mut lane = Lane::default();
    let mut pool = Vec::new();
    let mut all = Vec::new();
    let mut asked = Vec::new();
    let mut r = Rng(7);
    let mut t = 0i128;
    for idx in 0..20_000u64 {
        t += i128::from(r.below(5) as u8);
        if r.below(50) == 0 {
            lane.ask_now(t);
            asked.push(t);
        }
        let (start, end) = match r.below(3) {
            0 => (t, t + 1000),
            _ => (t, t + i128::from(r.below(4) as u8)),
        };
        let name = format!("op{}", r.below(10));
        let w = Work {
            end,
            start,
            idx,
            name: String::new(),
        };
        lane.work(w.clone(), &name, &mut pool);
        all.push(Timed {
            name,
            start_ns: start as i64,
            end_ns: end as i64,
        });
        assert!(lane.open_len() <= 300, "{}", lane.open_len());
    }
    assert!(pool.len() <= 300);
    lane.finish();
    all.sort_by_key(|s| (s.end_ns, s.start_ns));
    for t in asked {
        let want = super::super::preceding_before(&all, t as i64).map(|s| s.name.clone());
        let got = match lane.before(t) {
            Before::Unknown => panic!("not answered at {t}"),
            answered => answered.span().map(|w| w.name.clone()),
        };
        assert_eq!(got, want, "at {t}");
    }
}

#[test]
fn every_truncation_is_an_error() {
    let path = Path::new("r.pt.trace.json");
    for seed in [3, 4, 5] {
        let bytes = random_trace(seed, 12);
        assert!(parse(&bytes, path, true).is_ok());
        let end = bytes.iter().rposition(|b| *b == b'}').unwrap();
        for k in 0..end {
            for chunk in [5, CHUNK] {
                let r = read_with(|| Ok(&bytes[..k]), chunk, path, true);
                assert!(r.is_err(), "seed {seed}: {k} of {} bytes", bytes.len());
            }
        }
    }
}

#[test]
fn errors_say_what_and_where() {
    let path = Path::new("r.pt.trace.json");
    let text =
        r#"{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}, {"ph": "X", "name": 3, "ts": 2}]}"#;
    let at = text.find("3, \"ts\": 2").unwrap();
    for chunk in [4, CHUNK] {
        let e = read_with(|| Ok(text.as_bytes()), chunk, path, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid type: integer `3`"), "{e}");
        let n: usize = e.rsplit("at byte ").next().unwrap().parse().unwrap();
        assert!(n.abs_diff(at) <= 2, "{e}: {at}");
    }
    for (text, what) in [
        (
            r#"{"traceEvents": [{"ph": "X"} {"ph": "X"}]}"#,
            "expected `,` or `]`",
        ),
        (r#"{"traceEvents": []} x"#, "trailing characters"),
        (
            r#"{"traceEvents": [], "traceEvents": []}"#,
            "duplicate field `traceEvents`",
        ),
        (r#"{"other": 1}"#, "missing field `traceEvents`"),
        (
            r#"{"traceEvents": [{"ph": "X", "ph": "X"}]}"#,
            "duplicate field `ph`",
        ),
        (r#"{"traceEvents": [{"ts": 1e999}]}"#, "number out of range"),
        ("", "the file ends"),
    ] {
        let e = parse(text.as_bytes(), path, true).unwrap_err().to_string();
        assert!(e.contains(what), "{text}: {e}");
    }
}

#[test]
fn the_trace_fields_may_follow_the_events() {
    let events = r#"[{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.5, "dur": 2.0},
        {"ph": "X", "name": "gloo:all_reduce", "pid": 1, "tid": 1, "ts": 10.0, "dur": 3.0}]"#;
    let fields = r#""baseTimeNanoseconds": 1000000000000, "host_name": "h7",
        "distributedInfo": {"rank": 3, "world_size": 2, "pg_config": [{"pg_name": "0", "pg_desc": "main"}]},
        "clockmesh": {"alignment_bound_ns": 5, "merged_source": "history"}"#;
    let path = Path::new("x.pt.trace.json");
    let before = format!("{{{fields}, \"traceEvents\": {events}}}");
    let after = format!("{{\"traceEvents\": {events}, {fields}}}");
    let a = parse(before.as_bytes(), path, true).unwrap();
    let b = parse(after.as_bytes(), path, true).unwrap();
    assert_eq!((&a.participant, &a.calls), (&b.participant, &b.calls));
    assert_eq!(b.participant.host, "h7");
    assert_eq!(b.participant.rank, Some(3));
    assert_eq!(b.participant.bound_ns, Some(5));
    let c = &b.calls[0];
    assert_eq!(c.enter_ns, 1_000_000_010_000);
    assert_eq!(&*c.key.group, "main");
    assert_eq!(c.group_size, Some(2));
    assert_eq!(c.preceding.as_ref().unwrap().end_ns, 1_000_000_003_500);
    let p = write("merged.pt.trace.json", &Value::Null);
    std::fs::write(&p, &after).unwrap();
    assert!(is_merged(&p).unwrap());
    std::fs::write(&p, after.replace("merged_source", "other")).unwrap();
    assert!(!is_merged(&p).unwrap());
    std::fs::write(&p, r#"{"clockmesh": {"merged_source": "x"}}"#).unwrap();
    assert!(is_merged(&p).unwrap(), "only clockmesh matters");
    std::fs::write(&p, &after[..after.len() - 2]).unwrap();
    assert!(is_merged(&p).is_err());
}

/// An event as text, to compare what two readers made of it.
fn show_event(ev: &Event) -> String {
    let id = |i: &Option<Id>| match i {
        None => "-".to_string(),
        Some(Id::Num(n)) => format!("n{n}"),
        Some(Id::Text(t)) => format!("t{t}"),
    };
    let text = |t: &Option<Text>| t.as_ref().map(|t| t.0.to_string());
    let args = ev.args.as_ref().map(|a| {
        (
            text(&a.collective),
            text(&a.group),
            a.seq.map(|s| s.0),
            a.group_size,
            (a.external_id, a.correlation, a.in_nelems),
        )
    });
    format!(
        "{:?} {:?} {:?} {} {} {:?} {:?} {:?}",
        text(&ev.ph),
        text(&ev.name),
        text(&ev.cat),
        id(&ev.pid),
        id(&ev.tid),
        ev.ts.map(f64::to_bits),
        ev.dur.map(f64::to_bits),
        args
    )
}

/// Values the quick reader is tried on: plain, not plain, not JSON.
const VALUES: &[&str] = &[
    "0",
    "-0",
    "01",
    "1.",
    "1.5",
    "-1.25",
    "1e5",
    "1E-2",
    "-",
    "2.5e",
    "123456789012345",
    "1234567890123456",
    "123456789012345678",
    "1234567890123456789",
    "99999999999999999999",
    "0.1",
    "0.30000000000000004",
    "9007199254740993",
    "1.0000000000000002",
    "4294967296",
    "\"7\"",
    "\" 8 \"",
    "\"x\"",
    "\"a\\\"b\"",
    "\"\u{e9}\"",
    "\"\\u00e9\"",
    "\"tab\there\"",
    "null",
    "nul",
    "true",
    "false",
    "[]",
    "[1, [2, {\"a\": null}]]",
    "{}",
    "{\"Seq\": 1}",
    "[1,]",
    "{\"a\" 1}",
    " 3 ",
];
/// Keys of an event (one escaped).
const KEYS: &[&str] = &[
    "ph", "name", "cat", "pid", "tid", "ts", "dur", "args", "other", "p\\u0068",
];
/// Keys of an event's args.
const ARG_KEYS: &[&str] = &[
    "Collective name",
    "Process Group Name",
    "Seq",
    "Group size",
    "External id",
    "correlation",
    "In msg nelems",
    "x",
];

/// What the hand reader makes of an event is what serde makes of it,
/// whenever it reads one at all.
#[test]
fn the_quick_reader_reads_as_serde_does() {
    let mut r = Rng(11);
    let mut quick = 0;
    for _ in 0..40_000 {
        let mut text = String::from("{");
        for i in 0..r.below(5) {
            if i > 0 {
                let sep = *r.pick(&[",", ", ", ",\n  "]);
                text.push_str(sep);
            }
            let key = *r.pick(KEYS);
            let value = if key == "args" && r.below(3) > 0 {
                let mut a = String::from("{");
                for j in 0..r.below(4) {
                    if j > 0 {
                        a.push(',');
                    }
                    a.push_str(&format!("\"{}\": {}", r.pick(ARG_KEYS), r.pick(VALUES)));
                }
                a.push('}');
                a
            } else {
                r.pick(VALUES).to_string()
            };
            text.push_str(&format!("\"{key}\"{}{value}", r.pick(&[":", ": ", " :\t"])));
        }
        let close = *r.pick(&["}", " }", "}, ", "", "}]"]);
        text.push_str(close);
        let b = text.as_bytes();
        for cut in [b.len(), r.below(b.len() as u64 + 1) as usize] {
            let b = &b[..cut];
            if let Some((ev, n)) = quick_event(b) {
                quick += 1;
                let (want, m) = one::<Event>(b).unwrap_or_else(|e| panic!("{text}: {e}"));
                assert_eq!((show_event(&ev), n), (show_event(&want), m), "{text}");
            }
        }
    }
    assert!(quick > 1000, "{quick}");
    // Names of fields are text to serde; skipped values are not read.
    for (b, ok) in [
        (&b"{\"\xff\": 1}"[..], false),
        (b"{\"args\": {\"\xff\": 1}}", false),
        (b"{\"x\": \"\xff\"}", true),
        (b"{\"x\": {\"\xff\": 1}}", true),
    ] {
        assert_eq!(one::<Event>(b).is_ok(), ok, "{b:?}");
        if let Some((ev, n)) = quick_event(b) {
            assert!(ok);
            assert_eq!(
                (show_event(&ev), n),
                (show_event(&one::<Event>(b).unwrap().0), b.len())
            );
        }
    }
}

/// Mangled traces (bytes changed, inserted, dropped) are read or
/// refused, never a panic; when both readers take one, they agree.
#[test]
fn mangled_traces_never_panic() {
    let path = Path::new("r.pt.trace.json");
    let mut r = Rng(5);
    let mut agreed = 0;
    for seed in 0..300 {
        let mut bytes = random_trace(seed, 30);
        for _ in 0..=r.below(3) {
            let at = r.below(bytes.len() as u64) as usize;
            let byte = *r.pick(b"{}[]\",:0123456789.-eE\\ \nXxnt\xff\x00");
            match r.below(3) {
                0 => bytes[at] = byte,
                1 => bytes.insert(at, byte),
                _ => {
                    bytes.remove(at);
                }
            }
        }
        for chunk in [3, CHUNK] {
            let got = read_with(|| Ok(&bytes[..]), chunk, path, true);
            if let (Ok(got), Ok(want)) = (&got, reference::parse(&bytes, path, true)) {
                assert_eq!(got.calls, want.calls, "seed {seed}");
                agreed += 1;
            }
        }
    }
    assert!(agreed > 50, "{agreed}");
}

/// Current Kineto with NCCL: the kernel names its group but no `Seq`;
/// the `record_param_comms` op that issued it has the `Seq`, linked by
/// `External id` (or the launch's `correlation`); the kernel runs after
/// its step's CPU span ended; GPU-side step annotations come last, out
/// of order.
#[test]
fn nccl_kernels_take_sequence_and_step_from_the_op_that_launched_them() {
    let kernel = |ts: f64, corr: u64, ext: Option<u64>| {
        let mut args = json!({"correlation": corr, "Process Group Name": "0",
            "Collective name": "allreduce", "In msg nelems": 1024, "Group size": 2});
        if let Some(e) = ext {
            args["External id"] = json!(e);
        }
        json!({"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "ts": ts, "dur": 30.0, "args": args,
            "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"})
    };
    let comms = |ts: f64, ext: u64, seq: u64| {
        json!({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1,
            "ts": ts, "dur": 8.0, "args": {"External id": ext, "Seq": seq, "Process Group Name": "0",
            "Collective name": "allreduce", "Group size": 2, "In msg nelems": 1024}})
    };
    let op = |name: &str, ts: f64, ext: u64| {
        json!({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 6.0,
            "args": {"External id": ext}})
    };
    let launch = |ts: f64, corr: u64, ext: Option<u64>| {
        let mut args = json!({"correlation": corr});
        if let Some(e) = ext {
            args["External id"] = json!(e);
        }
        json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
            "ts": ts, "dur": 1.0, "args": args})
    };
    let step = |n: u64, ts: f64, cat: &str| {
        json!({"ph": "X", "cat": cat, "name": format!("ProfilerStep#{n}"), "pid": 1, "tid": 1,
            "ts": ts, "dur": 99.0})
    };
    let doc = json!({
        "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2},
        "traceEvents": [
            step(3, 0.0, "user_annotation"),
            comms(10.0, 45, 17),
            op("nccl:all_reduce", 11.0, 46),
            launch(12.0, 123, Some(46)),
            step(4, 100.0, "user_annotation"),
            comms(110.0, 55, 18),
            launch(112.0, 130, None),
            step(5, 200.0, "user_annotation"),
            comms(210.0, 65, 19),
            // The kernels run after their steps ended on the CPU, each
            // after the GPU work its step queued on the same stream.
            kernel(150.0, 123, Some(46)),
            json!({"ph": "X", "cat": "gpu_user_annotation", "name": "optimizer", "pid": 0,
                "tid": 7, "ts": 190.0, "dur": 59.0}),
            json!({"ph": "X", "cat": "kernel", "name": "spin_kernel", "pid": 0, "tid": 7,
                "ts": 200.0, "dur": 49.0}),
            kernel(250.0, 130, None),
            kernel(350.0, 140, Some(65)),
            // GPU rows repeat the steps, later and out of order.
            step(5, 340.0, "gpu_user_annotation"),
            step(4, 240.0, "gpu_user_annotation"),
        ]
    });
    let t = read(&write("gpu.pt.trace.json", &doc), true).unwrap();
    type Seen = (MatchedBy, u64, Option<u64>, Option<u32>, Option<u64>);
    let got: Vec<Seen> = t
        .calls
        .iter()
        .map(|c| {
            (
                c.matched_by,
                c.key.ordinal,
                c.step,
                c.group_size,
                c.elements,
            )
        })
        .collect();
    let seq = MatchedBy::Sequence;
    assert_eq!(
        got,
        [
            (seq, 17, Some(3), Some(2), Some(1024)),
            (seq, 18, Some(4), Some(2), Some(1024)),
            (seq, 19, Some(5), Some(2), Some(1024)),
        ],
        "by External id through nccl:all_reduce, by the launch's thread and time, by External id"
    );
    assert!(t.calls.iter().all(|c| &*c.key.name == "allreduce"));
    // The arrival is the kernel's start; what the rank did before is the
    // GPU work on its stream (the enclosing annotation of the kernels
    // that ended with it), not the CPU thread that only queued it and
    // ran ahead (its record_param_comms ended 232 µs earlier).
    assert_eq!(t.calls[1].enter_ns, 250_000);
    let before = t.calls[1].preceding.as_ref().unwrap();
    assert_eq!(
        (&*before.name, before.start_ns, before.end_ns),
        ("optimizer", 190_000, 249_000)
    );
}
