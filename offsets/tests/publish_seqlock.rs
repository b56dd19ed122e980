//! The offsets file under concurrency and failure: a writer publishing at a
//! high rate while Rust and C readers (hook/include/clockmesh.h, compiled
//! with `cc`) check every copy for a torn/mixed record; a killed writer; the
//! fail-closed error paths of both readers.
//!
//! Good reads: 10^7 by the C reader (always built with -O2); 10^7 by the
//! Rust readers in release builds (`cargo test --release -p clockmesh --test
//! publish_seqlock`, ~5 s), 10^6 in debug builds (unoptimized reads are 60x
//! slower). CLOCKMESH_STRESS_READS overrides both.

mod common;
use common::{compile_c_reader, scratch};

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use clockmesh_offsets::{
    DeviceKind, DeviceMap, KernelClocks, MAX_DEVICES, NodeMap, OffsetsReader, OffsetsWriter,
    PublishError, Record, device_flags, flags, realtime_now_ns,
};
use clockmesh_offsets::{GlobalNs, LocalNs};

fn stress_reads(optimized: bool) -> u64 {
    std::env::var("CLOCKMESH_STRESS_READS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if optimized { 10_000_000 } else { 1_000_000 })
}

/// Every field is a function of the window `k`, so a copy mixing two records
/// is detectable. Mirrored by `consistent()` in hook/tests/c_reader_check.c.
fn pattern(k: u64) -> Record {
    let n = (k % (MAX_DEVICES as u64 + 1)) as usize;
    Record {
        flags: flags::VALID,
        epoch: 0,
        window: k,
        reference_id: k ^ 0xabcd,
        updated_at_ns: (k * 3) as i64,
        valid_until_ns: i64::MAX,
        node: NodeMap {
            anchor_local_ns: (k * 5) as i64,
            offset_ns: -((k * 11) as i64),
            drift_ps_per_s: (k * 13) as i64,
            bound_ns: k * 17,
            bound_growth_ps_per_s: k * 19,
        },
        holdover_max_bound_ns: k * 31,
        clocks: KernelClocks {
            realtime_minus_monotonic_ns: (k * 23) as i64,
            realtime_minus_boottime_ns: 0,
            sampled_at_ns: 0,
        },
        devices: (0..n as u64)
            .map(|i| DeviceMap {
                device_id: i as u32,
                kind: DeviceKind::Cuda,
                flags: device_flags::VALID,
                device_anchor_ns: (k + i) as i64,
                offset_ns: (2 * k + i) as i64,
                drift_ps_per_s: 0,
                bound_ns: k * 29 + i,
                valid_until_ns: i64::MAX,
            })
            .collect(),
    }
}

fn is_pattern(r: &Record) -> bool {
    let mut expected = pattern(r.window);
    expected.epoch = r.epoch;
    *r == expected
}

/// Runs `readers` while a writer thread publishes pattern records at a high
/// rate (one per ~10 µs; the agent publishes about once a second); returns
/// how many records the writer published. Back-to-back writes with no gap
/// would starve any seqlock reader, which then reports `Busy`.
fn with_busy_writer(path: &Path, readers: impl FnOnce()) -> u64 {
    let writer = OffsetsWriter::open(path).unwrap();
    writer.publish(&pattern(1)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(Barrier::new(2));
    let handle = {
        let (stop, started) = (stop.clone(), started.clone());
        std::thread::spawn(move || {
            started.wait();
            let mut k = 1;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                writer.publish(&pattern(k)).unwrap();
                let t = std::time::Instant::now();
                while t.elapsed() < Duration::from_micros(10) {
                    std::hint::spin_loop();
                }
            }
            k
        })
    };
    started.wait();
    readers();
    stop.store(true, Ordering::Relaxed);
    handle.join().unwrap()
}

#[test]
fn rust_readers_never_see_a_torn_record() {
    let path = scratch("pub", "rust-stress");
    let per_thread = stress_reads(!cfg!(debug_assertions)) / 2;
    let written = with_busy_writer(&path, || {
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let reader = OffsetsReader::open(&path).unwrap();
                    let (mut ok, mut busy, mut torn, mut changes, mut last) =
                        (0u64, 0u64, 0u64, 0u64, 0u64);
                    while ok < per_thread {
                        // Busy (writer preempted mid-write for > 50 ms on an
                        // oversubscribed machine) fails closed: no record.
                        let r = match reader.read_record() {
                            Ok(r) => r,
                            Err(PublishError::Busy) => {
                                busy += 1;
                                continue;
                            }
                            Err(e) => panic!("{e}"),
                        };
                        ok += 1;
                        torn += u64::from(!is_pattern(&r));
                        if r.window != last {
                            changes += 1;
                            last = r.window;
                        }
                    }
                    (torn, changes, busy, ok)
                })
            })
            .collect();
        for t in threads {
            let (torn, changes, busy, ok) = t.join().unwrap();
            assert_eq!(torn, 0, "torn records seen");
            // The reads really overlapped with writes.
            assert!(changes > 100, "reader saw only {changes} distinct records");
            assert!(busy * 1000 < ok, "{busy} busy reads for {ok} good ones");
        }
    });
    assert!(written > 1000, "writer published only {written} records");
}

/// The ring under the same busy writer: every record a scan returns is
/// one the writer published (each pattern record is a function of its
/// anchor 5k), numbered consecutively, and `to_global` of a late stamp
/// gives the map of the newest record some scan saw.
#[test]
fn ring_scans_never_see_a_torn_record() {
    let path = scratch("pub", "ring-stress");
    let scans = stress_reads(!cfg!(debug_assertions)) / 500;
    with_busy_writer(&path, || {
        let reader = OffsetsReader::open(&path).unwrap();
        let (mut ok, mut busy, mut changes, mut last) = (0u64, 0u64, 0u64, 0i64);
        let since = std::time::Instant::now();
        // Until enough scans overlapped with writes (the writer thread may
        // get little CPU on a loaded machine), for at most 20 s.
        while ok < scans || (changes <= 10 && since.elapsed() < Duration::from_secs(20)) {
            let ring = match reader.ring() {
                Ok(r) => r,
                Err(PublishError::Busy) => {
                    busy += 1;
                    continue;
                }
                Err(e) => panic!("{e}"),
            };
            ok += 1;
            for w in ring.windows(2) {
                assert_eq!(w[0].0 + 1, w[1].0, "ring numbers not consecutive");
            }
            for (_, snap) in &ring {
                let k = (snap.node.anchor_local_ns / 5) as u64;
                assert_eq!(snap.node, pattern(k).node, "torn ring record");
            }
            let newest = ring.last().unwrap().1.node.anchor_local_ns;
            if newest != last {
                changes += 1;
                last = newest;
            }
            // A stamp every record covers: the newest record's map.
            let t = i64::MAX / 4;
            if let Ok((g, b)) = reader.to_global(LocalNs(t)) {
                let found = (0..4096u64).any(|d| {
                    let k = (newest / 5) as u64 + d;
                    pattern(k).node.to_global(LocalNs(t)) == (g, b)
                });
                assert!(found, "to_global gave a map no record has");
            }
        }
        assert!(changes > 10, "ring scans saw only {changes} changes");
        // A whole-ring scan is long next to this writer's 10 µs period
        // (the agent publishes every few seconds): some fail closed.
        assert!(busy < ok, "{busy} busy scans for {ok}");
    });
}

#[test]
fn c_reader_never_sees_a_torn_record() {
    let path = scratch("pub", "c-stress");
    let exe = compile_c_reader(path.parent().unwrap());
    let reads = stress_reads(true).to_string();
    let mut output = None;
    with_busy_writer(&path, || {
        output = Some(
            Command::new(&exe)
                .arg("stress")
                .arg(&path)
                .arg(&reads)
                .output()
                .unwrap(),
        );
    });
    let out = output.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "C reader failed: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("torn=0"), "{stdout}");
    let changes: u64 = stdout
        .split_whitespace()
        .find_map(|f| f.strip_prefix("changes="))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(
        changes > 100,
        "C reader saw only {changes} distinct records: {stdout}"
    );
}

fn c_code(exe: &Path, path: &Path) -> i32 {
    let out = Command::new(exe).arg("code").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|c| c.parse().ok())
        .unwrap()
}

fn fresh_record(offset_ns: i64) -> Record {
    let now = realtime_now_ns().0;
    Record {
        flags: flags::VALID,
        window: 1,
        updated_at_ns: now,
        valid_until_ns: now + 3_600_000_000_000,
        node: NodeMap {
            anchor_local_ns: now,
            offset_ns,
            drift_ps_per_s: 1_000_000, // 1 µs/s
            bound_ns: 50,
            bound_growth_ps_per_s: 1_000,
        },
        ..Record::default()
    }
}

#[test]
fn both_readers_fail_closed_and_agree_on_the_map() {
    let path = scratch("pub", "codes");
    let exe = compile_c_reader(path.parent().unwrap());

    // Missing.
    assert!(matches!(
        OffsetsReader::open(&path),
        Err(PublishError::Missing { .. })
    ));
    assert_eq!(c_code(&exe, &path), -1);

    // Created, nothing published yet.
    let writer = OffsetsWriter::open(&path).unwrap();
    let reader = OffsetsReader::open(&path).unwrap();
    assert!(matches!(
        reader.to_global(LocalNs(0)),
        Err(PublishError::NoData)
    ));
    assert_eq!(c_code(&exe, &path), -4);

    // Fresh data: both readers give the same answer.
    let rec = fresh_record(-1_234_567);
    writer.publish(&rec).unwrap();
    let local = rec.node.anchor_local_ns + 2_000_000_000;
    let (g, b) = reader.to_global(LocalNs(local)).unwrap();
    assert_eq!(g, GlobalNs(local - 1_234_567 + 2_000));
    assert_eq!(b, 52);
    let out = Command::new(&exe)
        .arg("map")
        .arg(&path)
        .arg(local.to_string())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{g} {b}")
    );
    assert_eq!(c_code(&exe, &path), 0);

    // Expired (by more than a tick: to_global checks freshness on the
    // coarse clock, which lags by up to one tick).
    let mut old = rec.clone();
    old.valid_until_ns = realtime_now_ns().0 - 50_000_000;
    writer.publish(&old).unwrap();
    assert!(matches!(
        reader.to_global(LocalNs(local)),
        Err(PublishError::Stale { .. })
    ));
    assert_eq!(c_code(&exe, &path), -5);

    // Flagged stale though still within valid_until.
    writer.publish(&rec).unwrap();
    writer.mark_stale();
    assert!(matches!(
        reader.to_global(LocalNs(local)),
        Err(PublishError::Stale { .. })
    ));
    assert_eq!(c_code(&exe, &path), -5);
    drop((reader, writer));

    // Unknown version (byte 8) and wrong magic (byte 0).
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8] = 3;
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        OffsetsReader::open(&path),
        Err(PublishError::BadVersion {
            found: 3,
            expected: 2
        })
    ));
    assert_eq!(c_code(&exe, &path), -3);
    bytes[0] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        OffsetsReader::open(&path),
        Err(PublishError::BadFormat(_))
    ));
    assert_eq!(c_code(&exe, &path), -2);
    std::fs::write(&path, b"short").unwrap();
    assert!(matches!(
        OffsetsReader::open(&path),
        Err(PublishError::BadFormat(_))
    ));
    assert_eq!(c_code(&exe, &path), -2);

    // A writer replaces a foreign file atomically with a valid empty one.
    let writer = OffsetsWriter::open(&path).unwrap();
    assert!(matches!(
        OffsetsReader::open(&path).unwrap().to_global(LocalNs(0)),
        Err(PublishError::NoData)
    ));
    // A second writer on the same file is refused.
    assert!(matches!(
        OffsetsWriter::open(&path),
        Err(PublishError::Locked)
    ));
    drop(writer);
}

/// Child-process body for `killed_writer_leaves_a_readable_stale_file`.
#[test]
#[ignore = "helper: runs only as the child of killed_writer_leaves_a_readable_stale_file"]
fn child_writer_publishes_then_idles_until_killed() {
    let Ok(path) = std::env::var("CLOCKMESH_CHILD_OFFSETS") else {
        return;
    };
    let writer = OffsetsWriter::open(&path).unwrap();
    for k in 1..=CHILD_WINDOWS {
        let mut r = fresh_record(-777);
        r.window = k;
        r.valid_until_ns = realtime_now_ns().0 + 300_000_000;
        writer.publish(&r).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    // Idle until killed: a kill in the middle of a write leaves the seqlock
    // odd, which readers answer `Busy` and a restarted writer drops (the
    // ring tests cover that); here the kill must find the record whole.
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// How many windows the child writer publishes before it idles.
const CHILD_WINDOWS: u64 = 20;

#[test]
fn killed_writer_leaves_a_readable_stale_file() {
    let path = scratch("pub", "killed");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "child_writer_publishes_then_idles_until_killed",
        ])
        .env("CLOCKMESH_CHILD_OFFSETS", &path)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let reader = loop {
        if let Ok(r) = OffsetsReader::open(&path)
            && r.read_record().is_ok_and(|r| r.window == CHILD_WINDOWS)
        {
            break r;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(
        reader.to_global(LocalNs(realtime_now_ns().0)).is_ok(),
        "fresh while the writer runs"
    );
    child.kill().unwrap(); // SIGKILL: no cleanup in the writer
    child.wait().unwrap();

    // Still readable, and the data expires on its own (fail closed).
    let last = reader.read_record().unwrap();
    assert_eq!(last.node.offset_ns, -777);
    std::thread::sleep(Duration::from_millis(350));
    assert!(matches!(
        reader.to_global(LocalNs(realtime_now_ns().0)),
        Err(PublishError::Stale { .. })
    ));

    // An agent restart keeps the record, flags it holdover, bumps the
    // epoch; with no holdover ceiling, an expired record stays stale.
    let writer = OffsetsWriter::open(&path).unwrap();
    let kept = reader.read_record().unwrap();
    assert_eq!(kept.window, last.window);
    assert_eq!(kept.node, last.node);
    assert_eq!(kept.flags, flags::VALID | flags::HOLDOVER);
    assert_eq!(kept.epoch, last.epoch + 1);
    assert!(matches!(
        reader.to_global(LocalNs(realtime_now_ns().0)),
        Err(PublishError::Stale { .. })
    ));
    // Fresh data clears it.
    let fresh = fresh_record(5);
    writer.publish(&fresh).unwrap();
    let anchor = fresh.node.anchor_local_ns;
    assert_eq!(
        reader.to_global(LocalNs(anchor)).unwrap(),
        (GlobalNs(anchor + 5), 50)
    );
}

/// `c_reader_check now PATH`: (status, epoch, earliest, latest).
fn c_now(exe: &Path, path: &Path) -> (i32, u64, i64, i64) {
    let out = Command::new(exe).arg("now").arg(path).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<&str> = text.split_whitespace().collect();
    (
        f[0].parse().unwrap(),
        f[1].parse().unwrap(),
        f[2].parse().unwrap(),
        f[3].parse().unwrap(),
    )
}

#[test]
fn now_is_an_interval_with_the_clock_state_in_both_readers() {
    use clockmesh_offsets::ClockStatus;
    let path = scratch("pub", "now");
    let exe = compile_c_reader(path.parent().unwrap());
    let writer = OffsetsWriter::open(&path).unwrap();
    let reader = OffsetsReader::open(&path).unwrap();
    // Nothing published yet: unknown, no interval.
    let n = reader.now().unwrap();
    assert_eq!(
        (n.status, n.earliest.0, n.latest.0),
        (ClockStatus::Unknown, i64::MIN, i64::MAX)
    );
    assert_eq!(c_now(&exe, &path), (0, n.epoch, i64::MIN, i64::MAX));

    let fresh = fresh_record(-5_000);
    let epoch = n.epoch; // the writer's restart counter, not the record's
    let node = fresh.node;
    let global = |t: i64| node.to_global(LocalNs(t)).0;
    let with = |flags: u32, valid_until_ns: i64| Record {
        flags,
        valid_until_ns,
        ..fresh.clone()
    };
    let later = fresh.valid_until_ns;
    let expired = realtime_now_ns().0 - 1;
    // Past its validity: holdover while the grown bound (50 ns + 1 ns/s)
    // is within the record's ceiling, stale above it, without one, or
    // with a bound that does not grow.
    let ceiling = |record: Record, holdover_max_bound_ns: u64| Record {
        holdover_max_bound_ns,
        ..record
    };
    let mut flat = ceiling(with(flags::VALID, expired), 1_000);
    flat.node.bound_growth_ps_per_s = 0;
    let states = [
        (with(flags::VALID, later), ClockStatus::Synchronised),
        (
            with(flags::VALID | flags::HOLDOVER, later),
            ClockStatus::Holdover,
        ),
        (with(flags::VALID | flags::STALE, later), ClockStatus::Stale),
        (with(flags::VALID, expired), ClockStatus::Stale),
        (
            ceiling(with(flags::VALID, expired), 1_000),
            ClockStatus::Holdover,
        ),
        (ceiling(with(flags::VALID, expired), 49), ClockStatus::Stale),
        (
            ceiling(with(flags::VALID | flags::STALE, expired), 1_000),
            ClockStatus::Stale,
        ),
        (flat, ClockStatus::Stale),
    ];
    for (record, status) in states {
        writer.publish(&record).unwrap();
        let before = realtime_now_ns().0;
        let n = reader.now().unwrap();
        let c = c_now(&exe, &path);
        let after = realtime_now_ns().0;
        assert_eq!((n.status, n.epoch), (status, epoch), "{status:?}");
        assert_eq!((c.0, c.1), (status as i32, epoch), "C: {status:?}");
        // The interval holds the global time of the read (between before
        // and after), and is 2 × the bound (50 ns + growth) wide.
        for (earliest, latest) in [(n.earliest.0, n.latest.0), (c.2, c.3)] {
            assert!(
                earliest <= global(after).0 && latest >= global(before).0,
                "{status:?}"
            );
            assert!(
                (100..=200).contains(&(latest - earliest)),
                "{}",
                latest - earliest
            );
        }
    }
}

/// A writer dropped and opened again at once gets the lock even while other
/// threads of the process spawn children (each child holds a copy of the
/// lock's file description until its `exec`): the race a restart test hit
/// in CI as a spurious `Locked`.
#[test]
fn a_reopened_writer_gets_the_lock_while_the_process_spawns_children() {
    let path = scratch("seqlock", "reopen-while-spawning");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spawner = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = std::process::Command::new("true").status();
            }
        })
    };
    let mut writer = OffsetsWriter::open(&path).unwrap();
    for _ in 0..300 {
        drop(writer);
        writer = OffsetsWriter::open(&path).expect("the dropped writer's lock is free");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    spawner.join().unwrap();
}
