//! A job's traces, read for the analysis: every rank's file by its kind
//! (Kineto JSON or xplane), ranks numbered in input order.

use std::path::{Path, PathBuf};

use super::model::{CollectiveCall, Participant, StepSpan};
use super::{RankTrace, kineto, xplane};
use crate::{FileError, TraceError};

/// Every rank of a job and all their calls.
#[derive(Debug, Default)]
pub struct Job {
    pub participants: Vec<Participant>,
    pub calls: Vec<CollectiveCall>,
    /// Per participant, its steps' spans.
    pub steps: Vec<Vec<StepSpan>>,
}

fn is_kineto(path: &Path) -> bool {
    crate::kineto::is_kineto_path(path)
}

fn with_path<T>(path: &Path, r: Result<T, TraceError>) -> Result<T, FileError> {
    r.map_err(|error| FileError {
        path: path.display().to_string(),
        error,
    })
}

/// Reads one rank's trace. `aligned`: it is a clockmesh merge's output and
/// its stated bound applies; otherwise its own host clock, bound unknown.
pub fn read_rank(path: &Path, aligned: bool) -> Result<RankTrace, FileError> {
    let r = if is_kineto(path) {
        kineto::read(path, aligned)
    } else {
        xplane::read(path, aligned)
    };
    with_path(path, r)
}

/// Whether a file is a clockmesh merge's output.
pub fn is_merged(path: &Path) -> Result<bool, FileError> {
    let r = if is_kineto(path) {
        kineto::is_merged(path)
    } else {
        xplane::is_merged(path)
    };
    with_path(path, r)
}

/// Reads every file (see [`read_rank`]) into one job.
pub fn read_job(files: &[PathBuf], aligned: bool) -> Result<Job, FileError> {
    let mut job = Job::default();
    for path in files {
        let rank = read_rank(path, aligned)?;
        let index = job.participants.len();
        job.participants.push(rank.participant);
        job.steps.push(rank.steps);
        job.calls.extend(rank.calls.into_iter().map(|mut c| {
            c.participant = index;
            c
        }));
    }
    Ok(job)
}
