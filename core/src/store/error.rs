//! Store errors: one line each, naming the database file and saying what to do.

use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

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
    /// SQLITE_FULL: the filesystem (or a quota) has no room for the next commit. The commit
    /// was rolled back whole, so the store holds every event before it.
    #[error("{path}: the disk is full ({message}); the experiment store holds everything written before this; free space on its filesystem, then continue the experiment with `knob resume`")]
    DiskFull { path: String, message: String },
    /// SQLITE_READONLY: this user may not write the file or its folder (another user's
    /// experiment, a folder shared read-only, a read-only mount). SQLite opens such a file
    /// read-only without a word, so without this the first write failed mid-run with a bare
    /// "attempt to write a readonly database".
    #[error("{path}: this user cannot write the experiment store ({message}); make the experiment's folder and its files writable by this user (or run knob as their owner), then try again")]
    ReadOnly { path: String, message: String },
    #[error("{path}: event refused: {reason}")]
    Rejected { path: String, reason: Rejection },
    #[error("{path}: the event log is damaged at event {seq}: {message}")]
    Corrupt {
        path: String,
        seq: u64,
        message: String,
    },
    /// The store file was deleted (unlinked) while the experiment ran: its folder removed by
    /// hand. Nothing can be recorded any more, and nothing recorded can be read again.
    #[error("{dir}: the experiment's files were deleted while it ran; its trials are stopped and nothing more can be recorded")]
    FilesDeleted { dir: String },
    /// The store file is no longer at its path, though not deleted: the experiment's folder was
    /// moved (renamed) while it ran. The store in the new place holds everything before this.
    #[error("{dir}: the experiment's folder was moved while it ran; its trials are stopped and nothing more is recorded; its store, wherever the folder now is, holds everything before this")]
    FilesMoved { dir: String },
    /// Its `knob create` has not written the first record yet, or was killed before it did
    /// (the registry takes such an experiment back once its process is gone, unless a knob
    /// process holds the folder).
    #[error("{path}: no experiment has been created in this store: its `knob create` has not recorded it yet, or was killed before it did; `knob experiment delete ID --yes` removes it")]
    NoExperiment { path: String },
    #[error("{path}: the store is closed; the event was not written")]
    Closed { path: String },
    /// The file is there but holds nothing (0 bytes): emptied, or a copy cut short. Not an
    /// experiment never created: its create wrote the schema before anything else.
    #[error("{path}: the experiment store is empty (0 bytes: emptied, or a copy cut short); put it back from a backup, or `knob experiment delete ID --yes` forgets the experiment")]
    Emptied { path: String },
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

/// `make(path, message)`, or the error that says what to do where SQLite knows the cause:
/// [`StoreError::Damaged`] for a corrupt file, [`StoreError::DiskFull`] for a full disk,
/// [`StoreError::ReadOnly`] for a file this user may not write.
pub(crate) fn or_known_cause(
    error: &rusqlite::Error,
    path: &str,
    make: impl FnOnce(String, String) -> StoreError,
) -> StoreError {
    match error.sqlite_error_code() {
        Some(rusqlite::ErrorCode::ReadOnly) => StoreError::ReadOnly {
            path: path.to_string(),
            message: one_line(error),
        },
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => StoreError::Damaged {
            path: path.to_string(),
            message: one_line(error),
        },
        // A row whose bytes SQLite reads but that does not hold what knob wrote there (JSON
        // that does not parse, a number as text): damaged bytes inside a page.
        None if matches!(error, rusqlite::Error::FromSqlConversionFailure(..)) => {
            StoreError::Damaged {
                path: path.to_string(),
                message: format!("a row does not hold what knob wrote: {}", one_line(error)),
            }
        }
        _ => match full_disk(error, Path::new(path)) {
            Some(message) => StoreError::DiskFull {
                path: path.to_string(),
                message,
            },
            None => make(path.to_string(), one_line(error)),
        },
    }
}

/// The error's one line if it means that the filesystem holding `path` is full: SQLITE_FULL, or
/// an I/O error while less than [`NEARLY_FULL_BYTES`] are free there (SQLite reports a full
/// disk met while growing the `-shm` or `-wal` file as a plain "disk I/O error").
pub(crate) fn full_disk(error: &rusqlite::Error, path: &Path) -> Option<String> {
    match error.sqlite_error_code()? {
        rusqlite::ErrorCode::DiskFull => Some(one_line(error)),
        rusqlite::ErrorCode::SystemIoFailure => match available_bytes(path) {
            Some(free) if free < NEARLY_FULL_BYTES => {
                Some(format!("{}; {free} bytes free there", one_line(error)))
            }
            _ => None,
        },
        _ => None,
    }
}

/// Less room than this on the store's filesystem makes an I/O error a full disk: SQLite needs
/// 32 KiB for the `-shm` file and room for its pages.
const NEARLY_FULL_BYTES: u64 = 1 << 20;

/// The bytes an unprivileged writer may still use on the filesystem holding `path` (the file,
/// or its folder while the file does not exist); `None` where the filesystem does not say.
fn available_bytes(path: &Path) -> Option<u64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let c_path = std::ffi::CString::new(existing.as_os_str().as_bytes()).ok()?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and a buffer of the type statvfs fills.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), stats.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs succeeded, so it filled the buffer.
    let stats = unsafe { stats.assume_init() };
    // A filesystem without block counts (proc, some FUSE) says nothing about its room.
    // The casts are no-ops on 64-bit Linux, not on every target libc.
    #[allow(clippy::unnecessary_cast)]
    (stats.f_blocks > 0).then(|| (stats.f_bavail as u64).saturating_mul(stats.f_frsize as u64))
}

/// An SQLite error as one line (SQLite's messages rarely hold newlines; a path might).
pub(crate) fn one_line(error: &dyn fmt::Display) -> String {
    error.to_string().replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_this_user_cannot_write_says_so_and_what_to_do() {
        // A connection opened only for reading fails a write as SQLite does for a file or
        // folder this user may not write (root may write any, so a chmod would not show it).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("experiment.db");
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE t (x INTEGER)")
            .unwrap();
        let connection = rusqlite::Connection::open_with_flags(
            &path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap();
        let error = connection
            .execute("INSERT INTO t VALUES (1)", [])
            .expect_err("a read-only connection cannot write");
        let error = or_known_cause(&error, "/data/x/experiment.db", |path, message| {
            StoreError::Write { path, message }
        });
        assert!(matches!(error, StoreError::ReadOnly { .. }), "{error:?}");
        let line = error.to_string();
        assert!(
            line.starts_with("/data/x/experiment.db: this user cannot write"),
            "{line}"
        );
        assert!(line.contains("writable by this user"), "{line}");
        assert!(!line.contains('\n'), "{line}");
    }

    #[test]
    fn a_full_disk_says_so_and_how_to_go_on() {
        // SQLite reports a commit beyond `max_page_count` as SQLITE_FULL, the code a full
        // filesystem gives.
        let connection = rusqlite::Connection::open_in_memory().unwrap();
        connection
            .execute_batch("CREATE TABLE t (blob BLOB); PRAGMA max_page_count = 4;")
            .unwrap();
        let error = (0..64)
            .find_map(|_| {
                connection
                    .execute("INSERT INTO t VALUES (zeroblob(4096))", [])
                    .err()
            })
            .expect("the page limit stops the inserts");
        let error = or_known_cause(&error, "/data/x/experiment.db", |path, message| {
            StoreError::Write { path, message }
        });
        assert!(matches!(error, StoreError::DiskFull { .. }), "{error:?}");
        let line = error.to_string();
        assert!(
            line.starts_with("/data/x/experiment.db: the disk is full"),
            "{line}"
        );
        assert!(line.contains("knob resume"), "{line}");
        assert!(!line.contains('\n'), "{line}");
    }
}
