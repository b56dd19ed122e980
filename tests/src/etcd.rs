//! A throwaway etcd server on loopback (Debian `etcd-server`), with its own
//! data directory, killed and removed on drop.

use std::{
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

pub struct EtcdServer {
    child: Child,
    dir: PathBuf,
    pub endpoint: String,
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl EtcdServer {
    /// Starts etcd and waits until it accepts clients (up to 20 s).
    pub fn start() -> anyhow::Result<Self> {
        let (client, peer) = (free_port()?, free_port()?);
        let dir =
            std::env::temp_dir().join(format!("clockmesh-etcd-{}-{client}", std::process::id()));
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
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
            endpoint: format!("127.0.0.1:{client}"),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(&server.endpoint).is_err() {
            anyhow::ensure!(Instant::now() < deadline, "etcd did not start within 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
