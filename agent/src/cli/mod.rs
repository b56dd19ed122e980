//! Subcommands of the `clockmesh` binary, one module each.
pub mod agent;
pub mod capture;
pub mod config;
pub mod files;
pub mod gpu;
pub mod offsets;
#[macro_use]
pub mod out;
pub mod report;
pub mod simulate;
pub mod sources;
pub mod status;
pub mod trace;
