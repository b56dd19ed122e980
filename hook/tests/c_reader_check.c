/*
 * Exercises hook/include/clockmesh.h against files written by the Rust
 * writer (driven from agent/tests/publish_c_reader.rs).
 *
 *   c_reader_check code PATH [LOCAL] print the status of to_global at LOCAL
 *                                   (default: now), e.g. "-5"
 *   c_reader_check map PATH LOCAL   print "global bound" (fresh data needed)
 *   c_reader_check stress PATH N    N good seqlock reads of records written
 *                                   with the stress pattern; exit 1 on a torn one
 *   c_reader_check bench PATH N     ns per clockmesh_to_global, clockmesh_now and
 *                                   bare clock_gettime(CLOCK_REALTIME) call
 *   c_reader_check now PATH         print "status epoch earliest latest"
 *   c_reader_check ring PATH T...   one line "rc global bound" per local stamp T
 *   c_reader_check state PATH T...  one line "state rc bound" per local time T: the
 *                                   current record's clockmesh_snapshot_status,
 *                                   clockmesh_check_fresh and bound at T
 *   c_reader_check dev PATH ID D... one line "rc global bound" per device stamp D
 *                                   of device ID (clockmesh_device_to_global)
 */
#include "clockmesh.h"

#include <stdio.h>
#include <stdlib.h>

/* The stress pattern: every field is a function of the window k (see
 * agent/tests/publish_seqlock.rs `pattern`). Returns 1 when consistent. */
static int consistent(const clockmesh_snapshot_t *s) {
  uint64_t k = s->window;
  uint32_t i;
  if (k == 0) return s->flags == 0 || s->flags == CLOCKMESH_F_VALID; /* before first publish */
  if (s->flags != CLOCKMESH_F_VALID) return 0;
  if (s->reference_id != (k ^ 0xabcdu)) return 0;
  if (s->updated_at_ns != (int64_t)(k * 3)) return 0;
  if (s->anchor_local_ns != (int64_t)(k * 5)) return 0;
  if (s->offset_ns != -(int64_t)(k * 11)) return 0;
  if (s->drift_ps_per_s != (int64_t)(k * 13)) return 0;
  if (s->bound_ns != k * 17) return 0;
  if (s->bound_growth_ps_per_s != k * 19) return 0;
  if (s->realtime_minus_monotonic_ns != (int64_t)(k * 23)) return 0;
  if (s->holdover_max_bound_ns != k * 31) return 0;
  if (s->device_count != k % (CLOCKMESH_MAX_DEVICES + 1)) return 0;
  for (i = 0; i < s->device_count; i++) {
    const clockmesh_device_t *d = &s->devices[i];
    if (d->device_id != i || d->device_anchor_ns != (int64_t)(k + i) ||
        d->offset_ns != (int64_t)(2 * k + i) || d->bound_ns != k * 29 + i)
      return 0;
  }
  return 1;
}

static int stress(clockmesh_t *cm, long n) {
  clockmesh_snapshot_t s;
  long ok = 0, torn = 0, busy = 0, changes = 0;
  uint64_t last = 0;
  while (ok < n) {
    int rc = clockmesh_read_snapshot(cm, &s);
    if (rc == CLOCKMESH_E_BUSY) { /* writer preempted mid-write: fail closed */
      busy++;
      continue;
    }
    ok++;
    if (rc != CLOCKMESH_OK) return fprintf(stderr, "read failed: %d\n", rc), 2;
    if (!consistent(&s)) {
      if (torn++ < 5) fprintf(stderr, "torn record at window %llu\n", (unsigned long long)s.window);
    }
    if (s.window != last) changes++, last = s.window;
  }
  printf("reads=%ld torn=%ld busy=%ld changes=%ld\n", ok, torn, busy, changes);
  return torn || busy * 1000 > ok ? 1 : 0;
}

static double elapsed(struct timespec a, struct timespec b) {
  return (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
}

static int bench_now(clockmesh_t *cm, long n);

static int bench(clockmesh_t *cm, long n) {
  struct timespec a, b;
  int64_t g, sum = 0;
  uint64_t bound;
  long i;
  const int64_t t0 = clockmesh_realtime_now_ns(); /* stamps of now: the newest record covers them */
  for (i = 0; i < 1000; i++) clockmesh_to_global(cm, t0 + i, &g, &bound);
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (i = 0; i < n; i++) {
    if (clockmesh_to_global(cm, t0 + i, &g, &bound) != CLOCKMESH_OK) return 2;
    sum += g;
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  printf("to_global_ns_per_call=%.2f (checksum %lld)\n", elapsed(a, b) / (double)n, (long long)sum);
  return bench_now(cm, n);
}

/* clockmesh_now against a bare clock_gettime(CLOCK_REALTIME), same run. */
static int bench_now(clockmesh_t *cm, long n) {
  struct timespec a, b, t;
  clockmesh_now_t now;
  int64_t sum = 0;
  long i;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (i = 0; i < n; i++) {
    clock_gettime(CLOCK_REALTIME, &t);
    sum += t.tv_nsec;
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  double bare = elapsed(a, b) / (double)n;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (i = 0; i < n; i++) {
    if (clockmesh_now(cm, &now) != CLOCKMESH_OK) return 2;
    sum += now.latest_ns - now.earliest_ns;
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  printf("now_ns_per_call=%.2f clock_gettime_ns_per_call=%.2f (checksum %lld)\n", elapsed(a, b) / (double)n,
         bare, (long long)sum);
  return 0;
}

int main(int argc, char **argv) {
  clockmesh_t cm;
  int rc;
  if (argc < 3) return fprintf(stderr, "usage: %s code|map|stress|bench PATH [ARG]\n", argv[0]), 64;
  rc = clockmesh_open(&cm, argv[2]);
  if (strcmp(argv[1], "code") == 0) {
    int64_t g;
    uint64_t b;
    int64_t at = argc > 3 ? strtoll(argv[3], NULL, 10) : clockmesh_realtime_now_ns();
    if (rc == CLOCKMESH_OK) rc = clockmesh_to_global(&cm, at, &g, &b);
    printf("%d %s\n", rc, clockmesh_strerror(rc));
    return 0;
  }
  if (rc != CLOCKMESH_OK) return fprintf(stderr, "open: %s\n", clockmesh_strerror(rc)), 2;
  if (strcmp(argv[1], "map") == 0 && argc > 3) {
    int64_t g;
    uint64_t b;
    rc = clockmesh_to_global(&cm, strtoll(argv[3], NULL, 10), &g, &b);
    if (rc != CLOCKMESH_OK) return fprintf(stderr, "to_global: %s\n", clockmesh_strerror(rc)), 2;
    printf("%lld %llu\n", (long long)g, (unsigned long long)b);
    return 0;
  }
  if (strcmp(argv[1], "now") == 0) {
    clockmesh_now_t now;
    rc = clockmesh_now(&cm, &now);
    if (rc != CLOCKMESH_OK) return fprintf(stderr, "now: %s\n", clockmesh_strerror(rc)), 2;
    printf("%d %llu %lld %lld\n", now.status, (unsigned long long)now.epoch, (long long)now.earliest_ns,
           (long long)now.latest_ns);
    return 0;
  }
  if (strcmp(argv[1], "ring") == 0 || (strcmp(argv[1], "dev") == 0 && argc > 3)) {
    int dev = argv[1][0] == 'd', i;
    for (i = dev ? 4 : 3; i < argc; i++) {
      int64_t g = 0, t = strtoll(argv[i], NULL, 10);
      uint64_t b = 0;
      rc = dev ? clockmesh_device_to_global(&cm, (uint32_t)strtoul(argv[3], NULL, 10), t, &g, &b)
               : clockmesh_to_global(&cm, t, &g, &b);
      if (rc != CLOCKMESH_OK) g = 0, b = 0;
      printf("%d %lld %llu\n", rc, (long long)g, (unsigned long long)b);
    }
    return 0;
  }
  if (strcmp(argv[1], "state") == 0) {
    clockmesh_snapshot_t s;
    int i;
    rc = clockmesh_read_snapshot(&cm, &s);
    if (rc != CLOCKMESH_OK) return fprintf(stderr, "read: %s\n", clockmesh_strerror(rc)), 2;
    for (i = 3; i < argc; i++) {
      int64_t t = strtoll(argv[i], NULL, 10);
      uint64_t b = 0;
      clockmesh_apply(&s, t, NULL, &b);
      printf("%d %d %llu\n", clockmesh_snapshot_status(&s, t), clockmesh_check_fresh(&s, t), (unsigned long long)b);
    }
    return 0;
  }
  if (strcmp(argv[1], "stress") == 0 && argc > 3) return stress(&cm, atol(argv[3]));
  if (strcmp(argv[1], "bench") == 0 && argc > 3) return bench(&cm, atol(argv[3]));
  return 64;
}
