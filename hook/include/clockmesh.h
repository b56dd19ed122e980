/*
 * clockmesh.h - header-only C reader of the clockmesh offsets file.
 *
 * The clockmesh agent publishes this node's map from local CLOCK_REALTIME to
 * the cluster's global timeline in a small memory-mapped file (default
 * /run/clockmesh/offsets; layout version 2: docs/offsets-format.md). This
 * header reads it with a seqlock: it never blocks the writer and never
 * returns a torn record. Every error fails closed: no offset is returned
 * unless the data is present, of the expected version, and answers at the
 * stamp's own time (the file keeps a ring of the last 256 records; a stamp
 * older than all of them is CLOCKMESH_E_TOO_OLD). Past a record's validity
 * it still answers, in holdover, while its bound grown at the published
 * rate stays within the record's holdover ceiling; then STALE.
 *
 *   clockmesh_t cm;
 *   if (clockmesh_open(&cm, NULL) == CLOCKMESH_OK) {
 *     int64_t global; uint64_t bound;
 *     if (clockmesh_to_global(&cm, local_ns, &global, &bound) == CLOCKMESH_OK) ...
 *     if (clockmesh_device_to_global(&cm, gpu, gpu_ns, &global, &bound) == CLOCKMESH_OK) ...
 *     clockmesh_now_t now;   (global time now as [earliest, latest] + status)
 *     if (clockmesh_now(&cm, &now) == CLOCKMESH_OK && now.status == CLOCKMESH_CLOCK_SYNCHRONISED) ...
 *     clockmesh_close(&cm);
 *   }
 *
 * Needs a 64-bit target with GCC/Clang (__atomic builtins, __int128).
 * Thread-safe: a clockmesh_t may be shared by threads once opened.
 * Licence: Apache-2.0 (clockmesh).
 */
#ifndef CLOCKMESH_H
#define CLOCKMESH_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CLOCKMESH_DEFAULT_PATH "/run/clockmesh/offsets"
#define CLOCKMESH_MAGIC 0x3153464f4d4b4c43ULL /* "CLKMOFS1" little-endian */
#define CLOCKMESH_VERSION 2u
#define CLOCKMESH_MAX_DEVICES 16u
#define CLOCKMESH_RING_OFFSET 4096u /* the ring of recent records */
#define CLOCKMESH_RING_SLOTS 256u
#define CLOCKMESH_SLOT_LEN 128u
#define CLOCKMESH_FILE_LEN (CLOCKMESH_RING_OFFSET + CLOCKMESH_RING_SLOTS * CLOCKMESH_SLOT_LEN) /* 36864 */

/* Error codes (negative); CLOCKMESH_OK is 0. */
enum clockmesh_status {
  CLOCKMESH_OK = 0,
  CLOCKMESH_E_MISSING = -1,     /* no offsets file: agent not running */
  CLOCKMESH_E_BAD_FORMAT = -2,  /* wrong magic or too short */
  CLOCKMESH_E_BAD_VERSION = -3, /* layout version this reader does not know */
  CLOCKMESH_E_NO_DATA = -4,     /* agent has not published an estimate yet */
  CLOCKMESH_E_STALE = -5,       /* flagged stale, or past valid_until and the holdover ceiling */
  CLOCKMESH_E_BUSY = -6,        /* record kept changing during the read */
  CLOCKMESH_E_IO = -7,          /* open/mmap failed (see errno) */
  CLOCKMESH_E_NOT_FOUND = -8,   /* no such device map */
  CLOCKMESH_E_INVALID = -9,     /* bad argument */
  CLOCKMESH_E_TOO_OLD = -10     /* stamp older than the oldest record the file keeps */
};

/* Record flags. */
#define CLOCKMESH_F_VALID 0x1u
#define CLOCKMESH_F_STALE 0x2u
#define CLOCKMESH_F_HOLDOVER 0x4u
#define CLOCKMESH_F_REFERENCE 0x8u
#define CLOCKMESH_DEV_F_VALID 0x1u

enum clockmesh_device_kind {
  CLOCKMESH_DEV_UNKNOWN = 0,
  CLOCKMESH_DEV_CUDA = 1,
  CLOCKMESH_DEV_ROCM = 2,
  CLOCKMESH_DEV_SYNTHETIC = 3 /* a modelled clock (tests) */
};

typedef struct clockmesh_handle {
  const volatile uint64_t *base; /* the mapping, FILE_LEN bytes */
} clockmesh_t;

/* global = local + offset_ns + drift_ps_per_s * (local - anchor_local_ns) / 1e12 */
typedef struct clockmesh_device {
  uint32_t device_id;
  uint16_t kind;
  uint16_t flags;
  int64_t device_anchor_ns;
  int64_t offset_ns;
  int64_t drift_ps_per_s;
  uint64_t bound_ns;
  int64_t valid_until_ns;
} clockmesh_device_t;

typedef struct clockmesh_snapshot {
  uint32_t flags;
  uint32_t device_count;
  uint64_t epoch;
  uint64_t window;
  uint64_t reference_id;
  int64_t updated_at_ns;
  int64_t valid_until_ns;
  int64_t anchor_local_ns;
  int64_t offset_ns;
  int64_t drift_ps_per_s;
  uint64_t bound_ns;
  uint64_t bound_growth_ps_per_s;
  int64_t realtime_minus_monotonic_ns;
  int64_t realtime_minus_boottime_ns;
  int64_t kernel_clocks_sampled_at_ns;
  uint64_t holdover_max_bound_ns; /* past valid_until: holdover while the grown bound <= this (0: never) */
  clockmesh_device_t devices[CLOCKMESH_MAX_DEVICES];
} clockmesh_snapshot_t;

/* Payload word indices (byte = 72 + 8 * index); see docs/offsets-format.md. */
#define CLOCKMESH__SEQ_WORD 8
#define CLOCKMESH__PAYLOAD_WORD 9
#define CLOCKMESH__CORE_WORDS 11
#define CLOCKMESH__HOLDOVER_WORD 14 /* payload word of holdover_max_bound_ns (byte 184) */
#define CLOCKMESH__STATE_WORDS 15   /* core words .. the holdover ceiling */
#define CLOCKMESH__SLOT_HOLDOVER_WORD 13
#define CLOCKMESH__PAYLOAD_WORDS 143
#define CLOCKMESH__DEVICE_WORD 15
#define CLOCKMESH__RING_HEAD_WORD 153 /* byte 1224: records ever appended */
#define CLOCKMESH__ANCHOR_CORE_WORD 6
#define CLOCKMESH__SPIN_ATTEMPTS 64
/* How long a reader waits for a writer that is mid-write (preempted, or
 * killed mid-write) before failing closed with CLOCKMESH_E_BUSY. */
#define CLOCKMESH__BUSY_TIMEOUT_NS 50000000LL

static inline const char *clockmesh_strerror(int status) {
  switch (status) {
  case CLOCKMESH_OK: return "ok";
  case CLOCKMESH_E_MISSING: return "offsets file missing (agent not running?)";
  case CLOCKMESH_E_BAD_FORMAT: return "not a clockmesh offsets file";
  case CLOCKMESH_E_BAD_VERSION: return "unsupported offsets file version";
  case CLOCKMESH_E_NO_DATA: return "no estimate published yet";
  case CLOCKMESH_E_STALE: return "offsets are stale";
  case CLOCKMESH_E_BUSY: return "offsets record busy";
  case CLOCKMESH_E_IO: return "I/O error";
  case CLOCKMESH_E_NOT_FOUND: return "no such device";
  case CLOCKMESH_E_INVALID: return "invalid argument";
  case CLOCKMESH_E_TOO_OLD: return "stamp older than the offsets file's records";
  default: return "unknown error";
  }
}

static inline uint64_t clockmesh__load(const volatile uint64_t *p) {
  return __atomic_load_n((const uint64_t *)p, __ATOMIC_RELAXED);
}

/* Header checks, in order: magic, version (a v1 file is BAD_VERSION), then
 * the geometry this reader was built for (bytes 8..32 and 40..56). */
static inline int clockmesh__check_header(const uint64_t h[8]) {
  if (h[0] != CLOCKMESH_MAGIC) return CLOCKMESH_E_BAD_FORMAT;
  if ((h[1] & 0xffffffffu) != CLOCKMESH_VERSION) return CLOCKMESH_E_BAD_VERSION;
  if (h[1] != (CLOCKMESH_VERSION | (64ull << 32)) ||
      h[2] != (CLOCKMESH_FILE_LEN | ((uint64_t)CLOCKMESH_MAX_DEVICES << 32)) || h[3] != (64u | (64ull << 32)) ||
      h[5] != (CLOCKMESH_RING_OFFSET | ((uint64_t)CLOCKMESH_RING_SLOTS << 32)) || h[6] != CLOCKMESH_SLOT_LEN)
    return CLOCKMESH_E_BAD_FORMAT;
  return CLOCKMESH_OK;
}

/* Maps the file (path NULL = default) after checking its header (read
 * with pread, so a file of another version is told from a short one). */
static inline int clockmesh_open(clockmesh_t *cm, const char *path) {
  struct stat st;
  void *m;
  int fd, status;
  unsigned char raw[64];
  uint64_t h[8];
  if (!cm) return CLOCKMESH_E_INVALID;
  cm->base = NULL;
  fd = open(path ? path : CLOCKMESH_DEFAULT_PATH, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? CLOCKMESH_E_MISSING : CLOCKMESH_E_IO;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return CLOCKMESH_E_IO;
  }
  if (pread(fd, raw, sizeof raw, 0) != (ssize_t)sizeof raw) {
    close(fd);
    return CLOCKMESH_E_BAD_FORMAT;
  }
  memcpy(h, raw, sizeof h); /* little-endian host (x86-64, aarch64) */
  status = clockmesh__check_header(h);
  if (status == CLOCKMESH_OK && st.st_size < (off_t)CLOCKMESH_FILE_LEN) status = CLOCKMESH_E_BAD_FORMAT;
  if (status != CLOCKMESH_OK) {
    close(fd);
    return status;
  }
  m = mmap(NULL, CLOCKMESH_FILE_LEN, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return CLOCKMESH_E_IO;
  cm->base = (const volatile uint64_t *)m;
  return CLOCKMESH_OK;
}

static inline void clockmesh_close(clockmesh_t *cm) {
  if (cm && cm->base) {
    munmap((void *)cm->base, CLOCKMESH_FILE_LEN);
    cm->base = NULL;
  }
}

/* One seqlock attempt: copies the first n payload words; 1 if consistent. */
static inline int clockmesh__try_read(const clockmesh_t *cm, uint64_t *out, int n) {
  const uint64_t *seq = (const uint64_t *)(cm->base + CLOCKMESH__SEQ_WORD);
  uint64_t s1 = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
  int i;
  if (s1 & 1u) return 0;
  for (i = 0; i < n; i++) out[i] = clockmesh__load(cm->base + CLOCKMESH__PAYLOAD_WORD + i);
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  return __atomic_load_n(seq, __ATOMIC_RELAXED) == s1;
}

static inline int64_t clockmesh__monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Seqlock copy of the first n payload words: spin briefly, then yield for
 * up to CLOCKMESH__BUSY_TIMEOUT_NS. Never writes to the shared page. */
static inline int clockmesh__read_words(const clockmesh_t *cm, uint64_t *out, int n) {
  int attempt;
  int64_t since;
  if (!cm->base) return CLOCKMESH_E_INVALID;
  for (attempt = 0; attempt < CLOCKMESH__SPIN_ATTEMPTS; attempt++)
    if (clockmesh__try_read(cm, out, n)) return CLOCKMESH_OK;
  since = clockmesh__monotonic_ns();
  while (clockmesh__monotonic_ns() - since < CLOCKMESH__BUSY_TIMEOUT_NS) {
    struct timespec pause = {0, 20000}; /* sleep, not yield: a preempted writer needs the CPU */
    if (clockmesh__try_read(cm, out, n)) return CLOCKMESH_OK;
    nanosleep(&pause, NULL);
  }
  return CLOCKMESH_E_BUSY;
}

static inline void clockmesh__decode(const uint64_t *p, int n, clockmesh_snapshot_t *s) {
  uint32_t i;
  memset(s, 0, sizeof *s);
  s->flags = (uint32_t)p[0];
  s->device_count = (uint32_t)(p[0] >> 32);
  s->epoch = p[1];
  s->window = p[2];
  s->reference_id = p[3];
  s->updated_at_ns = (int64_t)p[4];
  s->valid_until_ns = (int64_t)p[5];
  s->anchor_local_ns = (int64_t)p[6];
  s->offset_ns = (int64_t)p[7];
  s->drift_ps_per_s = (int64_t)p[8];
  s->bound_ns = p[9];
  s->bound_growth_ps_per_s = p[10];
  if (n > CLOCKMESH__HOLDOVER_WORD) s->holdover_max_bound_ns = p[CLOCKMESH__HOLDOVER_WORD];
  if (n < CLOCKMESH__PAYLOAD_WORDS) {
    s->device_count = 0;
    return;
  }
  s->realtime_minus_monotonic_ns = (int64_t)p[11];
  s->realtime_minus_boottime_ns = (int64_t)p[12];
  s->kernel_clocks_sampled_at_ns = (int64_t)p[13];
  if (s->device_count > CLOCKMESH_MAX_DEVICES) s->device_count = CLOCKMESH_MAX_DEVICES;
  for (i = 0; i < s->device_count; i++) {
    const uint64_t *d = p + CLOCKMESH__DEVICE_WORD + 8 * i;
    s->devices[i].device_id = (uint32_t)d[0];
    s->devices[i].kind = (uint16_t)(d[0] >> 32);
    s->devices[i].flags = (uint16_t)(d[0] >> 48);
    s->devices[i].device_anchor_ns = (int64_t)d[1];
    s->devices[i].offset_ns = (int64_t)d[2];
    s->devices[i].drift_ps_per_s = (int64_t)d[3];
    s->devices[i].bound_ns = d[4];
    s->devices[i].valid_until_ns = (int64_t)d[5];
  }
}

/* The whole record (node map, kernel clocks, device maps), not checked for
 * freshness; use clockmesh_check_fresh before trusting it. */
static inline int clockmesh_read_snapshot(const clockmesh_t *cm, clockmesh_snapshot_t *out) {
  uint64_t p[CLOCKMESH__PAYLOAD_WORDS];
  int rc;
  if (!cm || !out) return CLOCKMESH_E_INVALID;
  rc = clockmesh__read_words(cm, p, CLOCKMESH__PAYLOAD_WORDS);
  if (rc == CLOCKMESH_OK) clockmesh__decode(p, CLOCKMESH__PAYLOAD_WORDS, out);
  return rc;
}

static inline int64_t clockmesh_realtime_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* CLOCK_REALTIME at tick resolution (1-4 ms): enough for a freshness check
 * against a valid_until seconds ahead, and several times cheaper than a
 * precise read (54 vs ~10 ns on a KVM guest), which dominated to_global. */
static inline int64_t clockmesh_realtime_coarse_ns(void) {
#ifdef CLOCK_REALTIME_COARSE
  struct timespec ts;
  if (clock_gettime(CLOCK_REALTIME_COARSE, &ts) == 0) return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
#endif
  return clockmesh_realtime_now_ns();
}

static inline int64_t clockmesh__sat_i64(__int128 v) {
  if (v > (__int128)INT64_MAX) return INT64_MAX;
  if (v < (__int128)INT64_MIN) return INT64_MIN;
  return (int64_t)v;
}

/* The map's arithmetic, 128-bit so drift x age cannot overflow. */
/* rate (ps/s) x age (ns) / 1e12, truncated toward zero. In 64 bits when the
 * product fits (seconds-old records: the constant divisor is then a
 * multiply), else in 128 bits (a library call): the same result. */
static inline __int128 clockmesh__drift_ns(int64_t rate, __int128 age) {
  int64_t product;
  if (age >= INT64_MIN && age <= INT64_MAX && !__builtin_mul_overflow(rate, (int64_t)age, &product))
    return product / 1000000000000LL;
  return (__int128)rate * age / 1000000000000LL;
}

/* growth (ps/s) x |age| (ns) / 1e12, rounded up; 64 bits when it fits. */
static inline __int128 clockmesh__growth_ns(uint64_t growth, __int128 abs_age) {
  uint64_t product, sum;
  if (abs_age <= (__int128)UINT64_MAX && !__builtin_mul_overflow(growth, (uint64_t)abs_age, &product) &&
      !__builtin_add_overflow(product, 999999999999ULL, &sum))
    return sum / 1000000000000ULL;
  return ((__int128)growth * abs_age + 999999999999LL) / 1000000000000LL;
}

static inline void clockmesh__apply(int64_t anchor_ns, int64_t offset_ns, int64_t drift_ps_per_s,
                                    uint64_t bound0_ns, uint64_t growth_ps_per_s, int64_t local_ns,
                                    int64_t *global_ns, uint64_t *bound_ns) {
  __int128 age = (__int128)local_ns - anchor_ns;
  __int128 abs_age = age < 0 ? -age : age;
  __int128 drift = clockmesh__drift_ns(drift_ps_per_s, age);
  __int128 growth = clockmesh__growth_ns(growth_ps_per_s, abs_age);
  __int128 bound = (__int128)bound0_ns + growth;
  if (global_ns) *global_ns = clockmesh__sat_i64((__int128)local_ns + offset_ns + drift);
  if (bound_ns) *bound_ns = bound > (__int128)UINT64_MAX ? UINT64_MAX : (uint64_t)bound;
}

/* Applies a snapshot's node map to a local CLOCK_REALTIME stamp (pure
 * arithmetic; check freshness first with clockmesh_check_fresh). */
static inline void clockmesh_apply(const clockmesh_snapshot_t *s, int64_t local_ns,
                                   int64_t *global_ns, uint64_t *bound_ns) {
  clockmesh__apply(s->anchor_local_ns, s->offset_ns, s->drift_ps_per_s, s->bound_ns,
                   s->bound_growth_ps_per_s, local_ns, global_ns, bound_ns);
}

/* The clock's state, as ClockBound's and fbclock's (same values in the
 * Rust and Python readers). */
enum clockmesh_clock_status {
  CLOCKMESH_CLOCK_UNKNOWN = 0,      /* nothing published yet: no interval */
  CLOCKMESH_CLOCK_SYNCHRONISED = 1, /* a current solve */
  CLOCKMESH_CLOCK_HOLDOVER = 2,     /* carried forward without a current solve: the bound grows, up to the ceiling */
  CLOCKMESH_CLOCK_STALE = 3         /* flagged stale, or past validity and the holdover ceiling: no answer */
};

/* The state of a record at local time t, the one rule of every reader
 * (docs/offsets-format.md, "The state of a record"): UNKNOWN without VALID;
 * STALE when flagged STALE; up to valid_until_ns HOLDOVER if flagged
 * HOLDOVER, else SYNCHRONISED; past it HOLDOVER while bound_at_t (the bound
 * grown to t) <= holdover_max_bound_ns, which must be set, with a bound
 * that grows; then STALE. */
static inline int clockmesh__state(uint32_t flags, int64_t valid_until_ns, uint64_t growth_ps_per_s,
                                   uint64_t holdover_max_bound_ns, uint64_t bound_at_t, int64_t t) {
  if (!(flags & CLOCKMESH_F_VALID)) return CLOCKMESH_CLOCK_UNKNOWN;
  if (flags & CLOCKMESH_F_STALE) return CLOCKMESH_CLOCK_STALE;
  if (t <= valid_until_ns) return (flags & CLOCKMESH_F_HOLDOVER) ? CLOCKMESH_CLOCK_HOLDOVER : CLOCKMESH_CLOCK_SYNCHRONISED;
  if (holdover_max_bound_ns != 0 && growth_ps_per_s != 0 && bound_at_t <= holdover_max_bound_ns)
    return CLOCKMESH_CLOCK_HOLDOVER;
  return CLOCKMESH_CLOCK_STALE;
}

/* The error code of a state: UNKNOWN -> NO_DATA, STALE -> STALE, else OK. */
static inline int clockmesh__state_rc(int state) {
  return state == CLOCKMESH_CLOCK_UNKNOWN ? CLOCKMESH_E_NO_DATA
         : state == CLOCKMESH_CLOCK_STALE ? CLOCKMESH_E_STALE
                                          : CLOCKMESH_OK;
}

/* The state of a snapshot's record at local time t (enum clockmesh_clock_status). */
static inline int clockmesh_snapshot_status(const clockmesh_snapshot_t *s, int64_t t) {
  uint64_t bound;
  clockmesh_apply(s, t, NULL, &bound);
  return clockmesh__state(s->flags, s->valid_until_ns, s->bound_growth_ps_per_s, s->holdover_max_bound_ns,
                          bound, t);
}

/* Fails closed unless the snapshot's record answers at now_ns: NO_DATA, or
 * STALE (flagged, or past valid_until and the holdover ceiling); a record
 * in holdover is an answer (clockmesh_snapshot_status says which). */
static inline int clockmesh_check_fresh(const clockmesh_snapshot_t *s, int64_t now_ns) {
  return clockmesh__state_rc(clockmesh_snapshot_status(s, now_ns));
}

/* One seqlock attempt of a ring scan: the core words (11) of the newest
 * record anchored at or before t and, in core[11], its holdover ceiling.
 * *found: 1 found, 0 nothing published, -1 every record is anchored after
 * t (too old). 1 if consistent. */
static inline int clockmesh__try_pick(const clockmesh_t *cm, int64_t t, uint64_t *core, int *found) {
  const uint64_t *seq = (const uint64_t *)(cm->base + CLOCKMESH__SEQ_WORD);
  uint64_t s1 = __atomic_load_n(seq, __ATOMIC_ACQUIRE), head, n, k;
  int i;
  if (s1 & 1u) return 0;
  head = clockmesh__load(cm->base + CLOCKMESH__RING_HEAD_WORD);
  *found = 0;
  for (n = head, k = 0; n >= 1 && k < CLOCKMESH_RING_SLOTS; n--, k++) {
    const volatile uint64_t *slot =
        cm->base + (CLOCKMESH_RING_OFFSET + ((n - 1) % CLOCKMESH_RING_SLOTS) * CLOCKMESH_SLOT_LEN) / 8;
    if (clockmesh__load(slot) != n) break; /* cleared by a restarted writer: the ring ends here */
    if ((int64_t)clockmesh__load(slot + 1 + CLOCKMESH__ANCHOR_CORE_WORD) <= t) {
      for (i = 0; i < CLOCKMESH__CORE_WORDS; i++) core[i] = clockmesh__load(slot + 1 + i);
      core[CLOCKMESH__CORE_WORDS] = clockmesh__load(slot + CLOCKMESH__SLOT_HOLDOVER_WORD);
      *found = 1;
      break;
    }
    *found = -1;
  }
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  return __atomic_load_n(seq, __ATOMIC_RELAXED) == s1;
}

/* The ring record for stamp t, as an error code (OK, NO_DATA, TOO_OLD, BUSY). */
static inline int clockmesh__pick(const clockmesh_t *cm, int64_t t, uint64_t *core) {
  int attempt, found = 0;
  int64_t since;
  if (!cm->base) return CLOCKMESH_E_INVALID;
  for (attempt = 0; attempt < CLOCKMESH__SPIN_ATTEMPTS; attempt++)
    if (clockmesh__try_pick(cm, t, core, &found)) goto done;
  since = clockmesh__monotonic_ns();
  for (;;) {
    struct timespec pause = {0, 20000};
    if (clockmesh__try_pick(cm, t, core, &found)) goto done;
    if (clockmesh__monotonic_ns() - since >= CLOCKMESH__BUSY_TIMEOUT_NS) return CLOCKMESH_E_BUSY;
    nanosleep(&pause, NULL);
  }
done:
  return found == 1 ? CLOCKMESH_OK : found == 0 ? CLOCKMESH_E_NO_DATA : CLOCKMESH_E_TOO_OLD;
}

/* Maps a local CLOCK_REALTIME stamp onto the global timeline, judged at the
 * stamp's own time ("now" is not read): with the newest ring record
 * anchored at or before the stamp, if that record answers at the stamp
 * (state SYNCHRONISED or HOLDOVER: VALID, not STALE, the stamp within its
 * valid_until_ns or, past it, the bound grown to the stamp within the
 * record's holdover ceiling). Fails closed (nothing written): NO_DATA,
 * STALE (also a stamp past the newest record's validity and ceiling),
 * TOO_OLD (anchored before every record the file keeps), BUSY. */
static inline int clockmesh_to_global(const clockmesh_t *cm, int64_t local_ns,
                                      int64_t *global_ns, uint64_t *bound_ns) {
  uint64_t p[CLOCKMESH__CORE_WORDS + 1], bound;
  int64_t global;
  int rc;
  if (!cm) return CLOCKMESH_E_INVALID;
  rc = clockmesh__pick(cm, local_ns, p);
  if (rc != CLOCKMESH_OK) return rc;
  clockmesh__apply((int64_t)p[6], (int64_t)p[7], (int64_t)p[8], p[9], p[10], local_ns, &global, &bound);
  rc = clockmesh__state_rc(clockmesh__state((uint32_t)p[0], (int64_t)p[5], p[10], p[CLOCKMESH__CORE_WORDS], bound, local_ns));
  if (rc != CLOCKMESH_OK) return rc;
  if (global_ns) *global_ns = global;
  if (bound_ns) *bound_ns = bound;
  return CLOCKMESH_OK;
}

/* A device map applied to a device clock reading: host CLOCK_REALTIME
 * = d + offset_ns + trunc(drift_ps_per_s x (d - device_anchor_ns) / 1e12),
 * 128-bit and saturated (Rust DeviceMap::to_host). */
static inline int64_t clockmesh_device_to_host(const clockmesh_device_t *d, int64_t device_ns) {
  __int128 age = (__int128)device_ns - d->device_anchor_ns;
  return clockmesh__sat_i64((__int128)device_ns + d->offset_ns + clockmesh__drift_ns(d->drift_ps_per_s, age));
}

/* Maps a GPU clock reading of device device_id (the runtime's GPU index) to
 * the global timeline: the current record's device map gives the host time,
 * judged at that time (entry VALID, host time <= its valid_until_ns, else
 * NO_DATA / STALE; no entry: NOT_FOUND), then clockmesh_to_global maps it.
 * The bound is the device map's bound_ns plus the node map's bound there. */
static inline int clockmesh_device_to_global(const clockmesh_t *cm, uint32_t device_id, int64_t device_ns,
                                             int64_t *global_ns, uint64_t *bound_ns) {
  clockmesh_snapshot_t s;
  uint32_t i;
  int64_t host_ns;
  uint64_t bound;
  int rc;
  if (!cm) return CLOCKMESH_E_INVALID;
  rc = clockmesh_read_snapshot(cm, &s);
  if (rc != CLOCKMESH_OK) return rc;
  for (i = 0; i < s.device_count; i++)
    if (s.devices[i].device_id == device_id) break;
  if (i == s.device_count) return CLOCKMESH_E_NOT_FOUND;
  if (!(s.devices[i].flags & CLOCKMESH_DEV_F_VALID)) return CLOCKMESH_E_NO_DATA;
  host_ns = clockmesh_device_to_host(&s.devices[i], device_ns);
  if (host_ns > s.devices[i].valid_until_ns) return CLOCKMESH_E_STALE;
  rc = clockmesh_to_global(cm, host_ns, global_ns, &bound);
  if (rc != CLOCKMESH_OK) return rc;
  if (bound_ns) *bound_ns = bound + s.devices[i].bound_ns < bound ? UINT64_MAX : bound + s.devices[i].bound_ns;
  return CLOCKMESH_OK;
}

/* Global time now as an interval that holds the true global time:
 * [earliest_ns, latest_ns] = global(now) -/+ bound(now), the bound grown
 * over the record's age. A stale or holdover record still gives its
 * (widening) interval; status says which. Unknown: INT64_MIN..INT64_MAX. */
typedef struct clockmesh_now {
  int64_t earliest_ns;
  int64_t latest_ns;
  int status;     /* enum clockmesh_clock_status */
  uint64_t epoch; /* agent restart counter of the record */
} clockmesh_now_t;

/* Reads CLOCK_REALTIME and the record; fails only when the file cannot be
 * read (CLOCKMESH_E_BUSY, _INVALID): every state is an answer. */
static inline int clockmesh_now(const clockmesh_t *cm, clockmesh_now_t *out) {
  uint64_t p[CLOCKMESH__STATE_WORDS];
  int64_t now_ns, global_ns;
  uint64_t bound_ns;
  int rc;
  if (!cm || !out) return CLOCKMESH_E_INVALID;
  rc = clockmesh__read_words(cm, p, CLOCKMESH__STATE_WORDS);
  if (rc != CLOCKMESH_OK) return rc;
  now_ns = clockmesh_realtime_now_ns();
  out->epoch = p[1];
  clockmesh__apply((int64_t)p[6], (int64_t)p[7], (int64_t)p[8], p[9], p[10], now_ns, &global_ns, &bound_ns);
  out->status = clockmesh__state((uint32_t)p[0], (int64_t)p[5], p[10], p[CLOCKMESH__HOLDOVER_WORD], bound_ns, now_ns);
  if (out->status == CLOCKMESH_CLOCK_UNKNOWN) {
    out->earliest_ns = INT64_MIN;
    out->latest_ns = INT64_MAX;
    return CLOCKMESH_OK;
  }
  out->earliest_ns = clockmesh__sat_i64((__int128)global_ns - (__int128)bound_ns);
  out->latest_ns = clockmesh__sat_i64((__int128)global_ns + (__int128)bound_ns);
  return CLOCKMESH_OK;
}

/* The device map for device_id, if present, valid and fresh at now_ns. */
static inline int clockmesh_find_device(const clockmesh_snapshot_t *s, uint32_t device_id,
                                        int64_t now_ns, clockmesh_device_t *out) {
  uint32_t i;
  for (i = 0; i < s->device_count && i < CLOCKMESH_MAX_DEVICES; i++) {
    const clockmesh_device_t *d = &s->devices[i];
    if (d->device_id != device_id) continue;
    if (!(d->flags & CLOCKMESH_DEV_F_VALID)) return CLOCKMESH_E_NO_DATA;
    if (now_ns > d->valid_until_ns) return CLOCKMESH_E_STALE;
    if (out) *out = *d;
    return CLOCKMESH_OK;
  }
  return CLOCKMESH_E_NOT_FOUND;
}

#ifdef __cplusplus
}
#endif
#endif /* CLOCKMESH_H */
