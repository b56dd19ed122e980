//! AMD GPU identity through ROCm SMI (`rocm_smi_lib`): cargo feature `rocm-smi`.
//!
//! Identity and metadata only (device name, PCI bus id, unique id), used to
//! name a KFD clock source. The clock itself never goes through ROCm SMI; see
//! [`super::rocm`]. `rocm_smi_lib_sys` links `librocm_smi64` and runs bindgen
//! at build time, which is why this is a non-default feature: the default
//! build needs no ROCm.
//!
//! KFD topology nodes and ROCm SMI device indices are not in the same order,
//! so they are matched by PCI bus id ([`rsmi_index_for_kfd_node`]), with the
//! unique id as a cross-check where both sides report one.
//!
//! We call the raw functions that `rocm_smi_lib` re-exports, not its
//! `RocmSmi` wrapper: the wrapper ignores the status of `rsmi_init` (on a node
//! without an AMD GPU it hands back a session with 0 devices) and frees its
//! `malloc`ed string buffers through `CString`. Only functions with the same
//! prototypes in ROCm 5.2 (Debian bookworm's `librocm-smi`) and in the crate's
//! bundled (ROCm 6) header are called: `rsmi_init`, `rsmi_shut_down`,
//! `rsmi_num_monitor_devices`, `rsmi_dev_name_get`, `rsmi_dev_pci_id_get`,
//! `rsmi_dev_unique_id_get` and `rsmi_status_string`.
use std::ffi::{CStr, c_char};
use std::fmt;

use rocm_smi_lib::{
    rsmi_dev_name_get, rsmi_dev_pci_id_get, rsmi_dev_unique_id_get, rsmi_init,
    rsmi_num_monitor_devices, rsmi_shut_down, rsmi_status_string, rsmi_status_t,
    rsmi_status_t_RSMI_STATUS_NOT_SUPPORTED as RSMI_STATUS_NOT_SUPPORTED,
    rsmi_status_t_RSMI_STATUS_SUCCESS as RSMI_STATUS_SUCCESS,
};

use super::DevClockError;
use super::kfd_topology::KfdNode;

/// Errors of ROCm SMI identity lookups.
#[derive(Debug, thiserror::Error)]
pub enum RocmSmiError {
    /// `rsmi_init` failed (no amdgpu driver, no `/sys/class/drm`) or ROCm SMI
    /// sees no AMD GPU: not a fault, the node has no such device.
    #[error("ROCm SMI unavailable: {0}")]
    Unavailable(String),
    #[error("ROCm SMI device {index} not found ({available} available)")]
    NoSuchDevice { index: u32, available: u32 },
    #[error("{call} on ROCm SMI device {index} failed: {text} (status {status})")]
    Call {
        call: &'static str,
        index: u32,
        status: u32,
        text: String,
    },
    #[error("KFD node {0} has no PCI location (location_id) in its properties")]
    NoPciLocation(u32),
    #[error("no ROCm SMI device has PCI bus id {0}")]
    NoMatch(String),
    #[error("{count} ROCm SMI devices have PCI bus id {bus_id}")]
    Ambiguous { bus_id: String, count: usize },
    #[error(
        "PCI bus id {bus_id} matches ROCm SMI device {index}, but unique ids differ \
         (KFD {kfd:#x}, ROCm SMI {rsmi:#x})"
    )]
    UniqueIdMismatch {
        bus_id: String,
        index: u32,
        kfd: u64,
        rsmi: u64,
    },
}

impl RocmSmiError {
    /// True when ROCm SMI or an AMD GPU is simply not present on this node.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, RocmSmiError::Unavailable(_))
    }
}

impl From<RocmSmiError> for DevClockError {
    fn from(e: RocmSmiError) -> Self {
        match e {
            RocmSmiError::Unavailable(_) => DevClockError::Unavailable(e.to_string()),
            RocmSmiError::NoSuchDevice { index, available } => DevClockError::NoSuchDevice {
                index,
                available: available as usize,
            },
            other => DevClockError::io("ROCm SMI identity", std::io::Error::other(other)),
        }
    }
}

/// A PCI address: domain, bus, device, function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PciBusId {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl PciBusId {
    /// From the BDFID of `rsmi_dev_pci_id_get`: domain in bits 63..32, bus
    /// in 15..8, device in 7..3, function in 2..0. Bits 31..16 are reserved
    /// in ROCm 5 and hold the partition id (31..28) in ROCm 6: ignored.
    pub fn from_rsmi_bdfid(bdfid: u64) -> Self {
        PciBusId {
            domain: (bdfid >> 32) as u32,
            bus: ((bdfid >> 8) & 0xff) as u8,
            device: ((bdfid >> 3) & 0x1f) as u8,
            function: (bdfid & 0x7) as u8,
        }
    }

    /// From a KFD topology node's `location_id` (bus << 8 | device << 3 |
    /// function) and `domain`.
    pub fn from_kfd(location_id: u32, domain: u32) -> Self {
        PciBusId {
            domain,
            bus: ((location_id >> 8) & 0xff) as u8,
            device: ((location_id >> 3) & 0x1f) as u8,
            function: (location_id & 0x7) as u8,
        }
    }

    fn same_bus_device_function(&self, other: &PciBusId) -> bool {
        (self.bus, self.device, self.function) == (other.bus, other.device, other.function)
    }
}

impl fmt::Display for PciBusId {
    /// "dddd:bb:dd.f", as `lspci -D` and [`KfdNode::pci_bus_id`] write it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// What ROCm SMI says about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RsmiIdentity {
    /// ROCm SMI device index (`dv_ind`).
    pub index: u32,
    /// Marketing or PCI-database name; `None` where not supported.
    pub name: Option<String>,
    pub pci_bus_id: PciBusId,
    /// `None` where the GPU does not report one (many consumer parts).
    pub unique_id: Option<u64>,
}

/// The ROCm SMI device index for a KFD topology node, matched by PCI bus id.
///
/// A node without a `domain` property (older kernels) is matched on bus,
/// device and function alone, and only if exactly one device fits. Where both
/// sides report a non-zero unique id, they must agree.
pub fn rsmi_index_for_kfd_node(
    node: &KfdNode,
    devices: &[RsmiIdentity],
) -> Result<u32, RocmSmiError> {
    match_kfd_node(node, devices).map(|d| d.index)
}

fn match_kfd_node<'a>(
    node: &KfdNode,
    devices: &'a [RsmiIdentity],
) -> Result<&'a RsmiIdentity, RocmSmiError> {
    let location = node
        .location_id
        .ok_or(RocmSmiError::NoPciLocation(node.node))?;
    let want = PciBusId::from_kfd(location, node.domain.unwrap_or(0));
    let matches: Vec<&RsmiIdentity> = devices
        .iter()
        .filter(|d| match node.domain {
            Some(_) => d.pci_bus_id == want,
            None => d.pci_bus_id.same_bus_device_function(&want),
        })
        .collect();
    let device = match matches.as_slice() {
        [one] => *one,
        [] => return Err(RocmSmiError::NoMatch(want.to_string())),
        many => {
            return Err(RocmSmiError::Ambiguous {
                bus_id: want.to_string(),
                count: many.len(),
            });
        }
    };
    if let (Some(kfd), Some(rsmi)) = (node.unique_id, device.unique_id)
        && kfd != 0
        && rsmi != 0
        && kfd != rsmi
    {
        return Err(RocmSmiError::UniqueIdMismatch {
            bus_id: want.to_string(),
            index: device.index,
            kfd,
            rsmi,
        });
    }
    Ok(device)
}

/// Each KFD node's ROCm SMI index (or why there is none), in node order.
pub fn map_kfd_nodes(
    nodes: &[KfdNode],
    devices: &[RsmiIdentity],
) -> Vec<(u32, Result<u32, RocmSmiError>)> {
    nodes
        .iter()
        .map(|n| (n.node, rsmi_index_for_kfd_node(n, devices)))
        .collect()
}

/// An initialised ROCm SMI library; shut down on drop. `rsmi_init` is
/// reference counted by the library, so sessions may overlap.
#[derive(Debug)]
pub struct RocmSmi {
    _initialised: (),
}

impl RocmSmi {
    /// `rsmi_init(0)` (AMD devices only). Fails with
    /// [`RocmSmiError::Unavailable`] where the library cannot start, e.g. on
    /// a node without the amdgpu driver. The library itself prints to stderr
    /// when that happens.
    pub fn init() -> Result<Self, RocmSmiError> {
        let status = ffi_init();
        if status != RSMI_STATUS_SUCCESS {
            return Err(RocmSmiError::Unavailable(format!(
                "rsmi_init failed: {} (status {status}); no AMD GPU driver on this node?",
                status_text(status)
            )));
        }
        Ok(RocmSmi { _initialised: () })
    }

    /// Number of AMD GPUs ROCm SMI sees.
    pub fn device_count(&self) -> Result<u32, RocmSmiError> {
        let mut count = 0u32;
        let status = ffi_num_monitor_devices(&mut count);
        if status != RSMI_STATUS_SUCCESS {
            return Err(RocmSmiError::Unavailable(format!(
                "rsmi_num_monitor_devices failed: {} (status {status})",
                status_text(status)
            )));
        }
        Ok(count)
    }

    /// Name, PCI bus id and unique id of device `index`. The PCI bus id is
    /// required; name and unique id are `None` where the library has none.
    pub fn identity(&self, index: u32) -> Result<RsmiIdentity, RocmSmiError> {
        let available = self.device_count()?;
        if index >= available {
            return Err(RocmSmiError::NoSuchDevice { index, available });
        }
        self.identity_unchecked(index)
    }

    /// Every device ROCm SMI sees; [`RocmSmiError::Unavailable`] when none.
    pub fn identities(&self) -> Result<Vec<RsmiIdentity>, RocmSmiError> {
        let count = self.device_count()?;
        if count == 0 {
            return Err(RocmSmiError::Unavailable(
                "no AMD GPU: ROCm SMI reports 0 devices".into(),
            ));
        }
        (0..count).map(|i| self.identity_unchecked(i)).collect()
    }

    fn identity_unchecked(&self, index: u32) -> Result<RsmiIdentity, RocmSmiError> {
        let call_error = |call, status| RocmSmiError::Call {
            call,
            index,
            status,
            text: status_text(status),
        };
        let mut bdfid = 0u64;
        let status = ffi_dev_pci_id(index, &mut bdfid);
        if status != RSMI_STATUS_SUCCESS {
            return Err(call_error("rsmi_dev_pci_id_get", status));
        }
        let mut name_buf = [0u8; 256];
        // A device without a name is still identified by its PCI bus id.
        let name = match ffi_dev_name(index, &mut name_buf) {
            RSMI_STATUS_SUCCESS => Some(c_buffer_to_string(&name_buf)).filter(|n| !n.is_empty()),
            RSMI_STATUS_NOT_SUPPORTED => None,
            status => {
                tracing::debug!(index, "{}", call_error("rsmi_dev_name_get", status));
                None
            }
        };
        let mut unique_id = 0u64;
        let unique_id = match ffi_dev_unique_id(index, &mut unique_id) {
            RSMI_STATUS_SUCCESS => Some(unique_id),
            // Not supported on many GPUs; not fatal for identity.
            _ => None,
        };
        Ok(RsmiIdentity {
            index,
            name,
            pci_bus_id: PciBusId::from_rsmi_bdfid(bdfid),
            unique_id,
        })
    }
}

impl Drop for RocmSmi {
    fn drop(&mut self) {
        ffi_shut_down();
    }
}

/// ROCm SMI's identity of the device behind a KFD node.
pub fn identity_for_kfd_node(node: &KfdNode) -> Result<RsmiIdentity, RocmSmiError> {
    let smi = RocmSmi::init()?;
    let devices = smi.identities()?;
    match_kfd_node(node, &devices).cloned()
}

/// A display name for a KFD node from ROCm SMI ("<GPU name> (KFD node N
/// gpu_id G <PCI bus id>)"), or `None` (logged at debug level) where ROCm SMI
/// cannot tell. Used by [`super::rocm::RocmKfdSource::open`].
pub fn name_for_kfd_node(node: &KfdNode) -> Option<String> {
    match identity_for_kfd_node(node) {
        Ok(RsmiIdentity {
            name: Some(name),
            pci_bus_id,
            ..
        }) => Some(format!(
            "{name} (KFD node {} gpu_id {} {pci_bus_id})",
            node.node, node.gpu_id
        )),
        Ok(_) => None,
        Err(e) => {
            tracing::debug!(node = node.node, "no ROCm SMI name: {e}");
            None
        }
    }
}

/// The text up to the first NUL (all of it if there is none), lossy UTF-8.
fn c_buffer_to_string(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).trim().to_string()
}

/// `rsmi_status_string`, or the number where the library has no text.
fn status_text(status: rsmi_status_t) -> String {
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: `text` is a valid, exclusive out-pointer for the call. The
    // library works without rsmi_init here (a static table lookup).
    let rc = unsafe { rsmi_status_string(status, &mut text) };
    if rc != RSMI_STATUS_SUCCESS || text.is_null() {
        return format!("status {status}");
    }
    // SAFETY: on success the library points `text` at a NUL-terminated string
    // in static storage (documented in rocm_smi.h), valid for this read.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

fn ffi_init() -> rsmi_status_t {
    // SAFETY: no pointers; the library serialises init with its own mutex
    // and restores its reference count when init fails.
    unsafe { rsmi_init(0) }
}

fn ffi_shut_down() {
    // SAFETY: only called from Drop of a RocmSmi, i.e. once per successful
    // rsmi_init, as the library's reference counting requires.
    unsafe {
        rsmi_shut_down();
    }
}

fn ffi_num_monitor_devices(count: &mut u32) -> rsmi_status_t {
    // SAFETY: `count` is a valid, exclusive u32 for the call.
    unsafe { rsmi_num_monitor_devices(count) }
}

fn ffi_dev_pci_id(index: u32, bdfid: &mut u64) -> rsmi_status_t {
    // SAFETY: `bdfid` is a valid, exclusive u64 for the call; the library
    // checks `index`.
    unsafe { rsmi_dev_pci_id_get(index, bdfid) }
}

fn ffi_dev_unique_id(index: u32, id: &mut u64) -> rsmi_status_t {
    // SAFETY: `id` is a valid, exclusive u64 for the call; the library checks
    // `index`.
    unsafe { rsmi_dev_unique_id_get(index, id) }
}

fn ffi_dev_name(index: u32, buf: &mut [u8]) -> rsmi_status_t {
    // SAFETY: the library writes at most `buf.len()` bytes (the `len`
    // argument) into `buf`, which is valid and exclusively borrowed for the
    // call; the text is read back bounded by `buf.len()`, NUL or not.
    unsafe { rsmi_dev_name_get(index, buf.as_mut_ptr().cast::<c_char>(), buf.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kfd_node(node: u32, location_id: Option<u32>, domain: Option<u32>) -> KfdNode {
        KfdNode {
            node,
            gpu_id: 1000 + node,
            drm_render_minor: Some(128 + node),
            vendor_id: Some(0x1002),
            device_id: Some(0x740f),
            location_id,
            domain,
            unique_id: None,
        }
    }

    fn rsmi(index: u32, domain: u32, bus: u8, device: u8, function: u8) -> RsmiIdentity {
        RsmiIdentity {
            index,
            name: Some(format!("gpu{index}")),
            pci_bus_id: PciBusId {
                domain,
                bus,
                device,
                function,
            },
            unique_id: None,
        }
    }

    /// bus << 8 | device << 3 | function, as KFD writes `location_id`.
    fn location(bus: u32, device: u32, function: u32) -> u32 {
        (bus << 8) | (device << 3) | function
    }

    #[test]
    fn rsmi_bdfid_decodes_and_ignores_partition_bits() {
        // domain 0x0001, partition 3 (ROCm 6, bits 31..28), bus 0xc1, dev 0, fn 0
        let bdfid = (1u64 << 32) | (3u64 << 28) | (0xc1 << 8);
        let id = PciBusId::from_rsmi_bdfid(bdfid);
        assert_eq!(
            id,
            PciBusId {
                domain: 1,
                bus: 0xc1,
                device: 0,
                function: 0
            }
        );
        assert_eq!(id.to_string(), "0001:c1:00.0");
        let id = PciBusId::from_rsmi_bdfid((0x23 << 8) | (0x1f << 3) | 7);
        assert_eq!(id.to_string(), "0000:23:1f.7");
    }

    #[test]
    fn kfd_location_formats_like_kfd_node() {
        let node = kfd_node(2, Some(location(0x83, 2, 1)), Some(0x10));
        let id = PciBusId::from_kfd(node.location_id.unwrap(), node.domain.unwrap());
        assert_eq!(Some(id.to_string()), node.pci_bus_id());
        assert_eq!(id.to_string(), "0010:83:02.1");
    }

    #[test]
    fn kfd_nodes_map_to_rsmi_indices_by_pci_bus_id() {
        // KFD node order (by node number) differs from ROCm SMI's index order.
        let nodes = [
            kfd_node(1, Some(location(0xc1, 0, 0)), Some(0)),
            kfd_node(2, Some(location(0x03, 0, 0)), Some(0)),
            kfd_node(3, Some(location(0x43, 0, 0)), Some(0)),
        ];
        let devices = [
            rsmi(0, 0, 0x03, 0, 0),
            rsmi(1, 0, 0x43, 0, 0),
            rsmi(2, 0, 0xc1, 0, 0),
        ];
        let mapped: Vec<(u32, u32)> = map_kfd_nodes(&nodes, &devices)
            .into_iter()
            .map(|(node, r)| (node, r.unwrap()))
            .collect();
        assert_eq!(mapped, [(1, 2), (2, 0), (3, 1)]);
    }

    #[test]
    fn pci_domain_distinguishes_devices() {
        let devices = [rsmi(0, 0, 0x03, 0, 0), rsmi(1, 1, 0x03, 0, 0)];
        let node = kfd_node(1, Some(location(0x03, 0, 0)), Some(1));
        assert_eq!(rsmi_index_for_kfd_node(&node, &devices).unwrap(), 1);
        let node = kfd_node(1, Some(location(0x03, 0, 0)), Some(0));
        assert_eq!(rsmi_index_for_kfd_node(&node, &devices).unwrap(), 0);
        let node = kfd_node(1, Some(location(0x03, 0, 0)), Some(2));
        assert!(matches!(
            rsmi_index_for_kfd_node(&node, &devices),
            Err(RocmSmiError::NoMatch(b)) if b == "0002:03:00.0"
        ));
    }

    #[test]
    fn node_without_domain_matches_only_when_unique() {
        let node = kfd_node(1, Some(location(0x03, 0, 0)), None);
        let one = [rsmi(0, 0, 0x43, 0, 0), rsmi(1, 4, 0x03, 0, 0)];
        assert_eq!(rsmi_index_for_kfd_node(&node, &one).unwrap(), 1);
        let two = [rsmi(0, 0, 0x03, 0, 0), rsmi(1, 4, 0x03, 0, 0)];
        assert!(matches!(
            rsmi_index_for_kfd_node(&node, &two),
            Err(RocmSmiError::Ambiguous { count: 2, .. })
        ));
    }

    #[test]
    fn node_without_location_or_device_is_not_matched() {
        let devices = [rsmi(0, 0, 0x03, 0, 0)];
        let node = kfd_node(5, None, Some(0));
        assert!(matches!(
            rsmi_index_for_kfd_node(&node, &devices),
            Err(RocmSmiError::NoPciLocation(5))
        ));
        let node = kfd_node(1, Some(location(0x03, 0, 1)), Some(0));
        assert!(matches!(
            rsmi_index_for_kfd_node(&node, &devices),
            Err(RocmSmiError::NoMatch(_))
        ));
        assert!(matches!(
            rsmi_index_for_kfd_node(&node, &[]),
            Err(RocmSmiError::NoMatch(_))
        ));
    }

    #[test]
    fn duplicate_bus_ids_are_ambiguous() {
        // ROCm 6 compute partitions share one PCI function.
        let devices = [rsmi(0, 0, 0x03, 0, 0), rsmi(1, 0, 0x03, 0, 0)];
        let node = kfd_node(1, Some(location(0x03, 0, 0)), Some(0));
        assert!(matches!(
            rsmi_index_for_kfd_node(&node, &devices),
            Err(RocmSmiError::Ambiguous { count: 2, .. })
        ));
    }

    #[test]
    fn unique_ids_cross_check_where_both_report_one() {
        let mut node = kfd_node(1, Some(location(0x03, 0, 0)), Some(0));
        let mut device = rsmi(7, 0, 0x03, 0, 0);
        node.unique_id = Some(0x1234);
        device.unique_id = Some(0x1234);
        assert_eq!(
            rsmi_index_for_kfd_node(&node, &[device.clone()]).unwrap(),
            7
        );
        device.unique_id = Some(0x9999);
        assert!(matches!(
            rsmi_index_for_kfd_node(&node, &[device.clone()]),
            Err(RocmSmiError::UniqueIdMismatch {
                index: 7,
                kfd: 0x1234,
                rsmi: 0x9999,
                ..
            })
        ));
        // 0 or missing on either side means "not reported": no check.
        node.unique_id = Some(0);
        assert_eq!(
            rsmi_index_for_kfd_node(&node, &[device.clone()]).unwrap(),
            7
        );
        device.unique_id = None;
        node.unique_id = Some(0x1234);
        assert_eq!(rsmi_index_for_kfd_node(&node, &[device]).unwrap(), 7);
    }

    #[test]
    fn c_buffer_is_read_up_to_nul_or_end() {
        assert_eq!(c_buffer_to_string(b"Navi 31\0junk"), "Navi 31");
        assert_eq!(c_buffer_to_string(b"no terminator"), "no terminator");
        assert_eq!(c_buffer_to_string(&[0u8; 8]), "");
    }

    #[test]
    fn errors_convert_to_devclock_errors() {
        let e: DevClockError = RocmSmiError::Unavailable("x".into()).into();
        assert!(e.is_unavailable());
        let e: DevClockError = RocmSmiError::NoSuchDevice {
            index: 3,
            available: 1,
        }
        .into();
        assert!(matches!(
            e,
            DevClockError::NoSuchDevice {
                index: 3,
                available: 1
            }
        ));
        let e: DevClockError = RocmSmiError::NoMatch("0000:03:00.0".into()).into();
        assert!(!e.is_unavailable());
        assert!(e.to_string().contains("0000:03:00.0"), "{e}");
    }

    /// Runs against the real librocm_smi64. Without an AMD GPU (no /dev/kfd,
    /// as in CI) every lookup is a clean `Unavailable`, never a panic; on an
    /// AMD node the devices must have identities.
    #[test]
    fn identity_lookup_against_the_installed_library() {
        let has_amd_gpu = std::path::Path::new(super::super::rocm::KFD_DEVICE).exists();
        let listed = RocmSmi::init().and_then(|smi| smi.identities());
        if !has_amd_gpu {
            let err = listed.expect_err("no /dev/kfd, yet ROCm SMI listed devices");
            assert!(err.is_unavailable(), "{err}");
            assert!(DevClockError::from(err).is_unavailable());

            let by_index = RocmSmi::init().and_then(|smi| smi.identity(0));
            let err = by_index.expect_err("no AMD GPU, yet device 0 has an identity");
            assert!(
                err.is_unavailable() || matches!(err, RocmSmiError::NoSuchDevice { index: 0, .. }),
                "{err}"
            );

            let node = kfd_node(1, Some(location(0x03, 0, 0)), Some(0));
            let err = identity_for_kfd_node(&node).expect_err("no AMD GPU");
            assert!(err.is_unavailable(), "{err}");
            assert_eq!(name_for_kfd_node(&node), None);
        } else {
            let devices = listed.expect("AMD node: ROCm SMI lists devices");
            assert!(!devices.is_empty());
            for d in &devices {
                eprintln!("rocm-smi device {}: {:?} {}", d.index, d.name, d.pci_bus_id);
            }
        }
    }
}
