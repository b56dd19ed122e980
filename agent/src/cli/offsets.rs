//! `clockmesh offsets`: print the published offsets file as a reader (the
//! XLA hook, Python) sees it: node map, kernel clocks, GPU device maps, and
//! whether each is usable now.
use clockmesh_core::time::LocalNs;
use std::path::PathBuf;

use anyhow::Context as _;
use clockmesh::publish::{DeviceMap, OffsetsReader, Record, device_flags, flags};
use serde_json::json;

#[derive(clap::Args, Debug)]
pub struct OffsetsArgs {
    /// The offsets file (the agent's offsets_path).
    #[arg(
        long,
        value_name = "FILE",
        env = "CLOCKMESH_OFFSETS_PATH",
        default_value = "/run/clockmesh/offsets"
    )]
    path: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: OffsetsArgs) -> anyhow::Result<()> {
    check_path(&args.path)?;
    let reader = OffsetsReader::open(&args.path)
        .with_context(|| format!("opening {}", args.path.display()))?;
    let record = reader.read_record().context("reading the record")?;
    let now = clockmesh::devclock::host::realtime_ns()?;
    let fresh = reader.snapshot().and_then(|s| s.check_fresh(LocalNs(now)));
    if args.json {
        crate::outln!("{:#}", to_json(&record, fresh.as_ref().err(), now))?;
    } else {
        crate::out!("{}", render(&record, fresh.as_ref().err(), now))?;
    }
    Ok(())
}

/// Plain words for the two mistakes a user makes with `--path` (the
/// reader's own errors would say "No such device" for a directory).
fn check_path(path: &std::path::Path) -> anyhow::Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => anyhow::bail!(
            "{} is a directory; give the offsets file itself (the agent's offsets_path)",
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
            "no offsets file at {} (is the agent running, and is this its offsets_path?)",
            path.display()
        ),
        _ => Ok(()),
    }
}

fn device_usable(d: &DeviceMap, now: i64) -> &'static str {
    if d.flags & device_flags::VALID == 0 {
        "invalid"
    } else if now > d.valid_until_ns {
        "expired"
    } else {
        "ok"
    }
}

fn to_json(
    r: &Record,
    unusable: Option<&clockmesh::publish::PublishError>,
    now: i64,
) -> serde_json::Value {
    let devices: Vec<_> = r
        .devices
        .iter()
        .map(|d| {
            json!({
                "device_id": d.device_id, "kind": d.kind.as_str(),
                "device_anchor_ns": d.device_anchor_ns, "offset_ns": d.offset_ns,
                "drift_ps_per_s": d.drift_ps_per_s, "bound_ns": d.bound_ns,
                "valid_until_ns": d.valid_until_ns, "state": device_usable(d, now),
            })
        })
        .collect();
    json!({
        "usable": unusable.is_none(),
        "error": unusable.map(|e| e.to_string()),
        "flags": r.flags, "epoch": r.epoch, "window": r.window,
        "reference_id": r.reference_id, "updated_at_ns": r.updated_at_ns,
        "valid_until_ns": r.valid_until_ns,
        "node": {
            "anchor_local_ns": r.node.anchor_local_ns, "offset_ns": r.node.offset_ns,
            "drift_ps_per_s": r.node.drift_ps_per_s, "bound_ns": r.node.bound_ns,
            "bound_growth_ps_per_s": r.node.bound_growth_ps_per_s,
        },
        "clocks": {
            "realtime_minus_monotonic_ns": r.clocks.realtime_minus_monotonic_ns,
            "realtime_minus_boottime_ns": r.clocks.realtime_minus_boottime_ns,
        },
        "devices": devices,
    })
}

fn flag_names(f: u32) -> String {
    let names = [
        (flags::VALID, "valid"),
        (flags::STALE, "stale"),
        (flags::HOLDOVER, "holdover"),
        (flags::REFERENCE, "reference"),
    ];
    let set: Vec<&str> = names
        .iter()
        .filter(|(bit, _)| f & bit != 0)
        .map(|(_, n)| *n)
        .collect();
    if set.is_empty() {
        "none".into()
    } else {
        set.join(",")
    }
}

fn render(r: &Record, unusable: Option<&clockmesh::publish::PublishError>, now: i64) -> String {
    let age_s = |t: i64| (now - t) as f64 / 1e9;
    let mut out = format!(
        "Usable       : {}\nFlags        : {} (epoch {}, window {}, reference id {})\n",
        unusable.map_or("yes".into(), |e| format!("no: {e}")),
        flag_names(r.flags),
        r.epoch,
        r.window,
        r.reference_id
    );
    out += &format!(
        "Updated      : {:.1} s ago; valid for {:.1} s more\n",
        age_s(r.updated_at_ns),
        -age_s(r.valid_until_ns)
    );
    out += &format!(
        "Node map     : global − local = {:+} ns ± {} ns at the anchor ({:.1} s ago), drift {:+.3} ppb\n",
        r.node.offset_ns,
        r.node.bound_ns,
        age_s(r.node.anchor_local_ns),
        r.node.drift_ps_per_s as f64 / 1e3
    );
    for d in &r.devices {
        out += &format!(
            "GPU {:<2} {:<9}: host − device = {:+} ns ± {} ns, drift {:+.1} ppb, {} (valid {:+.1} s)\n",
            d.device_id,
            d.kind.as_str(),
            d.offset_ns,
            d.bound_ns,
            d.drift_ps_per_s as f64 / 1e3,
            device_usable(d, now),
            -age_s(d.valid_until_ns)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clockmesh::publish::DeviceKind;

    #[test]
    fn renders_node_and_device_maps_with_their_state() {
        let now = 1_000_000_000_000;
        let mut r = Record {
            flags: flags::VALID | flags::REFERENCE,
            valid_until_ns: now + 5_000_000_000,
            ..Default::default()
        };
        r.node.offset_ns = -42;
        r.devices.push(DeviceMap {
            device_id: 1,
            kind: DeviceKind::Cuda,
            flags: device_flags::VALID,
            offset_ns: 1234,
            drift_ps_per_s: 21_950_000,
            valid_until_ns: now - 1,
            ..Default::default()
        });
        let text = render(&r, None, now);
        assert!(text.contains("valid,reference"), "{text}");
        assert!(text.contains("-42 ns"), "{text}");
        assert!(
            text.contains("GPU 1  cuda") && text.contains("+21950.0 ppb, expired"),
            "{text}"
        );
        let j = to_json(&r, None, now);
        assert_eq!(j["devices"][0]["state"], "expired");
        assert_eq!(j["node"]["offset_ns"], -42);
        assert_eq!(flag_names(0), "none");
    }
}
