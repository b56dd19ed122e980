//! The known skew injected into a node's clock (`clockmesh agent --inject-skew`, the demo, the report's truth).

use serde::Serialize;

/// A known skew added to every local timestamp (tests and the demo): the
/// node then behaves as if its clock read `true + offset + drift·(t − epoch)`
/// plus, optionally, a seeded random walk of its frequency
/// ([`crate::wander`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct InjectedSkew {
    pub offset_ns: i64,
    pub drift_ppb: f64,
    pub epoch_ns: i64,
    /// Random-walk frequency wander, ppb per √s (0: none).
    pub wander_ppb_per_sqrt_s: f64,
    pub wander_seed: u64,
}

impl InjectedSkew {
    /// The skew at local time `t_ns`.
    pub fn at(&self, t_ns: i64) -> i64 {
        let age_ns = t_ns.saturating_sub(self.epoch_ns);
        let age_s = age_ns as f64 / 1e9;
        let wander = crate::wander::offset_ns(self.wander_seed, self.wander_ppb_per_sqrt_s, age_ns);
        self.offset_ns
            .saturating_add((self.drift_ppb * age_s + wander).round() as i64)
    }
}
