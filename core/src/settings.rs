//! The protocol settings an agent runs with, and the one function that
//! turns them into the estimator's configuration. The agent (from its
//! config file, environment and flags) and the simulator (from a scenario's
//! `[agent]` table) both go through [`estimator_config`], so a simulated
//! run uses exactly the settings that ship.

use clockmesh_estimator::{EstimatorConfig, FitConfig, PurityConfig};
use serde::{Deserialize, Serialize};

#[cfg(doc)]
use crate::setting;
use crate::time::Nanos;

/// Longest time a software-stamp fit spans (32 s: 32 windows of the
/// shipped 1 s). Their noise needs the long span, and its tight drift
/// bound is what makes holdover last; on a fast-wandering clock a shorter
/// one is better at the result, but 16 s everywhere cut the fault bench's
/// holdover short (docs/estimator.md §8). So a node publishes the newest
/// half of it under its slope only while that predicted its windows
/// better ([`crate::span_choice`]).
pub const SOFTWARE_HISTORY_NS: i64 = 32_000_000_000;

/// Longest time a NIC-stamp fit spans (2 s). Its pairs pin the line
/// within a couple of seconds; a longer span only adds the clocks'
/// frequency wander. Windows shorter than this fit several of them, so a
/// result comes every window from as many pairs as before.
pub const NIC_HISTORY_NS: i64 = 2_000_000_000;

/// Longest time the drift of a NIC-stamp fit spans (3 s): its offset comes
/// from [`NIC_HISTORY_NS`], its drift from this longer span while it agrees.
/// A reader extrapolates every result with its drift until the next one
/// replaces it, and one 2 s span's slope is noisier than the frequency
/// wanders over 3 s at 1–3 ppb/√s: NIC-128 aged p99 14.7 → 13.2 ns, harsh
/// NIC 28.8 → 28.9 (4 s: 13.1 and 29.9); with the rest of that change
/// 13.5 ns, 1.39 × the at-anchor p99 (docs/estimator.md §8).
pub const NIC_DRIFT_HISTORY_NS: i64 = 3_000_000_000;

/// Longest time a starved NIC-stamp fit spans (8 s): one whose
/// [`NIC_HISTORY_NS`] span holds fewer than [`NIC_STARVED_POINTS`] pure
/// points in a direction grows, one span at a time, while each longer fit
/// is still starved and agrees with the shorter ones. A NIC pair is pure
/// only when both its packets crossed unqueued: with queues busy two
/// thirds of the time that is about one pair in nine, two or three per
/// direction in 2 s at the shipped 10 pairs/s, and the line stood on them
/// (the family's busy-queue NIC members: p99 60–1,700 ns). The bound
/// grows with the span by the wander the estimator assumes, as every
/// span's does. Family seed 1, the 120 NIC members: p99 at the result per
/// class p90 140–469 → 57–308 ns, max 337–1,669 → 84–807 ns, medians
/// equal or better, coverage 1.0 (docs/estimator.md §8).
pub const NIC_STARVED_HISTORY_NS: i64 = 8_000_000_000;

/// Pure points per direction below which a NIC fit is starved
/// ([`NIC_STARVED_HISTORY_NS`]). At 8 the medians of three NIC classes got
/// worse (a 4 s span where 2 s held 6–7 points, bent by the wander); at 5
/// none did, and 71 of the 120 NIC members meet 20 ns (62 before).
pub const NIC_STARVED_POINTS: usize = 5;

/// Software stamps: a pair is pure when its gaps agree within this.
pub const SOFTWARE_PURITY_NS: i64 = 10_000;
/// NIC stamps on both sides: a few clock ticks plus serialisation jitter
/// (the estimator's own default).
pub const NIC_PURITY_NS: i64 = 40;

/// The stamps an edge's probes carry, which set its purity tolerance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StampClass {
    /// Every side of every probe stamped by the NIC.
    Nic,
    /// Some side stamped by the kernel, a tracepoint or tc.
    #[default]
    Software,
}

impl StampClass {
    pub fn as_str(self) -> &'static str {
        match self {
            StampClass::Nic => "nic",
            StampClass::Software => "software",
        }
    }

    /// Most windows of `window_ns` an edge's fit may span with these
    /// stamps: [`NIC_HISTORY_NS`] or [`SOFTWARE_HISTORY_NS`] whatever the
    /// window, at least one (the caller caps it at the windows it keeps).
    /// The simulator's figures per limit, dated, are in docs/estimator.md
    /// ("At the agent's shipped settings").
    pub fn max_history_windows(self, window: Nanos) -> usize {
        let history_ns = match self {
            StampClass::Nic => NIC_HISTORY_NS,
            StampClass::Software => SOFTWARE_HISTORY_NS,
        };
        windows_within(Nanos(history_ns), window)
    }

    /// Most windows of `window_ns` an edge's fit may span when its fit over
    /// [`StampClass::max_history_windows`] is starved of pure points
    /// ([`NIC_STARVED_HISTORY_NS`]; software spans already grow to their
    /// longest while they agree).
    pub fn starved_history_windows(self, window: Nanos) -> usize {
        match self {
            StampClass::Nic => windows_within(Nanos(NIC_STARVED_HISTORY_NS), window),
            StampClass::Software => self.max_history_windows(window),
        }
    }

    /// Most windows of `window_ns` the drift of an edge's fit may span
    /// beyond its offset's: [`NIC_DRIFT_HISTORY_NS`] for NIC stamps; `None`
    /// for software stamps, whose drift is their offset's (its span is
    /// already the longest that agrees).
    pub fn drift_history_windows(self, window: Nanos) -> Option<usize> {
        match self {
            StampClass::Nic => Some(windows_within(Nanos(NIC_DRIFT_HISTORY_NS), window)),
            StampClass::Software => None,
        }
    }

    /// Whether a fit may bridge windows without probes (a link down, a
    /// peer restarting) with these stamps: software stamps yes (their
    /// spans count windows that had probes; the wander over the span's
    /// whole time is in its bound); NIC stamps no (their span is a time:
    /// the agreement test cannot see the wander a longer one adds).
    pub fn bridges_silence(self) -> bool {
        self == StampClass::Software
    }

    /// How far the best round trip of the newest window may sit from that
    /// of a longer span before the span counts as another path (a route
    /// that changed, a detour added or removed): the older windows then
    /// describe a path that is gone, and the history is cut. Above the
    /// window-to-window noise of the best RTT with these stamps.
    pub fn path_change_ns(self) -> f64 {
        match self {
            StampClass::Nic => 30.0,
            StampClass::Software => 500.0,
        }
    }

    /// Whether newest probes faster than the span's older ones by more than
    /// [`StampClass::path_change_ns`] cut the history (and forget the older
    /// windows once the span is full). Software stamps yes: a detour gone
    /// (no queue makes a packet faster than its path), the detour's slow
    /// windows would hold the 32 s line off for most of its span. NIC
    /// stamps no: their 2 s span's envelope is bound by the newest, faster
    /// packets anyway (a detour inside the span costs nothing), and under
    /// busy queues the verdict flipped window to window, each cut leaving a
    /// line over one window's few pairs tilted microseconds a second
    /// (docs/estimator.md §8, "A faster NIC second does not cut").
    pub fn faster_path_cuts(self) -> bool {
        self == StampClass::Software
    }

    /// Whether newest probes slower than the span's older ones by more than
    /// [`StampClass::path_change_ns`] cut the history. NIC stamps yes: their
    /// best round trip holds still within a few ns, so a slower one is a
    /// path change or a line bent by a frequency change — unless the newest
    /// window is starved, whose few pairs queued alike (a slow patch, not a
    /// path; `history::slow_patch`). Software stamps
    /// no: their best round trip over a couple of seconds wanders with
    /// queues, CPU load and loss by more than the cut, and the older,
    /// faster pairs are the better samples of the same clocks (the fault
    /// bench's software edges were cut every few windows, their short fits
    /// hundreds of ns off). A faster path cuts software histories only
    /// ([`StampClass::faster_path_cuts`]).
    pub fn slower_path_cuts(self) -> bool {
        self == StampClass::Nic
    }

    /// The purity tolerance this class of stamps needs.
    pub fn purity_tolerance(self) -> Nanos {
        Nanos(match self {
            StampClass::Nic => NIC_PURITY_NS,
            StampClass::Software => SOFTWARE_PURITY_NS,
        })
    }

    /// Whether a pure pair's point is its packet with the smaller delay
    /// rather than its first. Software stamps yes: their noise (TX stamped
    /// before the packet leaves, RX after it arrived) only ever adds delay
    /// and is drawn afresh for each packet, so the better of two sits
    /// nearer the floor the fit stands on; it halved the scenario family's
    /// worst software members' p99 (docs/estimator.md §8, "The better
    /// packet of each software pair"). NIC stamps no: a NIC pair is pure
    /// only when both packets crossed alike, and its first packet is the
    /// one no queue behind the other can have touched.
    pub fn keeps_best_of_pair(self) -> bool {
        self == StampClass::Software
    }

    /// `base` with this class's purity rules (tolerance, which packet of a
    /// pure pair is kept).
    pub fn purity(self, base: &PurityConfig) -> PurityConfig {
        PurityConfig {
            tolerance_ns: self.purity_tolerance().0,
            best_of_pair: self.keeps_best_of_pair(),
            ..base.clone()
        }
    }
}
/// The sender sleeps between the packets of a pair; sleeps overshoot, so TX
/// gaps up to twice the nominal spacing are accepted (the gap is measured by
/// the TX stamps; purity compares it with the RX gap).
pub const MIN_SPACING_ERROR_NS: i64 = 20_000;

/// What shapes probing and estimation. Each field's key, unit, default,
/// range and doc are defined once, in [`crate::setting`]: `Default` and
/// [`Settings::validate`] come from there, as do the agent's
/// configuration keys, so the simulator runs what ships.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Interval between coded pairs on one edge ([`setting::PROBE_CADENCE_US`]).
    #[serde(
        rename = "probe_cadence_us",
        serialize_with = "crate::setting::serialize_units::<_, { crate::setting::PROBE_CADENCE_US.unit.ns() }>",
        deserialize_with = "crate::setting::deserialize_units::<_, { crate::setting::PROBE_CADENCE_US.unit.ns() }>"
    )]
    pub probe_cadence: Nanos,
    /// Spacing between the two probes of a pair ([`setting::PACKET_SPACING_US`]).
    #[serde(
        rename = "packet_spacing_us",
        serialize_with = "crate::setting::serialize_units::<_, { crate::setting::PACKET_SPACING_US.unit.ns() }>",
        deserialize_with = "crate::setting::deserialize_units::<_, { crate::setting::PACKET_SPACING_US.unit.ns() }>"
    )]
    pub packet_spacing: Nanos,
    /// Estimation window ([`setting::PROBE_WINDOW_S`]).
    #[serde(
        rename = "probe_window_s",
        serialize_with = "crate::setting::serialize_units::<_, { crate::setting::PROBE_WINDOW_S.unit.ns() }>",
        deserialize_with = "crate::setting::deserialize_units::<_, { crate::setting::PROBE_WINDOW_S.unit.ns() }>"
    )]
    pub probe_window: Nanos,
    /// Out-neighbours each node probes ([`setting::DEGREE`]).
    pub degree: usize,
    /// Most pairs one peer gets per cadence, on a NIC-stamped direction
    /// short of pure pairs ([`setting::MAX_PAIRS_PER_CADENCE`]).
    pub max_pairs_per_cadence: usize,
    /// Operator knowledge: the paths' minimum one-way delays differ by at
    /// most this. Replaces the ½-RTT asymmetry allowance in each edge's
    /// bound (unset by default; a wrong value makes every bound lie;
    /// [`setting::MAX_PATH_ASYMMETRY_NS`]).
    #[serde(
        rename = "max_path_asymmetry_ns",
        serialize_with = "crate::setting::serialize_optional_units::<_, { crate::setting::MAX_PATH_ASYMMETRY_NS.unit.ns() }>",
        deserialize_with = "crate::setting::deserialize_optional_units::<_, { crate::setting::MAX_PATH_ASYMMETRY_NS.unit.ns() }>"
    )]
    pub max_path_asymmetry: Option<Nanos>,
    /// Past a result's validity, readers keep answering while its bound,
    /// grown at the published rate, is at most this
    /// ([`setting::HOLDOVER_MAX_BOUND_NS`]; 0: never). Written into every
    /// record; the node also keeps a held result only while it answers.
    #[serde(
        rename = "holdover_max_bound_ns",
        serialize_with = "crate::setting::serialize_units::<_, { crate::setting::HOLDOVER_MAX_BOUND_NS.unit.ns() }>",
        deserialize_with = "crate::setting::deserialize_units::<_, { crate::setting::HOLDOVER_MAX_BOUND_NS.unit.ns() }>"
    )]
    pub holdover_max_bound: Nanos,
}

/// The newest probes a path change is judged on (`core/src/history.rs`):
/// one second's, with any stamps. A path that got faster shows in its
/// first second (no queue makes a packet faster than its path); a slower
/// one, which only cuts NIC histories ([`StampClass::slower_path_cuts`]),
/// in a second of NIC pairs, whose best round trip holds still within a
/// few ns. (Software stamps were judged on 2 s while a slower path cut
/// them too: the best of fewer pairs wandered by more than the cut.)
pub const PATH_JUDGED_NS: i64 = 1_000_000_000;

/// A silence (no probe either way) at least this long makes a software
/// fit bridge it only once the windows after it hold half a window's worth
/// of probes (`core/src/history.rs`): over a long silence the line's newest
/// end is pinned by the new probes alone. A shorter one (a lost stamp
/// report, a second of heavy loss) is bridged at once: the windows just
/// before it pin the line as well as ever.
pub const LONG_SILENCE_NS: i64 = 4_000_000_000;

/// How many whole windows fit in `span`: rounded down (a span must not
/// exceed its history), at least one.
pub(crate) fn windows_within(span: Nanos, window: Nanos) -> usize {
    usize::try_from(span.0 / window.0.max(1)).map_or(1, |w| w.max(1))
}

/// How many windows cover `span`: rounded up, at least one.
pub fn windows_covering(span: Nanos, window: Nanos) -> usize {
    let window_ns = window.0.max(1);
    let windows = span.0.saturating_add(window_ns - 1) / window_ns;
    usize::try_from(windows).map_or(1, |w| w.max(1))
}

impl Settings {
    /// The estimation window (`probe_window_s`).
    pub fn window(&self) -> Nanos {
        self.probe_window
    }

    /// The spacing of a pair's two probes (`packet_spacing_us`).
    pub fn spacing(&self) -> Nanos {
        self.packet_spacing
    }

    /// The interval between pairs on one edge (`probe_cadence_us`).
    pub fn cadence(&self) -> Nanos {
        self.probe_cadence
    }
}

/// The estimator configuration for `settings`: purity from the spacing and
/// the software-stamp tolerance; results usable for a few missed windows.
pub fn estimator_config(settings: &Settings) -> EstimatorConfig {
    let spacing_ns = settings.spacing().0;
    EstimatorConfig {
        purity: StampClass::Software.purity(&PurityConfig {
            spacing_ns,
            max_spacing_error_ns: spacing_ns.max(MIN_SPACING_ERROR_NS),
            ..PurityConfig::default()
        }),
        // Results stay usable for a few missed windows, never less than 10 s.
        max_age_ns: settings.window().saturating_mul(3).0.max(10_000_000_000),
        fit: FitConfig {
            max_path_asymmetry_ns: settings.max_path_asymmetry.map(Nanos::as_f64),
            ..FitConfig::default()
        },
        ..EstimatorConfig::default()
    }
}

/// The estimator configuration for edges whose stamps are all of `class`:
/// [`estimator_config`] with the class's purity tolerance, the rule the
/// agent applies to each edge's fit (`crate::history`). For callers that
/// fit edges of one known class (the simulator's estimator mode).
pub fn estimator_config_for(settings: &Settings, class: StampClass) -> EstimatorConfig {
    let mut config = estimator_config(settings);
    config.purity = class.purity(&config.purity);
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purity_follows_the_spacing() {
        let c = estimator_config(&Settings {
            packet_spacing: Nanos::from_micros(50),
            ..Settings::default()
        });
        assert_eq!(c.purity.spacing_ns, 50_000);
        assert_eq!(c.purity.max_spacing_error_ns, 50_000);
        assert_eq!(c.purity.tolerance_ns, SOFTWARE_PURITY_NS);
        assert!(c.purity.best_of_pair);
        let nic = estimator_config_for(&Settings::default(), StampClass::Nic);
        assert_eq!(nic.purity.tolerance_ns, NIC_PURITY_NS);
        assert!(!nic.purity.best_of_pair);
        assert_eq!(nic.purity.spacing_ns, 100_000);
        let close = estimator_config(&Settings {
            packet_spacing: Nanos::from_micros(5),
            ..Settings::default()
        });
        assert_eq!(close.purity.max_spacing_error_ns, MIN_SPACING_ERROR_NS);
        let d = estimator_config(&Settings::default());
        assert_eq!(d.purity.max_spacing_error_ns, 100_000);
        assert_eq!(d.max_age_ns, 10_000_000_000);
    }
}
