//! linuxptp's `ptp4l` beside chrony in `bench-chrony` and `bench-faults`:
//! what a user tuning PTP for sub-µs would run on hosts without PTP
//! hardware clocks, configured never to steer the clock.
//!
//! - Software timestamping (`time_stamping software`: veth has no PHC),
//!   UDPv4 (`-4`) **unicast** to the hosts' 198.18.0.0/15 addresses
//!   (`unicast_master_table`, `unicast_listen`, `inhibit_multicast_service`:
//!   no PTP message goes to a multicast group, and the benches' IP faults —
//!   the asymmetric route, the loss rules on UDP ports — act on it as they
//!   act on NTP; L2 frames would bypass the route).
//! - `free_running 1`: ptp4l measures its offset to the master and adjusts
//!   nothing (strace showed no `clock_adjtime`/`adjtimex`/`clock_settime`/
//!   `settimeofday` call; each bench also checks [`ClockUntouched`]).
//! - 16 Hz Sync and Delay_Req (`logSyncInterval -4`, the rate chrony polls
//!   at here), `freq_est_interval 0` and `summary_interval -4`: one `master
//!   offset` line per second, each the offset of the latest Sync (ptp4l
//!   prints it at the end of every frequency-estimation interval when
//!   free-running; 0, one second, is its shortest).
//!
//! The bridge: bench-faults' hosts meet on a Linux bridge of veths whose
//! switch namespace passes frames without netfilter (the testbed turns
//! `bridge-nf-call-iptables` off: it adds microseconds of jitter). A
//! bridged datagram keeps its sending socket (nothing on the way orphans
//! it: a veth crossing namespaces no longer does, and the bridge is no IP
//! hop), so the switch port's veth stamps it a second time, and every
//! event message ptp4l sends leaves a second software TX timestamp on its
//! socket's error queue (strace: one `recvmsg(MSG_ERRQUEUE)` read, `poll`
//! still `POLLERR`), which ptp4l 3.1.1 takes for a socket fault
//! ("unexpected socket error", port FAULTY) within ~30 ms of following or
//! serving a master. [`ptp_around_the_bridge`] sends ptp4l's datagrams
//! through the switch as clones, which carry no socket, and only those;
//! `--ptp-bridge-netfilter` (netfilter on in the switch namespace, whose
//! IP hooks orphan every bridged datagram) was the earlier way, for every
//! tool alike. On bench-chrony's one veth pair (no bridge) ptp4l runs as
//! is.
//!
//! The estimate at an instant is the latest `master offset` line before it,
//! while the port is a slave (`UNCALIBRATED`: a free-running servo never
//! locks, so ptp4l stays there), with its age. ptp4l's "master offset" is
//! slave − master; the benches' errors are corrections (reference − local,
//! as chrony's "System time" and clockmesh's global − local), so the error
//! is its negation. The hosts share one kernel clock: the truth is 0.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::Ipv4Addr,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clockmesh_testbed::{
    netns::{Host, Testbed},
    sh_in,
};

/// PTP's UDP ports (event and general messages), for the loss rules.
pub(crate) const PTP_PORTS: [u16; 2] = [319, 320];

/// A port state as ptp4l names it in its log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PortState {
    Initializing,
    Faulty,
    Disabled,
    Listening,
    PreMaster,
    Master,
    Passive,
    Uncalibrated,
    Slave,
    GrandMaster,
}

impl PortState {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "INITIALIZING" => Self::Initializing,
            "FAULTY" => Self::Faulty,
            "DISABLED" => Self::Disabled,
            "LISTENING" => Self::Listening,
            "PRE_MASTER" => Self::PreMaster,
            "MASTER" => Self::Master,
            "PASSIVE" => Self::Passive,
            "UNCALIBRATED" => Self::Uncalibrated,
            "SLAVE" => Self::Slave,
            "GRAND_MASTER" => Self::GrandMaster,
            _ => return None,
        })
    }

    /// Whether the port follows a master, so its offsets are estimates.
    fn follows_a_master(self) -> bool {
        matches!(self, Self::Uncalibrated | Self::Slave)
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Initializing => "initializing",
            Self::Faulty => "faulty",
            Self::Disabled => "disabled",
            Self::Listening => "listening",
            Self::PreMaster => "pre_master",
            Self::Master => "master",
            Self::Passive => "passive",
            Self::Uncalibrated => "uncalibrated",
            Self::Slave => "slave",
            Self::GrandMaster => "grand_master",
        }
    }
}

/// One `master offset` report.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct OffsetReport {
    /// ptp4l's CLOCK_MONOTONIC stamp of the line, s.
    pub(crate) at_s: f64,
    /// slave − master, ns.
    pub(crate) offset_ns: i64,
    pub(crate) freq_ppb: f64,
    pub(crate) path_delay_ns: i64,
}

/// What one line of ptp4l's log (`-m`) says, where the benches need it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum LogLine {
    Offset(OffsetReport),
    /// `port N: A to B on EVENT` (port 0 is the local management port).
    Port {
        at_s: f64,
        port: u16,
        to: PortState,
    },
    /// `assuming the grand master role`: the local clock is the timeline.
    GrandMaster {
        at_s: f64,
    },
}

/// Parses `ptp4l[1956.231]: master offset -128 s0 freq +384 path delay
/// 2413` and the state lines; anything else is `None`.
pub(crate) fn parse_line(line: &str) -> Option<LogLine> {
    let rest = line.trim().strip_prefix("ptp4l[")?;
    let (stamp, message) = rest.split_once("]: ")?;
    let at_s: f64 = stamp.parse().ok()?;
    if let Some(fields) = message.strip_prefix("master offset ") {
        return parse_offset(at_s, fields).map(LogLine::Offset);
    }
    if message.ends_with("assuming the grand master role") {
        return Some(LogLine::GrandMaster { at_s });
    }
    let (port, transition) = message.strip_prefix("port ")?.split_once(": ")?;
    let (_, to) = transition.split_once(" to ")?;
    let (to, _) = to.split_once(" on ")?;
    Some(LogLine::Port {
        at_s,
        port: port.parse().ok()?,
        to: PortState::parse(to)?,
    })
}

/// `-128 s0 freq +384 path delay 2413`.
fn parse_offset(at_s: f64, fields: &str) -> Option<OffsetReport> {
    let f: Vec<&str> = fields.split_whitespace().collect();
    let [offset, servo, "freq", freq, "path", "delay", delay] = f.as_slice() else {
        return None;
    };
    servo.strip_prefix('s')?.parse::<u8>().ok()?;
    Some(OffsetReport {
        at_s,
        offset_ns: offset.parse().ok()?,
        freq_ppb: freq.parse().ok()?,
        path_delay_ns: delay.parse().ok()?,
    })
}

/// What ptp4l's log has said so far: its port's state and the latest
/// offset reported since the port last began to follow a master.
#[derive(Clone, Copy, Debug, Default)]
struct Track {
    state: Option<PortState>,
    latest: Option<OffsetReport>,
}

impl Track {
    fn apply(&mut self, line: LogLine) {
        match line {
            LogLine::Offset(report) => self.latest = Some(report),
            LogLine::Port { port: 0, .. } => {}
            LogLine::Port { to, .. } => {
                // An offset measured against a master the port has left
                // is no answer (a new master starts a new series).
                if !to.follows_a_master() || !self.state.is_some_and(PortState::follows_a_master) {
                    self.latest = None;
                }
                self.state = Some(to);
            }
            LogLine::GrandMaster { .. } => {
                self.state = Some(PortState::GrandMaster);
                self.latest = None;
            }
        }
    }
}

/// ptp4l's answer at one instant.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum PtpReading {
    /// The latest offset reported while following a master.
    Offset {
        /// Correction (master − slave) = −"master offset", ns.
        error_ns: f64,
        /// How old the report is, s.
        age_s: f64,
        path_delay_ns: f64,
    },
    /// This host's ptp4l is the grand master: it serves its own clock and
    /// measures no offset.
    GrandMaster,
    /// No answer, and why (the port's state, or nothing reported yet).
    Unavailable(&'static str),
}

impl Track {
    fn reading(&self, now_s: f64) -> PtpReading {
        match (self.state, self.latest) {
            (Some(PortState::GrandMaster), _) => PtpReading::GrandMaster,
            (Some(s), Some(r)) if s.follows_a_master() => PtpReading::Offset {
                error_ns: -(r.offset_ns as f64),
                age_s: (now_s - r.at_s).max(0.0),
                path_delay_ns: r.path_delay_ns as f64,
            },
            (Some(s), _) if s.follows_a_master() => PtpReading::Unavailable("no offset yet"),
            (Some(s), _) => PtpReading::Unavailable(s.as_str()),
            (None, _) => PtpReading::Unavailable("starting"),
        }
    }
}

/// CLOCK_MONOTONIC in seconds, the clock of ptp4l's log stamps.
fn monotonic_s() -> f64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9)
        .unwrap_or(f64::NAN)
}

/// One host's place in the PTP domain.
pub(crate) struct PtpRole<'a> {
    /// Lower wins the best-master choice: host 0 is the preferred master.
    pub(crate) priority1: u8,
    /// Where to ask for unicast service (none: serve only).
    pub(crate) masters: &'a [Ipv4Addr],
    /// Never become a master (bench-chrony's client, like chrony's).
    pub(crate) slave_only: bool,
}

/// ptp4l's configuration for one host (see the module's comment).
pub(crate) fn conf(dir: &Path, name: &str, iface: &str, role: &PtpRole) -> String {
    let mut c = format!(
        "# clockmesh bench: software stamps, UDPv4 unicast, 16 Hz; free_running: never steers the clock\n\
         [global]\n\
         free_running 1\n\
         time_stamping software\n\
         network_transport UDPv4\n\
         priority1 {priority1}\n\
         slaveOnly {slave_only}\n\
         logSyncInterval -4\n\
         logMinDelayReqInterval -4\n\
         logAnnounceInterval 0\n\
         tx_timestamp_timeout 10\n\
         fault_reset_interval ASAP\n\
         freq_est_interval 0\n\
         summary_interval -4\n\
         unicast_listen 1\n\
         inhibit_multicast_service 1\n\
         uds_address {uds}\n",
        priority1 = role.priority1,
        slave_only = u8::from(role.slave_only),
        uds = dir.join(format!("{name}.uds")).display(),
    );
    if !role.masters.is_empty() {
        c.push_str("[unicast_master_table]\ntable_id 1\nlogQueryInterval 0\n");
        for m in role.masters {
            c.push_str(&format!("UDPv4 {m}\n"));
        }
    }
    c.push_str(&format!("[{iface}]\n"));
    if !role.masters.is_empty() {
        c.push_str("unicast_master_table 1\n");
    }
    c
}

/// A running `ptp4l` in one host's namespace; its log is read on a thread
/// of its own (and copied to `<name>.log`). Killed on drop.
pub(crate) struct Ptp4l {
    child: Child,
    track: Arc<Mutex<Track>>,
}

impl Ptp4l {
    pub(crate) fn start(
        host: &Host,
        dir: &Path,
        name: &str,
        role: &PtpRole,
    ) -> anyhow::Result<Self> {
        let conf_path = dir.join(format!("{name}.conf"));
        std::fs::write(&conf_path, conf(dir, name, host.iface, role))?;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &host.netns, "ptp4l", "-m", "-q", "-f"])
            .arg(&conf_path)
            .args(["-i", host.iface])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting ptp4l")?;
        let track = Arc::new(Mutex::new(Track::default()));
        let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        {
            let track = track.clone();
            thread::spawn(move || follow(stdout, stderr, log, &track));
        }
        let ptp = Ptp4l { child, track };
        ptp.wait_started(name, dir)?;
        Ok(ptp)
    }

    /// Until the port leaves INITIALIZING; fails if ptp4l exits first.
    fn wait_started(&self, name: &str, dir: &Path) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let state = self.lock().state;
            if state.is_some_and(|s| s != PortState::Initializing) {
                return Ok(());
            }
            if !process_alive(self.child.id()) || Instant::now() > deadline {
                bail!(
                    "ptp4l ({name}) did not start; see {}",
                    dir.join(format!("{name}.log")).display()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Track> {
        self.track.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A handle the sampler can read after this is moved or dropped.
    pub(crate) fn reader(&self) -> PtpReader {
        PtpReader(self.track.clone())
    }

    /// `ip netns exec` execs ptp4l: the child's pid is ptp4l's.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, as the benches kill an agent.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Ptp4l {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads one ptp4l's answers (its log as followed so far).
#[derive(Clone)]
pub(crate) struct PtpReader(Arc<Mutex<Track>>);

impl PtpReader {
    pub(crate) fn reading(&self) -> PtpReading {
        let track = *self.0.lock().unwrap_or_else(|e| e.into_inner());
        track.reading(monotonic_s())
    }
}

fn process_alive(pid: u32) -> bool {
    // A zombie (exited, not yet waited for) has state Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Follows ptp4l's stdout into `track`, copying both streams to `log`.
fn follow(
    stdout: Option<std::process::ChildStdout>,
    stderr: Option<std::process::ChildStderr>,
    log: std::fs::File,
    track: &Mutex<Track>,
) {
    let log = Arc::new(Mutex::new(log));
    if let Some(err) = stderr {
        let log = log.clone();
        thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = writeln!(log.lock().unwrap_or_else(|e| e.into_inner()), "{line}");
            }
        });
    }
    let Some(out) = stdout else { return };
    for line in BufReader::new(out).lines().map_while(Result::ok) {
        if let Some(parsed) = parse_line(&line) {
            track
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .apply(parsed);
        }
        let _ = writeln!(log.lock().unwrap_or_else(|e| e.into_inner()), "{line}");
    }
}

/// ptp4l on both hosts of bench-chrony's pair: master in host 0, a
/// slave-only client in host 1 (as chrony's server and client).
pub(crate) fn start_pair(master: &Host, client: &Host, dir: &Path) -> anyhow::Result<[Ptp4l; 2]> {
    std::fs::create_dir_all(dir)?;
    let serve = PtpRole {
        priority1: 1,
        masters: &[],
        slave_only: false,
    };
    let follow = PtpRole {
        priority1: 128,
        masters: &[master.addr],
        slave_only: true,
    };
    Ok([
        Ptp4l::start(master, dir, "master", &serve)?,
        Ptp4l::start(client, dir, "client", &follow)?,
    ])
}

/// ptp4l's answers at bench-chrony's instants: |error|, the reports' ages.
#[derive(Default)]
pub(crate) struct PtpSamples {
    pub(crate) errors: Vec<f64>,
    pub(crate) ages_s: Vec<f64>,
    pub(crate) unavailable: usize,
}

impl PtpSamples {
    pub(crate) fn take(&mut self, reading: PtpReading) {
        match reading {
            PtpReading::Offset {
                error_ns, age_s, ..
            } => {
                self.errors.push(error_ns.abs());
                self.ages_s.push(age_s);
            }
            // The client is slave-only: it never serves the timeline.
            PtpReading::GrandMaster | PtpReading::Unavailable(_) => self.unavailable += 1,
        }
    }
}

/// Both processes' CPU seconds so far.
pub(crate) fn cpu_seconds(ptp: &[Ptp4l]) -> f64 {
    ptp.iter()
        .filter_map(|p| clockmesh_testbed::cluster::process_cpu_seconds(p.pid()))
        .sum()
}

/// Where the switch namespace puts the PTP frames it takes off the bridge
/// (a veth pair of its own, up, with no address: frames for other MACs
/// end there).
const PTP_SINK: [&str; 2] = ["ptpsink0", "ptpsink1"];

/// PTP datagrams around the bridge, each as a copy without its sending
/// socket (see "The bridge" above), so that the switch port's veth does
/// not stamp it a second time: at each port's ingress, a UDP datagram to
/// a PTP port and to another host's MAC is mirrored (a clone, which has
/// no socket) straight out of that host's port, and the original is
/// redirected into [`PTP_SINK`]. Only ptp4l's frames take this path;
/// frames to the switch's own MAC (the asymmetric route's IP hop, which
/// orphans them anyway) and every other tool's pass the bridge as before,
/// and the hosts' loss rules and a link down act on them as on the rest.
/// `tc` u32 and mirred: this kernel has no flower, matchall or gact.
pub(crate) fn ptp_around_the_bridge(bed: &Testbed) -> anyhow::Result<()> {
    let sw = bed.switch_host().context("no switch namespace")?;
    let in_switch = |argv: &[&str]| sh_in(&sw.netns, argv);
    let sink = format!(
        "link add {} type veth peer name {}",
        PTP_SINK[0], PTP_SINK[1]
    );
    in_switch(&words("ip", &sink))?;
    for sink in PTP_SINK {
        in_switch(&["ip", "link", "set", sink, "up"])?;
    }
    let ports: Vec<(String, String)> = (0..bed.hosts().len())
        .map(|i| {
            let port = bed.switch_port(i).context("no switch port")?;
            Ok((port, host_mac(bed.host(i))?))
        })
        .collect::<anyhow::Result<_>>()?;
    for (from, _) in &ports {
        in_switch(&["tc", "qdisc", "add", "dev", from, "clsact"])?;
        for (to, mac) in ports.iter().filter(|(to, _)| to != from) {
            for port in PTP_PORTS {
                let filter = format!(
                    "filter add dev {from} ingress protocol ip u32 \
                     match ip protocol 17 0xff match ip dport {port} 0xffff match ether dst {mac} \
                     action mirred egress mirror dev {to} pipe \
                     action mirred ingress redirect dev {sink}",
                    sink = PTP_SINK[0],
                );
                in_switch(&words("tc", &filter))
                    .context("steering PTP around the bridge (tc u32, mirred)")?;
            }
        }
    }
    Ok(())
}

/// `program` and the words of `args`.
fn words<'a>(program: &'a str, args: &'a str) -> Vec<&'a str> {
    std::iter::once(program)
        .chain(args.split_whitespace())
        .collect()
}

/// The MAC address of `host`'s interface.
fn host_mac(host: &Host) -> anyhow::Result<String> {
    let path = format!("/sys/class/net/{}/address", host.iface);
    let mac = sh_in(&host.netns, &["cat", &path])?;
    Ok(mac.trim().to_string())
}

/// Bridged IPv4 through netfilter in the switch namespace (see "The
/// bridge" above); every tool's datagrams take that path.
pub(crate) fn bridge_netfilter_on(switch: &Host) -> anyhow::Result<()> {
    let on = "net.bridge.bridge-nf-call-iptables=1";
    sh_in(&switch.netns, &["sysctl", "-qw", on])
        .context("turning bridge-nf-call-iptables on in the switch namespace")?;
    Ok(())
}

/// The kernel clock's discipline (`adjtimex` read-only) and CLOCK_REALTIME −
/// CLOCK_MONOTONIC, taken before a bench and compared after it: any
/// frequency, offset, tick or status change, or a step, means something
/// steered the clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ClockUntouched {
    freq: i64,
    offset: i64,
    tick: i64,
    status: i32,
    realtime_minus_monotonic_ns: i128,
}

/// A step shows as a jump of REALTIME − MONOTONIC; both advance together
/// otherwise (a frequency change slews both).
const STEP_TOLERANCE_NS: i128 = 1_000_000;

impl ClockUntouched {
    pub(crate) fn take() -> anyhow::Result<Self> {
        let tx = read_adjtimex()?;
        Ok(ClockUntouched {
            freq: tx.freq as i64,
            offset: tx.offset as i64,
            tick: tx.tick as i64,
            status: tx.status,
            realtime_minus_monotonic_ns: realtime_minus_monotonic_ns(),
        })
    }

    /// Fails, naming what changed, if the clock was steered since `self`.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        let now = Self::take()?;
        let step = now.realtime_minus_monotonic_ns - self.realtime_minus_monotonic_ns;
        let same_discipline = (self.freq, self.offset, self.tick, self.status)
            == (now.freq, now.offset, now.tick, now.status);
        if !same_discipline || step.abs() > STEP_TOLERANCE_NS {
            bail!(
                "the system clock was steered during the bench (ptp4l must be free_running, \
                 chronyd -x): before {self:?}, after {now:?}, step {step} ns"
            );
        }
        Ok(())
    }
}

fn read_adjtimex() -> anyhow::Result<libc::timex> {
    // SAFETY: `timex` is plain data (all-zero is valid); modes 0 makes
    // adjtimex only read the kernel's clock discipline into it.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    tx.modes = 0;
    // SAFETY: `tx` is a valid, exclusively borrowed timex for the call.
    if unsafe { libc::adjtimex(&mut tx) } < 0 {
        bail!("adjtimex (read only): {}", std::io::Error::last_os_error());
    }
    Ok(tx)
}

fn realtime_minus_monotonic_ns() -> i128 {
    let ns = |id| {
        nix::time::clock_gettime(id)
            .map(|t| t.tv_sec() as i128 * 1_000_000_000 + t.tv_nsec() as i128)
            .unwrap_or(0)
    };
    ns(nix::time::ClockId::CLOCK_REALTIME) - ns(nix::time::ClockId::CLOCK_MONOTONIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ptp4l on two hosts of the test bridge, netfilter off as bench-faults
    /// runs it: with its datagrams around the bridge the client follows
    /// the master and reports offsets, and neither port reports the socket
    /// error a second TX timestamp causes (without the steering, no offset
    /// at all: docs/agent-tradeoff.md, "ptp4l through the faults").
    #[test]
    fn ptp4l_follows_its_master_across_the_test_bridge() {
        if !clockmesh_testbed::root_or_skip("ptp4l_follows_its_master_across_the_test_bridge") {
            return;
        }
        let bed = Testbed::switched(2).expect("testbed");
        ptp_around_the_bridge(&bed).expect("steering");
        let dir = std::env::temp_dir().join(format!("clockmesh-ptp-bridge-{}", std::process::id()));
        let pair = start_pair(bed.host(0), bed.host(1), &dir).expect("ptp4l");
        let client = pair[1].reader();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut reading = client.reading();
        while !matches!(reading, PtpReading::Offset { .. }) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(200));
            reading = client.reading();
        }
        drop(pair);
        let logs = ["master", "client"].map(|name| {
            std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
        });
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            matches!(reading, PtpReading::Offset { .. }),
            "no offset in 20 s: {reading:?}\n{}",
            logs.join("\n")
        );
        for log in logs {
            assert!(!log.contains("socket error"), "{log}");
        }
    }

    #[test]
    fn offset_lines_give_slave_minus_master_delay_and_stamp() {
        let line = "ptp4l[1956.231]: master offset       -128 s0 freq    +384 path delay      2413";
        assert_eq!(
            parse_line(line),
            Some(LogLine::Offset(OffsetReport {
                at_s: 1956.231,
                offset_ns: -128,
                freq_ppb: 384.0,
                path_delay_ns: 2413,
            }))
        );
        let big =
            parse_line("ptp4l[1957.234]: master offset     608008 s2 freq -607384 path delay 2490");
        assert!(
            matches!(big, Some(LogLine::Offset(r)) if r.offset_ns == 608_008 && r.freq_ppb == -607_384.0)
        );
        // A summary line (summary_interval above the sync interval) is not an offset.
        assert_eq!(
            parse_line("ptp4l[10.0]: rms  123 max  456 freq   +12 +/-   3 delay  2000 +/-  10"),
            None
        );
        assert_eq!(
            parse_line("ptp4l[x]: master offset 1 s0 freq 0 path delay 1"),
            None
        );
        assert_eq!(parse_line("master offset 1 s0 freq 0 path delay 1"), None);
    }

    #[test]
    fn state_lines_name_the_port_and_its_new_state() {
        assert_eq!(
            parse_line("ptp4l[1955.213]: port 1: MASTER to UNCALIBRATED on RS_SLAVE"),
            Some(LogLine::Port {
                at_s: 1955.213,
                port: 1,
                to: PortState::Uncalibrated
            })
        );
        assert_eq!(
            parse_line(
                "ptp4l[3.5]: port 1: UNCALIBRATED to FAULTY on FAULT_DETECTED (FT_UNSPECIFIED)"
            ),
            Some(LogLine::Port {
                at_s: 3.5,
                port: 1,
                to: PortState::Faulty
            })
        );
        assert_eq!(
            parse_line("ptp4l[1954.680]: port 1: assuming the grand master role"),
            Some(LogLine::GrandMaster { at_s: 1954.680 })
        );
        assert_eq!(
            parse_line("ptp4l[1.0]: selected best master clock fa0b84.fffe.3b7811"),
            None
        );
    }

    /// The answer is the latest offset while the port follows a master,
    /// negated into a correction, with its age; none once it stops.
    #[test]
    fn the_answer_is_the_latest_offset_while_following_a_master() {
        let mut t = Track::default();
        let feed = |t: &mut Track, line: &str| t.apply(parse_line(line).expect(line));
        assert_eq!(t.reading(1.0), PtpReading::Unavailable("starting"));
        feed(
            &mut t,
            "ptp4l[1.0]: port 1: INITIALIZING to LISTENING on INIT_COMPLETE",
        );
        assert_eq!(t.reading(1.0), PtpReading::Unavailable("listening"));
        feed(
            &mut t,
            "ptp4l[2.0]: port 1: LISTENING to UNCALIBRATED on RS_SLAVE",
        );
        assert_eq!(t.reading(2.0), PtpReading::Unavailable("no offset yet"));
        feed(
            &mut t,
            "ptp4l[3.0]: master offset 250 s0 freq +1 path delay 2000",
        );
        feed(
            &mut t,
            "ptp4l[4.0]: master offset -40 s0 freq +1 path delay 1900",
        );
        feed(
            &mut t,
            "ptp4l[4.1]: port 0: INITIALIZING to LISTENING on INIT_COMPLETE",
        );
        assert_eq!(
            t.reading(4.5),
            PtpReading::Offset {
                error_ns: 40.0,
                age_s: 0.5,
                path_delay_ns: 1900.0
            }
        );
        feed(
            &mut t,
            "ptp4l[5.0]: port 1: UNCALIBRATED to FAULTY on FAULT_DETECTED (FT_UNSPECIFIED)",
        );
        assert_eq!(t.reading(5.0), PtpReading::Unavailable("faulty"));
        feed(
            &mut t,
            "ptp4l[9.0]: port 1: FAULTY to LISTENING on INIT_COMPLETE",
        );
        feed(
            &mut t,
            "ptp4l[9.5]: port 1: LISTENING to UNCALIBRATED on RS_SLAVE",
        );
        assert_eq!(
            t.reading(9.5),
            PtpReading::Unavailable("no offset yet"),
            "no offset from before the fault"
        );
        feed(
            &mut t,
            "ptp4l[12.0]: port 1: UNCALIBRATED to MASTER on ANNOUNCE_RECEIPT_TIMEOUT_EXPIRES",
        );
        feed(
            &mut t,
            "ptp4l[12.0]: port 1: assuming the grand master role",
        );
        assert_eq!(t.reading(12.0), PtpReading::GrandMaster);
    }
}
