//! What the offsets integration tests share: scratch files and the C
//! reader (hook/include/clockmesh.h) built as a checker program.
#![allow(dead_code)] // Each test file uses its own part.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A fresh directory for test `name` (prefix `kind`), and the offsets
/// file's path in it.
pub fn scratch(kind: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("clockmesh-{kind}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("offsets")
}

pub fn hook_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../hook")
}

/// hook/tests/c_reader_check.c, compiled into `out_dir`.
pub fn compile_c_reader(out_dir: &Path) -> PathBuf {
    let exe = out_dir.join("c_reader_check");
    let status = Command::new("cc")
        .args([
            "-O2",
            "-std=c11",
            "-D_GNU_SOURCE",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-I",
        ])
        .arg(hook_dir().join("include"))
        .arg(hook_dir().join("tests/c_reader_check.c"))
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("run cc");
    assert!(status.success(), "cc failed");
    exe
}
