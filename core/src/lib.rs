//! clockmesh-core: the protocol's pure parts — what the agent and the
//! simulator share, with no I/O, no `unsafe` and no async runtime:
//!
//! - [`wire`]: probe, follow-up, RX-report, handshake and record datagrams
//!   (`docs/protocol.md`), with the optional HMAC;
//! - [`graph`]: the directed probe graph every node computes alike;
//! - [`collector`] and [`pairs`]: stamps of each packet settled into coded
//!   pairs, the best stamp per packet, the bounded pair book per edge;
//! - [`history`]: each out-edge's fit over the longest history its data allow;
//! - [`peers`]: per-peer handshake state and backoff;
//! - [`codec`]: edge fits and node results to and from protobuf (the only
//!   module that knows the wire's types), and a result read back from the
//!   offsets file;
//! - [`time`]: instants of a node's clock and window indices as types;
//! - [`result`]: a node's result, the domain type everything publishes;
//! - [`fits`]: the edge fits each node shares with the solver per window;
//! - [`stamps`]: clock domains, MONOTONIC/PHC → REALTIME maps, each event's
//!   stamps and their source;
//! - [`setting`]: each protocol setting's one definition (key, unit,
//!   default, range, doc), read by config, core and the simulator;
//! - [`settings`]: the agent's protocol settings and the one function that
//!   turns them into the estimator's configuration;
//! - [`report`]: what a node reports (edge status, edge lines, timings);
//! - [`window_clock`]: when each window phase is due on the local clock;
//! - [`node`]: one node's protocol as a state machine that returns actions;
//! - [`publication`]: what a node publishes for a result, whole: the
//!   offsets record as readers see it, the history line and the `/status`
//!   view.
//!
//! The agent (`agent/`) does the I/O around these; the estimator
//! (`clockmesh-estimator`) does the maths.
#![forbid(unsafe_code)]
// Every numeric conversion is deliberate: through the named helpers of
// `clockmesh_estimator::convert`, or an `#[expect]` that says why.
#![warn(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap,
    clippy::cast_precision_loss
)]
// Test fixtures cast freely; the library build above is what is held to it.
#![cfg_attr(
    test,
    allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_possible_wrap,
        clippy::cast_precision_loss
    )
)]

pub mod codec;
pub mod collector;
pub mod fits;
pub mod graph;
pub mod history;
pub mod node;
pub mod pairs;
pub mod peers;
pub mod probe_rate;
pub mod publication;
pub mod report;
pub mod result;
pub mod setting;
pub mod settings;
pub mod span_choice;
pub mod stamps;
pub mod succession;
pub mod tally;
pub mod time;
pub mod timeline;
pub mod window_clock;
pub mod wire;
