//! `cargo xtask bench-accuracy` runs this (release): a seeded family of
//! protocol-mode scenarios at the shipped settings
//! (`clockmesh_sim::family`), each run on its own thread from a shared
//! queue, longest first; per class the spread of p99 at the result, aged
//! p99 and coverage, and the worst members. Options:
//!
//! `--count N` (default 48), `--seed S` (default 1), `--json`,
//! `--threads T` (default: the machine's cores), `--worst K` (default 5),
//! `--only I[,J…]` (run those members alone and print each one's table;
//! with `--json`, their outcomes),
//! `--windows W` (every member run for W windows instead of its own),
//! `--write-scenarios DIR` (every member as `<name>.toml`, runnable by
//! `simulate`; nothing is run), `--baseline FILE` (fail on a class median
//! > 10 % worse than FILE's, or any coverage < 1), `--save-baseline FILE`.
use std::{
    path::PathBuf,
    sync::{Mutex, atomic::AtomicUsize, atomic::Ordering},
    time::Instant,
};

use clockmesh_sim::family::{self, FamilySummary, Member, Outcome};

type Error = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str = "\
usage: bench_accuracy [OPTIONS]   (cargo xtask bench-accuracy -- [OPTIONS])
Runs a seeded family of protocol-mode scenarios at the shipped settings and
prints per class the spread of p99 at the result, aged p99 and coverage.
'unreachable' counts the members whose clocks' wander alone ages a result
past 1.5 x their p99 at the result (an oracle that knew the truth and its
rate at every anchor): no estimator with that p99 meets the aged goal.
  --count N              members (default 48)
  --seed S               the family's seed (default 1)
  --json                 the summary and every member's outcome as JSON
  --threads T            runs at once (default: the machine's cores)
  --worst K              worst members listed (default 5)
  --only I[,J...]        run those members alone, each with its own table
  --windows W            every member runs W windows instead of its own
  --write-scenarios DIR  write each member as DIR/<name>.toml; run nothing
  --baseline FILE        fail on a class median > 10 % worse than FILE's,
                         or on any coverage < 1
  --save-baseline FILE   write this run's summary as a baseline
";

struct Options {
    count: u32,
    seed: u64,
    json: bool,
    threads: usize,
    worst: usize,
    only: Option<Vec<u32>>,
    windows: Option<u32>,
    write_scenarios: Option<PathBuf>,
    baseline: Option<PathBuf>,
    save_baseline: Option<PathBuf>,
}

fn parse() -> Result<Options, Error> {
    let mut o = Options {
        count: 48,
        seed: 1,
        json: false,
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        worst: 5,
        only: None,
        windows: None,
        write_scenarios: None,
        baseline: None,
        save_baseline: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--count" => o.count = number(&a, value()?)?,
            "--seed" => o.seed = number(&a, value()?)?,
            "--json" => o.json = true,
            "--threads" => o.threads = number::<usize>(&a, value()?)?.max(1),
            "--worst" => o.worst = number(&a, value()?)?,
            "--only" => {
                let list = value()?;
                let parsed: Result<Vec<u32>, _> =
                    list.split(',').map(|i| number(&a, i.to_owned())).collect();
                o.only = Some(parsed?);
            }
            "--windows" => o.windows = Some(number(&a, value()?)?),
            "--write-scenarios" => o.write_scenarios = Some(value()?.into()),
            "--baseline" => o.baseline = Some(value()?.into()),
            "--save-baseline" => o.save_baseline = Some(value()?.into()),
            "--help" | "-h" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            _ => return Err(format!("unknown argument {a}\n{USAGE}").into()),
        }
    }
    Ok(o)
}

/// `text` as the number option `flag` takes, or an error naming both.
fn number<T: std::str::FromStr>(flag: &str, text: String) -> Result<T, Error> {
    text.parse()
        .map_err(|_| format!("{flag} takes a whole number, not {text:?}").into())
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_accuracy: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Error> {
    let o = parse()?;
    if let Some(dir) = &o.write_scenarios {
        return write_scenarios(&o, dir);
    }
    let members: Vec<Member> = match &o.only {
        Some(only) if !o.json => return run_only(o.seed, only, o.windows),
        Some(only) => only.iter().map(|&i| family::member(o.seed, i)).collect(),
        None => family::sample(o.seed, o.count),
    };
    let members: Vec<Member> = members
        .into_iter()
        .map(|m| with_windows(m, o.windows))
        .collect();
    let started = Instant::now();
    let outcomes = run_all(&members, o.threads)?;
    let elapsed_s = started.elapsed().as_secs_f64();
    let summary = family::summarize(o.seed, o.count, &outcomes);
    let failures = match &o.baseline {
        Some(path) => {
            let baseline: FamilySummary = serde_json::from_str(&std::fs::read_to_string(path)?)?;
            family::gate(&baseline, &summary)
        }
        None => Vec::new(),
    };
    if let Some(path) = &o.save_baseline {
        std::fs::write(path, serde_json::to_string_pretty(&summary)? + "\n")?;
    }
    if o.json {
        let worst = family::worst(&outcomes, o.worst);
        let out = serde_json::json!({
            "summary": summary, "worst": worst, "outcomes": outcomes,
            "elapsed_s": elapsed_s, "cpu_s": cpu_seconds(), "threads": o.threads,
            "gate_failures": failures,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", table(&summary, &outcomes, o.worst));
        println!(
            "{} scenarios in {elapsed_s:.1} s elapsed, {:.1} s CPU, {} threads on {} cores",
            outcomes.len(),
            cpu_seconds(),
            o.threads,
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
    }
    if !failures.is_empty() {
        eprintln!("accuracy gate failed:\n  {}", failures.join("\n  "));
        std::process::exit(1);
    }
    Ok(())
}

/// This process's user + system CPU time so far (Linux: /proc/self/stat,
/// in the kernel's fixed 100 Hz ticks); NaN elsewhere.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // Fields after the parenthesised name: state is the 3rd, utime the 14th.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |k: usize| fields.get(k - 3).and_then(|v| v.parse::<f64>().ok());
    match (ticks(14), ticks(15)) {
        (Some(user), Some(system)) => (user + system) / 100.0,
        _ => f64::NAN,
    }
}

/// Every member, longest run first so the threads finish together.
fn run_all(members: &[Member], threads: usize) -> Result<Vec<Outcome>, Error> {
    let mut order: Vec<&Member> = members.iter().collect();
    order.sort_by_key(|m| std::cmp::Reverse(m.scenario.windows * m.scenario.nodes));
    let next = AtomicUsize::new(0);
    let done = Mutex::new(Vec::with_capacity(members.len()));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while let Some(m) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let outcome = clockmesh_sim::run_protocol(&m.scenario)
                        .map(|r| Outcome::of(m, &r))
                        .map_err(|e| format!("{}: {e}", m.scenario.name));
                    done.lock().expect("no panics holding it").push(outcome);
                }
            });
        }
    });
    let mut outcomes = done
        .into_inner()
        .expect("threads joined")
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    outcomes.sort_by_key(|o| o.index);
    Ok(outcomes)
}

/// `m` run for `windows` instead of its own length (`--windows`: the same
/// conditions over 1, 3, 10 minutes), its isolation dropped where it no
/// longer fits.
fn with_windows(mut m: Member, windows: Option<u32>) -> Member {
    if let Some(w) = windows {
        m.scenario.windows = w;
        if let Some(c) = &mut m.scenario.leader_change {
            c.after_window = c.after_window.min(w.saturating_sub(1));
        }
        if m.scenario.validate().is_err() {
            m.scenario.isolation = None;
        }
    }
    m
}

fn run_only(seed: u64, only: &[u32], windows: Option<u32>) -> Result<(), Error> {
    for &index in only {
        let m = with_windows(family::member(seed, index), windows);
        let report = clockmesh_sim::run_protocol(&m.scenario)?;
        println!("member {index} ({}):", m.class.name());
        print!("{}", report.table());
    }
    Ok(())
}

fn write_scenarios(o: &Options, dir: &PathBuf) -> Result<(), Error> {
    std::fs::create_dir_all(dir)?;
    let members = match &o.only {
        Some(only) => only.iter().map(|&i| family::member(o.seed, i)).collect(),
        None => family::sample(o.seed, o.count),
    };
    for m in &members {
        let path = dir.join(format!("{}.toml", m.scenario.name));
        let header = format!(
            "# Member {} of the scenario family seed {} (class {}): `bench-accuracy --seed {} --only {}`\n",
            m.index,
            o.seed,
            m.class.name(),
            o.seed,
            m.index
        );
        std::fs::write(&path, header + &toml::to_string(&m.scenario)?)?;
        println!("{}", path.display());
    }
    Ok(())
}

/// The per-class table and the worst members.
fn table(summary: &FamilySummary, outcomes: &[Outcome], worst: usize) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "family seed {} count {} (protocol mode, shipped settings)",
        summary.seed, summary.count
    );
    let _ = writeln!(
        s,
        "{:<22} {:>3}  {:>24}  {:>24}  {:>15}  {:>7} {:>8} {:>11}  after isolation: n, worst reader p50/max",
        "class",
        "n",
        "p99 at result p50/p90/max",
        "aged p99 p50/p90/max",
        "min coverage",
        "in goal",
        "aged≤1.5×",
        "unreachable",
    );
    for c in &summary.classes {
        let spread = |x: &family::Spread| format!("{:.1} / {:.1} / {:.1}", x.p50, x.p90, x.max);
        let _ = writeln!(
            s,
            "{:<22} {:>3}  {:>24}  {:>24}  {:>7.5}/{:>7.5}  {:>3}/{:<3} {:>4}/{:<3} {:>11}  {}",
            c.class,
            c.members,
            spread(&c.p99_ns),
            spread(&c.aged_p99_ns),
            c.min_coverage,
            c.min_aged_coverage,
            c.within_goal,
            c.members,
            c.aged_within_1_5x,
            c.members,
            c.aged_out_of_reach,
            c.recovery_max_ns.map_or(String::new(), |r| format!(
                "{}, {:.0} / {:.0}",
                c.isolations, r.p50, r.max
            ))
        );
    }
    let _ = writeln!(
        s,
        "worst (p99 at result over the class goal); reproduce: bench_accuracy --seed {} --only I, or --write-scenarios DIR --only I then simulate DIR/NAME.toml",
        summary.seed
    );
    for o in family::worst(outcomes, worst) {
        let _ = writeln!(
            s,
            "  #{:<4} {:<44} p99 {:>8.1} ns  aged {:>8.1} ns  drift p99 {:>7.1} ppb  coverage {:.5}/{:.5}",
            o.index,
            o.scenario,
            o.p99_ns,
            o.aged_p99_ns,
            o.drift_p99_ppb,
            o.coverage,
            o.aged_coverage
        );
    }
    let total: f64 = outcomes.iter().map(|o| o.wall_ms / 1e3).sum();
    let _ = writeln!(s, "simulation time summed over runs: {total:.1} s");
    s
}
