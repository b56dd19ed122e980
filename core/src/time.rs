//! Time as types at the protocol's seams (`clockmesh-time`): instants of a
//! node's own clock and of the global timeline, signed spans, window
//! indices. The unit is in the type, not in a field's name.

pub use clockmesh_time::{GlobalNs, LocalNs, Nanos, WindowIndex};
