//! Load for the benchmarks: both cores busy and UDP cross-traffic between
//! test hosts, until dropped.

use std::{
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use crate::netns::Host;

/// One flow of cross-traffic: 1,200-byte datagrams from `from` to `to`,
/// `per_10ms` of them every 10 ms; `drain` binds a receiver at `to` (else
/// nobody listens and the receiver's kernel answers ICMP).
pub struct Flow {
    pub from: Host,
    pub to: (Ipv4Addr, u16),
    pub per_10ms: u32,
    pub drain: Option<Host>,
}

pub struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Load {
    /// Two busy threads (one per core of the development VM) and `flows`.
    pub fn start(flows: Vec<Flow>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for _ in 0..2 {
            let stop = stop.clone();
            threads.push(thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            }));
        }
        for flow in flows {
            let to = SocketAddr::from(flow.to);
            if let Some(host) = flow.drain {
                let stop = stop.clone();
                threads.push(thread::spawn(move || {
                    let _ = host.run(move || drain(to, &stop));
                }));
            }
            let stop = stop.clone();
            threads.push(thread::spawn(move || {
                let _ = flow.from.run(move || blast(to, flow.per_10ms, &stop));
            }));
        }
        Load { stop, threads }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn blast(to: SocketAddr, per_10ms: u32, stop: &AtomicBool) {
    let Ok(sock) = UdpSocket::bind("0.0.0.0:0") else {
        return;
    };
    let buf = [0x5au8; 1200];
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..per_10ms {
            let _ = sock.send_to(&buf, to);
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn drain(at: SocketAddr, stop: &AtomicBool) {
    let Ok(sock) = UdpSocket::bind(at) else {
        return;
    };
    let _ = sock.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        let _ = sock.recv_from(&mut buf);
    }
}
