// See clockmesh_xla_hook.h. Uses only the generated protobuf API and the
// header-only C reader, so it builds inside XLA and stand-alone.
#include "clockmesh_xla_hook.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "clockmesh.h"

namespace clockmesh {
namespace {

using tensorflow::profiler::XPlane;
using tensorflow::profiler::XSpace;
using tensorflow::profiler::XStat;

constexpr char kTaskEnvPlaneName[] = "Task Environment";
constexpr char kProfileStartTime[] = "profile_start_time";

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

// profile_start_time as written by XLA (uint64 or int64), else now.
int64_t SessionStartNs(XPlane* plane) {
  for (const auto& [id, metadata] : plane->stat_metadata()) {
    if (metadata.name() != kProfileStartTime) continue;
    for (const XStat& stat : plane->stats()) {
      if (stat.metadata_id() != id) continue;
      if (stat.value_case() == XStat::kUint64Value) return static_cast<int64_t>(stat.uint64_value());
      if (stat.value_case() == XStat::kInt64Value) return stat.int64_value();
    }
  }
  return clockmesh_realtime_now_ns();
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

}  // namespace

int AddClockStatsToXSpace(XSpace* space, const char* offsets_path) {
  if (space == nullptr) return CLOCKMESH_E_INVALID;
  const char* path = offsets_path ? offsets_path : std::getenv("CLOCKMESH_OFFSETS");
  if (path != nullptr && std::strcmp(path, "off") == 0) return CLOCKMESH_OK;
  XPlane* plane = FindOrAddTaskEnvPlane(space);
  clockmesh_snapshot_t snap;
  int rc = ReadFreshSnapshot(path, &snap);
  Stat(plane, "clock_status")->set_str_value(clockmesh_strerror(rc));
  if (rc != CLOCKMESH_OK) return rc;

  const int64_t start_ns = SessionStartNs(plane);
  int64_t global_ns = 0;
  uint64_t bound_ns = 0;
  clockmesh_apply(&snap, start_ns, &global_ns, &bound_ns);
  Stat(plane, "clock_offset_ns")->set_int64_value(global_ns - start_ns);
  Stat(plane, "clock_offset_bound_ns")->set_uint64_value(bound_ns);
  Stat(plane, "clock_drift_ppb")->set_double_value(snap.drift_ps_per_s / 1000.0);
  Stat(plane, "clock_anchor_ns")->set_int64_value(snap.anchor_local_ns);
  Stat(plane, "clock_reference_id")->set_uint64_value(snap.reference_id);
  Stat(plane, "clock_agent_epoch")->set_uint64_value(snap.epoch);
  Stat(plane, "clock_window")->set_uint64_value(snap.window);
  Stat(plane, "clock_flags")->set_uint64_value(snap.flags);
  AddDeviceStats(plane, snap, clockmesh_realtime_now_ns());
  return CLOCKMESH_OK;
}

}  // namespace clockmesh
