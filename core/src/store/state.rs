//! Rebuilding an experiment from its log: [`ExperimentState`] and the replay that makes it.
//!
//! Replay reads only the log (`events` and `metrics`) and the counters, never the materialized
//! `experiment` and `trials` tables, so those can be rebuilt and can never mislead a resume.

use std::collections::HashMap;

use rusqlite::Connection;
use serde::Serialize;
use serde_json::Value;

use super::error::{or_known_cause, StoreError};
use super::event::{
    Counters, EventRecord, EventSeq, ExperimentStatus, Lineage, MetricKind, MetricRecord,
    StoreEvent, TrialStatus,
};
use super::reader::{metric_from_row, METRIC_COLUMNS};
use super::schema::read_counters;

/// Everything the log says about an experiment, as of its last committed event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExperimentState {
    pub experiment_id: String,
    /// The config as created, with every [`StoreEvent::ConfigUpdated`] applied.
    pub config: Value,
    pub start_time_ms: i64,
    pub status: ExperimentStatus,
    pub status_message: Option<String>,
    /// Starts with `INITIALIZED` at creation.
    pub status_history: Vec<StatusChange>,
    pub config_updates: Vec<ConfigUpdate>,
    /// In creation order (by trial sequence).
    pub trials: Vec<TrialState>,
    pub warnings: Vec<WarningRecord>,
    /// The next ids to hand out: never below anything in the log or in the counters table.
    pub counters: Counters,
    pub last_event_seq: EventSeq,
    pub last_event_time_ms: i64,
    /// The last moment the run that wrote the store is known to have lived: its last event, or
    /// later, the last time its writer marked the run alive while idle
    /// ([`ALIVE_FILE_NAME`](super::ALIVE_FILE_NAME)). What a crashed run's time budget is
    /// counted up to.
    pub last_alive_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusChange {
    pub seq: EventSeq,
    pub time_ms: i64,
    pub status: ExperimentStatus,
    pub message: Option<String>,
    /// See `StoreEvent::ExperimentStatusChanged`.
    pub spent_before_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigUpdate {
    pub seq: EventSeq,
    pub time_ms: i64,
    pub field: String,
    pub value: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WarningRecord {
    pub seq: EventSeq,
    pub time_ms: i64,
    pub trial_id: Option<String>,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrialState {
    pub trial_id: String,
    pub sequence: u64,
    pub parameter_id: u64,
    /// The tuner's label for the parameters, the id the trial sees (see `StoreEvent::TrialCreated`).
    pub parameter_label: Option<String>,
    pub parameters: Value,
    /// For a population member: where it comes from (see `StoreEvent::TrialCreated`).
    pub lineage: Option<Lineage>,
    pub status: TrialStatus,
    pub created_ms: i64,
    /// Attempt `n` is `attempts[n - 1]`.
    pub attempts: Vec<TrialAttempt>,
    /// How the trial ended, while its status is final.
    pub end: Option<TrialEnd>,
    /// How the manager decided to end it while it was not final (see
    /// `StoreEvent::TrialStopping`); cleared when it ends or is requeued.
    pub stopping: Option<Stopping>,
    /// Every attempt's metrics, in log order; each names its attempt.
    pub metrics: Vec<MetricRecord>,
    /// The `seq` of each metric recorded while `stopping` was set: once the manager decides to
    /// end an attempt, no assessor judges its results (see `Manager::act_on_metric`), so a
    /// resume does not tell its assessor of them either. In log order.
    #[serde(skip)]
    pub metrics_after_stopping: Vec<EventSeq>,
    /// The host memory (MiB) its attempts ask for since it ran out of memory, when the manager
    /// raised it (`maxOomRetries`); `None` while it asks for `trialMemorySize`.
    pub memory_request_mib: Option<u64>,
    /// The GPU memory (MiB per GPU) its attempts ask for since it ran out of GPU memory, when
    /// the manager raised it; `None` while it asks for `trialGpuMemory`.
    pub gpu_memory_request_mib: Option<u64>,
}

/// An end the manager decided on and asked the trial's service for (`StoreEvent::TrialStopping`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stopping {
    pub status: TrialStatus,
    pub message: String,
}

impl Stopping {
    /// Whether this stop came with a stop of the whole experiment, which a resume undoes (see
    /// [`STOPPED_WITH_EXPERIMENT`]).
    pub fn with_experiment(&self) -> bool {
        stopped_with_experiment(self.status, Some(&self.message))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrialAttempt {
    pub number: u32,
    pub environment_id: String,
    pub gpu_indices: Vec<u32>,
    pub pid: Option<u32>,
    pub started_ms: i64,
    pub end: Option<TrialEnd>,
    /// Set when this attempt was given up for a new one.
    pub requeued: Option<Requeue>,
    /// The peak resident memory (MiB) its service sampled, where reported (at its end).
    pub peak_memory_mib: Option<u64>,
    /// The peak GPU memory (MiB, on its fullest GPU) its service read from NVML, where known.
    pub peak_gpu_memory_mib: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrialEnd {
    /// The event that recorded it: where, among the metrics, the trial ended (a resume tells
    /// its assessor of the end there).
    #[serde(skip)]
    pub seq: EventSeq,
    pub time_ms: i64,
    pub status: TrialStatus,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub message: Option<String>,
    pub stderr_tail: Option<String>,
}

/// The end message of a trial that was cancelled because the whole experiment was stopped
/// (`knob stop`, Ctrl-C, the API's stop), unlike one the user killed (`knob trial kill`): the
/// status is USER_CANCELED for both, and this message is what lets `knob resume` run the former
/// again as a new attempt, as after a crash.
pub const STOPPED_WITH_EXPERIMENT: &str =
    "stopped with the experiment; `knob resume` runs it again";

/// What earlier versions recorded for the same (nothing else wrote it).
const STOPPED_WITH_EXPERIMENT_BEFORE: &str = "stopped by the user";

/// The end message of a trial cancelled (SYS_CANCELED) because the experiment failed (its store
/// could not be written, its tuner or a service failed): it did not end on its own either, and
/// `knob resume`, once the cause is fixed, runs it again as it runs one a crash cut short.
pub const CANCELED_WITH_FAILED_EXPERIMENT: &str =
    "the experiment failed; `knob resume` runs it again";

/// What earlier versions recorded for the same (which `knob resume` left ended).
const CANCELED_WITH_FAILED_EXPERIMENT_BEFORE: &str = "the experiment failed";

impl TrialEnd {
    /// Whether the trial was cancelled by a stop of the whole experiment
    /// ([`STOPPED_WITH_EXPERIMENT`]) or by its failure ([`CANCELED_WITH_FAILED_EXPERIMENT`]).
    pub fn stopped_with_experiment(&self) -> bool {
        stopped_with_experiment(self.status, self.message.as_deref())
    }
}

/// Whether an end (or a stop decided) with this status and message came with a stop or a
/// failure of the whole experiment (see [`STOPPED_WITH_EXPERIMENT`],
/// [`CANCELED_WITH_FAILED_EXPERIMENT`]): such a trial runs again on resume.
pub(crate) fn stopped_with_experiment(status: TrialStatus, message: Option<&str>) -> bool {
    match status {
        TrialStatus::UserCanceled => matches!(
            message,
            Some(STOPPED_WITH_EXPERIMENT | STOPPED_WITH_EXPERIMENT_BEFORE)
        ),
        TrialStatus::SysCanceled => matches!(
            message,
            Some(CANCELED_WITH_FAILED_EXPERIMENT | CANCELED_WITH_FAILED_EXPERIMENT_BEFORE)
        ),
        _ => false,
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Requeue {
    pub time_ms: i64,
    pub reason: String,
    /// The memory request of the next attempt, when raised (see `StoreEvent::TrialRequeued`).
    pub memory_request_mib: Option<u64>,
    /// The GPU memory request of the next attempt, when raised.
    pub gpu_memory_request_mib: Option<u64>,
}

impl ExperimentState {
    pub fn trial(&self, trial_id: &str) -> Option<&TrialState> {
        self.trials.iter().find(|trial| trial.trial_id == trial_id)
    }

    /// Milliseconds spent in [active](ExperimentStatus::is_active) statuses up to `until_ms`:
    /// what counts toward `maxExperimentDuration`. After a crash, pass
    /// [`last_alive_ms`](Self::last_alive_ms), the last moment known to be lived.
    pub fn active_time_ms(&self, until_ms: i64) -> i64 {
        active_time_ms(&self.status_history, until_ms)
    }
}

/// [`ExperimentState::active_time_ms`] of a status history (oldest first), for a reader that
/// has the history without the rest of the state (`StoreReader::active_time_ms`).
pub(crate) fn active_time_ms(history: &[StatusChange], until_ms: i64) -> i64 {
    let mut total = 0;
    for (index, change) in history.iter().enumerate() {
        // A run that said what was spent before it: its figure, not the segments before
        // (the last of which, a crashed run's, reaches to this start).
        if let Some(before) = change
            .spent_before_ms
            .filter(|_| change.time_ms <= until_ms)
        {
            total = i64::try_from(before).unwrap_or(i64::MAX);
        }
        let end = history.get(index + 1).map_or(until_ms, |next| next.time_ms);
        if change.status.is_active() {
            total += (end.min(until_ms) - change.time_ms).max(0);
        }
    }
    total
}

impl TrialState {
    /// The attempt now running or last run; 0 before the first start.
    pub fn current_attempt(&self) -> u32 {
        self.attempts.last().map_or(0, |attempt| attempt.number)
    }

    /// The first final metric of the current attempt: the trial's final (a later one is
    /// recorded but ignored, live as here).
    pub fn final_metric(&self) -> Option<&MetricRecord> {
        let current = self.current_attempt();
        self.metrics
            .iter()
            .find(|metric| metric.kind == MetricKind::Final && metric.attempt == current)
    }

    pub fn started_ms(&self) -> Option<i64> {
        self.attempts.last().map(|attempt| attempt.started_ms)
    }

    pub fn ended_ms(&self) -> Option<i64> {
        self.end.as_ref().map(|end| end.time_ms)
    }
}

/// Sets the dotted camelCase path `field` in `config`, creating objects on the way.
pub(crate) fn set_config_field(
    config: &mut Value,
    field: &str,
    value: Value,
) -> Result<(), String> {
    let keys: Vec<&str> = field.split('.').collect();
    if keys.iter().any(|key| key.is_empty()) {
        return Err("expected a dotted path of field names, e.g. trialConcurrency".to_string());
    }
    let (last, parents) = keys.split_last().expect("split yields at least one key");
    let mut object = config;
    for (depth, key) in parents.iter().enumerate() {
        let map = object
            .as_object_mut()
            .ok_or_else(|| format!("{} is not an object", keys[..depth].join(".")))?;
        object = map
            .entry(key.to_string())
            .or_insert_with(|| Value::Object(Default::default()));
    }
    let map = object.as_object_mut().ok_or_else(|| {
        let parent = parents.join(".");
        format!(
            "{} is not an object",
            if parent.is_empty() {
                "the config"
            } else {
                &parent
            }
        )
    })?;
    map.insert(last.to_string(), value);
    Ok(())
}

/// Replays the whole log in one read transaction, so the state is one committed moment.
pub(crate) fn replay(connection: &Connection, path: &str) -> Result<ExperimentState, StoreError> {
    let read_error = |e: rusqlite::Error| {
        or_known_cause(&e, path, |path, message| StoreError::Read { path, message })
    };
    let transaction = connection.unchecked_transaction().map_err(read_error)?;
    let mut replayer = Replayer::new(path);
    let mut events_statement = transaction
        .prepare("SELECT seq, time_ms, payload FROM events ORDER BY seq")
        .map_err(read_error)?;
    let mut events = events_statement.query([]).map_err(read_error)?;
    let mut metrics_statement = transaction
        .prepare(&format!(
            "SELECT {METRIC_COLUMNS} FROM metrics ORDER BY seq"
        ))
        .map_err(read_error)?;
    let mut metrics = metrics_statement.query([]).map_err(read_error)?;

    let mut next_event = read_event(events.next().map_err(read_error)?, path)?;
    let mut next_metric = match metrics.next().map_err(read_error)? {
        Some(row) => Some(metric_from_row(row).map_err(read_error)?),
        None => None,
    };
    loop {
        let take_event = match (&next_event, &next_metric) {
            (None, None) => break,
            (Some(event), Some(metric)) => event.seq < metric.seq,
            (Some(_), None) => true,
            (None, Some(_)) => false,
        };
        if take_event {
            let event = next_event.take().expect("checked above");
            replayer.apply(event)?;
            next_event = read_event(events.next().map_err(read_error)?, path)?;
        } else {
            let metric = next_metric.take().expect("checked above");
            replayer.apply_metric(metric)?;
            next_metric = match metrics.next().map_err(read_error)? {
                Some(row) => Some(metric_from_row(row).map_err(read_error)?),
                None => None,
            };
        }
    }
    let stored_counters = read_counters(&transaction).map_err(read_error)?;
    replayer.finish(stored_counters)
}

fn read_event(
    row: Option<&rusqlite::Row<'_>>,
    path: &str,
) -> Result<Option<EventRecord>, StoreError> {
    let Some(row) = row else { return Ok(None) };
    let read_error = |e: rusqlite::Error| {
        or_known_cause(&e, path, |path, message| StoreError::Read { path, message })
    };
    let seq: i64 = row.get(0).map_err(read_error)?;
    let time_ms: i64 = row.get(1).map_err(read_error)?;
    let payload: String = row.get(2).map_err(read_error)?;
    let event = serde_json::from_str(&payload).map_err(|e| StoreError::Corrupt {
        path: path.to_string(),
        seq: seq as u64,
        message: format!("undecodable event: {e}"),
    })?;
    Ok(Some(EventRecord {
        seq: seq as u64,
        time_ms,
        event,
    }))
}

struct Replayer {
    path: String,
    state: Option<ExperimentState>,
    trial_index: HashMap<String, usize>,
    last_seq: EventSeq,
    last_time_ms: i64,
}

impl Replayer {
    fn new(path: &str) -> Replayer {
        Replayer {
            path: path.to_string(),
            state: None,
            trial_index: HashMap::new(),
            last_seq: 0,
            last_time_ms: 0,
        }
    }

    fn corrupt(&self, seq: EventSeq, message: String) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            seq,
            message,
        }
    }

    fn advance(&mut self, seq: EventSeq, time_ms: i64) -> Result<(), StoreError> {
        if seq <= self.last_seq {
            return Err(self.corrupt(seq, format!("sequence {seq} appears twice")));
        }
        self.last_seq = seq;
        self.last_time_ms = self.last_time_ms.max(time_ms);
        Ok(())
    }

    fn state(&mut self, seq: EventSeq) -> Result<&mut ExperimentState, StoreError> {
        if self.state.is_none() {
            return Err(self.corrupt(seq, "event before the experiment was created".to_string()));
        }
        Ok(self.state.as_mut().expect("checked above"))
    }

    fn trial(&mut self, seq: EventSeq, trial_id: &str) -> Result<&mut TrialState, StoreError> {
        let Some(&index) = self.trial_index.get(trial_id) else {
            return Err(self.corrupt(seq, format!("event for unknown trial {trial_id:?}")));
        };
        Ok(&mut self.state(seq)?.trials[index])
    }

    fn apply_metric(&mut self, metric: MetricRecord) -> Result<(), StoreError> {
        self.advance(metric.seq, metric.time_ms)?;
        let seq = metric.seq;
        let trial_id = metric.trial_id.clone();
        let trial = self.trial(seq, &trial_id)?;
        if trial.stopping.is_some() {
            trial.metrics_after_stopping.push(seq);
        }
        trial.metrics.push(metric);
        Ok(())
    }

    fn apply(&mut self, record: EventRecord) -> Result<(), StoreError> {
        let EventRecord {
            seq,
            time_ms,
            event,
        } = record;
        self.advance(seq, time_ms)?;
        match event {
            StoreEvent::ExperimentCreated {
                experiment_id,
                config,
                start_time_ms,
            } => {
                if self.state.is_some() {
                    return Err(self.corrupt(seq, "the experiment is created twice".to_string()));
                }
                self.state = Some(ExperimentState {
                    experiment_id,
                    config,
                    start_time_ms,
                    status: ExperimentStatus::Initialized,
                    status_message: None,
                    status_history: vec![StatusChange {
                        seq,
                        time_ms,
                        status: ExperimentStatus::Initialized,
                        message: None,
                        spent_before_ms: None,
                    }],
                    config_updates: Vec::new(),
                    trials: Vec::new(),
                    warnings: Vec::new(),
                    counters: Counters::default(),
                    last_event_seq: 0,
                    last_event_time_ms: 0,
                    last_alive_ms: 0,
                });
            }
            StoreEvent::ExperimentStatusChanged {
                status,
                message,
                spent_before_ms,
            } => {
                let state = self.state(seq)?;
                state.status = status;
                state.status_message.clone_from(&message);
                state.status_history.push(StatusChange {
                    seq,
                    time_ms,
                    status,
                    message,
                    spent_before_ms,
                });
            }
            StoreEvent::ConfigUpdated { field, value } => {
                let state = self.state(seq)?;
                let applied = set_config_field(&mut state.config, &field, value.clone());
                state.config_updates.push(ConfigUpdate {
                    seq,
                    time_ms,
                    field,
                    value,
                });
                applied.map_err(|message| self.corrupt(seq, message))?;
            }
            StoreEvent::TrialCreated {
                trial_id,
                sequence,
                parameter_id,
                parameter_label,
                parameters,
                lineage,
            } => {
                if self.trial_index.contains_key(&trial_id) {
                    return Err(self.corrupt(seq, format!("trial {trial_id:?} is created twice")));
                }
                let state = self.state(seq)?;
                let index = state.trials.len();
                state.trials.push(TrialState {
                    trial_id: trial_id.clone(),
                    sequence,
                    parameter_id,
                    parameter_label,
                    parameters,
                    lineage: lineage.map(|l| *l),
                    status: TrialStatus::Waiting,
                    created_ms: time_ms,
                    attempts: Vec::new(),
                    end: None,
                    stopping: None,
                    metrics: Vec::new(),
                    metrics_after_stopping: Vec::new(),
                    memory_request_mib: None,
                    gpu_memory_request_mib: None,
                });
                self.trial_index.insert(trial_id, index);
            }
            StoreEvent::TrialStarted {
                trial_id,
                attempt,
                environment_id,
                gpu_indices,
                pid,
            } => {
                let trial = self.trial(seq, &trial_id)?;
                trial.status = TrialStatus::Running;
                trial.end = None;
                trial.attempts.push(TrialAttempt {
                    number: attempt,
                    environment_id,
                    gpu_indices,
                    pid,
                    started_ms: time_ms,
                    end: None,
                    requeued: None,
                    peak_memory_mib: None,
                    peak_gpu_memory_mib: None,
                });
            }
            StoreEvent::TrialEnded {
                trial_id,
                attempt,
                status,
                exit_code,
                signal,
                message,
                stderr_tail,
                peak_memory_mib,
                peak_gpu_memory_mib,
                ended_ms,
            } => {
                let trial = self.trial(seq, &trial_id)?;
                let started_ms = trial
                    .attempts
                    .iter()
                    .find(|a| a.number == attempt && a.end.is_none())
                    .map(|a| a.started_ms);
                let end = TrialEnd {
                    seq,
                    time_ms: super::event::end_time(ended_ms, time_ms, started_ms),
                    status,
                    exit_code,
                    signal,
                    message,
                    stderr_tail,
                };
                if let Some(ended) = trial
                    .attempts
                    .iter_mut()
                    .find(|a| a.number == attempt && a.end.is_none())
                {
                    ended.end = Some(end.clone());
                    ended.peak_memory_mib = ended.peak_memory_mib.or(peak_memory_mib);
                    ended.peak_gpu_memory_mib = ended.peak_gpu_memory_mib.or(peak_gpu_memory_mib);
                }
                trial.status = status;
                trial.end = Some(end);
                trial.stopping = None;
            }
            StoreEvent::TrialStopping {
                trial_id,
                status,
                message,
            } => {
                self.trial(seq, &trial_id)?.stopping = Some(Stopping { status, message });
            }
            StoreEvent::TrialRequeued {
                trial_id,
                reason,
                memory_request_mib,
                gpu_memory_request_mib,
                peak_memory_mib,
                peak_gpu_memory_mib,
            } => {
                let trial = self.trial(seq, &trial_id)?;
                trial.status = TrialStatus::Waiting;
                trial.end = None;
                trial.stopping = None;
                if memory_request_mib.is_some() {
                    trial.memory_request_mib = memory_request_mib;
                }
                if gpu_memory_request_mib.is_some() {
                    trial.gpu_memory_request_mib = gpu_memory_request_mib;
                }
                if let Some(attempt) = trial.attempts.last_mut() {
                    attempt.peak_memory_mib = attempt.peak_memory_mib.or(peak_memory_mib);
                    attempt.peak_gpu_memory_mib =
                        attempt.peak_gpu_memory_mib.or(peak_gpu_memory_mib);
                    attempt.requeued = Some(Requeue {
                        time_ms,
                        reason,
                        memory_request_mib,
                        gpu_memory_request_mib,
                    });
                }
            }
            StoreEvent::Metric { .. } => {
                return Err(self.corrupt(seq, "a metric in the events table".to_string()));
            }
            StoreEvent::Warning { trial_id, message } => {
                self.state(seq)?.warnings.push(WarningRecord {
                    seq,
                    time_ms,
                    trial_id,
                    message,
                });
            }
        }
        Ok(())
    }

    fn finish(self, stored_counters: Counters) -> Result<ExperimentState, StoreError> {
        let Some(mut state) = self.state else {
            return Err(StoreError::NoExperiment { path: self.path });
        };
        let from_log = Counters {
            next_event_seq: self.last_seq + 1,
            next_trial_sequence: state
                .trials
                .iter()
                .map(|t| t.sequence + 1)
                .max()
                .unwrap_or(0),
            next_parameter_id: state
                .trials
                .iter()
                .map(|t| t.parameter_id + 1)
                .max()
                .unwrap_or(0),
        };
        state.counters = from_log.at_least(stored_counters);
        state.last_event_seq = self.last_seq;
        state.last_event_time_ms = self.last_time_ms;
        state.last_alive_ms = alive_mark_ms(&self.path)
            .map_or(self.last_time_ms, |marked| marked.max(self.last_time_ms));
        Ok(state)
    }
}

/// When the writer of the store at `path` last marked its run alive, in ms since the epoch.
pub(super) fn alive_mark_ms(path: &str) -> Option<i64> {
    let folder = std::path::Path::new(path)
        .parent()
        .filter(|folder| !folder.as_os_str().is_empty())?;
    let modified = std::fs::metadata(folder.join(super::ALIVE_FILE_NAME))
        .and_then(|metadata| metadata.modified())
        .ok()?;
    let since_epoch = modified.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(since_epoch.as_millis()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `knob resume` runs again: trials a stop or a failure of the whole experiment
    /// cancelled (in this version's words and the earlier ones'), not those the user killed,
    /// a deadline ended, or that failed on their own.
    #[test]
    fn only_trials_cancelled_with_the_whole_experiment_count_as_stopped_with_it() {
        let cases = [
            (TrialStatus::UserCanceled, STOPPED_WITH_EXPERIMENT, true),
            (TrialStatus::UserCanceled, "stopped by the user", true),
            (TrialStatus::UserCanceled, "killed by the user", false),
            (
                TrialStatus::SysCanceled,
                CANCELED_WITH_FAILED_EXPERIMENT,
                true,
            ),
            (TrialStatus::SysCanceled, "the experiment failed", true),
            (
                TrialStatus::SysCanceled,
                "maxExperimentDuration reached",
                false,
            ),
            (TrialStatus::SysCanceled, "maxTrialDuration reached", false),
            (TrialStatus::SysCanceled, STOPPED_WITH_EXPERIMENT, false),
            (
                TrialStatus::UserCanceled,
                CANCELED_WITH_FAILED_EXPERIMENT,
                false,
            ),
            (TrialStatus::Failed, CANCELED_WITH_FAILED_EXPERIMENT, false),
        ];
        for (status, message, expected) in cases {
            assert_eq!(
                stopped_with_experiment(status, Some(message)),
                expected,
                "{status:?} {message:?}"
            );
        }
        assert!(!stopped_with_experiment(TrialStatus::UserCanceled, None));
    }
}
