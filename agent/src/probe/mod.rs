//! Probe messages and sending.
//!
//! The 32-byte header (`clockmesh_common::ProbeHeader`) is what the eBPF
//! programs parse; its layout is in `docs/protocol.md`. A coded pair is two
//! probes with the same sequence number, `pair_index` 0 and 1, sent
//! `spacing` apart by the sender's clock.

/// The wire format, probe graph and pair assembly are pure and live in
/// `clockmesh-core`; this module adds the sending of coded pairs.
pub use clockmesh_core::{graph, pairs, wire};

use std::{
    io,
    net::{SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

pub use clockmesh_common::{PROBE_HEADER_LEN, ProbeHeader, header_is_valid};

/// Default UDP port every agent owns for probes (sends and receives on it).
pub const DEFAULT_PROBE_PORT: u16 = 31_900;
/// Default spacing between the two probes of a pair: the protocol
/// setting's (`clockmesh_core::setting::PACKET_SPACING_US`).
pub const DEFAULT_PACKET_SPACING: Duration = clockmesh_core::setting::PACKET_SPACING_US
    .default_value()
    .to_duration();
/// Probe datagram size: the header padded to a minimum-size Ethernet frame's
/// worth of payload, so probes look like the small packets they are.
pub const PROBE_DATAGRAM_LEN: usize = 64;

/// A probe datagram: header, zero padding to [`PROBE_DATAGRAM_LEN`].
pub fn encode_probe(header: &ProbeHeader) -> [u8; PROBE_DATAGRAM_LEN] {
    let mut datagram = [0u8; PROBE_DATAGRAM_LEN];
    datagram[..PROBE_HEADER_LEN].copy_from_slice(&header.to_bytes());
    datagram
}

/// Sends one coded pair from `sock` to `dst`; returns when each packet left
/// userspace. The spacing is kept by spinning: sleeps overshoot by tens of µs.
pub fn send_coded_pair(
    sock: &UdpSocket,
    dst: SocketAddr,
    sender: u32,
    receiver: u32,
    seq: u64,
    spacing: Duration,
) -> io::Result<[Instant; 2]> {
    let spacing_ns = u32::try_from(spacing.as_nanos()).unwrap_or(u32::MAX);
    let first = encode_probe(&ProbeHeader::probe(sender, receiver, seq, 0, spacing_ns));
    let second = encode_probe(&ProbeHeader::probe(sender, receiver, seq, 1, spacing_ns));
    let t0 = Instant::now();
    sock.send_to(&first, dst)?;
    while t0.elapsed() < spacing {
        std::hint::spin_loop();
    }
    let t1 = Instant::now();
    sock.send_to(&second, dst)?;
    Ok([t0, t1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_probe_parses_back() {
        let h = ProbeHeader::probe(1, 2, 3, 1, 100_000);
        let d = encode_probe(&h);
        assert_eq!(ProbeHeader::from_bytes(&d), Some(h));
        assert!(d[PROBE_HEADER_LEN..].iter().all(|&b| b == 0));
    }

    #[test]
    fn pair_is_spaced_at_least_as_asked() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let spacing = Duration::from_micros(200);
        let [t0, t1] = send_coded_pair(&tx, rx.local_addr().unwrap(), 1, 2, 9, spacing).unwrap();
        assert!(t1 - t0 >= spacing);
        let mut buf = [0u8; 128];
        for expected_index in [0, 1] {
            let (n, _) = rx.recv_from(&mut buf).unwrap();
            let h = ProbeHeader::from_bytes(&buf[..n]).unwrap();
            assert_eq!(
                (n, h.seq, h.pair_index),
                (PROBE_DATAGRAM_LEN, 9, expected_index)
            );
        }
    }
}
