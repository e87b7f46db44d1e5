//! Read-only queries on a store, on a connection of their own: WAL lets any number of readers
//! run beside the writer without blocking it or being blocked.

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::types::Type;
use rusqlite::{params_from_iter, Connection, OptionalExtension, Row};
use serde::Serialize;
use serde_json::Value;

use super::error::{or_known_cause, StoreError};
use super::event::{
    Counters, Direction, EventRecord, EventSeq, ExperimentStatus, MetricKind, MetricRecord,
    StoreEvent, TrialStatus,
};
use super::schema::{self, path_text, read_counters};
use super::state::{replay, ExperimentState};

pub(crate) const METRIC_COLUMNS: &str =
    "seq, time_ms, trial_id, attempt, kind, trial_sequence, raw, value";

/// The last column is a waiting trial's latest `waiting: ...` warning since it last went back to
/// waiting (from the log, by the `events_by_trial` index): why it has not started.
const TRIAL_COLUMNS: &str = "id, sequence, parameter_id, parameters, status, attempts, created_ms,
    started_ms, ended_ms, environment_id, gpu_indices, pid, exit_code, signal, end_message,
    stderr_tail, final_value, final_raw,
    CASE WHEN status = 'WAITING' THEN (
        SELECT substr(json_extract(w.payload, '$.message'), 10) FROM events w
        WHERE w.trial_id = trials.id AND w.kind = 'warning'
          AND json_extract(w.payload, '$.message') LIKE 'waiting: %'
          AND w.seq > coalesce((SELECT max(r.seq) FROM events r
                                WHERE r.trial_id = trials.id AND r.kind = 'trial_requeued'), 0)
        ORDER BY w.seq DESC LIMIT 1) END,
    (SELECT json_extract(m.payload, '$.memory_request_mib') FROM events m
        WHERE m.trial_id = trials.id AND m.kind = 'trial_requeued'
          AND json_extract(m.payload, '$.memory_request_mib') IS NOT NULL
        ORDER BY m.seq DESC LIMIT 1),
    (SELECT json_extract(g.payload, '$.gpu_memory_request_mib') FROM events g
        WHERE g.trial_id = trials.id AND g.kind = 'trial_requeued'
          AND json_extract(g.payload, '$.gpu_memory_request_mib') IS NOT NULL
        ORDER BY g.seq DESC LIMIT 1),
    (SELECT json_extract(m.payload, '$.peak_memory_mib') FROM events m
        WHERE m.trial_id = trials.id AND m.kind = 'trial_requeued'
          AND json_extract(m.payload, '$.memory_request_mib') IS NOT NULL
        ORDER BY m.seq DESC LIMIT 1),
    (SELECT json_extract(g.payload, '$.peak_gpu_memory_mib') FROM events g
        WHERE g.trial_id = trials.id AND g.kind = 'trial_requeued'
          AND json_extract(g.payload, '$.gpu_memory_request_mib') IS NOT NULL
        ORDER BY g.seq DESC LIMIT 1)";

/// A sequence number as SQLite's signed integer: one above `i64::MAX`, which no event has,
/// stays above every event (`as i64` made it negative, so "after it" meant the whole log).
fn sql_seq(seq: EventSeq) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

/// The lineage a creation event's payload carries, if any.
fn lineage_in(payload: &str) -> Option<super::Lineage> {
    match serde_json::from_str(payload).ok()? {
        super::StoreEvent::TrialCreated {
            lineage: Some(lineage),
            ..
        } => Some(*lineage),
        _ => None,
    }
}

fn bad_column(index: usize, what: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(index, Type::Text, what.into())
}

pub(crate) fn metric_from_row(row: &Row<'_>) -> rusqlite::Result<MetricRecord> {
    let kind: String = row.get(4)?;
    Ok(MetricRecord {
        seq: u64_column(row, 0)?,
        time_ms: row.get(1)?,
        trial_id: row.get(2)?,
        attempt: row.get(3)?,
        kind: MetricKind::parse(&kind)
            .ok_or_else(|| bad_column(4, format!("unknown metric kind {kind:?}")))?,
        trial_sequence: u64_column(row, 5)?,
        raw: row.get(6)?,
        value: row.get(7)?,
    })
}

/// SQLite integers are i64; ids and sequences are never negative unless the file was edited.
fn u64_column(row: &Row<'_>, index: usize) -> rusqlite::Result<u64> {
    let value: i64 = row.get(index)?;
    u64::try_from(value).map_err(|_| bad_column(index, format!("negative id {value}")))
}

fn json_column(row: &Row<'_>, index: usize) -> rusqlite::Result<Value> {
    let text: String = row.get(index)?;
    serde_json::from_str(&text).map_err(|e| bad_column(index, e.to_string()))
}

/// A trial as it stands now, from the materialized `trials` table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrialRow {
    pub trial_id: String,
    pub sequence: u64,
    pub parameter_id: u64,
    pub parameters: Value,
    pub status: TrialStatus,
    /// Attempts started so far.
    pub attempts: u32,
    pub created_ms: i64,
    /// Of the current attempt.
    pub started_ms: Option<i64>,
    pub ended_ms: Option<i64>,
    pub environment_id: Option<String>,
    pub gpu_indices: Vec<u32>,
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub end_message: Option<String>,
    pub stderr_tail: Option<String>,
    /// The first final metric of the current attempt: decoded, and as sent.
    pub final_value: Option<f64>,
    pub final_raw: Option<String>,
    /// For a waiting trial, why it has not started, when the manager or its training service
    /// said (no free GPU, a cluster job pending with the scheduler's reason).
    pub waiting_reason: Option<String>,
    /// The host memory (MiB) its attempts ask for since it ran out of memory, when the manager
    /// raised it (`maxOomRetries`); `None` while it asks for `trialMemorySize`.
    pub memory_request_mib: Option<u64>,
    /// The GPU memory (MiB per GPU) its attempts ask for since it ran out of GPU memory, when
    /// the manager raised it; `None` while it asks for `trialGpuMemory`.
    pub gpu_memory_request_mib: Option<u64>,
    /// The peak resident memory (MiB) of the attempt that ran out of memory, which
    /// `memory_request_mib` was learned from (where its service sampled it).
    pub memory_request_peak_mib: Option<u64>,
    /// The peak GPU memory (MiB) of the attempt that ran out of GPU memory, which
    /// `gpu_memory_request_mib` was learned from (where NVML gave it).
    pub gpu_memory_request_peak_mib: Option<u64>,
}

fn trial_from_row(row: &Row<'_>) -> rusqlite::Result<TrialRow> {
    let status: String = row.get(4)?;
    let gpu_indices: Option<String> = row.get(10)?;
    Ok(TrialRow {
        trial_id: row.get(0)?,
        sequence: u64_column(row, 1)?,
        parameter_id: u64_column(row, 2)?,
        parameters: json_column(row, 3)?,
        status: TrialStatus::parse(&status)
            .ok_or_else(|| bad_column(4, format!("unknown trial status {status:?}")))?,
        attempts: row.get(5)?,
        created_ms: row.get(6)?,
        started_ms: row.get(7)?,
        ended_ms: row.get(8)?,
        environment_id: row.get(9)?,
        gpu_indices: match gpu_indices {
            Some(text) => serde_json::from_str(&text).map_err(|e| bad_column(10, e.to_string()))?,
            None => Vec::new(),
        },
        pid: row.get(11)?,
        exit_code: row.get(12)?,
        signal: row.get(13)?,
        end_message: row.get(14)?,
        stderr_tail: row.get(15)?,
        final_value: row.get(16)?,
        final_raw: row.get(17)?,
        waiting_reason: row.get(18)?,
        memory_request_mib: row
            .get::<_, Option<i64>>(19)?
            .and_then(|mib| u64::try_from(mib).ok()),
        gpu_memory_request_mib: row
            .get::<_, Option<i64>>(20)?
            .and_then(|mib| u64::try_from(mib).ok()),
        memory_request_peak_mib: row
            .get::<_, Option<i64>>(21)?
            .and_then(|mib| u64::try_from(mib).ok()),
        gpu_memory_request_peak_mib: row
            .get::<_, Option<i64>>(22)?
            .and_then(|mib| u64::try_from(mib).ok()),
    })
}

/// The experiment row: what `knob experiment list` shows without replaying.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExperimentSummary {
    pub experiment_id: String,
    /// With config updates applied.
    pub config: Value,
    pub start_time_ms: i64,
    pub status: ExperimentStatus,
    pub status_message: Option<String>,
    pub updated_ms: i64,
}

/// Which trials [`StoreReader::trials`] lists, by trial sequence.
/// Which attempts' metrics a query returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Attempts {
    /// Each trial's latest attempt (what the trial's final and status describe).
    #[default]
    Latest,
    /// Every attempt.
    All,
    /// Attempt number N of each trial.
    Only(u32),
}

impl Attempts {
    pub fn includes(self, attempt: u32, latest: u32) -> bool {
        match self {
            Attempts::Latest => attempt == latest,
            Attempts::All => true,
            Attempts::Only(number) => attempt == number,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrialQuery {
    /// Empty: every status.
    pub statuses: Vec<TrialStatus>,
    pub offset: u64,
    pub limit: Option<u64>,
}

/// A read-only view of an experiment's store.
pub struct StoreReader {
    connection: Connection,
    path: String,
}

impl std::fmt::Debug for StoreReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreReader")
            .field("path", &self.path)
            .finish()
    }
}

impl StoreReader {
    /// Opens `<dir>/experiment.db` read-only; it must exist and be a knob store.
    pub fn open(experiment_dir: &Path) -> Result<StoreReader, StoreError> {
        let path = experiment_dir.join(super::DB_FILE_NAME);
        let connection = schema::open_for_reading(&path)?;
        Ok(StoreReader {
            connection,
            path: path_text(&path),
        })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    fn read_error(&self, error: rusqlite::Error) -> StoreError {
        or_known_cause(&error, &self.path, |path, message| StoreError::Read {
            path,
            message,
        })
    }

    /// Rebuilds the whole experiment from the log (what resume and export use).
    pub fn replay(&self) -> Result<ExperimentState, StoreError> {
        replay(&self.connection, &self.path)
    }

    /// `None` before the experiment was created.
    pub fn experiment(&self) -> Result<Option<ExperimentSummary>, StoreError> {
        self.connection
            .query_row(
                "SELECT id, config, start_time_ms, status, status_message, updated_ms
                 FROM experiment",
                [],
                |row| {
                    let status: String = row.get(3)?;
                    Ok(ExperimentSummary {
                        experiment_id: row.get(0)?,
                        config: json_column(row, 1)?,
                        start_time_ms: row.get(2)?,
                        status: ExperimentStatus::parse(&status).ok_or_else(|| {
                            bad_column(3, format!("unknown experiment status {status:?}"))
                        })?,
                        status_message: row.get(4)?,
                        updated_ms: row.get(5)?,
                    })
                },
            )
            .optional()
            .map_err(|e| self.read_error(e))
    }

    /// The last moment the run writing this store is known to have been alive: its last event
    /// or metric, or its writer's alive mark, whichever is later. For a run that crashed, about
    /// when it died; `None` before anything was recorded.
    pub fn last_alive_ms(&self) -> Result<Option<i64>, StoreError> {
        // The writer stamps times that never go back (`Writer::apply`), so each table's last
        // row by sequence holds its latest time: two lookups, not two scans of the log (a
        // million metrics at 100 000 trials). Either table may be empty.
        let last_of = |table: &str| -> Result<Option<i64>, StoreError> {
            self.connection
                .query_row(
                    &format!("SELECT time_ms FROM {table} ORDER BY seq DESC LIMIT 1"),
                    [],
                    |row| row.get(0),
                )
                .optional()
                .map_err(|e| self.read_error(e))
        };
        let last_recorded = last_of("events")?.max(last_of("metrics")?);
        let marked = super::state::alive_mark_ms(&self.path);
        Ok(last_recorded.max(marked))
    }

    pub fn trials(&self, query: &TrialQuery) -> Result<Vec<TrialRow>, StoreError> {
        let mut sql = format!("SELECT {TRIAL_COLUMNS} FROM trials");
        if !query.statuses.is_empty() {
            let marks = vec!["?"; query.statuses.len()].join(", ");
            sql.push_str(&format!(" WHERE status IN ({marks})"));
        }
        // LIMIT -1 is SQLite's "no limit"; OFFSET needs a LIMIT.
        let limit = query
            .limit
            .map_or(-1, |limit| limit.min(i64::MAX as u64) as i64);
        sql.push_str(&format!(
            " ORDER BY sequence LIMIT {limit} OFFSET {}",
            query.offset.min(i64::MAX as u64)
        ));
        let statuses = query.statuses.iter().map(|status| status.as_str());
        self.collect(&sql, params_from_iter(statuses), trial_from_row)
    }

    pub fn trial(&self, trial_id: &str) -> Result<Option<TrialRow>, StoreError> {
        self.connection
            .query_row(
                &format!("SELECT {TRIAL_COLUMNS} FROM trials WHERE id = ?1"),
                [trial_id],
                trial_from_row,
            )
            .optional()
            .map_err(|e| self.read_error(e))
    }

    /// How many trials are in each status (statuses with none are left out).
    pub fn trial_counts(&self) -> Result<BTreeMap<TrialStatus, u64>, StoreError> {
        let rows = self.collect(
            "SELECT status, count(*) FROM trials GROUP BY status",
            [],
            |row| Ok((row.get::<_, String>(0)?, u64_column(row, 1)?)),
        )?;
        Ok(rows
            .into_iter()
            .filter_map(|(status, count)| Some((TrialStatus::parse(&status)?, count)))
            .collect())
    }

    /// (environment id, trials whose current attempt ran there, of them still running) for every
    /// environment a trial was placed on, by id.
    pub fn environment_trial_counts(&self) -> Result<Vec<(String, u64, u64)>, StoreError> {
        self.collect(
            "SELECT environment_id, count(*), sum(status = 'RUNNING') FROM trials
             WHERE environment_id IS NOT NULL GROUP BY environment_id ORDER BY environment_id",
            [],
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    u64_column(row, 1)?,
                    u64_column(row, 2)?,
                ))
            },
        )
    }

    /// The trials that rank ([`Ranking`](crate::objectives::Ranking): SUCCEEDED, a finite
    /// final, with `objectives` every listed metric finite and every constraint met), best
    /// first; ties go to the earlier trial.
    pub fn best_trials(
        &self,
        ranking: &crate::objectives::Ranking,
        limit: u64,
    ) -> Result<Vec<TrialRow>, StoreError> {
        // The SQL order is `objectives::best_first`'s: the value, then the sequence. A final
        // without a usable number (NaN, ±Infinity) has no `final_value`.
        let order = match ranking.direction {
            Direction::Maximize => "DESC",
            Direction::Minimize => "ASC",
        };
        let succeeded = TrialStatus::Succeeded.as_str();
        let limit = limit.min(i64::MAX as u64) as i64;
        if !ranking.reads_results() {
            let sql = format!(
                "SELECT {TRIAL_COLUMNS} FROM trials
                 WHERE final_value IS NOT NULL AND status = '{succeeded}'
                 ORDER BY final_value {order}, sequence LIMIT ?1"
            );
            return self.collect(&sql, [limit], trial_from_row);
        }
        // Each result as reported is read (its other objectives, its constraints): best first,
        // a page at a time (pages doubling), until enough rank; not every trial for each call
        // (the notifier asks once per trial that succeeds).
        let sql = format!(
            "SELECT {TRIAL_COLUMNS} FROM trials
             WHERE final_value IS NOT NULL AND status = '{succeeded}'
             ORDER BY final_value {order}, sequence LIMIT ?1 OFFSET ?2"
        );
        let mut ranked = Vec::new();
        let (mut offset, mut page) = (0i64, limit.clamp(1, 1 << 20).saturating_mul(2));
        loop {
            let rows = self.collect(&sql, [page, offset], trial_from_row)?;
            let last_page = (rows.len() as i64) < page;
            ranked.extend(rows.into_iter().filter(|t| ranking.ranks_row(t)));
            if last_page || ranked.len() as i64 >= limit {
                break;
            }
            offset += page;
            page = page.saturating_mul(2);
        }
        ranked.truncate(limit as usize);
        Ok(ranked)
    }

    /// The lineage of every population member (PBT), by trial id. It is kept in the log only
    /// (`StoreEvent::TrialCreated`), so this reads the creation events that carry one: a scan
    /// of the log; [`StoreReader::lineage`] first tells whether one trial has any.
    pub fn lineages(
        &self,
    ) -> Result<std::collections::HashMap<String, super::Lineage>, StoreError> {
        let rows = self.collect(
            "SELECT trial_id, payload FROM events
             WHERE kind = 'trial_created' AND payload LIKE '%\"lineage\"%'",
            [],
            |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)),
        )?;
        Ok(rows
            .into_iter()
            .filter_map(|(trial_id, payload)| Some((trial_id, lineage_in(&payload)?)))
            .collect())
    }

    /// One trial's lineage, `None` for a trial that is no population member: its creation
    /// event, by the `events_by_trial` index.
    pub fn lineage(&self, trial_id: &str) -> Result<Option<super::Lineage>, StoreError> {
        let payload: Option<String> = self
            .connection
            .query_row(
                "SELECT payload FROM events WHERE trial_id = ?1 AND kind = 'trial_created'
                 ORDER BY seq LIMIT 1",
                [trial_id],
                |row| row.get(0),
            )
            .optional()
            .map_err(|e| self.read_error(e))?;
        Ok(payload.as_deref().and_then(lineage_in))
    }

    /// Every metric of a trial, all attempts, in log order.
    pub fn metrics_of_trial(&self, trial_id: &str) -> Result<Vec<MetricRecord>, StoreError> {
        let sql = format!("SELECT {METRIC_COLUMNS} FROM metrics WHERE trial_id = ?1 ORDER BY seq");
        self.collect(&sql, [trial_id], metric_from_row)
    }

    /// Metrics with a sequence number above `after` (0 for all), oldest first: what a live
    /// dashboard polls for.
    pub fn metrics_since(
        &self,
        after: EventSeq,
        limit: u64,
    ) -> Result<Vec<MetricRecord>, StoreError> {
        let sql =
            format!("SELECT {METRIC_COLUMNS} FROM metrics WHERE seq > ?1 ORDER BY seq LIMIT ?2");
        self.collect(
            &sql,
            [sql_seq(after), limit.min(i64::MAX as u64) as i64],
            metric_from_row,
        )
    }

    /// Metrics with a sequence number above `after`, oldest first, of the given trials only, of
    /// the given attempts and of one kind, when asked: what a dashboard needs to draw a few
    /// trials' curves without downloading every metric of the experiment.
    pub fn metrics_matching(
        &self,
        trial_ids: Option<&[String]>,
        kind: Option<MetricKind>,
        attempts: Attempts,
        after: EventSeq,
        limit: u64,
    ) -> Result<Vec<MetricRecord>, StoreError> {
        let mut sql = format!("SELECT {METRIC_COLUMNS} FROM metrics WHERE seq > {after}");
        match attempts {
            Attempts::All => {}
            Attempts::Latest => sql.push_str(
                " AND attempt = (SELECT attempts FROM trials WHERE trials.id = metrics.trial_id)",
            ),
            Attempts::Only(number) => sql.push_str(&format!(" AND attempt = {number}")),
        }
        if let Some(ids) = trial_ids {
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            let marks = vec!["?"; ids.len()].join(", ");
            sql.push_str(&format!(" AND trial_id IN ({marks})"));
        }
        if let Some(kind) = kind {
            sql.push_str(&format!(" AND kind = '{}'", kind.as_str()));
        }
        sql.push_str(&format!(
            " ORDER BY seq LIMIT {}",
            limit.min(i64::MAX as u64)
        ));
        self.collect(
            &sql,
            params_from_iter(trial_ids.unwrap_or_default()),
            metric_from_row,
        )
    }

    /// The log above `after`, metrics included, oldest first.
    pub fn events_since(
        &self,
        after: EventSeq,
        limit: u64,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let limit_sql = limit.min(i64::MAX as u64) as i64;
        let mut records = self.events_where(
            "SELECT seq, time_ms, payload FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            [sql_seq(after), limit_sql],
        )?;
        records.extend(
            self.metrics_since(after, limit)?
                .into_iter()
                .map(|metric| EventRecord {
                    seq: metric.seq,
                    time_ms: metric.time_ms,
                    event: metric.to_event(),
                }),
        );
        records.sort_by_key(|record| record.seq);
        records.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        Ok(records)
    }

    /// Milliseconds the experiment spent in active statuses up to `until_ms`: what counts
    /// toward `maxExperimentDuration` (`ExperimentState::active_time_ms`), from its status
    /// changes alone, read by the `events_of_experiment` index (a store not yet opened for
    /// writing by a knob that makes it is scanned instead: about 0.1 s at 100 000 trials).
    pub fn active_time_ms(&self, until_ms: i64) -> Result<i64, StoreError> {
        let records = self.events_where(
            "SELECT seq, time_ms, payload FROM events WHERE trial_id IS NULL AND kind = ?1 ORDER BY seq",
            ["experiment_status_changed"],
        )?;
        let mut history = Vec::with_capacity(records.len());
        for EventRecord {
            seq,
            time_ms,
            event,
        } in records
        {
            if let StoreEvent::ExperimentStatusChanged {
                status,
                message,
                spent_before_ms,
            } = event
            {
                history.push(super::state::StatusChange {
                    seq,
                    time_ms,
                    status,
                    message,
                    spent_before_ms,
                });
            }
        }
        Ok(super::state::active_time_ms(&history, until_ms))
    }

    /// The counters table as committed.
    pub fn counters(&self) -> Result<Counters, StoreError> {
        read_counters(&self.connection).map_err(|e| self.read_error(e))
    }

    /// The log's events (not its metrics) that `sql` selects as (seq, time_ms, payload),
    /// decoded.
    fn events_where<P: rusqlite::Params>(
        &self,
        sql: &str,
        params: P,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let rows = self.collect(sql, params, |row| {
            Ok((
                u64_column(row, 0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, String>(2)?,
            ))
        })?;
        rows.into_iter()
            .map(|(seq, time_ms, payload)| {
                let event = serde_json::from_str(&payload).map_err(|e| StoreError::Corrupt {
                    path: self.path.clone(),
                    seq,
                    message: format!("undecodable event: {e}"),
                })?;
                Ok(EventRecord {
                    seq,
                    time_ms,
                    event,
                })
            })
            .collect()
    }

    fn collect<T, P: rusqlite::Params>(
        &self,
        sql: &str,
        params: P,
        map: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>, StoreError> {
        let run = || -> rusqlite::Result<Vec<T>> {
            let mut statement = self.connection.prepare_cached(sql)?;
            let rows = statement.query_map(params, map)?;
            rows.collect()
        };
        run().map_err(|e| self.read_error(e))
    }
}
