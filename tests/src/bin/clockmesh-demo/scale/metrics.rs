//! What the bench reads besides its own timers: etcd's `/metrics`, a
//! process's CPU time and RSS under /proc, a UDP socket's drops, and
//! quantiles of the samples it took.

use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::TcpStream,
    time::Duration,
};

use anyhow::Context as _;
use serde::Serialize;

/// p50 / p99 / max of some samples (0 when there are none).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Quantiles {
    pub n: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Quantiles {
    pub fn of(mut v: Vec<f64>) -> Self {
        if v.is_empty() {
            return Quantiles::default();
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Quantiles {
            n: v.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: v[v.len() - 1],
        }
    }
}

/// CPU seconds (user + system) a process (`pid`) or one of its threads
/// (`/proc/<pid>/task/<tid>`) has used.
pub fn cpu_s(stat_path: &str) -> anyhow::Result<f64> {
    let stat =
        std::fs::read_to_string(stat_path).with_context(|| format!("reading {stat_path}"))?;
    // The command name may hold spaces: fields count from after its ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat; 12 and 13 after ')'.
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields.get(i).context("short stat")?.parse::<f64>()?)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((ticks(11)? + ticks(12)?) / hz)
}

/// Resident set size of process `pid`, MiB.
pub fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .context("no VmRSS")?;
    Ok(kb / 1024.0)
}

/// The current thread's CPU seconds.
pub fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// One scrape of etcd's `/metrics`: every sample summed by metric name,
/// and `grpc_server_handled_total` by method.
#[derive(Clone, Debug, Default)]
pub struct EtcdMetrics {
    pub by_name: BTreeMap<String, f64>,
    pub handled_by_method: BTreeMap<String, f64>,
}

impl EtcdMetrics {
    /// GET /metrics from the client endpoint (HTTP/1.0: the body arrives
    /// unchunked, then the connection closes).
    pub fn scrape(endpoint: &str) -> anyhow::Result<Self> {
        let mut s = TcpStream::connect(endpoint).context("connecting to etcd for /metrics")?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: etcd\r\n\r\n")?;
        let mut body = String::new();
        s.read_to_string(&mut body)?;
        Ok(Self::parse(&body))
    }

    fn parse(text: &str) -> Self {
        let mut m = EtcdMetrics::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            *m.by_name.entry(name.to_owned()).or_default() += value;
            if name == "grpc_server_handled_total"
                && let Some(method) = label(labels, "grpc_method")
            {
                *m.handled_by_method.entry(method.to_owned()).or_default() += value;
            }
        }
        m
    }

    pub fn get(&self, name: &str) -> f64 {
        self.by_name.get(name).copied().unwrap_or(0.0)
    }

    /// `after − before` of one metric.
    pub fn delta(before: &Self, after: &Self, name: &str) -> f64 {
        after.get(name) - before.get(name)
    }
}

fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
    let len = labels[start..].find('"')?;
    Some(&labels[start..start + len])
}

/// Kernel UDP counters of the whole host (`/proc/net/snmp`): `InErrors`
/// and `RcvbufErrors`.
pub fn udp_snmp() -> anyhow::Result<(u64, u64)> {
    let snmp = std::fs::read_to_string("/proc/net/snmp")?;
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let names: Vec<&str> = udp
        .next()
        .context("no Udp header")?
        .split_whitespace()
        .collect();
    let values: Vec<&str> = udp
        .next()
        .context("no Udp values")?
        .split_whitespace()
        .collect();
    let get = |n: &str| -> u64 {
        names
            .iter()
            .position(|x| *x == n)
            .and_then(|i| values.get(i))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok((get("InErrors"), get("RcvbufErrors")))
}

/// Datagrams the kernel dropped at the UDP socket bound to `addr`
/// (`/proc/net/udp`'s last column: this socket's receive-queue overflows).
pub fn udp_socket_drops(addr: std::net::SocketAddrV4) -> anyhow::Result<u64> {
    let want = format!(
        "{:08X}:{:04X}",
        u32::from_ne_bytes(addr.ip().octets()),
        addr.port()
    );
    let table = std::fs::read_to_string("/proc/net/udp")?;
    table
        .lines()
        .skip(1)
        .find(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|d| d.parse().ok())
        .with_context(|| format!("no socket {addr} in /proc/net/udp"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_sum_by_name_and_method() {
        let m = EtcdMetrics::parse(
            "# HELP x\nfoo 2\nfoo{a=\"b\"} 3\ngrpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Put\"} 7\n",
        );
        assert_eq!(m.get("foo"), 5.0);
        assert_eq!(m.handled_by_method["Put"], 7.0);
    }

    #[test]
    fn quantiles_of_nothing_are_zero() {
        assert_eq!(Quantiles::of(vec![]).n, 0);
        let q = Quantiles::of(vec![3.0, 1.0, 2.0]);
        assert_eq!((q.p50, q.max), (2.0, 3.0));
    }
}
