//! The agent runtime (`clockmesh agent`): registration, handshakes, coded
//! probe pairs, timestamp assembly, per-window fits, the leader's network
//! solve, publication and the local HTTP endpoint.
//!
//! One tokio task ([`driver`]) runs the protocol core's `Node` and does its
//! I/O; the probe sender is a thread of its own ([`sender`]); the estimator
//! is pure (`clockmesh-estimator`).
//! See `docs/agent.md` for the loop, the window phases and the JSONL fields.

/// The protocol itself (stamp collector, peer handshakes, the window
/// phases, the fit/result codec, the node state machine) lives in
/// `clockmesh-core`; this module does its I/O.
pub use clockmesh_core::{codec, collector, peers};
mod driver;
pub mod gpu;
mod gpu_publish;
pub mod http;
pub mod jsonl;
pub mod privileges;
pub mod sender;
pub mod status;

use std::net::IpAddr;

use thiserror::Error;

pub use driver::{PROBE_RCVBUF_BYTES, raise_receive_buffer, run};

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Capture(#[from] crate::capture::CaptureError),
    #[error(transparent)]
    Discovery(#[from] crate::discovery::DiscoveryError),
    #[error(transparent)]
    Publish(#[from] crate::publish::PublishError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "interface {0:?} has no IPv4 address to advertise; set advertise_addr (CLOCKMESH_ADVERTISE_ADDR)"
    )]
    NoAddress(String),
    #[error("auth key file {path}: {reason}")]
    AuthKey { path: String, reason: String },
    #[error("static discovery needs `members` (CLOCKMESH_MEMBERS or the config file)")]
    NoMembers,
    #[error("this node ({0}) is listed under another id now; exiting so it restarts cleanly")]
    Deregistered(String),
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let what = what.into();
    move |source| RuntimeError::Io { what, source }
}

/// The first IPv4 address of `interface`.
pub fn interface_ipv4(interface: &str) -> Option<IpAddr> {
    nix::ifaddrs::getifaddrs()
        .ok()?
        .filter(|i| i.interface_name == interface)
        .find_map(|i| i.address?.as_sockaddr_in().map(|a| IpAddr::V4(a.ip())))
}

/// Reads the shared HMAC key (trailing newline ignored, at least 16 bytes).
pub fn load_auth_key(path: &std::path::Path) -> Result<crate::probe::wire::AuthKey, RuntimeError> {
    let err = |reason: String| RuntimeError::AuthKey {
        path: path.display().to_string(),
        reason,
    };
    let mut bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    crate::probe::wire::AuthKey::new(bytes).ok_or_else(|| err("shorter than 16 bytes".into()))
}
