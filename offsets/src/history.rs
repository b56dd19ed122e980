//! Per-window results as JSON lines (the agent's history), for offline use:
//! `clockmesh trace merge --history FILE` looks offsets up by host and time.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::device_map::PublishedDeviceMap;
use crate::{LocalNs, Nanos};

/// How a window's node offset is tied to the global timeline (the network
/// solve's anchor). The agent's wire records and JSONL carry its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AnchorKind {
    /// Solved against the reference in this window.
    Reference,
    /// The reference was absent; anchored at a substitute node.
    Substitute,
    /// Not connected to the anchor this window.
    Detached,
    /// A substitute placed on the reference timeline by the previous
    /// window's estimate (bound widened by drift × age).
    Holdover,
}

impl AnchorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reference => "reference",
            Self::Substitute => "substitute",
            Self::Detached => "detached",
            Self::Holdover => "holdover",
        }
    }

    /// The kind named `name` (as written by [`Self::as_str`]).
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Self::Reference,
            Self::Substitute,
            Self::Detached,
            Self::Holdover,
        ]
        .into_iter()
        .find(|k| k.as_str() == name)
    }
}

/// One node line of the history (`"type": "node"`): one node's map for one
/// estimator window. The agent writes it ([`NodeLine`]), `trace merge` and
/// the tests read it; the optional fields may be absent in older or
/// hand-written files.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// Hostname as it appears in trace file names / `XSpace.hostnames`.
    pub host: String,
    pub window: u64,
    /// Local CLOCK_REALTIME at which `offset_ns` holds.
    pub anchor_ns: i64,
    /// global − local at the anchor.
    pub offset_ns: i64,
    #[serde(default)]
    pub drift_ppb: f64,
    pub bound_ns: u64,
    /// Local CLOCK_REALTIME interval the window's fit covers.
    #[serde(default)]
    pub valid_from_ns: Option<i64>,
    #[serde(default)]
    pub valid_until_ns: Option<i64>,
    #[serde(default)]
    pub reference: Option<String>,
    /// The node's id in the probe graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<u32>,
    /// How fast the bound grows past the anchor, ppb.
    #[serde(default)]
    pub bound_growth_ppb: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor_kind: Option<AnchorKind>,
    /// The member whose clock the timeline is: the leader that started it,
    /// kept by every leader that continued it. A restarted agent reads it
    /// back from here, since the offsets file does not carry it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline_origin: Option<String>,
}

/// A node entry as the agent writes it: `{"type":"node", ...entry}`.
#[derive(Serialize)]
pub struct NodeLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    entry: &'a HistoryEntry,
}

impl<'a> NodeLine<'a> {
    pub fn new(entry: &'a HistoryEntry) -> Self {
        Self {
            kind: "node",
            entry,
        }
    }
}

impl HistoryEntry {
    /// The offset (global − local) at local time `t`, with drift.
    pub fn offset_at(&self, t: LocalNs) -> Nanos {
        // Wide and saturating: times come from files and must not panic.
        let age_s = (i128::from(t.0) - i128::from(self.anchor_ns)) as f64 / 1e9;
        Nanos(
            self.offset_ns
                .saturating_add((self.drift_ppb * age_s).round() as i64),
        )
    }

    /// [`Self::offset_at`] in picoseconds, unrounded to ns: for placing
    /// device events, whose durations must not jitter by whole ns.
    pub fn offset_at_ps(&self, t_ps: i128) -> i128 {
        let age_s = (t_ps - i128::from(self.anchor_ns) * 1000) as f64 / 1e12;
        (i128::from(self.offset_ns) * 1000)
            .saturating_add((self.drift_ppb * age_s * 1e3).round() as i128)
    }
}

/// One line of the history for one GPU's device-clock map (`"type":
/// "device"`), written by the agent once per window per device. The map is
/// [`PublishedDeviceMap`]: device time → this host's `host_domain` clock,
/// usable only inside its valid device-time range (fail closed outside).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceHistoryEntry {
    /// Always "device".
    #[serde(rename = "type")]
    pub kind: String,
    /// Hostname, as in node entries.
    pub host: String,
    /// Estimator window during which the map was written.
    pub window: u64,
    /// Host CLOCK_REALTIME when the line was written.
    pub written_at_ns: i64,
    #[serde(flatten)]
    pub map: PublishedDeviceMap,
}

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{path}:{line}: not a history entry: {error}")]
    Parse {
        path: String,
        line: usize,
        error: serde_json::Error,
    },
}

/// Appends one entry as a line (`O_APPEND`, one `write` per line).
pub fn append(path: &Path, entry: &HistoryEntry) -> Result<(), HistoryError> {
    append_line(path, entry)
}

fn append_line(path: &Path, record: &impl Serialize) -> Result<(), HistoryError> {
    let io = |error| HistoryError::Io {
        path: path.display().to_string(),
        error,
    };
    let mut line = serde_json::to_vec(record).map_err(|e| io(std::io::Error::other(e)))?;
    line.push(b'\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    f.write_all(&line).map_err(io)
}

/// The kind of a JSONL line: `"type"` absent or `"node"` is a node entry,
/// `"device"` a device map; anything else (`"edge"`, ...) is skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LineKind {
    Node,
    Device,
    Other,
}

fn line_kind(line: &str) -> LineKind {
    #[derive(Deserialize)]
    struct Typed {
        #[serde(rename = "type")]
        kind: Option<String>,
    }
    match serde_json::from_str::<Typed>(line) {
        Ok(t) => match t.kind.as_deref() {
            None | Some("node") => LineKind::Node,
            Some("device") => LineKind::Device,
            Some(_) => LineKind::Other,
        },
        Err(_) => LineKind::Node, // let the full parse report it
    }
}

/// Everything `trace merge` reads from a history file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    pub nodes: Vec<HistoryEntry>,
    pub devices: Vec<DeviceHistoryEntry>,
}

/// Reads all node entries; blank lines and other record types are skipped,
/// anything else must parse.
pub fn load(path: &Path) -> Result<Vec<HistoryEntry>, HistoryError> {
    load_all(path).map(|h| h.nodes)
}

/// Reads node and device entries in one pass; other record types and
/// blank lines are skipped, node and device lines must parse.
pub fn load_all(path: &Path) -> Result<History, HistoryError> {
    let io = |error| HistoryError::Io {
        path: path.display().to_string(),
        error,
    };
    let parse = |line: usize| {
        move |error| HistoryError::Parse {
            path: path.display().to_string(),
            line,
            error,
        }
    };
    let f = std::fs::File::open(path).map_err(io)?;
    let mut out = History::default();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        match line_kind(&line) {
            LineKind::Node => out
                .nodes
                .push(serde_json::from_str(&line).map_err(parse(i + 1))?),
            LineKind::Device => out
                .devices
                .push(serde_json::from_str(&line).map_err(parse(i + 1))?),
            LineKind::Other => {}
        }
    }
    Ok(out)
}

/// Appends one device-map line (`"type":"device"`), like [`append`].
pub fn append_device(path: &Path, entry: &DeviceHistoryEntry) -> Result<(), HistoryError> {
    append_line(path, entry)
}

/// The entry for `host` that best covers local time `t`: one whose
/// validity interval contains it, else the one with the nearest anchor
/// (ties: the later anchor). For many lookups use [`NodeIndex`].
pub fn lookup<'a>(entries: &'a [HistoryEntry], host: &str, t: LocalNs) -> Option<&'a HistoryEntry> {
    NodeIndex::new(entries).lookup(host, t)
}

/// Node entries by host, sorted by anchor, for repeated [`lookup`]s (one
/// per device event in `trace merge`).
#[derive(Debug, Default)]
pub struct NodeIndex<'a> {
    hosts: HashMap<&'a str, Sorted<&'a HistoryEntry>>,
}

impl<'a> NodeIndex<'a> {
    pub fn new(entries: &'a [HistoryEntry]) -> Self {
        let mut hosts: HashMap<&str, Vec<&HistoryEntry>> = HashMap::new();
        for e in entries {
            hosts.entry(e.host.as_str()).or_default().push(e);
        }
        let hosts = hosts
            .into_iter()
            .map(|(h, v)| (h, Sorted::new(v, node_anchor, node_reach)))
            .collect();
        Self { hosts }
    }

    /// Same choice as [`lookup`].
    pub fn lookup(&self, host: &str, t: LocalNs) -> Option<&'a HistoryEntry> {
        let t_ns = t.0;
        let s = self.hosts.get(host)?;
        let t = i128::from(t_ns);
        let covers = |e: &&HistoryEntry| {
            e.valid_from_ns.is_none_or(|f| f <= t_ns) && e.valid_until_ns.is_some_and(|u| t_ns <= u)
        };
        s.nearest(t, node_anchor, s.reach, covers)
            .or_else(|| s.nearest(t, node_anchor, i128::MAX, |_| true))
            .copied()
    }
}

fn node_anchor(e: &&HistoryEntry) -> i128 {
    i128::from(e.anchor_ns)
}

/// How far from its anchor an entry can cover (entries without an end cover nothing).
fn node_reach(e: &&HistoryEntry) -> i128 {
    let Some(until) = e.valid_until_ns else {
        return 0;
    };
    let anchor = i128::from(e.anchor_ns);
    let from = e.valid_from_ns.map_or(i128::from(i64::MIN), i128::from);
    (i128::from(until) - anchor).max(anchor - from)
}

/// Device maps by host and device, sorted by anchor.
#[derive(Debug, Default)]
pub struct DeviceMapIndex<'a> {
    hosts: HashMap<&'a str, HashMap<&'a str, DeviceMaps<'a>>>,
}

/// The maps of one host's device.
#[derive(Debug)]
pub struct DeviceMaps<'a> {
    sorted: Sorted<&'a DeviceHistoryEntry>,
}

impl<'a> DeviceMapIndex<'a> {
    pub fn new(entries: &'a [DeviceHistoryEntry]) -> Self {
        let mut raw: HashMap<&str, HashMap<&str, Vec<&DeviceHistoryEntry>>> = HashMap::new();
        for e in entries {
            raw.entry(e.host.as_str())
                .or_default()
                .entry(e.map.device.as_str())
                .or_default()
                .push(e);
        }
        let hosts = raw
            .into_iter()
            .map(|(h, devices)| {
                let devices = devices
                    .into_iter()
                    .map(|(d, v)| {
                        let sorted = Sorted::new(v, device_anchor, device_reach);
                        (d, DeviceMaps { sorted })
                    })
                    .collect();
                (h, devices)
            })
            .collect();
        Self { hosts }
    }

    /// The maps published for `device` on `host`, if any.
    pub fn maps(&self, host: &str, device: &str) -> Option<&DeviceMaps<'a>> {
        self.hosts.get(host)?.get(device)
    }
}

impl<'a> DeviceMaps<'a> {
    /// All maps, by anchor.
    pub fn entries(&self) -> &[&'a DeviceHistoryEntry] {
        &self.sorted.items
    }

    /// The map whose valid range contains `device_ns` with the nearest
    /// anchor (ties: the later anchor); `None` if no map covers it.
    pub fn lookup(&self, device_ns: u64) -> Option<&'a DeviceHistoryEntry> {
        let covers = |e: &&DeviceHistoryEntry| {
            e.map.valid_from_device_ns <= device_ns && device_ns <= e.map.valid_until_device_ns
        };
        let t = i128::from(device_ns);
        self.sorted
            .nearest(t, device_anchor, self.sorted.reach, covers)
            .copied()
    }
}

fn device_anchor(e: &&DeviceHistoryEntry) -> i128 {
    i128::from(e.map.anchor_device_ns)
}

fn device_reach(e: &&DeviceHistoryEntry) -> i128 {
    let anchor = i128::from(e.map.anchor_device_ns);
    (i128::from(e.map.valid_until_device_ns) - anchor)
        .max(anchor - i128::from(e.map.valid_from_device_ns))
}

/// Items sorted by anchor, with the furthest any item covers from its anchor.
#[derive(Debug)]
struct Sorted<T> {
    items: Vec<T>,
    reach: i128,
}

impl<T> Default for Sorted<T> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            reach: 0,
        }
    }
}

impl<T> Sorted<T> {
    fn new(mut items: Vec<T>, anchor: fn(&T) -> i128, reach: fn(&T) -> i128) -> Self {
        items.sort_by_key(anchor);
        let reach = items.iter().map(reach).max().unwrap_or(0);
        Self { items, reach }
    }

    /// The item nearest `t` by anchor (ties: the later anchor) that
    /// `covers` accepts, looking at most `reach` away: items are visited
    /// outwards from `t`, so the first accepted one is the nearest.
    fn nearest(
        &self,
        t: i128,
        anchor: fn(&T) -> i128,
        reach: i128,
        covers: impl Fn(&T) -> bool,
    ) -> Option<&T> {
        let split = self.items.partition_point(|x| anchor(x) < t);
        let (mut left, mut right) = (split, split);
        loop {
            let dl = (left > 0).then(|| t - anchor(&self.items[left - 1]));
            let dr = self.items.get(right).map(|x| anchor(x) - t);
            let (item, dist) = match (dl, dr) {
                (Some(l), Some(r)) if l < r => {
                    left -= 1;
                    (&self.items[left], l)
                }
                (_, Some(r)) => {
                    right += 1;
                    (&self.items[right - 1], r)
                }
                (Some(l), None) => {
                    left -= 1;
                    (&self.items[left], l)
                }
                (None, None) => return None,
            };
            if dist > reach {
                return None;
            }
            if covers(item) {
                return Some(item);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(host: &str, anchor: i64, off: i64, until: Option<i64>) -> HistoryEntry {
        HistoryEntry {
            host: host.into(),
            window: 1,
            anchor_ns: anchor,
            offset_ns: off,
            drift_ppb: 0.0,
            bound_ns: 10,
            valid_from_ns: None,
            valid_until_ns: until,
            reference: None,
            ..HistoryEntry::default()
        }
    }

    #[test]
    fn append_load_and_lookup() {
        let dir = std::env::temp_dir().join(format!("cm-hist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("h.jsonl");
        let _ = std::fs::remove_file(&p);
        append(&p, &entry("a", 100, 5, Some(200))).unwrap();
        append(&p, &entry("a", 300, 7, Some(400))).unwrap();
        append(&p, &entry("b", 100, 9, None)).unwrap();
        let all = load(&p).unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(lookup(&all, "a", LocalNs(150)).unwrap().offset_ns, 5);
        assert_eq!(lookup(&all, "a", LocalNs(350)).unwrap().offset_ns, 7);
        assert_eq!(
            lookup(&all, "a", LocalNs(260)).unwrap().offset_ns,
            7,
            "nearest anchor"
        );
        assert_eq!(lookup(&all, "b", LocalNs(0)).unwrap().offset_ns, 9);
        assert!(lookup(&all, "c", LocalNs(0)).is_none());
        // The agent's edge lines are skipped, its node lines read.
        std::fs::write(&p, "{\"type\":\"edge\",\"from\":\"a\"}\n{\"type\":\"node\",\"host\":\"a\",\"window\":1,\"anchor_ns\":1,\"offset_ns\":2,\"bound_ns\":3}\n").unwrap();
        assert_eq!(load(&p).unwrap().len(), 1);
        std::fs::write(&p, "{\"host\":1}\n").unwrap();
        let err = load(&p).unwrap_err().to_string();
        assert!(err.contains(":1:"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn device(anchor: u64, from: u64, until: u64) -> DeviceHistoryEntry {
        DeviceHistoryEntry {
            kind: "device".into(),
            host: "a".into(),
            window: anchor,
            written_at_ns: 0,
            map: PublishedDeviceMap {
                device: "nvidia:0".into(),
                device_domain: "cuda-globaltimer".into(),
                source: "cuda-pingpong".into(),
                host_domain: "CLOCK_REALTIME".into(),
                anchor_device_ns: anchor,
                offset_at_anchor_ns: anchor as i64,
                drift_ppb: 0.0,
                bound_ns: 1,
                residual_rms_ns: 0.0,
                points: 1,
                valid_from_device_ns: from,
                valid_until_device_ns: until,
            },
        }
    }

    #[test]
    fn device_lookup_takes_the_nearest_covering_anchor() {
        // Overlapping maps like the agent's (anchor every 4, 30 back, 2 ahead),
        // one wide map far away, and one narrow map whose anchor is nearest
        // to 101 but which does not cover it.
        let mut entries: Vec<_> = (0..10)
            .map(|i| device(100 + 4 * i, 70 + 4 * i, 102 + 4 * i))
            .collect();
        entries.push(device(1_000, 0, 2_000));
        entries.push(device(101, 101 + 5, 200));
        entries.reverse(); // file order must not matter
        let index = DeviceMapIndex::new(&entries);
        let maps = index.maps("a", "nvidia:0").unwrap();
        let anchor = |d| maps.lookup(d).map(|e| e.map.anchor_device_ns);
        assert_eq!(
            anchor(101),
            Some(100),
            "the nearer anchor 101 does not cover"
        );
        assert_eq!(anchor(103), Some(104));
        assert_eq!(anchor(102), Some(104), "tie between 100 and 104: the later");
        assert_eq!(anchor(60), Some(1_000), "only the wide map covers");
        assert_eq!(anchor(2_001), None, "fail closed past every map");
        assert!(index.maps("a", "nvidia:1").is_none());
        assert!(index.maps("b", "nvidia:0").is_none());
    }

    #[test]
    fn node_index_matches_a_linear_search() {
        let mut entries = Vec::new();
        for i in 0..40i64 {
            let mut e = entry(if i % 3 == 0 { "b" } else { "a" }, i * 37 % 500, i, None);
            e.valid_from_ns = (i % 4 != 0).then_some(e.anchor_ns - 20);
            e.valid_until_ns = (i % 5 != 0).then_some(e.anchor_ns + 3);
            entries.push(e);
        }
        let index = NodeIndex::new(&entries);
        for t in -50..560 {
            for host in ["a", "b", "c"] {
                let mine = || entries.iter().filter(|e| e.host == host);
                let covers = |e: &&HistoryEntry| {
                    e.valid_from_ns.is_none_or(|f| f <= t)
                        && e.valid_until_ns.is_some_and(|u| t <= u)
                };
                let dist = |e: &HistoryEntry| (t - e.anchor_ns).unsigned_abs();
                let best = mine()
                    .filter(covers)
                    .map(dist)
                    .min()
                    .or_else(|| mine().map(dist).min());
                assert_eq!(
                    index.lookup(host, LocalNs(t)).map(dist),
                    best,
                    "{host} at {t}"
                );
            }
        }
    }

    #[test]
    fn load_all_reads_node_and_device_lines() {
        let dir = std::env::temp_dir().join(format!("cm-hist-all-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("h.jsonl");
        let _ = std::fs::remove_file(&p);
        append(&p, &entry("a", 1, 2, None)).unwrap();
        append_device(&p, &device(5, 0, 9)).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains("\"type\":\"device\""), "{text}");
        let h = load_all(&p).unwrap();
        assert_eq!((h.nodes.len(), h.devices.len()), (1, 1));
        assert_eq!(h.devices[0], device(5, 0, 9));
        assert_eq!(load(&p).unwrap().len(), 1, "load keeps to node lines");
        std::fs::write(&p, "{\"type\":\"device\",\"host\":\"a\"}\n").unwrap();
        assert!(load_all(&p).unwrap_err().to_string().contains(":1:"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn offsets_in_ps_agree_with_ns_and_never_panic() {
        let mut e = entry("a", 1_000, 100, None);
        e.drift_ppb = 1000.0;
        assert_eq!(e.offset_at_ps(2_000_001_000 * 1000), 2_100 * 1000);
        // 1 µs after the anchor at 1 ppm: 1 ps, which offset_at rounds away.
        assert_eq!(e.offset_at_ps(1_000 * 1000 + 1_000_000), 100_000 + 1);
        e.drift_ppb = f64::INFINITY;
        let _ = (
            e.offset_at(LocalNs(i64::MIN)),
            e.offset_at_ps(i128::MAX / 2),
        );
    }

    #[test]
    fn drift_moves_offset_with_time() {
        let mut e = entry("a", 0, 100, None);
        e.drift_ppb = 1000.0; // 1 µs per s
        assert_eq!(e.offset_at(LocalNs(2_000_000_000)), Nanos(2100));
    }
}
