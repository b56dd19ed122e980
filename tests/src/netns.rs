//! Test hosts: network namespaces joined by veth pairs.
//!
//! Addresses come from 198.18.0.0/15 (RFC 2544 benchmarking range) and no
//! default route is installed, so nothing can leave the test hosts. All hosts
//! share one kernel clock, so the true offset between them is exactly zero.
//! Namespaces are deleted on drop (also when a test panics), and namespaces
//! left behind by a killed run are removed by the next [`Testbed`].

use std::{
    fs::File,
    net::Ipv4Addr,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
    thread,
};

use nix::sched::{CloneFlags, setns};
use thiserror::Error;

/// Every namespace this crate creates starts with this, then `<pid>-`.
const NS_PREFIX: &str = "cmtb-";
/// Where `ip netns` keeps the named namespaces.
pub const NETNS_DIR: &str = "/var/run/netns";
/// Address of the switch namespace's bridge (hosts are .1 to .250).
pub const SWITCH_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 254);
/// Interface name of every host's link, inside its own namespace.
pub const HOST_IFACE: &str = "eth0";

#[derive(Debug, Error)]
pub enum TestbedError {
    #[error("`{cmd}` failed: {stderr}")]
    Command { cmd: String, stderr: String },
    #[error("could not run `ip` (iproute2 installed? running as root?): {0}")]
    Spawn(std::io::Error),
    #[error("entering network namespace {ns}: {source}")]
    Enter { ns: String, source: nix::Error },
    #[error("opening network namespace {ns}: {source}")]
    Open { ns: String, source: std::io::Error },
    #[error("a testbed has 2 to 250 hosts, not {0}")]
    Size(usize),
}

/// One test host.
#[derive(Clone, Debug)]
pub struct Host {
    /// Network namespace name (`ip netns exec <netns> ...`).
    pub netns: String,
    pub addr: Ipv4Addr,
    /// The host's link, always [`HOST_IFACE`].
    pub iface: &'static str,
}

impl Host {
    /// Runs `f` on a new thread inside this host's namespace and waits for it.
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, TestbedError> {
        self.spawn(f).join().map_err(|_| TestbedError::Command {
            cmd: format!("thread in {}", self.netns),
            stderr: "panicked".into(),
        })?
    }

    /// Starts `f` on a new thread inside this host's namespace. Namespace
    /// membership is per thread, so work spawned onto other threads leaves it.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> thread::JoinHandle<Result<T, TestbedError>> {
        let ns = self.netns.clone();
        thread::spawn(move || {
            enter(&ns)?;
            Ok(f())
        })
    }
}

/// Moves the calling thread into network namespace `ns`.
pub fn enter(ns: &str) -> Result<(), TestbedError> {
    let path = format!("{NETNS_DIR}/{ns}");
    let file = File::open(&path).map_err(|source| TestbedError::Open {
        ns: ns.into(),
        source,
    })?;
    setns(file, CloneFlags::CLONE_NEWNET).map_err(|source| TestbedError::Enter {
        ns: ns.into(),
        source,
    })
}

/// A set of test hosts; deleted on drop.
pub struct Testbed {
    hosts: Vec<Host>,
    switch: Option<String>,
}

impl Testbed {
    /// Two hosts joined by one veth pair (the lowest-noise path).
    pub fn pair() -> Result<Self, TestbedError> {
        remove_stale_namespaces();
        let mut bed = Testbed::empty(2)?;
        let (a, b) = (&bed.hosts[0].netns, &bed.hosts[1].netns);
        ip(&[
            "link", "add", HOST_IFACE, "netns", a, "type", "veth", "peer", "name", HOST_IFACE,
            "netns", b,
        ])?;
        bed.configure_hosts()?;
        bed.switch = None;
        Ok(bed)
    }

    /// `n` hosts, each joined by a veth pair to a bridge in a switch namespace.
    pub fn switched(n: usize) -> Result<Self, TestbedError> {
        remove_stale_namespaces();
        let mut bed = Testbed::empty(n)?;
        let sw = format!("{}sw", bed.hosts[0].netns.trim_end_matches("h0"));
        add_namespace(&sw)?;
        bed.switch = Some(sw.clone());
        ipn(&sw, &["link", "add", "br0", "type", "bridge"])?;
        ipn(&sw, &["link", "set", "br0", "up"])?;
        disable_bridge_netfilter(&sw);
        for (i, host) in bed.hosts.iter().enumerate() {
            let port = switch_port_name(i);
            ip(&[
                "link",
                "add",
                HOST_IFACE,
                "netns",
                &host.netns,
                "type",
                "veth",
                "peer",
                "name",
                &port,
                "netns",
                &sw,
            ])?;
            ipn(&sw, &["link", "set", &port, "master", "br0"])?;
            ipn(&sw, &["link", "set", &port, "up"])?;
        }
        // The switch also gets an address: services every host reaches
        // (etcd in the cluster tests and the demo) run there.
        ipn(&sw, &["link", "set", "lo", "up"])?;
        ipn(
            &sw,
            &["addr", "add", &format!("{SWITCH_ADDR}/24"), "dev", "br0"],
        )?;
        bed.configure_hosts()?;
        Ok(bed)
    }

    /// The switch namespace as a host (only for [`Testbed::switched`]).
    pub fn switch_host(&self) -> Option<Host> {
        self.switch.as_ref().map(|sw| Host {
            netns: sw.clone(),
            addr: SWITCH_ADDR,
            iface: "br0",
        })
    }

    /// The switch namespace's port (interface) that host `i` hangs on
    /// (only for [`Testbed::switched`]).
    pub fn switch_port(&self, i: usize) -> Option<String> {
        (self.switch.is_some() && i < self.hosts.len()).then(|| switch_port_name(i))
    }

    /// Creates `n` empty host namespaces; dropped (deleted) on error.
    fn empty(n: usize) -> Result<Self, TestbedError> {
        if !(2..=250).contains(&n) {
            return Err(TestbedError::Size(n));
        }
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let base = format!("{NS_PREFIX}{}-{id}-", std::process::id());
        let mut bed = Testbed {
            hosts: Vec::new(),
            switch: None,
        };
        for i in 0..n {
            let netns = format!("{base}h{i}");
            add_namespace(&netns)?;
            bed.hosts.push(Host {
                netns,
                addr: Ipv4Addr::new(198, 18, 0, i as u8 + 1),
                iface: HOST_IFACE,
            });
        }
        Ok(bed)
    }

    fn configure_hosts(&self) -> Result<(), TestbedError> {
        for h in &self.hosts {
            ipn(&h.netns, &["link", "set", "lo", "up"])?;
            ipn(
                &h.netns,
                &["addr", "add", &format!("{}/24", h.addr), "dev", HOST_IFACE],
            )?;
            ipn(&h.netns, &["link", "set", HOST_IFACE, "up"])?;
        }
        Ok(())
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let names = self
            .hosts
            .iter()
            .map(|h| h.netns.clone())
            .chain(self.switch.clone());
        for ns in names {
            let _ = ip(&["netns", "del", &ns]);
        }
    }
}

fn switch_port_name(host: usize) -> String {
    format!("p{host}")
}

/// A switch forwards frames; with br_netfilter loaded the kernel would also
/// run bridged frames through iptables, adding microseconds of jitter that a
/// real switch does not have. Best effort: absent without br_netfilter.
fn disable_bridge_netfilter(ns: &str) {
    for key in ["iptables", "ip6tables", "arptables"] {
        let _ = Command::new("ip")
            .args(["netns", "exec", ns, "sysctl", "-qw"])
            .arg(format!("net.bridge.bridge-nf-call-{key}=0"))
            .output();
    }
}

fn add_namespace(ns: &str) -> Result<(), TestbedError> {
    ip(&["netns", "add", ns])
}

fn ipn(ns: &str, args: &[&str]) -> Result<(), TestbedError> {
    let mut full = vec!["-n", ns];
    full.extend_from_slice(args);
    ip(&full)
}

fn ip(args: &[&str]) -> Result<(), TestbedError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(TestbedError::Spawn)?;
    if out.status.success() {
        return Ok(());
    }
    Err(TestbedError::Command {
        cmd: format!("ip {}", args.join(" ")),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    })
}

/// Deletes `cmtb-<pid>-*` namespaces whose process is gone (a killed run).
pub fn remove_stale_namespaces() {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for name in entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
    {
        let Some(pid) = name
            .strip_prefix(NS_PREFIX)
            .and_then(|r| r.split('-').next())
        else {
            continue;
        };
        let alive = std::path::Path::new("/proc").join(pid).exists();
        if !alive {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_outside_range_are_rejected() {
        assert!(matches!(Testbed::switched(1), Err(TestbedError::Size(1))));
        assert!(matches!(
            Testbed::switched(251),
            Err(TestbedError::Size(251))
        ));
    }
}
