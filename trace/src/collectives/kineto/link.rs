//! Which collective a call is and when its rank called it, from the CPU
//! op that issued it.
//!
//! PyTorch marks each collective call with a `record_param_comms` CPU op
//! (its process group, `Seq`, group size, input elements); the NCCL
//! kernel that runs it names only the group, and usually no `Seq`. The
//! kernel is linked to the op through Kineto's ids: its `External id` is
//! the CPU op that launched it, and its `correlation` is the launch's
//! (`cudaLaunchKernel`, `cuLaunchKernelEx`, `hipLaunchKernel`, cat
//! `cuda_runtime`/`cuda_driver`), whose `External id` or thread and time
//! lead to the op. A backend span (gloo's worker) is linked through the
//! dispatcher op that issued it.

use std::collections::HashMap;

use super::event::Args;
use super::{CallArgs, Found, Tier};

/// A `record_param_comms` CPU op (times relative ns, as written).
pub(super) struct CommsOp {
    pub(super) thread: usize,
    pub(super) start: i128,
    pub(super) end: i128,
    pub(super) args: CallArgs,
}

/// A kernel launch on the CPU: the op it belongs to, where and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Launch {
    pub(super) external_id: Option<u64>,
    pub(super) thread: usize,
    pub(super) start: i128,
}

impl Launch {
    /// The launch an event is, keyed by its correlation id: a runtime or
    /// driver call with a `correlation` (a kernel has one too, but it is
    /// on a GPU row, cat `kernel`).
    pub(super) fn of(
        cat: Option<&str>,
        thread: usize,
        start: i128,
        args: Option<&Args>,
    ) -> Option<(u64, Self)> {
        let cat = cat?;
        if !(cat.ends_with("_runtime") || cat.ends_with("_driver")) {
            return None;
        }
        let a = args?;
        Some((
            a.correlation?,
            Self {
                external_id: a.external_id,
                thread,
                start,
            },
        ))
    }
}

/// What the links lead to for one call.
pub(super) struct Link<'a> {
    /// The `record_param_comms` op of the call, if found.
    pub(super) comms: Option<&'a CommsOp>,
    /// When the rank issued the call on the CPU (relative ns): the comms
    /// op's start, else the launch's, else the issuing op's. Its step is
    /// the call's.
    pub(super) issued_at: i128,
}

/// The ops the links go through, indexed.
pub(super) struct Links<'a> {
    /// Comms ops per thread, by start.
    comms: HashMap<usize, Vec<&'a CommsOp>>,
    /// Comms ops and CPU collective ops by `External id`.
    by_external_id: HashMap<u64, Target<'a>>,
    launches: &'a HashMap<u64, Launch>,
}

/// What an `External id` names.
#[derive(Clone, Copy)]
enum Target<'a> {
    Comms(&'a CommsOp),
    /// A CPU op that is a collective (`nccl:all_reduce`, `c10d::…`): its
    /// comms op is the one that overlaps it on its thread.
    Op {
        thread: usize,
        start: i128,
        end: i128,
    },
}

impl<'a> Links<'a> {
    pub(super) fn new(
        comms: &'a [CommsOp],
        found: &'a [Found],
        launches: &'a HashMap<u64, Launch>,
    ) -> Self {
        let mut per_thread: HashMap<usize, Vec<&CommsOp>> = HashMap::new();
        let mut by_external_id = HashMap::new();
        for f in found.iter().filter(|f| f.tier != Tier::Kernel) {
            if let Some(id) = f.args.external_id {
                by_external_id.insert(
                    id,
                    Target::Op {
                        thread: f.thread,
                        start: f.start,
                        end: f.end,
                    },
                );
            }
        }
        for c in comms {
            per_thread.entry(c.thread).or_default().push(c);
            if let Some(id) = c.args.external_id {
                by_external_id.insert(id, Target::Comms(c));
            }
        }
        for v in per_thread.values_mut() {
            v.sort_by_key(|c| (c.start, c.end));
        }
        Self {
            comms: per_thread,
            by_external_id,
            launches,
        }
    }

    /// The comms op overlapping `[start, end]` on `thread`: the one that
    /// started last at or before `end` (it holds the op, or the op holds
    /// it), if it has not ended before `start`.
    fn comms_around(&self, thread: usize, start: i128, end: i128) -> Option<&'a CommsOp> {
        let v = self.comms.get(&thread)?;
        let i = v.partition_point(|c| c.start <= end);
        let c = *v.get(i.checked_sub(1)?)?;
        (c.end >= start).then_some(c)
    }

    fn by_external_id(&self, id: u64) -> Option<&'a CommsOp> {
        match *self.by_external_id.get(&id)? {
            Target::Comms(c) => Some(c),
            Target::Op { thread, start, end } => self.comms_around(thread, start, end),
        }
    }

    /// The links of a call (`f`) issued by `issue` (itself, or the
    /// dispatcher op that issued a backend span).
    pub(super) fn of(&self, f: &Found, issue: &Found) -> Link<'a> {
        if f.tier != Tier::Kernel {
            let comms = issue
                .args
                .external_id
                .and_then(|id| self.by_external_id(id))
                .or_else(|| self.comms_around(issue.thread, issue.start, issue.end));
            return Link {
                comms,
                issued_at: comms.map_or(issue.start, |c| c.start),
            };
        }
        let launch = f.args.correlation.and_then(|c| self.launches.get(&c));
        let comms = f
            .args
            .external_id
            .or(launch.and_then(|l| l.external_id))
            .and_then(|id| self.by_external_id(id))
            .or_else(|| launch.and_then(|l| self.comms_around(l.thread, l.start, l.start)));
        let issued_at = comms
            .map(|c| c.start)
            .or(launch.map(|l| l.start))
            .unwrap_or(f.start);
        Link { comms, issued_at }
    }
}
