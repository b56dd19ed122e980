//! Each out-edge's fit over a history of windows, its length chosen from the
//! data.
//!
//! One window holds few pairs at the shipped cadence (about 40 per
//! direction in 4 s); with software stamps the minimum delays of so few
//! samples are noisy, and so is a fit that stands between them. A longer
//! span sees more of the fast packets — but only while both clocks stay
//! affine over it. So the node keeps the raw probes of the last
//! [`MAX_WINDOWS`] windows and fits the last 1, 2, 4, 8, 16 and 32 of them. It keeps
//! the longest fit that agrees with every shorter one: their offsets at the
//! newest point differ by less than the sum of their bounds. A clock whose
//! frequency moved inside the span breaks that agreement and shortens the
//! history; a steady one lets it grow (the choice chrony makes with its runs
//! test, here made with the fits' own honest bounds).
//!
//! The agreement test cannot see frequency wander: the honest bounds of a
//! fit (half the best RTT plus the slopes that RTT allows) are far wider
//! than the tens of ns a wandering clock bends the line. So each class of
//! stamps has its own longest span ([`StampClass::max_history_windows`]):
//! 2 s with NIC stamps, whose pairs pin the line within it; 32 s with
//! software stamps, whose noise needs the long span (its tighter drift
//! bound also makes holdover last). On a fast-wandering clock the newest
//! 16 s of a full software history are closer at the newest point: a node
//! publishes that half span's offset under the 32 s slope unless the 32 s
//! line has predicted the windows after it better ([`crate::span_choice`]). Both
//! spans are times, not window counts, so a
//! shorter window brings results more often from as many pairs. A NIC fit
//! starved of pure pairs (busy queues leave a few in 2 s) grows its span,
//! one span at a time up to 8 s, while it is still starved
//! ([`crate::settings::NIC_STARVED_HISTORY_NS`]). A NIC fit
//! takes its drift from a longer span (3 s) when that span agrees too
//! ([`StampClass::drift_history_windows`]): a reader extrapolates each
//! result with it, and a 2 s slope is noisier than a 3 s one lags.
//!
//! A software line that bridges a long silence (a link down, a peer
//! cut off) keeps the slope of its whole span, whose lever reaches across
//! the silence, but takes its offset from the packets after it: the clocks
//! wandered meanwhile, and the span's fastest packets, mostly from before,
//! would carry the old offset over
//! ([`EdgeHistory::offset_after_silence`]).
//!
//! The bound stays honest over the longer span: each fit's model slack
//! grows with its span by the frequency wander the estimator assumes
//! (`holdover_wander_ppb`): a frequency change of Δf inside a span T moves
//! the clock off the best affine line by at most Δf·T/8.

use std::collections::VecDeque;

use clockmesh_estimator::convert::{count_f64, ns_f64, ns_i64, unsigned_ns_f64};
use clockmesh_estimator::{EdgeFit, EdgeOutcome, EdgeProbes, EstimatorConfig, estimate_edge};

use crate::settings::{
    LONG_SILENCE_NS, NIC_STARVED_POINTS, PATH_JUDGED_NS, StampClass, windows_covering,
};
use crate::span_choice::{Candidates, LinesSeen, SoftwareSpan};
use crate::time::{LocalNs, Nanos};

/// Windows of raw probes kept per out-edge (32 s at the shipped 1 s
/// windows): the longest span of any class of stamps.
pub const MAX_WINDOWS: usize = 32;
/// Spans tried, in windows, shortest first.
const SPANS: [usize; 6] = [1, 2, 4, 8, 16, 32];

/// The raw probes of one out-edge's recent windows that had any, newest
/// last.
///
/// A silent window (no probe either way: the link down, the peer
/// restarting, its stamp report lost) tells nothing about the clocks. On a
/// software-stamped edge it is not kept: it would push out windows that
/// still do, and after an outage every fit would start again from one
/// window's pairs. Software fits bridge the silence (their bound allows
/// the wander over the span's whole time, and the agreement and path tests
/// judge the span as any other). A NIC-stamped edge keeps it: its span is
/// a time ([`StampClass::bridges_silence`]). A fit during a silence is the
/// kept windows' line at its own anchor, which the solve ages with its
/// drift bound.
#[derive(Debug, Default)]
pub struct EdgeHistory {
    windows: VecDeque<KeptWindow>,
    /// The newest window that had probes.
    newest: Option<u64>,
    /// The newest window pushed, when it had no probes and was not kept
    /// (a bridging edge): reported as that window's failed fit when no
    /// kept span may be fitted.
    silent: Option<(u64, EdgeProbes, StampClass)>,
    /// The lines the last fit offered the node's
    /// [`crate::span_choice::SpanChoice`], until the next window judges
    /// them.
    offered: Option<Candidates>,
}

/// One window's probes, its number and its stamps.
#[derive(Debug)]
struct KeptWindow {
    k: u64,
    probes: EdgeProbes,
    stamps: StampClass,
}

/// The chosen fit and how many windows it spans.
pub struct HistoryFit {
    pub outcome: EdgeOutcome,
    pub windows: usize,
    /// How many windows its drift spans: [`HistoryFit::windows`], or more
    /// with NIC stamps ([`StampClass::drift_history_windows`]).
    pub drift_windows: usize,
    /// The stamps of the span (its worst window's), which set its purity.
    pub stamps: StampClass,
}

impl HistoryFit {
    /// The share of its stamps' full history the fit spans, when a shorter
    /// one means a noisier offset: with software stamps the span out of
    /// [`StampClass::max_history_windows`]. With NIC stamps, whose pairs
    /// pin the line within a window or two, 1 once its pure pairs span half
    /// a window (weighting NIC fits down by their pure points made the
    /// simulator's harsh NIC scenario worse, p99 10.5 → 15–18 ns: a history
    /// cut by a path change is on the current path); less for a fit over
    /// the part of a window after a peer came back, whose slope over tens
    /// of ms can be ppm off: such a node's drift then leans on its previous
    /// one (the estimator's drift prior), and the gate's isolated NIC
    /// member's worst reader went 8.4 µs → 0.7 µs (docs/estimator.md §8).
    pub fn history_share(&self, window: Nanos) -> f64 {
        match self.stamps {
            StampClass::Nic => match &self.outcome.fit {
                Ok(fit) => (2.0 * ns_f64(fit.span_ns) / ns_f64(window.0.max(1))).clamp(0.01, 1.0),
                Err(_) => 1.0,
            },
            StampClass::Software => {
                let full = self.stamps.max_history_windows(window);
                // A half span under the full span's slope is a full history.
                let spanned = self.windows.max(self.drift_windows);
                count_f64(spanned.clamp(1, full)) / count_f64(full)
            }
        }
    }

    /// Takes the drift of `long`, a fit over `long_windows`, keeping its
    /// own offset: a NIC fit's longer drift span
    /// ([`EdgeHistory::steady_drift`]), a software half span under the
    /// full span's slope ([`SoftwareSpan::Half`]).
    fn take_slope_of(&mut self, long: &EdgeFit, long_windows: usize) {
        if let Ok(fit) = self.outcome.fit.as_mut() {
            *fit = with_slope_of(fit, long);
            self.drift_windows = long_windows;
        }
    }

    /// `outcome`, fitted over `span` windows with `stamps`; its drift spans
    /// as many until [`EdgeHistory::fit`] finds a longer one for it.
    fn spanning(outcome: EdgeOutcome, span: usize, stamps: StampClass) -> Self {
        HistoryFit {
            outcome,
            windows: span,
            drift_windows: span,
            stamps,
        }
    }
}

impl EdgeHistory {
    /// Adds the probes of the window after the last one pushed (see
    /// [`EdgeHistory::push_window`]).
    pub fn push(&mut self, probes: EdgeProbes, stamps: StampClass) {
        let k = self.windows.back().map_or(0, |w| w.k + 1);
        self.push_window(k, probes, stamps);
    }

    /// Adds window `k`'s probes, dropping the oldest beyond
    /// [`MAX_WINDOWS`]; a window without probes is kept only on an edge
    /// that does not bridge silence, with the edge's own class (see
    /// [`EdgeHistory`]).
    pub fn push_window(&mut self, k: u64, probes: EdgeProbes, stamps: StampClass) {
        let silent = probes.forward.is_empty() && probes.backward.is_empty();
        // A window without probes has no stamps to class (the pair book
        // calls it software); the edge's stamps did not change in its
        // silence. Classed software, a NIC edge's silence would be bridged
        // by a software span of the windows before it, shared as fresh
        // every window of the silence.
        let stamps = match self.windows.back() {
            Some(newest) if silent => newest.stamps,
            _ => stamps,
        };
        let bridged = self
            .windows
            .back()
            .is_none_or(|newest| newest.stamps.bridges_silence());
        if silent && bridged {
            self.silent = Some((k, probes, stamps));
            return;
        }
        self.silent = None;
        self.windows.push_back(KeptWindow { k, probes, stamps });
        while self.windows.len() > MAX_WINDOWS {
            self.windows.pop_front();
        }
        if !silent {
            self.newest = Some(k);
        }
    }

    /// Whether window `k` is more than [`MAX_WINDOWS`] past the newest
    /// window that had probes: a peer silent that long has nothing left
    /// to add.
    pub fn is_outlived_by(&self, k: u64) -> bool {
        self.newest
            .is_none_or(|newest| k.saturating_sub(newest) >= MAX_WINDOWS as u64)
    }

    /// The longest span whose fit agrees with every shorter one; `None`
    /// only before the first window. The one-window span is always tried,
    /// so a failed fit is reported when no span fits. Windows are
    /// `window` long.
    ///
    /// When the newest second saw a faster path than every older window of
    /// a full history (the class's longest span), those windows are
    /// forgotten: they saw a detour that is gone (no queue makes a packet
    /// faster than its path), and a later span that held them, pinned at
    /// its newest end by a few fast windows, would lean towards the old
    /// path's bias.
    ///
    /// A full software history publishes the line `software` names
    /// ([`crate::span_choice`]); the fit offers both for the next window to
    /// judge ([`EdgeHistory::lines_seen`]).
    pub fn fit(
        &mut self,
        cfg: &EstimatorConfig,
        window: Nanos,
        software: SoftwareSpan,
    ) -> Option<HistoryFit> {
        let Kept {
            chosen,
            faster_since,
            candidates,
        } = self.fit_kept(cfg, window, software);
        self.offered = candidates;
        if let Some(newest) = faster_since {
            self.windows.drain(..self.windows.len() - newest);
        }
        chosen.or_else(|| {
            let (_, probes, stamps) = self.silent.as_ref()?;
            Some(HistoryFit::spanning(
                fit_probes(probes, *stamps, cfg),
                1,
                *stamps,
            ))
        })
    }

    /// What the newest window's probes, pushed since the last fit, see of
    /// the lines that fit offered (software stamps only, the class whose
    /// lines are chosen between); `None` after a silent window, whose
    /// newest kept one the lines saw. Forgets the lines.
    pub fn lines_seen(&mut self) -> Option<LinesSeen> {
        let offered = self.offered.take()?;
        let newest = self.windows.back()?;
        if newest.stamps != StampClass::Software || self.silent.is_some() {
            return None;
        }
        offered.seen_by(|line| offset_error_seen(&newest.probes, line))
    }

    /// [`EdgeHistory::fit`] over the kept windows (`None` when no span of
    /// them may be fitted), how many of the newest windows saw a faster
    /// path than all the older ones of the class's longest span, if so (a
    /// young history's first window, slow while the path warms up, is not
    /// worth forgetting: the simulator's figures moved when it was), and
    /// the lines a full software history offers; it publishes `software`'s.
    fn fit_kept(&self, cfg: &EstimatorConfig, window: Nanos, software: SoftwareSpan) -> Kept {
        let mut chosen: Option<HistoryFit> = None;
        let mut accepted: Vec<EdgeFit> = Vec::new();
        // The newest accepted fit before the current one: the half span
        // once the longest is reached.
        let mut shorter: Option<HistoryFit> = None;
        // Whether the chosen span's newest probes saw its older windows'
        // path: its lines are scored only then (a detour's first seconds
        // favour the line that forgets the direct path sooner, which is
        // the biased one).
        let mut on_one_path = false;
        // The newest window's stamps set how long a history is worth it.
        let Some(newest_stamps) = self.windows.back().map(|w| w.stamps) else {
            return Kept::default();
        };
        let longest = newest_stamps.max_history_windows(window);
        // Grows past the class's longest span one span at a time while
        // each fit holds too few pure points, up to the starved limit.
        let mut limit = longest;
        let mut faster_since = None;
        for &span in &SPANS {
            if !self.spannable(span, limit, newest_stamps) {
                break;
            }
            if self.thin_after_silence(span, window) {
                // Longer spans bridge the same silence with the same few pairs.
                break;
            }
            let (outcome, stamps) = self.fit_span(span, cfg);
            let Ok(fit) = &outcome.fit else {
                if chosen.is_none() {
                    chosen = Some(HistoryFit::spanning(outcome, span, stamps));
                }
                continue;
            };
            if !accepted.iter().all(|short| agree(fit, short)) {
                break; // the clocks were not affine over this span
            }
            let seen = self.path_seen(span, fit, stamps, window);
            if seen == PathSeen::Faster && span == longest && seen.cuts(stamps) {
                faster_since = Some(windows_covering(Nanos(PATH_JUDGED_NS), window));
            }
            if seen.cuts(stamps) && !slow_patch(seen, &accepted) {
                // Its older windows saw another path, or a slow patch; a
                // longer span whose older windows include fast ones may
                // still be on the newest path.
                continue;
            }
            if span >= longest && starved(fit) {
                let starved_limit = newest_stamps.starved_history_windows(window);
                limit = limit.max((2 * span).min(starved_limit));
            }
            accepted.push(fit.clone());
            on_one_path = seen == PathSeen::Same;
            let previous = chosen.replace(HistoryFit::spanning(outcome, span, stamps));
            shorter = previous.filter(|p| p.outcome.fit.is_ok());
        }
        let candidates = chosen
            .as_ref()
            .filter(|_| on_one_path)
            .and_then(|full| half_and_full(full, shorter.as_ref(), longest));
        let full_history = chosen.as_ref().is_some_and(|c| c.windows == longest);
        if let (Some(lines), SoftwareSpan::Half, true) = (&candidates, software, full_history) {
            chosen = shorter.map(|mut half| {
                half.take_slope_of(&lines.full, longest);
                half
            });
        }
        if let Some(chosen) = chosen.as_mut() {
            self.steady_drift(chosen, &accepted, cfg, window);
            self.offset_after_silence(chosen, window);
        }
        Kept {
            chosen,
            faster_since,
            candidates,
        }
    }

    /// Whether the newest `span` kept windows may be fitted as one, for a
    /// class that spans at most `longest` windows: as many kept windows,
    /// and for a class that does not bridge silence, as much time up to
    /// the current window.
    fn spannable(&self, span: usize, longest: usize, stamps: StampClass) -> bool {
        if span > self.windows.len() || span > longest {
            return false;
        }
        if stamps.bridges_silence() {
            return true;
        }
        let oldest = self.windows[self.windows.len() - span].k;
        // The current window: a silent one pushed after the newest kept.
        let newest_kept = self.windows.back().map(|w| w.k);
        let current = self.silent.as_ref().map_or(newest_kept, |s| Some(s.0));
        current.is_some_and(|k| k.saturating_sub(oldest) < longest as u64)
    }

    /// Whether the newest `span` windows bridge a long silence
    /// ([`LONG_SILENCE_NS`]) whose windows after it hold fewer than half
    /// the probes a window before it did (the median of the span's). Such
    /// a line is pinned at its newest end by those few probes: its offset
    /// there is about as noisy as a fit of them alone, yet its bound is as
    /// tight as the long span allows, so it would replace a held result
    /// that is still better ([`crate::publication::keeps_the_held`]).
    /// Until the windows after the silence hold half a window's worth,
    /// they are fitted alone. (A first window cut short by the silence's
    /// end holds about half: fitted alone, its offset was the noisier.)
    fn thin_after_silence(&self, span: usize, window: Nanos) -> bool {
        let Some(last) = self.first_after_long_silence(window) else {
            return false;
        };
        let since = self.windows.len() - last;
        if span <= since || span > self.windows.len() {
            return false;
        }
        let probes = |w: &KeptWindow| w.probes.forward.len().min(w.probes.backward.len());
        let after: usize = self.windows.iter().rev().take(since).map(probes).sum();
        let mut before: Vec<usize> = self
            .windows
            .iter()
            .rev()
            .skip(since)
            .take(span - since)
            .map(probes)
            .collect();
        before.sort_unstable();
        2 * after < before[before.len() / 2]
    }

    /// Moves a software line that bridges a long silence
    /// ([`LONG_SILENCE_NS`]) to the offset its windows after the silence
    /// allow under its slope. The bridged line's offset at its newest end
    /// is set by the fastest packets of the whole span, mostly from before
    /// the silence, carried across it by the slope; the clocks wandered
    /// meanwhile. Its slope, over the silence's whole lever, is the better
    /// half of it; the newest packets say where the line is now. The bound
    /// grows by the move: still honest.
    fn offset_after_silence(&self, chosen: &mut HistoryFit, window: Nanos) {
        let Some(last) = self.first_after_long_silence(window) else {
            return;
        };
        let since = self.windows.len() - last;
        if !chosen.stamps.bridges_silence() || since >= chosen.windows.min(self.windows.len()) {
            return;
        }
        let Ok(bridged) = chosen.outcome.fit.as_ref() else {
            return;
        };
        let seen = self
            .windows
            .iter()
            .skip(last)
            .filter_map(|w| fastest_along(&w.probes, bridged))
            .fold((f64::INFINITY, f64::INFINITY), |(f, b), (wf, wb)| {
                (f.min(wf), b.min(wb))
            });
        if !(seen.0.is_finite() && seen.1.is_finite()) {
            return;
        }
        let offset_error = (seen.1 - seen.0) / 2.0;
        let mut moved = bridged.clone();
        moved.offset_rel_ns -= offset_error;
        moved.bound_ns += offset_error.abs();
        chosen.outcome.fit = Ok(moved);
    }

    /// The index of the first kept window after the newest silence, when
    /// that silence lasted at least [`LONG_SILENCE_NS`].
    fn first_after_long_silence(&self, window: Nanos) -> Option<usize> {
        let last = self
            .windows
            .len()
            .checked_sub(self.windows_since_silence())?;
        let before = self.windows.get(last.checked_sub(1)?)?;
        let silent = self.windows[last].k - before.k - 1;
        (window.saturating_mul(ns_i64(silent)).0 >= LONG_SILENCE_NS).then_some(last)
    }

    /// How many of the newest kept windows follow each other without a
    /// silence between them.
    fn windows_since_silence(&self) -> usize {
        let newest_first = self.windows.iter().rev();
        let gaps = newest_first.clone().zip(newest_first.skip(1));
        1 + gaps
            .take_while(|(newer, older)| newer.k == older.k + 1)
            .count()
    }

    /// Gives `chosen` the drift of a longer span than its own, up to the
    /// class's [`StampClass::drift_history_windows`], when that span's fit
    /// agrees with every shorter one and saw the same path. Its offset
    /// stays the short span's (the line's bend under frequency wander
    /// costs the offset more than the slope); its drift, from more pairs
    /// over more time, is what a reader extrapolates until the next result.
    fn steady_drift(
        &self,
        chosen: &mut HistoryFit,
        accepted: &[EdgeFit],
        cfg: &EstimatorConfig,
        window: Nanos,
    ) {
        let Some(longest) = chosen.stamps.drift_history_windows(window) else {
            return;
        };
        if accepted.is_empty() {
            return; // no span fitted: nothing to lend a drift to
        }
        let Some(span) = (chosen.windows + 1..=longest)
            .rev()
            .find(|&s| self.spannable(s, longest, chosen.stamps))
        else {
            return;
        };
        let (outcome, stamps) = self.fit_span(span, cfg);
        let Ok(long) = &outcome.fit else { return };
        if stamps != chosen.stamps
            || !accepted.iter().all(|short| agree(long, short))
            || self.path_seen(span, long, stamps, window).cuts(stamps)
        {
            return;
        }
        // The long span's own guarantee for its own slope.
        chosen.take_slope_of(long, span);
    }

    /// Whether the newest probes' best round trip, measured along the
    /// span's fitted line, sits so far from the best of the span's older
    /// windows that those saw another path (a detour added or removed):
    /// the fit cannot tell, it keeps the fastest packets of either path,
    /// and the agreement test allows the asymmetry both fits share. The
    /// newest probes are the newest windows covering
    /// [`crate::settings::PATH_JUDGED_NS`]; which seen paths cut a span is
    /// [`PathSeen::cuts`].
    fn path_seen(&self, span: usize, fit: &EdgeFit, stamps: StampClass, window: Nanos) -> PathSeen {
        let newest_windows = windows_covering(Nanos(PATH_JUDGED_NS), window);
        if span <= newest_windows {
            return PathSeen::Same;
        }
        // The best round trip of `count` windows from the `first`.
        let best = |first: usize, count: usize| {
            self.windows
                .iter()
                .skip(first)
                .take(count)
                .filter_map(|w| best_round_trip(&w.probes, fit))
                .fold(f64::INFINITY, f64::min)
        };
        let newest_first = self.windows.len() - newest_windows;
        let older = best(self.windows.len() - span, span - newest_windows);
        let newest = best(newest_first, newest_windows);
        let cut = stamps.path_change_ns();
        if !(newest.is_finite() && older.is_finite()) {
            PathSeen::Same
        } else if newest < older - cut {
            PathSeen::Faster
        } else if newest > older + cut {
            PathSeen::Slower
        } else {
            PathSeen::Same
        }
    }

    fn fit_span(&self, span: usize, cfg: &EstimatorConfig) -> (EdgeOutcome, StampClass) {
        let first = &self.windows[0].probes;
        let mut merged = EdgeProbes {
            from: first.from,
            to: first.to,
            forward: Vec::new(),
            backward: Vec::new(),
        };
        // The span's worst stamps set its purity.
        let mut stamps = StampClass::Nic;
        for w in self.windows.iter().skip(self.windows.len() - span) {
            merged.forward.extend_from_slice(&w.probes.forward);
            merged.backward.extend_from_slice(&w.probes.backward);
            stamps = stamps.max(w.stamps);
        }
        (fit_probes(&merged, stamps, cfg), stamps)
    }
}

/// What [`EdgeHistory::fit_kept`] found.
#[derive(Default)]
struct Kept {
    chosen: Option<HistoryFit>,
    faster_since: Option<usize>,
    candidates: Option<Candidates>,
}

/// The lines a software fit offers the node's
/// [`crate::span_choice::SpanChoice`]: its own, and the half span's offset
/// under its slope; `None` for NIC stamps, no fitted half span, or a span
/// under a quarter of the class's `longest`. Only a full history publishes
/// the half line, but a young one's lines are scored too, so that a node
/// whose stamps favour the full line returns to it soon after its history
/// is full.
fn half_and_full(
    full: &HistoryFit,
    half: Option<&HistoryFit>,
    longest: usize,
) -> Option<Candidates> {
    let half = half?;
    if full.stamps != StampClass::Software
        || half.stamps != StampClass::Software
        || 2 * half.windows != full.windows
        || 4 * full.windows < longest
    {
        return None;
    }
    let full_fit = full.outcome.fit.as_ref().ok()?;
    let half_fit = half.outcome.fit.as_ref().ok()?;
    Some(Candidates {
        full: full_fit.clone(),
        half: with_slope_of(half_fit, full_fit),
    })
}

/// `fit`'s offset at its epoch under `slope`'s drift and drift bound.
fn with_slope_of(fit: &EdgeFit, slope: &EdgeFit) -> EdgeFit {
    EdgeFit {
        drift: slope.drift,
        drift_bound: slope.drift_bound,
        ..fit.clone()
    }
}

/// What the newest probes' best round trip, against a span's older
/// windows', says of the path they took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PathSeen {
    /// Within the class's cut ([`StampClass::path_change_ns`]), or not
    /// judged.
    Same,
    /// Faster by more than the cut: a detour gone.
    Faster,
    /// Slower by more than the cut: a detour added, or a slow patch.
    Slower,
}

impl PathSeen {
    /// Whether a span that saw this is not fitted as one: a faster path
    /// with software stamps ([`StampClass::faster_path_cuts`]), a slower
    /// one with stamps whose best round trip holds still
    /// ([`StampClass::slower_path_cuts`]).
    fn cuts(self, stamps: StampClass) -> bool {
        match self {
            PathSeen::Same => false,
            PathSeen::Faster => stamps.faster_path_cuts(),
            PathSeen::Slower => stamps.slower_path_cuts(),
        }
    }
}

/// The fit of `probes` with `stamps`: the class's purity tolerance (as
/// `settings::estimator_config_for` sets it), and model slack grown with
/// the probes' time span by the frequency wander the estimator assumes.
fn fit_probes(probes: &EdgeProbes, stamps: StampClass, cfg: &EstimatorConfig) -> EdgeOutcome {
    let mut fit_cfg = cfg.fit.clone();
    fit_cfg.model_slack_ns += cfg.holdover_wander_ppb * 1e-9 * time_span(probes) / 8.0;
    estimate_edge(probes, &stamps.purity(&cfg.purity), &fit_cfg)
}

/// Whether a slower newest second is a queue rather than a path: the
/// newest window's own fit (`accepted`'s first, the one-window span) is
/// starved. Its few pairs passed the purity test by queueing alike, not by
/// crossing unqueued, so their round trip says nothing of the path; cut to
/// that window alone, the line stood on them with a slope microseconds per
/// second off (the scenario family's worst NIC windows, docs/estimator.md
/// §8, "A slow patch is not a path"). A detour added shows in windows with
/// their usual share of pure pairs, and those still cut.
fn slow_patch(seen: PathSeen, accepted: &[EdgeFit]) -> bool {
    seen == PathSeen::Slower && accepted.first().is_some_and(starved)
}

/// Whether `fit` stands on too few pure points in a direction to pin its
/// line ([`NIC_STARVED_POINTS`]).
fn starved(fit: &EdgeFit) -> bool {
    fit.forward_points.min(fit.backward_points) < NIC_STARVED_POINTS
}

/// Whether two fits' offsets at the shorter one's epoch are within the sum
/// of their bounds there.
fn agree(long: &EdgeFit, short: &EdgeFit) -> bool {
    let t = short.epoch_ns;
    let (lb, lf) = long.offset_at(LocalNs(t));
    let (sb, sf) = short.offset_at(LocalNs(t));
    let gap = ns_f64(lb - sb) + (lf - sf);
    let age = unsigned_ns_f64(t.saturating_sub(long.epoch_ns).unsigned_abs());
    gap.abs() <= long.bound_ns + long.drift_bound * age + short.bound_ns
}

/// The smallest forward plus the smallest backward delay of one window's
/// probes, each taken against `fit`'s line (so the clocks' offset and
/// drift cancel); `None` without probes both ways.
fn best_round_trip(w: &EdgeProbes, fit: &EdgeFit) -> Option<f64> {
    let (forward, backward) = fastest_along(w, fit)?;
    Some(forward + backward)
}

/// How far `fit`'s offset is from the one its probes' fastest packet
/// each way say (half their delays' difference along the line: an offset
/// error of e takes e from every forward delay and adds it to every
/// backward one), on top of the path's asymmetry; `None` without probes
/// both ways.
fn offset_error_seen(w: &EdgeProbes, fit: &EdgeFit) -> Option<f64> {
    let (forward, backward) = fastest_along(w, fit)?;
    Some((backward - forward) / 2.0)
}

/// The smallest forward and the smallest backward delay of one window's
/// probes, each taken against `fit`'s line.
fn fastest_along(w: &EdgeProbes, fit: &EdgeFit) -> Option<(f64, f64)> {
    // Offsets are on the `from` clock's time: TX forward, RX backward.
    let forward = w.forward.iter().map(|p| {
        let (base, rel) = fit.offset_at(LocalNs(p.tx_ns));
        ns_f64(p.rx_ns - p.tx_ns - base) - rel
    });
    let backward = w.backward.iter().map(|p| {
        let (base, rel) = fit.offset_at(LocalNs(p.rx_ns));
        ns_f64(p.rx_ns - p.tx_ns + base) + rel
    });
    Some((forward.reduce(f64::min)?, backward.reduce(f64::min)?))
}

/// Time covered by the probes (ns, on the `from` clock).
fn time_span(p: &EdgeProbes) -> f64 {
    let stamps = p
        .forward
        .iter()
        .map(|t| t.tx_ns)
        .chain(p.backward.iter().map(|t| t.rx_ns));
    let (lo, hi) = stamps.fold((i64::MAX, i64::MIN), |(lo, hi), t| (lo.min(t), hi.max(t)));
    if lo > hi { 0.0 } else { ns_f64(hi - lo) }
}

#[cfg(test)]
mod tests {
    use clockmesh_estimator::ProbeTimestamps;

    use super::*;
    use crate::span_choice::SpanChoice;

    /// Probes of one window `w` of a link whose `to` clock is ahead by
    /// `offset(t)`; one-way delay 5 µs plus a per-probe jitter.
    fn window(w: i64, offset: impl Fn(i64) -> i64) -> EdgeProbes {
        window_via(w, offset, 0)
    }

    /// The tests' windows: 4 s, 40 pairs each way.
    const W_NS: i64 = 4_000_000_000;

    /// [`window`] with `detour_ns` more one-way delay forward (an extra hop).
    fn window_via(w: i64, offset: impl Fn(i64) -> i64, detour_ns: i64) -> EdgeProbes {
        window_of(W_NS, w, offset, detour_ns)
    }

    /// Window `w` of `len_ns`, a pair every 100 ms.
    fn window_of(len_ns: i64, w: i64, offset: impl Fn(i64) -> i64, detour_ns: i64) -> EdgeProbes {
        let base = 1_700_000_000_000_000_000i64 + w * len_ns;
        let pairs = len_ns / 100_000_000;
        let mut forward = Vec::new();
        let mut backward = Vec::new();
        for k in 0..pairs {
            for i in 0..2u8 {
                let t = base + k * 100_000_000 + i64::from(i) * 100_000;
                let jitter = (k * 7919 + i64::from(i) * 31) % 3_000;
                let seq = (w * pairs + k) as u64;
                forward.push(ProbeTimestamps {
                    seq,
                    pair_index: i,
                    tx_ns: t,
                    rx_ns: t + 5_000 + detour_ns + jitter + offset(t),
                });
                let tb = t + 50_000_000;
                backward.push(ProbeTimestamps {
                    seq,
                    pair_index: i,
                    tx_ns: tb + offset(tb),
                    rx_ns: tb + 5_000 + jitter,
                });
            }
        }
        EdgeProbes {
            from: 1,
            to: 2,
            forward,
            backward,
        }
    }

    fn cfg() -> EstimatorConfig {
        crate::settings::estimator_config(&crate::settings::Settings::default())
    }

    #[test]
    fn a_peer_s_history_outlives_its_absence_for_max_windows() {
        let mut h = EdgeHistory::default();
        assert!(h.is_outlived_by(0), "nothing pushed: nothing to keep");
        h.push_window(10, window(10, |_| 1_000), StampClass::Software);
        assert!(!h.is_outlived_by(10 + MAX_WINDOWS as u64 - 1));
        assert!(h.is_outlived_by(10 + MAX_WINDOWS as u64));
    }

    /// Software stamps: 32 s of history whatever the window, as far as
    /// the windows kept reach.
    #[test]
    fn a_steady_clock_uses_the_whole_history() {
        for (len_ns, windows) in [(4_000_000_000, 8), (2_000_000_000, 16), (1_000_000_000, 32)] {
            let mut h = EdgeHistory::default();
            for w in 0..MAX_WINDOWS as i64 + 2 {
                h.push(window_of(len_ns, w, |_| 1_000, 0), StampClass::Software);
            }
            let fit = h.fit(&cfg(), Nanos(len_ns), SoftwareSpan::Full).unwrap();
            assert_eq!(fit.windows, windows, "{len_ns} ns windows");
            let f = fit.outcome.fit.unwrap();
            let fitted = f.offset_at_f64(LocalNs(f.epoch_ns));
            assert!((fitted - 1_000.0).abs() <= f.bound_ns);
        }
    }

    /// Fits a software edge every 1 s window for `windows` windows whose
    /// `to` clock is ahead by `offset(t)`; the last window's choice.
    fn fitted_every_window(windows: i64, offset: impl Fn(i64) -> i64 + Copy) -> HistoryFit {
        let mut h = EdgeHistory::default();
        let mut choice = SpanChoice::default();
        let mut last = None;
        for w in 0..windows {
            last = fit_one_second(&mut h, &mut choice, window_of(1_000_000_000, w, offset, 0));
        }
        last.unwrap()
    }

    /// What a node does with one 1 s window of a software edge's probes:
    /// judges the lines offered, then fits with the span its choice names.
    fn fit_one_second(
        h: &mut EdgeHistory,
        choice: &mut SpanChoice,
        probes: EdgeProbes,
    ) -> Option<HistoryFit> {
        h.push(probes, StampClass::Software);
        let seen: Vec<_> = h.lines_seen().into_iter().collect();
        choice.score(&seen);
        h.fit(&cfg(), Nanos::from_secs(1), choice.span())
    }

    /// A frequency that moves 1 ppb a second bends the 32 s line by tens
    /// of ns at its ends; the newest 16 s under its slope predicted each
    /// next window better, and is published once that is clear.
    #[test]
    fn a_wandering_frequency_publishes_the_half_span_under_the_full_slope() {
        let t0 = 1_700_000_000_000_000_000i64;
        let bent = move |t: i64| {
            let s = (t - t0) as f64 * 1e-9;
            (0.5 * s * s) as i64
        };
        let chosen = fitted_every_window(100, bent);
        assert_eq!((chosen.windows, chosen.drift_windows), (16, 32));
        assert_eq!(chosen.history_share(Nanos::from_secs(1)), 1.0);
        let f = chosen.outcome.fit.unwrap();
        let truth = bent(f.epoch_ns) as f64;
        assert!((f.offset_at_f64(LocalNs(f.epoch_ns)) - truth).abs() <= f.bound_ns);
    }

    /// A detour added under a wandering clock: the half span, on the
    /// detour sooner, is not published while the newest probes take a
    /// slower path than the span's older ones.
    #[test]
    fn a_detour_publishes_the_full_span() {
        let len_ns = 1_000_000_000;
        let t0 = 1_700_000_000_000_000_000i64;
        let bent = move |t: i64| {
            let s = (t - t0) as f64 * 1e-9;
            (0.5 * s * s) as i64
        };
        let mut h = EdgeHistory::default();
        let mut choice = SpanChoice::default();
        let mut fit_window = |w: i64, detour_ns: i64| {
            let probes = window_of(len_ns, w, bent, detour_ns);
            fit_one_second(&mut h, &mut choice, probes).unwrap()
        };
        for w in 0..100 {
            fit_window(w, 0);
        }
        assert_eq!(fit_window(100, 0).windows, 16);
        for w in 101..106 {
            assert_eq!(fit_window(w, 20_000).windows, 32, "window {w}");
        }
    }

    /// Where neither line predicts better, the half line under the full
    /// slope is published (the default; `crate::span_choice`), as close
    /// to a steady frequency as the full line would be.
    #[test]
    fn a_steady_frequency_publishes_the_half_line_by_default() {
        let t0 = 1_700_000_000_000_000_000i64;
        // 10 ppb apart, steadily.
        let steady = move |t: i64| 1_000 + (t - t0) / 100_000_000;
        let chosen = fitted_every_window(100, steady);
        assert_eq!((chosen.windows, chosen.drift_windows), (16, 32));
        let f = chosen.outcome.fit.unwrap();
        let error = f.offset_at_f64(LocalNs(f.epoch_ns)) - steady(f.epoch_ns) as f64;
        assert!(error.abs() <= 5.0, "{error} ns off");
    }

    #[test]
    fn a_young_software_history_has_its_share_and_a_nic_one_a_full_share() {
        let len_ns = 1_000_000_000;
        let share_after = |windows: i64, stamps: StampClass| {
            let mut h = EdgeHistory::default();
            for w in 0..windows {
                h.push(window_of(len_ns, w, |_| 1_000, 0), stamps);
            }
            h.fit(&cfg(), Nanos(len_ns), SoftwareSpan::Full)
                .unwrap()
                .history_share(Nanos(len_ns))
        };
        // A restarted agent's edge: 1, then 4 of the 32 windows of a full span.
        assert_eq!(share_after(1, StampClass::Software), 1.0 / 32.0);
        assert_eq!(share_after(4, StampClass::Software), 4.0 / 32.0);
        assert_eq!(share_after(40, StampClass::Software), 1.0);
        // NIC fits weigh by their bound alone once their pure pairs span
        // half a window, young or not.
        assert_eq!(share_after(1, StampClass::Nic), 1.0);
    }

    #[test]
    fn a_nic_fit_over_part_of_a_window_has_that_share() {
        // A peer back 0.7 s into a 1 s window: three pairs each way.
        let mut h = EdgeHistory::default();
        h.push(window_of(300_000_000, 0, |_| 1_000, 0), StampClass::Nic);
        let fit = h
            .fit(&cfg(), Nanos::from_secs(1), SoftwareSpan::Full)
            .unwrap();
        let share = fit.history_share(Nanos::from_secs(1));
        assert!(share > 0.0 && share < 0.6, "{share}");
    }

    #[test]
    fn a_frequency_step_shortens_the_history() {
        let mut h = EdgeHistory::default();
        let step = 1_700_000_000_000_000_000i64 + 6 * 4_000_000_000;
        // 50 ppm faster from window 6 on: not affine over 8 windows.
        let offset = move |t: i64| if t < step { 0 } else { (t - step) / 20_000 };
        for w in 0..8 {
            h.push(window(w, offset), StampClass::Software);
        }
        let fit = h.fit(&cfg(), Nanos(W_NS), SoftwareSpan::Full).unwrap();
        assert!(fit.windows <= 2, "{} windows", fit.windows);
        let f = fit.outcome.fit.unwrap();
        let fitted = f.offset_at_f64(LocalNs(f.epoch_ns));
        let truth = offset(f.epoch_ns) as f64;
        assert!((fitted - truth).abs() <= f.bound_ns, "{f:?}");
    }

    /// A detour on one direction (an asymmetric route) moves the offset
    /// the newest probes see by half of it. Removed, the older windows'
    /// slow packets would tilt the line: the history is cut. Added, the
    /// older windows' packets are the faster ones, the better samples of
    /// the same clocks: the span stays, and so does the offset.
    #[test]
    fn a_path_that_got_faster_cuts_the_history_and_a_slower_one_does_not() {
        for (before, after) in [(0, 800), (800, 0)] {
            let mut h = EdgeHistory::default();
            for w in 0..MAX_WINDOWS as i64 - 1 {
                h.push(window_via(w, |_| 1_000, before), StampClass::Software);
            }
            let fit = h.fit(&cfg(), Nanos(W_NS), SoftwareSpan::Full).unwrap();
            assert!(fit.windows > 1, "a steady path: a span of several windows");
            h.push(
                window_via(MAX_WINDOWS as i64 - 1, |_| 1_000, after),
                StampClass::Software,
            );
            let chosen = h.fit(&cfg(), Nanos(W_NS), SoftwareSpan::Full).unwrap();
            let f = chosen.outcome.fit.unwrap();
            let fitted = f.offset_at_f64(LocalNs(f.epoch_ns));
            // What the fastest probes see: half the detour of the path
            // they took, which no endpoint can see.
            let seen = 1_000.0 + before.min(after) as f64 / 2.0;
            let error = fitted - seen;
            eprintln!(
                "{before} -> {after}: {} windows, error {error:.0} ns",
                chosen.windows
            );
            if after < before {
                assert_eq!(chosen.windows, 1, "{before} -> {after} ns detour");
            } else {
                assert_eq!(chosen.windows, fit.windows, "{before} -> {after} ns detour");
            }
            assert!(error.abs() < 100.0, "{before} -> {after}: {error} ns");
        }
    }

    /// NIC stamps: a newest second slower by more than the cut is a path
    /// change (their best round trip holds still within a few ns).
    #[test]
    fn a_slower_nic_path_cuts_the_history() {
        let mut h = two_nic_seconds();
        assert_eq!(fitted_windows(&mut h), 2);
        h.push(window_of(SECOND_NS, 2, |_| 1_000, 800), StampClass::Nic);
        assert_eq!(fitted_windows(&mut h), 1);
    }

    const SECOND_NS: i64 = 1_000_000_000;

    /// Two 1 s NIC windows on one path, ten pure pairs each way in each.
    fn two_nic_seconds() -> EdgeHistory {
        let mut h = EdgeHistory::default();
        for w in 0..2 {
            h.push(window_of(SECOND_NS, w, |_| 1_000, 0), StampClass::Nic);
        }
        h
    }

    /// How many 1 s windows the history's fit spans.
    fn fitted_windows(h: &mut EdgeHistory) -> usize {
        h.fit(&cfg(), Nanos(SECOND_NS), SoftwareSpan::Full)
            .unwrap()
            .windows
    }

    /// A newest window whose few pure pairs all queued alike (fewer than
    /// [`NIC_STARVED_POINTS`] a direction, 800 ns slower) is a slow patch:
    /// the span keeps the window before it. The same slowdown with a full
    /// window's pairs still cuts (`a_slower_nic_path_cuts_the_history`).
    #[test]
    fn a_starved_slower_nic_window_does_not_cut_the_history() {
        let mut h = two_nic_seconds();
        let mut slow = window_of(SECOND_NS, 2, |_| 1_000, 800);
        // Two probes a pair: one pair short of a fit that is not starved.
        let probes = 2 * (NIC_STARVED_POINTS - 1);
        slow.forward.truncate(probes);
        slow.backward.truncate(probes);
        h.push(slow, StampClass::Nic);
        assert_eq!(fitted_windows(&mut h), 2);
    }

    /// NIC stamps: a newest second faster than the one before (a slow
    /// window, then the usual path again) does not cut the 2 s span, and
    /// the line sits on the faster packets.
    #[test]
    fn a_faster_nic_second_keeps_the_span() {
        let mut h = EdgeHistory::default();
        h.push(window_of(SECOND_NS, 0, |_| 1_000, 0), StampClass::Nic);
        h.push(window_of(SECOND_NS, 1, |_| 1_000, 800), StampClass::Nic);
        assert_eq!(fitted_windows(&mut h), 1, "slower: cut");
        h.push(window_of(SECOND_NS, 2, |_| 1_000, 0), StampClass::Nic);
        let chosen = h.fit(&cfg(), Nanos(SECOND_NS), SoftwareSpan::Full).unwrap();
        assert_eq!(chosen.windows, 2, "faster: kept");
        let f = chosen.outcome.fit.unwrap();
        let fitted = f.offset_at_f64(LocalNs(f.epoch_ns));
        let error = fitted - 1_000.0;
        assert!(error.abs() < 20.0, "{error} ns");
    }

    /// A detour that came and went inside the span: the newest window is
    /// back on the old path and so are the oldest, so the path test sees no
    /// change and the span stays long. That costs nothing: the detour only
    /// slows one direction, and the fit's envelope is bound by the fastest
    /// packets, those of the path around it.
    #[test]
    fn a_detour_inside_the_span_leaves_the_fit_on_the_faster_path() {
        let mut h = EdgeHistory::default();
        let span = StampClass::Software.max_history_windows(Nanos(W_NS));
        for w in 0..span as i64 {
            let detour = if (2..6).contains(&w) { 800 } else { 0 };
            h.push(window_via(w, |_| 1_000, detour), StampClass::Software);
        }
        let chosen = h.fit(&cfg(), Nanos(W_NS), SoftwareSpan::Full).unwrap();
        let f = chosen.outcome.fit.unwrap();
        let fitted = f.offset_at_f64(LocalNs(f.epoch_ns));
        let error = fitted - 1_000.0;
        assert_eq!(chosen.windows, span);
        assert!(error.abs() < 20.0, "{error} ns");
    }

    /// NIC stamps: 2 s of history whatever the window.
    #[test]
    fn nic_stamps_keep_a_short_history() {
        for (len_ns, windows) in [(4_000_000_000, 1), (2_000_000_000, 1), (1_000_000_000, 2)] {
            let mut h = EdgeHistory::default();
            for w in 0..MAX_WINDOWS as i64 {
                h.push(window_of(len_ns, w, |_| 1_000, 0), StampClass::Nic);
            }
            let fit = h.fit(&cfg(), Nanos(len_ns), SoftwareSpan::Full).unwrap();
            assert_eq!(fit.windows, windows, "{len_ns} ns windows");
        }
    }

    /// Busy queues: only one pair in `keep` crossed unqueued both ways (the
    /// second packet of every other pair 500 ns later than its first).
    fn queued_but_one_in(mut p: EdgeProbes, keep: u64) -> EdgeProbes {
        for probe in p.forward.iter_mut().chain(p.backward.iter_mut()) {
            if probe.pair_index == 1 && probe.seq % keep != 0 {
                probe.rx_ns += 500;
            }
        }
        p
    }

    /// A NIC fit of 2 s whose busy queues left it fewer than
    /// NIC_STARVED_POINTS pure pairs a direction grows its span, one span
    /// at a time, until it holds enough (2 a second here: 4 s), and no
    /// further; a fed one keeps 2 s (`nic_stamps_keep_a_short_history`).
    #[test]
    fn a_starved_nic_fit_grows_its_span_until_it_holds_enough_pure_pairs() {
        const S: i64 = 1_000_000_000;
        for (keep, windows) in [(5, 4), (10, 8), (1, 2)] {
            let mut h = EdgeHistory::default();
            for w in 0..MAX_WINDOWS as i64 {
                h.push(
                    queued_but_one_in(window_of(S, w, |_| 1_000, 0), keep),
                    StampClass::Nic,
                );
            }
            let fit = h.fit(&cfg(), Nanos(S), SoftwareSpan::Full).unwrap();
            assert_eq!(fit.windows, windows, "one pair in {keep} pure");
            let f = fit.outcome.fit.unwrap();
            assert!(
                (f.offset_at(LocalNs(f.epoch_ns)).0 - 1_000).abs() < 50,
                "{f:?}"
            );
        }
    }

    /// A busy or lossy host: software-stamped seconds whose pairs were all
    /// queued (the best round trip 600–3,000 ns slower). The fastest pairs
    /// of the span are still the better samples: the history stays whole.
    #[test]
    fn slow_seconds_do_not_cut_a_software_history() {
        const SHORT_NS: i64 = 1_000_000_000;
        let slow = |w: i64| match w % 8 {
            3 | 4 => 900,
            _ => 0,
        };
        let mut h = EdgeHistory::default();
        for w in 0..MAX_WINDOWS as i64 {
            h.push(
                window_of(SHORT_NS, w, |_| 1_000, slow(w)),
                StampClass::Software,
            );
        }
        for w in MAX_WINDOWS as i64..MAX_WINDOWS as i64 + 4 {
            h.push(
                window_of(SHORT_NS, w, |_| 1_000, 3_000),
                StampClass::Software,
            );
            let chosen = h.fit(&cfg(), Nanos(SHORT_NS), SoftwareSpan::Full).unwrap();
            assert_eq!(chosen.windows, MAX_WINDOWS, "window {w}");
            let f = chosen.outcome.fit.unwrap();
            let fitted = f.offset_at_f64(LocalNs(f.epoch_ns));
            assert!((fitted - 1_000.0).abs() < 100.0, "window {w}");
        }
    }

    /// NIC stamps at 1 s windows: the offset from the last 2 s, the drift
    /// from the last 3 s, which a steady clock's spans agree on.
    #[test]
    fn a_nic_fit_takes_its_drift_from_a_longer_span() {
        const SHORT_NS: i64 = 1_000_000_000;
        let base = 1_700_000_000_000_000_000i64;
        // 2 ppm of drift, bending by a few ns a second (a wandering
        // frequency), so each span has its own slope.
        let offset = move |t: i64| {
            let s = (t - base) as f64 / 1e9;
            1_000 + (t - base) / 500_000 + (2.0 * s * s) as i64
        };
        let mut h = EdgeHistory::default();
        for w in 0..8 {
            h.push(window_of(SHORT_NS, w, offset, 0), StampClass::Nic);
        }
        let chosen = h.fit(&cfg(), Nanos(SHORT_NS), SoftwareSpan::Full).unwrap();
        assert_eq!((chosen.windows, chosen.drift_windows), (2, 3));
        let fit = chosen.outcome.fit.unwrap();
        let own = h.fit_span(2, &cfg()).0.fit.unwrap();
        let long = h.fit_span(3, &cfg()).0.fit.unwrap();
        assert_ne!(own.drift, long.drift, "the test needs spans that differ");
        assert_eq!((fit.drift, fit.drift_bound), (long.drift, long.drift_bound));
        assert_eq!(
            fit.offset_at(LocalNs(fit.epoch_ns)),
            own.offset_at(LocalNs(own.epoch_ns))
        );
    }

    /// A frequency step inside the drift's span but before the offset's:
    /// the long span's line bends away from the newest pairs (here its path
    /// test sees it), and the fit keeps its own drift.
    #[test]
    fn a_frequency_step_keeps_the_nic_fit_s_own_drift() {
        const SHORT_NS: i64 = 1_000_000_000;
        let step = 1_700_000_000_000_000_000i64 + 5 * SHORT_NS;
        // 10 ppm faster from window 5 on; windows 5 and 6 are the 2 s span.
        // (The 3 s span still fits: a larger step would make it fail.)
        let offset = move |t: i64| if t < step { 0 } else { (t - step) / 100_000 };
        let mut h = EdgeHistory::default();
        for w in 0..7 {
            h.push(window_of(SHORT_NS, w, offset, 0), StampClass::Nic);
        }
        let chosen = h.fit(&cfg(), Nanos(SHORT_NS), SoftwareSpan::Full).unwrap();
        assert_eq!((chosen.windows, chosen.drift_windows), (2, 2));
        let own = h.fit_span(2, &cfg()).0.fit.unwrap();
        assert_eq!(chosen.outcome.fit.unwrap().drift, own.drift);
    }

    /// Window `w` of `len_ns` without a probe either way (the link down).
    fn silent(w: i64, len_ns: i64) -> EdgeProbes {
        thinned(window_of(len_ns, w, |_| 0, 0), 0)
    }

    /// `probes` with only its first `kept` probes each way.
    fn thinned(mut probes: EdgeProbes, kept: usize) -> EdgeProbes {
        probes.forward.truncate(kept);
        probes.backward.truncate(kept);
        probes
    }

    /// A software edge's history of `windows` one-second windows, the
    /// offset a steady 1 µs.
    fn steady_software_history(windows: i64) -> EdgeHistory {
        let mut h = EdgeHistory::default();
        for w in 0..windows {
            let probes = window_of(1_000_000_000, w, |_| 1_000, 0);
            h.push_window(w as u64, probes, StampClass::Software);
        }
        h
    }

    /// A 28 s silence on a software edge: while it lasts the edge keeps
    /// the line of the windows before it, at its own anchor; the first
    /// window after it is fitted with the 31 windows from before it.
    #[test]
    fn a_silence_is_bridged_by_the_windows_before_it() {
        const SHORT_NS: i64 = 1_000_000_000;
        let offset = |_| 1_000;
        let mut h = steady_software_history(32);
        let before = h
            .fit(&cfg(), Nanos(SHORT_NS), SoftwareSpan::Full)
            .unwrap()
            .outcome
            .fit
            .unwrap();
        for w in 32..60 {
            h.push_window(w as u64, silent(w, SHORT_NS), StampClass::Software);
            let during = h
                .fit(&cfg(), Nanos(SHORT_NS), SoftwareSpan::Full)
                .unwrap()
                .outcome
                .fit
                .unwrap();
            assert_eq!(during.epoch_ns, before.epoch_ns, "window {w}");
            assert!(!h.is_outlived_by(w as u64), "window {w}");
        }
        h.push_window(60, window_of(SHORT_NS, 60, offset, 0), StampClass::Software);
        let after = h.fit(&cfg(), Nanos(SHORT_NS), SoftwareSpan::Full).unwrap();
        assert_eq!(after.windows, MAX_WINDOWS);
        let per_window = 2 * 2 * (SHORT_NS / 100_000_000) as usize;
        let probes = after.outcome.forward.probes + after.outcome.backward.probes;
        assert_eq!(
            probes,
            MAX_WINDOWS * per_window,
            "the windows before the silence"
        );
        let f = after.outcome.fit.unwrap();
        let fitted = f.offset_at_f64(LocalNs(f.epoch_ns));
        assert!((fitted - 1_000.0).abs() <= f.bound_ns);
    }

    /// After a long silence, a window with a few probes is fitted alone (a
    /// wide bound: the held result stays); once the windows after the
    /// silence hold half a window's worth, the fit bridges it again. A
    /// short silence is bridged at once.
    #[test]
    fn a_silence_is_bridged_only_once_a_window_s_worth_came_after_it() {
        const SHORT_NS: i64 = 1_000_000_000;
        let offset = |_| 1_000;
        let (mut h, first) = after_a_silence_with(6);
        assert_eq!(first.windows, 1, "six probes each way after the silence");
        h.push_window(41, window_of(SHORT_NS, 41, offset, 0), StampClass::Software);
        let next = h.fit(&cfg(), Nanos(SHORT_NS), SoftwareSpan::Full).unwrap();
        assert_eq!(next.windows, 16, "bridged once a full window came");
        assert!(next.outcome.fit.unwrap().bound_ns < first.outcome.fit.unwrap().bound_ns);
        let after_a_lost_report = thinned(window_of(SHORT_NS, 43, offset, 0), 6);
        h.push_window(43, after_a_lost_report, StampClass::Software);
        let short = h.fit(&cfg(), Nanos(SHORT_NS), SoftwareSpan::Full).unwrap();
        assert_eq!(short.windows, 16, "a one-window silence is bridged at once");
    }

    /// The first window after a long silence, cut short by the silence's
    /// end, holds more than half a window's probes (12 of 20 each way):
    /// it is bridged at once, the line moved to its packets.
    #[test]
    fn a_window_over_half_full_after_a_silence_is_bridged() {
        let (_, first) = after_a_silence_with(12);
        assert!(first.windows > 1, "bridged: {} window(s)", first.windows);
    }

    /// A steady 20-window software history, 20 windows of silence, then
    /// window 40 with `kept` probes each way: the history and its fit.
    fn after_a_silence_with(kept: usize) -> (EdgeHistory, HistoryFit) {
        const SHORT_NS: i64 = 1_000_000_000;
        let mut h = steady_software_history(20);
        let partial = thinned(window_of(SHORT_NS, 40, |_| 1_000, 0), kept);
        h.push_window(40, partial, StampClass::Software);
        let first = h.fit(&cfg(), Nanos(SHORT_NS), SoftwareSpan::Full).unwrap();
        (h, first)
    }

    /// Across a long silence the clocks moved (here 400 ns, as a wander of
    /// a few ppb would in tens of seconds). A line bridging it whose offset
    /// at its newest end is still the old one (the fastest packets before
    /// the silence pinned it) is moved to the offset the packets after the
    /// silence allow under its slope, and its bound grows by the move; a
    /// line that does not bridge a long silence is left alone.
    #[test]
    fn a_bridged_line_takes_its_offset_from_the_windows_after_the_silence() {
        const SHORT_NS: i64 = 1_000_000_000;
        let first_after = 1_700_000_000_000_000_000i64 + 40 * SHORT_NS;
        let offset = move |t: i64| if t < first_after { 1_000 } else { 1_400 };
        let mut h = EdgeHistory::default();
        for w in (0..20).chain(40..42) {
            h.push_window(
                w as u64,
                window_of(SHORT_NS, w, offset, 0),
                StampClass::Software,
            );
        }
        let mut fit = h.fit(&cfg(), Nanos(SHORT_NS), SoftwareSpan::Full).unwrap();
        assert_eq!(fit.windows, 16, "bridged: two windows after it, 14 before");
        let at_end = |fit: &HistoryFit| {
            let f = fit.outcome.fit.as_ref().unwrap();
            (f.offset_at_f64(LocalNs(f.epoch_ns)), f.bound_ns)
        };
        // The old offset at the newest end, flat: what a line pinned by the
        // windows before the silence says.
        if let Ok(f) = fit.outcome.fit.as_mut() {
            f.drift = 0.0;
            f.offset_rel_ns -= f.offset_at_f64(LocalNs(f.epoch_ns)) - 1_000.0;
        }
        let (_, bound_before) = at_end(&fit);
        h.offset_after_silence(&mut fit, Nanos(SHORT_NS));
        let (moved, bound) = at_end(&fit);
        assert!(
            (moved - 1_400.0).abs() < 5.0,
            "{moved} ns at the newest end"
        );
        assert!(
            (bound - bound_before - 400.0).abs() < 5.0,
            "grown by the move"
        );
        // Without a long silence before the newest windows: left alone.
        let mut steady = EdgeHistory::default();
        for w in 0..20 {
            steady.push_window(
                w as u64,
                window_of(SHORT_NS, w, |_| 1_000, 0),
                StampClass::Software,
            );
        }
        let mut fit = steady
            .fit(&cfg(), Nanos(SHORT_NS), SoftwareSpan::Full)
            .unwrap();
        let before = at_end(&fit);
        steady.offset_after_silence(&mut fit, Nanos(SHORT_NS));
        assert_eq!(at_end(&fit), before);
    }

    /// NIC fits span time, not kept windows: during a silence the edge
    /// has no fit to share (the pair book classes a window without probes
    /// software; it was bridged by a software span of the windows before
    /// it, shared as each silent window's fit), and the first window after
    /// it is fitted alone.
    #[test]
    fn a_nic_fit_does_not_bridge_a_silence() {
        const SHORT_NS: i64 = 1_000_000_000;
        let mut h = EdgeHistory::default();
        for w in 0..5 {
            h.push_window(
                w as u64,
                window_of(SHORT_NS, w, |_| 1_000, 0),
                StampClass::Nic,
            );
        }
        for w in 5..8 {
            h.push_window(w as u64, silent(w, SHORT_NS), StampClass::Software);
            let during = h.fit(&cfg(), Nanos(SHORT_NS), SoftwareSpan::Full);
            let stale = w >= 6; // window 4 left the 2 s NIC span
            assert!(
                !stale || during.is_none_or(|f| f.outcome.fit.is_err()),
                "window {w}: no line of the windows before the silence"
            );
        }
        h.push_window(8, window_of(SHORT_NS, 8, |_| 1_000, 0), StampClass::Nic);
        let after = h.fit(&cfg(), Nanos(SHORT_NS), SoftwareSpan::Full).unwrap();
        assert_eq!(after.stamps, StampClass::Nic);
        let probes = after.outcome.forward.probes + after.outcome.backward.probes;
        assert_eq!(
            probes,
            2 * 2 * (SHORT_NS / 100_000_000) as usize,
            "window 8's alone"
        );
    }

    /// Short windows: a path that got faster cuts a software history at
    /// its first second, so no span mixes the old path's slow packets in.
    #[test]
    fn a_path_that_got_faster_cuts_at_its_first_second() {
        const SHORT_NS: i64 = 1_000_000_000;
        let mut h = EdgeHistory::default();
        for w in 0..MAX_WINDOWS as i64 - 1 {
            h.push(window_of(SHORT_NS, w, |_| 1_000, 800), StampClass::Software);
        }
        h.push(
            window_of(SHORT_NS, MAX_WINDOWS as i64 - 1, |_| 1_000, 0),
            StampClass::Software,
        );
        assert_eq!(
            h.fit(&cfg(), Nanos(SHORT_NS), SoftwareSpan::Full)
                .unwrap()
                .windows,
            1
        );
    }

    /// A detour on one direction for the whole history, then gone: the
    /// windows that saw it are forgotten at the first faster second, so
    /// the next fits span only the direct path's windows and sit on the
    /// clocks' offset, instead of a line through the detour's windows
    /// pinned at its newest end by the few direct ones (half the detour's
    /// bias, leaning out over seconds).
    #[test]
    fn a_detour_gone_is_forgotten_at_its_first_faster_second() {
        const SHORT_NS: i64 = 1_000_000_000;
        const DETOUR_NS: i64 = 2_000;
        let offset = |_| 1_000;
        let mut h = EdgeHistory::default();
        for w in 0..40 {
            let probes = window_of(SHORT_NS, w, offset, DETOUR_NS);
            h.push(probes, StampClass::Software);
            h.fit(&cfg(), Nanos(SHORT_NS), SoftwareSpan::Full);
        }
        for w in 40..44 {
            h.push(window_of(SHORT_NS, w, offset, 0), StampClass::Software);
            let fit = h.fit(&cfg(), Nanos(SHORT_NS), SoftwareSpan::Full).unwrap();
            assert!(
                fit.windows <= (w - 39) as usize,
                "window {w}: {}",
                fit.windows
            );
            let f = fit.outcome.fit.unwrap();
            let fitted = f.offset_at_f64(LocalNs(f.epoch_ns));
            let error = fitted - 1_000.0;
            assert!(error.abs() < 500.0, "window {w}: {error} ns off");
        }
    }
}
