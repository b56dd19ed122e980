/*
 * clockmesh_skew.so: LD_PRELOAD it into a process and that process's
 * CLOCK_REALTIME runs exactly as `clockmesh agent --inject-skew
 * OFFSET_NS,DRIFT_PPB,EPOCH_NS` makes the agent's own stamps run:
 *
 *     local(t) = t + OFFSET_NS + round(DRIFT_PPB * (t - EPOCH_NS) / 1e9)
 *
 * with t the kernel's CLOCK_REALTIME (agent/src/config.rs, InjectedSkew::at).
 * Set CLOCKMESH_SKEW=OFFSET_NS,DRIFT_PPB,EPOCH_NS; without it nothing
 * changes. Only the REALTIME clocks are skewed (clock_gettime REALTIME and
 * REALTIME_COARSE, gettimeofday, time, timespec_get): MONOTONIC stays the
 * kernel's, so sleeps, timeouts and condition waits behave (Debian's
 * libfaketime also rewrites those and was seen to hang `Event.wait`).
 * A test reads the truth with a raw syscall(SYS_clock_gettime), which this
 * library does not see. Test harness only; never shipped.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int skew_on;
static int64_t skew_offset_ns;
static double skew_drift_ppb;
static int64_t skew_epoch_ns;

__attribute__((constructor)) static void skew_load(void) {
  const char *spec = getenv("CLOCKMESH_SKEW");
  long long offset, epoch;
  double drift;
  if (spec && sscanf(spec, "%lld,%lf,%lld", &offset, &drift, &epoch) == 3) {
    skew_offset_ns = offset;
    skew_drift_ppb = drift;
    skew_epoch_ns = epoch;
    skew_on = 1;
  } else if (spec) {
    fprintf(stderr, "clockmesh_skew: CLOCKMESH_SKEW=%s is not OFFSET_NS,DRIFT_PPB,EPOCH_NS\n", spec);
    abort();
  }
}

static int64_t skew_at(int64_t t_ns) {
  double age_s = (double)(t_ns - skew_epoch_ns) / 1e9;
  return skew_offset_ns + llround(skew_drift_ppb * age_s);
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
  int r = (int)syscall(SYS_clock_gettime, clock, ts);
  if (r != 0 || !skew_on || (clock != CLOCK_REALTIME && clock != CLOCK_REALTIME_COARSE)) {
    return r;
  }
  int64_t t = (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec;
  int64_t local = t + skew_at(t);
  ts->tv_sec = local / 1000000000LL;
  ts->tv_nsec = local % 1000000000LL;
  return 0;
}

/* glibc declares `tv` non-null. */
int gettimeofday(struct timeval *tv, void *tz) {
  (void)tz;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  tv->tv_sec = ts.tv_sec;
  tv->tv_usec = ts.tv_nsec / 1000;
  return 0;
}

time_t time(time_t *out) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (out) {
    *out = ts.tv_sec;
  }
  return ts.tv_sec;
}

int timespec_get(struct timespec *ts, int base) {
  if (base != TIME_UTC) {
    return 0;
  }
  return clock_gettime(CLOCK_REALTIME, ts) == 0 ? base : 0;
}
