//! eBPF capture on real network namespaces (needs root; see `root_or_skip`).
//!
//! Each test uses its own probe port: the tracing programs are global, so a
//! port of its own keeps a test's counters free of its neighbours' packets.

use std::{net::UdpSocket, time::Duration};

use aya::programs::{SchedClassifier, TcAttachType, TestRun, TestRunOptions};
use clockmesh::{
    capture::{Capture, CaptureConfig, CaptureError, TxStampSource, loader},
    probe::{self, ProbeHeader},
};
use clockmesh_common::{kind, point};
use clockmesh_testbed::{
    exchange::{self, ExchangeConfig, HostRecord},
    netns::Testbed,
    root_or_skip,
};

/// A current-thread runtime: namespace membership is per thread, so capture
/// and its ring buffer stay on the thread that entered the namespace.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn exchange_on_pair(cfg: &ExchangeConfig) -> [HostRecord; 2] {
    let bed = Testbed::pair().expect("testbed");
    exchange::run(&bed, cfg).expect("exchange")
}

/// Every probe sent yields exactly one event per point at each end.
fn assert_one_event_per_point(tx: &HostRecord, rx: &HostRecord, pairs: u64) {
    for seq in 0..pairs {
        for idx in [0, 1] {
            for (host, pt) in [
                (tx, point::TC_EGRESS),
                (tx, point::TP_XMIT),
                (rx, point::TC_INGRESS),
                (rx, point::TP_RECEIVE),
            ] {
                let n = exchange::find(&host.events, pt, tx.node, seq, idx).count();
                assert_eq!(
                    n, 1,
                    "node {} point {pt} probe {seq}/{idx}: {n} events",
                    host.node
                );
            }
        }
    }
}

#[test]
fn probes_both_ways_yield_exactly_one_event_per_point_and_sane_delays() {
    if !root_or_skip("probes_both_ways") {
        return;
    }
    let cfg = ExchangeConfig {
        pairs: 40,
        port: 31_901,
        noise_port: Some(31_999),
        ..ExchangeConfig::default()
    };
    let [a, b] = exchange_on_pair(&cfg);
    assert_one_event_per_point(&a, &b, cfg.pairs);
    assert_one_event_per_point(&b, &a, cfg.pairs);
    // Only probes produce events: 2 probes × 2 points × 2 directions per pair.
    for host in [&a, &b] {
        assert_eq!(
            host.events.len() as u64,
            cfg.pairs * 8,
            "node {}",
            host.node
        );
        assert!(
            host.events
                .iter()
                .all(|e| e.kind == kind::PROBE && e.dst_port == cfg.port)
        );
        assert!(
            host.counters.skipped > 0,
            "noise was not seen: {:?}",
            host.counters
        );
        assert_eq!(host.counters.ringbuf_full, 0);
        assert_eq!(host.counters.malformed, 0);
    }
    for (tx, rx) in [(&a, &b), (&b, &a)] {
        for (tp, rp) in [
            (point::TC_EGRESS, point::TC_INGRESS),
            (point::TP_XMIT, point::TP_RECEIVE),
        ] {
            let d = exchange::one_way_delays(tx, rx, tp, rp);
            assert_eq!(d.len() as u64, cfg.pairs * 2);
            // Both hosts read one clock, so a delay is the real one: never
            // negative, typically tens of µs over veth. A busy 2-core CI
            // machine can preempt a single datagram for milliseconds, so the
            // typical (median) delay is what must be small; a wrong clock base
            // or a mismatched point would be off by seconds for every sample.
            assert!(
                d.iter().all(|&ns| ns > 0 && ns < 100_000_000),
                "{tp}->{rp}: {d:?}"
            );
            let median = exchange::summarize(&d).expect("delays").median;
            assert!(
                median < 1_000_000,
                "{tp}->{rp}: median {median} ns of {d:?}"
            );
        }
    }
}

#[test]
fn ebpf_stamps_agree_with_so_timestamping() {
    if !root_or_skip("ebpf_stamps_agree") {
        return;
    }
    let cfg = ExchangeConfig {
        pairs: 40,
        port: 31_902,
        ..ExchangeConfig::default()
    };
    let [a, b] = exchange_on_pair(&cfg);
    for (tx, rx) in [(&a, &b), (&b, &a)] {
        // RX: tc ingress reads the same skb->tstamp the socket reports.
        for (h, d) in rx.received.iter().filter(|(h, _)| h.sender == tx.node) {
            assert_ne!(
                d.stamps.software_ns, 0,
                "RX stamping active for probe {h:?}"
            );
            let ev = exchange::find(&rx.events, point::TC_INGRESS, h.sender, h.seq, h.pair_index)
                .next()
                .expect("ingress event");
            assert_eq!(ev.skb_tstamp_ns as i64, d.stamps.software_ns, "probe {h:?}");
        }
        // TX: the driver's software stamp follows net_dev_start_xmit closely.
        // Both run in one softirq-disabled section, but a hypervisor can
        // still steal the vCPU between them on a busy machine: nearly all
        // stamps must be close, none may be far.
        let mut checked = 0;
        let mut not_close = Vec::new();
        for r in &tx.tx_reports {
            let (seq, idx) = exchange::probe_of_tx_report(r.id);
            let ev = exchange::find(&tx.events, point::TP_XMIT, tx.node, seq, idx)
                .next()
                .expect("xmit event");
            let xmit_realtime = tx.mono_to_realtime.apply(ev.ktime_ns as i64);
            let diff = r.stamps.software_ns - xmit_realtime;
            let close = 100_000 + tx.mono_to_realtime.bound_ns;
            assert!(
                diff.abs() < 100 * close,
                "TX stamp {diff} ns from net_dev_start_xmit"
            );
            if diff.abs() >= close {
                not_close.push(diff);
            }
            checked += 1;
        }
        assert_eq!(checked as u64, cfg.pairs * 2, "every probe has a TX report");
        assert!(
            not_close.len() * 20 <= checked,
            "TX stamps more than 100 µs from net_dev_start_xmit: {not_close:?}"
        );
    }
}

/// Ethernet + IPv4 + UDP frame carrying `payload` to `port`.
fn udp_frame(port: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 14];
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let total = (20 + 8 + payload.len()) as u16;
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&[198, 18, 0, 1]);
    ip[16..20].copy_from_slice(&[198, 18, 0, 2]);
    f.extend(ip);
    f.extend(40_000u16.to_be_bytes());
    f.extend(port.to_be_bytes());
    f.extend((8 + payload.len() as u16).to_be_bytes());
    f.extend([0, 0]);
    f.extend(payload);
    f
}

/// `__sk_buff` bytes with `tstamp` (offset 152) and `hwtstamp` (offset 184) set.
fn skb_context(tstamp: u64, hwtstamp: u64) -> Vec<u8> {
    let mut ctx = vec![0u8; 192];
    ctx[152..160].copy_from_slice(&tstamp.to_le_bytes());
    ctx[184..192].copy_from_slice(&hwtstamp.to_le_bytes());
    ctx
}

#[test]
fn test_run_carries_injected_hw_and_sw_timestamps() {
    if !root_or_skip("test_run_injection") {
        return;
    }
    let bed = Testbed::pair().unwrap();
    let port = 31_903;
    let events = bed
        .host(0)
        .run(move || {
            let rt = runtime();
            let _g = rt.enter();
            let mut cfg = CaptureConfig::new("eth0", port..=port);
            cfg.tracepoints = false;
            let mut cap = Capture::attach(&cfg).unwrap();
            let frame = udp_frame(
                port,
                &probe::encode_probe(&ProbeHeader::probe(5, 6, 77, 1, 100)),
            );
            let ctx = skb_context(1_700_000_000_123_456_789, 42_000_000_007);
            let prog = cap.classifier(loader::PROG_TC_INGRESS).unwrap();
            let opts = TestRunOptions {
                data_in: Some(&frame),
                ctx_in: Some(&ctx),
                ..TestRunOptions::default()
            };
            prog.test_run(opts).expect("BPF_PROG_TEST_RUN");
            let mut out = Vec::new();
            cap.poll_events(&mut out);
            out
        })
        .unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = events[0];
    assert_eq!((e.sender, e.receiver, e.seq, e.pair_index), (5, 6, 77, 1));
    assert_eq!(e.point, point::TC_INGRESS);
    assert_eq!(
        e.hw_tstamp_ns, 42_000_000_007,
        "NIC RX stamp carried through"
    );
    assert_eq!(
        e.skb_tstamp_ns, 1_700_000_000_123_456_789,
        "skb tstamp carried through"
    );
}

#[test]
fn malformed_packets_on_the_probe_port_make_no_event_but_count() {
    if !root_or_skip("malformed_packets") {
        return;
    }
    let bed = Testbed::pair().unwrap();
    let port = 31_904;
    let dst = std::net::SocketAddr::new(bed.host(1).addr.into(), port);
    let receiver = bed.host(1).clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let capture = receiver.spawn(move || {
        let rt = runtime();
        let _g = rt.enter();
        let mut cfg = CaptureConfig::new("eth0", port..=port);
        cfg.tracepoints = false;
        let mut cap = Capture::attach(&cfg).unwrap();
        let _sink = UdpSocket::bind(dst).unwrap();
        ready_tx.send(()).unwrap();
        done_rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let mut out = Vec::new();
        cap.poll_events(&mut out);
        (out, cap.counters().unwrap())
    });
    ready_rx.recv().unwrap();
    let good = probe::encode_probe(&ProbeHeader::probe(1, 2, 3, 0, 100));
    let mut wrong_magic = good;
    wrong_magic[0] = b'X';
    let mut wrong_version = good;
    wrong_version[4] = 99;
    let mut bad_pair_index = good;
    bad_pair_index[6] = 7;
    let mut oversized = vec![0u8; 1200];
    oversized[..good.len()].copy_from_slice(&good);
    let malformed: Vec<Vec<u8>> = vec![
        good[..10].to_vec(),
        Vec::new(),
        wrong_magic.to_vec(),
        wrong_version.to_vec(),
        bad_pair_index.to_vec(),
        oversized,
    ];
    bed.host(0)
        .run(move || {
            let s = UdpSocket::bind("198.18.0.1:0").unwrap();
            for m in &malformed {
                s.send_to(m, dst).unwrap();
            }
        })
        .unwrap();
    done_tx.send(()).unwrap();
    let (events, counters) = capture.join().unwrap().unwrap();
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(counters.malformed, 6, "{counters:?}");
    assert_eq!(counters.emitted, 0);
}

#[test]
fn clear_errors_for_missing_interface_btf_and_privileges() {
    if !root_or_skip("clear_errors") {
        return;
    }
    let rt = runtime();
    let _g = rt.enter();
    let err = Capture::attach(&CaptureConfig::new("nosuch0", 1000..=1000))
        .err()
        .unwrap();
    assert!(matches!(err, CaptureError::NoSuchInterface(_)), "{err}");
    assert!(
        err.to_string().contains("\"nosuch0\" does not exist"),
        "{err}"
    );

    let mut cfg = CaptureConfig::new("lo", 1000..=1000);
    cfg.btf_path = "/nonexistent/vmlinux".into();
    let err = Capture::attach(&cfg).err().unwrap();
    assert!(matches!(err, CaptureError::NoBtf { .. }), "{err}");

    // Drop root in one thread only: raw setresuid is per thread on Linux
    // (glibc's wrapper would change the whole process).
    let msg = std::thread::spawn(|| {
        // SAFETY: plain syscall on this thread's credentials; no memory involved.
        let rc = unsafe { libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534) };
        assert_eq!(rc, 0);
        let rt = runtime();
        let _g = rt.enter();
        Capture::attach(&CaptureConfig::new("lo", 1000..=1000))
            .err()
            .unwrap()
            .to_string()
    })
    .join()
    .unwrap();
    assert!(
        msg.contains("not permitted") && msg.contains("CAP_BPF"),
        "{msg}"
    );
}

#[test]
fn detach_leaves_no_tcx_links_or_qdiscs() {
    if !root_or_skip("detach") {
        return;
    }
    let bed = Testbed::pair().unwrap();
    let ns = bed.host(0).netns.clone();
    let (during, after) = bed
        .host(0)
        .run(|| {
            let rt = runtime();
            let _g = rt.enter();
            let tcx = |dir| SchedClassifier::query_tcx("eth0", dir).unwrap().1.len();
            let cap = Capture::attach(&CaptureConfig::new("eth0", 31_905..=31_905)).unwrap();
            let during = (tcx(TcAttachType::Ingress), tcx(TcAttachType::Egress));
            cap.detach();
            (
                during,
                (tcx(TcAttachType::Ingress), tcx(TcAttachType::Egress)),
            )
        })
        .unwrap();
    assert_eq!(during, (1, 1));
    assert_eq!(after, (0, 0));
    let qdiscs = std::process::Command::new("tc")
        .args(["-n", &ns, "qdisc", "show", "dev", "eth0"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&qdiscs.stdout);
    assert!(!text.contains("clsact"), "{text}");
}

#[test]
fn fentry_refusal_falls_back_to_the_error_queue() {
    if !root_or_skip("fentry_fallback") {
        return;
    }
    let bed = Testbed::pair().unwrap();
    let source = bed
        .host(0)
        .run(|| {
            let rt = runtime();
            let _g = rt.enter();
            let cap = Capture::attach(&CaptureConfig::new("eth0", 31_906..=31_906)).unwrap();
            cap.tx_stamp_source()
        })
        .unwrap();
    // Whatever the kernel allows, attach succeeds; the source says which path
    // NIC TX stamps take. On kernels refusing fentry (EPERM) it is the error queue.
    let fentry_allowed = fentry_loads();
    eprintln!("fentry allowed by this kernel: {fentry_allowed}; TX stamp source: {source:?}");
    let expected = if fentry_allowed {
        TxStampSource::Fentry
    } else {
        TxStampSource::ErrQueue
    };
    assert_eq!(source, expected);
}

/// Independent probe of the kernel: load the fentry program with aya directly.
fn fentry_loads() -> bool {
    let Ok(mut ebpf) = aya::Ebpf::load(loader::embedded_object()) else {
        return false;
    };
    let btf = aya::Btf::from_sys_fs().expect("kernel BTF");
    let prog: &mut aya::programs::FEntry = ebpf
        .program_mut(loader::PROG_TX_COMPLETION)
        .expect("program in object")
        .try_into()
        .expect("an fentry program");
    prog.load("__skb_tstamp_tx", &btf).is_ok()
}

#[test]
fn switched_hosts_reach_each_other_and_have_no_route_out() {
    if !root_or_skip("switched_testbed") {
        return;
    }
    let bed = Testbed::switched(4).unwrap();
    let last = bed.host(3).clone();
    let receiver = last.spawn(move || {
        let s = UdpSocket::bind((last.addr, 31_907)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 16];
        let (n, from) = s.recv_from(&mut buf).unwrap();
        (buf[..n].to_vec(), from)
    });
    std::thread::sleep(Duration::from_millis(50));
    let dst = (bed.host(3).addr, 31_907);
    bed.host(0)
        .run(move || {
            UdpSocket::bind("198.18.0.1:0")
                .unwrap()
                .send_to(b"hello", dst)
                .unwrap()
        })
        .unwrap();
    let (payload, from) = receiver.join().unwrap().unwrap();
    assert_eq!(
        (payload.as_slice(), from.ip()),
        (&b"hello"[..], std::net::IpAddr::from(bed.host(0).addr))
    );
    for h in bed.hosts() {
        let out = std::process::Command::new("ip")
            .args(["-n", &h.netns, "route", "show", "default"])
            .output()
            .unwrap();
        assert!(out.stdout.is_empty(), "{} has a default route", h.netns);
    }
}
