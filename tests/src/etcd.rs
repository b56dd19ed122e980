//! A throwaway etcd server on loopback (Debian `etcd-server`), with its own
//! data directory, killed and removed on drop.

use crate::netns::Host;

use std::{
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

pub struct EtcdServer {
    child: Child,
    dir: PathBuf,
    /// Namespace etcd runs in (`None`: the caller's).
    netns: Option<String>,
    /// How to start it again on loopback: extra flags and ports.
    again: Option<(Vec<String>, u16, u16)>,
    pub endpoint: String,
}

/// Where etcd on `ip:client` keeps its data (kept across a restart).
fn data_dir(ip: &str, client: u16) -> PathBuf {
    std::env::temp_dir().join(format!(
        "clockmesh-etcd-{}-{ip}-{client}",
        std::process::id()
    ))
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl EtcdServer {
    /// Starts etcd on loopback and waits until it accepts clients (up to 20 s).
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(&[])
    }

    /// [`EtcdServer::start`] with extra command-line flags (e.g.
    /// `--quota-backend-bytes`, `--auto-compaction-retention`), for
    /// benches that measure etcd itself.
    pub fn start_with(extra: &[String]) -> anyhow::Result<Self> {
        let (client, peer) = (free_port()?, free_port()?);
        let _ = std::fs::remove_dir_all(data_dir("127.0.0.1", client));
        let mut cmd = Command::new("etcd");
        cmd.args(extra);
        let mut server = Self::launch(cmd, None, "127.0.0.1", client, peer)?;
        server.again = Some((extra.to_vec(), client, peer));
        Ok(server)
    }

    /// Kills etcd (SIGKILL, as a crashed or rescheduled member) and starts
    /// it again on its data and ports; waits until it accepts clients.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        let (extra, client, peer) = self
            .again
            .clone()
            .ok_or_else(|| anyhow::anyhow!("only a loopback etcd restarts"))?;
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut cmd = Command::new("etcd");
        cmd.args(&extra);
        let again = Self::launch(cmd, None, "127.0.0.1", client, peer)?;
        // The new process takes over; the old handle must not delete its data.
        let old = std::mem::replace(self, again);
        std::mem::forget(old);
        self.again = Some((extra, client, peer));
        Ok(())
    }

    /// The etcd process's pid (for its CPU time and RSS under /proc).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts etcd inside `host`'s network namespace, on its address (ports
    /// 2379/2380), for agents in other test hosts to reach.
    pub fn start_in(host: &Host) -> anyhow::Result<Self> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &host.netns, "etcd"]);
        let _ = std::fs::remove_dir_all(data_dir(&host.addr.to_string(), 2379));
        Self::launch(
            cmd,
            Some(host.netns.clone()),
            &host.addr.to_string(),
            2379,
            2380,
        )
    }

    fn launch(
        mut cmd: Command,
        netns: Option<String>,
        ip: &str,
        client: u16,
        peer: u16,
    ) -> anyhow::Result<Self> {
        let dir = data_dir(ip, client);
        let client_url = format!("http://{ip}:{client}");
        let peer_url = format!("http://{ip}:{peer}");
        let child = cmd
            .args(["--name", "clockmesh-test", "--data-dir"])
            .arg(&dir)
            .args([
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args(["--initial-cluster", &format!("clockmesh-test={peer_url}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting etcd (Debian package etcd-server): {e}"))?;
        let server = EtcdServer {
            child,
            dir,
            netns,
            again: None,
            endpoint: format!("{ip}:{client}"),
        };
        server.wait_ready()?;
        Ok(server)
    }
}

impl EtcdServer {
    /// Waits (up to 20 s) until etcd accepts TCP connections; probes from
    /// the namespace of its host when it runs in one.
    fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = if let Some(ns) = &self.netns {
                // A connect from inside the namespace (bash's /dev/tcp).
                let (ip, port) = self.endpoint.split_once(':').unwrap_or(("", ""));
                Command::new("ip")
                    .args(["netns", "exec", ns, "bash", "-c"])
                    .arg(format!("exec 3<>/dev/tcp/{ip}/{port}"))
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            } else {
                TcpStream::connect(&self.endpoint).is_ok()
            };
            if ok {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "etcd did not start within 20 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
