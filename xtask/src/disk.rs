//! Free space on the filesystem a task writes to: a check before a task
//! that needs many gigabytes (so it fails at once and says what to free,
//! not half an hour in with ENOSPC), and a watcher that records how low
//! the free space fell while it ran (the figure the check's need comes from).

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::Duration,
};

use anyhow::{Context as _, bail};

const GIB: f64 = (1u64 << 30) as f64;
/// How often the watcher samples: the big writers (a venv, a target dir)
/// grow over minutes, so a few seconds' resolution misses nothing that matters.
const SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// Bytes an unprivileged writer could still use on `path`'s filesystem.
pub fn free_bytes(path: &Path) -> anyhow::Result<u64> {
    let stat = nix::sys::statvfs::statvfs(path)
        .with_context(|| format!("reading the free space of {}", path.display()))?;
    Ok(stat.blocks_available() * stat.fragment_size())
}

pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB
}

/// Fails, naming `what_to_free`, when `path`'s filesystem has less than
/// `need_gib` free.
pub fn require_free(
    path: &Path,
    need_gib: f64,
    task: &str,
    what_to_free: &str,
) -> anyhow::Result<()> {
    let free = gib(free_bytes(path)?);
    if free < need_gib {
        bail!(
            "{task} needs about {need_gib:.0} GiB free on the filesystem of {} and {free:.1} GiB are free; {what_to_free}",
            path.display()
        );
    }
    Ok(())
}

/// Samples the free space of one filesystem in a thread until dropped.
pub struct Watch {
    at_start: u64,
    lowest: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    sampler: Option<thread::JoinHandle<()>>,
}

impl Watch {
    pub fn start(path: &Path) -> anyhow::Result<Self> {
        let at_start = free_bytes(path)?;
        let lowest = Arc::new(AtomicU64::new(at_start));
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (path, lowest, stop) = (PathBuf::from(path), lowest.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(free) = free_bytes(&path) {
                        lowest.fetch_min(free, Ordering::Relaxed);
                    }
                    thread::sleep(SAMPLE_EVERY);
                }
            })
        };
        Ok(Self {
            at_start,
            lowest,
            stop,
            sampler: Some(sampler),
        })
    }

    /// The most space in use at once since the start, above what was in use then.
    pub fn peak_use(&self) -> u64 {
        self.at_start
            .saturating_sub(self.lowest.load(Ordering::Relaxed))
    }

    pub fn lowest_free(&self) -> u64 {
        self.lowest.load(Ordering::Relaxed)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(sampler) = self.sampler.take() {
            let _ = sampler.join();
        }
    }
}
