//! The cross-rank critical path of each step (`clockmesh trace
//! critical-path`), each rank's time by kind, and what-if.
//!
//! Definitions (design: `docs/trace-merge.md`, "Critical path"):
//!
//! * A rank's **chain** in step N: its calls whose step is N, by enter.
//!   Before each call k, the interval from its **anchor** to its enter is
//!   split into *other* (before the op that preceded the call), *work*
//!   (that op: the last event that ended before the call on the issuing
//!   thread; for a GPU call, on its device, any stream) and the *gap* (after it: the
//!   host's gap, and for a GPU call its launch → kernel latency). The anchor is the previous call's exit
//!   when k entered after it, else the previous call's enter (the calls
//!   overlap: k waited only for its issue); the first call's is the rank's
//!   **chain start**: the step's start (the earliest start of step N over
//!   the ranks), or the exit of the rank's previous call where that is
//!   later (and before the call's enter).
//!   Where the rank's own step span began after its chain start, the time
//!   up to it is a *late start* (host time between steps: a host gap).
//! * A rank's **end**: the later of its step span's end and its last exit.
//!   The step runs from its start to the latest end; the *tail* follows
//!   the call that exited last.
//! * The **critical path**: from the rank that ended last, back through its
//!   tail and the call that exited last; at a matched instance the part
//!   after the last arrival is the collective's own time, and the path
//!   jumps to the last arriver's enter (*order uncertain* when that arrival
//!   is not significant); then the arriver's gap, work and other time, to
//!   its anchor, and so on to the chain start.
//! * **What-if**: the chains replayed with one op's duration changed: a
//!   call enters at its anchor + other + work + gap; a matched instance
//!   completes on each rank at the latest replayed enter over its ranks
//!   plus that rank's own completion time (exit − last enter, measured);
//!   the tail is kept. Nothing is subtracted.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use super::analyse::{Analysis, Instance};
use super::model::{CollectiveCall, InstanceKey, Name, Participant, StepSpan, Track};

/// What to compute besides the paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CriticalOptions {
    pub what_if: Vec<WhatIf>,
}

/// "If op `op` on participant `participant` took `duration`".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhatIf {
    pub participant: usize,
    pub op: Name,
    pub duration: WhatIfDuration,
}

/// The duration a what-if gives the op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhatIfDuration {
    /// Its median over every step of that rank.
    Median,
    /// A given duration, ns.
    Ns(u64),
}

/// Everything `clockmesh trace critical-path` reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CriticalPaths {
    pub participants: Vec<Participant>,
    /// Per step, by step.
    pub steps: Vec<StepPath>,
    /// What topped the path (its longest segment), most often first.
    pub tops: Vec<TopCount>,
    pub what_if: Vec<WhatIfResult>,
}

/// One step's critical path and its ranks' time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepPath {
    pub step: u64,
    pub start_ns: i64,
    pub end_ns: i64,
    pub duration_ns: u64,
    /// The path in time order.
    pub segments: Vec<Segment>,
    /// Index into `segments` of the longest one.
    pub top: Option<usize>,
    /// Hops where the order of the two last arrivers is within their
    /// combined bound.
    pub uncertain_hops: u64,
    /// Per participant with calls in the step.
    pub ranks: Vec<RankTime>,
}

/// What a piece of the path is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentKind {
    /// From the step's start to the rank's chain start (its previous
    /// step's calls still running).
    CarryOver,
    /// From the step's start (on the rank that began it first) to this
    /// rank's own start of it: time between steps on its host, a host gap.
    LateStart,
    /// On the issuing thread before the op that preceded a call (work the
    /// analysis keeps no event of).
    Other,
    /// The op that preceded a call.
    Work,
    /// After that op, before the call: the host's gap (and a GPU call's
    /// launch → kernel latency).
    Gap,
    /// A collective's own time after its last arrival (the whole call for
    /// one not matched across ranks).
    Collective,
    /// After the rank's last call, to its step's end.
    Tail,
}

/// One piece of the path.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub participant: usize,
    pub kind: SegmentKind,
    /// The op (work; other: the op it came before), the call (collective;
    /// gap, late start and carry-over: the call they came before), or the
    /// call the tail follows.
    pub op: Name,
    pub start_ns: i64,
    pub end_ns: i64,
    pub duration_ns: u64,
    /// The call's plane and line (collective segments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub track: Option<Track>,
    /// Where the path came from another rank to this collective's last
    /// arriver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hop: Option<Hop>,
}

/// The path's jump to an instance's last arriver.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hop {
    /// The rank the path came from (it waited) and the last arriver.
    pub from: usize,
    pub to: usize,
    pub key: InstanceKey,
    pub order: HopOrder,
}

/// Whether the last arriver is known to be last.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "order")]
pub enum HopOrder {
    /// Late beyond the two last arrivers' combined bound.
    Certain,
    /// Within it: `other` may have been last.
    Uncertain {
        other: usize,
        late_by_ns: u64,
        combined_bound_ns: u64,
    },
}

/// One rank's time in one step (sums over its chain).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankTime {
    pub participant: usize,
    /// Work: the ops that preceded its calls.
    pub compute_ns: u64,
    /// Other time on the issuing thread (no event kept).
    pub other_ns: u64,
    pub gap_ns: u64,
    /// Waiting in its calls for the last arriver (last enter − own enter,
    /// at most the call).
    pub waiting_ns: u64,
    /// Its calls after the last arrival, less what overlaps its work.
    pub exposed_communication_ns: u64,
}

/// How often one (rank, kind, op) was the longest segment of a path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopCount {
    pub participant: usize,
    pub kind: SegmentKind,
    pub op: Name,
    pub steps: u64,
    /// Its duration summed over those steps.
    pub total_ns: u64,
}

/// One what-if, replayed over every step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WhatIfResult {
    pub what_if: WhatIf,
    /// The duration given to the op (the median, or as asked); `None`:
    /// the rank never ran the op before a call.
    pub duration_ns: Option<u64>,
    pub steps: Vec<WhatIfStep>,
}

/// A step's measured duration and the one replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhatIfStep {
    pub step: u64,
    pub measured_ns: u64,
    pub predicted_ns: u64,
}

/// Paths, times and what-ifs of a job: `calls` as given to
/// [`super::analyse()`] (before it), `steps` per participant. Never panics.
pub fn critical_paths(
    analysis: &Analysis,
    calls: &[CollectiveCall],
    steps: &[Vec<StepSpan>],
    opts: &CriticalOptions,
) -> CriticalPaths {
    let job = Job::new(analysis, calls, steps);
    let paths: Vec<StepPath> = job.steps.iter().map(|s| job.path(s)).collect();
    let what_if = opts.what_if.iter().map(|w| job.what_if(w)).collect();
    CriticalPaths {
        participants: analysis.participants.clone(),
        tops: tops(&paths),
        steps: paths,
        what_if,
    }
}

/// Where a call stands before its enter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Anchor {
    Start,
    PreviousExit,
    PreviousEnter,
}

/// One call of a chain, with the time before it split.
#[derive(Clone, Debug)]
struct Node {
    call: usize,
    instance: Option<usize>,
    anchor: Anchor,
    anchor_ns: i64,
    /// Before the rank's own step span began (first call only).
    late_ns: i64,
    other_ns: i64,
    work_ns: i64,
    gap_ns: i64,
    /// The preceding op and its whole duration.
    work: Option<(Name, i64)>,
    /// exit − last enter (matched), exit − enter (not).
    own_ns: i64,
}

/// One rank's chain in one step.
#[derive(Clone, Debug)]
struct Chain {
    participant: usize,
    start_ns: i64,
    end_ns: i64,
    nodes: Vec<Node>,
}

/// One step: its chains.
#[derive(Clone, Debug)]
struct Step {
    step: u64,
    start_ns: i64,
    chains: Vec<Chain>,
    /// (participant, instance) → (chain, node).
    at: HashMap<(usize, usize), (usize, usize)>,
}

struct Job<'a> {
    analysis: &'a Analysis,
    calls: &'a [CollectiveCall],
    steps: Vec<Step>,
}

fn span(a: i64, b: i64) -> i64 {
    b.saturating_sub(a).max(0)
}

fn unsigned(ns: i64) -> u64 {
    u64::try_from(ns).unwrap_or(0)
}

impl<'a> Job<'a> {
    fn new(analysis: &'a Analysis, calls: &'a [CollectiveCall], steps: &[Vec<StepSpan>]) -> Self {
        let instance_of = instance_index(analysis);
        let n = analysis.participants.len();
        let mut by_rank: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, c) in calls.iter().enumerate() {
            if c.participant < n && c.exit_ns >= c.enter_ns {
                by_rank[c.participant].push(i);
            }
        }
        for v in &mut by_rank {
            v.sort_by_key(|&i| (calls[i].enter_ns, calls[i].exit_ns));
        }
        // step → participant → positions in `by_rank` (one pass: the job's
        // cost grows with its calls, not calls × steps).
        let mut by_step: BTreeMap<u64, BTreeMap<usize, Vec<usize>>> = BTreeMap::new();
        for (p, v) in by_rank.iter().enumerate() {
            for (pos, &i) in v.iter().enumerate() {
                if let Some(step) = calls[i].step {
                    by_step
                        .entry(step)
                        .or_default()
                        .entry(p)
                        .or_default()
                        .push(pos);
                }
            }
        }
        let ctx = Context {
            analysis,
            calls,
            by_rank: &by_rank,
            steps,
            instance_of: &instance_of,
        };
        let steps = by_step
            .into_iter()
            .map(|(step, ranks)| ctx.step(step, ranks))
            .collect();
        Self {
            analysis,
            calls,
            steps,
        }
    }
}

/// (participant, enter, exit) → the matched instance holding that call.
fn instance_index(analysis: &Analysis) -> HashMap<(usize, i64, i64), usize> {
    let mut index = HashMap::new();
    for (i, inst) in analysis.instances.iter().enumerate() {
        for r in &inst.ranks {
            index.insert((r.participant, r.enter_ns, r.exit_ns), i);
        }
    }
    index
}

fn step_span(steps: &[Vec<StepSpan>], participant: usize, step: u64) -> Option<StepSpan> {
    steps
        .get(participant)?
        .iter()
        .find(|s| s.step == step)
        .copied()
}

/// What building the chains reads.
struct Context<'c> {
    analysis: &'c Analysis,
    calls: &'c [CollectiveCall],
    /// Per participant, its calls by enter.
    by_rank: &'c [Vec<usize>],
    steps: &'c [Vec<StepSpan>],
    instance_of: &'c HashMap<(usize, i64, i64), usize>,
}

impl Context<'_> {
    /// Step `step`'s chains (`ranks`: participant → positions of its calls
    /// of the step in `by_rank`), the time before each call split (see the
    /// module's definitions).
    fn step(&self, step: u64, ranks: BTreeMap<usize, Vec<usize>>) -> Step {
        let first_start = |p: usize, first: &CollectiveCall| {
            step_span(self.steps, p, step)
                .map(|s| s.start_ns)
                .unwrap_or_else(|| {
                    first
                        .preceding
                        .as_ref()
                        .map_or(first.enter_ns, |w| w.start_ns.min(first.enter_ns))
                })
        };
        let start_ns = ranks
            .iter()
            .map(|(&p, v)| first_start(p, &self.calls[self.by_rank[p][v[0]]]))
            .min()
            .unwrap_or(0);
        let chains: Vec<Chain> = ranks
            .into_iter()
            .map(|(p, positions)| {
                self.chain(p, &positions, start_ns, step_span(self.steps, p, step))
            })
            .collect();
        let mut at = HashMap::new();
        for (ci, c) in chains.iter().enumerate() {
            for (ni, n) in c.nodes.iter().enumerate() {
                if let Some(inst) = n.instance {
                    at.insert((c.participant, inst), (ci, ni));
                }
            }
        }
        Step {
            step,
            start_ns,
            chains,
            at,
        }
    }

    /// One rank's chain: its calls at `positions` of `by_rank`.
    fn chain(
        &self,
        participant: usize,
        positions: &[usize],
        step_start: i64,
        span_of_step: Option<StepSpan>,
    ) -> Chain {
        let calls = self.calls;
        let mine: Vec<usize> = positions
            .iter()
            .map(|&pos| self.by_rank[participant][pos])
            .collect();
        let first = &calls[mine[0]];
        // The rank's previous call, where it exited inside the step and
        // before this one entered.
        let before = positions[0]
            .checked_sub(1)
            .map(|pos| calls[self.by_rank[participant][pos]].exit_ns)
            .filter(|&x| x <= first.enter_ns);
        let start_ns = before
            .map_or(step_start, |x| x.max(step_start))
            .min(first.enter_ns);
        let mut nodes: Vec<Node> = Vec::with_capacity(mine.len());
        for &i in &mine {
            let c = &calls[i];
            let (anchor, anchor_ns) = match nodes.last() {
                None => (Anchor::Start, start_ns),
                Some(prev) if c.enter_ns >= calls[prev.call].exit_ns => {
                    (Anchor::PreviousExit, calls[prev.call].exit_ns)
                }
                Some(prev) => (Anchor::PreviousEnter, calls[prev.call].enter_ns),
            };
            let instance = self
                .instance_of
                .get(&(participant, c.enter_ns, c.exit_ns))
                .copied();
            let own_start = span_of_step.filter(|_| anchor == Anchor::Start);
            let own_start = own_start.map_or(anchor_ns, |s| s.start_ns);
            let anchor = (anchor, anchor_ns, own_start);
            nodes.push(node(i, c, instance, anchor, self.analysis));
        }
        let last_exit = nodes.iter().map(|n| calls[n.call].exit_ns).max();
        let end_ns = span_of_step
            .map(|s| s.end_ns)
            .into_iter()
            .chain(last_exit)
            .max()
            .unwrap_or(start_ns);
        Chain {
            participant,
            start_ns,
            end_ns,
            nodes,
        }
    }
}

/// A call with the time from its anchor (`anchor`: kind, time, and the
/// rank's own step start, which only a chain's first call may follow)
/// split.
fn node(
    call: usize,
    c: &CollectiveCall,
    instance: Option<usize>,
    (anchor, anchor_ns, own_start): (Anchor, i64, i64),
    analysis: &Analysis,
) -> Node {
    let e = c.enter_ns.max(anchor_ns);
    let a = own_start.clamp(anchor_ns, e);
    let late_ns = span(anchor_ns, a);
    let (other_ns, work_ns, gap_ns, work) = match &c.preceding {
        Some(p) => {
            let ws = p.start_ns.clamp(a, e);
            let we = p.end_ns.clamp(ws, e);
            let full = span(p.start_ns, p.end_ns);
            (
                span(a, ws),
                span(ws, we),
                span(we, e),
                Some((p.name.clone(), full)),
            )
        }
        None => (span(a, e), 0, 0, None),
    };
    let own_ns = match instance.and_then(|i| analysis.instances.get(i)) {
        Some(inst) => span(inst.last_enter_ns, c.exit_ns),
        None => span(c.enter_ns, c.exit_ns),
    };
    Node {
        call,
        instance,
        anchor,
        anchor_ns,
        late_ns,
        other_ns,
        work_ns,
        gap_ns,
        work,
        own_ns,
    }
}

/// Where a walk stands: chain, node, and at its enter or its exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct At {
    chain: usize,
    node: usize,
    exit: bool,
}

impl Job<'_> {
    fn instance(&self, node: &Node) -> Option<&Instance> {
        self.analysis.instances.get(node.instance?)
    }

    fn call(&self, node: &Node) -> &CollectiveCall {
        &self.calls[node.call]
    }

    /// The chain's call that exited last (of equal exits the later one):
    /// the tail follows it, whichever call entered last.
    fn last_to_exit(&self, chain: &Chain) -> Option<usize> {
        (0..chain.nodes.len()).max_by_key(|&k| (self.call(&chain.nodes[k]).exit_ns, k))
    }

    /// The chain and node of `participant`'s call in `inst`, in `step`.
    fn find(&self, step: &Step, participant: usize, inst: usize) -> Option<(usize, usize)> {
        step.at.get(&(participant, inst)).copied()
    }

    fn path(&self, step: &Step) -> StepPath {
        let mut segments = Vec::new();
        let last = step
            .chains
            .iter()
            .enumerate()
            .max_by_key(|(_, c)| (c.end_ns, c.participant))
            .map(|(i, _)| i);
        if let Some(ci) = last {
            self.walk(step, ci, &mut segments);
        }
        segments.retain(|s: &Segment| s.duration_ns > 0 || s.hop.is_some());
        segments.reverse();
        let end_ns = measured_end(step);
        let top = segments
            .iter()
            .enumerate()
            .max_by_key(|(i, s)| (s.duration_ns, std::cmp::Reverse(*i)))
            .map(|(i, _)| i);
        StepPath {
            step: step.step,
            start_ns: step.start_ns,
            end_ns,
            duration_ns: unsigned(span(step.start_ns, end_ns)),
            uncertain_hops: segments
                .iter()
                .filter(|s| matches!(&s.hop, Some(h) if h.order != HopOrder::Certain))
                .count() as u64,
            top,
            segments,
            ranks: step.chains.iter().map(|c| self.rank_time(c)).collect(),
        }
    }

    /// Pushes the path's segments, latest first, from the end of chain
    /// `ci` back to a chain start.
    fn walk(&self, step: &Step, ci: usize, out: &mut Vec<Segment>) {
        let chain = &step.chains[ci];
        let Some(last) = self.last_to_exit(chain) else {
            return;
        };
        let last_exit = self.call(&chain.nodes[last]).exit_ns;
        let op = self.call(&chain.nodes[last]).op.clone();
        out.push(self.segment(chain, SegmentKind::Tail, op, last_exit, chain.end_ns));
        let mut at = At {
            chain: ci,
            node: last,
            exit: true,
        };
        let mut seen = BTreeSet::new();
        // Every position is visited once at most: the walk ends.
        while seen.insert((at.chain, at.node, at.exit)) {
            let next = if at.exit {
                self.back_from_exit(step, at, out)
            } else {
                self.back_from_enter(step, at, out)
            };
            match next {
                Some(n) => at = n,
                None => break,
            }
        }
    }

    fn segment(
        &self,
        chain: &Chain,
        kind: SegmentKind,
        op: Name,
        start_ns: i64,
        end_ns: i64,
    ) -> Segment {
        Segment {
            participant: chain.participant,
            kind,
            op,
            start_ns,
            end_ns: end_ns.max(start_ns),
            duration_ns: unsigned(span(start_ns, end_ns)),
            track: None,
            hop: None,
        }
    }

    /// The collective's own time, then the jump to its last arriver.
    fn back_from_exit(&self, step: &Step, at: At, out: &mut Vec<Segment>) -> Option<At> {
        let chain = &step.chains[at.chain];
        let node = &chain.nodes[at.node];
        let c = self.call(node);
        let here = At { exit: false, ..at };
        let arriver = self.instance(node).and_then(|inst| {
            let (tc, tn) = self.find(step, inst.last, node.instance?)?;
            Some((inst, tc, tn))
        });
        let Some((inst, tc, tn)) = arriver else {
            let mut s = self.segment(
                chain,
                SegmentKind::Collective,
                c.op.clone(),
                c.enter_ns,
                c.exit_ns,
            );
            s.track = c.track;
            out.push(s);
            return Some(here);
        };
        let from = inst.last_enter_ns.clamp(c.enter_ns, c.exit_ns);
        let mut s = self.segment(
            chain,
            SegmentKind::Collective,
            c.op.clone(),
            from,
            c.exit_ns,
        );
        s.track = c.track;
        // Where the order is uncertain the path says so even when it stays
        // on this rank: the other candidate's work may be what held it.
        s.hop = (inst.last != chain.participant || !inst.significant).then(|| Hop {
            from: chain.participant,
            to: inst.last,
            key: inst.key.clone(),
            order: hop_order(inst),
        });
        out.push(s);
        Some(At {
            chain: tc,
            node: tn,
            exit: false,
        })
    }

    /// Gap, work and other time before a call, then its anchor.
    fn back_from_enter(&self, step: &Step, at: At, out: &mut Vec<Segment>) -> Option<At> {
        let chain = &step.chains[at.chain];
        let node = &chain.nodes[at.node];
        let c = self.call(node);
        let entered = c.enter_ns.max(node.anchor_ns);
        let gap_start = entered.saturating_sub(node.gap_ns);
        let work_start = gap_start.saturating_sub(node.work_ns);
        out.push(self.segment(chain, SegmentKind::Gap, c.op.clone(), gap_start, entered));
        if let Some((name, _)) = &node.work {
            out.push(self.segment(
                chain,
                SegmentKind::Work,
                name.clone(),
                work_start,
                gap_start,
            ));
        }
        let other_op = node.work.as_ref().map_or(c.op.clone(), |(n, _)| n.clone());
        let other_start = node.anchor_ns.saturating_add(node.late_ns);
        out.push(self.segment(chain, SegmentKind::Other, other_op, other_start, work_start));
        out.push(self.segment(
            chain,
            SegmentKind::LateStart,
            c.op.clone(),
            node.anchor_ns,
            other_start,
        ));
        let previous = at.node.checked_sub(1);
        match (node.anchor, previous) {
            (Anchor::PreviousExit, Some(p)) => Some(At {
                chain: at.chain,
                node: p,
                exit: true,
            }),
            (Anchor::PreviousEnter, Some(p)) => Some(At {
                chain: at.chain,
                node: p,
                exit: false,
            }),
            _ => {
                out.push(self.segment(
                    chain,
                    SegmentKind::CarryOver,
                    c.op.clone(),
                    step.start_ns,
                    chain.start_ns,
                ));
                None
            }
        }
    }

    fn rank_time(&self, chain: &Chain) -> RankTime {
        let mut t = RankTime {
            participant: chain.participant,
            ..RankTime::default()
        };
        let mut work: Vec<(i64, i64)> = Vec::new();
        for n in &chain.nodes {
            let c = self.call(n);
            // Saturating: extreme stamps must not overflow a sum.
            add(&mut t.compute_ns, n.work_ns);
            add(&mut t.other_ns, n.other_ns);
            add(&mut t.gap_ns, n.gap_ns);
            add(&mut t.gap_ns, n.late_ns);
            let gap_start = c.enter_ns.max(n.anchor_ns).saturating_sub(n.gap_ns);
            work.push((gap_start.saturating_sub(n.work_ns), gap_start));
        }
        let work = merged(work);
        for n in &chain.nodes {
            let c = self.call(n);
            let last_enter = self.instance(n).map_or(c.enter_ns, |i| i.last_enter_ns);
            let released = last_enter.clamp(c.enter_ns, c.exit_ns);
            add(&mut t.waiting_ns, span(c.enter_ns, released));
            let covered = overlap(&work, released, c.exit_ns);
            let exposed = span(released, c.exit_ns).saturating_sub(covered);
            add(&mut t.exposed_communication_ns, exposed);
        }
        t
    }
}

fn hop_order(inst: &Instance) -> HopOrder {
    if inst.significant {
        HopOrder::Certain
    } else {
        HopOrder::Uncertain {
            other: inst.second_last,
            late_by_ns: inst.late_by_ns,
            combined_bound_ns: inst.combined_bound_ns,
        }
    }
}

/// Intervals sorted and merged where they overlap.
fn merged(mut v: Vec<(i64, i64)>) -> Vec<(i64, i64)> {
    v.retain(|(a, b)| b > a);
    v.sort_unstable();
    let mut out: Vec<(i64, i64)> = Vec::with_capacity(v.len());
    for (a, b) in v {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// How much of [a, b] the merged intervals cover.
fn overlap(merged: &[(i64, i64)], a: i64, b: i64) -> i64 {
    merged.iter().fold(0, |sum: i64, &(s, e)| {
        sum.saturating_add(span(s.max(a), e.min(b)))
    })
}

fn add(total: &mut u64, ns: i64) {
    *total = total.saturating_add(unsigned(ns));
}

fn measured_end(step: &Step) -> i64 {
    step.chains
        .iter()
        .map(|c| c.end_ns)
        .max()
        .unwrap_or(step.start_ns)
}

/// Per (rank, kind, op): the steps whose path it topped.
fn tops(paths: &[StepPath]) -> Vec<TopCount> {
    let mut counts: BTreeMap<(usize, SegmentKind, Name), (u64, u64)> = BTreeMap::new();
    for p in paths {
        if let Some(s) = p.top.and_then(|i| p.segments.get(i)) {
            let e = counts
                .entry((s.participant, s.kind, s.op.clone()))
                .or_default();
            e.0 += 1;
            e.1 = e.1.saturating_add(s.duration_ns);
        }
    }
    let mut v: Vec<TopCount> = counts
        .into_iter()
        .map(|((participant, kind, op), (steps, total_ns))| TopCount {
            participant,
            kind,
            op,
            steps,
            total_ns,
        })
        .collect();
    v.sort_by_key(|t| std::cmp::Reverse((t.steps, t.total_ns)));
    v
}

impl Job<'_> {
    /// The op's median duration on the rank, over every step's chain.
    fn median(&self, w: &WhatIf) -> Option<u64> {
        let mut d: Vec<i64> = self
            .steps
            .iter()
            .flat_map(|s| &s.chains)
            .filter(|c| c.participant == w.participant)
            .flat_map(|c| &c.nodes)
            .filter_map(|n| n.work.as_ref())
            .filter(|(name, _)| *name == w.op)
            .map(|(_, full)| *full)
            .collect();
        d.sort_unstable();
        d.get(d.len().checked_sub(1)? / 2).map(|&m| unsigned(m))
    }

    fn what_if(&self, w: &WhatIf) -> WhatIfResult {
        let duration_ns = match w.duration {
            WhatIfDuration::Median => self.median(w),
            WhatIfDuration::Ns(ns) => self.median(w).map(|_| ns),
        };
        let steps = self
            .steps
            .iter()
            .map(|s| WhatIfStep {
                step: s.step,
                measured_ns: unsigned(span(s.start_ns, measured_end(s))),
                predicted_ns: unsigned(span(
                    s.start_ns,
                    self.replay(s, duration_ns.map(|d| (w, d))),
                )),
            })
            .collect();
        WhatIfResult {
            what_if: w.clone(),
            duration_ns,
            steps,
        }
    }

    /// A node's work as replayed: its measured work, the op's change of
    /// duration added where the what-if names it.
    fn replayed_work(node: &Node, participant: usize, change: Option<(&WhatIf, u64)>) -> i64 {
        match (change, &node.work) {
            (Some((w, d)), Some((name, full))) if w.participant == participant && *name == w.op => {
                let d = i64::try_from(d).unwrap_or(i64::MAX);
                node.work_ns.saturating_add(d.saturating_sub(*full)).max(0)
            }
            _ => node.work_ns,
        }
    }

    /// The step's end with the chains replayed (see the module's
    /// definitions); `None` replays them as measured.
    fn replay(&self, step: &Step, change: Option<(&WhatIf, u64)>) -> i64 {
        let chains = &step.chains;
        let mut enter: Vec<Vec<Option<i64>>> =
            chains.iter().map(|c| vec![None; c.nodes.len()]).collect();
        let mut exit = enter.clone();
        let mut pos = vec![0usize; chains.len()];
        loop {
            let mut progressed = false;
            for ci in 0..chains.len() {
                while self.advance(step, ci, &mut pos, &mut enter, &mut exit, change, false) {
                    progressed = true;
                }
            }
            if pos.iter().zip(chains).all(|(&p, c)| p >= c.nodes.len()) {
                break;
            }
            if !progressed {
                // Ranks waiting on each other in orders that disagree: the
                // earliest blocked call completes with the measured enters of
                // the ranks not there yet.
                let Some(ci) = (0..chains.len())
                    .filter(|&ci| pos[ci] < chains[ci].nodes.len())
                    .min_by_key(|&ci| self.call(&chains[ci].nodes[pos[ci]]).enter_ns)
                else {
                    break;
                };
                if !self.advance(step, ci, &mut pos, &mut enter, &mut exit, change, true) {
                    break;
                }
            }
        }
        chains
            .iter()
            .enumerate()
            .map(|(ci, c)| {
                let Some(k) = self.last_to_exit(c) else {
                    return c.end_ns;
                };
                let measured_last = self.call(&c.nodes[k]).exit_ns;
                let tail = span(measured_last, c.end_ns);
                let last = exit[ci][k].unwrap_or(measured_last);
                // A call that exited earlier may now exit later.
                let latest = exit[ci].iter().flatten().copied().max();
                latest.into_iter().fold(last.saturating_add(tail), i64::max)
            })
            .max()
            .unwrap_or(step.start_ns)
    }

    /// Replays chain `ci`'s next call if it can be: its enter once its
    /// anchor is known, its exit once every rank of its instance entered
    /// (`force`: with the measured enter of those that did not).
    #[allow(clippy::too_many_arguments)]
    fn advance(
        &self,
        step: &Step,
        ci: usize,
        pos: &mut [usize],
        enter: &mut [Vec<Option<i64>>],
        exit: &mut [Vec<Option<i64>>],
        change: Option<(&WhatIf, u64)>,
        force: bool,
    ) -> bool {
        let chain = &step.chains[ci];
        let k = pos[ci];
        let Some(node) = chain.nodes.get(k) else {
            return false;
        };
        if enter[ci][k].is_none() {
            let anchor = match node.anchor {
                Anchor::Start => Some(chain.start_ns),
                Anchor::PreviousExit => exit[ci][k - 1],
                Anchor::PreviousEnter => enter[ci][k - 1],
            };
            let Some(anchor) = anchor else {
                return false;
            };
            let work = Self::replayed_work(node, chain.participant, change);
            enter[ci][k] = Some(
                anchor
                    .saturating_add(node.late_ns)
                    .saturating_add(node.other_ns)
                    .saturating_add(work)
                    .saturating_add(node.gap_ns),
            );
        }
        let Some(mine) = enter[ci][k] else {
            return false;
        };
        let released = match self.instance(node) {
            None => Some(mine),
            Some(inst) => self.last_enter(step, inst, node, enter, force),
        };
        let Some(released) = released else {
            return false;
        };
        exit[ci][k] = Some(released.max(mine).saturating_add(node.own_ns));
        pos[ci] += 1;
        true
    }

    /// The latest replayed enter over the instance's ranks; a rank outside
    /// the step counts with its measured enter. `None`: one has not entered
    /// yet (unless `force`).
    fn last_enter(
        &self,
        step: &Step,
        inst: &Instance,
        node: &Node,
        enter: &[Vec<Option<i64>>],
        force: bool,
    ) -> Option<i64> {
        let index = node.instance?;
        let mut latest = i64::MIN;
        for r in &inst.ranks {
            let replayed = match self.find(step, r.participant, index) {
                Some((c, n)) => enter[c][n],
                None => Some(r.enter_ns),
            };
            match replayed {
                Some(t) => latest = latest.max(t),
                None if force => latest = latest.max(r.enter_ns),
                None => return None,
            }
        }
        Some(latest)
    }
}

#[cfg(test)]
#[path = "critical_tests.rs"]
mod tests;
