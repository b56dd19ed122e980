//! `clockmesh trace ...`: inspect profiler traces and merge several hosts'
//! traces onto one global timeline.
use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clockmesh::publish::history;
use clockmesh::trace::scan::PlaneSummary;
use clockmesh::trace::{self, DeviceClockSpec, MergeOptions};

use super::out::StdoutError;

#[derive(clap::Args, Debug)]
pub struct TraceArgs {
    #[command(subcommand)]
    command: TraceCommand,
}

#[derive(clap::Subcommand, Debug)]
enum TraceCommand {
    /// Show planes, lines, events, session start and clock stats of .xplane.pb files.
    Info(InfoArgs),
    /// Place several hosts' traces on one global timeline (one xprof run).
    ///
    /// Each host's map from its clock to the global timeline comes from, in
    /// order: --offset (one constant, no bound); the agent's JSONL history
    /// (--history) when it covers the session (one anchor per estimator
    /// window); the records the clockmesh hook or JAX helper took at session
    /// start and stop; the history extrapolated. When the map drifts, every
    /// event start and end goes through it at its own time; a constant map
    /// shifts lines whole. Planes in a GPU's own clock (--device-clock, or
    /// declared by clock_domain/clock_device plane stats) go through the
    /// device maps in --history first. Every placed plane gets its worst
    /// bound as the stat clock_alignment_bound_ns; the summary prints each
    /// host's offset, drift and bound. All other bytes are copied verbatim.
    /// Nothing is written unless every input is valid (and within
    /// --max-bound).
    Merge(MergeArgs),
    /// Who arrives last at each collective, by how much, and whether the
    /// alignment is consistent (straggler analysis of one distributed job).
    ///
    /// Reads every rank's trace (xprof .xplane.pb, PyTorch Kineto JSON) on
    /// one timeline: a merged run as `trace merge` writes it, or the
    /// per-host inputs, merged in memory first exactly as `trace merge`
    /// would (--history, else the hook's start/stop records). Matches each
    /// collective instance across ranks (PyTorch: process group and
    /// sequence number, from the record_param_comms op that launched the
    /// kernel; XLA: the op and its run id); what has neither is matched by
    /// aligning the ranks' sequences of calls (kind, group, sizes, order;
    /// captures may start and stop at other steps), decided by equal steps
    /// or lined-up exits, and a group that cannot be aligned is refused
    /// with its reason, never paired wrongly. Then prints per instance the
    /// last arriver, the arrival
    /// spread and each rank's wait, a straggler ranking (wait caused to the
    /// others, per rank, host and step, and what the straggler did just
    /// before it arrived), and the causality check: no rank can leave an
    /// all-reduce, all-gather, reduce-scatter, all-to-all or barrier before
    /// the last rank entered it, so an exit earlier than another rank's
    /// entry by more than their two bounds proves the alignment wrong. A
    /// rank is "late" only by more than the combined bounds; less is
    /// "within alignment error".
    Collectives(CollectivesArgs),
    /// What bounded each step: the cross-rank critical path, each rank's
    /// time, and what-if.
    ///
    /// Reads the inputs as `trace collectives` does (a merged run, or the
    /// per-host inputs with --history/--offset; xplane and Kineto) and
    /// matches the collectives the same way. Then, per step, walks back
    /// from the rank that ended the step last: through each collective's
    /// own time to its last arriver (the rank whose enter released the
    /// others), then along that rank's time before its call (the gap after
    /// the op that preceded it, that op, other time on the thread) to its
    /// previous call, and so on to the step's start. A hop whose last
    /// arriver is within the alignment bound of the second-last says "order
    /// uncertain" instead of guessing. Per rank: work (the ops that preceded
    /// its calls), gaps, waiting for the last arriver, and exposed
    /// communication; and which rank and op topped the path how often.
    ///
    /// --what-if RANK:OP[=DURATION] replays every step with that op on that
    /// rank taking its median (or DURATION): each call enters when its own
    /// rank's work before it is done, and a collective completes when its
    /// last rank has entered plus its own measured time, so the step time
    /// that follows is what the other ranks allow, not a subtraction.
    /// Definitions: docs/trace-merge.md, "Critical path".
    CriticalPath(CriticalPathArgs),
}

#[derive(clap::Args, Debug)]
struct InfoArgs {
    /// .xplane.pb files or directories containing them.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct MergeArgs {
    /// Per-host xprof run directories, log directories or .xplane.pb files,
    /// and PyTorch *.json traces. A host may have several processes (one
    /// file each, e.g. two JAX processes' <host>.xplane.pb in their own log
    /// dirs): they share the host's map and are written <host>@p<N>.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// Output log directory; writes <OUT>/plugins/profile/<RUN>/<host>.xplane.pb.
    #[arg(short, long)]
    out: PathBuf,
    /// Run (directory) name [default: merged_<origin as YYYY_MM_DD_HH_MM_SS UTC>].
    #[arg(long)]
    run: Option<String>,
    /// Offset of a host, global − local in ns: --offset host=NS (repeatable,
    /// or comma-separated). A host no input has is an error.
    #[arg(long = "offset", value_name = "HOST=NS", value_parser = parse_offset, value_delimiter = ',')]
    offsets: Vec<(String, i64)>,
    /// The agents' per-window histories (JSON lines) to look node offsets
    /// and GPU device-clock maps up in: a file (one agent's, or several
    /// concatenated), or a directory whose *.jsonl files are read (one per
    /// host, as a job leaves them). Repeatable.
    #[arg(long, value_name = "FILE_OR_DIR")]
    history: Vec<PathBuf>,
    /// Treat hosts without any offset as offset 0 (warns) instead of failing.
    #[arg(long)]
    allow_missing_offsets: bool,
    /// Plane whose timestamps are raw readings of a GPU clock, placed through
    /// that device's maps in --history: [HOST:]PLANE=DEVICE, e.g.
    /// "/device:GPU:0=nvidia:0" or "host-a:gpu_timers=nvidia:1" (repeatable).
    /// Not for CUPTI/roctracer planes: those are already host time.
    #[arg(long = "device-clock", value_name = "[HOST:]PLANE=DEVICE", value_parser = parse_device_clock)]
    device_clocks: Vec<DeviceClockSpec>,
    /// Apply no device map: planes declaring a device clock are shifted by
    /// the node offset only, as before device maps existed.
    #[arg(long, conflicts_with = "device_clocks")]
    ignore_device_clocks: bool,
    /// Also write the xprof hosts as one Chrome/Perfetto JSON trace to this
    /// file (refused if it exists, unless --force): each host's processes
    /// labelled with its offset, drift and bound, and a flow arrow chain
    /// per collective instance, in arrival order, ending on the last
    /// arriver.
    #[arg(long, value_name = "FILE")]
    perfetto: Option<PathBuf>,
    /// Also write what the merge did per host (source, offset, drift, worst
    /// bound, events placed, device planes) as JSON to this file (refused
    /// if it exists, unless --force); `clockmesh report --merge-summary`
    /// shows it.
    #[arg(long, value_name = "FILE")]
    summary: Option<PathBuf>,
    /// Replace an existing --perfetto or --summary file.
    #[arg(long)]
    force: bool,
    /// Fail, writing nothing, if any host's alignment bound (worst over its
    /// session) exceeds NS, or is unknown (--offset, assumed 0).
    #[arg(long, value_name = "NS")]
    max_bound: Option<u64>,
}

/// The inputs of one distributed job, merged or to merge.
#[derive(clap::Args, Debug)]
struct JobInputs {
    /// A merged run (directory or files from `trace merge`), or the
    /// per-host run directories and files to merge first.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// The agents' per-window histories, for merging per-host inputs (as
    /// `trace merge --history`: a file, or a directory of *.jsonl, one per
    /// host). Repeatable.
    #[arg(long, value_name = "FILE_OR_DIR")]
    history: Vec<PathBuf>,
    /// Offset of a host, global − local in ns, for merging per-host inputs
    /// (as `trace merge --offset`).
    #[arg(long = "offset", value_name = "HOST=NS", value_parser = parse_offset, value_delimiter = ',')]
    offsets: Vec<(String, i64)>,
    /// Analyse the per-host inputs on their own host clocks, unmerged, with
    /// no bound: what unaligned clocks would tell (compare with the
    /// aligned run).
    #[arg(long, conflicts_with_all = ["history", "offsets"])]
    no_align: bool,
}

#[derive(clap::Args, Debug)]
struct CollectivesArgs {
    #[command(flatten)]
    job: JobInputs,
    /// Print the whole analysis as JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Exit with status 3 when the causality check finds a violation.
    #[arg(long)]
    strict: bool,
    /// How many instances the table lists (worst arrival spread first).
    #[arg(long, value_name = "N", default_value_t = 20)]
    instances: usize,
}

#[derive(clap::Args, Debug)]
struct CriticalPathArgs {
    #[command(flatten)]
    job: JobInputs,
    /// Print every step's path, times and the what-ifs as JSON.
    #[arg(long)]
    json: bool,
    /// How many paths the table prints (slowest steps first).
    #[arg(long, value_name = "N", default_value_t = 3)]
    paths: usize,
    /// Replay the steps with OP on RANK taking its median, or DURATION
    /// (ns, or with a unit: 1.5ms, 200us, 2s). RANK: the trace's rank
    /// number, `#N` for the N-th input (from 0), or a host name.
    /// Repeatable.
    #[arg(long = "what-if", value_name = "RANK:OP[=DURATION]", value_parser = parse_what_if)]
    what_if: Vec<WhatIfSpec>,
}

/// `--what-if` as given, its rank not yet resolved.
#[derive(Clone, Debug, PartialEq)]
struct WhatIfSpec {
    rank: String,
    op: String,
    duration: trace::collectives::critical::WhatIfDuration,
}

fn parse_what_if(s: &str) -> Result<WhatIfSpec, String> {
    use trace::collectives::critical::WhatIfDuration;
    let (rank, rest) =
        split_rank(s).ok_or_else(|| format!("expected RANK:OP[=DURATION], got {s:?}"))?;
    let (op, duration) = match rest.rsplit_once('=') {
        Some((op, d)) => (op, WhatIfDuration::Ns(parse_duration_ns(d)?)),
        None => (rest, WhatIfDuration::Median),
    };
    if rank.is_empty() || op.is_empty() {
        return Err(format!("expected RANK:OP[=DURATION], got {s:?}"));
    }
    Ok(WhatIfSpec {
        rank: rank.to_string(),
        op: op.to_string(),
        duration,
    })
}

/// At the first single ':' (ops have `::` in them: `1:aten::mm`).
fn split_rank(s: &str) -> Option<(&str, &str)> {
    let b = s.as_bytes();
    let at = (0..b.len())
        .find(|&i| b[i] == b':' && b.get(i + 1) != Some(&b':') && (i == 0 || b[i - 1] != b':'))?;
    Some((&s[..at], &s[at + 1..]))
}

/// `1500`, `1500ns`, `1.5us`, `1.5µs`, `2ms`, `0.5s` → ns.
fn parse_duration_ns(s: &str) -> Result<u64, String> {
    let units = [
        ("ns", 1.0),
        ("us", 1e3),
        ("µs", 1e3),
        ("ms", 1e6),
        ("s", 1e9),
    ];
    let (number, scale) = units
        .iter()
        .find_map(|(u, f)| s.strip_suffix(u).map(|n| (n, *f)))
        .unwrap_or((s, 1.0));
    let v: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("not a duration: {s:?} (ns, or with a unit: 1.5ms, 200us, 2s)"))?;
    let ns = v * scale;
    if !(0.0..=u64::MAX as f64).contains(&ns) {
        return Err(format!("duration out of range: {s:?}"));
    }
    // Rounded to the ns the traces carry.
    Ok(ns.round() as u64)
}

fn parse_device_clock(s: &str) -> Result<DeviceClockSpec, String> {
    s.parse().map_err(|e: trace::SpecError| e.to_string())
}

fn parse_offset(s: &str) -> Result<(String, i64), String> {
    let (host, ns) = s
        .split_once('=')
        .ok_or_else(|| format!("expected HOST=NS, got {s:?}"))?;
    if host.trim().is_empty() {
        return Err(format!("no host name in {s:?} (expected HOST=NS)"));
    }
    let ns = ns
        .trim()
        .parse()
        .map_err(|e| format!("offset of {host:?} is not an integer ns: {e}"))?;
    Ok((host.to_string(), ns))
}

pub fn run(args: TraceArgs) -> anyhow::Result<()> {
    match args.command {
        TraceCommand::Info(a) => info(a),
        TraceCommand::Merge(a) => merge(a),
        TraceCommand::Collectives(a) => collectives(a),
        TraceCommand::CriticalPath(a) => critical_path(a),
    }
}

fn info(args: InfoArgs) -> anyhow::Result<()> {
    let files = trace::collect_inputs(&args.inputs)?;
    let mut failed = 0;
    for path in files {
        match trace::scan_file(&path) {
            Ok(scan) => print_scan(&scan)?,
            Err(e) => {
                failed += 1;
                eprintln!("{}: {e}", path.display());
            }
        }
    }
    anyhow::ensure!(failed == 0, "{failed} file(s) could not be read");
    Ok(())
}

fn print_scan(scan: &trace::Scan) -> Result<(), StdoutError> {
    crate::outln!("{} ({} bytes)", scan.path.display(), scan.file_len)?;
    crate::outln!("  hostnames: {}", scan.hostnames.join(", "))?;
    match scan.profile_start_ns() {
        Some(s) => crate::outln!("  session start: {s} ns ({})", utc(s))?,
        None => crate::outln!("  session start: none (no Task Environment profile_start_time)")?,
    }
    if let (Some(a), Some(b)) = (scan.profile_start_ns(), scan.profile_stop_ns()) {
        crate::outln!("  session length: {:.6} s", (b - a) as f64 / 1e9)?;
    }
    let clock = scan.clock_stat_names();
    if clock.is_empty() {
        crate::outln!("  clock stats: none")?;
    } else {
        for name in clock {
            if let Some(v) = scan.clock_stat_value(name) {
                crate::outln!("  clock stat {name} = {v}")?;
            }
        }
    }
    crate::outln!(
        "  planes: {}, lines: {}, events: {}",
        scan.planes.len(),
        scan.lines.len(),
        scan.events()
    )?;
    for p in &scan.planes {
        crate::outln!(
            "    {:<32} id {:<4} lines {:<6} events {:<10} event metadata {}",
            p.name,
            p.id,
            p.lines,
            p.events,
            p.event_metadata
        )?;
        if let Some(clock) = plane_clock(p) {
            crate::outln!("      {clock}")?;
        }
    }
    Ok(())
}

/// What a plane declares about its clock, and what the merge does with it.
fn plane_clock(p: &PlaneSummary) -> Option<String> {
    let device = p.clock_device.as_deref();
    let line = match (p.clock_domain.as_deref(), device) {
        (None, None) => return None,
        (Some("CLOCK_REALTIME"), _) => {
            "clock_domain \"CLOCK_REALTIME\": host time, node offset only".to_string()
        }
        (Some(d), Some(dev)) => format!(
            "clock_domain {d:?}, clock_device {dev:?}: device clock, merge places it through {dev}'s published maps"
        ),
        (Some(d), None) => {
            format!("clock_domain {d:?} without clock_device: merge needs --device-clock for it")
        }
        (None, Some(dev)) => format!(
            "clock_device {dev:?} without clock_domain: merge shifts it by the node offset unless --device-clock names it"
        ),
    };
    Some(line)
}

/// `YYYY-MM-DD HH:MM:SS.nnnnnnnnn UTC` without a date crate.
pub(crate) fn utc(ns: i64) -> String {
    let (secs, nanos) = (ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000));
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{nanos:09} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn default_run_name(origin_ns: i64) -> String {
    let s = utc(origin_ns);
    // "YYYY-MM-DD HH:MM:SS" -> "merged_YYYY_MM_DD_HH_MM_SS"
    format!("merged_{}", s[..19].replace(['-', ' ', ':'], "_"))
}

fn merge(args: MergeArgs) -> anyhow::Result<()> {
    if let Some(p) = &args.summary {
        super::files::refuse_overwrite(p, args.force, "--summary")?;
    }
    let inputs = trace_inputs(&args.inputs)?;
    let history = load_histories(&args.history)?;
    let mut opts = MergeOptions {
        out_dir: args.out.clone(),
        run_name: args.run.clone().unwrap_or_default(),
        offsets: args.offsets.iter().cloned().collect::<HashMap<_, _>>(),
        history: history.nodes,
        device_history: history.devices,
        device_clocks: args.device_clocks.clone(),
        ignore_device_clocks: args.ignore_device_clocks,
        allow_missing_offsets: args.allow_missing_offsets,
        perfetto: args.perfetto.clone(),
        max_bound_ns: args.max_bound,
        overwrite_perfetto: args.force,
    };
    if opts.run_name.is_empty() {
        // The name depends on the origin: plan once (cheap) to learn it.
        let origin = trace::merge::plan_merge(&inputs, &opts)?.origin;
        opts.run_name = default_run_name(origin);
    }
    let total: u64 = inputs
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let bar = progress_bar(total);
    let report = trace::merge(&inputs, &opts, &mut |n| {
        if let Some(b) = &bar {
            b.inc(n)
        }
    })
    .context("trace merge failed; nothing was written")?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    crate::outln!("merged run: {}", report.run_dir.display())?;
    crate::outln!(
        "origin: {} ns ({}), {} -> {} bytes",
        report.origin_ns,
        utc(report.origin_ns),
        report.bytes_in,
        report.bytes_out
    )?;
    for h in &report.hosts {
        print_host(h)?;
        for d in &h.device_planes {
            print_device_plane(d)?;
        }
    }
    if let Some(p) = &args.perfetto {
        crate::outln!("perfetto JSON: {}", p.display())?;
    }
    if let Some(p) = &args.summary {
        let json = serde_json::to_vec_pretty(&trace::MergeSummary::of(&report))?;
        super::files::write_atomically(p, &json, args.force, "--summary")
            .context("the merged run is complete; only its summary failed")?;
        crate::outln!("summary JSON: {}", p.display())?;
    }
    Ok(())
}

/// `trace collectives --strict` found the alignment provably
/// inconsistent: the process exits with [`CausalityViolated::EXIT`] (1
/// stays "could not analyse").
#[derive(Debug, thiserror::Error)]
#[error("{0} causality violation(s): these traces are not consistently aligned")]
pub struct CausalityViolated(pub u64);

impl CausalityViolated {
    pub const EXIT: u8 = 3;
}

/// The job's ranks, read as the inputs are: on their own clocks with
/// `--no-align`, else merged (read as they are, or merged first).
fn read_job(args: &JobInputs) -> anyhow::Result<trace::collectives::inputs::Job> {
    use trace::collectives as coll;
    let files = trace_inputs(&args.inputs)?;
    let job = if args.no_align {
        coll::inputs::read_job(&files, false)?
    } else {
        let merged = files
            .iter()
            .map(|f| coll::inputs::is_merged(f))
            .collect::<Result<Vec<_>, _>>()?;
        if merged.iter().all(|&m| m) {
            coll::inputs::read_job(&files, true)?
        } else {
            anyhow::ensure!(
                !merged.iter().any(|&m| m),
                "some inputs are merged runs and some are not: give one merged run, or the per-host inputs"
            );
            merged_in_scratch(&files, args)?
        }
    };
    Ok(job)
}

fn collectives(args: CollectivesArgs) -> anyhow::Result<()> {
    use trace::collectives::{self as coll, AnalysisOptions};
    let aligned = !args.job.no_align;
    let job = read_job(&args.job)?;
    let analysis = coll::analyse(
        &job.participants,
        job.calls,
        &AnalysisOptions {
            aligned,
            ..AnalysisOptions::default()
        },
    );
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&analysis)?)?;
    } else {
        crate::out!("{}", coll::render::table(&analysis, args.instances))?;
    }
    let violations = analysis.summary.causality_violations;
    if args.strict && violations > 0 {
        return Err(CausalityViolated(violations).into());
    }
    Ok(())
}

/// Merges per-host inputs as `trace merge` would, into a scratch
/// directory that is removed afterwards, and reads the merged ranks.
fn critical_path(args: CriticalPathArgs) -> anyhow::Result<()> {
    use trace::collectives::critical::{self, CriticalOptions};
    use trace::collectives::{self as coll, AnalysisOptions};
    let aligned = !args.job.no_align;
    let job = read_job(&args.job)?;
    let what_if = args
        .what_if
        .iter()
        .map(|w| resolve_what_if(w, &job.participants))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let opts = AnalysisOptions {
        aligned,
        ..AnalysisOptions::default()
    };
    let analysis = coll::analyse(&job.participants, job.calls.clone(), &opts);
    let paths = critical::critical_paths(
        &analysis,
        &job.calls,
        &job.steps,
        &CriticalOptions { what_if },
    );
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&paths)?)?;
    } else {
        crate::out!("{}", coll::critical_render::table(&paths, args.paths))?;
    }
    Ok(())
}

/// `--what-if`'s rank as a participant: a rank number, `#N`, or a host.
fn resolve_what_if(
    w: &WhatIfSpec,
    participants: &[trace::collectives::Participant],
) -> anyhow::Result<trace::collectives::critical::WhatIf> {
    let by_index = w
        .rank
        .strip_prefix('#')
        .and_then(|n| n.parse::<usize>().ok());
    let by_rank = w.rank.parse::<u64>().ok();
    let found: Vec<usize> = (0..participants.len())
        .filter(|&i| {
            let p = &participants[i];
            by_index == Some(i) || (by_rank.is_some() && p.rank == by_rank) || p.host == w.rank
        })
        .collect();
    let known = || {
        participants
            .iter()
            .enumerate()
            .map(|(i, p)| match p.rank {
                Some(r) => format!("#{i} (rank {r}, {})", p.host),
                None => format!("#{i} ({})", p.host),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    match found.as_slice() {
        [participant] => Ok(trace::collectives::critical::WhatIf {
            participant: *participant,
            op: w.op.as_str().into(),
            duration: w.duration,
        }),
        [] => anyhow::bail!(
            "--what-if: no rank {:?} in the inputs; they are {}",
            w.rank,
            known()
        ),
        _ => anyhow::bail!(
            "--what-if: {:?} names several ranks ({}); give #N",
            w.rank,
            known()
        ),
    }
}

fn merged_in_scratch(
    files: &[PathBuf],
    args: &JobInputs,
) -> anyhow::Result<trace::collectives::inputs::Job> {
    let scratch = Scratch::new()?;
    let history = load_histories(&args.history)?;
    let opts = MergeOptions {
        out_dir: scratch.0.clone(),
        run_name: "collectives".into(),
        offsets: args.offsets.iter().cloned().collect(),
        history: history.nodes,
        device_history: history.devices,
        device_clocks: Vec::new(),
        ignore_device_clocks: false,
        allow_missing_offsets: false,
        perfetto: None,
        max_bound_ns: None,
        overwrite_perfetto: false,
    };
    let report = trace::merge(files, &opts, &mut |_| {})
        .context("merging the inputs onto one timeline failed")?;
    let merged = trace::collect_inputs(std::slice::from_ref(&report.run_dir))?;
    let mut job = trace::collectives::inputs::read_job(&merged, true)?;
    // The scratch run is gone when this returns: name the user's files.
    for p in &mut job.participants {
        let input = report
            .hosts
            .iter()
            .find(|h| h.output.display().to_string() == p.trace)
            .map(|h| h.input.display().to_string());
        if let Some(input) = input {
            p.trace = input;
        }
    }
    Ok(job)
}

/// The trace inputs (directories expanded); a history file among them is
/// refused with how to pass it (`--history h/*.jsonl` gives only the first
/// file to --history, the shell's other words become inputs).
fn trace_inputs(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    if let Some(h) = paths.iter().find(|p| is_history_file(p)) {
        anyhow::bail!(
            "{} looks like an agent history, not a trace: pass --history once per file, or --history DIR for a directory of them",
            h.display()
        );
    }
    Ok(trace::collect_inputs(paths)?)
}

fn is_history_file(p: &Path) -> bool {
    p.is_file() && p.extension().is_some_and(|e| e == "jsonl")
}

/// Every history given: files as they are, directories as their *.jsonl
/// files (in name order); one history, whichever file each line was in.
fn load_histories(paths: &[PathBuf]) -> anyhow::Result<history::History> {
    let mut all = history::History::default();
    for path in paths {
        for file in history_files(path)? {
            let h = history::load_all(&file)?;
            all.nodes.extend(h.nodes);
            all.devices.extend(h.devices);
        }
    }
    Ok(all)
}

fn history_files(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("reading the history directory {}", path.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading the history directory {}", path.display()))?;
    files.retain(|f| is_history_file(f));
    files.sort();
    anyhow::ensure!(
        !files.is_empty(),
        "no *.jsonl history files in {}",
        path.display()
    );
    Ok(files)
}

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> std::io::Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "clockmesh-collectives-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One host of the merge summary: where its offset came from, the offset
/// at the session start, its drift over the session and the worst bound.
fn print_host(h: &trace::HostPlacement) -> Result<(), StdoutError> {
    let bound = match h.worst_bound_ns() {
        Some(b) => format!("± {b} ns"),
        None => "bound unknown".into(),
    };
    let placed = if h.events_placed > 0 {
        format!(", {} event(s) placed one by one", h.events_placed)
    } else {
        ", lines shifted whole".into()
    };
    crate::outln!(
        "  {:<24} offset {:>14} ns, drift {:>+10.1} ppb, {bound} ({}, {} anchor(s)){placed}{}",
        process_name(h),
        h.offset_ns,
        h.mean_drift_ppb(),
        h.source.describe(),
        h.map.anchors().len(),
        if h.lines_absolute > 0 {
            format!(", {} absolute line(s)", h.lines_absolute)
        } else {
            String::new()
        }
    )?;
    Ok(())
}

/// The host, or which of its processes (`host@p1`) when it has several.
fn process_name(h: &trace::HostPlacement) -> String {
    let file = h.output.file_name().unwrap_or_default().to_string_lossy();
    match file.split_once(trace::merge::PROCESS_SEPARATOR) {
        Some((host, rest)) => format!("{host}@{}", rest.split('.').next().unwrap_or(rest)),
        None => h.host.clone(),
    }
}

fn print_device_plane(d: &trace::DevicePlaneReport) -> Result<(), StdoutError> {
    let node = if d.node_bound_known {
        "device + node"
    } else {
        "device only: the node offset has no bound"
    };
    crate::outln!(
        "    device plane {:?} <- {} ({}): {} event(s) on {} line(s) mapped, worst bound {} ns ({node})",
        d.plane,
        d.device,
        d.map_domain,
        d.events_mapped,
        d.lines_mapped,
        d.worst_bound_ns
    )?;
    Ok(())
}

/// A byte progress bar on stderr when it is a terminal; none otherwise.
fn progress_bar(total: u64) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} merging [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    Some(bar)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_parse_and_bad_ones_explain() {
        assert_eq!(parse_offset("h-1=-250").unwrap(), ("h-1".into(), -250));
        assert!(parse_offset("h1").unwrap_err().contains("HOST=NS"));
        assert!(
            parse_offset("h1=abc")
                .unwrap_err()
                .contains("not an integer")
        );
    }

    #[test]
    fn device_clock_flag_errors_explain() {
        let s = parse_device_clock("host-a:/device:GPU:0=nvidia:0").unwrap();
        assert_eq!(s.host.as_deref(), Some("host-a"));
        assert!(
            parse_device_clock("/device:GPU:0")
                .unwrap_err()
                .contains("[HOST:]PLANE=DEVICE")
        );
        assert!(parse_device_clock("p=").unwrap_err().contains("no device"));
    }

    #[test]
    fn what_if_flags_parse_and_bad_ones_explain() {
        use trace::collectives::critical::WhatIfDuration;
        let w = parse_what_if("1:aten::mm").unwrap();
        assert_eq!((w.rank.as_str(), w.op.as_str()), ("1", "aten::mm"));
        assert_eq!(w.duration, WhatIfDuration::Median);
        let w = parse_what_if("node-2:fusion.3=1.5ms").unwrap();
        assert_eq!((w.rank.as_str(), w.op.as_str()), ("node-2", "fusion.3"));
        assert_eq!(w.duration, WhatIfDuration::Ns(1_500_000));
        assert_eq!(parse_duration_ns("200us"), Ok(200_000));
        assert_eq!(parse_duration_ns("42"), Ok(42));
        assert!(parse_what_if("aten::mm").unwrap_err().contains("RANK:OP"));
        let w = parse_what_if("#0:c10d::allreduce_").unwrap();
        assert_eq!((w.rank.as_str(), w.op.as_str()), ("#0", "c10d::allreduce_"));
        assert!(parse_what_if(":mm").unwrap_err().contains("RANK:OP"));
        assert!(
            parse_what_if("1:mm=fast")
                .unwrap_err()
                .contains("not a duration")
        );
        assert!(
            parse_what_if("1:mm=-3ms")
                .unwrap_err()
                .contains("out of range")
        );
    }

    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(utc(0), "1970-01-01 00:00:00.000000000 UTC");
        assert_eq!(
            utc(1_795_335_288_621_242_594),
            "2026-11-22 08:14:48.621242594 UTC"
        );
        assert_eq!(default_run_name(0), "merged_1970_01_01_00_00_00");
    }
}
