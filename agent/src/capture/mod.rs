//! Capture: the eBPF programs' events and the socket's own timestamps.
//!
//! - [`loader`]: load/attach the embedded programs, stream [`ProbeEvent`]s.
//! - [`timestamping`]: SO_TIMESTAMPING on the probe socket (TX stamps from the
//!   error queue, RX stamps from control messages): the hardware-TX path
//!   where fentry is refused, and a cross-check of the eBPF stamps.
//! - [`clocks`]: measures the MONOTONIC/PHC → REALTIME maps (the domain
//!   and map types are `clockmesh_core::stamps`); [`stamps`]: every event
//!   timestamp tagged with its domain (re-exported from the core).
//! - [`btf`]: kernel struct offsets for the tracing programs.

pub mod btf;
pub mod clocks;
pub mod loader;
mod privileges;
pub mod stamps;
pub mod timestamping;

use std::{ops::RangeInclusive, path::PathBuf};

pub use clockmesh_common::ProbeEvent;
pub use loader::{Capture, CaptureConfig, Counters, TxStampSource};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CaptureError {
    #[error("network interface {0:?} does not exist (in this network namespace)")]
    NoSuchInterface(String),
    #[error(
        "not permitted to load eBPF programs: missing {0}; run as root or grant these capabilities (the DaemonSet adds BPF, PERFMON, NET_ADMIN)"
    )]
    NotPermitted(String),
    #[error("kernel BTF unavailable at {path}: {reason}")]
    NoBtf { path: PathBuf, reason: String },
    #[error("kernel BTF lacks what the tracing programs need: {0}")]
    BtfLayout(#[from] btf::BtfError),
    #[error("probe port range {0:?} is empty or starts at 0")]
    BadPorts(RangeInclusive<u16>),
    #[error(
        "this binary was built without eBPF programs (AYA_BUILD_SKIP); rebuild with `cargo xtask build-ebpf` prerequisites installed"
    )]
    NotBuilt,
    #[error("loading the eBPF object failed: {0}")]
    Load(#[source] aya::EbpfError),
    #[error("eBPF program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("eBPF object has no program {0}")]
    MissingProgram(&'static str),
    #[error("eBPF object has no map {0}")]
    MissingMap(&'static str),
    #[error("eBPF map: {0}")]
    Map(#[from] aya::EbpfError),
    #[error("ring buffer registration with tokio failed: {0}")]
    RingBuffer(#[source] std::io::Error),
}

impl CaptureError {
    fn from_load(e: aya::EbpfError) -> Self {
        if is_permission_error(&e.to_string()) {
            return CaptureError::NotPermitted("permission to call bpf() (EPERM)".into());
        }
        CaptureError::Load(e)
    }

    fn program(name: &'static str, source: aya::programs::ProgramError) -> Self {
        CaptureError::Program { name, source }
    }
}

fn is_permission_error(msg: &str) -> bool {
    msg.contains("Operation not permitted") || msg.contains("EPERM")
}
