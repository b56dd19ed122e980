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
// tool, clockmesh_proto::clock_stats):
//   clock_offset_ns        int64   global - local CLOCK_REALTIME at the
//                                  session start (profile_start_time), from
//                                  the start record (else the stop record)
//   clock_offset_bound_ns  uint64  error bound of that offset
//   clock_drift_ppb        double  drift of the offset
//   clock_bound_growth_ppb double  how fast the bound grows away from it
//   clock_stop_at_ns       int64   profile_stop_time: where the stop record
//                                  holds (absent if it could not be read)
//   clock_stop_{offset_ns,offset_bound_ns,drift_ppb,bound_growth_ppb}
//                                  the stop record's map there
//   clock_anchors          string  "start+stop", "start" or "stop-only"
//   clock_anchor_ns        int64   local time the agent's estimate refers to
//   clock_reference_id     uint64  reference node of the global timeline
//   clock_agent_epoch      uint64  agent restart counter
//   clock_window           uint64  estimator window
//   clock_flags            uint64  record flags (docs/offsets-format.md)
//   clock_device_<id>_{offset_ns,bound_ns,drift_ppb,anchor_ns,kind}
//   clock_status           string  "ok" or why no offset was recorded
//
// `offsets_path` NULL means $CLOCKMESH_OFFSETS or /run/clockmesh/offsets;
// CLOCKMESH_OFFSETS=off disables the hook. Returns a clockmesh_status code
// (0 = at least one record). It takes the start record (once); calling it
// again replaces the previous values.
int AddClockStatsToXSpace(tensorflow::profiler::XSpace* space,
                          const char* offsets_path = nullptr);

// Reads and keeps the offsets record at the session start, for the next
// AddClockStatsToXSpace. Returns a clockmesh_status code; on error nothing
// is kept (the stop record then stands in).
int RecordSessionStart(const char* offsets_path = nullptr);

}  // namespace clockmesh

#endif  // CLOCKMESH_XLA_HOOK_H_
