//! Checking, before touching the bpf() syscall, that this thread may load and
//! attach programs, so the user gets one clear message instead of an EPERM
//! from deep inside the loader.

use super::CaptureError;

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Effective capabilities of the calling thread (capabilities are per thread).
fn effective_capabilities() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

/// The capabilities missing for clockmesh's programs, by name.
pub fn missing_capabilities(eff: u64) -> Vec<&'static str> {
    let has = |cap: u32| eff & (1 << cap) != 0;
    let admin = has(CAP_SYS_ADMIN);
    let mut missing = Vec::new();
    if !(has(CAP_BPF) || admin) {
        missing.push("CAP_BPF");
    }
    if !(has(CAP_PERFMON) || admin) {
        missing.push("CAP_PERFMON");
    }
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    missing
}

pub fn require_bpf_capabilities() -> Result<(), CaptureError> {
    let Some(eff) = effective_capabilities() else {
        return Ok(()); // cannot tell; the loader reports EPERM if it comes to that
    };
    let missing = missing_capabilities(eff);
    if missing.is_empty() {
        Ok(())
    } else {
        Err(CaptureError::NotPermitted(missing.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_like_sets_are_enough() {
        assert!(missing_capabilities(u64::MAX).is_empty());
        let bpf_set = (1 << CAP_BPF) | (1 << CAP_PERFMON) | (1 << CAP_NET_ADMIN);
        assert!(missing_capabilities(bpf_set).is_empty());
        let sys_admin = (1 << CAP_SYS_ADMIN) | (1 << CAP_NET_ADMIN);
        assert!(missing_capabilities(sys_admin).is_empty());
    }

    #[test]
    fn missing_ones_are_named() {
        assert_eq!(
            missing_capabilities(0),
            ["CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN"]
        );
        assert_eq!(
            missing_capabilities(1 << CAP_NET_ADMIN),
            ["CAP_BPF", "CAP_PERFMON"]
        );
    }
}
