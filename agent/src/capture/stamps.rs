//! Every timestamp of an event, tagged with its clock domain, and brought to
//! the node's REALTIME through measured maps: pure, in `clockmesh-core`.

pub use clockmesh_core::stamps::{Stamp, event_stamps, stamp_source, to_realtime};
