//! NVIDIA GPU clock: `%globaltimer` read by a tiny kernel, bracketed by host
//! clock reads.
//!
//! The CUDA driver is loaded at run time (cudarc `dynamic-loading`); the
//! agent builds and runs without CUDA, and [`CudaSource::open`] reports
//! `Unavailable` where `libcuda` is absent. The kernels are hand-written PTX
//! JIT-compiled by the driver (no toolkit, no NVRTC).
//!
//! Two modes share one host-mapped (pinned, zero-copy) mailbox:
//! - **ping-pong** (default): per burst, one single-thread kernel is launched
//!   and stays resident for the burst, polling the mailbox; the host writes a
//!   request number, the kernel reads `%globaltimer`, writes it and then the
//!   acknowledgement. The bracket is one PCIe round trip (~1.5-2 us on H100).
//!   The kernel exits after `n` pings or when idle for `IDLE_TIMEOUT_NS`, so
//!   it never holds an SM between bursts.
//! - **launch-per-sample** (fallback): one kernel launch per sample writes
//!   `%globaltimer`; the bracket includes the launch (~6-10 us).
//!
//! Holding a CUDA context costs GPU memory (measured on H100, see
//! docs/gpu-clocks.md), so the source is opt-in per node.
use std::ffi::{CStr, c_void};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, Instant};

use clockmesh_estimator::device::{
    DeviceId, DeviceReading, HostStamp, SnapshotPair, SourceKind, Vendor,
};
use cudarc::driver::{CudaContext, DriverError, result, sys};

use super::{DevClockError, DeviceClockSource, SourceInfo, host};

pub use super::CudaMode;

/// `%globaltimer` steps in multiples of 32 ns on H100 (no profiler attached).
pub const GLOBALTIMER_QUANTUM_NS: u64 = 32;
/// A burst kernel exits after this long without a ping.
pub const IDLE_TIMEOUT_NS: u64 = 20_000_000;
/// Host gives up on one answer after this long.
const ANSWER_TIMEOUT: Duration = Duration::from_millis(50);
/// Host gives up waiting for the burst kernel to start after this long.
const START_TIMEOUT: Duration = Duration::from_secs(2);
/// Spin this long for the kernel to start, then sleep `START_POLL` per poll.
const START_SPIN: Duration = Duration::from_micros(5);
const START_POLL: Duration = Duration::from_micros(20);

/// Mailbox words (u64). The request sits alone in its 64-byte line, written
/// only by the host; the answer words share another line, written only by
/// the kernel, so each side polls a line the other side writes.
const REQ: usize = 0;
const ACK: usize = 8;
const TIME: usize = 9;
const READY: usize = 10;
const MAILBOX_BYTES: usize = 128;

/// PTX for the kernels (ISA 7.0, JIT-compiled for the actual GPU). Offsets
/// in bytes: REQ 0, ACK 64, TIME 72, READY 80.
///
/// `clockmesh_pingpong` answers with one 16-byte store of (ACK, TIME): no
/// fence on the critical path. `clockmesh_pingpong_fenced` writes TIME,
/// `membar.sys`, then ACK (kept to compare; select it with
/// `CLOCKMESH_CUDA_PINGPONG=fenced`). The host guards the vector store
/// against arriving in two halves by requiring TIME to have changed.
pub const PTX: &CStr = c"
.version 7.0
.target sm_70
.address_size 64

.visible .entry clockmesh_pingpong(
    .param .u64 mailbox,
    .param .u32 max_pings,
    .param .u64 idle_timeout_ns
)
{
    .reg .pred %p<4>;
    .reg .b32 %r<3>;
    .reg .b64 %rd<8>;

    ld.param.u64 %rd1, [mailbox];
    ld.param.u32 %r1, [max_pings];
    ld.param.u64 %rd2, [idle_timeout_ns];
    cvta.to.global.u64 %rd1, %rd1;
    ld.volatile.global.u64 %rd3, [%rd1];
    mov.u64 %rd4, %globaltimer;
    st.volatile.global.u64 [%rd1+80], %rd4;
    membar.sys;
    mov.u32 %r2, 0;
    setp.eq.u32 %p3, %r1, 0;
    @%p3 bra DONE;
WAIT:
    ld.volatile.global.u64 %rd5, [%rd1];
    setp.ne.u64 %p1, %rd5, %rd3;
    @%p1 bra SERVE;
    mov.u64 %rd6, %globaltimer;
    sub.u64 %rd7, %rd6, %rd4;
    setp.gt.u64 %p2, %rd7, %rd2;
    @%p2 bra DONE;
    bra.uni WAIT;
SERVE:
    mov.u64 %rd6, %globaltimer;
    st.volatile.global.v2.u64 [%rd1+64], {%rd5, %rd6};
    mov.u64 %rd3, %rd5;
    mov.u64 %rd4, %rd6;
    add.u32 %r2, %r2, 1;
    setp.lt.u32 %p1, %r2, %r1;
    @%p1 bra WAIT;
DONE:
    ret;
}

.visible .entry clockmesh_pingpong_fenced(
    .param .u64 mailbox,
    .param .u32 max_pings,
    .param .u64 idle_timeout_ns
)
{
    .reg .pred %p<4>;
    .reg .b32 %r<3>;
    .reg .b64 %rd<8>;

    ld.param.u64 %rd1, [mailbox];
    ld.param.u32 %r1, [max_pings];
    ld.param.u64 %rd2, [idle_timeout_ns];
    cvta.to.global.u64 %rd1, %rd1;
    ld.volatile.global.u64 %rd3, [%rd1];
    mov.u64 %rd4, %globaltimer;
    st.volatile.global.u64 [%rd1+80], %rd4;
    membar.sys;
    mov.u32 %r2, 0;
    setp.eq.u32 %p3, %r1, 0;
    @%p3 bra DONE;
WAIT:
    ld.volatile.global.u64 %rd5, [%rd1];
    setp.ne.u64 %p1, %rd5, %rd3;
    @%p1 bra SERVE;
    mov.u64 %rd6, %globaltimer;
    sub.u64 %rd7, %rd6, %rd4;
    setp.gt.u64 %p2, %rd7, %rd2;
    @%p2 bra DONE;
    bra.uni WAIT;
SERVE:
    mov.u64 %rd6, %globaltimer;
    st.volatile.global.u64 [%rd1+72], %rd6;
    membar.sys;
    st.volatile.global.u64 [%rd1+64], %rd5;
    membar.sys;
    mov.u64 %rd3, %rd5;
    mov.u64 %rd4, %rd6;
    add.u32 %r2, %r2, 1;
    setp.lt.u32 %p1, %r2, %r1;
    @%p1 bra WAIT;
DONE:
    ret;
}

.visible .entry clockmesh_stamp(
    .param .u64 mailbox,
    .param .u64 seq
)
{
    .reg .b64 %rd<4>;

    ld.param.u64 %rd1, [mailbox];
    ld.param.u64 %rd2, [seq];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u64 %rd3, %globaltimer;
    st.volatile.global.u64 [%rd1+72], %rd3;
    membar.sys;
    st.volatile.global.u64 [%rd1+64], %rd2;
    membar.sys;
    ret;
}
";

fn cuda_err(what: &str) -> impl Fn(DriverError) -> DevClockError + '_ {
    move |e| DevClockError::Cuda(format!("{what}: {e:?}"))
}

/// Whether `libcuda` can be loaded. Must be checked before any other cudarc
/// call: cudarc panics when the library is missing.
pub fn libcuda_present() -> bool {
    // SAFETY: this only tries to dlopen libcuda (running its initialisers, as
    // any CUDA program does) and drops the handle; no symbol is called.
    unsafe { sys::is_culib_present() }
}

/// Pinned host memory mapped into the device's address space.
struct Mailbox {
    host: NonNull<u64>,
    device: sys::CUdeviceptr,
}

impl Mailbox {
    /// Allocate and zero the mailbox; the context must be current.
    fn new() -> Result<Self, DevClockError> {
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: cuMemHostAlloc returns MAILBOX_BYTES of page-locked memory
        // (page aligned, so u64-aligned) or an error; it is zeroed before use.
        let host = unsafe { result::malloc_host(MAILBOX_BYTES, flags) }
            .map_err(cuda_err("cuMemHostAlloc"))?;
        let host = NonNull::new(host.cast::<u64>())
            .ok_or_else(|| DevClockError::Cuda("cuMemHostAlloc returned null".into()))?;
        // SAFETY: `host` points at MAILBOX_BYTES writable bytes just allocated.
        unsafe { std::ptr::write_bytes(host.as_ptr().cast::<u8>(), 0, MAILBOX_BYTES) };
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated with CU_MEMHOSTALLOC_DEVICEMAP in the
        // current context; `device` is a valid out-pointer.
        let rc = unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut device, host.as_ptr().cast::<c_void>(), 0)
        };
        let mailbox = Mailbox { host, device };
        rc.result().map_err(cuda_err("cuMemHostGetDevicePointer"))?;
        Ok(mailbox)
    }

    fn read(&self, word: usize) -> u64 {
        debug_assert!(word * 8 < MAILBOX_BYTES);
        // SAFETY: word < MAILBOX_BYTES/8, so the pointer stays inside the live,
        // aligned allocation; volatile because the GPU writes it behind our back.
        unsafe { self.host.as_ptr().add(word).read_volatile() }
    }

    fn write(&self, word: usize, value: u64) {
        debug_assert!(word * 8 < MAILBOX_BYTES);
        // SAFETY: as in `read`; volatile because the GPU polls it.
        unsafe { self.host.as_ptr().add(word).write_volatile(value) }
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc and freed once; the owner has
        // synchronised the stream, so no kernel still touches it.
        let _ = unsafe { result::free_host(self.host.as_ptr().cast::<c_void>()) };
    }
}

/// Module and kernels loaded from [`PTX`].
struct Kernels {
    module: sys::CUmodule,
    pingpong: sys::CUfunction,
    pingpong_fenced: sys::CUfunction,
    stamp: sys::CUfunction,
}

impl Kernels {
    fn load() -> Result<Self, DevClockError> {
        // SAFETY: PTX is a NUL-terminated PTX text, as cuModuleLoadData expects.
        let module = unsafe { result::module::load_data(PTX.as_ptr().cast::<c_void>()) }
            .map_err(cuda_err("cuModuleLoadData (PTX JIT)"))?;
        let get = |name: &str| {
            let cname = std::ffi::CString::new(name).expect("static name has no NUL");
            // SAFETY: `module` was just loaded and is not unloaded before
            // the functions are dropped with it.
            unsafe { result::module::get_function(module, cname) }
                .map_err(cuda_err("cuModuleGetFunction"))
        };
        let found = (
            get("clockmesh_pingpong"),
            get("clockmesh_pingpong_fenced"),
            get("clockmesh_stamp"),
        );
        let (pingpong, pingpong_fenced, stamp) = match found {
            (Ok(p), Ok(f), Ok(s)) => (p, f, s),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                // SAFETY: loaded above, unloaded once.
                let _ = unsafe { result::module::unload(module) };
                return Err(e);
            }
        };
        Ok(Kernels {
            module,
            pingpong,
            pingpong_fenced,
            stamp,
        })
    }
}

/// Launch a one-thread kernel with the given parameter values.
fn launch_one_thread(
    f: sys::CUfunction,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), DevClockError> {
    // SAFETY: `f` comes from a loaded module; `params` point at values whose
    // types match the kernel's .param list (checked by the callers next to
    // the PTX) and stay alive for this call (the driver copies them).
    unsafe { result::launch_kernel(f, (1, 1, 1), (1, 1, 1), 0, stream, params) }
        .map_err(cuda_err("cuLaunchKernel"))
}

/// One NVIDIA GPU's `%globaltimer`.
pub struct CudaSource {
    // Field order is drop order: the stream is synchronised in Drop first.
    stream: sys::CUstream,
    kernels: Kernels,
    mailbox: Mailbox,
    ctx: Arc<CudaContext>,
    mode: CudaMode,
    fenced: bool,
    next_req: u64,
    last_time: u64,
    info: SourceInfo,
    phases: PhaseTimes,
}

/// Wall time spent per phase of a burst, summed (logged when dropped).
#[derive(Debug, Default, Clone, Copy)]
pub struct PhaseTimes {
    pub bursts: u64,
    pub launch_ns: u64,
    pub start_wait_ns: u64,
    pub pings_ns: u64,
}

// SAFETY: the raw CUDA handles (stream, module, functions, mapped memory)
// belong to the context, which is bound to the calling thread before every
// use; the source is used from one thread at a time (&mut self).
unsafe impl Send for CudaSource {}

impl CudaSource {
    /// Open device `ordinal`: retain its primary context, JIT the PTX,
    /// allocate the mailbox. `Unavailable` where CUDA or the GPU is absent.
    pub fn open(ordinal: u32, mode: CudaMode) -> Result<Self, DevClockError> {
        if !libcuda_present() {
            return Err(DevClockError::Unavailable(
                "no NVIDIA GPU: libcuda.so could not be loaded".into(),
            ));
        }
        result::init().map_err(cuda_err("cuInit"))?;
        let count = result::device::get_count().map_err(cuda_err("cuDeviceGetCount"))?;
        if ordinal as i32 >= count {
            return Err(DevClockError::NoSuchDevice {
                index: ordinal,
                available: count.max(0) as usize,
            });
        }
        let ctx = CudaContext::new(ordinal as usize).map_err(cuda_err("primary context"))?;
        check_compute_mode(&ctx)?;
        let name = device_name(&ctx, ordinal);
        let kernels = Kernels::load()?;
        let mailbox = Mailbox::new()?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(cuda_err("cuStreamCreate"))?;
        Ok(CudaSource {
            stream,
            kernels,
            mailbox,
            ctx,
            mode,
            fenced: std::env::var("CLOCKMESH_CUDA_PINGPONG").is_ok_and(|v| v == "fenced"),
            next_req: 1,
            last_time: 0,
            phases: PhaseTimes::default(),
            info: SourceInfo {
                device: DeviceId {
                    vendor: Vendor::Nvidia,
                    index: ordinal,
                },
                kind: match mode {
                    CudaMode::PingPong => SourceKind::CudaPingPong,
                    CudaMode::LaunchPerSample => SourceKind::CudaLaunchPerSample,
                },
                name,
                quantum_ns: GLOBALTIMER_QUANTUM_NS,
            },
        })
    }

    fn bind(&self) -> Result<(), DevClockError> {
        self.ctx
            .bind_to_thread()
            .map_err(cuda_err("cuCtxSetCurrent"))
    }

    fn take_req(&mut self) -> u64 {
        let r = self.next_req;
        self.next_req += 1;
        r
    }

    /// Spin until the mailbox's ACK equals `req` and TIME has changed since
    /// the last answer (so half of a split 16-byte store is never taken);
    /// returns `%globaltimer`.
    fn await_answer(&mut self, req: u64, timeout: Duration) -> Result<u64, DevClockError> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if self.mailbox.read(ACK) == req {
                fence(Ordering::Acquire);
                let time = self.mailbox.read(TIME);
                if time != self.last_time {
                    self.last_time = time;
                    return Ok(time);
                }
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && start.elapsed() > timeout {
                return Err(DevClockError::Timeout {
                    stage: "answer",
                    waited_us: start.elapsed().as_micros() as u64,
                });
            }
            std::hint::spin_loop();
        }
    }

    fn pair(
        &self,
        ns: u64,
        before: HostStamp,
        after: HostStamp,
        seq: u64,
        burst: u64,
    ) -> SnapshotPair {
        SnapshotPair {
            device: self.info.device,
            source: self.info.kind,
            reading: DeviceReading::Ns(ns),
            before,
            after,
            in_call_boottime_ns: None,
            seq,
            burst,
        }
    }

    fn start_pingpong_kernel(&mut self, n: usize) -> Result<(), DevClockError> {
        self.mailbox.write(READY, 0);
        fence(Ordering::SeqCst);
        // Parameter types match clockmesh_pingpong(.u64, .u32, .u64).
        let mut mailbox: u64 = self.mailbox.device;
        let mut max_pings: u32 = u32::try_from(n).unwrap_or(u32::MAX);
        let mut idle: u64 = IDLE_TIMEOUT_NS;
        let mut params = [
            (&mut mailbox as *mut u64).cast::<c_void>(),
            (&mut max_pings as *mut u32).cast::<c_void>(),
            (&mut idle as *mut u64).cast::<c_void>(),
        ];
        let kernel = if self.fenced {
            self.kernels.pingpong_fenced
        } else {
            self.kernels.pingpong
        };
        let t0 = Instant::now();
        launch_one_thread(kernel, self.stream, &mut params)?;
        let t1 = Instant::now();
        self.await_kernel_start()?;
        self.phases.bursts += 1;
        self.phases.launch_ns += (t1 - t0).as_nanos() as u64;
        self.phases.start_wait_ns += t1.elapsed().as_nanos() as u64;
        Ok(())
    }

    /// Summed wall time per burst phase so far (ping-pong mode).
    pub fn phase_times(&self) -> PhaseTimes {
        self.phases
    }

    /// Wait for the burst kernel to announce itself. Kernel start takes tens
    /// of microseconds, and much longer while another process's kernels
    /// hold the GPU (contexts are time-sliced), so after a short spin the
    /// host sleeps between polls instead of burning a core. No bracket is
    /// open while waiting, so this costs latency, not accuracy.
    fn await_kernel_start(&self) -> Result<(), DevClockError> {
        let start = Instant::now();
        while self.mailbox.read(READY) == 0 {
            let waited = start.elapsed();
            if waited > START_TIMEOUT {
                return Err(DevClockError::Timeout {
                    stage: "kernel start",
                    waited_us: waited.as_micros() as u64,
                });
            }
            if waited < START_SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(START_POLL);
            }
        }
        Ok(())
    }

    fn pingpong_burst(
        &mut self,
        n: usize,
        burst: u64,
        first_seq: u64,
    ) -> Result<Vec<SnapshotPair>, DevClockError> {
        self.start_pingpong_kernel(n)?;
        let pings_start = Instant::now();
        let mut pairs = Vec::with_capacity(n);
        for i in 0..n {
            let req = self.take_req();
            let before = host::stamp_before()?;
            self.mailbox.write(REQ, req);
            fence(Ordering::SeqCst);
            let ns = self.await_answer(req, ANSWER_TIMEOUT)?;
            let after = host::stamp_after()?;
            pairs.push(self.pair(ns, before, after, first_seq + i as u64, burst));
        }
        self.phases.pings_ns += pings_start.elapsed().as_nanos() as u64;
        Ok(pairs)
    }

    fn launch_burst(
        &mut self,
        n: usize,
        burst: u64,
        first_seq: u64,
    ) -> Result<Vec<SnapshotPair>, DevClockError> {
        let mut pairs = Vec::with_capacity(n);
        for i in 0..n {
            let req = self.take_req();
            // Parameter types match clockmesh_stamp(.u64, .u64).
            let mut mailbox: u64 = self.mailbox.device;
            let mut seq: u64 = req;
            let mut params = [
                (&mut mailbox as *mut u64).cast::<c_void>(),
                (&mut seq as *mut u64).cast::<c_void>(),
            ];
            let before = host::stamp_before()?;
            launch_one_thread(self.kernels.stamp, self.stream, &mut params)?;
            let ns = self.await_answer(req, ANSWER_TIMEOUT)?;
            let after = host::stamp_after()?;
            pairs.push(self.pair(ns, before, after, first_seq + i as u64, burst));
        }
        Ok(pairs)
    }
}

fn check_compute_mode(ctx: &CudaContext) -> Result<(), DevClockError> {
    let mode = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE)
        .map_err(cuda_err("compute mode"))?;
    let prohibited = sys::CUcomputemode::CU_COMPUTEMODE_PROHIBITED as i32;
    let exclusive = sys::CUcomputemode::CU_COMPUTEMODE_EXCLUSIVE_PROCESS as i32;
    if mode == prohibited || mode == exclusive {
        // In exclusive-process mode our context would lock the workload out.
        return Err(DevClockError::Unavailable(format!(
            "GPU compute mode {mode} (prohibited or exclusive-process): not sampling"
        )));
    }
    Ok(())
}

fn device_name(ctx: &CudaContext, ordinal: u32) -> String {
    let name = result::device::get_name(ctx.cu_device()).unwrap_or_else(|_| "NVIDIA GPU".into());
    match result::device::get_uuid(ctx.cu_device()) {
        Ok(uuid) => {
            let hex: String = uuid
                .bytes
                .iter()
                .map(|b| format!("{:02x}", *b as u8))
                .collect();
            format!("{name} (cuda:{ordinal}, GPU-{hex})")
        }
        Err(_) => format!("{name} (cuda:{ordinal})"),
    }
}

impl DeviceClockSource for CudaSource {
    fn info(&self) -> &SourceInfo {
        &self.info
    }

    fn sample_burst(
        &mut self,
        n: usize,
        burst: u64,
        first_seq: u64,
    ) -> Result<Vec<SnapshotPair>, DevClockError> {
        self.bind()?;
        match self.mode {
            CudaMode::PingPong => self.pingpong_burst(n, burst, first_seq),
            CudaMode::LaunchPerSample => self.launch_burst(n, burst, first_seq),
        }
    }

    fn device_memory_used(&self) -> Option<u64> {
        let (free, total) = self.ctx.mem_get_info().ok()?;
        Some(total.saturating_sub(free) as u64)
    }
}

impl Drop for CudaSource {
    fn drop(&mut self) {
        let p = self.phases;
        if p.bursts > 0 {
            let per = |ns: u64| ns as f64 / p.bursts as f64 / 1e3;
            tracing::info!(
                bursts = p.bursts,
                launch_us = per(p.launch_ns),
                start_wait_us = per(p.start_wait_ns),
                pings_us = per(p.pings_ns),
                "CUDA burst phases (mean wall time per burst)"
            );
        }
        if self.bind().is_err() {
            return; // context already unusable; nothing of ours runs in it
        }
        // SAFETY: the stream was created in this context and is destroyed once,
        // after waiting for any burst kernel (it exits within IDLE_TIMEOUT_NS).
        unsafe {
            let _ = result::stream::synchronize(self.stream);
            let _ = result::stream::destroy(self.stream);
            let _ = result::module::unload(self.kernels.module);
        }
        // The mailbox is freed by its own Drop, after this.
    }
}
