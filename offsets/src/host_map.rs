//! A host's time-varying map from local CLOCK_REALTIME to the global
//! timeline, built from anchors: the agent's per-window history entries, or
//! the two records a profiler hook takes at session start and stop.
//!
//! [`HostMap::to_global`] is the one function that turns a stamp into
//! global time ± bound *at the stamp's own time*; `trace merge` places every
//! event through it and the readers use the same rule.
//!
//! Between two anchors the offset is interpolated linearly, so it never
//! jumps from one window's estimate to the next and a constant drift is
//! followed exactly. The bound is the interpolated anchor bounds plus the
//! larger growth rate times the distance to the *nearest* anchor: how far
//! the true offset can bend away from the chord. Before the first and after
//! the last anchor the map extrapolates with that anchor's own drift and the
//! bound grows with the distance.

use crate::history::{AnchorKind, HistoryEntry};
use crate::{GlobalNs, LocalNs, Nanos};

/// One point of a host's map: at local time `at_ns` the offset
/// (global − local) is `offset_ns` ± `bound_ns`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Anchor {
    pub at_ns: i64,
    pub offset_ns: i64,
    /// How fast the offset changes, ppb (used only outside the anchors).
    pub drift_ppb: f64,
    pub bound_ns: u64,
    /// How fast the bound grows away from the anchor, ppb.
    pub bound_growth_ppb: f64,
}

impl From<&HistoryEntry> for Anchor {
    fn from(e: &HistoryEntry) -> Self {
        Self {
            at_ns: e.anchor_ns,
            offset_ns: e.offset_ns,
            drift_ppb: e.drift_ppb,
            bound_ns: e.bound_ns,
            bound_growth_ppb: e.bound_growth_ppb,
        }
    }
}

/// A stamp placed on the global timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlobalTime {
    /// Global time, ps since the epoch.
    pub global_ps: i128,
    /// Error bound, ns; meaningless when the map's bound is unknown.
    pub bound_ns: u64,
}

impl GlobalTime {
    /// The global time in whole ns (floor), saturated to i64.
    pub fn global(&self) -> GlobalNs {
        GlobalNs(sat_i64(self.global_ps.div_euclid(1000)))
    }
}

/// Local CLOCK_REALTIME → global timeline for one host (see the module
/// docs). Never empty.
#[derive(Clone, Debug, PartialEq)]
pub struct HostMap {
    /// Sorted by `at_ns`, one per time.
    anchors: Vec<Anchor>,
    /// False for an offset given by hand (no bound known).
    bound_known: bool,
}

impl HostMap {
    /// A map through `anchors` (any order; at equal times the tighter bound
    /// wins). `None` when there are none.
    pub fn new(mut anchors: Vec<Anchor>) -> Option<Self> {
        anchors.sort_by(|a, b| a.at_ns.cmp(&b.at_ns).then(a.bound_ns.cmp(&b.bound_ns)));
        anchors.dedup_by_key(|a| a.at_ns);
        (!anchors.is_empty()).then_some(Self {
            anchors,
            bound_known: true,
        })
    }

    /// One offset for all times, with no known bound (`--offset`, or 0
    /// assumed).
    pub fn fixed(offset: Nanos) -> Self {
        Self {
            anchors: vec![Anchor {
                at_ns: 0,
                offset_ns: offset.0,
                drift_ppb: 0.0,
                bound_ns: 0,
                bound_growth_ppb: 0.0,
            }],
            bound_known: false,
        }
    }

    /// The same map, its bounds marked unknown (a record without one).
    pub fn without_bound(self) -> Self {
        Self {
            bound_known: false,
            ..self
        }
    }

    /// The map of `host` from the agent's history: every node entry of the
    /// host that is on the global timeline (detached windows are not).
    pub fn from_history<'a>(
        entries: impl IntoIterator<Item = &'a HistoryEntry>,
        host: &str,
    ) -> Option<Self> {
        let anchors = entries
            .into_iter()
            .filter(|e| e.host == host && e.anchor_kind != Some(AnchorKind::Detached))
            .map(Anchor::from)
            .collect();
        Self::new(anchors)
    }

    pub fn anchors(&self) -> &[Anchor] {
        &self.anchors
    }

    /// Whether [`GlobalTime::bound_ns`] means anything.
    pub fn bound_known(&self) -> bool {
        self.bound_known
    }

    /// The same offset and bound at every time: placing a stamp is adding
    /// one constant.
    pub fn is_constant(&self) -> bool {
        let first = self.anchors[0];
        self.anchors.iter().all(|a| {
            a.offset_ns == first.offset_ns
                && a.bound_ns == first.bound_ns
                && a.drift_ppb == 0.0
                && a.bound_growth_ppb == 0.0
        })
    }

    /// The largest bound of any stamp in `[from_ns, to_ns]`: the bound is
    /// piecewise linear with at most one peak per piece (where the growth
    /// from the nearer anchor turns), so the ends, the anchors and the
    /// pieces' midpoints inside the interval cover it.
    pub fn worst_bound(&self, from: LocalNs, to: LocalNs) -> u64 {
        let (from_ns, to_ns) = (from.0, to.0);
        let mut at = vec![from_ns, to_ns];
        for w in self.anchors.windows(2) {
            at.extend([w[0].at_ns, w[0].at_ns + (w[1].at_ns - w[0].at_ns) / 2]);
        }
        at.extend(self.anchors.last().map(|a| a.at_ns));
        at.into_iter()
            .filter(|&t| from_ns <= t && t <= to_ns)
            .map(|t| self.to_global(LocalNs(t)).bound_ns)
            .max()
            .unwrap_or(0)
    }

    /// Global time ± bound of the local stamp `local`, at its own time.
    pub fn to_global(&self, local: LocalNs) -> GlobalTime {
        self.to_global_ps(i128::from(local.0) * 1000)
    }

    /// The offset (global − local) at `local`, rounded to ns.
    pub fn offset_at(&self, local: LocalNs) -> Nanos {
        let t = i128::from(local.0) * 1000;
        let (offset_ps, _) = self.offset_at_ps(t);
        Nanos(sat_i64((offset_ps + 500).div_euclid(1000)))
    }

    /// [`Self::to_global`] for a stamp in ps (device events keep ps).
    pub fn to_global_ps(&self, local_ps: i128) -> GlobalTime {
        let (offset_ps, bound_ns) = self.offset_at_ps(local_ps);
        GlobalTime {
            global_ps: local_ps.saturating_add(offset_ps),
            bound_ns,
        }
    }

    /// Offset (ps) and bound (ns, rounded up) at local time `t_ps`.
    fn offset_at_ps(&self, t_ps: i128) -> (i128, u64) {
        self.segment(t_ps).offset_at_ps(t_ps)
    }

    /// The piece of the map that holds at `t_ps`: callers placing many
    /// nearby stamps (a trace line's events) keep it and ask
    /// [`Segment::contains`] before looking again.
    pub fn segment(&self, t_ps: i128) -> Segment {
        let after = self
            .anchors
            .partition_point(|a| i128::from(a.at_ns) * 1000 <= t_ps);
        let at = |i: usize| i128::from(self.anchors[i].at_ns) * 1000;
        let (from_ps, until_ps, a, b) = match after.checked_sub(1) {
            None => (i128::MIN, at(0), &self.anchors[0], None),
            Some(i) => (
                at(i),
                self.anchors.get(after).map_or(i128::MAX, |_| at(after)),
                &self.anchors[i],
                self.anchors.get(after),
            ),
        };
        let base = Segment {
            from_ps,
            until_ps,
            anchor_ps: i128::from(a.at_ns) * 1000,
            offset_ps: i128::from(a.offset_ns) * 1000,
            span_ps: 0.0,
            inv_span: 0.0,
            change_ps: 0.0,
            drift: a.drift_ppb * 1e-9,
            bound_ns: a.bound_ns as f64,
            bound_change_ns: 0.0,
            growth: finite(a.bound_growth_ppb) * 1e-12,
            bound_known: self.bound_known,
        };
        match b {
            None => base,
            Some(b) => Segment {
                span_ps: as_f64(i128::from(b.at_ns) * 1000 - base.anchor_ps),
                inv_span: 1.0 / as_f64(i128::from(b.at_ns) * 1000 - base.anchor_ps),
                change_ps: as_f64(i128::from(b.offset_ns) * 1000 - base.offset_ps),
                bound_change_ns: b.bound_ns as f64 - a.bound_ns as f64,
                growth: base.growth.max(finite(b.bound_growth_ppb) * 1e-12),
                ..base
            },
        }
    }
}

/// One piece of a [`HostMap`], ready to evaluate: between two anchors
/// (linear interpolation), or beyond the last (before the first) one
/// (that anchor's drift). Built once per piece, evaluated per stamp.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Segment {
    from_ps: i128,
    until_ps: i128,
    /// The anchor the piece starts from (the first one before them all).
    anchor_ps: i128,
    offset_ps: i128,
    /// To the next anchor; 0 when extrapolating.
    span_ps: f64,
    /// 1 / `span_ps`: a multiply per stamp instead of a divide.
    inv_span: f64,
    change_ps: f64,
    /// Extrapolation: offset change per ps.
    drift: f64,
    bound_ns: f64,
    bound_change_ns: f64,
    /// Bound growth, ns per ps of distance.
    growth: f64,
    bound_known: bool,
}

impl Segment {
    /// Whether `t_ps` falls in this piece (`[from, until)`).
    pub fn contains(&self, t_ps: i128) -> bool {
        self.from_ps <= t_ps && t_ps < self.until_ps
    }

    /// [`HostMap::to_global_ps`] for a time this piece [`contains`](Self::contains).
    pub fn to_global_ps(&self, local_ps: i128) -> GlobalTime {
        let (offset_ps, bound_ns) = self.offset_at_ps(local_ps);
        GlobalTime {
            global_ps: local_ps.saturating_add(offset_ps),
            bound_ns,
        }
    }

    /// Whether [`GlobalTime::bound_ns`] means anything.
    pub fn bound_known(&self) -> bool {
        self.bound_known
    }

    /// Offset (ps) and bound (ns, rounded up). Between anchors the step is
    /// computed in f64 from exact integer differences: it is at most a
    /// window's offset change (≤ 1e12 ps even at 1,000 ppm), so its
    /// rounding error stays far below 1 ps.
    fn offset_at_ps(&self, t_ps: i128) -> (i128, u64) {
        let from = as_f64(t_ps - self.anchor_ps);
        let (step, bound) = if self.span_ps > 0.0 {
            let frac = from * self.inv_span;
            let nearest = from.min(self.span_ps - from);
            // The nudge keeps exact whole-ps steps whole despite the
            // reciprocal's last-bit error (at most 1 ps either way).
            (
                floor_i128(self.change_ps * frac + 1e-6),
                self.bound_ns + self.bound_change_ns * frac + self.growth * nearest,
            )
        } else {
            (
                floor_i128(self.drift * from + 0.5),
                self.bound_ns + self.growth * from.abs(),
            )
        };
        (self.offset_ps.saturating_add(step), ceil_u64(bound))
    }
}

impl Segment {
    /// This piece seen from `base_ps` (a trace line's start), for stamps
    /// given as i64 ps after it; `None` when the anchor is too far away
    /// for that.
    pub fn near(&self, base_ps: i128) -> Option<NearSegment> {
        let clamp = |v: i128| v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        Some(NearSegment {
            // Clamped bounds only ever refuse a stamp the piece holds (it
            // then goes the long way), never take one it does not.
            lo: clamp(self.from_ps.saturating_sub(base_ps)),
            hi: clamp(self.until_ps.saturating_sub(base_ps)),
            from_anchor: i64::try_from(base_ps.checked_sub(self.anchor_ps)?).ok()?,
            offset_ps: self.offset_ps,
            span_ps: self.span_ps,
            inv_span: self.inv_span,
            change_ps: self.change_ps,
            drift: self.drift,
            bound_ns: self.bound_ns,
            bound_change_ns: self.bound_change_ns,
            growth: self.growth,
        })
    }
}

/// A [`Segment`] seen from a base time, evaluated in i64 and f64 only:
/// for stamps it [`contains`](Self::contains), [`Self::eval`] gives
/// exactly [`Segment::offset_at_ps`]'s results (the same f64 expressions
/// on the same exact distances), or `None` where those leave i64.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NearSegment {
    /// Stamps `lo <= rel < hi` (ps after the base) are in the piece.
    lo: i64,
    hi: i64,
    /// Base − anchor, ps.
    from_anchor: i64,
    offset_ps: i128,
    span_ps: f64,
    inv_span: f64,
    change_ps: f64,
    drift: f64,
    bound_ns: f64,
    bound_change_ns: f64,
    growth: f64,
}

impl NearSegment {
    /// The offset (global − local, ps) at the piece's anchor.
    pub fn anchor_offset_ps(&self) -> i128 {
        self.offset_ps
    }

    /// Whether the stamp `rel` ps after the base is in this piece.
    #[inline]
    pub fn contains(&self, rel: i64) -> bool {
        self.lo <= rel && rel < self.hi
    }

    /// For a stamp `rel` ps after the base that the piece
    /// [`contains`](Self::contains): the offset's step from the anchor's
    /// (ps; the offset is [`Self::anchor_offset_ps`] plus it) and, when
    /// `BOUND`, the bound in ns *before* rounding up (NaN counts as 0; the
    /// largest of several rounds up to the largest rounded one). `None`
    /// where [`Segment::offset_at_ps`] would leave i64.
    #[inline]
    pub fn eval<const BOUND: bool>(&self, rel: i64) -> Option<(i64, f64)> {
        let from = self.from_anchor.checked_add(rel)? as f64;
        let (v, bound) = if self.span_ps > 0.0 {
            let frac = from * self.inv_span;
            let bound = if BOUND {
                let nearest = from.min(self.span_ps - from);
                self.bound_ns + self.bound_change_ns * frac + self.growth * nearest
            } else {
                0.0
            };
            (self.change_ps * frac + 1e-6, bound)
        } else {
            let bound = if BOUND {
                self.bound_ns + self.growth * from.abs()
            } else {
                0.0
            };
            (self.drift * from + 0.5, bound)
        };
        floor_i64(v).map(|step| (step, bound))
    }
}

/// ⌊v⌋ when it is well inside i64 (one conversion instead of the i128
/// library call); `None` otherwise, NaN included.
#[inline]
fn floor_i64(v: f64) -> Option<i64> {
    if v.abs() < 9.0e18 {
        let n = v as i64;
        Some(if (n as f64) > v { n - 1 } else { n })
    } else {
        None
    }
}

/// Rounds a bound from [`NearSegment::eval`] up, as [`Segment`] does.
pub fn round_bound_ns(bound: f64) -> u64 {
    ceil_u64(bound)
}

/// i128 → f64 through i64 when it fits (one instruction; the i128
/// conversion is a library call, and this is on every event's path).
fn as_f64(v: i128) -> f64 {
    match i64::try_from(v) {
        Ok(v) => v as f64,
        Err(_) => wide_as_f64(v),
    }
}

/// Out of line, or the optimiser folds both arms into the library call.
#[cold]
#[inline(never)]
fn wide_as_f64(v: i128) -> f64 {
    v as f64
}

/// `floor` without the libm call, saturating (NaN: 0).
fn floor_i128(v: f64) -> i128 {
    if v.is_nan() {
        return 0;
    }
    match floor_i64(v) {
        Some(n) => i128::from(n),
        None => v as i128,
    }
}

/// `ceil` without the libm call (no SSE4.1 on the baseline target).
fn ceil_u64(v: f64) -> u64 {
    if v.is_nan() || v <= 0.0 {
        return 0;
    }
    if v >= u64::MAX as f64 {
        return u64::MAX;
    }
    let n = v as u64;
    if (n as f64) < v { n + 1 } else { n }
}

/// Bound growth from a file: NaN or negative counts as none, infinite stays.
fn finite(ppb: f64) -> f64 {
    if ppb > 0.0 { ppb } else { 0.0 }
}

fn sat_i64(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anchor(at_ns: i64, offset_ns: i64, bound_ns: u64) -> Anchor {
        Anchor {
            at_ns,
            offset_ns,
            drift_ppb: 0.0,
            bound_ns,
            bound_growth_ppb: 0.0,
        }
    }

    #[test]
    fn a_constant_drift_is_followed_exactly_between_and_beyond_anchors() {
        // 50 ppm: +50 µs per second; anchors every 4 s, each with that drift.
        let drift = 50_000.0;
        let anchors = (0..4)
            .map(|i| Anchor {
                drift_ppb: drift,
                ..anchor(i * 4_000_000_000, 123_000_000 + i * 200_000, 100)
            })
            .collect();
        let map = HostMap::new(anchors).unwrap();
        for t in [
            -3_000_000_000i64,
            0,
            1,
            2_500_000_001,
            11_999_999_999,
            20_000_000_000,
        ] {
            let want = 123_000_000i128 * 1000 + i128::from(t) / 20; // 0.05 ps per ns
            let got = map.to_global_ps(i128::from(t) * 1000).global_ps - i128::from(t) * 1000;
            assert!((got - want).abs() <= 1, "at {t}: {got} vs {want}");
        }
        assert!(!map.is_constant());
    }

    #[test]
    fn offsets_do_not_jump_between_windows_and_the_bound_grows_from_the_nearest_anchor() {
        let mut a = anchor(0, 1_000, 10);
        a.bound_growth_ppb = 1e6; // 1 ns per µs
        let b = anchor(1_000_000, 2_000, 30);
        let map = HostMap::new(vec![b, a]).unwrap();
        // Halfway: offset halfway, bound = mean of the bounds + 500 µs × 1e6 ppb.
        let mid = map.to_global(LocalNs(500_000));
        assert_eq!(mid.global().0, 500_000 + 1_500);
        assert_eq!(mid.bound_ns, 20 + 500);
        // Near b: the growth counts from b, not from a.
        assert_eq!(map.to_global(LocalNs(999_000)).bound_ns, 30 + 1);
        // Continuity at an anchor, from either side.
        assert_eq!(map.offset_at(LocalNs(1_000_000)), Nanos(2_000));
        assert_eq!(map.offset_at(LocalNs(999_000)), Nanos(1_999));
        // Before the first anchor: its growth, its (zero) drift.
        let before = map.to_global(LocalNs(-2_000_000));
        assert_eq!(
            (before.global().0, before.bound_ns),
            (-2_000_000 + 1_000, 10 + 2_000)
        );
    }

    #[test]
    fn detached_windows_and_other_hosts_are_left_out_and_duplicates_keep_the_tighter_bound() {
        let e = |host: &str, at, off, bound, kind| HistoryEntry {
            host: host.into(),
            anchor_ns: at,
            offset_ns: off,
            bound_ns: bound,
            anchor_kind: kind,
            ..HistoryEntry::default()
        };
        let entries = [
            e("a", 10, 5, 9, Some(AnchorKind::Reference)),
            e("a", 10, 6, 3, Some(AnchorKind::Holdover)),
            e("a", 20, 999, 1, Some(AnchorKind::Detached)),
            e("b", 15, 7, 1, None),
        ];
        let map = HostMap::from_history(&entries, "a").unwrap();
        assert_eq!(map.anchors().len(), 1);
        assert_eq!(map.offset_at(LocalNs(30)), Nanos(6));
        assert!(HostMap::from_history(&entries, "c").is_none());
        assert!(HostMap::from_history(&entries[2..3], "a").is_none());
    }

    #[test]
    fn the_worst_bound_over_an_interval_finds_the_peak_between_anchors() {
        let mut a = anchor(0, 0, 10);
        a.bound_growth_ppb = 1e6; // 1 ns per µs
        let map = HostMap::new(vec![a, anchor(1_000_000, 0, 10)]).unwrap();
        assert_eq!(
            map.worst_bound(LocalNs(0), LocalNs(1_000_000)),
            10 + 500_000 / 1000
        );
        assert_eq!(map.worst_bound(LocalNs(0), LocalNs(100_000)), 10 + 100);
        let brute = (0..=1000)
            .map(|k| map.to_global(LocalNs(k * 1000)).bound_ns)
            .max()
            .unwrap();
        assert_eq!(map.worst_bound(LocalNs(0), LocalNs(1_000_000)), brute);
        assert_eq!(
            map.worst_bound(LocalNs(-1_000_000), LocalNs(-1_000_000)),
            10 + 1000
        );
    }

    #[test]
    fn a_near_segment_evaluates_as_its_segment() {
        let mut a = anchor(0, 1_000, 10);
        a.bound_growth_ppb = 1e6;
        a.drift_ppb = -50_000.0;
        let mut b = anchor(4_000_000_000, -199_000, 250);
        b.drift_ppb = 1e3;
        b.bound_growth_ppb = 3.5;
        let map = HostMap::new(vec![a, b]).unwrap();
        let bases = [
            -7_000_000_000_123i128,
            0,
            1_999_999_999_999,
            9_000_000_000_000,
        ];
        let mut taken = 0;
        for base in bases {
            for rel in (-60..60)
                .map(|k| k * 211_111_111_111)
                .chain([i64::MIN, i64::MAX, -1, 0, 1])
            {
                let t = base + i128::from(rel);
                let seg = map.segment(t);
                let near = seg.near(base).unwrap();
                // Clamped to i64, the piece may refuse the last stamp
                // (which then goes the long way), never take a foreign one.
                assert!(near.contains(rel) || rel == i64::MAX, "{base} {rel}");
                for other in [map.segment(base), map.segment(-1), map.segment(i128::MAX)] {
                    let view = other.near(base).unwrap();
                    if view.contains(rel) || rel != i64::MAX {
                        assert_eq!(view.contains(rel), other.contains(t), "{base} {rel}");
                    }
                }
                let (offset, bound) = seg.offset_at_ps(t);
                let got = near.eval::<true>(rel);
                let step_only = near.eval::<false>(rel);
                assert_eq!(got.map(|g| g.0), step_only.map(|g| g.0));
                if let Some((step, b)) = got {
                    assert_eq!(near.anchor_offset_ps() + i128::from(step), offset);
                    assert_eq!(round_bound_ns(b), bound, "{base} {rel}");
                    taken += 1;
                }
            }
        }
        assert!(taken > 400, "{taken}");
        // Too far from its anchor for i64: no near view.
        assert!(map.segment(0).near(i128::from(i64::MAX) * 2).is_none());
    }

    #[test]
    fn a_fixed_offset_is_constant_without_a_bound() {
        let map = HostMap::fixed(Nanos(-42));
        assert!(map.is_constant() && !map.bound_known());
        assert_eq!(map.to_global(LocalNs(i64::MAX)).global().0, i64::MAX - 42);
    }

    #[test]
    fn values_from_files_never_panic() {
        let wild = Anchor {
            at_ns: i64::MIN,
            offset_ns: i64::MAX,
            drift_ppb: f64::NAN,
            bound_ns: u64::MAX,
            bound_growth_ppb: f64::INFINITY,
        };
        let map = HostMap::new(vec![wild, anchor(i64::MAX, i64::MIN, 0)]).unwrap();
        for t in [i64::MIN, -1, 0, i64::MAX] {
            let g = map.to_global(LocalNs(t));
            let _ = (g.global().0, map.offset_at(LocalNs(t)));
        }
        let lone = HostMap::new(vec![Anchor {
            drift_ppb: f64::INFINITY,
            ..wild
        }])
        .unwrap();
        let _ = lone.to_global(LocalNs(i64::MAX));
    }
}
