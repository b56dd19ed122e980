//! Which planes of a host are in a device's clock, with their maps checked, before anything is placed.

use super::DevResult;
use super::spec::DeviceClockSpec;
use crate::plan::{DeviceError, DevicePlaneReport};
use crate::scan::{PlaneSummary, Scan};
use clockmesh_offsets::device_map::HOST_REALTIME;
use clockmesh_offsets::history::DeviceMapIndex;

/// Resolves which planes of one host are device-mapped and checks their
/// maps. `used[i]` is set for every spec that matched a plane.
pub fn resolve_planes(
    scan: &Scan,
    host: &str,
    specs: &[DeviceClockSpec],
    used: &mut [bool],
    maps: &DeviceMapIndex<'_>,
) -> DevResult<Vec<DevicePlaneReport>> {
    let path = scan.path.display().to_string();
    let mut out = Vec::new();
    for (index, plane) in scan.planes.iter().enumerate() {
        let spec = spec_for(host, &plane.name, specs, used)?;
        let Some(device) = device_of(&path, host, plane, spec)? else {
            continue;
        };
        let map_domain = check_maps(&path, host, plane, &device, maps)?;
        out.push(DevicePlaneReport {
            plane_index: index,
            plane: plane.name.clone(),
            device,
            declared_domain: plane.clock_domain.clone(),
            map_domain,
            lines_mapped: 0,
            events_mapped: 0,
            worst_bound_ns: 0,
            node_bound_known: true,
        });
    }
    Ok(out)
}

/// The spec naming this plane: host-specific before generic.
fn spec_for<'s>(
    host: &str,
    plane: &str,
    specs: &'s [DeviceClockSpec],
    used: &mut [bool],
) -> DevResult<Option<&'s DeviceClockSpec>> {
    let mut found: [Option<(usize, &DeviceClockSpec)>; 2] = [None, None];
    for (i, s) in specs.iter().enumerate() {
        if s.plane != plane || s.host.as_deref().is_some_and(|h| h != host) {
            continue;
        }
        let slot = &mut found[usize::from(s.host.is_none())];
        match slot {
            Some((_, first)) if first.device != s.device => {
                return Err(Box::new(DeviceError::Conflict {
                    host: host.into(),
                    plane: plane.into(),
                    first: first.to_string(),
                    second: s.to_string(),
                }));
            }
            Some(_) => used[i] = true,
            None => *slot = Some((i, s)),
        }
    }
    let chosen = found[0].or(found[1]);
    for (i, _) in found.iter().flatten() {
        used[*i] = true;
    }
    Ok(chosen.map(|(_, s)| s))
}

/// The device whose clock a plane is in, if any: the flag's, else the one
/// the plane declares (with a device `clock_domain`).
fn device_of(
    path: &str,
    host: &str,
    plane: &PlaneSummary,
    spec: Option<&DeviceClockSpec>,
) -> DevResult<Option<String>> {
    if let Some(s) = spec {
        return Ok(Some(s.device.clone()));
    }
    let realtime = HOST_REALTIME;
    match (plane.clock_domain.as_deref(), &plane.clock_device) {
        (None, Some(device)) => {
            tracing::warn!(
                plane = %plane.name,
                device,
                "plane has clock_device but no clock_domain; shifted by the node offset only"
            );
            Ok(None)
        }
        (None, None) => Ok(None),
        (Some(d), _) if d == realtime => Ok(None),
        (Some(_), Some(device)) => Ok(Some(device.clone())),
        (Some(domain), None) => Err(Box::new(DeviceError::NoDevice {
            path: path.into(),
            host: host.into(),
            plane: plane.name.clone(),
            domain: domain.into(),
        })),
    }
}

/// Checks a device's maps exist, target REALTIME and, when the plane
/// declares its domain, are in that domain; returns their device domain.
fn check_maps(
    path: &str,
    host: &str,
    plane: &PlaneSummary,
    device: &str,
    index: &DeviceMapIndex<'_>,
) -> DevResult<String> {
    let maps = index
        .maps(host, device)
        .ok_or_else(|| DeviceError::NoMaps {
            path: path.into(),
            plane: plane.name.clone(),
            host: host.into(),
            device: device.into(),
        })?;
    let realtime = HOST_REALTIME;
    for e in maps.entries() {
        if e.map.host_domain != realtime {
            return Err(Box::new(DeviceError::HostDomain {
                path: path.into(),
                host: host.into(),
                device: device.into(),
                host_domain: e.map.host_domain.clone(),
                realtime,
            }));
        }
        match plane.clock_domain.as_deref() {
            Some(declared) if declared != e.map.device_domain => {
                return Err(Box::new(DeviceError::DomainMismatch {
                    path: path.into(),
                    plane: plane.name.clone(),
                    host: host.into(),
                    device: device.into(),
                    declared: declared.into(),
                    published: e.map.device_domain.clone(),
                }));
            }
            _ => {}
        }
    }
    let first = maps.entries().first();
    Ok(first
        .map(|e| e.map.device_domain.clone())
        .unwrap_or_default())
}

/// Specs that matched no plane of any input are typos: refuse them.
pub fn check_specs_used(
    specs: &[DeviceClockSpec],
    used: &[bool],
    hosts: &[String],
) -> DevResult<()> {
    match specs.iter().zip(used).find(|(_, u)| !**u) {
        Some((s, _)) => Err(Box::new(DeviceError::Unused {
            spec: s.to_string(),
            hosts: match &s.host {
                Some(h) if !hosts.contains(h) => format!("the inputs (no host {h})"),
                Some(h) => format!("host {h}"),
                None => "any host".into(),
            },
        })),
        None => Ok(()),
    }
}
