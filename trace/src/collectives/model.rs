//! What the collectives analysis reads: one call of a collective by one
//! rank, on one timeline (global after a merge, raw host clocks with
//! `--no-align`), with the rank's alignment bound. The parsers
//! ([`super::kineto`], [`super::xplane`]) produce these; [`super::analyse`]
//! turns them into instances, stragglers and the causality check.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A name many calls share (an op, a group, a module): one allocation per
/// distinct name in a trace, however many calls carry it.
pub type Name = Arc<str>;

/// Hands out one [`Name`] per distinct string (a reader's calls of one op
/// share it: memory grows with the calls, not with their names' bytes).
#[derive(Debug, Default)]
pub(crate) struct Interner(std::collections::HashMap<Box<str>, Name>);

impl Interner {
    pub(crate) fn name(&mut self, s: &str) -> Name {
        if let Some(n) = self.0.get(s) {
            return n.clone();
        }
        let n: Name = Arc::from(s);
        self.0.insert(s.into(), n.clone());
        n
    }
}

/// Which profiler a rank's trace came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Framework {
    /// xprof `.xplane.pb` (JAX, TensorFlow, any XLA program).
    Xla,
    /// PyTorch profiler (Kineto Chrome JSON). `pytorch` in JSON, not
    /// snake_case's `py_torch`.
    #[serde(rename = "pytorch")]
    PyTorch,
}

/// What a collective does: decides which ordering the causality check
/// may demand of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveKind {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Barrier,
    Broadcast,
    Reduce,
    Gather,
    Scatter,
    CollectivePermute,
    SendRecv,
}

impl CollectiveKind {
    /// Every rank's result depends on every rank's input, so no rank can
    /// leave before the last one has entered (the causality check applies).
    pub fn waits_for_all(self) -> bool {
        matches!(
            self,
            Self::AllReduce
                | Self::AllGather
                | Self::ReduceScatter
                | Self::AllToAll
                | Self::Barrier
        )
    }
}

/// One rank of the analysed job: a trace file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Participant {
    /// The host (node name) the rank ran on, as the merge names it.
    pub host: String,
    /// The job's rank (PyTorch `distributedInfo.rank`, JAX process index)
    /// when the trace says.
    pub rank: Option<u64>,
    pub framework: Framework,
    /// The trace file it came from.
    pub trace: String,
    /// The trace's stated alignment bound (ns): worst over its session
    /// (`clock_alignment_bound_ns`, Kineto `clockmesh.alignment_bound_ns`).
    /// `None`: not merged by clockmesh, or `--no-align` (raw clocks).
    pub bound_ns: Option<u64>,
}

/// How calls on different ranks are known to be the same instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchedBy {
    /// The profiler's own sequence number of the process group (PyTorch
    /// `record_param_comms` `Seq`).
    Sequence,
    /// The XLA run id that XLA's own rendezvous keys the collective by.
    RunId,
    /// The ranks' sequences of calls in the group, aligned by kind, name,
    /// group size and elements in order (a rank's capture may start or
    /// stop at other calls than another's): `ordinal` is the place in the
    /// reference rank's sequence.
    Occurrence,
    /// As [`MatchedBy::Occurrence`], where the sequences fit at several
    /// shifts (a periodic job) and the one at which the ranks' exits line
    /// up far better than at any other was taken.
    ExitTimes,
}

/// Which instance a call belongs to: equal keys on different ranks are one
/// instance.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct InstanceKey {
    /// The framework's group: PyTorch process group name, XLA program
    /// (module) name.
    pub group: Name,
    /// The collective as the framework names it across ranks (PyTorch
    /// collective name, XLA HLO op name).
    pub name: Name,
    /// Sequence number, run id or occurrence (see [`MatchedBy`]).
    pub ordinal: u64,
}

/// What a rank did just before it entered a collective.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Preceding {
    /// The last event that ended before the call on the same thread (for
    /// a GPU call: on any stream of its device).
    pub name: Name,
    /// Its start and end on the analysed timeline (ns).
    pub start_ns: i64,
    pub end_ns: i64,
}

/// Where a call sits in its file: in an xplane file the plane's index
/// among the file's planes and the line's id; in a Kineto file plane 0 and
/// the thread's number ((pid, tid) in order of first appearance). The
/// process and thread of the Chrome JSON that `trace merge --perfetto`
/// writes, for pointing at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Track {
    pub plane: u32,
    pub line: i64,
}

/// Which clock stamped a call, as far as the analysis' bounds are concerned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallClock {
    /// The host's clock (a CPU op, a backend span).
    #[default]
    Host,
    /// The GPU's clock, converted to host time by the profiler (CUPTI, in
    /// Kineto and XLA alike): a kernel, an XLA op on a `/device:` plane.
    Gpu,
}

/// The profiler's GPU→host conversion error a GPU stamp may carry beyond
/// its host's alignment bound. Measured on an H200 (CUDA 13.0, CUPTI
/// 13.0.1, PyTorch 2.11) against clockmesh's own map of the same GPU's
/// `%globaltimer` (`python/gpu/cupti_conversion.py`, docs/gpu-clocks.md):
/// Kineto's kernel starts sat 0–512 ns before the kernel's own first clock
/// read, mapped; the map itself errs up to ~250 ns (p99). 1 µs covers both
/// with room; XLA's conversion was not measured separately.
pub const PROFILER_GPU_CONVERSION_NS: u64 = 1_000;

impl CallClock {
    /// What this clock adds to the host's bound.
    pub fn conversion_ns(self) -> u64 {
        match self {
            Self::Host => 0,
            Self::Gpu => PROFILER_GPU_CONVERSION_NS,
        }
    }
}

/// One rank's call of one collective.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CollectiveCall {
    /// Index into the analysis' participants.
    pub participant: usize,
    pub kind: CollectiveKind,
    pub key: InstanceKey,
    pub matched_by: MatchedBy,
    /// The event's own name in the trace (`gloo:all_reduce`,
    /// `ncclDevKernel_AllReduce_Sum_f32_RING_LL`, `all-reduce.3`).
    pub op: Name,
    /// Enter and exit on the analysed timeline, epoch ns.
    pub enter_ns: i64,
    pub exit_ns: i64,
    /// The training step it belongs to, when the trace marks steps.
    pub step: Option<u64>,
    /// How many ranks take part, when the trace says (PyTorch group size).
    pub group_size: Option<u32>,
    /// Elements of the rank's input, when the trace says (PyTorch
    /// `In msg nelems`): part of what must agree when calls are matched
    /// by their order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elements: Option<u64>,
    /// What the rank did right before entering.
    pub preceding: Option<Preceding>,
    /// The clock that stamped it (GPU stamps carry the profiler's
    /// conversion error too).
    #[serde(default)]
    pub clock: CallClock,
    /// Its plane and line (see [`Track`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub track: Option<Track>,
}

/// One training step's span on one rank's host timeline (PyTorch
/// `ProfilerStep#N`, XLA `StepTraceAnnotation`), on the analysed timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepSpan {
    pub step: u64,
    pub start_ns: i64,
    pub end_ns: i64,
}
