//! A throwaway etcd server on loopback (Debian `etcd-server`), with its own
//! data directory, killed and removed on drop.

use crate::netns::Host;

use std::{
    io::{Read as _, Write as _},
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

/// Fresh loopback ports [`EtcdServer::start_with`] tries.
const START_ATTEMPTS: usize = 4;

/// What a healthy etcd's `/health` answer holds.
const HEALTHY: &str = "\"health\":\"true\"";

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
    ///
    /// The ports are picked free and released until etcd binds them, so
    /// a test starting its own etcd at the same moment can take one first
    /// (one etcd exits, or the other's listener answers the probe): it
    /// starts again on fresh ports, up to [`START_ATTEMPTS`] times.
    pub fn start_with(extra: &[String]) -> anyhow::Result<Self> {
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            let (client, peer) = (free_port()?, free_port()?);
            let _ = std::fs::remove_dir_all(data_dir("127.0.0.1", client));
            let mut cmd = Command::new("etcd");
            cmd.args(extra);
            match Self::launch(cmd, None, "127.0.0.1", client, peer) {
                Ok(mut server) => {
                    server.again = Some((extra.to_vec(), client, peer));
                    return Ok(server);
                }
                Err(e) => failures.push(format!("ports {client}/{peer}: {e:#}")),
            }
        }
        anyhow::bail!("etcd did not start: {}", failures.join("; "))
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
        let mut server = EtcdServer {
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
    /// Waits (up to 20 s) until this etcd says it is healthy on its client
    /// URL (`GET /health`: it has a leader and serves); asks from the
    /// namespace of its host when it runs in one. An open port is not
    /// enough: it can be another etcd's (see [`EtcdServer::start_with`]).
    /// Fails at once if etcd exits.
    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!("etcd exited ({status}) before it was healthy");
            }
            if self.health().is_some_and(|h| h.contains(HEALTHY)) {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "etcd not healthy within 20 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// etcd's answer to `GET /health` on its client URL, if any.
    fn health(&self) -> Option<String> {
        let request = "GET /health HTTP/1.0\r\n\r\n";
        if let Some(ns) = &self.netns {
            // From inside the namespace (bash's /dev/tcp).
            let (ip, port) = self.endpoint.split_once(':')?;
            let script = format!(
                "exec 3<>/dev/tcp/{ip}/{port} && printf '{request}' >&3 && timeout 1 cat <&3"
            );
            let out = Command::new("ip")
                .args(["netns", "exec", ns, "bash", "-c", &script])
                .stderr(Stdio::null())
                .output()
                .ok()?;
            return Some(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let mut stream = TcpStream::connect(&self.endpoint).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        stream.write_all(request.as_bytes()).ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        Some(answer)
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
