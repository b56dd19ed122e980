// Unit test of clockmesh_xla_hook.cc against C++ code generated from
// proto/xplane.proto: adds the stats to a real XSpace, serializes, parses
// back, and checks values; checks fail-closed behaviour.
//
// The offsets files are written here straight from docs/offsets-format.md
// (an independent implementation of the layout); agreement of the C reader
// with the Rust writer is tested in agent/tests/publish_seqlock.rs.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "clockmesh.h"
#include "clockmesh_xla_hook.h"

using tensorflow::profiler::XPlane;
using tensorflow::profiler::XSpace;
using tensorflow::profiler::XStat;

static int failures = 0;
#define CHECK(cond)                                                      \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                        \
    }                                                                    \
  } while (0)

struct Device {
  uint32_t id;
  uint16_t kind;
  int64_t offset_ns;
  uint64_t bound_ns;
};

// Writes an offsets file per docs/offsets-format.md (version 1).
static void WriteOffsets(const std::string& path, uint32_t flags, int64_t valid_until, int64_t anchor,
                         int64_t offset, int64_t drift_ps_per_s, uint64_t bound,
                         const std::vector<Device>& devices, uint32_t version = 1) {
  std::vector<uint64_t> w(4096 / 8, 0);
  std::memcpy(&w[0], "CLKMOFS1", 8);
  w[1] = version | (64ull << 32);
  w[2] = 4096 | (16ull << 32);
  w[3] = 64 | (64ull << 32);
  w[8] = 2;  // seq: even, one completed write
  uint64_t* p = &w[9];
  p[0] = flags | (static_cast<uint64_t>(devices.size()) << 32);
  p[1] = 7;       // epoch
  p[2] = 1234;    // window
  p[3] = 0xbeef;  // reference id
  p[4] = static_cast<uint64_t>(anchor);
  p[5] = static_cast<uint64_t>(valid_until);
  p[6] = static_cast<uint64_t>(anchor);
  p[7] = static_cast<uint64_t>(offset);
  p[8] = static_cast<uint64_t>(drift_ps_per_s);
  p[9] = bound;
  p[10] = 0;  // bound growth
  for (size_t i = 0; i < devices.size(); ++i) {
    uint64_t* d = p + 15 + 8 * i;
    d[0] = devices[i].id | (static_cast<uint64_t>(devices[i].kind) << 32) | (1ull << 48);
    d[1] = 100;
    d[2] = static_cast<uint64_t>(devices[i].offset_ns);
    d[3] = 2000;
    d[4] = devices[i].bound_ns;
    d[5] = static_cast<uint64_t>(valid_until);
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(w.data(), 8, w.size(), f);
  std::fclose(f);
}

static XSpace SampleSpace(int64_t start_ns) {
  XSpace space;
  space.add_hostnames("hostA");
  XPlane* cpu = space.add_planes();
  cpu->set_id(1);
  cpu->set_name("/host:CPU");
  auto* line = cpu->add_lines();
  line->set_id(1);
  line->set_timestamp_ns(5448);
  auto* ev = line->add_events();
  ev->set_metadata_id(1);
  ev->set_offset_ps(2500000);
  ev->set_duration_ps(1000);
  XPlane* env = space.add_planes();
  env->set_id(2);
  env->set_name("Task Environment");
  (*env->mutable_stat_metadata())[1].set_id(1);
  (*env->mutable_stat_metadata())[1].set_name("profile_start_time");
  (*env->mutable_stat_metadata())[2].set_id(2);
  (*env->mutable_stat_metadata())[2].set_name("profile_stop_time");
  XStat* s = env->add_stats();
  s->set_metadata_id(1);
  s->set_uint64_value(static_cast<uint64_t>(start_ns));
  s = env->add_stats();
  s->set_metadata_id(2);
  s->set_uint64_value(static_cast<uint64_t>(start_ns + 1000000));
  return space;
}

static const XPlane* TaskEnv(const XSpace& space) {
  for (const XPlane& p : space.planes())
    if (p.name() == "Task Environment") return &p;
  return nullptr;
}

static const XStat* FindStat(const XPlane& plane, const std::string& name, int* count = nullptr) {
  const XStat* found = nullptr;
  int n = 0;
  for (const auto& [id, md] : plane.stat_metadata()) {
    if (md.name() != name) continue;
    for (const XStat& s : plane.stats())
      if (s.metadata_id() == id) found = &s, ++n;
  }
  if (count) *count = n;
  return found;
}

static void TestAddsStatsAndRoundTrips(const std::string& dir) {
  const std::string path = dir + "/offsets";
  const int64_t now = clockmesh_realtime_now_ns();
  const int64_t start = now - 2000000000;  // session started 2 s ago
  // 1 µs/s drift: at the session start (2 s before the anchor) -2 µs.
  WriteOffsets(path, CLOCKMESH_F_VALID, now + 60000000000LL, now, -123456, 1000000, 80,
               {{0, CLOCKMESH_DEV_CUDA, 42, 9}, {3, CLOCKMESH_DEV_ROCM, -17, 11}});
  XSpace space = SampleSpace(start);
  const std::string cpu_before = space.planes(0).SerializeAsString();
  CHECK(clockmesh::AddClockStatsToXSpace(&space, path.c_str()) == CLOCKMESH_OK);
  CHECK(clockmesh::AddClockStatsToXSpace(&space, path.c_str()) == CLOCKMESH_OK);  // idempotent

  XSpace back;
  CHECK(back.ParseFromString(space.SerializeAsString()));
  CHECK(back.planes(0).SerializeAsString() == cpu_before);  // other planes untouched
  const XPlane* env = TaskEnv(back);
  CHECK(env != nullptr);
  if (!env) return;
  int n = 0;
  const XStat* off = FindStat(*env, "clock_offset_ns", &n);
  CHECK(off && off->int64_value() == -123456 - 2000);
  CHECK(n == 1);
  CHECK(FindStat(*env, "clock_offset_bound_ns") && FindStat(*env, "clock_offset_bound_ns")->uint64_value() == 80);
  CHECK(FindStat(*env, "clock_drift_ppb") && FindStat(*env, "clock_drift_ppb")->double_value() == 1000.0);
  CHECK(FindStat(*env, "clock_reference_id") && FindStat(*env, "clock_reference_id")->uint64_value() == 0xbeef);
  CHECK(FindStat(*env, "clock_agent_epoch") && FindStat(*env, "clock_agent_epoch")->uint64_value() == 7);
  CHECK(FindStat(*env, "clock_window") && FindStat(*env, "clock_window")->uint64_value() == 1234);
  CHECK(FindStat(*env, "clock_status") && FindStat(*env, "clock_status")->str_value() == "ok");
  CHECK(FindStat(*env, "profile_start_time")->uint64_value() == static_cast<uint64_t>(start));
  CHECK(FindStat(*env, "clock_device_3_offset_ns") && FindStat(*env, "clock_device_3_offset_ns")->int64_value() == -17);
  CHECK(FindStat(*env, "clock_device_3_kind") && FindStat(*env, "clock_device_3_kind")->str_value() == "rocm");
  CHECK(FindStat(*env, "clock_device_0_bound_ns") && FindStat(*env, "clock_device_0_bound_ns")->uint64_value() == 9);

  // Written for `clockmesh trace info/merge` checks in hook/test.sh.
  FILE* f = std::fopen((dir + "/hostA.xplane.pb").c_str(), "wb");
  const std::string bytes = back.SerializeAsString();
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

static void TestFailsClosed(const std::string& dir) {
  const std::string path = dir + "/offsets-bad";
  const int64_t now = clockmesh_realtime_now_ns();
  struct Case {
    const char* what;
    uint32_t flags;
    int64_t valid_until;
    uint32_t version;
    int expected;
  } cases[] = {
      {"expired", CLOCKMESH_F_VALID, now - 1, 1, CLOCKMESH_E_STALE},
      {"flagged stale", CLOCKMESH_F_VALID | CLOCKMESH_F_STALE, now + 60000000000LL, 1, CLOCKMESH_E_STALE},
      {"no data", 0, now + 60000000000LL, 1, CLOCKMESH_E_NO_DATA},
      {"bad version", CLOCKMESH_F_VALID, now + 60000000000LL, 2, CLOCKMESH_E_BAD_VERSION},
  };
  for (const Case& c : cases) {
    WriteOffsets(path, c.flags, c.valid_until, now, 5, 0, 1, {}, c.version);
    XSpace space = SampleSpace(now);
    int rc = clockmesh::AddClockStatsToXSpace(&space, path.c_str());
    if (rc != c.expected) std::fprintf(stderr, "case %s: rc %d\n", c.what, rc);
    CHECK(rc == c.expected);
    const XPlane* env = TaskEnv(space);
    CHECK(FindStat(*env, "clock_offset_ns") == nullptr);
    CHECK(FindStat(*env, "clock_status")->str_value() == clockmesh_strerror(c.expected));
  }
  XSpace space = SampleSpace(now);
  CHECK(clockmesh::AddClockStatsToXSpace(&space, (dir + "/missing").c_str()) == CLOCKMESH_E_MISSING);
  // No Task Environment plane yet: one is created for the status.
  XSpace bare;
  bare.add_planes()->set_name("/host:CPU");
  CHECK(clockmesh::AddClockStatsToXSpace(&bare, (dir + "/missing").c_str()) == CLOCKMESH_E_MISSING);
  CHECK(TaskEnv(bare) != nullptr && bare.planes_size() == 2);
  // Disabled by environment.
  setenv("CLOCKMESH_OFFSETS", "off", 1);
  XSpace off = SampleSpace(now);
  const std::string before = off.SerializeAsString();
  CHECK(clockmesh::AddClockStatsToXSpace(&off) == CLOCKMESH_OK);
  CHECK(off.SerializeAsString() == before);
  unsetenv("CLOCKMESH_OFFSETS");
}

static const char* StrStat(const XPlane& env, const std::string& name) {
  const XStat* s = FindStat(env, name);
  return s ? s->str_value().c_str() : "";
}

// The start record (RecordSessionStart) and the stop record
// (AddClockStatsToXSpace) are both kept, each at its own end of the session.
static void TestStartAndStopRecords(const std::string& dir) {
  const std::string start_path = dir + "/offsets-start", stop_path = dir + "/offsets-stop";
  const int64_t now = clockmesh_realtime_now_ns();
  const int64_t start = now - 11000000000LL, stop = start + 1000000;  // SampleSpace: 1 ms session
  WriteOffsets(start_path, CLOCKMESH_F_VALID, now + 60000000000LL, start, 1000, 0, 40, {});
  WriteOffsets(stop_path, CLOCKMESH_F_VALID, now + 60000000000LL, stop, 1550, 0, 60, {});

  CHECK(clockmesh::RecordSessionStart(start_path.c_str()) == CLOCKMESH_OK);
  XSpace both = SampleSpace(start);
  CHECK(clockmesh::AddClockStatsToXSpace(&both, stop_path.c_str()) == CLOCKMESH_OK);
  const XPlane* env = TaskEnv(both);
  CHECK(std::string(StrStat(*env, "clock_anchors")) == "start+stop");
  CHECK(FindStat(*env, "clock_offset_ns")->int64_value() == 1000);
  CHECK(FindStat(*env, "clock_offset_bound_ns")->uint64_value() == 40);
  CHECK(FindStat(*env, "clock_stop_at_ns")->int64_value() == stop);
  CHECK(FindStat(*env, "clock_stop_offset_ns")->int64_value() == 1550);
  CHECK(FindStat(*env, "clock_stop_offset_bound_ns")->uint64_value() == 60);
  CHECK(FindStat(*env, "clock_bound_growth_ppb") != nullptr);

  // The start record is taken once: the next session without a start read
  // uses the stop record at both ends.
  XSpace stop_only = SampleSpace(start);
  CHECK(clockmesh::AddClockStatsToXSpace(&stop_only, stop_path.c_str()) == CLOCKMESH_OK);
  env = TaskEnv(stop_only);
  CHECK(std::string(StrStat(*env, "clock_anchors")) == "stop-only");
  CHECK(FindStat(*env, "clock_offset_ns")->int64_value() == 1550);

  // The stop read fails (agent gone): the start record alone, status ok.
  CHECK(clockmesh::RecordSessionStart(start_path.c_str()) == CLOCKMESH_OK);
  XSpace start_only = SampleSpace(start);
  CHECK(clockmesh::AddClockStatsToXSpace(&start_only, (dir + "/missing").c_str()) == CLOCKMESH_OK);
  env = TaskEnv(start_only);
  CHECK(std::string(StrStat(*env, "clock_anchors")) == "start");
  CHECK(std::string(StrStat(*env, "clock_status")) == "ok");
  CHECK(FindStat(*env, "clock_offset_ns")->int64_value() == 1000);
  CHECK(FindStat(*env, "clock_stop_offset_ns") == nullptr);

  // A failed start read keeps nothing.
  CHECK(clockmesh::RecordSessionStart((dir + "/missing").c_str()) == CLOCKMESH_E_MISSING);
  XSpace none = SampleSpace(start);
  CHECK(clockmesh::AddClockStatsToXSpace(&none, (dir + "/missing").c_str()) == CLOCKMESH_E_MISSING);
  CHECK(FindStat(*TaskEnv(none), "clock_offset_ns") == nullptr);
}

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp";
  TestAddsStatsAndRoundTrips(dir);
  TestFailsClosed(dir);
  TestStartAndStopRecords(dir);
  if (failures) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("hook_test: all checks passed\n");
  return 0;
}
