//! Layout v2: the ring of recent records. The Rust, C
//! (hook/include/clockmesh.h) and Python (python/clockmesh/reader.py)
//! readers place stamps inside, between, before and after the ring's
//! records written by the Rust writer, and GPU stamps through the device
//! maps, and must give the same answer — the same error codes included —
//! as the rule of docs/offsets-format.md computed here from the records;
//! they give the same state and bound in holdover (past a record's
//! validity, within its ceiling) and past the ceiling (stale), and keep
//! answering across a writer restart.

mod common;
use common::{compile_c_reader, scratch};

use std::path::Path;
use std::process::Command;

use clockmesh_offsets::layout::{FILE_LEN, RING_SLOTS, VERSION};
use clockmesh_offsets::{
    DeviceKind, DeviceMap, NodeMap, OffsetsReader, OffsetsWriter, PublishError, Record,
    device_flags, flags, realtime_now_ns,
};
use clockmesh_offsets::{GlobalNs, LocalNs};

const S: i64 = 1_000_000_000;

/// The C and Python readers' codes for the Rust errors.
fn code(r: &Result<(GlobalNs, u64), PublishError>) -> String {
    match r {
        Ok((g, b)) => format!("0 {g} {b}"),
        Err(e) => {
            let c = match e {
                PublishError::Missing { .. } => -1,
                PublishError::BadFormat(_) => -2,
                PublishError::BadVersion { .. } => -3,
                PublishError::NoData => -4,
                PublishError::Stale { .. } => -5,
                PublishError::Busy => -6,
                PublishError::NoDevice(_) => -8,
                PublishError::TooOld { .. } => -10,
                other => panic!("unexpected {other}"),
            };
            format!("{c} 0 0")
        }
    }
}

const PY: &str = r#"
import sys, clockmesh
from clockmesh import reader
mode, path = sys.argv[1], sys.argv[2]
try:
    r = clockmesh.OffsetsReader(path)
except clockmesh.ClockmeshError as e:
    print(e.code, 0, 0); sys.exit(0)
args = [int(a) for a in sys.argv[3:]]
if mode == "now":
    n = r.now()
    print(n.status, n.epoch); sys.exit(0)
if mode == "state":
    s = r.read_snapshot()
    for t in args:
        try:
            s.check_fresh(t); rc = 0
        except clockmesh.ClockmeshError as e:
            rc = e.code
        print(s.status(t), rc, s.apply(t)[1])
    sys.exit(0)
dev = args.pop(0) if mode == "dev" else None
for t in args:
    try:
        g, b = r.to_global(t) if dev is None else r.device_to_global(dev, t)
        print(0, g, b)
    except clockmesh.ClockmeshError as e:
        print(e.code, 0, 0)
"#;

fn python_lines(mode: &str, path: &Path, args: &[String]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let py = Command::new("python3")
        .arg("-c")
        .arg(PY)
        .arg(mode)
        .arg(path)
        .args(args)
        .env("PYTHONPATH", root.join("python"))
        .output()
        .unwrap();
    assert!(
        py.status.success(),
        "{}",
        String::from_utf8_lossy(&py.stderr)
    );
    lines(&py.stdout)
}

fn lines(b: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(b)
        .lines()
        .map(str::to_string)
        .collect()
}

/// One line per stamp from each of C and Python: (C, Python).
fn others(exe: &Path, path: &Path, mode: &str, args: &[i64]) -> (Vec<String>, Vec<String>) {
    let args: Vec<String> = args.iter().map(i64::to_string).collect();
    let c = Command::new(exe)
        .arg(mode)
        .arg(path)
        .args(&args)
        .output()
        .unwrap();
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    (lines(&c.stdout), python_lines(mode, path, &args))
}

fn record(window: u64, anchor: i64, valid_until: i64, offset: i64) -> Record {
    Record {
        flags: flags::VALID,
        window,
        updated_at_ns: anchor,
        valid_until_ns: valid_until,
        node: NodeMap {
            anchor_local_ns: anchor,
            offset_ns: offset,
            drift_ps_per_s: -1_500_000 + 700_001 * window as i64,
            bound_ns: 30 + window,
            bound_growth_ps_per_s: 2_500 * window,
        },
        ..Record::default()
    }
}

/// The rule of docs/offsets-format.md over the records published (oldest
/// first, at most RING_SLOTS kept).
fn model(published: &[Record], t: i64) -> Result<(GlobalNs, u64), PublishError> {
    let kept = &published[published.len().saturating_sub(RING_SLOTS)..];
    let Some(r) = kept.iter().rev().find(|r| r.node.anchor_local_ns <= t) else {
        return Err(if kept.is_empty() {
            PublishError::NoData
        } else {
            PublishError::TooOld {
                local_ns: t,
                oldest_anchor_ns: kept[0].node.anchor_local_ns,
            }
        });
    };
    if r.flags & flags::VALID == 0 {
        return Err(PublishError::NoData);
    }
    let (global, bound) = r.node.to_global(LocalNs(t));
    // Past its validity a record holds over while its grown bound stays
    // within its ceiling (set, and the bound growing).
    let held = r.holdover_max_bound_ns > 0
        && r.node.bound_growth_ps_per_s > 0
        && bound <= r.holdover_max_bound_ns;
    if r.flags & flags::STALE != 0 || (t > r.valid_until_ns && !held) {
        return Err(PublishError::Stale {
            valid_until_ns: r.valid_until_ns,
            now_ns: t,
            flags: r.flags,
        });
    }
    Ok((global, bound))
}

/// Every stamp through the three readers and the model; all must agree.
fn agree(exe: &Path, path: &Path, published: &[Record], stamps: &[i64]) -> Vec<String> {
    let reader = OffsetsReader::open(path).unwrap();
    let rust: Vec<String> = stamps
        .iter()
        .map(|&t| code(&reader.to_global(LocalNs(t))))
        .collect();
    let expected: Vec<String> = stamps.iter().map(|&t| code(&model(published, t))).collect();
    let (c, py) = others(exe, path, "ring", stamps);
    for (i, t) in stamps.iter().enumerate() {
        assert_eq!(rust[i], expected[i], "Rust vs the rule at {t}");
        assert_eq!(c[i], rust[i], "C vs Rust at {t}");
        assert_eq!(py[i], rust[i], "Python vs Rust at {t}");
    }
    rust
}

#[test]
fn three_readers_agree_inside_between_before_and_after_the_rings_records() {
    let path = scratch("ring", "agree");
    let exe = compile_c_reader(path.parent().unwrap());
    let writer = OffsetsWriter::open(&path).unwrap();
    let now = realtime_now_ns().0;
    let base = now - 600 * S;
    // Six records 4 s apart, each valid 3 s: a 1 s gap after each; a
    // holdover one; the newest anchored now, valid an hour.
    let mut published = Vec::new();
    for k in 0..6u64 {
        let a = base + 4 * S * k as i64;
        let mut r = record(k + 1, a, a + 3 * S, -1_000 * (k as i64 + 1) + 7);
        if k == 3 {
            r.flags |= flags::HOLDOVER;
        }
        published.push(r);
    }
    published.push(record(7, now, now + 3_600 * S, 123_456));
    // Nothing published yet: no data for any stamp.
    agree(&exe, &path, &published[..0], &[now, base]);
    for r in &published {
        writer.publish(r).unwrap();
    }
    let mut stamps = vec![base - 1, base - 3_600 * S, i64::MIN, i64::MAX];
    for r in &published {
        let (a, v) = (r.node.anchor_local_ns, r.valid_until_ns);
        // At the anchor, inside (odd ns for the rounding), at and just past
        // the validity, between this record and the next.
        stamps.extend([a, a + S + 123_457, a - 1, v, v + 1, a + 3 * S + S / 2]);
    }
    stamps.push(now + 3_600 * S + 1); // after the newest record's validity
    let lines = agree(&exe, &path, &published, &stamps);
    for (want, what) in [
        ("0 ", "inside"),
        ("-5 ", "between / after"),
        ("-10 ", "before"),
    ] {
        assert!(lines.iter().any(|l| l.starts_with(want)), "no {what} case");
    }
    // Judged at the stamp's time, not now: the oldest record expired
    // ten minutes ago but still maps its own stamps.
    let reader = OffsetsReader::open(&path).unwrap();
    assert!(reader.to_global(LocalNs(base + S)).is_ok());
    assert!(matches!(
        reader.to_global(LocalNs(base - 1)),
        Err(PublishError::TooOld { oldest_anchor_ns, .. }) if oldest_anchor_ns == base
    ));

    // Republishing the newest window (new device maps) updates it in place.
    assert_eq!(writer.ring_len(), published.len());
    let mut again = published.last().unwrap().clone();
    again.devices = vec![DeviceMap {
        device_id: 1,
        flags: device_flags::VALID,
        valid_until_ns: i64::MAX,
        ..DeviceMap::default()
    }];
    writer.publish(&again).unwrap();
    assert_eq!(writer.ring_len(), published.len());

    // Marked stale: the newest record refuses its stamps, older ones serve theirs.
    writer.mark_stale();
    published.last_mut().unwrap().flags |= flags::STALE;
    agree(&exe, &path, &published, &stamps);
    assert!(matches!(
        reader.to_global(LocalNs(now + S)),
        Err(PublishError::Stale { .. })
    ));

    // An agent restart keeps the ring (its newest record stale, epoch + 1).
    drop(writer);
    let writer = OffsetsWriter::open(&path).unwrap();
    assert_eq!(writer.ring_len(), published.len());
    agree(&exe, &path, &published, &stamps);
    let fresh = record(8, now + S, now + 3_600 * S, -42);
    writer.publish(&fresh).unwrap();
    published.push(fresh);
    agree(&exe, &path, &published, &stamps);
}

#[test]
fn the_ring_keeps_the_last_256_records_and_refuses_older_stamps() {
    let path = scratch("ring", "wrap");
    let exe = compile_c_reader(path.parent().unwrap());
    let writer = OffsetsWriter::open(&path).unwrap();
    let now = realtime_now_ns().0;
    // 300 windows of 4 s (a window the agent takes), each valid 12 s: the last 256 cover
    // 1024 s (17 min) of stamps.
    let first = now - 300 * 4 * S;
    let published: Vec<Record> = (0..300)
        .map(|k| {
            let a = first + 4 * S * k;
            record(k as u64 + 1, a, a + 12 * S, -5_000 + k)
        })
        .collect();
    for r in &published {
        writer.publish(r).unwrap();
    }
    assert_eq!(writer.ring_len(), RING_SLOTS);
    let oldest_kept = published[300 - RING_SLOTS].node.anchor_local_ns;
    assert!(now - oldest_kept >= 10 * 60 * S, "covers ≥ 10 min");
    let stamps: Vec<i64> = [
        first + 10 * 4 * S + S,   // record 11: dropped from the ring
        oldest_kept - S,          // just before the oldest kept record
        oldest_kept - 1,          // ditto
        oldest_kept,              // the oldest kept record
        oldest_kept + 5 * S,      // overlap: the next record is newer
        now - 17 * S,             // an older record still valid
        now,                      // the newest
        now - 4 * S + 12 * S + 1, // past the newest record's validity
    ]
    .to_vec();
    let lines = agree(&exe, &path, &published, &stamps);
    assert_eq!(&lines[0][..4], "-10 ");
    assert_eq!(&lines[2][..4], "-10 ");
    assert_eq!(&lines[3][..2], "0 ");
    assert_eq!(&lines[7][..3], "-5 ");
}

#[test]
fn device_stamps_agree_in_the_three_readers() {
    let path = scratch("ring", "devices");
    let exe = compile_c_reader(path.parent().unwrap());
    let writer = OffsetsWriter::open(&path).unwrap();
    let now = realtime_now_ns().0;
    let older = record(1, now - 60 * S, now - 50 * S, 900);
    let mut newest = record(2, now - 40 * S, now + 3_600 * S, -77_777);
    let device = |id: u32, flags: u16, valid_until_ns: i64| DeviceMap {
        device_id: id,
        kind: DeviceKind::Cuda,
        flags,
        // Device clock ~ host time − 5 ms, drifting −3 µs/s.
        device_anchor_ns: now - 5_000_000,
        offset_ns: 5_000_123,
        drift_ps_per_s: -3_000_000,
        bound_ns: 250,
        valid_until_ns,
    };
    newest.devices = vec![
        device(0, device_flags::VALID, now + 600 * S),
        device(3, 0, now + 600 * S),
        device(5, device_flags::VALID, now - 30 * S),
    ];
    writer.publish(&older).unwrap();
    writer.publish(&newest).unwrap();
    let reader = OffsetsReader::open(&path).unwrap();
    let d0 = newest.devices[0];
    let stamps = [
        now - 5_000_000,           // the device anchor
        now + 2 * S + 333,         // inside the newest record
        now - 55 * S,              // host time in the older record
        now - 45 * S,              // between: past the older record's validity
        now - 120 * S,             // before every record
        now + 601 * S,             // past the device map's validity
        d0.valid_until_ns - 5 * S, // just inside it
    ];
    for (id, expect) in [(0u32, None), (3, Some(-4)), (5, Some(-5)), (9, Some(-8))] {
        let rust: Vec<String> = stamps
            .iter()
            .map(|&d| code(&reader.device_to_global(id, d)))
            .collect();
        let mut args = vec![i64::from(id)];
        args.extend(stamps);
        let (c, py) = others(&exe, &path, "dev", &args);
        assert_eq!(c, rust, "C vs Rust, device {id}");
        assert_eq!(py, rust, "Python vs Rust, device {id}");
        if let Some(code) = expect {
            assert!(
                rust.iter().any(|l| l.starts_with(&format!("{code} "))),
                "device {id}: {rust:?}"
            );
        }
    }
    // Device 0 by hand: DeviceMap::to_host, then the node map of the record
    // that covers that host time, bounds added.
    let by_hand = |d: i64| -> Result<(GlobalNs, u64), PublishError> {
        let host = d0.to_host(d);
        if host > LocalNs(d0.valid_until_ns) {
            return Err(PublishError::Stale {
                valid_until_ns: d0.valid_until_ns,
                now_ns: host.0,
                flags: 1,
            });
        }
        let (g, b) = model(&[older.clone(), newest.clone()], host.0)?;
        Ok((g, b + d0.bound_ns))
    };
    let rust: Vec<String> = stamps
        .iter()
        .map(|&d| code(&reader.device_to_global(0, d)))
        .collect();
    let hand: Vec<String> = stamps.iter().map(|&d| code(&by_hand(d))).collect();
    assert_eq!(rust, hand);
    for want in ["0 ", "-5 ", "-10 "] {
        assert!(rust.iter().any(|l| l.starts_with(want)), "{want}: {rust:?}");
    }
}

#[test]
fn v1_files_are_refused_by_every_reader_and_replaced_by_the_writer() {
    let path = scratch("ring", "v1");
    let exe = compile_c_reader(path.parent().unwrap());
    // A layout v1 file: one 4096-byte page, version 1.
    let mut v1 = vec![0u8; 4096];
    v1[..8].copy_from_slice(b"CLKMOFS1");
    v1[8..16].copy_from_slice(&(1u64 | (64 << 32)).to_le_bytes());
    v1[16..24].copy_from_slice(&(4096u64 | (16 << 32)).to_le_bytes());
    v1[64..72].copy_from_slice(&2u64.to_le_bytes());
    v1[72..76].copy_from_slice(&flags::VALID.to_le_bytes());
    std::fs::write(&path, &v1).unwrap();
    assert!(matches!(
        OffsetsReader::open(&path),
        Err(PublishError::BadVersion {
            found: 1,
            expected: VERSION
        })
    ));
    let py = python_lines("ring", &path, &[realtime_now_ns().0.to_string()]);
    assert_eq!(py, vec!["-3 0 0".to_string()]);
    let out = Command::new(&exe).arg("code").arg(&path).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("-3 "));

    let writer = OffsetsWriter::open(&path).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        FILE_LEN as u64,
        "replaced by a v2 file"
    );
    assert!(matches!(
        OffsetsReader::open(&path)
            .unwrap()
            .to_global(LocalNs(realtime_now_ns().0)),
        Err(PublishError::NoData)
    ));
    drop(writer);
}

#[test]
fn a_restarted_writer_clears_torn_ring_records_and_drops_a_torn_current_record() {
    use clockmesh_offsets::layout::{RECORD_END, slot_offset};
    let path = scratch("ring", "torn-restart");
    let exe = compile_c_reader(path.parent().unwrap());
    let now = realtime_now_ns().0;
    let mut published: Vec<Record> = (0..3)
        .map(|k| record(k as u64 + 1, now - (30 - 10 * k) * S, now + 3_600 * S, k))
        .collect();
    let writer = OffsetsWriter::open(&path).unwrap();
    for r in &published {
        writer.publish(r).unwrap();
    }
    drop(writer);
    // As if a writer died writing record 3: its slot and the current
    // record's payload hold a mix (one word changed, checksums stale).
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[slot_offset(3) + 64] ^= 0x40; // offset_ns of record 3
    bytes[RECORD_END - 8] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();

    let writer = OffsetsWriter::open(&path).unwrap();
    assert!(writer.dropped_torn_record());
    assert_eq!(writer.ring_len(), 2);
    let reader = OffsetsReader::open(&path).unwrap();
    assert_eq!(reader.read_record().unwrap().flags, 0, "no data");
    // Record 3 is gone; record 2 (now the newest, flagged holdover: still
    // answering) and record 1 remain.
    published.pop();
    published.last_mut().unwrap().flags |= flags::HOLDOVER;
    let stamps = [now - 25 * S, now - 15 * S, now - 5 * S, now - 40 * S];
    let lines = agree(&exe, &path, &published, &stamps);
    assert!(
        lines[1].starts_with("0 ") && lines[2].starts_with("0 "),
        "{lines:?}"
    );
    // The next record gets number 3 again, in the cleared slot.
    let fresh = record(9, now, now + 3_600 * S, 99);
    writer.publish(&fresh).unwrap();
    published.push(fresh);
    assert_eq!(writer.ring_len(), 3);
    agree(&exe, &path, &published, &[now - 25 * S, now + S]);
}

#[test]
fn rust_reader_serves_stamps_older_than_the_ring_from_the_history() {
    use clockmesh_offsets::{Anchor, HostMap};
    let path = scratch("ring", "history");
    let now = realtime_now_ns().0;
    let writer = OffsetsWriter::open(&path).unwrap();
    writer
        .publish(&record(1, now, now + 3_600 * S, 10))
        .unwrap();
    // An anchor of the agent's history an hour ago, offset 500 ± 20 ns.
    let history = HostMap::new(vec![Anchor {
        at_ns: now - 3_600 * S,
        offset_ns: 500,
        drift_ppb: 0.0,
        bound_ns: 20,
        bound_growth_ppb: 0.0,
    }])
    .unwrap();
    let plain = OffsetsReader::open(&path).unwrap();
    let with = OffsetsReader::open(&path).unwrap().with_history(history);
    let old = now - 3_600 * S;
    assert!(matches!(
        plain.to_global(LocalNs(old)),
        Err(PublishError::TooOld { .. })
    ));
    assert_eq!(
        with.to_global(LocalNs(old)).unwrap(),
        (GlobalNs(old + 500), 20)
    );
    // Stamps the ring covers still come from the ring.
    assert_eq!(
        with.to_global(LocalNs(now)).unwrap(),
        plain.to_global(LocalNs(now)).unwrap()
    );
}

/// A record as the agent writes them: bound 100 ns growing 100 ns/s, valid
/// 12 s after its anchor, holdover ceiling 10 µs — so it holds over until
/// 99 s after its anchor, where its bound reaches the ceiling exactly.
fn held(window: u64, anchor: i64, offset: i64) -> Record {
    Record {
        flags: flags::VALID,
        window,
        updated_at_ns: anchor,
        valid_until_ns: anchor + 12 * S,
        node: NodeMap {
            anchor_local_ns: anchor,
            offset_ns: offset,
            drift_ps_per_s: 2_500_001,
            bound_ns: 100,
            bound_growth_ps_per_s: 100_000,
        },
        holdover_max_bound_ns: 10_000,
        ..Record::default()
    }
}

/// Where a `held` record anchored at `a` reaches its ceiling.
const CEILING_AGE: i64 = 99 * S;

/// The current record's state, `check_fresh` code and bound at each time
/// in the three readers: "state rc bound" lines, all equal.
fn states_agree(exe: &Path, path: &Path, times: &[i64]) -> Vec<String> {
    let snap = OffsetsReader::open(path).unwrap().snapshot().unwrap();
    let rust: Vec<String> = times
        .iter()
        .map(|&t| {
            let rc = code(&snap.check_fresh(LocalNs(t)).map(|()| (GlobalNs(0), 0)));
            let rc = rc.split(' ').next().unwrap().to_string();
            format!(
                "{} {rc} {}",
                snap.status(LocalNs(t)) as i32,
                snap.node.to_global(LocalNs(t)).1
            )
        })
        .collect();
    let (c, py) = others(exe, path, "state", times);
    assert_eq!(c, rust, "C vs Rust");
    assert_eq!(py, rust, "Python vs Rust");
    rust
}

/// `now()` in the three readers: (status, epoch), all equal.
fn now_agrees(exe: &Path, path: &Path) -> (i32, u64) {
    let n = OffsetsReader::open(path).unwrap().now().unwrap();
    let (c, py) = others(exe, path, "now", &[]);
    let rust = format!("{} {}", n.status as i32, n.epoch);
    let c: Vec<&str> = c[0].split(' ').collect();
    assert_eq!(format!("{} {}", c[0], c[1]), rust, "C vs Rust");
    assert_eq!(py[0], rust, "Python vs Rust");
    (n.status as i32, n.epoch)
}

#[test]
fn three_readers_hold_over_past_validity_until_the_ceiling_then_refuse() {
    let path = scratch("ring", "holdover");
    let exe = compile_c_reader(path.parent().unwrap());
    let writer = OffsetsWriter::open(&path).unwrap();
    let now = realtime_now_ns().0;
    let base = now - 600 * S;
    let mut published = vec![
        // Gaps of 120 s and 180 s after the first two: served in holdover
        // up to 99 s after each anchor, then stale.
        held(1, base, -1_000),
        held(2, base + 120 * S, -2_000),
        // Solved in holdover (flag), but without a ceiling: stale past
        // its validity.
        Record {
            flags: flags::VALID | flags::HOLDOVER,
            holdover_max_bound_ns: 0,
            ..held(3, base + 300 * S, -3_000)
        },
        // A bound that does not grow: no holdover past validity.
        {
            let mut r = held(4, base + 400 * S, -4_000);
            r.node.bound_growth_ps_per_s = 0;
            r
        },
        // The newest: updates stopped 30 s ago (valid until 18 s ago).
        held(5, now - 30 * S, -5_000),
    ];
    for r in &published {
        writer.publish(r).unwrap();
    }
    let mut stamps = vec![];
    for r in &published {
        let (a, v) = (r.node.anchor_local_ns, r.valid_until_ns);
        stamps.extend([
            a + S,
            v,
            v + 1,
            a + 30 * S + 7,
            a + CEILING_AGE,
            a + CEILING_AGE + 1,
        ]);
    }
    stamps.extend([base + 59 * S, base + 250 * S, now + 3_600 * S]);
    let lines = agree(&exe, &path, &published, &stamps);
    // Record 1: inside, at the validity edge, in holdover (bound grown
    // from 1_300 ns to the ceiling), at the ceiling exactly; then stale.
    let bound = |l: &str| l.split(' ').nth(2).unwrap().parse::<u64>().unwrap();
    assert!(lines[..5].iter().all(|l| l.starts_with("0 ")), "{lines:?}");
    assert_eq!(bound(&lines[2]), 1_301);
    assert_eq!(bound(&lines[4]), 10_000, "the ceiling itself still answers");
    assert!(lines[5].starts_with("-5 "), "1 ns past the ceiling");
    // Records 3 (no ceiling) and 4 (no growth): stale right past validity.
    for r in [2, 3] {
        assert!(lines[6 * r + 1].starts_with("0 "), "{r}: {lines:?}");
        assert!(lines[6 * r + 2].starts_with("-5 "), "{r}: {lines:?}");
    }
    // In the gaps: held over (base + 59 s), past the ceiling (base + 250 s).
    let n = stamps.len();
    assert!(lines[n - 3].starts_with("0 ") && lines[n - 2].starts_with("-5 "));

    // The current record (the newest) in all three: state, code, bound.
    let (a, v) = (now - 30 * S, now - 18 * S);
    let at = [a + S, v, v + 1, now, a + CEILING_AGE, a + CEILING_AGE + 1];
    let got = states_agree(&exe, &path, &at);
    let states: Vec<&str> = got.iter().map(|l| &l[..4]).collect();
    assert_eq!(states, ["1 0 ", "1 0 ", "2 0 ", "2 0 ", "2 0 ", "3 -5"]);
    assert_eq!(now_agrees(&exe, &path).0, 2, "now: holdover");

    // Flagged stale: no holdover, no answer, at any time.
    writer.mark_stale();
    published.last_mut().unwrap().flags |= flags::STALE;
    agree(&exe, &path, &published, &stamps);
    let got = states_agree(&exe, &path, &at);
    assert!(got.iter().all(|l| l.starts_with("3 -5 ")), "{got:?}");
    assert_eq!(now_agrees(&exe, &path).0, 3);
}

#[test]
fn a_restarted_writer_keeps_answering_in_holdover_with_a_new_epoch() {
    let path = scratch("ring", "restart-holdover");
    let exe = compile_c_reader(path.parent().unwrap());
    let now = realtime_now_ns().0;
    let writer = OffsetsWriter::open(&path).unwrap();
    let epoch = writer.epoch();
    let mut published = vec![held(1, now - 8 * S, 700), held(2, now - 4 * S, 900)];
    for r in &published {
        writer.publish(r).unwrap();
    }
    assert_eq!(now_agrees(&exe, &path), (1, epoch), "synchronised");
    let stamps = [
        now - 6 * S,                   // record 1
        now,                           // record 2, within its validity
        now + 20 * S,                  // record 2 in holdover
        now - 4 * S + CEILING_AGE + 1, // past its ceiling
    ];
    let before = agree(&exe, &path, &published, &stamps);
    assert!(before[1].starts_with("0 ") && before[2].starts_with("0 "));
    // The agent dies (kill -9: nothing marked) and starts again.
    drop(writer);
    let writer = OffsetsWriter::open(&path).unwrap();
    assert_eq!(writer.epoch(), epoch + 1);
    // The previous records still answer, the same as before: the newest
    // flagged holdover, with the new epoch in the current record.
    assert_eq!(
        now_agrees(&exe, &path),
        (2, epoch + 1),
        "holdover, new epoch"
    );
    published.last_mut().unwrap().flags |= flags::HOLDOVER;
    assert_eq!(agree(&exe, &path, &published, &stamps), before);
    let reader = OffsetsReader::open(&path).unwrap();
    let ring = reader.ring().unwrap();
    assert_eq!(ring.last().unwrap().1.flags, flags::VALID | flags::HOLDOVER);
    assert_eq!(ring[0].1.flags, flags::VALID, "older records untouched");
    // Its first result: synchronised again, same (new) epoch.
    let fresh = held(3, now, 1_100);
    writer.publish(&fresh).unwrap();
    published.push(fresh);
    assert_eq!(now_agrees(&exe, &path), (1, epoch + 1), "synchronised");
    agree(&exe, &path, &published, &stamps);
}

#[test]
fn a_restarted_writer_does_not_revive_a_record_past_its_ceiling() {
    let path = scratch("ring", "restart-expired");
    let exe = compile_c_reader(path.parent().unwrap());
    let now = realtime_now_ns().0;
    let writer = OffsetsWriter::open(&path).unwrap();
    let old = held(1, now - 600 * S, 5);
    writer.publish(&old).unwrap();
    drop(writer);
    let writer = OffsetsWriter::open(&path).unwrap();
    let mut published = vec![old];
    published[0].flags |= flags::HOLDOVER;
    let lines = agree(&exe, &path, &published, &[now, now - 590 * S]);
    assert!(
        lines[0].starts_with("-5 ") && lines[1].starts_with("0 "),
        "{lines:?}"
    );
    assert_eq!(now_agrees(&exe, &path), (3, writer.epoch()), "stale now");
}
