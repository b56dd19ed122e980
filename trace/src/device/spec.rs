//! `--device-clock [HOST:]PLANE=DEVICE` specs: parsed and printed.

use std::fmt;
use std::str::FromStr;

/// `--device-clock [HOST:]PLANE=DEVICE`: PLANE's timestamps are raw
/// readings of DEVICE's clock (on HOST, or on every host).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceClockSpec {
    pub host: Option<String>,
    pub plane: String,
    pub device: String,
}

impl fmt::Display for DeviceClockSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(h) = &self.host {
            write!(f, "{h}:")?;
        } else if !self.plane.starts_with('/') && self.plane.contains(':') {
            f.write_str(":")?;
        }
        write!(f, "{}={}", self.plane, self.device)
    }
}

/// A `--device-clock` value that does not parse.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("expected [HOST:]PLANE=DEVICE (e.g. \"/device:GPU:0=nvidia:0\"), got {0:?}")]
    Syntax(String),
    #[error("no plane name in {0:?} (expected [HOST:]PLANE=DEVICE)")]
    NoPlane(String),
    #[error("no device in {0:?} (expected a device such as nvidia:0 after '=')")]
    NoDevice(String),
}

impl FromStr for DeviceClockSpec {
    type Err = SpecError;

    /// The device is after the last '='. A plane name starting with '/'
    /// (XLA's `/device:GPU:0`) has no host prefix; otherwise text before
    /// the first ':' is the host (empty: every host).
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let (lhs, device) = s
            .rsplit_once('=')
            .ok_or_else(|| SpecError::Syntax(s.into()))?;
        let device = device.trim();
        if device.is_empty() || device.contains(char::is_whitespace) {
            return Err(SpecError::NoDevice(s.into()));
        }
        let (host, plane) = match lhs.split_once(':') {
            Some((h, p)) if !lhs.starts_with('/') => ((!h.is_empty()).then_some(h), p),
            _ => (None, lhs),
        };
        if plane.is_empty() {
            return Err(SpecError::NoPlane(s.into()));
        }
        Ok(Self {
            host: host.map(str::to_string),
            plane: plane.into(),
            device: device.into(),
        })
    }
}
