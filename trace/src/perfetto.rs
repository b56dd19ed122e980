//! Merged Chrome/Perfetto JSON from already-merged `.xplane.pb` files: one
//! process per host+plane (pid = 1000 × (host index + 1) + plane index), one
//! thread per line, `X` events with µs timestamps relative to the global
//! origin. Streams events; keeps one plane's event names in memory.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::fields::{map_entry, xevent, xevent_metadata, xline, xplane, xspace};
use super::plan::MergeError;
use super::wire::{LEN, VARINT, WireReader};
use super::{FileError, TraceError};

/// Writes `json` atomically (temp + rename) from `(host, merged file)` pairs.
pub fn write_chrome_json(inputs: &[(String, PathBuf)], json: &Path) -> Result<(), MergeError> {
    let tmp = json.with_extension(format!("tmp-{}", std::process::id()));
    let out_err = |error| MergeError::Output {
        path: json.display().to_string(),
        error,
    };
    let result = (|| {
        let file = File::create(&tmp).map_err(out_err)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        w.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")
            .map_err(out_err)?;
        let mut first = true;
        for (host_idx, (host, path)) in inputs.iter().enumerate() {
            let ferr = |error| {
                MergeError::File(FileError {
                    path: path.display().to_string(),
                    error,
                })
            };
            write_host(&mut w, host_idx, host, path, &mut first).map_err(|e| match e {
                Failure::Trace(t) => ferr(t),
                Failure::Out(o) => out_err(o),
            })?;
        }
        w.write_all(b"\n]}\n").map_err(out_err)?;
        w.flush().map_err(out_err)
    })();
    match result {
        Ok(()) => std::fs::rename(&tmp, json).map_err(out_err),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

enum Failure {
    Trace(TraceError),
    Out(std::io::Error),
}

impl From<TraceError> for Failure {
    fn from(e: TraceError) -> Self {
        Self::Trace(e)
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Self::Out(e)
    }
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialize")
}

/// Writes `,\n` between array elements.
fn sep(w: &mut impl Write, first: &mut bool) -> std::io::Result<()> {
    if !std::mem::take(first) {
        w.write_all(b",\n")?;
    }
    Ok(())
}

/// Picoseconds as a decimal µs string (exact, no float rounding).
fn ps_to_us(ps: i128) -> String {
    let sign = if ps < 0 { "-" } else { "" };
    let a = ps.unsigned_abs();
    format!("{sign}{}.{:06}", a / 1_000_000, a % 1_000_000)
}

fn write_host(
    w: &mut impl Write,
    host_idx: usize,
    host: &str,
    path: &Path,
    first: &mut bool,
) -> Result<(), Failure> {
    let mut r = WireReader::new(File::open(path).map_err(TraceError::io)?)?;
    let end = r.file_len();
    let mut plane_idx = 0;
    while r.pos() < end {
        let (field, wire) = r.read_key()?;
        if (field, wire) != (xspace::PLANES, LEN) {
            r.skip_value(wire, end)?;
            continue;
        }
        let n = r.read_len(end)?;
        let pid = 1000 * (host_idx as u64 + 1) + plane_idx;
        plane_idx += 1;
        write_plane(w, &mut r, n, pid, host, first)?;
    }
    Ok(())
}

struct LineHead {
    id: i64,
    name: String,
    ts_ns: i64,
}

fn write_plane(
    w: &mut impl Write,
    r: &mut WireReader,
    n: u64,
    pid: u64,
    host: &str,
    first: &mut bool,
) -> Result<(), Failure> {
    let (start, end) = (r.pos(), r.pos() + n);
    // First walk: name and event names (map entries may follow the lines).
    let mut name = String::new();
    let mut names: HashMap<i64, String> = HashMap::new();
    let mut lines = Vec::new();
    while r.pos() < end {
        let (field, wire) = r.read_key()?;
        match (field, wire) {
            (xplane::NAME, LEN) => {
                let k = r.read_len(end)?;
                name = String::from_utf8_lossy(&r.read_bytes(k)?).into_owned();
            }
            (xplane::LINES, LEN) => {
                let k = r.read_len(end)?;
                lines.push((r.pos(), k));
                r.skip(k)?;
            }
            (xplane::EVENT_METADATA, LEN) => {
                let k = r.read_len(end)?;
                if let Some((id, n)) = read_event_metadata(r, k)? {
                    names.insert(id, n);
                }
            }
            _ => r.skip_value(wire, end)?,
        }
    }
    let _ = start;
    sep(w, first)?;
    write!(
        w,
        "{{\"ph\":\"M\",\"pid\":{pid},\"name\":\"process_name\",\"args\":{{\"name\":{}}}}},\n{{\"ph\":\"M\",\"pid\":{pid},\"name\":\"process_sort_index\",\"args\":{{\"sort_index\":{pid}}}}}",
        json_str(&format!("{host} {name}"))
    )?;
    for (ls, lk) in lines {
        r.seek_to(ls)?;
        let head = read_line_head(r, lk)?;
        sep(w, first)?;
        write!(
            w,
            "{{\"ph\":\"M\",\"pid\":{pid},\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":{}}}}}",
            head.id,
            json_str(&head.name)
        )?;
        r.seek_to(ls)?;
        write_events(w, r, lk, pid, &head, &names, first)?;
    }
    r.seek_to(end)?;
    Ok(())
}

fn read_event_metadata(r: &mut WireReader, k: u64) -> Result<Option<(i64, String)>, TraceError> {
    let end = r.pos() + k;
    let (mut key, mut name, mut display) = (None, None, None);
    while r.pos() < end {
        let (f, wire) = r.read_key()?;
        match (f, wire) {
            (map_entry::KEY, VARINT) => key = Some(r.read_varint()? as i64),
            (map_entry::VALUE, LEN) => {
                let m = r.read_len(end)?;
                let mend = r.pos() + m;
                while r.pos() < mend {
                    let (g, w2) = r.read_key()?;
                    match (g, w2) {
                        (xevent_metadata::NAME, LEN) | (xevent_metadata::DISPLAY_NAME, LEN) => {
                            let s = r.read_len(mend)?;
                            let v = String::from_utf8_lossy(&r.read_bytes(s)?).into_owned();
                            if g == xevent_metadata::NAME {
                                name = Some(v)
                            } else {
                                display = Some(v)
                            }
                        }
                        _ => r.skip_value(w2, mend)?,
                    }
                }
            }
            _ => r.skip_value(wire, end)?,
        }
    }
    Ok(key.zip(display.filter(|d| !d.is_empty()).or(name)))
}

fn read_line_head(r: &mut WireReader, k: u64) -> Result<LineHead, TraceError> {
    let end = r.pos() + k;
    let mut head = LineHead {
        id: 0,
        name: String::new(),
        ts_ns: 0,
    };
    let mut display = String::new();
    while r.pos() < end {
        let (f, wire) = r.read_key()?;
        match (f, wire) {
            (xline::ID, VARINT) => head.id = r.read_varint()? as i64,
            (xline::TIMESTAMP_NS, VARINT) => head.ts_ns = r.read_varint()? as i64,
            (xline::NAME, LEN) | (xline::DISPLAY_NAME, LEN) => {
                let s = r.read_len(end)?;
                let v = String::from_utf8_lossy(&r.read_bytes(s)?).into_owned();
                if f == xline::NAME {
                    head.name = v
                } else {
                    display = v
                }
            }
            _ => r.skip_value(wire, end)?,
        }
    }
    if !display.is_empty() {
        head.name = display;
    }
    Ok(head)
}

fn write_events(
    w: &mut impl Write,
    r: &mut WireReader,
    k: u64,
    pid: u64,
    head: &LineHead,
    names: &HashMap<i64, String>,
    first: &mut bool,
) -> Result<(), Failure> {
    let end = r.pos() + k;
    while r.pos() < end {
        let (f, wire) = r.read_key()?;
        if (f, wire) != (xline::EVENTS, LEN) {
            r.skip_value(wire, end)?;
            continue;
        }
        let m = r.read_len(end)?;
        let eend = r.pos() + m;
        let (mut meta, mut offset_ps, mut dur_ps, mut aggregated) = (0i64, 0i64, 0i64, false);
        while r.pos() < eend {
            let (g, w2) = r.read_key()?;
            match (g, w2) {
                (xevent::METADATA_ID, VARINT) => meta = r.read_varint()? as i64,
                (xevent::OFFSET_PS, VARINT) => offset_ps = r.read_varint()? as i64,
                (xevent::DURATION_PS, VARINT) => dur_ps = r.read_varint()? as i64,
                (xevent::NUM_OCCURRENCES, VARINT) => {
                    r.read_varint()?;
                    aggregated = true;
                }
                _ => r.skip_value(w2, eend)?,
            }
        }
        if aggregated {
            continue; // no timestamp (num_occurrences replaces offset_ps)
        }
        let ts_ps = i128::from(head.ts_ns) * 1000 + i128::from(offset_ps);
        let name = names
            .get(&meta)
            .map_or_else(|| format!("#{meta}"), |n| n.clone());
        sep(w, first)?;
        write!(
            w,
            "{{\"ph\":\"X\",\"pid\":{pid},\"tid\":{},\"ts\":{},\"dur\":{},\"name\":{}}}",
            head.id,
            ps_to_us(ts_ps),
            ps_to_us(i128::from(dur_ps)),
            json_str(&name)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ps_to_us;

    #[test]
    fn ps_to_us_is_exact() {
        assert_eq!(ps_to_us(1_234_567_891), "1234.567891");
        assert_eq!(ps_to_us(-5), "-0.000005");
        assert_eq!(ps_to_us(0), "0.000000");
    }
}
