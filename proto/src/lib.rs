//! Placeholder; the publication issue fills this crate.
