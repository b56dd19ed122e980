//! GPU device clock sources (the I/O side of device-clock correlation).
//!
//! A [`DeviceClockSource`] takes bursts of [`SnapshotPair`]s: a device clock
//! reading bracketed by host clock reads. The pure fitter in
//! `clockmesh_estimator::device` turns them into a map from device time to
//! host time; [`sampler::DeviceClockSampler`] drives both, and
//! [`PublishedDeviceMap`] is what publication needs of the result.
//!
//! Sources: [`cuda::CudaSource`] (`%globaltimer` through a ping-pong kernel,
//! CUDA loaded at run time), [`rocm::RocmKfdSource`] (KFD ioctl, libc only) and
//! [`synthetic::SyntheticSource`] (a modelled clock, for CI and demos). Each
//! GPU source is opt-in: opening a CUDA context costs GPU memory (see
//! docs/gpu-clocks.md) and opening `/dev/kfd` registers a KFD process.
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod host;
pub mod kfd_topology;
pub mod publish_map;
pub mod rocm;
#[cfg(feature = "rocm-smi")]
pub mod rocm_smi;
pub mod sampler;
pub mod synthetic;

pub use clockmesh_estimator::device::{DeviceId, HostDomain, SnapshotPair, SourceKind};
pub use clockmesh_offsets::PublishedDeviceMap;
pub use publish_map::published_map;

/// What a source is and how fine its readings are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceInfo {
    pub device: DeviceId,
    pub kind: SourceKind,
    /// Human-readable device name (GPU model, UUID or PCI location).
    pub name: String,
    /// Resolution of one device reading (ns).
    pub quantum_ns: u64,
}

/// Errors of device clock sources.
#[derive(Debug, thiserror::Error)]
pub enum DevClockError {
    /// The vendor library or device is absent: not a fault, the node just
    /// has no such GPU.
    #[error("{0}")]
    Unavailable(String),
    #[error("device {index} not found ({available} available)")]
    NoSuchDevice { index: u32, available: usize },
    #[error("CUDA driver call failed: {0}")]
    Cuda(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("malformed KFD topology at {path}: {reason}")]
    Topology { path: String, reason: String },
    #[error("device did not answer within {waited_us} us ({stage})")]
    Timeout { stage: &'static str, waited_us: u64 },
    #[error("host clock read failed: {0}")]
    HostClock(String),
    #[error(transparent)]
    Fit(#[from] clockmesh_estimator::device::FitError),
}

impl DevClockError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        DevClockError::Io {
            what: what.into(),
            source,
        }
    }

    /// True when the source is simply not present on this node.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, DevClockError::Unavailable(_))
    }
}

/// A device clock that can be read against the host clocks.
///
/// One source reads one device. Implementations take host stamps with
/// [`host::stamp_before`] and [`host::stamp_after`] immediately around the
/// device read so the bracket is as tight as the mechanism allows.
pub trait DeviceClockSource: Send {
    fn info(&self) -> &SourceInfo;

    /// Take up to `n` pairs back to back, tagged with `burst` and sequence
    /// numbers starting at `first_seq`. Best effort: a pair that failed is
    /// left out; an error means the source itself failed.
    fn sample_burst(
        &mut self,
        n: usize,
        burst: u64,
        first_seq: u64,
    ) -> Result<Vec<SnapshotPair>, DevClockError>;

    /// Device memory in use on this device by all processes (bytes), where
    /// the source can tell; used to state what holding the source costs.
    fn device_memory_used(&self) -> Option<u64> {
        None
    }
}

/// Which CUDA kernel protocol samples the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CudaMode {
    /// One resident kernel per burst answers host pings (tightest pairs).
    #[default]
    PingPong,
    /// One kernel launch per sample (fallback; wider brackets).
    LaunchPerSample,
}

/// Which source to open, and its options.
#[derive(Debug, Clone)]
pub enum SourceChoice {
    Cuda(CudaMode),
    /// `tick_hz` overrides the counter rate read from the DRM render node.
    Rocm {
        tick_hz: Option<u64>,
    },
    Synthetic(clockmesh_estimator::device::SyntheticConfig),
}

/// Open a source for device `index`. GPU sources return
/// [`DevClockError::Unavailable`] where the vendor's driver or device is
/// absent, so callers can skip them.
pub fn open_source(
    choice: &SourceChoice,
    index: u32,
) -> Result<Box<dyn DeviceClockSource>, DevClockError> {
    Ok(match choice {
        #[cfg(feature = "cuda")]
        SourceChoice::Cuda(mode) => Box::new(cuda::CudaSource::open(index, *mode)?),
        #[cfg(not(feature = "cuda"))]
        SourceChoice::Cuda(_) => {
            return Err(DevClockError::Unavailable(
                "this clockmesh was built without the `cuda` cargo feature".into(),
            ));
        }
        SourceChoice::Rocm { tick_hz } => Box::new(rocm::RocmKfdSource::open(index, *tick_hz)?),
        SourceChoice::Synthetic(config) => {
            let config = clockmesh_estimator::device::SyntheticConfig {
                device_index: index,
                ..config.clone()
            };
            Box::new(synthetic::SyntheticSource::new(config)?)
        }
    })
}
