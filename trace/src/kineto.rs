//! PyTorch profiler traces (Kineto's Chrome JSON, `*.pt.trace.json`), one
//! per rank, placed on the global timeline through each host's map like
//! xplane host planes: every event's start and end at its own time.
//!
//! Times are `ts` and `dur` in µs (fractions down to ns). Newer Kineto
//! writes `ts` relative to the top-level `baseTimeNanoseconds`; older
//! writes epoch µs. The output always carries `baseTimeNanoseconds` = the
//! merge's origin with every `ts` relative to it, so all ranks (and the
//! xprof hosts of the same merge) share one zero. Everything else in the
//! file is kept (keys, `args`, `distributedInfo`), and the host's offset,
//! bound and source are added under `"clockmesh"`.
//!
//! A trace is read whole (serde_json values, about 5× the file size in
//! memory); per-rank traces are tens to hundreds of MB.

use std::io::Write;
use std::path::{Path, PathBuf};

use clockmesh_offsets::{Anchor, HostMap};
use serde_json::{Map, Number, Value, json};

use super::TraceError;

/// The top-level key the clockmesh torch helper writes (and the merge
/// extends with what it did).
pub const CLOCKMESH_KEY: &str = "clockmesh";
/// Top-level key (Kineto): epoch ns that `ts` values are relative to.
pub const BASE_TIME_KEY: &str = "baseTimeNanoseconds";

/// Whether a file is taken as a Kineto trace (by name).
pub fn is_kineto_path(p: &Path) -> bool {
    let name = p.to_string_lossy();
    name.ends_with(".json") && !name.ends_with(".trace.json.gz")
}

/// One rank's trace, read whole.
#[derive(Debug)]
pub struct KinetoTrace {
    pub path: PathBuf,
    pub host: String,
    doc: Map<String, Value>,
    /// Epoch ns that the input's `ts` values are relative to (0: absolute).
    base_ns: i128,
    /// Earliest start and latest end of a timed event, local epoch ns.
    pub start_ns: i64,
    pub stop_ns: i64,
    pub events: u64,
}

fn malformed(what: &'static str) -> TraceError {
    TraceError::Malformed { at: 0, what }
}

impl KinetoTrace {
    /// Reads and checks a trace: a JSON object with a `traceEvents` array
    /// holding at least one timed event.
    pub fn load(path: &Path) -> Result<Self, TraceError> {
        let bytes = std::fs::read(path).map_err(TraceError::io)?;
        let doc: Value = serde_json::from_slice(&bytes).map_err(|e| {
            TraceError::NotXPlane(format!("not a PyTorch (Kineto) JSON trace: {e}"))
        })?;
        let Value::Object(doc) = doc else {
            return Err(malformed("a Kineto trace is a JSON object"));
        };
        let base_ns = match doc.get(BASE_TIME_KEY) {
            None => 0,
            Some(v) => v
                .as_i64()
                .map(i128::from)
                .or_else(|| v.as_u64().map(i128::from))
                .ok_or_else(|| malformed("baseTimeNanoseconds is not an integer"))?,
        };
        let events = doc
            .get("traceEvents")
            .and_then(Value::as_array)
            .ok_or_else(|| malformed("no traceEvents array"))?;
        let (mut start, mut stop, mut n) = (i128::MAX, i128::MIN, 0u64);
        for ev in events {
            let Some((ts, dur)) = event_times(ev)? else {
                continue;
            };
            let s = base_ns + us_to_ps(ts)? / 1000;
            start = start.min(s);
            stop = stop.max(s + us_to_ps(dur)? / 1000);
            n += 1;
        }
        if n == 0 {
            return Err(malformed("no timed events (ts) in traceEvents"));
        }
        let host = host_of(path, &doc);
        let ns = |v: i128| i64::try_from(v).map_err(|_| malformed("event time out of range"));
        Ok(Self {
            path: path.to_path_buf(),
            host,
            base_ns,
            start_ns: ns(start)?,
            stop_ns: ns(stop)?,
            events: n,
            doc,
        })
    }

    /// `distributedInfo.rank`, when the trace has one.
    pub fn rank(&self) -> Option<u64> {
        self.doc.get("distributedInfo")?.get("rank")?.as_u64()
    }

    /// The helper's records (start and stop) as a map, if it wrote any.
    pub fn hook_map(&self) -> Option<HostMap> {
        let records = self.doc.get(CLOCKMESH_KEY)?.get("records")?.as_array()?;
        let anchors = records
            .iter()
            .filter_map(|r| {
                Some(Anchor {
                    at_ns: r.get("at_ns")?.as_i64()?,
                    offset_ns: r.get("offset_ns")?.as_i64()?,
                    drift_ppb: r.get("drift_ppb").and_then(Value::as_f64).unwrap_or(0.0),
                    bound_ns: r.get("bound_ns")?.as_u64()?,
                    bound_growth_ppb: r
                        .get("bound_growth_ppb")
                        .and_then(Value::as_f64)
                        .unwrap_or(0.0),
                })
            })
            .collect();
        HostMap::new(anchors)
    }

    /// Places every timed event through `map` relative to `origin_ns`;
    /// returns the worst bound (ns). Nothing is written.
    pub fn place(&mut self, map: &HostMap, origin_ns: i64) -> Result<u64, TraceError> {
        let origin_ps = i128::from(origin_ns) * 1000;
        let base_ps = self.base_ns * 1000;
        let mut worst = 0;
        let events = self
            .doc
            .get_mut("traceEvents")
            .and_then(Value::as_array_mut)
            .ok_or_else(|| malformed("no traceEvents array"))?;
        for ev in events.iter_mut() {
            let Some((ts, dur)) = event_times(ev)? else {
                continue;
            };
            let start = base_ps + us_to_ps(ts)?;
            let end = start + us_to_ps(dur)?;
            let (a, b) = (map.to_global_ps(start), map.to_global_ps(end));
            worst = worst.max(a.bound_ns).max(b.bound_ns);
            let obj = ev
                .as_object_mut()
                .ok_or_else(|| malformed("event is not an object"))?;
            obj.insert("ts".into(), us_value(a.global_ps - origin_ps)?);
            if obj.contains_key("dur") {
                obj.insert("dur".into(), us_value(b.global_ps - a.global_ps)?);
            }
        }
        self.doc.insert(BASE_TIME_KEY.into(), json!(origin_ns));
        Ok(worst)
    }

    /// Records what the merge did under `"clockmesh"` (kept: the helper's
    /// records and status).
    pub fn note_placement(&mut self, source: &str, offset_ns: i64, bound_ns: Option<u64>) {
        let entry = self
            .doc
            .entry(CLOCKMESH_KEY)
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(m) = entry {
            m.insert("host".into(), json!(self.host));
            m.insert("merged_source".into(), json!(source));
            m.insert("merged_offset_ns".into(), json!(offset_ns));
            m.insert("alignment_bound_ns".into(), json!(bound_ns));
        }
    }

    /// Writes the trace to `path`: one value per line with `": "`
    /// separators, unindented (tools grep Kineto files as text: Holistic
    /// Trace Analysis finds the rank with `"rank":\s+(\d+)`).
    pub fn write(&self, path: &Path) -> std::io::Result<u64> {
        use serde::Serialize;
        let f = std::fs::File::create(path)?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        let fmt = serde_json::ser::PrettyFormatter::with_indent(b"");
        let mut ser = serde_json::Serializer::with_formatter(&mut w, fmt);
        self.doc.serialize(&mut ser)?;
        w.flush()?;
        Ok(w.get_ref().metadata()?.len())
    }
}

/// The host of a trace: the helper's `"clockmesh".host`, else Kineto's
/// `host_name`, else the file name before its first '.'
/// (`tensorboard_trace_handler` names files `<worker>.<time>.pt.trace.json`).
pub(crate) fn host_of(path: &Path, doc: &Map<String, Value>) -> String {
    let named = doc
        .get(CLOCKMESH_KEY)
        .and_then(|c| c.get("host"))
        .or_else(|| doc.get("host_name"))
        .and_then(Value::as_str)
        .filter(|h| !h.is_empty());
    if let Some(h) = named {
        return h.into();
    }
    file_host(path)
}

/// A Kineto trace's host when the trace names none: its file name before
/// the first '.' (`tensorboard_trace_handler` names files
/// `<worker>.<time>.pt.trace.json`). The merge and `trace collectives` both
/// use it, so one file is one host in both.
pub(crate) fn file_host(path: &Path) -> String {
    path.file_name()
        .map(|n| {
            n.to_string_lossy()
                .split('.')
                .next()
                .unwrap_or("")
                .to_string()
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into())
}

/// `(ts, dur)` in µs of an event with a time; `None` for metadata events
/// (`ph` "M") and events without `ts`.
fn event_times(ev: &Value) -> Result<Option<(f64, f64)>, TraceError> {
    if ev.get("ph").and_then(Value::as_str) == Some("M") {
        return Ok(None);
    }
    let Some(ts) = ev.get("ts") else {
        return Ok(None);
    };
    let ts = ts
        .as_f64()
        .ok_or_else(|| malformed("an event's ts is not a number"))?;
    let dur = match ev.get("dur") {
        None => 0.0,
        Some(d) => d
            .as_f64()
            .ok_or_else(|| malformed("an event's dur is not a number"))?,
    };
    Ok(Some((ts, dur)))
}

/// µs (f64, as written) → ps, rounded to whole ns: Kineto writes ns
/// resolution at most, and f64 noise must not become fake ps.
pub(crate) fn us_to_ps(us: f64) -> Result<i128, TraceError> {
    if !us.is_finite() || us.abs() > 9.0e15 {
        return Err(malformed("an event time is out of range"));
    }
    // Whole µs and the fraction apart: epoch µs times 1000 would lose the
    // ns digits in f64.
    let whole = us.trunc();
    let frac_ns = ((us - whole) * 1000.0).round();
    Ok((i128::from(whole as i64) * 1000 + i128::from(frac_ns as i64)) * 1000)
}

/// ps → a JSON number of µs with ns resolution (rounded).
fn us_value(ps: i128) -> Result<Value, TraceError> {
    let ns = i64::try_from((ps + 500).div_euclid(1000))
        .map_err(|_| malformed("a placed time is out of range"))?;
    let us = ns as f64 / 1000.0;
    Number::from_f64(us)
        .map(Value::Number)
        .ok_or_else(|| malformed("a placed time is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clockmesh_offsets::{LocalNs, Nanos};

    fn write(dir: &Path, name: &str, v: &Value) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, serde_json::to_vec(v).unwrap()).unwrap();
        p
    }

    #[test]
    fn relative_and_absolute_times_are_read_and_placed() {
        let dir = std::env::temp_dir().join(format!("cm-kineto-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let base: i64 = 1_795_000_000_000_000_000;
        let rel = json!({
            "baseTimeNanoseconds": base,
            "distributedInfo": {"rank": 1, "world_size": 2},
            "traceEvents": [
                {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "x"}},
                {"ph": "X", "name": "aten::mm", "ts": 10.5, "dur": 2.25, "args": {"External id": 7}},
                {"ph": "i", "name": "mark", "ts": 20.001, "s": "t"}
            ]
        });
        let mut t = KinetoTrace::load(&write(&dir, "a.1.pt.trace.json", &rel)).unwrap();
        assert_eq!((t.host.as_str(), t.rank(), t.events), ("a", Some(1), 2));
        assert_eq!(t.start_ns, base + 10_500);
        assert_eq!(t.stop_ns, base + 20_001);
        // 1 ms ahead, 1,000 ppm fast from the base: +10.5 ns at the start.
        let map = HostMap::new(vec![Anchor {
            at_ns: base,
            offset_ns: 1_000_000,
            drift_ppb: 1e6,
            bound_ns: 5,
            bound_growth_ppb: 0.0,
        }])
        .unwrap();
        let worst = t.place(&map, base).unwrap();
        assert_eq!(worst, 5);
        let ev = &t.doc["traceEvents"][1];
        assert_eq!(ev["ts"], json!(1_010.511)); // 10.5 µs + 1 ms + 10.5 ns
        assert_eq!(ev["dur"], json!(2.252)); // 2.25 µs grew by 2.25 ns
        assert_eq!(ev["args"]["External id"], json!(7));
        assert!(t.doc["traceEvents"][2].get("dur").is_none(), "no dur added");
        // Old Kineto: epoch µs, no base.
        let abs = json!({"traceEvents": [{"ph": "X", "ts": 1_795_000_000_000_000.5, "dur": 1}]});
        let t = KinetoTrace::load(&write(&dir, "b.json", &abs)).unwrap();
        assert_eq!(t.start_ns, 1_795_000_000_000_000_500);
        // Not a trace: clear errors.
        for bad in [
            json!([1]),
            json!({"traceEvents": []}),
            json!({"traceEvents": [{"ts": "x"}]}),
        ] {
            assert!(
                KinetoTrace::load(&write(&dir, "c.json", &bad)).is_err(),
                "{bad}"
            );
        }
        std::fs::write(dir.join("d.json"), b"{").unwrap();
        assert!(KinetoTrace::load(&dir.join("d.json")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_helpers_records_become_a_map_and_name_the_host() {
        let dir = std::env::temp_dir().join(format!("cm-kineto-h-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let v = json!({
            "clockmesh": {"host": "node-7", "status": "ok", "records": [
                {"at_ns": 100, "offset_ns": 5, "bound_ns": 3, "drift_ppb": 0.0, "bound_growth_ppb": 0.0},
                {"at_ns": 200, "offset_ns": 7, "bound_ns": 3}
            ]},
            "traceEvents": [{"ph": "X", "ts": 0.15, "dur": 0}]
        });
        let t = KinetoTrace::load(&write(&dir, "w.json", &v)).unwrap();
        assert_eq!(t.host, "node-7");
        let map = t.hook_map().unwrap();
        assert_eq!(map.offset_at(LocalNs(150)), Nanos(6));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
