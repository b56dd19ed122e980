//! Placing one line's events: through the host map's last piece on the fast path, else through the timeline.

use clockmesh_offsets::host_map::{NearSegment, round_bound_ns};

use super::event::EventTimes;
use super::timeline::{Placed, Tally, Timeline, Unmapped};

/// A timed event placed relative to a line starting at `new_ts_ns`:
/// its start and end, and its new offset and duration (never negative).
pub(super) fn place_event(
    t: &EventTimes,
    line_ps: i128,
    new_ts_ns: i64,
    tl: &Timeline<'_>,
) -> Result<(Placed, Placed, (i64, i64)), Unmapped> {
    let s = line_ps + i128::from(t.offset_ps);
    let (a, b) = tl.span(s, s + i128::from(t.duration_ps))?;
    let offset = to_i64(a.ps - i128::from(new_ts_ns) * 1000, s)?;
    let duration = to_i64(b.ps - a.ps, s)?;
    Ok((a, b, (offset, duration)))
}

/// Places one line's events. Host-clock planes go through the piece of
/// the host map that held last, seen from the line's start in i64 and
/// f64 ([`NearSegment`]): the same values as [`Timeline::span`], without
/// its i128 conversions, and with the bounds (walk A only, `BOUND`) kept
/// unrounded until the line's end. Device planes, and whatever leaves
/// i64, go through [`Timeline::span`].
#[derive(Clone)]
pub(super) struct LinePlacer<'t, 'a> {
    tl: &'t Timeline<'a>,
    line_ps: i128,
    /// Host-clock planes: the piece used last, from `line_ps`.
    piece: Option<NearSegment>,
    /// `line_ps` + the piece's anchor offset − the origin.
    base_ps: i128,
    /// Worst unrounded bound of the times placed through `piece`.
    worst: f64,
}

impl<'t, 'a> LinePlacer<'t, 'a> {
    pub(super) fn new(tl: &'t Timeline<'a>, line_ps: i128) -> Self {
        Self {
            tl,
            line_ps,
            piece: None,
            base_ps: 0,
            worst: f64::NEG_INFINITY,
        }
    }

    /// A timed event relative to a line starting at `new_ts_ps`: its
    /// placed start (ps after the origin) and its new offset and duration,
    /// as [`place_event`]. With `BOUND`, the bounds go into `tally` (or
    /// [`Self::worst`], folded in by [`Self::finish`]).
    #[inline]
    pub(super) fn event<const BOUND: bool>(
        &mut self,
        t: &EventTimes,
        (new_ts_ns, new_ts_ps): (i64, i128),
        tally: &mut Tally,
    ) -> Result<(i128, (i64, i64)), Unmapped> {
        if self.tl.maps.is_some() {
            let (a, b, times) = place_event(t, self.line_ps, new_ts_ns, self.tl)?;
            if BOUND {
                tally.add(a);
                tally.add(b);
            }
            return Ok((a.ps, times));
        }
        let a = self.host::<BOUND>(t.offset_ps, tally)?;
        let b = match t.offset_ps.checked_add(t.duration_ps) {
            Some(end) => self.host::<BOUND>(end, tally)?,
            None => {
                self.host_wide::<BOUND>(i128::from(t.offset_ps) + i128::from(t.duration_ps), tally)?
            }
        };
        let s = self.line_ps + i128::from(t.offset_ps);
        Ok((a, (to_i64(a - new_ts_ps, s)?, to_i64(b - a, s)?)))
    }

    /// A host-clock time `rel` ps after the line start → ps after the origin.
    #[inline]
    fn host<const BOUND: bool>(&mut self, rel: i64, tally: &mut Tally) -> Result<i128, Unmapped> {
        match self.in_piece::<BOUND>(rel) {
            Some(ps) => Ok(ps),
            None => self.host_next::<BOUND>(rel, tally),
        }
    }

    /// `rel` through the current piece, if it holds there in i64.
    #[inline]
    fn in_piece<const BOUND: bool>(&mut self, rel: i64) -> Option<i128> {
        let p = self.piece.as_ref().filter(|p| p.contains(rel))?;
        let (step, bound) = p.eval::<BOUND>(rel)?;
        // NaN (a bound of 0) never counts, as with `f64::max`.
        if BOUND && bound > self.worst {
            self.worst = bound;
        }
        Some(self.base_ps + i128::from(rel) + i128::from(step))
    }

    /// [`Self::host`] outside the piece: the next piece, else the long way.
    #[inline(never)]
    fn host_next<const BOUND: bool>(
        &mut self,
        rel: i64,
        tally: &mut Tally,
    ) -> Result<i128, Unmapped> {
        let seg = self.tl.node.segment(self.line_ps + i128::from(rel));
        self.piece = seg.near(self.line_ps);
        if let Some(p) = &self.piece {
            self.base_ps = self.line_ps + p.anchor_offset_ps() - self.tl.origin_ps;
        }
        match self.in_piece::<BOUND>(rel) {
            Some(ps) => Ok(ps),
            None => self.host_wide::<BOUND>(i128::from(rel), tally),
        }
    }

    /// The long way: [`Timeline::place`].
    #[inline(never)]
    fn host_wide<const BOUND: bool>(
        &mut self,
        rel: i128,
        tally: &mut Tally,
    ) -> Result<i128, Unmapped> {
        let p = self.tl.place(None, self.line_ps + rel)?;
        if BOUND {
            tally.add(p);
        }
        Ok(p.ps)
    }

    /// Folds the bounds kept unrounded into `tally`.
    pub(super) fn finish(&self, tally: &mut Tally) {
        if self.worst > f64::NEG_INFINITY {
            tally.add(Placed {
                ps: 0,
                bound_ns: round_bound_ns(self.worst),
                node_bound_known: self.tl.node.bound_known(),
            });
        }
    }
}

pub(super) fn to_i64(ps: i128, device_ps: i128) -> Result<i64, Unmapped> {
    i64::try_from(ps.max(0)).map_err(|_| Unmapped::at(device_ps, "placed time out of range"))
}
