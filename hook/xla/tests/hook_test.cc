// Unit test of clockmesh_xla_hook.cc against C++ code generated from
// proto/xplane.proto: adds the stats to a real XSpace, serializes, parses
// back, and checks values; checks fail-closed behaviour.
//
// The offsets files are written here straight from docs/offsets-format.md
// (an independent implementation of the layout); agreement of the C reader
// with the Rust writer is tested in offsets/tests/publish_seqlock.rs and
// offsets/tests/publish_ring.rs.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
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

// Writes an offsets file per docs/offsets-format.md (version 2; the hook
// reads the current record only, and the C reader does not check the
// checksums, so the ring is left empty and the checksum 0).
static void WriteOffsets(const std::string& path, uint32_t flags, int64_t valid_until, int64_t anchor,
                         int64_t offset, int64_t drift_ps_per_s, uint64_t bound,
                         const std::vector<Device>& devices, uint32_t version = 2) {
  std::vector<uint64_t> w(CLOCKMESH_FILE_LEN / 8, 0);
  std::memcpy(&w[0], "CLKMOFS1", 8);
  w[1] = version | (64ull << 32);
  w[2] = CLOCKMESH_FILE_LEN | (16ull << 32);
  w[3] = 64 | (64ull << 32);
  w[5] = CLOCKMESH_RING_OFFSET | (static_cast<uint64_t>(CLOCKMESH_RING_SLOTS) << 32);
  w[6] = CLOCKMESH_SLOT_LEN;
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

// Sets the record's bound_growth_ps_per_s (payload word 10).
static void SetBoundGrowth(const std::string& path, uint64_t growth_ps_per_s) {
  FILE* f = std::fopen(path.c_str(), "r+b");
  std::fseek(f, (9 + 10) * 8, SEEK_SET);
  std::fwrite(&growth_ps_per_s, 8, 1, f);
  std::fclose(f);
}

// A session of duration_ns from start_ns; stop_stat: how profile_stop_time
// is written ('u' uint64 as XLA does, 'i' int64, 0 absent).
static XSpace SampleSpace(int64_t start_ns, int64_t duration_ns = 1000000, char stop_stat = 'u') {
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
  if (stop_stat == 0) return space;
  s = env->add_stats();
  s->set_metadata_id(2);
  if (stop_stat == 'i') s->set_int64_value(start_ns + duration_ns);
  else s->set_uint64_value(static_cast<uint64_t>(start_ns + duration_ns));
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
      {"expired", CLOCKMESH_F_VALID, now - 1, 2, CLOCKMESH_E_STALE},
      {"flagged stale", CLOCKMESH_F_VALID | CLOCKMESH_F_STALE, now + 60000000000LL, 2, CLOCKMESH_E_STALE},
      {"no data", 0, now + 60000000000LL, 2, CLOCKMESH_E_NO_DATA},
      {"layout v1", CLOCKMESH_F_VALID, now + 60000000000LL, 1, CLOCKMESH_E_BAD_VERSION},
      {"bad version", CLOCKMESH_F_VALID, now + 60000000000LL, 3, CLOCKMESH_E_BAD_VERSION},
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
  setenv("CLOCKMESH_OFFSETS_PATH", "off", 1);
  XSpace off = SampleSpace(now);
  const std::string before = off.SerializeAsString();
  CHECK(clockmesh::AddClockStatsToXSpace(&off) == CLOCKMESH_OK);
  CHECK(off.SerializeAsString() == before);
  unsetenv("CLOCKMESH_OFFSETS_PATH");
}

static const char* StrStat(const XPlane& env, const std::string& name) {
  const XStat* s = FindStat(env, name);
  return s ? s->str_value().c_str() : "";
}

static bool Has(const XPlane& env, const std::string& name) { return FindStat(env, name) != nullptr; }
static int64_t I64(const XPlane& env, const std::string& name) {
  const XStat* s = FindStat(env, name);
  return s ? s->int64_value() : INT64_MIN;
}
static uint64_t U64(const XPlane& env, const std::string& name) {
  const XStat* s = FindStat(env, name);
  return s ? s->uint64_value() : UINT64_MAX;
}
static double F64(const XPlane& env, const std::string& name) {
  const XStat* s = FindStat(env, name);
  return s ? s->double_value() : -1e300;
}
static bool HasClockStats(const XPlane& env, bool except_status) {
  for (const XStat& s : env.stats()) {
    auto it = env.stat_metadata().find(s.metadata_id());
    if (it == env.stat_metadata().end() || it->second.name().rfind("clock_", 0) != 0) continue;
    if (except_status && it->second.name() == "clock_status") continue;
    return true;
  }
  return false;
}

// The start record (RecordSessionStart) and the stop record
// (AddClockStatsToXSpace) are both kept, each at its own end of the session.
static void TestStartAndStopRecords(const std::string& dir) {
  const std::string start_path = dir + "/offsets-start", stop_path = dir + "/offsets-stop";
  const std::string missing = dir + "/missing";
  const int64_t now = clockmesh_realtime_now_ns();
  const int64_t session = 10000000000LL;  // 10 s
  const int64_t start = now - 11000000000LL, stop = start + session;
  // Start record: anchored 1 s before the session start, 2 µs/s drift
  // (offset 1000 + 2000 at the start), bound 40 growing 0.5 µs/s (+500).
  WriteOffsets(start_path, CLOCKMESH_F_VALID, now + 60000000000LL, start - 1000000000LL, 1000, 2000000, 40,
               {{0, CLOCKMESH_DEV_CUDA, 42, 9}});
  SetBoundGrowth(start_path, 500000);
  // Stop record (the agent's newer estimate): anchored at the stop, offset
  // 1550, no drift, bound 60 growing 3 µs/s (+30 µs over the session),
  // another device.
  WriteOffsets(stop_path, CLOCKMESH_F_VALID, now + 60000000000LL, stop, 1550, 0, 60,
               {{5, CLOCKMESH_DEV_ROCM, -8, 13}});
  SetBoundGrowth(stop_path, 3000000);

  CHECK(clockmesh::RecordSessionStart(start_path.c_str()) == CLOCKMESH_OK);
  XSpace both = SampleSpace(start, session);
  CHECK(clockmesh::AddClockStatsToXSpace(&both, stop_path.c_str()) == CLOCKMESH_OK);
  const XPlane* env = TaskEnv(both);
  CHECK(std::string(StrStat(*env, "clock_anchors")) == "start+stop");
  CHECK(std::string(StrStat(*env, "clock_status")) == "ok");
  CHECK(I64(*env, "clock_offset_ns") == 3000);
  CHECK(U64(*env, "clock_offset_bound_ns") == 540);
  CHECK(F64(*env, "clock_drift_ppb") == 2000.0);
  CHECK(F64(*env, "clock_bound_growth_ppb") == 500.0);
  CHECK(I64(*env, "clock_stop_at_ns") == stop);
  CHECK(I64(*env, "clock_stop_offset_ns") == 1550);
  CHECK(U64(*env, "clock_stop_offset_bound_ns") == 60);
  CHECK(F64(*env, "clock_stop_drift_ppb") == 0.0);
  CHECK(F64(*env, "clock_stop_bound_growth_ppb") == 3000.0);
  // Identity and devices from the stop record.
  CHECK(I64(*env, "clock_anchor_ns") == stop);
  CHECK(I64(*env, "clock_device_5_offset_ns") == -8);
  CHECK(!Has(*env, "clock_device_0_offset_ns"));

  // A re-run replaces every clock stat: nothing readable now, no offset left.
  CHECK(clockmesh::AddClockStatsToXSpace(&both, missing.c_str()) == CLOCKMESH_E_MISSING);
  CHECK(std::string(StrStat(*env, "clock_status")) == clockmesh_strerror(CLOCKMESH_E_MISSING));
  CHECK(!HasClockStats(*env, true));
  CHECK(Has(*env, "profile_stop_time"));

  // The start record is taken once: the next session without a start read
  // uses the stop record at both ends, its bound grown over the session.
  XSpace stop_only = SampleSpace(start, session);
  CHECK(clockmesh::AddClockStatsToXSpace(&stop_only, stop_path.c_str()) == CLOCKMESH_OK);
  env = TaskEnv(stop_only);
  CHECK(std::string(StrStat(*env, "clock_anchors")) == "stop-only");
  CHECK(I64(*env, "clock_offset_ns") == 1550);
  CHECK(U64(*env, "clock_offset_bound_ns") == 60 + 30000);
  CHECK(F64(*env, "clock_bound_growth_ppb") == 3000.0);
  CHECK(I64(*env, "clock_stop_offset_ns") == 1550);
  CHECK(U64(*env, "clock_stop_offset_bound_ns") == 60);

  // A failed start read: stop-only too (nothing kept from the earlier read).
  CHECK(clockmesh::RecordSessionStart(start_path.c_str()) == CLOCKMESH_OK);
  CHECK(clockmesh::RecordSessionStart(missing.c_str()) == CLOCKMESH_E_MISSING);
  XSpace failed_start = SampleSpace(start, session);
  CHECK(clockmesh::AddClockStatsToXSpace(&failed_start, stop_path.c_str()) == CLOCKMESH_OK);
  env = TaskEnv(failed_start);
  CHECK(std::string(StrStat(*env, "clock_anchors")) == "stop-only");
  CHECK(I64(*env, "clock_offset_ns") == 1550);
  CHECK(U64(*env, "clock_offset_bound_ns") == 30060);

  // The stop read fails (agent gone): the start record alone, status ok.
  CHECK(clockmesh::RecordSessionStart(start_path.c_str()) == CLOCKMESH_OK);
  XSpace start_only = SampleSpace(start, session);
  CHECK(clockmesh::AddClockStatsToXSpace(&start_only, missing.c_str()) == CLOCKMESH_OK);
  env = TaskEnv(start_only);
  CHECK(std::string(StrStat(*env, "clock_anchors")) == "start");
  CHECK(std::string(StrStat(*env, "clock_status")) == "ok");
  CHECK(I64(*env, "clock_offset_ns") == 3000);
  CHECK(U64(*env, "clock_offset_bound_ns") == 540);
  CHECK(I64(*env, "clock_anchor_ns") == start - 1000000000LL);
  CHECK(I64(*env, "clock_device_0_offset_ns") == 42);
  for (const char* name : {"clock_stop_at_ns", "clock_stop_offset_ns", "clock_stop_offset_bound_ns",
                           "clock_stop_drift_ppb", "clock_stop_bound_growth_ppb"})
    CHECK(!Has(*env, name));

  // Neither: fail closed, status only.
  CHECK(clockmesh::RecordSessionStart(missing.c_str()) == CLOCKMESH_E_MISSING);
  XSpace none = SampleSpace(start, session);
  CHECK(clockmesh::AddClockStatsToXSpace(&none, missing.c_str()) == CLOCKMESH_E_MISSING);
  CHECK(!HasClockStats(*TaskEnv(none), true));
  CHECK(std::string(StrStat(*TaskEnv(none), "clock_status")) == clockmesh_strerror(CLOCKMESH_E_MISSING));
}

// A start record fresh when read stays the start anchor even if it has
// expired by the stop (only the read at the start has to be fresh).
static void TestStartFreshThenExpired(const std::string& dir) {
  const std::string start_path = dir + "/offsets-short", stop_path = dir + "/offsets-stop2";
  const int64_t now = clockmesh_realtime_now_ns();
  WriteOffsets(start_path, CLOCKMESH_F_VALID, now + 200000000, now, 111, 0, 5, {});
  WriteOffsets(stop_path, CLOCKMESH_F_VALID, now + 60000000000LL, now, 222, 0, 6, {});
  CHECK(clockmesh::RecordSessionStart(start_path.c_str()) == CLOCKMESH_OK);
  struct timespec pause = {0, 300000000};
  nanosleep(&pause, nullptr);
  // The start file has expired by now: a read at the stop would refuse it.
  clockmesh_t cm;
  clockmesh_snapshot_t snap;
  CHECK(clockmesh_open(&cm, start_path.c_str()) == CLOCKMESH_OK);
  CHECK(clockmesh_read_snapshot(&cm, &snap) == CLOCKMESH_OK);
  clockmesh_close(&cm);
  CHECK(clockmesh_check_fresh(&snap, clockmesh_realtime_now_ns()) == CLOCKMESH_E_STALE);
  XSpace space = SampleSpace(now);
  CHECK(clockmesh::AddClockStatsToXSpace(&space, stop_path.c_str()) == CLOCKMESH_OK);
  const XPlane* env = TaskEnv(space);
  CHECK(std::string(StrStat(*env, "clock_anchors")) == "start+stop");
  CHECK(I64(*env, "clock_offset_ns") == 111);
  CHECK(I64(*env, "clock_stop_offset_ns") == 222);
}

// clock_stop_at_ns: profile_stop_time as int64 too; without it, the time of
// the stop read.
static void TestStopTime(const std::string& dir) {
  const std::string path = dir + "/offsets-stoptime";
  const int64_t now = clockmesh_realtime_now_ns();
  WriteOffsets(path, CLOCKMESH_F_VALID, now + 60000000000LL, now, -70, 1000000, 1, {});  // 1 µs/s
  XSpace as_int = SampleSpace(now - 3000000000LL, 2000000000LL, 'i');
  CHECK(clockmesh::AddClockStatsToXSpace(&as_int, path.c_str()) == CLOCKMESH_OK);
  CHECK(I64(*TaskEnv(as_int), "clock_stop_at_ns") == now - 1000000000LL);
  CHECK(I64(*TaskEnv(as_int), "clock_stop_offset_ns") == -70 - 1000);  // 1 s before the anchor
  CHECK(I64(*TaskEnv(as_int), "clock_offset_ns") == -70 - 3000);
  XSpace no_stop = SampleSpace(now - 3000000000LL, 0, 0);
  const int64_t before = clockmesh_realtime_now_ns();
  CHECK(clockmesh::AddClockStatsToXSpace(&no_stop, path.c_str()) == CLOCKMESH_OK);
  const int64_t after = clockmesh_realtime_now_ns();
  const int64_t at = I64(*TaskEnv(no_stop), "clock_stop_at_ns");
  CHECK(before <= at && at <= after);
}

// CLOCKMESH_OFFSETS_PATH=off: the XSpace is untouched and no start record is
// carried into a later session.
static void TestDisabledDropsStart(const std::string& dir) {
  const std::string path = dir + "/offsets-off";
  const int64_t now = clockmesh_realtime_now_ns();
  WriteOffsets(path, CLOCKMESH_F_VALID, now + 60000000000LL, now, 9, 0, 1, {});
  // Disabled at the stop: the kept start record is dropped with the session.
  CHECK(clockmesh::RecordSessionStart(path.c_str()) == CLOCKMESH_OK);
  setenv("CLOCKMESH_OFFSETS_PATH", "off", 1);
  XSpace off = SampleSpace(now);
  const std::string before = off.SerializeAsString();
  CHECK(clockmesh::AddClockStatsToXSpace(&off) == CLOCKMESH_OK);
  CHECK(off.SerializeAsString() == before);
  unsetenv("CLOCKMESH_OFFSETS_PATH");
  XSpace next = SampleSpace(now);
  CHECK(clockmesh::AddClockStatsToXSpace(&next, path.c_str()) == CLOCKMESH_OK);
  CHECK(std::string(StrStat(*TaskEnv(next), "clock_anchors")) == "stop-only");
  // Disabled at the start: the slot is emptied.
  CHECK(clockmesh::RecordSessionStart(path.c_str()) == CLOCKMESH_OK);
  setenv("CLOCKMESH_OFFSETS_PATH", "off", 1);
  CHECK(clockmesh::RecordSessionStart() == CLOCKMESH_OK);
  unsetenv("CLOCKMESH_OFFSETS_PATH");
  XSpace after = SampleSpace(now);
  CHECK(clockmesh::AddClockStatsToXSpace(&after, path.c_str()) == CLOCKMESH_OK);
  CHECK(std::string(StrStat(*TaskEnv(after), "clock_anchors")) == "stop-only");
}

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp";
  TestAddsStatsAndRoundTrips(dir);
  TestFailsClosed(dir);
  TestStartAndStopRecords(dir);
  TestStartFreshThenExpired(dir);
  TestStopTime(dir);
  TestDisabledDropsStart(dir);
  if (failures) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("hook_test: all checks passed\n");
  return 0;
}
