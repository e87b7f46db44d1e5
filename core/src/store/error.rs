//! Store errors: one line each, naming the database file and saying what to do.

use std::fmt;

/// Something the store could not do. Each displays as one line starting with the file.
///
/// `Clone`, because one failed commit is reported to every caller whose event was in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: cannot open the experiment store: {message}")]
    Open { path: String, message: String },
    #[error("{path}: not an SQLite database, so not a knob experiment store; move it away or choose another experiment directory")]
    NotADatabase { path: String },
    #[error("{path}: an SQLite database of another program, not a knob experiment store; move it away or choose another experiment directory")]
    ForeignDatabase { path: String },
    #[error("{path}: written by a newer knob (store schema {found}, this knob reads schemas up to {supported}); upgrade knob to open it")]
    NewerSchema {
        path: String,
        found: i64,
        supported: i64,
    },
    #[error("{path}: another knob process is writing this experiment; stop it (knob stop) before opening it again")]
    Locked { path: String },
    #[error("{path}: cannot write to the experiment store: {message}")]
    Write { path: String, message: String },
    #[error("{path}: cannot read the experiment store: {message}")]
    Read { path: String, message: String },
    /// SQLite found the file corrupt: a disk error, the machine stopping while its disk still
    /// cached writes, or a copy taken while the store was written.
    #[error("{path}: the experiment store is damaged ({message}) and cannot be read; keep a copy of the experiment's folder: each trial's folder in it (trials/ID/) still holds the trial's parameters and its output, metrics included")]
    Damaged { path: String, message: String },
    #[error("{path}: event refused: {reason}")]
    Rejected { path: String, reason: Rejection },
    #[error("{path}: the event log is damaged at event {seq}: {message}")]
    Corrupt {
        path: String,
        seq: u64,
        message: String,
    },
    #[error("{path}: no experiment has been created in this store")]
    NoExperiment { path: String },
    #[error("{path}: the store is closed; the event was not written")]
    Closed { path: String },
}

/// Why the writer refused one event. The caller's bug (or a duplicate delivery), never the
/// disk's: the other events of the batch are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    ExperimentExists,
    NoExperiment,
    UnknownTrial {
        trial_id: String,
    },
    DuplicateTrialId {
        trial_id: String,
    },
    DuplicateParameterId {
        parameter_id: u64,
    },
    /// A trial sequence below the counter: it may have been handed out before.
    SequenceWentBack {
        sequence: u64,
        next: u64,
    },
    /// The trial is not in a status this event can follow.
    WrongTrialStatus {
        trial_id: String,
        status: String,
        event: &'static str,
    },
    WrongAttempt {
        trial_id: String,
        attempt: u32,
        expected: String,
    },
    NotAFinalStatus {
        status: String,
    },
    /// The same (trial, attempt, kind, trial_sequence) was stored before.
    DuplicateMetric {
        trial_id: String,
        attempt: u32,
        trial_sequence: u64,
    },
    BadConfigField {
        field: String,
        message: String,
    },
    /// serde_json could not encode the event (cannot happen with `serde_json::Value` payloads).
    Unencodable {
        message: String,
    },
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ExperimentExists => f.write_str("the experiment was already created"),
            Self::NoExperiment => f.write_str("no experiment has been created yet"),
            Self::UnknownTrial { trial_id } => write!(f, "no trial {trial_id:?}"),
            Self::DuplicateTrialId { trial_id } => write!(f, "trial id {trial_id:?} is taken"),
            Self::DuplicateParameterId { parameter_id } => {
                write!(f, "parameter id {parameter_id} is taken")
            }
            Self::SequenceWentBack { sequence, next } => write!(
                f,
                "trial sequence {sequence} may have been used before (next free is {next})"
            ),
            Self::WrongTrialStatus {
                trial_id,
                status,
                event,
            } => write!(
                f,
                "trial {trial_id:?} is {status}, so {event} cannot follow"
            ),
            Self::WrongAttempt {
                trial_id,
                attempt,
                expected,
            } => write!(
                f,
                "trial {trial_id:?} has no attempt {attempt} here (expected {expected})"
            ),
            Self::NotAFinalStatus { status } => {
                write!(f, "{status} is not a status a trial can end with")
            }
            Self::DuplicateMetric {
                trial_id,
                attempt,
                trial_sequence,
            } => write!(
                f,
                "metric {trial_sequence} of trial {trial_id:?} attempt {attempt} is already stored"
            ),
            Self::BadConfigField { field, message } => {
                write!(f, "config field {field:?}: {message}")
            }
            Self::Unencodable { message } => write!(f, "not encodable as JSON: {message}"),
        }
    }
}

/// `make(path, message)`, or [`StoreError::Damaged`] where SQLite found the file corrupt.
pub(crate) fn or_damaged(
    error: &rusqlite::Error,
    path: &str,
    make: impl FnOnce(String, String) -> StoreError,
) -> StoreError {
    match error.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => StoreError::Damaged {
            path: path.to_string(),
            message: one_line(error),
        },
        _ => make(path.to_string(), one_line(error)),
    }
}

/// An SQLite error as one line (SQLite's messages rarely hold newlines; a path might).
pub(crate) fn one_line(error: &dyn fmt::Display) -> String {
    error.to_string().replace(['\n', '\r'], " ")
}
