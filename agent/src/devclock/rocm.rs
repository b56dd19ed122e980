//! AMD GPU clock through the KFD ioctl `AMDKFD_IOC_GET_CLOCK_COUNTERS`.
//!
//! No ROCm userspace is needed: `/dev/kfd` plus libc. GPUs are the KFD
//! topology nodes with a non-zero `gpu_id`
//! (`/sys/class/kfd/kfd/topology/nodes/*/gpu_id`). The ioctl returns the GPU
//! clock counter (the same counter as DRM `AMDGPU_INFO_TIMESTAMP`) together
//! with the kernel's MONOTONIC_RAW and BOOTTIME read in the same call; we
//! bracket it with our own host reads. The counter's rate comes from the DRM
//! render node (`AMDGPU_INFO_DEV_INFO.gpu_counter_freq`, kHz) or from the
//! caller. Not yet run on AMD hardware: the layouts are checked against the
//! kernel UAPI values in tests, and the topology parser against fixtures.
use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};

use clockmesh_estimator::device::{DeviceId, DeviceReading, SnapshotPair, SourceKind, Vendor};

pub use super::kfd_topology::{KfdNode, parse_topology};
use super::{DevClockError, DeviceClockSource, SourceInfo, host};

pub const KFD_DEVICE: &str = "/dev/kfd";
pub const KFD_TOPOLOGY_NODES: &str = "/sys/class/kfd/kfd/topology/nodes";
pub const DRI_DIR: &str = "/dev/dri";

/// `struct kfd_ioctl_get_clock_counters_args` (include/uapi/linux/kfd_ioctl.h).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KfdGetClockCountersArgs {
    /// From KFD: the GPU clock counter.
    pub gpu_clock_counter: u64,
    /// From KFD: `ktime_get_raw_ns()` (MONOTONIC_RAW).
    pub cpu_clock_counter: u64,
    /// From KFD: `ktime_get_boottime_ns()` (BOOTTIME).
    pub system_clock_counter: u64,
    /// From KFD: rate of `system_clock_counter` (1e9).
    pub system_clock_freq: u64,
    /// To KFD: which GPU.
    pub gpu_id: u32,
    pub pad: u32,
}

/// `struct drm_amdgpu_info` (include/uapi/drm/amdgpu_drm.h): the request
/// header; the 16-byte union is unused for `AMDGPU_INFO_DEV_INFO`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct DrmAmdgpuInfo {
    pub return_pointer: u64,
    pub return_size: u32,
    pub query: u32,
    pub union_pad: [u8; 16],
}

/// Linux `_IOC` encoding (asm-generic/ioctl.h): dir:2 | size:14 | type:8 | nr:8.
const fn ioc(dir: u64, ty: u8, nr: u8, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | ((ty as u64) << 8) | nr as u64
}
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;

/// `AMDKFD_IOWR(0x05, struct kfd_ioctl_get_clock_counters_args)`, type 'K'.
pub const AMDKFD_IOC_GET_CLOCK_COUNTERS: u64 = ioc(
    IOC_READ | IOC_WRITE,
    b'K',
    0x05,
    size_of::<KfdGetClockCountersArgs>(),
);
/// `DRM_IOW(DRM_COMMAND_BASE + DRM_AMDGPU_INFO, struct drm_amdgpu_info)`.
pub const DRM_IOCTL_AMDGPU_INFO: u64 =
    ioc(IOC_WRITE, b'd', 0x40 + 0x05, size_of::<DrmAmdgpuInfo>());
pub const AMDGPU_INFO_DEV_INFO: u32 = 0x16;
/// Byte offset of `gpu_counter_freq` (kHz) in `struct drm_amdgpu_info_device`:
/// after seven u32 fields. The kernel copies min(return_size, sizeof), so a
/// short buffer is fine.
pub const DEV_INFO_GPU_COUNTER_FREQ_OFFSET: usize = 28;

/// Call `AMDKFD_IOC_GET_CLOCK_COUNTERS` on an open `/dev/kfd`.
fn kfd_get_clock_counters(
    kfd: BorrowedFd<'_>,
    args: &mut KfdGetClockCountersArgs,
) -> std::io::Result<()> {
    // SAFETY: the request number encodes exactly size_of::<KfdGetClockCountersArgs>()
    // (checked against the UAPI value in tests); `args` is a valid, exclusive
    // #[repr(C)] buffer of that size for the whole call; the fd is open.
    let rc = unsafe {
        libc::ioctl(
            kfd.as_raw_fd(),
            AMDKFD_IOC_GET_CLOCK_COUNTERS as libc::c_ulong,
            args as *mut KfdGetClockCountersArgs,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `gpu_counter_freq` (kHz) from `AMDGPU_INFO_DEV_INFO` on a render node.
fn drm_gpu_counter_freq_khz(render: BorrowedFd<'_>) -> std::io::Result<u32> {
    let mut dev_info = [0u8; DEV_INFO_GPU_COUNTER_FREQ_OFFSET + 4];
    let mut request = DrmAmdgpuInfo {
        return_pointer: dev_info.as_mut_ptr() as u64,
        return_size: dev_info.len() as u32,
        query: AMDGPU_INFO_DEV_INFO,
        union_pad: [0; 16],
    };
    // SAFETY: the kernel writes at most `return_size` bytes to `return_pointer`,
    // which points at `dev_info`, alive and exclusively borrowed for the
    // call; `request` matches struct drm_amdgpu_info (size checked in tests).
    let rc = unsafe {
        libc::ioctl(
            render.as_raw_fd(),
            DRM_IOCTL_AMDGPU_INFO as libc::c_ulong,
            &mut request as *mut DrmAmdgpuInfo,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let off = DEV_INFO_GPU_COUNTER_FREQ_OFFSET;
    Ok(u32::from_ne_bytes([
        dev_info[off],
        dev_info[off + 1],
        dev_info[off + 2],
        dev_info[off + 3],
    ]))
}

/// Where the ROCm source looks; tests point these at fixtures.
#[derive(Debug, Clone)]
pub struct RocmPaths {
    pub topology_nodes: PathBuf,
    pub kfd: PathBuf,
    pub dri: PathBuf,
}

impl Default for RocmPaths {
    fn default() -> Self {
        RocmPaths {
            topology_nodes: KFD_TOPOLOGY_NODES.into(),
            kfd: KFD_DEVICE.into(),
            dri: DRI_DIR.into(),
        }
    }
}

/// One AMD GPU's clock counter via KFD.
pub struct RocmKfdSource {
    kfd: File,
    node: KfdNode,
    tick_hz: u64,
    info: SourceInfo,
}

impl RocmKfdSource {
    /// Open the `index`-th KFD GPU node. `tick_hz` overrides the counter
    /// rate read from the DRM render node.
    pub fn open(index: u32, tick_hz: Option<u64>) -> Result<Self, DevClockError> {
        Self::open_at(&RocmPaths::default(), index, tick_hz)
    }

    pub fn open_at(
        paths: &RocmPaths,
        index: u32,
        tick_hz: Option<u64>,
    ) -> Result<Self, DevClockError> {
        let nodes = parse_topology(&paths.topology_nodes)?;
        if nodes.is_empty() {
            return Err(DevClockError::Unavailable(format!(
                "no AMD GPU: no KFD GPU nodes under {}",
                paths.topology_nodes.display()
            )));
        }
        let node = nodes
            .get(index as usize)
            .cloned()
            .ok_or(DevClockError::NoSuchDevice {
                index,
                available: nodes.len(),
            })?;
        let kfd = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&paths.kfd)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => DevClockError::Unavailable(format!(
                    "no AMD GPU: {} does not exist",
                    paths.kfd.display()
                )),
                _ => DevClockError::io(format!("open {}", paths.kfd.display()), e),
            })?;
        let tick_hz = match tick_hz {
            Some(hz) if hz > 0 => hz,
            _ => counter_hz_from_drm(&paths.dri, &node)?,
        };
        let name = format!(
            "AMD GPU node {} gpu_id {} {}",
            node.node,
            node.gpu_id,
            node.pci_bus_id().unwrap_or_default()
        );
        // With the `rocm-smi` feature, ROCm SMI's GPU name where it has one.
        #[cfg(feature = "rocm-smi")]
        let name = super::rocm_smi::name_for_kfd_node(&node).unwrap_or(name);
        let info = SourceInfo {
            device: DeviceId {
                vendor: Vendor::Amd,
                index,
            },
            kind: SourceKind::KfdIoctl,
            name,
            quantum_ns: 1_000_000_000u64.div_ceil(tick_hz),
        };
        Ok(RocmKfdSource {
            kfd,
            node,
            tick_hz,
            info,
        })
    }

    pub fn node(&self) -> &KfdNode {
        &self.node
    }

    pub fn tick_hz(&self) -> u64 {
        self.tick_hz
    }
}

fn counter_hz_from_drm(dri: &Path, node: &KfdNode) -> Result<u64, DevClockError> {
    let minor = node.drm_render_minor.ok_or_else(|| {
        DevClockError::Unavailable(format!(
            "KFD node {} has no drm_render_minor; pass the counter rate (--rocm-tick-hz)",
            node.node
        ))
    })?;
    let path = dri.join(format!("renderD{minor}"));
    let render =
        File::open(&path).map_err(|e| DevClockError::io(format!("open {}", path.display()), e))?;
    let khz = drm_gpu_counter_freq_khz(render.as_fd())
        .map_err(|e| DevClockError::io(format!("AMDGPU_INFO_DEV_INFO on {}", path.display()), e))?;
    if khz == 0 {
        return Err(DevClockError::Unavailable(format!(
            "{} reports a zero GPU counter rate",
            path.display()
        )));
    }
    Ok(u64::from(khz) * 1_000)
}

impl DeviceClockSource for RocmKfdSource {
    fn info(&self) -> &SourceInfo {
        &self.info
    }

    fn sample_burst(
        &mut self,
        n: usize,
        burst: u64,
        first_seq: u64,
    ) -> Result<Vec<SnapshotPair>, DevClockError> {
        let mut pairs = Vec::with_capacity(n);
        for i in 0..n {
            let mut args = KfdGetClockCountersArgs {
                gpu_id: self.node.gpu_id,
                ..Default::default()
            };
            let before = host::stamp_before()?;
            kfd_get_clock_counters(self.kfd.as_fd(), &mut args)
                .map_err(|e| DevClockError::io("AMDKFD_IOC_GET_CLOCK_COUNTERS", e))?;
            let after = host::stamp_after()?;
            pairs.push(SnapshotPair {
                device: self.info.device,
                source: SourceKind::KfdIoctl,
                reading: DeviceReading::Ticks {
                    ticks: args.gpu_clock_counter,
                    hz: self.tick_hz,
                },
                before,
                after,
                in_call_boottime_ns: i64::try_from(args.system_clock_counter).ok(),
                seq: first_seq + i as u64,
                burst,
            });
        }
        Ok(pairs)
    }
}
