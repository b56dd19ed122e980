//! The pure-Python reader (python/clockmesh) reads what the Rust writer
//! wrote: same record, same `to_global`, same fail-closed errors.

use std::path::{Path, PathBuf};
use std::process::Command;

use clockmesh_offsets::LocalNs;
use clockmesh_offsets::{
    DeviceKind, DeviceMap, NodeMap, OffsetsReader, OffsetsWriter, Record, device_flags, flags,
    realtime_now_ns, sample_kernel_clocks,
};

fn python(script: &str, offsets: &Path) -> (bool, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(offsets)
        .env("PYTHONPATH", root.join("python"))
        .output()
        .expect("python3 runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text.trim().to_string())
}

const READ: &str = r#"
import sys, clockmesh
r = clockmesh.OffsetsReader(sys.argv[1])
s = r.read_snapshot()
g, b = r.to_global(s.anchor_local_ns + 3_000_000_000)
d = s.devices[1]
print(s.window, s.epoch, s.offset_ns, s.realtime_minus_boottime_ns, len(s.devices), d.device_id, d.kind, d.offset_ns, g, b)
"#;

const CODE: &str = r#"
import sys, time, clockmesh
try:
    clockmesh.OffsetsReader(sys.argv[1]).to_global(time.time_ns())
    print("ok")
except clockmesh.ClockmeshError as e:
    print(type(e).__name__, e.code)
"#;

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("clockmesh-py-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("offsets")
}

#[test]
fn python_reader_matches_rust() {
    let path = scratch();
    assert_eq!(python(CODE, &path), (true, "Missing -1".into()));
    let writer = OffsetsWriter::open(&path).unwrap();
    assert_eq!(python(CODE, &path), (true, "NoData -4".into()));

    let now = realtime_now_ns().0;
    let device = |id, off| DeviceMap {
        device_id: id,
        kind: DeviceKind::Rocm,
        flags: device_flags::VALID,
        device_anchor_ns: 1_000,
        offset_ns: off,
        drift_ps_per_s: -3,
        bound_ns: 40,
        valid_until_ns: now + 1_000_000_000,
    };
    let rec = Record {
        flags: flags::VALID,
        window: 42,
        valid_until_ns: now + 60_000_000_000,
        node: NodeMap {
            anchor_local_ns: now,
            offset_ns: -987_654_321,
            drift_ps_per_s: -1_500_000, // -1.5 µs/s: negative drift rounding
            bound_ns: 75,
            bound_growth_ps_per_s: 333,
        },
        clocks: sample_kernel_clocks(),
        devices: vec![device(0, 11), device(7, -22)],
        ..Record::default()
    };
    writer.publish(&rec).unwrap();
    let reader = OffsetsReader::open(&path).unwrap();
    let (g, b) = reader.to_global(LocalNs(now + 3_000_000_000)).unwrap();
    let kept = reader.read_record().unwrap();
    let expected = format!(
        "42 {} -987654321 {} 2 7 2 -22 {g} {b}",
        kept.epoch, rec.clocks.realtime_minus_boottime_ns
    );
    assert_eq!(python(READ, &path), (true, expected));

    writer.mark_stale();
    assert_eq!(python(CODE, &path), (true, "Stale -5".into()));
    drop(writer);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8] = 9;
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(python(CODE, &path), (true, "BadVersion -3".into()));
    std::fs::write(&path, b"x").unwrap();
    assert_eq!(python(CODE, &path), (true, "BadFormat -2".into()));
}
