//! Fuzzes the xplane wire scanner and the byte-preserving rewriter: any
//! input must scan without panicking; when it scans, shifting every line
//! must produce a file that scans to the same structure with every
//! timestamp moved by exactly the shift, and shifting back must restore
//! the input byte for byte when no varint changed length.
#![no_main]

use std::io::Write;

use clockmesh_trace::rewrite::{Edit, Plan, rewrite};
use clockmesh_trace::scan_file;
use clockmesh_trace::wire::WireReader;
use libfuzzer_sys::fuzz_target;

fn file_with(bytes: &[u8], name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("xplane-fuzz-{}-{name}", std::process::id()));
    std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
    p
}

fn shifted(path: &std::path::Path, shift: i64) -> Option<Vec<u8>> {
    let scan = scan_file(path).ok()?;
    let mut edits = Vec::new();
    for line in &scan.lines {
        let new = line.timestamp_ns.wrapping_add(shift);
        if line.ts_fields.is_empty() {
            edits.push(Edit::insert_varint_field(line.content_start, 3, new as u64));
        }
        for f in &line.ts_fields {
            edits.push(Edit::replace_varint(f.pos, f.len, new as u64));
        }
    }
    let plan = Plan::new(edits, Vec::new(), scan.frames());
    let mut r = WireReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut out = Vec::new();
    rewrite(&mut r, &plan, &mut out, &mut |_| {}).expect("a scanned file rewrites");
    assert_eq!(out.len() as u64, plan.output_len(scan.file_len));
    Some(out)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let shift = i64::from_le_bytes(data[..8].try_into().unwrap()) >> 20;
    let input = file_with(&data[8..], "in");
    let Ok(before) = scan_file(&input) else {
        return;
    };
    let out = shifted(&input, shift).unwrap();
    let output = file_with(&out, "out");
    let after = scan_file(&output).expect("the rewritten file scans");
    assert_eq!(before.planes.len(), after.planes.len());
    assert_eq!(before.events(), after.events());
    assert_eq!(before.lines.len(), after.lines.len());
    for (b, a) in before.lines.iter().zip(&after.lines) {
        assert_eq!(a.timestamp_ns, b.timestamp_ns.wrapping_add(shift));
    }
});
