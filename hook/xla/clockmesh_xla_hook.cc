// See clockmesh_xla_hook.h. Uses only the generated protobuf API and the
// header-only C reader, so it builds inside XLA and stand-alone.
#include "clockmesh_xla_hook.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "clockmesh.h"

namespace clockmesh {
namespace {

using tensorflow::profiler::XPlane;
using tensorflow::profiler::XSpace;
using tensorflow::profiler::XStat;

constexpr char kTaskEnvPlaneName[] = "Task Environment";
constexpr char kProfileStartTime[] = "profile_start_time";
constexpr char kProfileStopTime[] = "profile_stop_time";

// The record RecordSessionStart read, until the session's stats take it.
// TSL's ProfilerLock allows one session at a time: one slot is enough.
std::mutex g_start_mutex;
bool g_has_start = false;
clockmesh_snapshot_t g_start;

XPlane* FindOrAddTaskEnvPlane(XSpace* space) {
  int64_t max_id = 0;
  for (XPlane& plane : *space->mutable_planes()) {
    if (plane.name() == kTaskEnvPlaneName) return &plane;
    if (plane.id() > max_id) max_id = plane.id();
  }
  XPlane* plane = space->add_planes();
  plane->set_id(max_id + 1);
  plane->set_name(kTaskEnvPlaneName);
  return plane;
}

int64_t StatMetadataId(XPlane* plane, const std::string& name) {
  int64_t max_id = 0;
  for (const auto& [id, metadata] : plane->stat_metadata()) {
    if (metadata.name() == name) return id;
    if (id > max_id) max_id = id;
  }
  auto& metadata = (*plane->mutable_stat_metadata())[max_id + 1];
  metadata.set_id(max_id + 1);
  metadata.set_name(name);
  return max_id + 1;
}

// The plane's stat with this name, created if missing (so re-running the
// hook replaces values instead of duplicating them).
XStat* Stat(XPlane* plane, const std::string& name) {
  int64_t id = StatMetadataId(plane, name);
  for (XStat& stat : *plane->mutable_stats()) {
    if (stat.metadata_id() == id) return &stat;
  }
  XStat* stat = plane->add_stats();
  stat->set_metadata_id(id);
  return stat;
}

// Removes every clock_* stat a previous run left, so a re-run replaces
// them all (a stop anchor or device that is gone now must not linger).
void RemoveClockStats(XPlane* plane) {
  auto is_clock = [plane](const XStat& stat) {
    auto it = plane->stat_metadata().find(stat.metadata_id());
    return it != plane->stat_metadata().end() && it->second.name().rfind("clock_", 0) == 0;
  };
  auto* stats = plane->mutable_stats();
  int kept = 0;
  for (int i = 0; i < stats->size(); ++i) {
    if (is_clock(stats->Get(i))) continue;
    if (kept != i) stats->SwapElements(kept, i);
    ++kept;
  }
  stats->DeleteSubrange(kept, stats->size() - kept);
}

// A session time stat as written by XLA (uint64 or int64), else fallback_ns.
int64_t SessionTimeNs(XPlane* plane, const char* name, int64_t fallback_ns) {
  for (const auto& [id, metadata] : plane->stat_metadata()) {
    if (metadata.name() != name) continue;
    for (const XStat& stat : plane->stats()) {
      if (stat.metadata_id() != id) continue;
      if (stat.value_case() == XStat::kUint64Value) return static_cast<int64_t>(stat.uint64_value());
      if (stat.value_case() == XStat::kInt64Value) return stat.int64_value();
    }
  }
  return fallback_ns;
}

const char* KindName(uint16_t kind) {
  switch (kind) {
    case CLOCKMESH_DEV_CUDA: return "cuda";
    case CLOCKMESH_DEV_ROCM: return "rocm";
    case CLOCKMESH_DEV_SYNTHETIC: return "synthetic";
    default: return "unknown";
  }
}

void AddDeviceStats(XPlane* plane, const clockmesh_snapshot_t& snap, int64_t now_ns) {
  for (uint32_t i = 0; i < snap.device_count && i < CLOCKMESH_MAX_DEVICES; ++i) {
    clockmesh_device_t dev;
    if (clockmesh_find_device(&snap, snap.devices[i].device_id, now_ns, &dev) != CLOCKMESH_OK) continue;
    const std::string prefix = "clock_device_" + std::to_string(dev.device_id) + "_";
    Stat(plane, prefix + "offset_ns")->set_int64_value(dev.offset_ns);
    Stat(plane, prefix + "bound_ns")->set_uint64_value(dev.bound_ns);
    Stat(plane, prefix + "drift_ppb")->set_double_value(dev.drift_ps_per_s / 1000.0);
    Stat(plane, prefix + "anchor_ns")->set_int64_value(dev.device_anchor_ns);
    Stat(plane, prefix + "kind")->set_str_value(KindName(dev.kind));
  }
}

int ReadFreshSnapshot(const char* path, clockmesh_snapshot_t* snap) {
  clockmesh_t cm;
  int rc = clockmesh_open(&cm, path);
  if (rc != CLOCKMESH_OK) return rc;
  rc = clockmesh_read_snapshot(&cm, snap);
  clockmesh_close(&cm);
  if (rc != CLOCKMESH_OK) return rc;
  return clockmesh_check_fresh(snap, clockmesh_realtime_now_ns());
}

// The offsets path: the argument, else $CLOCKMESH_OFFSETS_PATH (NULL: default).
const char* OffsetsPath(const char* offsets_path) {
  return offsets_path ? offsets_path : std::getenv("CLOCKMESH_OFFSETS_PATH");
}

bool Disabled(const char* path) { return path != nullptr && std::strcmp(path, "off") == 0; }

// Takes (once) the record RecordSessionStart kept.
bool TakeStart(clockmesh_snapshot_t* out) {
  std::lock_guard<std::mutex> lock(g_start_mutex);
  if (!g_has_start) return false;
  *out = g_start;
  g_has_start = false;
  return true;
}

// One record's map at local time at_ns: offset (global - local), bound,
// drift and bound growth, under stat names prefix + "offset_ns", ...
void AddAnchorStats(XPlane* plane, const clockmesh_snapshot_t& snap, int64_t at_ns,
                    const std::string& prefix) {
  int64_t global_ns = 0;
  uint64_t bound_ns = 0;
  clockmesh_apply(&snap, at_ns, &global_ns, &bound_ns);
  Stat(plane, prefix + "offset_ns")->set_int64_value(global_ns - at_ns);
  Stat(plane, prefix + "offset_bound_ns")->set_uint64_value(bound_ns);
  Stat(plane, prefix + "drift_ppb")->set_double_value(snap.drift_ps_per_s / 1000.0);
  Stat(plane, prefix + "bound_growth_ppb")->set_double_value(snap.bound_growth_ps_per_s / 1000.0);
}

// Which record the global timeline and devices come from.
void AddIdentityStats(XPlane* plane, const clockmesh_snapshot_t& snap) {
  Stat(plane, "clock_anchor_ns")->set_int64_value(snap.anchor_local_ns);
  Stat(plane, "clock_reference_id")->set_uint64_value(snap.reference_id);
  Stat(plane, "clock_agent_epoch")->set_uint64_value(snap.epoch);
  Stat(plane, "clock_window")->set_uint64_value(snap.window);
  Stat(plane, "clock_flags")->set_uint64_value(snap.flags);
  AddDeviceStats(plane, snap, clockmesh_realtime_now_ns());
}

}  // namespace

int RecordSessionStart(const char* offsets_path) {
  const char* path = OffsetsPath(offsets_path);
  const bool disabled = Disabled(path);
  clockmesh_snapshot_t snap{};
  const int rc = disabled ? CLOCKMESH_OK : ReadFreshSnapshot(path, &snap);
  // A previous session's record never carries over: disabled or failed,
  // the slot is emptied.
  std::lock_guard<std::mutex> lock(g_start_mutex);
  g_has_start = !disabled && rc == CLOCKMESH_OK;
  if (g_has_start) g_start = snap;
  return rc;
}

int AddClockStatsToXSpace(XSpace* space, const char* offsets_path) {
  if (space == nullptr) return CLOCKMESH_E_INVALID;
  // The start record belongs to this session whatever happens next.
  clockmesh_snapshot_t start{}, stop{};
  const bool have_start = TakeStart(&start);
  const char* path = OffsetsPath(offsets_path);
  if (Disabled(path)) return CLOCKMESH_OK;
  XPlane* plane = FindOrAddTaskEnvPlane(space);
  RemoveClockStats(plane);
  const int rc = ReadFreshSnapshot(path, &stop);
  const int64_t read_ns = clockmesh_realtime_now_ns();
  const bool have_stop = rc == CLOCKMESH_OK;
  if (!have_start && !have_stop) {
    Stat(plane, "clock_status")->set_str_value(clockmesh_strerror(rc));
    return rc;
  }
  Stat(plane, "clock_status")->set_str_value(clockmesh_strerror(CLOCKMESH_OK));
  Stat(plane, "clock_anchors")->set_str_value(have_start ? (have_stop ? "start+stop" : "start") : "stop-only");
  // Without a start record the stop record stands in at the start, its
  // bound grown over the session (clockmesh_apply).
  AddAnchorStats(plane, have_start ? start : stop, SessionTimeNs(plane, kProfileStartTime, read_ns), "clock_");
  AddIdentityStats(plane, have_stop ? stop : start);
  if (have_stop) {
    const int64_t stop_ns = SessionTimeNs(plane, kProfileStopTime, read_ns);
    Stat(plane, "clock_stop_at_ns")->set_int64_value(stop_ns);
    AddAnchorStats(plane, stop, stop_ns, "clock_stop_");
  }
  return CLOCKMESH_OK;
}

}  // namespace clockmesh
