//! Output files written whole or not at all: a temporary file beside the
//! target, moved into place once complete, never replacing an existing
//! file without --force.
use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;

/// Refuses an existing `output` unless `force` (`flag` names the option
/// that chose it).
pub fn refuse_overwrite(output: &Path, force: bool, flag: &str) -> anyhow::Result<()> {
    if !force && output.exists() {
        anyhow::bail!(
            "{} exists; give another {flag} or --force to replace it",
            output.display()
        );
    }
    Ok(())
}

/// Writes a temporary file beside `output`, then moves it into place, so
/// readers never see a partial file. Without `force` the move is a hard
/// link, which fails rather than replace a file created meanwhile.
pub fn write_atomically(
    output: &Path,
    bytes: &[u8],
    force: bool,
    flag: &str,
) -> anyhow::Result<()> {
    let dir = match output.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = output
        .file_name()
        .with_context(|| format!("{} names no file", output.display()))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = write_new(&tmp, bytes).and_then(|()| move_into_place(&tmp, output, force, flag));
    let _ = std::fs::remove_file(&tmp);
    result
}

fn write_new(tmp: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))
}

fn move_into_place(tmp: &Path, output: &Path, force: bool, flag: &str) -> anyhow::Result<()> {
    if force {
        return std::fs::rename(tmp, output)
            .with_context(|| format!("moving the output to {}", output.display()));
    }
    match std::fs::hard_link(tmp, output) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => anyhow::bail!(
            "{} exists; give another {flag} or --force to replace it",
            output.display()
        ),
        // A file system without hard links: the check above the render must do.
        Err(_) if !output.exists() => std::fs::rename(tmp, output)
            .with_context(|| format!("moving the output to {}", output.display())),
        r => r.with_context(|| format!("writing {}", output.display())),
    }
}
