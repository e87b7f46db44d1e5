//! The database file: connections, pragmas, the schema and its version, the writer lock.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension};

use super::error::{one_line, StoreError};
use super::event::Counters;

/// Bumped on any change to the tables below or to the JSON form of the event types.
pub(crate) const SCHEMA_VERSION: i64 = 1;

/// `PRAGMA application_id`: "knob" in ASCII, so `file(1)` and knob itself can tell a knob
/// store from any other SQLite file.
const APPLICATION_ID: i64 = 0x6b6e_6f62;

/// The writer holds an exclusive SQLite lock on this file for as long as it lives, so two
/// managers can never write one experiment. It is a separate file because an exclusive lock on
/// the store itself would shut out the readers. The OS drops the lock when the process dies.
pub(crate) const LOCK_FILE_NAME: &str = "experiment.db.writer-lock";

const SCHEMA: &str = r"
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;

CREATE TABLE counters (name TEXT PRIMARY KEY, next INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO counters (name, next) VALUES ('event_seq', 1), ('trial_sequence', 0), ('parameter_id', 0);

-- The log, but for metrics. payload is the StoreEvent as JSON; the other columns are copies
-- for queries.
CREATE TABLE events (
    seq      INTEGER PRIMARY KEY,
    time_ms  INTEGER NOT NULL,
    kind     TEXT NOT NULL,
    trial_id TEXT,
    payload  TEXT NOT NULL
);
CREATE INDEX events_by_trial ON events (trial_id, seq) WHERE trial_id IS NOT NULL;

-- The log's metric events, typed columns only (they are most of the volume). seq shares the
-- sequence of events.seq; 'since N' is a range scan of the primary key.
CREATE TABLE metrics (
    seq            INTEGER PRIMARY KEY,
    time_ms        INTEGER NOT NULL,
    trial_id       TEXT NOT NULL,
    attempt        INTEGER NOT NULL,
    kind           TEXT NOT NULL CHECK (kind IN ('intermediate', 'final')),
    trial_sequence INTEGER NOT NULL,
    raw            TEXT NOT NULL,
    value          REAL
);
CREATE UNIQUE INDEX metrics_by_trial ON metrics (trial_id, attempt, kind, trial_sequence);

-- Materialized views of the log, updated in the transaction of each event: readers list and
-- rank trials without replaying the log. Replay never reads them.
CREATE TABLE experiment (
    singleton      INTEGER PRIMARY KEY CHECK (singleton = 1),
    id             TEXT NOT NULL,
    config         TEXT NOT NULL,
    start_time_ms  INTEGER NOT NULL,
    status         TEXT NOT NULL,
    status_message TEXT,
    updated_ms     INTEGER NOT NULL
);

CREATE TABLE trials (
    id             TEXT PRIMARY KEY,
    sequence       INTEGER NOT NULL UNIQUE,
    parameter_id   INTEGER NOT NULL UNIQUE,
    parameters     TEXT NOT NULL,
    status         TEXT NOT NULL,
    attempts       INTEGER NOT NULL,
    created_ms     INTEGER NOT NULL,
    started_ms     INTEGER,
    ended_ms       INTEGER,
    environment_id TEXT,
    gpu_indices    TEXT,
    pid            INTEGER,
    exit_code      INTEGER,
    signal         INTEGER,
    end_message    TEXT,
    stderr_tail    TEXT,
    -- The first final metric of the current attempt.
    final_value    REAL,
    final_raw      TEXT
);
CREATE INDEX trials_by_status ON trials (status, sequence);
CREATE INDEX trials_by_final_value ON trials (final_value) WHERE final_value IS NOT NULL;
";

/// Indexes added after schema 1 was first written, made on every open for writing: an older
/// store gets them the first time a knob that knows them writes it. An index changes no table
/// and no event, so the schema version stays, and an older knob reads and writes such a store
/// as before (SQLite keeps the index up to date for it).
///
/// `events_of_experiment`: the experiment's own events (its status changes), which every
/// snapshot reads for `running_ms`; without it each snapshot scanned the whole log, about
/// 0.1 s at 100 000 trials, where the index answers in microseconds.
const ADDED_INDEXES: &str =
    "CREATE INDEX IF NOT EXISTS events_of_experiment ON events (kind, seq) WHERE trial_id IS NULL;";

pub(crate) fn path_text(path: &Path) -> String {
    path.display().to_string()
}

fn open_error(path: &Path, error: &rusqlite::Error) -> StoreError {
    match error.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => StoreError::NotADatabase {
            path: path_text(path),
        },
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Locked {
            path: path_text(path),
        },
        _ => super::error::or_known_cause(error, &path_text(path), |path, message| {
            StoreError::Open { path, message }
        }),
    }
}

/// What a file turned out to be.
enum Identity {
    /// New or empty: ready for the schema.
    Empty,
    Knob,
}

/// Tells a knob store from a new file, another program's database or a newer knob's store.
fn identify(connection: &Connection, path: &Path) -> Result<Identity, StoreError> {
    let read = |sql: &str| -> Result<i64, StoreError> {
        connection
            .query_row(sql, [], |row| row.get(0))
            .map_err(|e| open_error(path, &e))
    };
    let application_id = read("PRAGMA application_id")?;
    if application_id != APPLICATION_ID {
        let objects = read("SELECT count(*) FROM sqlite_schema")?;
        return if application_id == 0 && objects == 0 {
            Ok(Identity::Empty)
        } else {
            Err(StoreError::ForeignDatabase {
                path: path_text(path),
            })
        };
    }
    let version: Option<String> = connection
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |row| row.get(0),
        )
        .optional()
        .map_err(|e| open_error(path, &e))?;
    let found = version.as_deref().and_then(|v| v.parse::<i64>().ok());
    match found {
        Some(SCHEMA_VERSION) => Ok(Identity::Knob),
        Some(found) if found > SCHEMA_VERSION => Err(StoreError::NewerSchema {
            path: path_text(path),
            found,
            supported: SCHEMA_VERSION,
        }),
        other => Err(StoreError::Open {
            path: path_text(path),
            message: format!(
                "store schema {} is not one this knob can read (it reads {SCHEMA_VERSION})",
                other.map_or_else(|| "unknown".to_string(), |v| v.to_string())
            ),
        }),
    }
}

/// Opens (creating if needed) the store for writing, with the schema in place.
///
/// Durability: WAL with `synchronous=NORMAL`. A commit is in the WAL file (the OS page cache)
/// when it returns, so an acknowledged event survives a kill -9 of knob, an OOM kill or a
/// crash of knob at any point: the failures resume is built for. The WAL is fsynced at each
/// checkpoint, not at each commit; after a power loss or kernel panic the database is still
/// consistent but may lack the last events before it, whose trials resume runs again.
/// `FULL` would add an fsync (about 1 ms here, far more on network disks) to every commit, and
/// with several commits per trial that would make knob, not the trials, the bottleneck.
pub(crate) fn open_for_writing(
    path: &Path,
    busy_timeout: Duration,
) -> Result<Connection, StoreError> {
    let connection = Connection::open(path).map_err(|e| open_error(path, &e))?;
    refuse_read_only(&connection, path)?;
    let setup = |sql: &str| {
        connection
            .execute_batch(sql)
            .map_err(|e| open_error(path, &e))
    };
    connection
        .busy_timeout(busy_timeout)
        .map_err(|e| open_error(path, &e))?;
    let identity = identify(&connection, path)?;
    let journal_mode: String = connection
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(|e| open_error(path, &e))?;
    if !journal_mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Open {
            path: path_text(path),
            message: format!("SQLite refused write-ahead logging (journal mode {journal_mode})"),
        });
    }
    setup("PRAGMA synchronous = NORMAL")?;
    if let Identity::Empty = identity {
        create_schema(&connection, path)?;
    }
    setup(ADDED_INDEXES)?;
    Ok(connection)
}

/// SQLite opens a file this user may not write read-only, without an error: refused here, at
/// once, rather than at the first write, once the run has started (a resume then ended in
/// ERROR with a bare "attempt to write a readonly database").
fn refuse_read_only(connection: &Connection, path: &Path) -> Result<(), StoreError> {
    if connection
        .is_readonly(rusqlite::MAIN_DB)
        .map_err(|e| open_error(path, &e))?
    {
        return Err(StoreError::ReadOnly {
            path: path_text(path),
            message: "SQLite could open it only for reading".to_string(),
        });
    }
    Ok(())
}

fn create_schema(connection: &Connection, path: &Path) -> Result<(), StoreError> {
    let sql = format!(
        "BEGIN IMMEDIATE;
         {SCHEMA}
         INSERT INTO meta (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}'),
             ('created_by', 'knob {}');
         PRAGMA application_id = {APPLICATION_ID};
         COMMIT;",
        env!("CARGO_PKG_VERSION")
    );
    connection.execute_batch(&sql).map_err(|e| {
        let _ = connection.execute_batch("ROLLBACK");
        open_error(path, &e)
    })
}

/// Opens an existing store read-only. Readers never block the writer, nor it them (WAL).
pub(crate) fn open_for_reading(path: &Path) -> Result<Connection, StoreError> {
    if !path.is_file() {
        return Err(StoreError::Open {
            path: path_text(path),
            message: "no such file; is this an experiment directory?".to_string(),
        });
    }
    if path.metadata().is_ok_and(|metadata| metadata.len() == 0) {
        return Err(StoreError::Emptied {
            path: path_text(path),
        });
    }
    let connection = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| open_error(path, &e))?;
    connection
        .busy_timeout(Duration::from_secs(5))
        .map_err(|e| open_error(path, &e))?;
    match identify(&connection, path)? {
        Identity::Knob => Ok(connection),
        Identity::Empty => Err(StoreError::NoExperiment {
            path: path_text(path),
        }),
    }
}

/// Takes the writer lock next to the store, or fails with [`StoreError::Locked`].
pub(crate) fn take_writer_lock(
    lock_path: &Path,
    store_path: &Path,
) -> Result<Connection, StoreError> {
    let lock_error = |e: &rusqlite::Error| match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Locked {
            path: path_text(store_path),
        },
        Some(ErrorCode::ReadOnly) => StoreError::ReadOnly {
            path: path_text(lock_path),
            message: one_line(e),
        },
        // Its first write (who holds it) needs room: a full disk is told as for the store.
        _ => match super::error::full_disk(e, lock_path) {
            Some(message) => StoreError::DiskFull {
                path: path_text(store_path),
                message,
            },
            None => StoreError::Open {
                path: path_text(lock_path),
                message: one_line(e),
            },
        },
    };
    let lock = Connection::open(lock_path).map_err(|e| lock_error(&e))?;
    // Exclusive locking mode keeps the lock taken by the first write until the connection
    // closes; the write records who holds it, for a person looking at the file. The mode is set
    // once the lock is ours: set before, a failed attempt keeps the shared lock it read with, so
    // two processes opening at once could each stop the other and both fail. In the normal mode
    // a failed attempt lets go and waits (the busy timeout) for a racing opener to either hold
    // the lock or give up.
    lock.busy_timeout(Duration::from_millis(500))
        .map_err(|e| lock_error(&e))?;
    lock.execute_batch(
        "PRAGMA synchronous = OFF;
         BEGIN EXCLUSIVE;
         PRAGMA locking_mode = EXCLUSIVE;
         CREATE TABLE IF NOT EXISTS writer (pid INTEGER NOT NULL);
         DELETE FROM writer;",
    )
    .map_err(|e| lock_error(&e))?;
    lock.execute("INSERT INTO writer (pid) VALUES (?1)", [std::process::id()])
        .and_then(|_| lock.execute_batch("COMMIT"))
        .map_err(|e| lock_error(&e))?;
    Ok(lock)
}

/// The counters table as stored.
pub(crate) fn read_counters(connection: &Connection) -> rusqlite::Result<Counters> {
    let mut counters = Counters::default();
    let mut statement = connection.prepare("SELECT name, next FROM counters")?;
    let mut rows = statement.query([])?;
    while let Some(row) = rows.next()? {
        let name: String = row.get(0)?;
        let next: i64 = row.get(1)?;
        let next = u64::try_from(next).unwrap_or(0);
        match name.as_str() {
            "event_seq" => counters.next_event_seq = next,
            "trial_sequence" => counters.next_trial_sequence = next,
            "parameter_id" => counters.next_parameter_id = next,
            _ => {}
        }
    }
    Ok(counters)
}

/// The counters as derivable from the log alone.
pub(crate) fn counters_from_log(connection: &Connection) -> rusqlite::Result<Counters> {
    let (last_seq, next_trial_sequence, next_parameter_id): (i64, i64, i64) = connection
        .query_row(
            "SELECT max(coalesce((SELECT max(seq) FROM events), 0),
                        coalesce((SELECT max(seq) FROM metrics), 0)),
                    coalesce((SELECT max(json_extract(payload, '$.sequence')) + 1 FROM events
                              WHERE kind = 'trial_created'), 0),
                    coalesce((SELECT max(json_extract(payload, '$.parameter_id')) + 1 FROM events
                              WHERE kind = 'trial_created'), 0)",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )?;
    Ok(Counters {
        next_event_seq: u64::try_from(last_seq).unwrap_or(0) + 1,
        next_trial_sequence: u64::try_from(next_trial_sequence).unwrap_or(0),
        next_parameter_id: u64::try_from(next_parameter_id).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_opened_only_for_reading_is_refused_before_any_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("experiment.db");
        drop(open_for_writing(&path, Duration::from_secs(1)).unwrap());
        // What SQLite gives a user who may not write the file: a connection that only reads.
        let connection =
            Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let error = refuse_read_only(&connection, &path).expect_err("refused");
        assert!(matches!(error, StoreError::ReadOnly { .. }), "{error:?}");
        assert!(
            error.to_string().contains("make the experiment's folder"),
            "{error}"
        );
        let writable = Connection::open(&path).unwrap();
        refuse_read_only(&writable, &path).unwrap();
    }
}
