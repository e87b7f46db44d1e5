//! The writer thread: owns the read-write connection, turns queued events into group commits,
//! and acknowledges each event only once its transaction has committed.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, ErrorCode, OptionalExtension};
use tokio::sync::{oneshot, watch};

use super::error::{one_line, Rejection, StoreError};
use super::event::{Counters, EventSeq, MetricKind, StoreEvent, TrialStatus};
use super::file::{StoreFile, StoreGone};
use super::state::set_config_field;

/// Most events in one transaction: bounds the memory a batch holds and the time an ack waits
/// behind a huge backlog, while keeping the fsync per event negligible.
const MAX_BATCH: usize = 8192;

pub(crate) type AckSender<T> = oneshot::Sender<Result<T, StoreError>>;

pub(crate) enum Command {
    Append {
        event: StoreEvent,
        ack: Option<AckSender<EventSeq>>,
    },
    /// Events written in one transaction; the ack answers for the last one.
    AppendTogether {
        events: Vec<StoreEvent>,
        ack: AckSender<EventSeq>,
    },
    Flush(AckSender<()>),
    Shutdown,
}

/// Counts kept by the writer, readable through [`Store::stats`](super::Store::stats).
#[derive(Debug, Default)]
pub(crate) struct SharedStats {
    pub(crate) transactions: AtomicU64,
    pub(crate) events: AtomicU64,
}

/// Where the log stands; restored as a whole when a batch fails.
#[derive(Debug, Clone, Copy)]
struct Position {
    counters: Counters,
    last_time_ms: i64,
}

pub(crate) struct Writer {
    connection: Connection,
    /// Held, never used: one writer per store.
    _lock: super::WriterLock,
    path: String,
    position: Position,
    stats: Arc<SharedStats>,
    /// The first failure of a fire-and-forget event since the last flush, which reports it.
    unreported: Option<StoreError>,
    /// The last committed sequence number, updated after each commit and before its acks.
    committed: watch::Sender<EventSeq>,
    /// The store file, to notice that it was deleted while the experiment runs (`rm -rf` of
    /// its folder): SQLite writes on into the unlinked file, and every result from then on
    /// would be lost without a word. `None` if it cannot be opened: then nothing is noticed.
    store_file: Option<StoreFile>,
    /// [`super::ALIVE_FILE_NAME`] in the experiment's folder, and how often to mark it while
    /// idle.
    alive_file: PathBuf,
    alive_interval: Duration,
}

enum Failure {
    Rejected(Rejection),
    /// Anything else (disk full, I/O error, lock timeout) fails the whole batch.
    Fatal(rusqlite::Error),
}

impl From<rusqlite::Error> for Failure {
    fn from(error: rusqlite::Error) -> Self {
        Failure::Fatal(error)
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}

fn is_constraint(error: &rusqlite::Error) -> bool {
    error.sqlite_error_code() == Some(ErrorCode::ConstraintViolation)
}

impl Writer {
    pub(crate) fn new(
        connection: Connection,
        lock: super::WriterLock,
        path: String,
        counters: Counters,
        stats: Arc<SharedStats>,
        committed: watch::Sender<EventSeq>,
        alive_interval: Duration,
    ) -> Result<Writer, StoreError> {
        let last_time_ms: i64 = connection
            .query_row(
                "SELECT max(coalesce((SELECT time_ms FROM events ORDER BY seq DESC LIMIT 1), 0),
                            coalesce((SELECT time_ms FROM metrics ORDER BY seq DESC LIMIT 1), 0))",
                [],
                |row| row.get(0),
            )
            .map_err(|e| StoreError::Open {
                path: path.clone(),
                message: one_line(&e),
            })?;
        Ok(Writer {
            connection,
            _lock: lock,
            position: Position {
                counters,
                last_time_ms,
            },
            stats,
            unreported: None,
            committed,
            store_file: StoreFile::open(std::path::Path::new(&path)).ok(),
            alive_file: std::path::Path::new(&path).with_file_name(super::ALIVE_FILE_NAME),
            path,
            alive_interval,
        })
    }

    /// Why the store file is no longer where the experiment is registered, if it is not: deleted
    /// (its last link is gone), or moved (its path now names no file, or another file: the
    /// experiment's folder renamed, whose new trials would have been made under the old path
    /// again, apart from the store and its registration).
    fn store_gone(&self) -> Option<StoreError> {
        let gone = self.store_file.as_ref()?.gone()?;
        let dir = std::path::Path::new(&self.path)
            .parent()
            .map(|dir| dir.display().to_string())
            .unwrap_or_default();
        Some(match gone {
            StoreGone::Deleted => StoreError::FilesDeleted { dir },
            StoreGone::Moved => StoreError::FilesMoved { dir },
        })
    }

    /// Runs until [`Command::Shutdown`] or until every sender is gone, committing what is queued.
    pub(crate) fn run(mut self, commands: Receiver<Command>) {
        loop {
            let first = match commands.recv_timeout(self.alive_interval) {
                Ok(command) => command,
                // Events carry their time; only a quiet stretch needs the mark.
                Err(RecvTimeoutError::Timeout) => {
                    self.mark_alive();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match commands.try_recv() {
                    Ok(command) => batch.push(command),
                    Err(_) => break,
                }
            }
            if !self.process(batch) {
                return;
            }
        }
    }

    /// Sets the alive file's modification time to now (making it if need be). A failure is
    /// ignored: it costs only how much of a crashed run's time a resume counts.
    fn mark_alive(&self) {
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.alive_file)
            .and_then(|file| file.set_modified(SystemTime::now()));
    }

    /// Commits one batch and answers everyone in it. Returns false on shutdown.
    fn process(&mut self, batch: Vec<Command>) -> bool {
        let mut events = Vec::new();
        let mut acks = Vec::new();
        let mut flushes = Vec::new();
        let mut keep_running = true;
        for command in batch {
            match command {
                Command::Append { event, ack } => {
                    events.push(event);
                    acks.push(ack);
                }
                Command::AppendTogether {
                    events: together,
                    ack,
                } => {
                    // A batch is one transaction, so they commit together; a refusal of any
                    // but the last is reported by the next flush.
                    debug_assert!(!together.is_empty(), "events to append together");
                    let last = together.len().saturating_sub(1);
                    let mut ack = Some(ack);
                    for (index, event) in together.into_iter().enumerate() {
                        events.push(event);
                        acks.push(if index == last { ack.take() } else { None });
                    }
                }
                Command::Flush(ack) => flushes.push(ack),
                Command::Shutdown => keep_running = false,
            }
        }
        if !events.is_empty() {
            let outcomes = self.write_batch(events);
            for (ack, outcome) in acks.into_iter().zip(outcomes) {
                match ack {
                    Some(ack) => {
                        let _ = ack.send(outcome);
                    }
                    None => {
                        if let Err(error) = outcome {
                            self.unreported.get_or_insert(error);
                        }
                    }
                }
            }
        }
        for flush in flushes {
            let _ = flush.send(self.unreported.take().map_or(Ok(()), Err));
        }
        keep_running
    }

    /// One transaction for all `events`: each gets its sequence number or its own rejection,
    /// or, when the transaction fails, every one gets the failure.
    fn write_batch(&mut self, events: Vec<StoreEvent>) -> Vec<Result<EventSeq, StoreError>> {
        let before = self.position;
        let count = events.len();
        // Checked at each batch, not on a timer: no commit then goes into a deleted store
        // unnoticed. One fstat, next to a transaction's writes.
        if let Some(gone) = self.store_gone() {
            return vec![Err(gone); count];
        }
        match self.try_write_batch(events) {
            Ok(outcomes) => {
                let applied = outcomes.iter().filter(|o| o.is_ok()).count();
                if applied > 0 {
                    self.stats.transactions.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .events
                        .fetch_add(applied as u64, Ordering::Relaxed);
                    let last = self.position.counters.next_event_seq.saturating_sub(1);
                    self.committed.send_replace(last);
                }
                outcomes
                    .into_iter()
                    .map(|outcome| {
                        outcome.map_err(|reason| StoreError::Rejected {
                            path: self.path.clone(),
                            reason,
                        })
                    })
                    .collect()
            }
            Err(error) => {
                // SQLite may have rolled back already (e.g. on SQLITE_FULL); then this fails,
                // harmlessly.
                let _ = self.connection.execute_batch("ROLLBACK");
                self.position = before;
                let busy = matches!(
                    error.sqlite_error_code(),
                    Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
                );
                let error = super::error::or_known_cause(&error, &self.path, |path, message| {
                    // Only another connection's write transaction holds the writer off (in
                    // WAL, readers never do): say whose, and what to do.
                    let message = if busy {
                        format!("{message}: another process holds a write transaction on it (an `sqlite3` shell after BEGIN?) longer than knob waits; end that transaction, then `knob resume` continues the experiment")
                    } else {
                        message
                    };
                    StoreError::Write { path, message }
                });
                vec![Err(error); count]
            }
        }
    }

    fn try_write_batch(
        &mut self,
        events: Vec<StoreEvent>,
    ) -> rusqlite::Result<Vec<Result<EventSeq, Rejection>>> {
        let counters_before = self.position.counters;
        self.connection.execute_batch("BEGIN IMMEDIATE")?;
        let mut outcomes = Vec::with_capacity(events.len());
        for event in events {
            match self.apply(event) {
                Ok(seq) => outcomes.push(Ok(seq)),
                Err(Failure::Rejected(reason)) => outcomes.push(Err(reason)),
                Err(Failure::Fatal(error)) => return Err(error),
            }
        }
        self.save_counters(counters_before)?;
        self.connection.execute_batch("COMMIT")?;
        Ok(outcomes)
    }

    fn save_counters(&self, before: Counters) -> rusqlite::Result<()> {
        let now = self.position.counters;
        let mut update = self
            .connection
            .prepare_cached("UPDATE counters SET next = ?2 WHERE name = ?1")?;
        for (name, old, new) in [
            ("event_seq", before.next_event_seq, now.next_event_seq),
            (
                "trial_sequence",
                before.next_trial_sequence,
                now.next_trial_sequence,
            ),
            (
                "parameter_id",
                before.next_parameter_id,
                now.next_parameter_id,
            ),
        ] {
            if new != old {
                update.execute(params![name, new as i64])?;
            }
        }
        Ok(())
    }

    /// Validates and writes one event inside the open transaction.
    ///
    /// Every check runs before the first write, and the only statement a constraint can refuse
    /// is the event's first write, which SQLite undoes on its own: a rejected event leaves
    /// nothing behind, without a savepoint per event.
    fn apply(&mut self, mut event: StoreEvent) -> Result<EventSeq, Failure> {
        let seq = self.position.counters.next_event_seq;
        let time_ms = now_ms().max(self.position.last_time_ms);
        if let StoreEvent::Metric { value, .. } = &mut event {
            *value = value.filter(|v| v.is_finite());
        }
        self.apply_to_tables(&event, seq, time_ms)?;
        if !matches!(event, StoreEvent::Metric { .. }) {
            let payload = serde_json::to_string(&event).map_err(|e| {
                Failure::Rejected(Rejection::Unencodable {
                    message: e.to_string(),
                })
            })?;
            self.connection
                .prepare_cached(
                    "INSERT INTO events (seq, time_ms, kind, trial_id, payload)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![
                    seq as i64,
                    time_ms,
                    event.kind(),
                    event.trial_id(),
                    payload
                ])?;
        }
        self.position.counters.next_event_seq = seq + 1;
        self.position.last_time_ms = time_ms;
        Ok(seq)
    }

    fn require_experiment(&self) -> Result<(), Failure> {
        let exists: bool = self
            .connection
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM experiment)")?
            .query_row([], |row| row.get(0))?;
        if exists {
            Ok(())
        } else {
            Err(Failure::Rejected(Rejection::NoExperiment))
        }
    }

    fn trial_status(&self, trial_id: &str) -> Result<(TrialStatus, u32), Failure> {
        let row: Option<(String, u32)> = self
            .connection
            .prepare_cached("SELECT status, attempts FROM trials WHERE id = ?1")?
            .query_row([trial_id], |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()?;
        let Some((status, attempts)) = row else {
            return Err(Failure::Rejected(Rejection::UnknownTrial {
                trial_id: trial_id.to_string(),
            }));
        };
        // The writer wrote every status; anything else means the file was edited.
        let status = TrialStatus::parse(&status).ok_or_else(|| {
            Failure::Fatal(rusqlite::Error::InvalidColumnType(
                0,
                format!("trials.status {status:?}"),
                rusqlite::types::Type::Text,
            ))
        })?;
        Ok((status, attempts))
    }

    fn apply_to_tables(
        &mut self,
        event: &StoreEvent,
        seq: EventSeq,
        time_ms: i64,
    ) -> Result<(), Failure> {
        let reject = |reason| Err(Failure::Rejected(reason));
        let wrong_status = |trial_id: &str, status: TrialStatus, event: &'static str| {
            Err(Failure::Rejected(Rejection::WrongTrialStatus {
                trial_id: trial_id.to_string(),
                status: status.as_str().to_string(),
                event,
            }))
        };
        let connection = &self.connection;
        match event {
            StoreEvent::ExperimentCreated {
                experiment_id,
                config,
                start_time_ms,
            } => {
                let inserted = connection
                    .prepare_cached(
                        "INSERT INTO experiment
                         (singleton, id, config, start_time_ms, status, status_message, updated_ms)
                         VALUES (1, ?1, ?2, ?3, 'INITIALIZED', NULL, ?4)",
                    )?
                    .execute(params![
                        experiment_id,
                        config.to_string(),
                        start_time_ms,
                        time_ms
                    ]);
                match inserted {
                    Err(e) if is_constraint(&e) => return reject(Rejection::ExperimentExists),
                    other => other?,
                };
            }
            StoreEvent::ExperimentStatusChanged {
                status, message, ..
            } => {
                let changed = connection
                    .prepare_cached(
                        "UPDATE experiment SET status = ?1, status_message = ?2, updated_ms = ?3",
                    )?
                    .execute(params![status.as_str(), message, time_ms])?;
                if changed == 0 {
                    return reject(Rejection::NoExperiment);
                }
            }
            StoreEvent::ConfigUpdated { field, value } => {
                let config: Option<String> = connection
                    .prepare_cached("SELECT config FROM experiment")?
                    .query_row([], |row| row.get(0))
                    .optional()?;
                let Some(config) = config else {
                    return reject(Rejection::NoExperiment);
                };
                let mut config: serde_json::Value = serde_json::from_str(&config).map_err(|e| {
                    Failure::Fatal(rusqlite::Error::ToSqlConversionFailure(e.into()))
                })?;
                if let Err(message) = set_config_field(&mut config, field, value.clone()) {
                    return reject(Rejection::BadConfigField {
                        field: field.clone(),
                        message,
                    });
                }
                connection
                    .prepare_cached("UPDATE experiment SET config = ?1, updated_ms = ?2")?
                    .execute(params![config.to_string(), time_ms])?;
            }
            StoreEvent::TrialCreated {
                trial_id,
                sequence,
                parameter_id,
                parameters,
                // Kept in the event log only (the state replays it from there).
                parameter_label: _,
                lineage: _,
            } => {
                self.require_experiment()?;
                let counters = &mut self.position.counters;
                if *sequence < counters.next_trial_sequence {
                    return reject(Rejection::SequenceWentBack {
                        sequence: *sequence,
                        next: counters.next_trial_sequence,
                    });
                }
                let inserted = connection
                    .prepare_cached(
                        "INSERT INTO trials
                         (id, sequence, parameter_id, parameters, status, attempts, created_ms)
                         VALUES (?1, ?2, ?3, ?4, 'WAITING', 0, ?5)",
                    )?
                    .execute(params![
                        trial_id,
                        *sequence as i64,
                        *parameter_id as i64,
                        parameters.to_string(),
                        time_ms
                    ]);
                match inserted {
                    Err(e) if is_constraint(&e) && one_line(&e).contains("parameter_id") => {
                        return reject(Rejection::DuplicateParameterId {
                            parameter_id: *parameter_id,
                        })
                    }
                    Err(e) if is_constraint(&e) && one_line(&e).contains("trials.id") => {
                        return reject(Rejection::DuplicateTrialId {
                            trial_id: trial_id.clone(),
                        })
                    }
                    other => other?,
                };
                counters.next_trial_sequence = counters.next_trial_sequence.max(sequence + 1);
                counters.next_parameter_id = counters.next_parameter_id.max(parameter_id + 1);
            }
            StoreEvent::TrialStarted {
                trial_id,
                attempt,
                environment_id,
                gpu_indices,
                pid,
            } => {
                let (status, attempts) = self.trial_status(trial_id)?;
                if status != TrialStatus::Waiting {
                    return wrong_status(trial_id, status, "trial_started");
                }
                if *attempt != attempts + 1 {
                    return reject(Rejection::WrongAttempt {
                        trial_id: trial_id.clone(),
                        attempt: *attempt,
                        expected: (attempts + 1).to_string(),
                    });
                }
                let gpu_indices = serde_json::to_string(gpu_indices).unwrap_or_default();
                self.connection
                    .prepare_cached(
                        "UPDATE trials SET status = 'RUNNING', attempts = ?2, started_ms = ?3,
                            environment_id = ?4, gpu_indices = ?5, pid = ?6, ended_ms = NULL,
                            exit_code = NULL, signal = NULL, end_message = NULL,
                            stderr_tail = NULL, final_value = NULL, final_raw = NULL
                         WHERE id = ?1",
                    )?
                    .execute(params![
                        trial_id,
                        attempt,
                        time_ms,
                        environment_id,
                        gpu_indices,
                        pid
                    ])?;
            }
            StoreEvent::TrialEnded {
                trial_id,
                attempt,
                status: end_status,
                exit_code,
                signal,
                message,
                stderr_tail,
                ended_ms,
                ..
            } => {
                if !end_status.is_final() {
                    return reject(Rejection::NotAFinalStatus {
                        status: end_status.as_str().to_string(),
                    });
                }
                let (status, attempts) = self.trial_status(trial_id)?;
                if status.is_final() {
                    return wrong_status(trial_id, status, "trial_ended");
                }
                if *attempt != attempts {
                    return reject(Rejection::WrongAttempt {
                        trial_id: trial_id.clone(),
                        attempt: *attempt,
                        expected: attempts.to_string(),
                    });
                }
                let started_ms: Option<i64> = match ended_ms {
                    Some(_) => self
                        .connection
                        .prepare_cached("SELECT started_ms FROM trials WHERE id = ?1")?
                        .query_row([trial_id], |row| row.get(0))?,
                    None => None,
                };
                self.connection
                    .prepare_cached(
                        "UPDATE trials SET status = ?2, ended_ms = ?3, exit_code = ?4,
                            signal = ?5, end_message = ?6, stderr_tail = ?7
                         WHERE id = ?1",
                    )?
                    .execute(params![
                        trial_id,
                        end_status.as_str(),
                        super::event::end_time(*ended_ms, time_ms, started_ms),
                        exit_code,
                        signal,
                        message,
                        stderr_tail
                    ])?;
            }
            StoreEvent::TrialStopping {
                trial_id,
                status: end_status,
                ..
            } => {
                if !end_status.is_final() {
                    return reject(Rejection::NotAFinalStatus {
                        status: end_status.as_str().to_string(),
                    });
                }
                // Kept in the event log only (the state replays it from there).
                let (status, _) = self.trial_status(trial_id)?;
                if status.is_final() {
                    return wrong_status(trial_id, status, "trial_stopping");
                }
            }
            StoreEvent::TrialRequeued { trial_id, .. } => {
                let (status, attempts) = self.trial_status(trial_id)?;
                // A started trial, or one that ended before it started (cancelled by a stop of
                // the experiment, which a resume runs after all).
                if status == TrialStatus::Waiting {
                    return wrong_status(trial_id, status, "trial_requeued");
                }
                self.connection
                    .prepare_cached(
                        "UPDATE trials SET status = 'WAITING', final_value = NULL, final_raw = NULL
                         WHERE id = ?1",
                    )?
                    .execute([trial_id])?;
                if attempts == 0 {
                    // No attempt keeps that end: the trial is as if never ended.
                    self.connection
                        .prepare_cached(
                            "UPDATE trials SET ended_ms = NULL, exit_code = NULL, signal = NULL,
                                end_message = NULL, stderr_tail = NULL
                             WHERE id = ?1",
                        )?
                        .execute([trial_id])?;
                }
            }
            StoreEvent::Metric {
                trial_id,
                attempt,
                kind,
                trial_sequence,
                raw,
                value,
            } => {
                let (_, attempts) = self.trial_status(trial_id)?;
                if *attempt == 0 || *attempt > attempts {
                    return reject(Rejection::WrongAttempt {
                        trial_id: trial_id.clone(),
                        attempt: *attempt,
                        expected: format!("1..={attempts}"),
                    });
                }
                let inserted = self
                    .connection
                    .prepare_cached(
                        "INSERT INTO metrics
                         (seq, time_ms, trial_id, attempt, kind, trial_sequence, raw, value)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                    )?
                    .execute(params![
                        seq as i64,
                        time_ms,
                        trial_id,
                        attempt,
                        kind.as_str(),
                        *trial_sequence as i64,
                        raw,
                        value
                    ]);
                match inserted {
                    Err(e) if is_constraint(&e) => {
                        return reject(Rejection::DuplicateMetric {
                            trial_id: trial_id.clone(),
                            attempt: *attempt,
                            trial_sequence: *trial_sequence,
                        })
                    }
                    other => other?,
                };
                if *kind == MetricKind::Final && *attempt == attempts {
                    self.connection
                        .prepare_cached(
                            // The attempt's first final is the trial's (as in the manager);
                            // `final_raw` is cleared when a new attempt starts.
                            "UPDATE trials SET final_value = ?2, final_raw = ?3
                             WHERE id = ?1 AND final_raw IS NULL",
                        )?
                        .execute(params![trial_id, value, raw])?;
                }
            }
            StoreEvent::Warning { .. } => self.require_experiment()?,
        }
        Ok(())
    }
}
