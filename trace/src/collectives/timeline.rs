//! What the two parsers share: a rank's calls, and the lookups on one
//! thread's timeline (what came before a call, which step holds it).

use std::path::Path;

use super::model::{CollectiveCall, Participant, StepSpan};

/// One rank's trace, read for the analysis.
#[derive(Debug)]
pub struct RankTrace {
    pub participant: Participant,
    /// Its calls, `participant` still 0 (the caller numbers the ranks).
    pub calls: Vec<CollectiveCall>,
    /// Its steps' spans, by start (few: one per step).
    pub steps: Vec<StepSpan>,
}

/// The steps as the model has them.
pub(crate) fn step_spans(steps: &[Timed<u64>]) -> Vec<StepSpan> {
    steps
        .iter()
        .map(|s| StepSpan {
            step: s.name,
            start_ns: s.start_ns,
            end_ns: s.end_ns,
        })
        .collect()
}

/// A named span of one timeline (epoch ns).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timed<N> {
    pub name: N,
    pub start_ns: i64,
    pub end_ns: i64,
}

/// The span that ended last at or before `t` in `sorted` (sorted by end,
/// then longest first, so an enclosing op wins over its last child).
pub(crate) fn preceding_before<N>(sorted: &[Timed<N>], t: i64) -> Option<&Timed<N>> {
    let i = sorted.partition_point(|s| s.end_ns <= t);
    // Among equal ends, `sorted` puts the longest first: take it.
    let last_end = sorted.get(i.checked_sub(1)?)?.end_ns;
    let first = sorted[..i].partition_point(|s| s.end_ns < last_end);
    sorted.get(first)
}

/// The step whose span holds `t` (`steps` sorted by start, not overlapping).
pub(crate) fn step_at(steps: &[Timed<u64>], t: i64) -> Option<u64> {
    let i = steps.partition_point(|s| s.start_ns <= t);
    let s = steps.get(i.checked_sub(1)?)?;
    (t <= s.end_ns).then_some(s.name)
}

/// [`step_at`], else the step that started last before `t`: an op that a
/// device ran after its step's host span ended (asynchronous dispatch)
/// belongs to the step that launched it, the latest one begun.
pub(crate) fn step_begun_before(steps: &[Timed<u64>], t: i64) -> Option<u64> {
    step_at(steps, t).or_else(|| {
        let i = steps.partition_point(|s| s.start_ns <= t);
        Some(steps.get(i.checked_sub(1)?)?.name)
    })
}

/// The host a file names: `<host><suffix>` (the merge writes
/// `<host>.xplane.pb`, and `<host>@<process>.xplane.pb` for one of a
/// host's several processes), else the name up to its first '.'.
pub(crate) fn file_host(path: &Path, suffix: &str) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let host = name
        .strip_suffix(suffix)
        .unwrap_or_else(|| name.split('.').next().unwrap_or(""));
    let host = host
        .split(crate::merge::PROCESS_SEPARATOR)
        .next()
        .unwrap_or(host);
    if host.is_empty() {
        "host".into()
    } else {
        host.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &'static str, s: i64, e: i64) -> Timed<&'static str> {
        Timed {
            name,
            start_ns: s,
            end_ns: e,
        }
    }

    #[test]
    fn the_enclosing_op_that_ended_last_is_what_came_before() {
        let mut v = vec![
            t("mm", 2, 5),
            t("matmul", 1, 5),
            t("early", 0, 1),
            t("later", 6, 9),
        ];
        v.sort_by_key(|x| (x.end_ns, x.start_ns));
        assert_eq!(preceding_before(&v, 5).unwrap().name, "matmul");
        assert_eq!(preceding_before(&v, 4).unwrap().name, "early");
        assert!(preceding_before(&v, 0).is_none());
        assert_eq!(preceding_before(&v, 100).unwrap().name, "later");
    }

    #[test]
    fn a_time_between_steps_has_no_step() {
        let steps = vec![
            Timed {
                name: 1,
                start_ns: 0,
                end_ns: 10,
            },
            Timed {
                name: 2,
                start_ns: 20,
                end_ns: 30,
            },
        ];
        assert_eq!(step_at(&steps, 5), Some(1));
        assert_eq!(step_at(&steps, 15), None);
        assert_eq!(step_at(&steps, 30), Some(2));
        assert_eq!(step_at(&steps, -1), None);
        assert_eq!(step_begun_before(&steps, 15), Some(1));
        assert_eq!(step_begun_before(&steps, 35), Some(2));
        assert_eq!(step_begun_before(&steps, -1), None);
    }

    #[test]
    fn hosts_are_named_by_the_file() {
        assert_eq!(file_host(Path::new("/a/n1.xplane.pb"), ".xplane.pb"), "n1");
        assert_eq!(file_host(Path::new("x.json"), ".xplane.pb"), "x");
        // Kineto files: one rule for the merge and the analysis.
        assert_eq!(
            crate::kineto::file_host(Path::new("/t/w.123.pt.trace.json")),
            "w"
        );
        assert_eq!(
            crate::kineto::file_host(Path::new("n1.rank1.pt.trace.json")),
            "n1"
        );
        assert_eq!(
            file_host(Path::new("/r/n1@p3.xplane.pb"), ".xplane.pb"),
            "n1"
        );
    }
}
