//! Test hosts.
