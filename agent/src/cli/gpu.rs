//! `clockmesh gpu-clock`: sample one GPU's clock against the host clocks,
//! fit the map and print how good it is (brackets, fit, prediction error,
//! CPU cost). This is the measurement tool behind docs/gpu-clocks.md.
use std::collections::VecDeque;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::ValueEnum;
use clockmesh::devclock::CudaMode;
use clockmesh::devclock::sampler::{DeviceClockSampler, SamplerConfig};
use clockmesh::devclock::{
    DevClockError, HostDomain, PublishedDeviceMap, SourceChoice, host, open_source,
};
use clockmesh_estimator::device::{DeviceClockFit, FitConfig, FitStats, SyntheticConfig};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SourceArg {
    /// NVIDIA `%globaltimer` through a kernel (CUDA loaded at run time).
    Cuda,
    /// AMD GPU clock counter through the KFD ioctl on /dev/kfd.
    Rocm,
    /// A modelled clock (H100-like drift and brackets); needs no GPU.
    Synthetic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CudaModeArg {
    /// Kernel resident for each burst, answering host pings (~2 us brackets).
    Pingpong,
    /// One kernel launch per sample (fallback, ~6-10 us brackets).
    Launch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HostClockArg {
    Realtime,
    Monotonic,
    Boottime,
}

/// Sample a GPU device clock against the host clocks and report the fit.
///
/// Opening a GPU source holds a CUDA context (about 0.5 GiB of GPU memory on
/// an H100) or a KFD process, so run it only where that is acceptable.
#[derive(clap::Args, Debug)]
pub struct GpuArgs {
    /// Clock source.
    #[arg(long, value_enum, default_value_t = SourceArg::Cuda)]
    pub source: SourceArg,
    /// CUDA sampling mode.
    #[arg(long, value_enum, default_value_t = CudaModeArg::Pingpong)]
    pub cuda_mode: CudaModeArg,
    /// Device index (CUDA ordinal, or n-th KFD GPU node).
    #[arg(long, default_value_t = 0)]
    pub device: u32,
    /// How long to sample, in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Time between bursts in ms (the seeds' `snapshot_period_ms`).
    #[arg(
        long = "period-ms",
        alias = "snapshot-period-ms",
        default_value_t = 100
    )]
    pub period_ms: u64,
    /// Pairs per burst; the tightest is kept.
    #[arg(long, default_value_t = 8)]
    pub burst: usize,
    /// Fit window in seconds.
    #[arg(long, default_value_t = 30.0)]
    pub window_s: f64,
    /// Extrapolation cap in seconds: past it the map refuses.
    #[arg(long, default_value_t = 2.0)]
    pub cap_s: f64,
    /// Host clock to map onto.
    #[arg(long, value_enum, default_value_t = HostClockArg::Realtime)]
    pub host_clock: HostClockArg,
    /// Reject pairs with a wider bracket (us).
    #[arg(long, default_value_t = 50.0)]
    pub max_bracket_us: f64,
    /// AMD counter rate in Hz, if the DRM render node cannot be asked.
    #[arg(long)]
    pub rocm_tick_hz: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write each burst's kept pair as CSV (burst, host midpoint ns,
    /// device ns, bracket ns) for offline analysis.
    #[arg(long)]
    pub pairs_csv: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
struct Spread {
    n: usize,
    min: f64,
    p50: f64,
    p99: f64,
    max: f64,
}

fn spread(values: &[f64]) -> Spread {
    if values.is_empty() {
        return Spread::default();
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    Spread {
        n: v.len(),
        min: v[0],
        p50: at(0.5),
        p99: at(0.99),
        max: v[v.len() - 1],
    }
}

#[derive(Debug, Serialize)]
struct HorizonReport {
    /// Age of the fit used for the prediction (ms).
    horizon_ms: u64,
    /// |predicted host time - bracket midpoint| of each burst's kept pair.
    abs_error_ns: Spread,
    /// Fraction with |error| <= bound + half bracket.
    within_bound: f64,
    /// Predictions refused (past the extrapolation cap).
    refused: u64,
}

#[derive(Debug, Serialize)]
struct CpuReport {
    wall_s: f64,
    process_cpu_s: f64,
    /// Whole process (all threads) CPU over the sampling loop, % of one core.
    process_pct_of_core: f64,
    /// CPU of the sample() calls alone, % of one core.
    sampling_pct_of_core: f64,
    per_burst_cpu_us: Spread,
}

#[derive(Debug, Serialize)]
struct StatsReport {
    bursts: u64,
    pairs_seen: u64,
    accepted: u64,
    rejected_bracket_too_wide: u64,
    rejected_invalid: u64,
    rejected_non_monotonic: u64,
    rejected_outlier: u64,
    pruned_outliers: u64,
    resets: u64,
    source_errors: u64,
}

impl StatsReport {
    fn new(s: FitStats, source_errors: u64) -> Self {
        StatsReport {
            bursts: s.bursts,
            pairs_seen: s.pairs_seen,
            accepted: s.accepted,
            rejected_bracket_too_wide: s.rejected_bracket_too_wide,
            rejected_invalid: s.rejected_invalid,
            rejected_non_monotonic: s.rejected_non_monotonic,
            rejected_outlier: s.rejected_outlier,
            pruned_outliers: s.pruned_outliers,
            resets: s.resets,
            source_errors,
        }
    }
}

#[derive(Debug, Serialize)]
struct GpuReport {
    source: String,
    device: String,
    host_clock: &'static str,
    period_ms: u64,
    burst_len: usize,
    /// Brackets of every pair (ns).
    bracket_all_ns: Spread,
    /// Bracket of the tightest pair of each burst (ns).
    bracket_best_ns: Spread,
    /// Residual rms of the fit at the end of each full window (ns).
    window_rms_ns: Spread,
    /// The same, window by window, in order.
    window_rms_each_ns: Vec<f64>,
    window_s: f64,
    prediction: Vec<HorizonReport>,
    fit: Option<PublishedDeviceMap>,
    cpu: CpuReport,
    stats: StatsReport,
    /// Device memory in use by all processes right after opening (MiB).
    gpu_mem_used_after_open_mib: Option<f64>,
}

fn fit_config(args: &GpuArgs) -> anyhow::Result<FitConfig> {
    let secs = |s: f64, what: &str| -> anyhow::Result<u64> {
        if !(s.is_finite() && s > 0.0) {
            bail!("{what} must be a positive number of seconds");
        }
        Ok((s * 1e9) as u64)
    };
    Ok(FitConfig {
        domain: match args.host_clock {
            HostClockArg::Realtime => HostDomain::Realtime,
            HostClockArg::Monotonic => HostDomain::Monotonic,
            HostClockArg::Boottime => HostDomain::Boottime,
        },
        window_ns: secs(args.window_s, "--window-s")?,
        extrapolation_cap_ns: secs(args.cap_s, "--cap-s")?,
        max_bracket_ns: (secs(args.max_bracket_us, "--max-bracket-us")? / 1_000_000).max(1),
        ..FitConfig::default()
    })
}

fn source_choice(args: &GpuArgs) -> SourceChoice {
    match args.source {
        SourceArg::Cuda => SourceChoice::Cuda(match args.cuda_mode {
            CudaModeArg::Pingpong => CudaMode::PingPong,
            CudaModeArg::Launch => CudaMode::LaunchPerSample,
        }),
        SourceArg::Rocm => SourceChoice::Rocm {
            tick_hz: args.rocm_tick_hz,
        },
        SourceArg::Synthetic => SourceChoice::Synthetic(SyntheticConfig::default()),
    }
}

/// Predicted-vs-measured bookkeeping for one fit age.
struct Horizon {
    age: Duration,
    errors: Vec<f64>,
    within: u64,
    refused: u64,
}

impl Horizon {
    fn record(&mut self, fit: &DeviceClockFit, pair: &clockmesh::devclock::SnapshotPair) {
        let domain = fit.domain;
        let (Ok(device_ns), Ok(mid), Ok(bracket)) = (
            pair.device_ns(),
            pair.midpoint_ns(domain),
            pair.bracket_ns(domain),
        ) else {
            return;
        };
        match fit.map(device_ns) {
            Ok(m) => {
                let err = (m.host_ns - mid).unsigned_abs();
                self.errors.push(err as f64);
                if err <= m.bound_ns + bracket / 2 {
                    self.within += 1;
                }
            }
            Err(_) => self.refused += 1,
        }
    }

    fn report(&self) -> HorizonReport {
        HorizonReport {
            horizon_ms: self.age.as_millis() as u64,
            abs_error_ns: spread(&self.errors),
            within_bound: if self.errors.is_empty() {
                0.0
            } else {
                self.within as f64 / self.errors.len() as f64
            },
            refused: self.refused,
        }
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "one pass over the GPU sampling steps, printed in order"
)]
pub fn run(args: GpuArgs) -> anyhow::Result<()> {
    if !(args.duration.is_finite() && args.duration > 0.0) {
        bail!("--duration must be a positive number of seconds");
    }
    if args.period_ms == 0 || args.burst == 0 {
        bail!("--period-ms and --burst must be positive");
    }
    let fit = fit_config(&args)?;
    let domain = fit.domain;
    let source = match open_source(&source_choice(&args), args.device) {
        Ok(s) => s,
        Err(e @ DevClockError::Unavailable(_)) => {
            bail!("{e}\n(try `--source synthetic` to exercise the pipeline without a GPU)")
        }
        Err(e) => return Err(e).context("opening the device clock source"),
    };
    let info = source.info().clone();
    tracing::info!(device = %info.device, name = %info.name, kind = ?info.kind, "sampling");
    let mem_mib = source
        .device_memory_used()
        .map(|b| b as f64 / (1024.0 * 1024.0));
    let mut sampler = DeviceClockSampler::new(
        source,
        SamplerConfig {
            burst_len: args.burst,
            fit,
        },
    )?;

    let period = Duration::from_millis(args.period_ms);
    let mut horizons: Vec<Horizon> = [0u64, 1_000, 2_000, 5_000]
        .iter()
        .map(|&ms| Horizon {
            age: if ms == 0 {
                period
            } else {
                Duration::from_millis(ms)
            },
            errors: Vec::new(),
            within: 0,
            refused: 0,
        })
        .collect();
    let max_age = horizons.iter().map(|h| h.age).max().unwrap_or(period);
    let mut past_fits: VecDeque<(Instant, DeviceClockFit)> = VecDeque::new();
    let (mut all_brackets, mut best_brackets, mut burst_cpu, mut window_rms) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let window = Duration::from_secs_f64(args.window_s);
    let mut next_window = window;
    let mut source_errors = 0u64;

    let mut csv = match &args.pairs_csv {
        Some(path) => {
            let file = std::fs::File::create(path)
                .with_context(|| format!("creating {}", path.display()))?;
            let mut w = std::io::BufWriter::new(file);
            writeln!(w, "burst,host_mid_ns,device_ns,bracket_ns")?;
            Some(w)
        }
        None => None,
    };
    let start = Instant::now();
    let (cpu0, _) = host::cpu_time_ns()?;
    let mut sampling_cpu_ns = 0i64;
    let end = start + Duration::from_secs_f64(args.duration);
    let mut next = start;
    while next < end {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        next += period;
        let (_, t0) = host::cpu_time_ns()?;
        let sample = match sampler.sample() {
            Ok(s) => s,
            Err(e) => {
                source_errors += 1;
                tracing::warn!(error = %e, "burst failed");
                continue;
            }
        };
        let (_, t1) = host::cpu_time_ns()?;
        sampling_cpu_ns += t1 - t0;
        burst_cpu.push((t1 - t0) as f64 / 1e3);
        let brackets: Vec<f64> = sample
            .pairs
            .iter()
            .filter_map(|p| p.bracket_ns(domain).ok())
            .map(|b| b as f64)
            .collect();
        if let Some(best) = brackets.iter().copied().min_by(f64::total_cmp) {
            best_brackets.push(best);
        }
        all_brackets.extend(brackets);
        let taken = Instant::now();
        if let (Some(w), Some(p)) = (csv.as_mut(), sample.outcome.accepted.as_ref())
            && let (Ok(mid), Ok(dev), Ok(b)) =
                (p.midpoint_ns(domain), p.device_ns(), p.bracket_ns(domain))
        {
            writeln!(w, "{},{mid},{dev},{b}", p.burst)?;
        }
        if let Some(pair) = sample.outcome.accepted {
            for h in horizons.iter_mut() {
                let fit = if h.age == period {
                    sample.prior_fit.as_ref()
                } else {
                    // Newest fit at least `age` old (times are increasing).
                    let newer =
                        past_fits.partition_point(|(at, _)| taken.duration_since(*at) >= h.age);
                    newer
                        .checked_sub(1)
                        .and_then(|i| past_fits.get(i))
                        .map(|(_, f)| f)
                };
                if let Some(fit) = fit {
                    h.record(fit, &pair);
                }
            }
        }
        if let Some(fit) = sampler.fit() {
            past_fits.push_back((taken, fit.clone()));
            while past_fits
                .get(1)
                .is_some_and(|(at, _)| taken.duration_since(*at) > max_age)
            {
                past_fits.pop_front();
            }
            if taken.duration_since(start) >= next_window {
                window_rms.push(fit.residual_rms_ns);
                next_window += window;
            }
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let (cpu1, _) = host::cpu_time_ns()?;
    if let Some(mut w) = csv {
        w.flush()?;
    }
    let process_cpu_s = (cpu1 - cpu0) as f64 / 1e9;

    let report = GpuReport {
        source: format!("{:?}", info.kind),
        device: format!("{} {}", info.device, info.name),
        host_clock: clockmesh::devclock::publish_map::host_domain_name(domain),
        period_ms: args.period_ms,
        burst_len: args.burst,
        bracket_all_ns: spread(&all_brackets),
        bracket_best_ns: spread(&best_brackets),
        window_rms_ns: spread(&window_rms),
        window_rms_each_ns: window_rms.clone(),
        window_s: args.window_s,
        prediction: horizons.iter().map(Horizon::report).collect(),
        fit: sampler.published(),
        cpu: CpuReport {
            wall_s: wall,
            process_cpu_s,
            process_pct_of_core: 100.0 * process_cpu_s / wall,
            sampling_pct_of_core: 100.0 * sampling_cpu_ns as f64 / 1e9 / wall,
            per_burst_cpu_us: spread(&burst_cpu),
        },
        stats: StatsReport::new(sampler.stats(), source_errors),
        gpu_mem_used_after_open_mib: mem_mib,
    };
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        print_text(&report)?;
    }
    Ok(())
}

fn print_text(r: &GpuReport) -> Result<(), super::out::StdoutError> {
    let us = |ns: f64| ns / 1e3;
    crate::outln!("device         {}", r.device)?;
    crate::outln!("source         {} -> {}", r.source, r.host_clock)?;
    crate::outln!(
        "period         {} ms, {} pairs per burst, {} bursts",
        r.period_ms,
        r.burst_len,
        r.stats.bursts
    )?;
    crate::outln!(
        "bracket all    p50 {:.2} us  p99 {:.2} us  min {:.2} us",
        us(r.bracket_all_ns.p50),
        us(r.bracket_all_ns.p99),
        us(r.bracket_all_ns.min)
    )?;
    crate::outln!(
        "bracket best   p50 {:.2} us  p99 {:.2} us  (tightest per burst)",
        us(r.bracket_best_ns.p50),
        us(r.bracket_best_ns.p99)
    )?;
    match &r.fit {
        Some(f) => {
            crate::outln!(
                "fit            offset {} ns at device {} ns, drift {:+.1} ppb ({:+.3} ppm)",
                f.offset_at_anchor_ns,
                f.anchor_device_ns,
                f.drift_ppb,
                f.drift_ppb / 1e3
            )?;
            crate::outln!(
                "               residual rms {:.1} ns over {} points, bound {} ns, valid until +{:.1} s",
                f.residual_rms_ns,
                f.points,
                f.bound_ns,
                (f.valid_until_device_ns - f.anchor_device_ns) as f64 / 1e9
            )?;
        }
        None => crate::outln!("fit            none (not enough accepted pairs)")?,
    }
    crate::outln!(
        "window rms     {} windows of {} s: median {:.1} ns, max {:.1} ns",
        r.window_rms_ns.n,
        r.window_s,
        r.window_rms_ns.p50,
        r.window_rms_ns.max
    )?;
    for h in &r.prediction {
        crate::outln!(
            "predict +{:>5} ms  |err| p50 {:.0} ns  p99 {:.0} ns  max {:.0} ns  within bound {:.4}  refused {}",
            h.horizon_ms,
            h.abs_error_ns.p50,
            h.abs_error_ns.p99,
            h.abs_error_ns.max,
            h.within_bound,
            h.refused
        )?;
    }
    crate::outln!(
        "cpu            process {:.4}% of a core, sample() {:.4}% ({:.1} us per burst p50)",
        r.cpu.process_pct_of_core,
        r.cpu.sampling_pct_of_core,
        r.cpu.per_burst_cpu_us.p50
    )?;
    if let Some(m) = r.gpu_mem_used_after_open_mib {
        crate::outln!("gpu memory     {m:.0} MiB in use on the device after opening")?;
    }
    let s = &r.stats;
    crate::outln!(
        "rejected       bracket {} invalid {} non-monotonic {} outlier {} pruned {} resets {} source errors {}",
        s.rejected_bracket_too_wide,
        s.rejected_invalid,
        s.rejected_non_monotonic,
        s.rejected_outlier,
        s.pruned_outliers,
        s.resets,
        s.source_errors
    )?;
    Ok(())
}
