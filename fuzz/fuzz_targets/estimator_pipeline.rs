//! The estimator's public input path on arbitrary bytes: probes → pairing/purity → fit →
//! network solve → aged query. Any input must give a value or an `Err`, never a panic.
#![no_main]

use clockmesh_estimator::{
    EdgeProbes, Estimator, EstimatorConfig, FitConfig, LocalNs, ProbeTimestamps, PurePoint,
    fit_edge,
};
use libfuzzer_sys::fuzz_target;

/// Reads little-endian integers off the input; zeros once it runs out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn i64(&mut self) -> i64 {
        i64::from_le_bytes(self.take())
    }
    /// A timestamp: either near a base (likely to pair and fit) or fully arbitrary.
    fn stamp(&mut self, base: i64) -> i64 {
        let raw = self.i64();
        if self.u8() & 1 == 0 {
            base.wrapping_add(raw % 1_000_000_000)
        } else {
            raw
        }
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn probes(b: &mut Bytes, base: i64) -> Vec<ProbeTimestamps> {
    let n = b.u8() as usize % 64;
    (0..n)
        .map(|_| ProbeTimestamps {
            seq: u64::from(b.u8() % 32),
            pair_index: b.u8() % 3,
            tx_ns: b.stamp(base),
            rx_ns: b.stamp(base),
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data);
    let base = b.i64();
    // Direct fit on arbitrary points.
    let pts = |b: &mut Bytes| -> Vec<PurePoint> {
        let n = b.u8() as usize % 32;
        (0..n)
            .map(|i| PurePoint {
                seq: i as u64,
                tx_ns: b.stamp(base),
                rx_ns: b.stamp(base),
            })
            .collect()
    };
    let (f, w) = (pts(&mut b), pts(&mut b));
    let _ = fit_edge(&f, &w, &FitConfig::default());
    // Whole pipeline on a small graph.
    let mut edges = Vec::new();
    while !b.is_empty() && edges.len() < 6 {
        let from = u32::from(b.u8() % 5);
        let to = u32::from(b.u8() % 5);
        edges.push(EdgeProbes {
            from,
            to,
            forward: probes(&mut b, base),
            backward: probes(&mut b, base),
        });
    }
    let mut est = Estimator::new(EstimatorConfig::default());
    if est.process_window(LocalNs(base), &edges).is_ok() {
        for node in 0..5 {
            let _ = est.offset_at(node, LocalNs(base.wrapping_add(1_000_000_000)));
            let _ = est.offset_at(node, LocalNs(i64::MAX));
            let _ = est.offset_at(node, LocalNs(i64::MIN));
        }
    }
});
