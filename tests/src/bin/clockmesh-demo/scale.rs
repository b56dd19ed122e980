//! `clockmesh-demo bench-scale`: the per-window coordination at N simulated
//! members, measured on this machine against a real etcd through the
//! agent's own etcd backend, and against the relay's leader (a real
//! `core::Node`) on loopback (docs/coordination.md, issue 34).

use std::time::Duration;

use anyhow::Context as _;
use clap::ValueEnum;
use clockmesh_core::node::Exchange;
use serde::Serialize;

mod etcd_run;
mod fault_view;
mod metrics;
mod relay;
mod truth;

#[derive(clap::Args, Debug)]
pub struct ScaleArgs {
    /// Member counts of the etcd runs (a fresh etcd each), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,2000,5000,10000")]
    members: Vec<usize>,
    /// Windows measured per run.
    #[arg(long, default_value_t = 5)]
    windows: u64,
    /// Leading windows left out of the accuracy figures.
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    /// Windows before etcd's counters (requests, bytes, CPU) are first
    /// read: more than 1 leaves the members' first reads out, for the
    /// steady state.
    #[arg(long, default_value_t = 1)]
    settle_windows: u64,
    /// Window length, s (the agent's `probe_window_s`).
    #[arg(long, default_value_t = 1)]
    window_s: u64,
    /// Every member also reads the member list and the leader this often,
    /// s, as the agent's runtime does every 2 s (through etcd watches since
    /// issue 34). 0: not, so the table shows the per-window exchange alone.
    #[arg(long, default_value_t = 2)]
    membership_every_s: u64,
    /// How fits and results travel in the etcd runs: `relay` (what the
    /// agent ships: etcd carries membership and the election only; the
    /// per-window figures are the relay run's) or `store` (through etcd,
    /// as the agent did before, measured for comparison).
    #[arg(long, value_enum, default_value_t = ExchangeArg::Relay)]
    exchange: ExchangeArg,
    /// Kill etcd (SIGKILL) this many windows after the first measured one
    /// and start it again on its data (the relay exchange's etcd runs).
    #[arg(long)]
    restart_etcd_at: Option<u64>,
    /// Kill the leader's agent (no leave: its lease runs out after 10 s)
    /// this many windows after the first measured one. etcd runs: a seat
    /// holder takes over and hands the places out again. Relay run: member
    /// 1 (following the leader's results as a member) leads
    /// `--takeover-s` later and continues the timeline; every member's
    /// reader is checked against the first leader's clock.
    #[arg(long)]
    kill_leader_at: Option<u64>,
    /// Relay run with `--kill-leader-at`: seconds from the kill until the
    /// successor leads. Default: with `--path both`, what the etcd runs
    /// before it measured (the time until every member named the new
    /// leader, rounded up; the largest over their member counts), else 12
    /// (the campaign lease's 10 s, then a refresh).
    #[arg(long)]
    takeover_s: Option<u64>,
    /// TTL of each etcd member's lease, s (the agent's `etcd_member_ttl_s`:
    /// a keep-alive every third of it). The seat holders' leases keep the
    /// agent's 10 s.
    #[arg(long, default_value_t = clockmesh::discovery::ETCD_MEMBER_TTL_S)]
    member_ttl_s: u64,
    /// Out-neighbours per member in the probe graph (the agent's `degree`).
    #[arg(long, default_value_t = 4)]
    degree: usize,
    /// Which paths to run.
    #[arg(long, value_enum, default_value_t = Path::Both)]
    path: Path,
    /// Members of the relay run.
    #[arg(long, default_value_t = 10_000)]
    relay_members: usize,
    /// `--path both` with one etcd member count: run the relay alongside
    /// the etcd run, in this process on the same cores, starting this many
    /// seconds after the etcd run begins (so that its windows fall in
    /// etcd's measured span); without it the relay runs after the etcd
    /// runs. Not with `--kill-leader-at` (the relay's takeover is taken from
    /// the etcd run).
    #[arg(long)]
    relay_alongside_after_s: Option<u64>,
    /// Receive buffer forced on the relay leader's socket, bytes (default:
    /// what the agent sets on its probe socket).
    #[arg(long)]
    relay_rcvbuf: Option<usize>,
    /// Extra etcd flags, e.g. `--etcd-arg=--auto-compaction-retention=1m`.
    #[arg(long = "etcd-arg", allow_hyphen_values = true)]
    etcd_args: Vec<String>,
    /// Members sharing one member's two etcd connections (each with its
    /// own lease, keep-alive and campaign). Default: 1, every member its
    /// own, unless the open-file limit (this process's and etcd's) cannot
    /// hold two per member; then as few as fit.
    #[arg(long)]
    members_per_connection: Option<usize>,
    /// Registrations in flight at once while the members start.
    #[arg(long, default_value_t = 64)]
    start_concurrency: usize,
    /// Seed of the truth (clocks, edges) and of the fits' noise.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print every figure as JSON instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ExchangeArg {
    Relay,
    Store,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Path {
    Etcd,
    Relay,
    Both,
}

#[derive(Serialize)]
struct Output {
    host: Host,
    etcd: Vec<etcd_run::EtcdReport>,
    relay: Option<relay::RelayReport>,
    /// The relay's successor led this long after the kill, and why.
    relay_takeover: Option<Takeover>,
}

#[derive(Serialize)]
struct Takeover {
    s: u64,
    from: String,
}

/// Without `--takeover-s`, the relay's successor leads when the etcd runs
/// of this invocation saw every member name the new leader (the slowest of
/// them, rounded up), else after the campaign lease's 10 s and a refresh.
fn takeover(asked: Option<u64>, etcd: &[etcd_run::EtcdReport]) -> Takeover {
    if let Some(s) = asked {
        return Takeover {
            s,
            from: "--takeover-s".into(),
        };
    }
    let measured = etcd
        .iter()
        .flat_map(|r| r.faults.iter().map(move |f| (r.members, f)))
        .filter(|(_, f)| f.fault == fault_view::Fault::LeaderKilled)
        .max_by(|a, b| {
            a.1.all_on_final_leader_after_s
                .total_cmp(&b.1.all_on_final_leader_after_s)
        });
    match measured {
        Some((n, f)) => Takeover {
            s: (f.all_on_final_leader_after_s.ceil() as u64).max(1),
            from: format!(
                "the etcd run at {n} members: every member named the new leader {:.1} s after the kill",
                f.all_on_final_leader_after_s
            ),
        },
        None => Takeover {
            s: 12,
            from: "default: the campaign lease's 10 s and a refresh".into(),
        },
    }
}

#[derive(Serialize)]
struct Host {
    cpu_model: String,
    cpus: usize,
    shares_the_cpus: &'static str,
}

const SHARED: &str = "etcd, the harness's simulated members and their client tasks, the \
leader's thread (and, for the relay, the senders' thread) on the same cores; another \
engineer's build may have been running";

const SHARED_ALONGSIDE: &str = "etcd, the harness's simulated etcd members and their client \
tasks, the etcd leader's thread, and the relay run alongside (its leader's and senders' threads) \
on the same cores; the harness CPU figure counts the relay's threads too";

/// Current CLOCK_REALTIME, ns.
pub fn realtime_ns() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// Sleeps until CLOCK_REALTIME reads `t_ns`.
pub async fn sleep_until_realtime(t_ns: i64) {
    let now = realtime_ns();
    if t_ns > now {
        tokio::time::sleep(Duration::from_nanos((t_ns - now) as u64)).await;
    }
}

/// Each member holds two etcd connections and each relay member a
/// socket: raises the open-file limit toward `want` — the hard limit too
/// where this process may (root), else as far as the hard limit lets it;
/// returns the limit now in force.
fn raise_nofile(want: u64) -> anyhow::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid rlimit to fill and read; `both` is a valid
    // rlimit to read.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            anyhow::bail!("getrlimit: {}", std::io::Error::last_os_error());
        }
        if want > lim.rlim_max {
            let both = libc::rlimit {
                rlim_cur: want,
                rlim_max: want,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &both) == 0 {
                return Ok(want);
            }
        }
        let target = want.min(lim.rlim_max);
        if lim.rlim_cur >= target {
            return Ok(lim.rlim_cur);
        }
        let raised = libc::rlimit {
            rlim_cur: target,
            rlim_max: lim.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
            anyhow::bail!(
                "raising the open-file limit to {target}: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(target)
    }
}

/// Members per connection pair: 1 (each its own, as agents) unless this
/// process or etcd (which inherits the limit) could not hold 2 per member.
fn members_per_connection(members: usize, asked: Option<usize>, nofile: u64) -> usize {
    if let Some(m) = asked {
        return m.max(1);
    }
    // Room for etcd's own files and the harness's.
    let room = nofile.saturating_sub(2048).max(2) as usize;
    (2 * members).div_ceil(room).max(1)
}

fn host() -> Host {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    Host {
        cpu_model: model,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        shares_the_cpus: SHARED,
    }
}

pub fn run(args: ScaleArgs) -> anyhow::Result<()> {
    check(&args)?;
    let most = args
        .members
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(args.relay_members);
    let together = args.relay_alongside_after_s.is_some();
    // The relay's sockets, where it runs in this process beside etcd's members.
    let relay_files = if together {
        args.relay_members as u64
    } else {
        0
    };
    let nofile = raise_nofile(4 * most as u64 + 2 * relay_files + 4096)?;
    let mut out = Output {
        host: host(),
        etcd: Vec::new(),
        relay: None,
        relay_takeover: None,
    };
    if together {
        out.host.shares_the_cpus = SHARED_ALONGSIDE;
    }
    let alongside = args.relay_alongside_after_s.map(|after| {
        let cfg = relay_cfg(&args, takeover(args.takeover_s, &[]).s);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(after));
            eprintln!(
                "bench-scale: relay, {} members, alongside etcd …",
                cfg.members
            );
            relay::run(&cfg).context("relay run alongside etcd")
        })
    });
    if args.path != Path::Relay {
        for &n in &args.members {
            let per = members_per_connection(
                n,
                args.members_per_connection,
                nofile.saturating_sub(relay_files),
            );
            let r = run_etcd(&args, n, per)?;
            out.etcd.push(r);
        }
    }
    if let Some(t) = alongside {
        let r = t
            .join()
            .map_err(|_| anyhow::anyhow!("the relay thread panicked"))??;
        out.relay = Some(r);
    } else if args.path != Path::Etcd {
        eprintln!("bench-scale: relay, {} members …", args.relay_members);
        let takeover = takeover(args.takeover_s, &out.etcd);
        let cfg = relay_cfg(&args, takeover.s);
        out.relay = Some(relay::run(&cfg).context("relay run")?);
        if args.kill_leader_at.is_some() {
            out.relay_takeover = Some(takeover);
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_tables(&out);
    }
    Ok(())
}

/// The arguments' rules a flag's own parser cannot check.
fn check(args: &ScaleArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.windows > args.warmup, "--windows must exceed --warmup");
    anyhow::ensure!(args.window_s >= 1, "--window-s: at least 1");
    anyhow::ensure!(args.degree >= 1, "--degree: at least 1");
    anyhow::ensure!(
        args.members.iter().all(|&n| n >= 2),
        "--members: each count at least 2 (a leader and one more)"
    );
    anyhow::ensure!(
        (2..=60_000).contains(&args.relay_members),
        "--relay-members: 2 to 60000 (one loopback address each)"
    );
    if args.relay_alongside_after_s.is_some() {
        anyhow::ensure!(
            args.path == Path::Both && args.members.len() == 1,
            "--relay-alongside-after-s: with --path both and one --members count"
        );
        anyhow::ensure!(
            args.kill_leader_at.is_none(),
            "--relay-alongside-after-s: not with --kill-leader-at (the relay's takeover comes from the etcd run)"
        );
    }
    Ok(())
}

/// One etcd run at `n` members, `per` members to a connection pair.
fn run_etcd(args: &ScaleArgs, n: usize, per: usize) -> anyhow::Result<etcd_run::EtcdReport> {
    eprintln!("bench-scale: etcd, {n} members, {} windows …", args.windows);
    let cfg = etcd_run::EtcdRunCfg {
        members: n,
        windows: args.windows,
        warmup: args.warmup,
        settle_windows: args.settle_windows,
        window_s: args.window_s,
        membership_every_s: args.membership_every_s,
        degree: args.degree,
        seed: args.seed,
        etcd_args: args.etcd_args.clone(),
        start_concurrency: args.start_concurrency,
        members_per_connection: per,
        exchange: match args.exchange {
            ExchangeArg::Relay => Exchange::Relay,
            ExchangeArg::Store => Exchange::Store,
        },
        restart_etcd_at: args.restart_etcd_at,
        kill_leader_at: args.kill_leader_at,
        member_ttl_s: args.member_ttl_s,
    };
    let r = etcd_run::run(&cfg).with_context(|| format!("etcd run at {n} members"))?;
    if !args.json {
        eprintln!("{}", serde_json::to_string(&r)?);
    }
    Ok(r)
}

fn relay_cfg(args: &ScaleArgs, takeover_s: u64) -> relay::RelayCfg {
    relay::RelayCfg {
        members: args.relay_members,
        windows: args.windows,
        warmup: args.warmup,
        window_s: args.window_s,
        degree: args.degree,
        seed: args.seed,
        rcvbuf: args.relay_rcvbuf,
        kill_leader_at: args.kill_leader_at,
        takeover_s,
    }
}

fn print_tables(out: &Output) {
    println!(
        "bench-scale on {} × {} ({})",
        out.host.cpus, out.host.cpu_model, out.host.shares_the_cpus
    );
    if let Some(first) = out.etcd.first() {
        println!(
            "\netcd (one real etcd 3.4 on loopback, fresh per column; {} s windows, {} windows each, degree {}, member list read every {}):",
            first.window_s,
            first.windows,
            first.degree,
            if first.membership_every_s == 0 {
                "never".to_string()
            } else {
                format!("{} s", first.membership_every_s)
            }
        );
        print_etcd(&out.etcd);
        for r in &out.etcd {
            print_faults(r);
        }
    }
    if let Some(r) = &out.relay {
        print_relay(r);
    }
    if let Some(t) = &out.relay_takeover {
        println!(
            "(the relay's successor led {} s after the kill: {})",
            t.s, t.from
        );
    }
}

/// What the members saw of each fault of a run.
fn print_faults(r: &etcd_run::EtcdReport) {
    if r.etcd_restarted {
        println!(
            "\n({} members: etcd restarted in the run, so its request, byte, fsync and CPU figures above cover only what followed)",
            r.members
        );
    }
    for f in &r.faults {
        println!(
            "\n{} members, {} at {:.1} s: after it {} refreshes, {:.2} % with their place, {:.2} % knowing a leader; all on {} within {:.1} s (successor's hand-outs, ms: {})",
            r.members,
            f.fault,
            f.at_s,
            f.refreshes_after,
            100.0 * f.placed_share_after,
            100.0 * f.leader_known_share_after,
            f.final_leader.as_deref().unwrap_or("no leader"),
            f.all_on_final_leader_after_s,
            q(&r.places.successor_hand_out_ms),
        );
        println!(
            "  s after the first window | refreshes | with their place | naming the final leader"
        );
        for (t, n, placed, on_final) in &f.timeline {
            println!(
                "  {t:>24.0} | {n:>9} | {:>15.1} % | {:>21.1} %",
                100.0 * placed,
                100.0 * on_final
            );
        }
    }
}

fn q(x: &metrics::Quantiles) -> String {
    if x.n == 0 {
        return "-".into();
    }
    format!("{:.1} / {:.1} / {:.1}", x.p50, x.p99, x.max)
}

type Row = (&'static str, fn(&etcd_run::EtcdReport) -> String);

fn print_etcd(rs: &[etcd_run::EtcdReport]) {
    for (name, f) in traffic_rows().iter().chain(outcome_rows()) {
        print!("{name:<48}");
        for r in rs {
            print!(" | {:>22}", f(r));
        }
        println!();
    }
}

/// Requests, bytes and latencies.
fn traffic_rows() -> &'static [Row] {
    &[
        ("members", |r| r.members.to_string()),
        ("fits and results travel over", |r| {
            match r.exchange {
                "relay" => "the relay (below)",
                _ => "etcd (store)",
            }
            .to_string()
        }),
        ("member lease TTL, s (keep-alive every third)", |r| {
            r.member_ttl_s.to_string()
        }),
        ("mean out-edges per member", |r| {
            format!("{:.2}", r.mean_out_edges)
        }),
        ("etcd connections (members per connection pair)", |r| {
            format!("{} ({})", r.etcd_connections, r.members_per_connection)
        }),
        ("start (connect + register all), s", |r| {
            format!("{:.0}", r.start_s)
        }),
        ("etcd requests / window", |r| {
            format!("{:.0}", r.etcd_requests_per_window)
        }),
        ("  of which Put / Range / Txn / LeaseKeepAlive", |r| {
            let m = |k: &str| {
                r.etcd_requests_by_method_per_window
                    .get(k)
                    .copied()
                    .unwrap_or(0.0)
            };
            format!(
                "{:.0} / {:.0} / {:.0} / {:.0}",
                m("Put"),
                m("Range"),
                m("Txn"),
                m("LeaseKeepAlive")
            )
        }),
        ("etcd gRPC bytes in / out per window, MB", |r| {
            format!(
                "{:.2} / {:.2}",
                r.etcd_rx_bytes_per_window / 1e6,
                r.etcd_tx_bytes_per_window / 1e6
            )
        }),
        ("harness payload put / read per window, MB", |r| {
            format!(
                "{:.2} / {:.2}",
                r.harness_put_bytes_per_window / 1e6,
                r.harness_read_bytes_per_window / 1e6
            )
        }),
        ("put edges, ms p50/p99/max", |r| q(&r.put_edges_ms)),
        ("  puts done after the solve phase / window", |r| {
            format!("{:.0}", r.late_puts_per_window)
        }),
        ("read own result, ms", |r| q(&r.read_result_ms)),
        (
            "member list + leader read, ms",
            |r| q(&r.members_refresh_ms),
        ),
    ]
}

/// The leader's work, the members' results, etcd's and the harness's cost.
fn outcome_rows() -> &'static [Row] {
    &[
        ("leader fetch (range of edges/), ms", |r| q(&r.fetch_ms)),
        ("  fetched per window, MB", |r| {
            format!("{:.2}", r.fetch_bytes / 1e6)
        }),
        ("leader solve, ms", |r| q(&r.solve_ms)),
        ("leader put results (txns), ms", |r| {
            format!("{} ({})", q(&r.put_results_ms), r.put_results_txns)
        }),
        ("leader solve phase start → results written, ms", |r| {
            q(&r.solve_start_to_published_ms)
        }),
        ("leader thread CPU, cores", |r| {
            format!("{:.2}", r.leader_cpu_cores)
        }),
        ("result after window end, ms p50/p99/max", |r| {
            q(&r.result_after_end_ms)
        }),
        ("member-windows missing their result", |r| {
            if r.member_windows == 0 {
                return "-".into();
            }
            format!("{:.1} % of {}", 100.0 * r.missed_share, r.member_windows)
        }),
        ("|error| vs truth, ns p50/p99/max", |r| q(&r.abs_error_ns)),
        ("bound coverage", |r| format!("{:.4}", r.coverage)),
        ("members with their place right / wrong / none", |r| {
            format!(
                "{} / {} / {}",
                r.places.members_placed_right,
                r.places.members_placed_wrong,
                r.places.members_without_place
            )
        }),
        ("  seat holders (the whole list)", |r| {
            r.places.seat_holders.to_string()
        }),
        ("  refresh that first found the place p50/p99/max", |r| {
            q(&r.places.refreshes_to_place)
        }),
        ("leader refresh (list + election), ms", |r| {
            q(&r.places.leader_refresh_ms)
        }),
        ("leader hand-out of places, ms", |r| {
            q(&r.places.leader_hand_out_ms)
        }),
        ("request errors (registrations retried, rejoins)", |r| {
            format!(
                "{} ({}, {})",
                r.request_errors, r.register_retries, r.rejoins
            )
        }),
        ("etcd WAL fsync mean ms (fsyncs / window)", |r| {
            format!(
                "{:.2} ({:.0})",
                r.etcd_wal_fsync_ms, r.etcd_wal_fsyncs_per_window
            )
        }),
        ("etcd backend commit mean, ms", |r| {
            format!("{:.2}", r.etcd_backend_commit_ms)
        }),
        ("etcd CPU, cores", |r| format!("{:.2}", r.etcd_cpu_cores)),
        ("etcd RSS, MiB", |r| format!("{:.0}", r.etcd_rss_mib)),
        ("etcd DB start → end, MiB", |r| {
            format!("{:.1} → {:.1}", r.etcd_db_mib_start, r.etcd_db_mib_end)
        }),
        ("etcd DB growth / window, MiB (quota)", |r| {
            format!(
                "{:.2} ({:.0})",
                r.etcd_db_growth_mib_per_window, r.etcd_quota_mib
            )
        }),
        ("etcd keys compacted in the run", |r| {
            format!("{:.0}", r.etcd_compactions)
        }),
        ("harness CPU (members + leader), cores", |r| {
            format!("{:.2}", r.harness_cpu_cores)
        }),
        ("harness RSS, MiB", |r| format!("{:.0}", r.harness_rss_mib)),
    ]
}

fn print_relay(r: &relay::RelayReport) {
    println!(
        "\nrelay (a real core::Node leader on one UDP socket, loopback, {} members, {} windows, rcvbuf {} B):",
        r.members, r.windows, r.rcvbuf_bytes
    );
    let rows: Vec<(&str, String)> = vec![
        (
            "fit datagrams sent / window",
            format!(
                "{:.0} ({:.2} MB)",
                r.fits_sent_per_window,
                r.fit_bytes_per_window / 1e6
            ),
        ),
        ("  burst sent in, ms p50/p99/max", q(&r.burst_ms)),
        (
            "fits the leader took / window",
            format!("{:.0}", r.fits_received_per_window),
        ),
        (
            "dropped at the leader's socket / window",
            format!("{:.0}", r.socket_drops_per_window),
        ),
        (
            "host UDP RcvbufErrors / window",
            format!("{:.0}", r.udp_rcvbuf_errors_per_window),
        ),
        ("leader socket drain per tick, ms", q(&r.leader_drain_ms)),
        (
            "leader solve tick (solve + send results), ms",
            q(&r.solve_tick_ms),
        ),
        (
            "results sent / received per window",
            format!(
                "{:.0} / {:.0}",
                r.results_sent_per_window, r.results_received_per_window
            ),
        ),
        (
            "result sent after window end, ms",
            q(&r.result_after_end_ms),
        ),
        (
            "member-windows missing their result",
            format!("{:.1} %", 100.0 * r.missed_share),
        ),
        ("|error| vs truth, ns p50/p99/max", q(&r.abs_error_ns)),
        ("bound coverage", format!("{:.4}", r.coverage)),
        (
            "leader thread CPU, cores",
            format!("{:.2}", r.leader_cpu_cores),
        ),
        (
            "senders' thread CPU, cores",
            format!("{:.2}", r.senders_cpu_cores),
        ),
        (
            "readers: checks, answered, in holdover",
            format!(
                "{} ({:.2} %, {:.2} %)",
                r.readers.checks,
                100.0 * r.readers.available,
                100.0 * r.readers.holdover
            ),
        ),
        (
            "  within bound of the first leader's clock",
            format!("{:.4}", r.readers.coverage),
        ),
        ("  |error|, ns p50/p99/max", q(&r.readers.abs_error_ns)),
        ("  bound, ns p50/p99/max", q(&r.readers.bound_ns)),
        (
            "successor's first result after the kill, s (results)",
            r.readers.successor_first_result_s.map_or("-".into(), |s| {
                format!("{s:.1} ({})", r.readers.successor_results)
            }),
        ),
    ];
    for (name, v) in rows {
        println!("{name:<48} | {v}");
    }
}
