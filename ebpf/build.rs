//! Rebuild the eBPF object when the linker changes (as in the aya template).
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
