//! SO_TIMESTAMPING on the probe socket.
//!
//! TX: with `OPT_ID`, each datagram sent gets a per-socket counter; the kernel
//! queues its timestamps on the socket's error queue (`MSG_ERRQUEUE`), tagged
//! with that counter (`sock_extended_err.ee_data`). RX: timestamps arrive as
//! `SCM_TIMESTAMPING` control messages with the datagram. Index 0 is the
//! software stamp (CLOCK_REALTIME), index 2 the raw NIC stamp (PHC domain).
//!
//! This is the hardware-TX path where fentry is refused, and the cross-check
//! of the eBPF kernel stamps.

use std::{
    io::IoSliceMut,
    net::SocketAddr,
    os::fd::{AsFd, AsRawFd},
};

use nix::{
    errno::Errno,
    sys::{
        socket::{
            ControlMessageOwned, MsgFlags, SockaddrStorage, TimestampingFlag as F, Timestamps,
            recvmsg, setsockopt, sockopt::Timestamping,
        },
        time::TimeSpec,
    },
};

/// SO_EE_ORIGIN_TIMESTAMPING: the error-queue entry is a timestamp report.
const SO_EE_ORIGIN_TIMESTAMPING: u8 = 4;

/// Which stamps to ask the kernel for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StampMode {
    /// Kernel software stamps (any NIC).
    Software,
    /// Software plus NIC hardware stamps (the NIC must also be enabled with
    /// SIOCSHWTSTAMP, e.g. by ptp4l or `hwstamp_ctl`).
    Hardware,
}

/// Enables timestamping on `sock` (UDP, IPv4 or IPv6).
pub fn enable(sock: &impl AsFd, mode: StampMode) -> nix::Result<()> {
    setsockopt(sock, Timestamping, &tx_flags(mode))
}

/// Restarts the `OPT_ID` numbering: the next datagram sent is numbered 0.
///
/// A send that fails may or may not have used a number (a drop in
/// netfilter's OUTPUT hook or the qdisc has, a missing route has not),
/// so after one the sender's count and the kernel's can differ. The
/// kernel sets its counter to 0 when `OPT_ID` is switched on, so it is
/// switched off and on again.
pub fn restart_tx_ids(sock: &impl AsFd, mode: StampMode) -> nix::Result<()> {
    setsockopt(
        sock,
        Timestamping,
        &(tx_flags(mode) - F::SOF_TIMESTAMPING_OPT_ID),
    )?;
    enable(sock, mode)
}

/// RX and TX stamps, TX reports numbered (`OPT_ID`) without the packet.
fn tx_flags(mode: StampMode) -> F {
    let mut flags = F::SOF_TIMESTAMPING_SOFTWARE
        | F::SOF_TIMESTAMPING_RX_SOFTWARE
        | F::SOF_TIMESTAMPING_TX_SOFTWARE
        | F::SOF_TIMESTAMPING_OPT_ID
        | F::SOF_TIMESTAMPING_OPT_TSONLY;
    if mode == StampMode::Hardware {
        flags |= F::SOF_TIMESTAMPING_RAW_HARDWARE
            | F::SOF_TIMESTAMPING_RX_HARDWARE
            | F::SOF_TIMESTAMPING_TX_HARDWARE;
    }
    flags
}

/// Enables RX timestamps only: for a socket that also sends datagrams whose
/// TX stamps nobody reads (their reports would fill the error queue, which
/// shares the receive buffer, until received datagrams are dropped).
pub fn enable_rx(sock: &impl AsFd, mode: StampMode) -> nix::Result<()> {
    let mut flags = F::SOF_TIMESTAMPING_SOFTWARE | F::SOF_TIMESTAMPING_RX_SOFTWARE;
    if mode == StampMode::Hardware {
        flags |= F::SOF_TIMESTAMPING_RAW_HARDWARE | F::SOF_TIMESTAMPING_RX_HARDWARE;
    }
    setsockopt(sock, Timestamping, &flags)
}

/// Timestamps of one datagram; 0 means "not provided".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamps {
    /// Software stamp, CLOCK_REALTIME ns.
    pub software_ns: i64,
    /// Raw NIC stamp, PHC ns.
    pub hardware_ns: i64,
}

impl Stamps {
    fn from_scm(t: &Timestamps) -> Self {
        Stamps {
            software_ns: timespec_ns(&t.system),
            hardware_ns: timespec_ns(&t.hw_raw),
        }
    }
}

fn timespec_ns(t: &TimeSpec) -> i64 {
    t.tv_sec() * 1_000_000_000 + t.tv_nsec()
}

/// A TX timestamp report from the error queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxReport {
    /// `OPT_ID` counter: the n-th datagram sent on this socket (from 0).
    pub id: u32,
    /// SCM_TSTAMP_SND (0) for driver/NIC stamps, SCHED (1), ACK (2).
    pub tstype: u32,
    pub stamps: Stamps,
}

/// A received datagram and its RX stamps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RxDatagram {
    pub len: usize,
    pub from: Option<SocketAddr>,
    pub stamps: Stamps,
}

/// Space for SCM_TIMESTAMPING plus IP(V6)_RECVERR control messages.
fn cmsg_buffer() -> Vec<u8> {
    nix::cmsg_space!(Timestamps, libc::sock_extended_err, libc::sockaddr_in6)
}

/// Reads every TX report queued now (non-blocking); returns how many.
pub fn drain_tx_reports(sock: &impl AsFd, out: &mut Vec<TxReport>) -> nix::Result<usize> {
    let mut n = 0;
    loop {
        match read_one_tx_report(sock) {
            Ok(Some(r)) => {
                out.push(r);
                n += 1;
            }
            Ok(None) => continue, // not a timestamp report (e.g. ICMP error)
            Err(Errno::EAGAIN) => return Ok(n),
            Err(e) => return Err(e),
        }
    }
}

fn read_one_tx_report(sock: &impl AsFd) -> nix::Result<Option<TxReport>> {
    let mut data = [0u8; 64];
    let mut iov = [IoSliceMut::new(&mut data)];
    let mut cmsg = cmsg_buffer();
    let flags = MsgFlags::MSG_ERRQUEUE | MsgFlags::MSG_DONTWAIT;
    let msg =
        recvmsg::<SockaddrStorage>(sock.as_fd().as_raw_fd(), &mut iov, Some(&mut cmsg), flags)?;
    let mut stamps = None;
    let mut ee = None;
    for c in msg.cmsgs()? {
        match c {
            ControlMessageOwned::ScmTimestampsns(t) => stamps = Some(Stamps::from_scm(&t)),
            ControlMessageOwned::Ipv4RecvErr(e, _) | ControlMessageOwned::Ipv6RecvErr(e, _) => {
                ee = Some(e)
            }
            _ => {}
        }
    }
    Ok(match (stamps, ee) {
        (Some(stamps), Some(e)) if e.ee_origin == SO_EE_ORIGIN_TIMESTAMPING => Some(TxReport {
            id: e.ee_data,
            tstype: e.ee_info,
            stamps,
        }),
        _ => None,
    })
}

/// Receives one datagram into `buf` with its RX stamps (non-blocking:
/// `Err(EAGAIN)` when nothing is queued).
pub fn recv_stamped(sock: &impl AsFd, buf: &mut [u8]) -> nix::Result<RxDatagram> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut cmsg = cmsg_buffer();
    let msg = recvmsg::<SockaddrStorage>(
        sock.as_fd().as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_DONTWAIT,
    )?;
    let mut stamps = Stamps::default();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmTimestampsns(t) = c {
            stamps = Stamps::from_scm(&t);
        }
    }
    let from = msg.address.and_then(|a| storage_to_socket_addr(&a));
    Ok(RxDatagram {
        len: msg.bytes,
        from,
        stamps,
    })
}

/// Waits until the kernel stamps received packets. Enabling RX timestamping
/// flips a global static key through a deferred work item, so the first
/// packets after `enable` may arrive unstamped. Sends datagrams to itself on
/// loopback until one comes back stamped; `Ok(false)` if none did in time.
pub fn wait_for_rx_stamping(timeout: std::time::Duration) -> std::io::Result<bool> {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0")?;
    enable(&sock, StampMode::Software).map_err(std::io::Error::from)?;
    let me = sock.local_addr()?;
    let deadline = std::time::Instant::now() + timeout;
    let mut buf = [0u8; 16];
    while std::time::Instant::now() < deadline {
        sock.send_to(b"warm-up", me)?;
        std::thread::sleep(std::time::Duration::from_millis(1));
        while let Ok(d) = recv_stamped(&sock, &mut buf) {
            if d.stamps.software_ns != 0 {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

fn storage_to_socket_addr(a: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = a.as_sockaddr_in() {
        return Some(SocketAddr::V4((*v4).into()));
    }
    a.as_sockaddr_in6().map(|v6| SocketAddr::V6((*v6).into()))
}

#[cfg(test)]
mod tests {
    use std::{net::UdpSocket, thread, time::Duration};

    use super::*;

    fn recv_blocking(sock: &UdpSocket, buf: &mut [u8]) -> RxDatagram {
        for _ in 0..1000 {
            match recv_stamped(sock, buf) {
                Ok(d) => return d,
                Err(Errno::EAGAIN) => thread::sleep(Duration::from_millis(1)),
                Err(e) => panic!("recv: {e}"),
            }
        }
        panic!("no datagram within 1 s");
    }

    #[test]
    fn loopback_tx_and_rx_software_stamps() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        enable(&rx, StampMode::Software).unwrap();
        enable(&tx, StampMode::Software).unwrap();
        assert!(wait_for_rx_stamping(Duration::from_secs(2)).unwrap());
        for i in 0..3u8 {
            tx.send_to(&[i; 40], rx.local_addr().unwrap()).unwrap();
        }
        let mut buf = [0u8; 128];
        let mut previous = 0;
        for i in 0..3u8 {
            let d = recv_blocking(&rx, &mut buf);
            assert_eq!((d.len, buf[0]), (40, i));
            assert_eq!(d.from, Some(tx.local_addr().unwrap()));
            assert!(d.stamps.software_ns > previous, "{d:?}");
            assert_eq!(d.stamps.hardware_ns, 0, "loopback has no NIC clock");
            previous = d.stamps.software_ns;
        }
        let mut reports = Vec::new();
        for _ in 0..1000 {
            drain_tx_reports(&tx, &mut reports).unwrap();
            if reports.len() >= 3 {
                break;
            }
            thread::sleep(Duration::from_millis(1));
        }
        let ids: Vec<u32> = reports.iter().map(|r| r.id).collect();
        assert_eq!(ids, [0, 1, 2], "{reports:?}");
        assert!(
            reports
                .iter()
                .all(|r| r.stamps.software_ns > 0 && r.tstype == 0)
        );
    }

    /// Sends `n` datagrams to `to` and returns the ids of their TX reports.
    fn report_ids(tx: &UdpSocket, to: SocketAddr, n: usize) -> Vec<u32> {
        for _ in 0..n {
            tx.send_to(&[7; 16], to).unwrap();
        }
        let mut reports = Vec::new();
        for _ in 0..1000 {
            drain_tx_reports(tx, &mut reports).unwrap();
            if reports.len() >= n {
                break;
            }
            thread::sleep(Duration::from_millis(1));
        }
        reports.iter().map(|r| r.id).collect()
    }

    #[test]
    fn restarting_tx_ids_numbers_the_next_datagram_zero() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        enable(&tx, StampMode::Software).unwrap();
        assert_eq!(report_ids(&tx, to, 3), [0, 1, 2]);
        restart_tx_ids(&tx, StampMode::Software).unwrap();
        assert_eq!(report_ids(&tx, to, 2), [0, 1]);
        // Enabling again without the switch keeps counting.
        enable(&tx, StampMode::Software).unwrap();
        assert_eq!(report_ids(&tx, to, 1), [2]);
    }
}
