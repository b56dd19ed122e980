//! `clockmesh report`'s library: one self-contained HTML page from the
//! agent's JSONL history — offset ± bound and drift per node, min RTT and
//! pure ratio per edge, the probe graph, GPU device maps, and, given the
//! injected truth, estimated − true; with a trace merge's summary and a
//! collectives analysis, what the merge did per host and who arrived last
//! at each collective; with critical paths, what bounded each step. The input files are read in [`read`]; the page
//! itself is built without I/O ([`render`]). The `clockmesh` binary's
//! `report` subcommand parses the flags and writes the page.
//!
//! Depends on the pure libraries (core's line types, offsets' history,
//! trace's summaries and analysis, the simulator's injected skew), never
//! on the agent.

mod collectives;
mod critical;
mod html;
mod lines;
pub mod read;
mod svg;
mod truth;

pub use html::{Inputs, render};
pub use lines::{History, LinesError};
pub use truth::{Truth, TruthError};
