//! What both trace benches need: where the inputs live, and this process's
//! peak memory and CPU time read from /proc, printed by a child as
//! `key=value` lines and parsed back by the parent.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The cargo target directory (the inputs are cached there).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// Peak resident memory of this process (KiB), from /proc.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU seconds (user + system) of this process so far, from /proc.
pub fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime is the
    // 12th, stime the 13th, in clock ticks (100 per second on Linux).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    f.iter().sum::<f64>() / 100.0
}

/// The value of `key=` in a child's output (NaN when missing).
pub fn parse(out: &str, key: &str) -> f64 {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Runs this bench binary again with `args` (a child mode, so its peak
/// memory is its own) and returns what it printed; panics with its stderr
/// if it failed.
pub fn run_child<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
