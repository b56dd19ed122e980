//! Giving up the capabilities the agent needed to start. CAP_BPF,
//! CAP_PERFMON and CAP_NET_ADMIN load and attach the eBPF programs and set
//! up the sockets; afterwards the agent parses datagrams from the network
//! and serves HTTP, and needs none of them. Capabilities are per thread:
//! the sender thread drops its own when it starts, the main thread once the
//! programs it may still attach (`tracepoint_stamps = auto`) are decided.
//! Later threads inherit the dropped sets.

use caps::{CapSet, Capability, errors::CapsError};

/// Clears every capability set of the calling thread: bounding first (it
/// needs CAP_SETPCAP, which a container without it does not have: that
/// part is best effort), then ambient, inheritable, effective and permitted.
/// Without permitted capabilities nothing can raise them again short of an
/// exec, and the agent never execs; `no_new_privs` (per thread, inherited,
/// never cleared) makes even an exec of a set-uid or file-capability binary
/// gain nothing, should one ever happen.
pub fn drop_all() -> Result<(), PrivilegeError> {
    drop_all_but(None)
}

/// [`drop_all`], except that `keep` stays in the permitted set alone (not
/// effective): the main thread keeps CAP_NET_ADMIN this way where its
/// classifiers went through netlink tc, whose filters outlive the process
/// unless it removes them ([`raise`] before the detach).
pub fn drop_all_but(keep: Option<Capability>) -> Result<(), PrivilegeError> {
    nix::sys::prctl::set_no_new_privs().map_err(PrivilegeError::NoNewPrivs)?;
    let _ = caps::clear(None, CapSet::Bounding);
    for set in [CapSet::Ambient, CapSet::Inheritable, CapSet::Effective] {
        caps::clear(None, set)?;
    }
    let kept: caps::CapsHashSet = keep.into_iter().collect();
    caps::set(None, CapSet::Permitted, &kept)?;
    Ok(())
}

/// Makes a capability kept by [`drop_all_but`] effective again.
pub fn raise(cap: Capability) -> Result<(), PrivilegeError> {
    caps::raise(None, CapSet::Effective, cap)?;
    Ok(())
}

/// Why the agent could not give up its privileges.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error("setting no_new_privs: {0}")]
    NoNewPrivs(nix::Error),
    #[error("clearing capabilities: {0}")]
    Caps(#[from] CapsError),
}

/// The calling thread's capabilities in `set`, by name.
fn names(set: CapSet) -> Vec<String> {
    let mut names: Vec<String> = caps::read(None, set)
        .map(|s| s.iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// The calling thread's effective capabilities, by name (status, tests).
pub fn effective() -> Vec<String> {
    names(CapSet::Effective)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_new_privs() -> bool {
        nix::sys::prctl::get_no_new_privs().unwrap_or(false)
    }

    /// Each case runs on a thread of its own: capabilities and no_new_privs
    /// are per thread, and the test process must keep its own.
    fn on_own_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(f).join().unwrap()
    }

    #[test]
    fn drop_all_leaves_nothing_and_sets_no_new_privs() {
        let (effective, permitted, nnp) = on_own_thread(|| {
            drop_all().unwrap();
            (
                names(CapSet::Effective),
                names(CapSet::Permitted),
                no_new_privs(),
            )
        });
        assert!(
            effective.is_empty() && permitted.is_empty(),
            "{effective:?} {permitted:?}"
        );
        assert!(nnp);
    }

    #[test]
    fn a_kept_capability_is_only_permitted_until_raised() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (a capability to keep)");
            return;
        }
        let (before, permitted, after) = on_own_thread(|| {
            drop_all_but(Some(Capability::CAP_NET_ADMIN)).unwrap();
            let before = names(CapSet::Effective);
            let permitted = names(CapSet::Permitted);
            raise(Capability::CAP_NET_ADMIN).unwrap();
            (before, permitted, names(CapSet::Effective))
        });
        assert!(before.is_empty(), "{before:?}");
        assert_eq!(permitted, ["CAP_NET_ADMIN"]);
        assert_eq!(after, ["CAP_NET_ADMIN"]);
    }
}
