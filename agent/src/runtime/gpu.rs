//! GPU clock sampling inside the agent (`gpu_clock`, opt-in).
//!
//! One thread owns every source: CUDA calls block and bind contexts per
//! thread, so they stay off the async loop. Every `snapshot_period_ms` it
//! takes one burst per GPU and shares the new maps; the main loop picks
//! them up on its tick, republishes the offsets record with them, puts them
//! on `/status` and `/metrics`, and writes one JSONL `"type":"device"` line
//! per GPU per window (what `trace merge --history` needs).

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tracing::{info, warn};

use super::status::DeviceStatus;
use crate::{
    config::{GpuClockKind, GpuDevices, InjectedSkew, MAX_GPU_DEVICES},
    devclock::{
        self, CudaMode, DevClockError, HostDomain, PublishedDeviceMap, SourceChoice, host,
        sampler::{DeviceClockSampler, SamplerConfig},
    },
    publish::{DeviceKind, DeviceMap, device_flags},
};

/// What the sampling thread shares with the main loop.
#[derive(Clone, Debug, Default)]
pub struct GpuSnapshot {
    /// Bumped after every round of bursts (and on a failure to open).
    pub generation: u64,
    pub devices: Vec<DeviceStatus>,
    /// Why sampling is not running.
    pub error: Option<String>,
}

/// The sampling thread; stopped and joined on drop.
pub struct GpuClocks {
    shared: Arc<Mutex<GpuSnapshot>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl GpuClocks {
    /// Starts sampling, or `None` when `gpu_clock = off`. Sources are opened
    /// on the thread (a CUDA context takes ~0.3 s per GPU); failures show up
    /// in [`GpuSnapshot::error`], not here: a node without the GPU keeps
    /// probing.
    pub fn start(
        kind: GpuClockKind,
        devices: GpuDevices,
        period: Duration,
    ) -> std::io::Result<Option<Self>> {
        let Some(choice) = source_choice(kind) else {
            return Ok(None);
        };
        let shared = Arc::new(Mutex::new(GpuSnapshot::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (shared.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("gpu-clock".into())
            .spawn(move || {
                // Device clocks need device files, not capabilities.
                if let Err(e) = super::privileges::drop_all() {
                    tracing::warn!("gpu-clock: dropping capabilities: {e}");
                }
                sample_forever(&choice, &devices, period, &s, &st)
            })?;
        Ok(Some(GpuClocks {
            shared,
            stop,
            thread: Some(thread),
        }))
    }

    pub fn snapshot(&self) -> GpuSnapshot {
        self.shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn generation(&self) -> u64 {
        self.shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .generation
    }
}

impl Drop for GpuClocks {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

pub fn source_choice(kind: GpuClockKind) -> Option<SourceChoice> {
    match kind {
        GpuClockKind::Off => None,
        GpuClockKind::Cuda => Some(SourceChoice::Cuda(CudaMode::PingPong)),
        GpuClockKind::CudaLaunch => Some(SourceChoice::Cuda(CudaMode::LaunchPerSample)),
        GpuClockKind::Rocm => Some(SourceChoice::Rocm { tick_hz: None }),
        GpuClockKind::Synthetic => Some(SourceChoice::Synthetic(Default::default())),
    }
}

/// Opens the selected GPUs. `all` opens indices from 0 until the source has
/// no such device (one modelled device for `synthetic`).
pub fn open_samplers(
    choice: &SourceChoice,
    devices: &GpuDevices,
) -> Result<Vec<DeviceClockSampler>, DevClockError> {
    let indices: Vec<u32> = match (devices, choice) {
        (GpuDevices::All, SourceChoice::Synthetic(_)) => vec![0],
        (GpuDevices::All, _) => (0..MAX_GPU_DEVICES).collect(),
        (GpuDevices::List(list), _) => list.clone(),
    };
    let mut samplers = Vec::new();
    for index in indices {
        match devclock::open_source(choice, index) {
            Ok(source) => samplers.push(DeviceClockSampler::new(source, SamplerConfig::default())?),
            Err(DevClockError::NoSuchDevice { .. })
                if *devices == GpuDevices::All && !samplers.is_empty() =>
            {
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(samplers)
}

fn sample_forever(
    choice: &SourceChoice,
    devices: &GpuDevices,
    period: Duration,
    shared: &Mutex<GpuSnapshot>,
    stop: &AtomicBool,
) {
    let mut samplers = match open_samplers(choice, devices) {
        Ok(s) => s,
        Err(e) => {
            warn!("GPU clock sampling not running: {e}");
            let mut snap = shared.lock().unwrap_or_else(|e| e.into_inner());
            snap.error = Some(e.to_string());
            snap.generation += 1;
            return;
        }
    };
    let mut states: Vec<DeviceStatus> = samplers.iter().map(initial_status).collect();
    for s in &states {
        info!(device = %s.device, name = %s.name, "GPU clock sampling");
    }
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        for (sampler, state) in samplers.iter_mut().zip(states.iter_mut()) {
            sample_into(sampler, state);
        }
        {
            let mut snap = shared.lock().unwrap_or_else(|e| e.into_inner());
            snap.devices.clone_from(&states);
            snap.generation += 1;
        }
        next = next_deadline(next, period, Instant::now());
        sleep_until(next, stop);
    }
}

fn initial_status(s: &DeviceClockSampler) -> DeviceStatus {
    let info = s.source().info();
    DeviceStatus {
        device: info.device.to_string(),
        index: info.device.index,
        name: info.name.clone(),
        ..DeviceStatus::default()
    }
}

fn sample_into(sampler: &mut DeviceClockSampler, state: &mut DeviceStatus) {
    match sampler.sample() {
        Ok(burst) => {
            state.last_bracket_ns = burst
                .outcome
                .accepted
                .and_then(|p| p.bracket_ns(HostDomain::Realtime).ok());
            state.last_error = None;
        }
        Err(e) => {
            state.sample_errors += 1;
            state.last_error = Some(e.to_string());
        }
    }
    let stats = sampler.stats();
    state.bursts = stats.bursts;
    state.accepted = stats.accepted;
    state.rejected = stats.rejected_total();
    state.resets = stats.resets;
    state.map = sampler.published();
    state.updated_at_ns = host::realtime_ns().unwrap_or_default();
}

/// The next burst is one period after the last deadline; after a stall
/// (suspended VM, slow GPU) it restarts from now instead of catching up.
fn next_deadline(last: Instant, period: Duration, now: Instant) -> Instant {
    let next = last + period;
    if next < now { now + period } else { next }
}

fn sleep_until(deadline: Instant, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        std::thread::park_timeout(deadline - now);
    }
}

/// The offsets-file entry for one GPU: device ns → this node's local
/// CLOCK_REALTIME (with the injected test skew, if any, so it composes with
/// the node map). `None` without a map.
pub fn device_entry(d: &DeviceStatus, skew: Option<InjectedSkew>) -> Option<DeviceMap> {
    let m = d.map.as_ref()?;
    let anchor_host = m.map(m.anchor_device_ns)?;
    let until_host = m.map(m.valid_until_device_ns)?;
    let skew_at = |t: i64| skew.map_or(0, |s| s.at(t));
    let skew_ppb = skew.map_or(0.0, |s| s.drift_ppb);
    Some(DeviceMap {
        device_id: d.index,
        kind: device_kind(m),
        flags: device_flags::VALID,
        device_anchor_ns: i64::try_from(m.anchor_device_ns).ok()?,
        offset_ns: m.offset_at_anchor_ns.saturating_add(skew_at(anchor_host.0)),
        drift_ps_per_s: ((m.drift_ppb + skew_ppb) * 1e3).round() as i64,
        bound_ns: m.bound_ns,
        valid_until_ns: until_host.0.saturating_add(skew_at(until_host.0)),
    })
}

fn device_kind(m: &PublishedDeviceMap) -> DeviceKind {
    match m.source.as_str() {
        s if s.starts_with("cuda") => DeviceKind::Cuda,
        "kfd-ioctl" => DeviceKind::Rocm,
        "synthetic" => DeviceKind::Synthetic,
        _ => DeviceKind::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clockmesh_core::time::Nanos;

    fn synthetic_samplers(devices: GpuDevices) -> Vec<DeviceClockSampler> {
        let choice = source_choice(GpuClockKind::Synthetic).unwrap();
        open_samplers(&choice, &devices).unwrap()
    }

    #[test]
    fn off_starts_nothing() {
        assert!(
            GpuClocks::start(GpuClockKind::Off, GpuDevices::All, Duration::from_secs(1))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn device_selection() {
        assert_eq!(synthetic_samplers(GpuDevices::All).len(), 1);
        let list = synthetic_samplers(GpuDevices::List(vec![2, 5]));
        let names: Vec<String> = list.iter().map(|s| initial_status(s).device).collect();
        assert_eq!(names, ["synthetic:2", "synthetic:5"]);
    }

    #[test]
    fn missing_gpu_is_reported_not_fatal() {
        // No AMD GPU here (and none in CI): the thread says why and stops.
        let clocks = GpuClocks::start(
            GpuClockKind::Rocm,
            GpuDevices::All,
            Duration::from_millis(10),
        )
        .unwrap()
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while clocks.generation() == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let snap = clocks.snapshot();
        assert!(snap.devices.is_empty());
        assert!(snap.error.is_some(), "{snap:?}");
    }

    #[test]
    fn thread_samples_and_entry_maps_like_the_fit() {
        let clocks = GpuClocks::start(
            GpuClockKind::Synthetic,
            GpuDevices::List(vec![3]),
            Duration::from_millis(5),
        )
        .unwrap()
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let snap = loop {
            let snap = clocks.snapshot();
            // The fitter needs 8 bursts (FitConfig::min_points) before its
            // first map: wait for the map, not a burst count below that.
            if snap.devices.first().is_some_and(|d| d.map.is_some()) || Instant::now() > deadline {
                break snap;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let d = &snap.devices[0];
        assert_eq!((d.device.as_str(), d.index), ("synthetic:3", 3));
        assert!(d.accepted >= 8 && d.last_error.is_none(), "{d:?}");
        let m = d.map.as_ref().expect("a fit within 20 s");
        let e = device_entry(d, None).unwrap();
        assert_eq!((e.device_id, e.kind), (3, DeviceKind::Synthetic));
        // The file's integer map reproduces the published map.
        let t = m.valid_until_device_ns - 1_000_000;
        let file_map = e.to_host(t as i64);
        assert!(
            (file_map - m.map(t).unwrap()).abs() <= Nanos(1),
            "{file_map} vs {:?}",
            m.map(t)
        );
        // A skew shifts the entry by the skew at that host time.
        let skew = InjectedSkew {
            offset_ns: 1_000_000,
            drift_ppb: 0.0,
            epoch_ns: 0,
            wander_ppb_per_sqrt_s: 0.0,
            wander_seed: 0,
        };
        let skewed = device_entry(d, Some(skew)).unwrap();
        assert_eq!(skewed.offset_ns - e.offset_ns, 1_000_000);
        assert_eq!(skewed.valid_until_ns - e.valid_until_ns, 1_000_000);
    }

    #[test]
    fn deadlines_do_not_catch_up_after_a_stall() {
        let t0 = Instant::now();
        let p = Duration::from_millis(100);
        assert_eq!(next_deadline(t0, p, t0), t0 + p);
        let late = t0 + Duration::from_secs(5);
        assert_eq!(next_deadline(t0, p, late), late + p);
    }
}
