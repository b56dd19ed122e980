//! Giving up the capabilities the agent needed to start. CAP_BPF,
//! CAP_PERFMON and CAP_NET_ADMIN load and attach the eBPF programs and set
//! up the sockets; afterwards the agent parses datagrams from the network
//! and serves HTTP, and needs none of them. Capabilities are per thread:
//! the sender thread drops its own when it starts, the main thread once the
//! programs it may still attach (`tracepoint_stamps = auto`) are decided.
//! Later threads inherit the dropped sets.

use caps::{CapSet, errors::CapsError};

/// Clears every capability set of the calling thread: bounding first (it
/// needs CAP_SETPCAP, which a container without it does not have: that
/// part is best effort), then ambient, inheritable, effective and permitted.
/// Without permitted capabilities nothing can raise them again short of an
/// exec, and the agent never execs.
pub fn drop_all() -> Result<(), CapsError> {
    let _ = caps::clear(None, CapSet::Bounding);
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set)?;
    }
    Ok(())
}

/// The calling thread's effective capabilities, by name (status, tests).
pub fn effective() -> Vec<String> {
    let mut names: Vec<String> = caps::read(None, CapSet::Effective)
        .map(|s| s.iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    names.sort();
    names
}
