//! Collectives across ranks on one timeline (`clockmesh trace collectives`):
//! which rank arrives last at each collective instance, by how much, how
//! long the others wait for it, and whether the alignment is consistent
//! (no rank may leave an all-reduce before the last one entered it).
//! Design: `docs/trace-merge.md`, "Collectives".

mod align;
pub mod analyse;
pub mod classify;
pub mod critical;
pub mod critical_render;
pub mod inputs;
pub mod kineto;
pub mod model;
pub mod render;
mod timeline;
pub mod xplane;

pub use analyse::{Analysis, AnalysisOptions, analyse};
pub use classify::{Classified, Phase, classify, classify_comms_arg, classify_name};
pub use model::*;
pub use timeline::RankTrace;
pub(crate) use timeline::{
    Timed, file_host, preceding_before, step_at, step_begun_before, step_spans,
};
