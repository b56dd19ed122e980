//! Device-clock planes: planes whose timestamps are raw readings of a GPU's
//! own clock (in-kernel `%globaltimer`, AMD `s_memrealtime`, KFD counters),
//! placed on the global timeline through the agent's published device maps
//! (device → host REALTIME) composed with the node offset (host → global).
//!
//! Only planes named with `--device-clock` or declaring their clock with
//! the `clock_domain` + `clock_device` plane stats qualify: CUPTI and
//! roctracer `/device:GPU:N` planes are already in host time.
//!
//! Per mapped line the merge does three walks over the line's bytes, all
//! before or while writing and none holding more than one event: (A) map
//! every time, fail closed, find the new line start; (B) the same writer as
//! (C) into a byte counter, for the new length; (C) the rewrite itself.
//! Memory stays O(lines). Design and limits: `docs/trace-merge.md`.

mod event;
mod host;
mod placer;
mod resolve;
mod spec;
#[cfg(test)]
mod tests;
mod timeline;
mod walk;

use crate::plan::DeviceError;

pub use host::{DeviceContext, HostDevices, plan_host};
pub use resolve::{check_specs_used, resolve_planes};
pub use spec::{DeviceClockSpec, SpecError};

/// Errors are cold and large: boxed.
type DevResult<T> = Result<T, Box<DeviceError>>;
