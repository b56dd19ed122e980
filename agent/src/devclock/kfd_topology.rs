//! The KFD topology (`/sys/class/kfd/kfd/topology/nodes/*`): which nodes
//! are GPUs, their ids, DRM render minors and PCI location. Read by the
//! ROCm clock source (`rocm`) and the ROCm SMI identity lookup (`rocm_smi`).
use std::path::Path;

use super::DevClockError;

/// One GPU node of the KFD topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KfdNode {
    /// Node number (directory name).
    pub node: u32,
    pub gpu_id: u32,
    pub drm_render_minor: Option<u32>,
    pub vendor_id: Option<u32>,
    pub device_id: Option<u32>,
    /// PCI location (bus << 8 | device << 3 | function) and PCI domain.
    pub location_id: Option<u32>,
    pub domain: Option<u32>,
    pub unique_id: Option<u64>,
}

impl KfdNode {
    /// PCI bus id "dddd:bb:dd.f" where the topology has it.
    pub fn pci_bus_id(&self) -> Option<String> {
        let loc = self.location_id?;
        Some(format!(
            "{:04x}:{:02x}:{:02x}.{}",
            self.domain.unwrap_or(0),
            loc >> 8,
            (loc >> 3) & 0x1f,
            loc & 0x7
        ))
    }
}

fn topology_error(path: &Path, reason: impl Into<String>) -> DevClockError {
    DevClockError::Topology {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

fn parse_u64(text: &str) -> Option<u64> {
    let t = text.trim();
    match t.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => t.parse().ok(),
    }
}

/// Value of `key` in a KFD `properties` file ("key value" per line).
fn property(properties: &str, key: &str) -> Option<u64> {
    properties.lines().find_map(|line| {
        let (k, v) = line.split_once(char::is_whitespace)?;
        if k == key { parse_u64(v) } else { None }
    })
}

/// The GPU nodes under a KFD topology `nodes` directory, by node number.
/// A missing directory means no KFD (no AMD GPU driver): an empty list.
/// CPU nodes (`gpu_id` 0) are skipped.
pub fn parse_topology(nodes_dir: &Path) -> Result<Vec<KfdNode>, DevClockError> {
    let entries = match std::fs::read_dir(nodes_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(DevClockError::io(nodes_dir.display().to_string(), e)),
    };
    let mut nodes = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| DevClockError::io(nodes_dir.display().to_string(), e))?;
        let Some(node) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue; // not a node directory
        };
        if let Some(gpu) = parse_node(&entry.path(), node)? {
            nodes.push(gpu);
        }
    }
    nodes.sort_by_key(|n| n.node);
    Ok(nodes)
}

fn parse_node(dir: &Path, node: u32) -> Result<Option<KfdNode>, DevClockError> {
    let gpu_id_path = dir.join("gpu_id");
    let text = std::fs::read_to_string(&gpu_id_path)
        .map_err(|e| DevClockError::io(gpu_id_path.display().to_string(), e))?;
    let gpu_id = parse_u64(&text)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| topology_error(&gpu_id_path, format!("not a u32: {:?}", text.trim())))?;
    if gpu_id == 0 {
        return Ok(None);
    }
    // properties is informative; a node without it is still usable.
    let props = std::fs::read_to_string(dir.join("properties")).unwrap_or_default();
    let u32_prop = |k| property(&props, k).and_then(|v| u32::try_from(v).ok());
    Ok(Some(KfdNode {
        node,
        gpu_id,
        drm_render_minor: u32_prop("drm_render_minor"),
        vendor_id: u32_prop("vendor_id"),
        device_id: u32_prop("device_id"),
        location_id: u32_prop("location_id"),
        domain: u32_prop("domain"),
        unique_id: property(&props, "unique_id"),
    }))
}
