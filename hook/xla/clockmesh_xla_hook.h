/*
 * clockmesh XLA hook: records this node's clock offset (read from the
 * clockmesh agent's offsets file with the header-only C reader) as stats of
 * the "Task Environment" plane of a profiler XSpace, so that
 * `clockmesh trace merge` can place the trace on the global timeline.
 *
 * Call RecordSessionStart() where the session starts (the
 * tsl::ProfilerSession constructor, after start_time_ns_ is set) and
 * AddClockStatsToXSpace() after tsl::profiler::PostProcessSingleHostXSpace()
 * in tsl::ProfilerSession::CollectData (see hook/README.md): the offsets are
 * recorded at both ends of the session, so `clockmesh trace merge` can
 * follow the clock's drift between them. The hook only reads the offsets
 * file and never fails the profiling session: when no record can be read
 * it adds a `clock_status` string stat and no offset (fail closed).
 */
#ifndef CLOCKMESH_XLA_HOOK_H_
#define CLOCKMESH_XLA_HOOK_H_

#ifdef CLOCKMESH_XPLANE_PB_H
#include CLOCKMESH_XPLANE_PB_H
#else
#include "tsl/profiler/protobuf/xplane.pb.h"
#endif

namespace clockmesh {

// Stats added to the Task Environment plane (names shared with the merge
// tool, clockmesh_proto::clock_stats). Start anchor, holding at local
// CLOCK_REALTIME profile_start_time:
//   clock_offset_ns        int64   global - local at profile_start_time, from
//                                  the start record; "stop-only": the stop
//                                  record there, its bound grown by
//                                  bound growth x age (clockmesh_apply)
//   clock_offset_bound_ns  uint64  error bound of that offset
//   clock_drift_ppb        double  that record's drift
//   clock_bound_growth_ppb double  that record's bound_growth_ps_per_s / 1000
// Stop anchor (absent when the stop read failed):
//   clock_stop_at_ns       int64   local time it holds at: profile_stop_time
//                                  (uint64 or int64) if the plane has it,
//                                  else the local time of the stop read
//   clock_stop_offset_ns   int64   global - local there, from the stop record
//   clock_stop_offset_bound_ns uint64, clock_stop_drift_ppb double,
//   clock_stop_bound_growth_ppb double   likewise
// Which anchors, and the record's identity (stop record, else start):
//   clock_anchors          string  "start+stop"; "start" (stop read failed);
//                                  "stop-only" (no start record: start
//                                  anchor derived from the stop record)
//   clock_anchor_ns        int64   local time the agent's estimate refers to
//   clock_reference_id     uint64  reference node of the global timeline
//   clock_agent_epoch      uint64  agent restart counter
//   clock_window           uint64  estimator window
//   clock_flags            uint64  record flags (docs/offsets-format.md)
//   clock_device_<id>_{offset_ns,bound_ns,drift_ppb,anchor_ns,kind}
//   clock_status           string  "ok" (at least one anchor recorded) or
//                                  why no offset was recorded (then no
//                                  other clock_* stat is present)
//
// `offsets_path` NULL means $CLOCKMESH_OFFSETS_PATH or /run/clockmesh/offsets;
// CLOCKMESH_OFFSETS_PATH=off disables the hook (the XSpace is left untouched).
// Reads the stop record, takes (clears) the start record kept by
// RecordSessionStart, and returns a clockmesh_status code (0 = at least one
// anchor, or disabled). Calling it again replaces every clock_* stat.
int AddClockStatsToXSpace(tensorflow::profiler::XSpace* space,
                          const char* offsets_path = nullptr);

// Reads the offsets record at the session start and keeps it, if it is fresh
// then, in a process-wide slot (mutex-guarded; TSL's ProfilerLock allows one
// session at a time) for the next AddClockStatsToXSpace. It is not checked
// for freshness again at the stop. Same path rules as above. Returns a
// clockmesh_status code; on error, or when disabled, the slot is emptied (the
// stop record then stands in: clock_anchors "stop-only").
int RecordSessionStart(const char* offsets_path = nullptr);

}  // namespace clockmesh

#endif  // CLOCKMESH_XLA_HOOK_H_
