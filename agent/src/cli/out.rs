//! Standard output without panics. `println!` panics when stdout fails: a
//! closed pipe (`clockmesh trace info … | head -1`) or a full disk
//! (`> /dev/full`). Here a closed pipe ends the command quietly, as it
//! ends `cat` or `grep`; any other failure is an error like any other.

use std::io::Write as _;

/// Standard output failed.
#[derive(Debug, thiserror::Error)]
#[error("writing to standard output")]
pub struct StdoutError(
    #[from]
    #[source]
    pub std::io::Error,
);

impl StdoutError {
    /// The reader went away: nothing left to tell it, not a failure.
    pub fn is_closed_pipe(&self) -> bool {
        self.0.kind() == std::io::ErrorKind::BrokenPipe
    }
}

/// Writes `text` to standard output and flushes it.
pub fn print(text: &str) -> Result<(), StdoutError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// `println!` that returns a [`StdoutError`] instead of panicking.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::out::print(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that returns a [`StdoutError`] instead of panicking.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::out::print(&format!($($arg)*))
    };
}
