//! One definition of each protocol setting: its configuration key, unit,
//! default, allowed range and one-line doc. [`Settings::default`] and
//! [`Settings::validate`], the agent's configuration keys (parsers,
//! `--help`, `clockmesh config`), the simulator's scenario validation and
//! the docs test all read these descriptors, so a default or a range is
//! written here and nowhere else.

use std::fmt;

use serde::{Deserialize, Deserializer, Serializer};
use thiserror::Error;

use crate::{graph::MAX_DEGREE, settings::Settings, time::Nanos};

/// The unit a setting's value is given in (the suffix of its key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Microseconds,
    Seconds,
    Nanoseconds,
    /// A plain number of things (neighbours).
    Count,
}

impl Unit {
    /// The unit's symbol as docs/configuration.md writes it (`–`: none).
    pub fn symbol(self) -> &'static str {
        match self {
            Unit::Microseconds => "µs",
            Unit::Seconds => "s",
            Unit::Nanoseconds => "ns",
            Unit::Count => "–",
        }
    }

    /// Nanoseconds in one unit (1 for a count).
    pub const fn ns(self) -> i64 {
        match self {
            Unit::Microseconds => 1_000,
            Unit::Seconds => 1_000_000_000,
            Unit::Nanoseconds | Unit::Count => 1,
        }
    }
}

/// A value's unit suffix in messages: ` µs`, nothing for a count.
impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unit::Count => Ok(()),
            other => write!(f, " {}", other.symbol()),
        }
    }
}

/// A setting's value type: a span of time ([`Nanos`]) or a count. A key
/// is written in a whole number of its unit (`probe_cadence_us = 2000`);
/// the value is typed, the unit being the key's, not the field's name.
pub trait SettingValue: Copy + PartialOrd {
    /// The value in whole `unit`s, for keys, tables and errors
    /// (saturating; never panics).
    fn to_units(self, unit: Unit) -> u64;
    /// The value written as `units` of `unit`.
    fn from_units(units: u64, unit: Unit) -> Self;
}

impl SettingValue for Nanos {
    fn to_units(self, unit: Unit) -> u64 {
        whole_units(self, unit.ns())
    }

    fn from_units(units: u64, unit: Unit) -> Self {
        Nanos::from_unsigned(units, unit.ns())
    }
}

/// `span` in whole units of `ns_per_unit` ns, as a key writes it
/// (saturating; a negative span is 0).
pub fn whole_units(span: Nanos, ns_per_unit: i64) -> u64 {
    u64::try_from(span.0 / ns_per_unit.max(1)).unwrap_or(0)
}

/// Serde of a span setting written in whole units of its key, `NS` ns each
/// (its descriptor's [`Unit::ns`]): `#[serde(serialize_with =
/// "serialize_units::<_, { PROBE_CADENCE_US.unit.ns() }>")]`, so scenario
/// files and reports carry what a configuration file does.
pub fn serialize_units<S: Serializer, const NS: i64>(
    span: &Nanos,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_u64(whole_units(*span, NS))
}

/// See [`serialize_units`]; a negative number is refused, like the agent's
/// configuration keys.
pub fn deserialize_units<'de, D: Deserializer<'de>, const NS: i64>(
    d: D,
) -> Result<Nanos, D::Error> {
    Ok(Nanos::from_unsigned(u64::deserialize(d)?, NS))
}

/// [`serialize_units`] for a setting unset by default.
pub fn serialize_optional_units<S: Serializer, const NS: i64>(
    span: &Option<Nanos>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match span {
        Some(span) => s.serialize_some(&whole_units(*span, NS)),
        None => s.serialize_none(),
    }
}

/// [`deserialize_units`] for a setting unset by default.
pub fn deserialize_optional_units<'de, D: Deserializer<'de>, const NS: i64>(
    d: D,
) -> Result<Option<Nanos>, D::Error> {
    Ok(Option::<u64>::deserialize(d)?.map(|units| Nanos::from_unsigned(units, NS)))
}

impl SettingValue for usize {
    fn to_units(self, _: Unit) -> u64 {
        u64::try_from(self).unwrap_or(u64::MAX)
    }

    fn from_units(units: u64, _: Unit) -> Self {
        usize::try_from(units).unwrap_or(usize::MAX)
    }
}

/// One protocol setting, defined once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting<T> {
    /// The configuration key, the field of [`Settings`] and of a
    /// scenario's `[agent]` table.
    pub key: &'static str,
    pub unit: Unit,
    /// The shipped default; `None`: unset unless the operator sets it.
    pub default: Option<T>,
    /// Smallest allowed value.
    pub min: T,
    /// Largest allowed value.
    pub max: T,
    /// One line for `--help` and docs/configuration.md.
    pub doc: &'static str,
}

impl<T: Copy> Setting<T> {
    /// The default, usable in constants. A setting unset by default
    /// ([`MAX_PATH_ASYMMETRY_NS`]) gives its minimum rather than a panic;
    /// read [`Setting::default`] where unset matters.
    pub const fn default_value(&self) -> T {
        match self.default {
            Some(d) => d,
            None => self.min,
        }
    }
}

impl<T: SettingValue> Setting<T> {
    /// `value` if within the range, else an error naming the key, value,
    /// unit and range.
    pub fn check(&self, value: T) -> Result<T, SettingsError> {
        if value < self.min || value > self.max {
            return Err(SettingsError::OutOfRange {
                key: self.key,
                value: value.to_units(self.unit),
                unit: self.unit,
                min: self.min.to_units(self.unit),
                max: self.max.to_units(self.unit),
            });
        }
        Ok(value)
    }

    /// The value a key gives as `units` of its unit, checked.
    pub fn from_units(&self, units: u64) -> Result<T, SettingsError> {
        self.check(T::from_units(units, self.unit))
    }

    /// `value` in whole units of the key (what a file or table shows).
    pub fn units(&self, value: T) -> u64 {
        value.to_units(self.unit)
    }

    /// The range as docs/configuration.md writes it (`50–10000000`).
    pub fn range_text(&self) -> String {
        format!("{}–{}", self.units(self.min), self.units(self.max))
    }
}

/// A setting out of its range, or settings that contradict each other.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum SettingsError {
    #[error("{key} = {value}{unit} is outside its range {min}..={max}{unit}")]
    OutOfRange {
        key: &'static str,
        value: u64,
        unit: Unit,
        min: u64,
        max: u64,
    },
    /// A pair's two probes must fit within the cadence.
    #[error(
        "packet_spacing_us = {spacing_us} µs must be less than probe_cadence_us = {cadence_us} µs"
    )]
    SpacingNotBelowCadence { spacing_us: u64, cadence_us: u64 },
}

/// Interval between coded pairs on one edge. At least 50 µs: a pair's two
/// probes and their stamps must be handled well within it.
pub const PROBE_CADENCE_US: Setting<Nanos> = Setting {
    key: "probe_cadence_us",
    unit: Unit::Microseconds,
    default: Some(Nanos::from_millis(100)),
    min: Nanos::from_micros(50),
    max: Nanos::from_secs(10),
    doc: "interval between coded pairs on one edge, µs",
};

/// Spacing between the two probes of a pair (purity compares the TX gap
/// with the RX gap); must also be below [`PROBE_CADENCE_US`].
pub const PACKET_SPACING_US: Setting<Nanos> = Setting {
    key: "packet_spacing_us",
    unit: Unit::Microseconds,
    default: Some(Nanos::from_micros(100)),
    min: Nanos::from_micros(1),
    max: Nanos::from_millis(100),
    doc: "spacing between the two probes of a pair, µs",
};

/// The estimation window: one result per window.
pub const PROBE_WINDOW_S: Setting<Nanos> = Setting {
    key: "probe_window_s",
    unit: Unit::Seconds,
    default: Some(Nanos::from_secs(1)),
    min: Nanos::from_secs(1),
    max: Nanos::from_secs(3600),
    doc: "estimation window, s",
};

/// Out-degree of the probe graph, at most what the graph supports
/// ([`MAX_DEGREE`]). Huygens used 10-20 on large clusters; 4 is plenty for
/// small ones and keeps probe traffic low.
pub const DEGREE: Setting<usize> = Setting {
    key: "degree",
    unit: Unit::Count,
    default: Some(4),
    min: 1,
    max: MAX_DEGREE,
    doc: "out-neighbours each node probes",
};

/// The most pairs one peer gets per cadence. A NIC-stamped direction whose
/// queues leave few pairs pure is probed up to this many times faster, in
/// powers of two (`core/src/probe_rate.rs`); 1 keeps every peer at the
/// cadence. 8: the scenario family's busy-queue NIC members were within
/// 20 ns 34 of 46 at 4, 42 at 8 (docs/estimator.md §8).
pub const MAX_PAIRS_PER_CADENCE: Setting<usize> = Setting {
    key: "max_pairs_per_cadence",
    unit: Unit::Count,
    default: Some(8),
    min: 1,
    max: 16,
    doc: "most coded pairs one peer gets per cadence: a NIC-stamped direction whose busy queues leave few pairs pure is probed up to this many times faster (powers of two); 1: every peer at the cadence",
};

/// Operator knowledge of path asymmetry; unset by default because a wrong
/// value makes every bound lie.
pub const MAX_PATH_ASYMMETRY_NS: Setting<Nanos> = Setting {
    key: "max_path_asymmetry_ns",
    unit: Unit::Nanoseconds,
    default: None,
    min: Nanos::ZERO,
    max: Nanos::from_secs(1),
    doc: "known limit on the difference between the two directions' minimum one-way delays, ns; replaces the ½-RTT asymmetry allowance in each edge's bound (unset: unknown; a wrong value makes every bound lie)",
};

/// The holdover ceiling written into every offsets record (0: never hold).
pub const HOLDOVER_MAX_BOUND_NS: Setting<Nanos> = Setting {
    key: "holdover_max_bound_ns",
    unit: Unit::Nanoseconds,
    default: Some(Nanos::from_micros(10)),
    min: Nanos::ZERO,
    max: Nanos::from_secs(1),
    doc: "holdover ceiling written into every offsets record, ns: past a result's validity readers keep answering (state holdover) while its bound, grown at the published rate, stays at most this; then stale. 0: stale right past the validity",
};

/// A setting described as text, whatever its value type: for tables
/// (docs, `clockmesh config`) that list every setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingText {
    pub key: &'static str,
    pub unit: Unit,
    /// `None`: unset by default.
    pub default: Option<String>,
    /// `min–max`.
    pub range: String,
    pub doc: &'static str,
}

impl<T: SettingValue> From<&Setting<T>> for SettingText {
    fn from(s: &Setting<T>) -> Self {
        SettingText {
            key: s.key,
            unit: s.unit,
            default: s.default.map(|d| s.units(d).to_string()),
            range: s.range_text(),
            doc: s.doc,
        }
    }
}

/// Every protocol setting, in [`Settings`] field order.
pub fn all() -> [SettingText; 7] {
    [
        SettingText::from(&PROBE_CADENCE_US),
        SettingText::from(&PACKET_SPACING_US),
        SettingText::from(&PROBE_WINDOW_S),
        SettingText::from(&DEGREE),
        SettingText::from(&MAX_PAIRS_PER_CADENCE),
        SettingText::from(&MAX_PATH_ASYMMETRY_NS),
        SettingText::from(&HOLDOVER_MAX_BOUND_NS),
    ]
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            probe_cadence: PROBE_CADENCE_US.default_value(),
            packet_spacing: PACKET_SPACING_US.default_value(),
            probe_window: PROBE_WINDOW_S.default_value(),
            degree: DEGREE.default_value(),
            max_pairs_per_cadence: MAX_PAIRS_PER_CADENCE.default_value(),
            max_path_asymmetry: MAX_PATH_ASYMMETRY_NS.default,
            holdover_max_bound: HOLDOVER_MAX_BOUND_NS.default_value(),
        }
    }
}

impl Settings {
    /// Each setting within its range, and a pair's spacing below its
    /// cadence: what the agent accepts. The first violation, as a typed
    /// error naming the key, value, unit and range.
    pub fn validate(&self) -> Result<(), SettingsError> {
        PROBE_CADENCE_US.check(self.probe_cadence)?;
        PACKET_SPACING_US.check(self.packet_spacing)?;
        PROBE_WINDOW_S.check(self.probe_window)?;
        DEGREE.check(self.degree)?;
        MAX_PAIRS_PER_CADENCE.check(self.max_pairs_per_cadence)?;
        if let Some(a) = self.max_path_asymmetry {
            MAX_PATH_ASYMMETRY_NS.check(a)?;
        }
        HOLDOVER_MAX_BOUND_NS.check(self.holdover_max_bound)?;
        check_spacing_below_cadence(self.packet_spacing, self.probe_cadence)
    }
}

/// A pair's two probes must both go out within one cadence.
pub fn check_spacing_below_cadence(spacing: Nanos, cadence: Nanos) -> Result<(), SettingsError> {
    if spacing >= cadence {
        return Err(SettingsError::SpacingNotBelowCadence {
            spacing_us: PACKET_SPACING_US.units(spacing),
            cadence_us: PROBE_CADENCE_US.units(cadence),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_the_shipped_ones() {
        let d = Settings::default();
        assert_eq!(d.validate(), Ok(()));
        assert_eq!(
            (d.probe_cadence, d.packet_spacing, d.probe_window, d.degree),
            (
                Nanos::from_millis(100),
                Nanos::from_micros(100),
                Nanos::from_secs(1),
                4
            )
        );
        assert_eq!(
            (d.max_path_asymmetry, d.holdover_max_bound),
            (None, Nanos(10_000))
        );
    }

    #[test]
    fn an_error_names_the_key_value_unit_and_range() {
        let s = Settings {
            probe_cadence: Nanos::from_micros(20),
            ..Settings::default()
        };
        let e = s.validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "probe_cadence_us = 20 µs is outside its range 50..=10000000 µs"
        );
        let s = Settings {
            degree: 21,
            ..Settings::default()
        };
        assert_eq!(
            s.validate().unwrap_err().to_string(),
            "degree = 21 is outside its range 1..=20"
        );
        let s = Settings {
            max_path_asymmetry: Some(Nanos::from_secs(2)),
            ..Settings::default()
        };
        assert!(matches!(
            s.validate(),
            Err(SettingsError::OutOfRange {
                key: "max_path_asymmetry_ns",
                unit: Unit::Nanoseconds,
                ..
            })
        ));
    }

    #[test]
    fn the_spacing_must_be_below_the_cadence() {
        let s = Settings {
            probe_cadence: Nanos::from_micros(800),
            packet_spacing: Nanos::from_micros(800),
            ..Settings::default()
        };
        assert_eq!(
            s.validate(),
            Err(SettingsError::SpacingNotBelowCadence {
                spacing_us: 800,
                cadence_us: 800
            })
        );
    }

    #[test]
    fn the_table_lists_every_setting_once() {
        let keys: Vec<&str> = all().iter().map(|s| s.key).collect();
        assert_eq!(
            keys,
            [
                "probe_cadence_us",
                "packet_spacing_us",
                "probe_window_s",
                "degree",
                "max_pairs_per_cadence",
                "max_path_asymmetry_ns",
                "holdover_max_bound_ns"
            ]
        );
        assert_eq!(all()[3].range, "1–20");
        // The keys are the fields' serialized names (a scenario's `[agent]`).
        let json = serde_json::to_value(Settings::default()).unwrap();
        let mut fields: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        fields.sort_unstable();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!(fields, sorted);
        assert_eq!(all()[4].default.as_deref(), Some("8"));
        assert_eq!(all()[5].default, None);
        // Each is written in its key's unit and read back to the same span.
        assert_eq!(json["probe_cadence_us"], 100_000);
        assert_eq!(json["probe_window_s"], 1);
        assert_eq!(json["holdover_max_bound_ns"], 10_000);
        assert_eq!(all()[0].default.as_deref(), Some("100000"));
        assert_eq!(
            serde_json::from_value::<Settings>(json).unwrap(),
            Settings::default()
        );
    }
}
