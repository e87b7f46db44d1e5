//! The event model: what the log holds, one [`StoreEvent`] per state change.
//!
//! The JSON form of every type here is written to disk, so it is part of the store's schema:
//! renaming a variant or a field needs a schema version bump (see `schema.rs`). Adding an
//! `Option` field is safe, since a missing `Option` reads back as `None`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where a population member comes from (population-based training, issue 15): the trials are
/// named by id. A member of the first generation has neither.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lineage {
    /// The member whose checkpoint it starts from (`KNOB_RESTORE_FROM`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The member it replaces, which the tuner stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<String>,
    /// How many intermediate results the parent had reported when it was cloned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_step: Option<u64>,
}

/// Position of an event in the log: 1 for the first event, +1 for each one after, with no gaps
/// and never reused. Metrics and the other events share this one sequence.
pub type EventSeq = u64;

/// Experiment statuses, spelled as NNI spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ExperimentStatus {
    /// Created, no trial submitted yet.
    Initialized,
    Running,
    /// `maxTrialNumber` reached; running trials are finishing.
    NoMoreTrial,
    /// The tuner has nothing more to try; running trials are finishing.
    TunerNoMoreTrial,
    Stopping,
    /// Stopped by the user or a signal; resumable.
    Stopped,
    /// The budget is spent or the tuner is exhausted, and every trial has ended.
    Done,
    Error,
}

impl ExperimentStatus {
    pub const ALL: [ExperimentStatus; 8] = [
        Self::Initialized,
        Self::Running,
        Self::NoMoreTrial,
        Self::TunerNoMoreTrial,
        Self::Stopping,
        Self::Stopped,
        Self::Done,
        Self::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Initialized => "INITIALIZED",
            Self::Running => "RUNNING",
            Self::NoMoreTrial => "NO_MORE_TRIAL",
            Self::TunerNoMoreTrial => "TUNER_NO_MORE_TRIAL",
            Self::Stopping => "STOPPING",
            Self::Stopped => "STOPPED",
            Self::Done => "DONE",
            Self::Error => "ERROR",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == text)
    }

    /// Whether the experiment ended (DONE, STOPPED or ERROR): nothing runs it any more.
    pub fn has_ended(self) -> bool {
        matches!(self, Self::Done | Self::Stopped | Self::Error)
    }

    /// Whether time in this status counts toward `maxExperimentDuration`: the manager is up and
    /// the experiment has trials to run or to wait for.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            Self::Running | Self::NoMoreTrial | Self::TunerNoMoreTrial | Self::Stopping
        )
    }
}

/// Trial statuses, spelled as NNI spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TrialStatus {
    Waiting,
    Running,
    Succeeded,
    Failed,
    UserCanceled,
    SysCanceled,
    EarlyStopped,
}

impl TrialStatus {
    pub const ALL: [TrialStatus; 7] = [
        Self::Waiting,
        Self::Running,
        Self::Succeeded,
        Self::Failed,
        Self::UserCanceled,
        Self::SysCanceled,
        Self::EarlyStopped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Waiting => "WAITING",
            Self::Running => "RUNNING",
            Self::Succeeded => "SUCCEEDED",
            Self::Failed => "FAILED",
            Self::UserCanceled => "USER_CANCELED",
            Self::SysCanceled => "SYS_CANCELED",
            Self::EarlyStopped => "EARLY_STOPPED",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == text)
    }

    /// Whether a trial in this status has ended (a [`StoreEvent::TrialEnded`] status).
    pub fn is_final(self) -> bool {
        !matches!(self, Self::Waiting | Self::Running)
    }
}

/// Whether a metric is one of a trial's intermediate results or its final result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricKind {
    Intermediate,
    Final,
}

impl MetricKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Intermediate => "intermediate",
            Self::Final => "final",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "intermediate" => Some(Self::Intermediate),
            "final" => Some(Self::Final),
            _ => None,
        }
    }
}

/// One state change of an experiment. The log of these, in order, is the experiment.
///
/// Rules the writer enforces (an event breaking one is refused with
/// [`StoreError::Rejected`](super::StoreError::Rejected), the rest of its batch is kept):
/// - `ExperimentCreated` once, before any status change or config update.
/// - `TrialCreated`: trial id and parameter id unused; `sequence` not below the trial-sequence
///   counter, so trial sequences never go back, even across resumes.
/// - Attempts are numbered from 1. `TrialStarted` takes a `WAITING` trial to `RUNNING` and must
///   name the next attempt; `TrialEnded` names the current attempt (0 for a trial that never
///   started) of a `WAITING` or `RUNNING` trial and a final status; `TrialRequeued` takes a
///   started or ended trial back to `WAITING` for a new attempt (a retry, a resume that cannot
///   re-attach to a running process, or a resume of a trial a stop of the experiment
///   cancelled, which may never have started).
/// - `TrialStopping` names a `WAITING` or `RUNNING` trial and a final status.
/// - `Metric`: the trial exists, `attempt` is one it started, and (trial, attempt, kind,
///   trial_sequence) is new, so a metric delivered twice is stored once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StoreEvent {
    ExperimentCreated {
        experiment_id: String,
        /// The canonical config, as `core::config` writes it.
        config: Value,
        start_time_ms: i64,
    },
    ExperimentStatusChanged {
        status: ExperimentStatus,
        message: Option<String>,
        /// On the `RUNNING` that starts a run: the experiment time spent before it, as that run
        /// worked it out (a crashed run counted up to its last sign of life, see
        /// `ExperimentState::last_alive_ms`). Time is counted from it on: the crashed run's
        /// status stays active until this event (nothing recorded its end), and the stretch
        /// between the crash and the resume is no run's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        spent_before_ms: Option<u64>,
    },
    /// A live edit of the config (e.g. `trialConcurrency`, `maxTrialNumber`). `field` is a
    /// dotted path of camelCase keys into the config object; objects on the way are created.
    ConfigUpdated { field: String, value: Value },
    TrialCreated {
        trial_id: String,
        sequence: u64,
        parameter_id: u64,
        /// The parameter id the trial sees when the tuner labeled its parameters (NNI
        /// Hyperband's `"0-4_0_3"`); absent otherwise.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parameter_label: Option<String>,
        parameters: Value,
        /// For a population member (population-based training): where it comes from. Boxed:
        /// most trials have none, and every event crosses the writer's queue.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lineage: Option<Box<Lineage>>,
    },
    TrialStarted {
        trial_id: String,
        attempt: u32,
        environment_id: String,
        gpu_indices: Vec<u32>,
        /// The trial's process (and process-group leader), when it runs on this machine.
        pid: Option<u32>,
    },
    TrialEnded {
        trial_id: String,
        attempt: u32,
        status: TrialStatus,
        exit_code: Option<i32>,
        signal: Option<i32>,
        message: Option<String>,
        stderr_tail: Option<String>,
        /// The attempt's peak resident memory (MiB) as its service sampled it, where reported.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peak_memory_mib: Option<u64>,
        /// The attempt's peak GPU memory (MiB, on its fullest GPU), where its service read it
        /// (NVML).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peak_gpu_memory_mib: Option<u64>,
        /// When the attempt ended (Unix ms), where its service reported it later than it
        /// happened (a host that could not be reached meanwhile); absent: the event's own time. Read
        /// through [`end_time`], which keeps it between the attempt's start and the event.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ended_ms: Option<i64>,
    },
    /// The manager decided to end a running trial (the tuner or the assessor stopped it, the
    /// user killed it, it ran past `maxTrialDuration`) and asked its service to kill it; its
    /// `TrialEnded` follows with this status and message once it is gone. Recorded before the
    /// kill is asked for, so that the decision outlives a crash of the manager in between: a
    /// resume ends the trial so rather than running it again (a population member the tuner
    /// replaced would otherwise train on beside its successor).
    TrialStopping {
        trial_id: String,
        status: TrialStatus,
        message: String,
    },
    TrialRequeued {
        trial_id: String,
        reason: String,
        /// The host memory (MiB) the next attempt asks for, when the manager raised it after
        /// the trial ran out of memory (`maxOomRetries`); absent otherwise.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        memory_request_mib: Option<u64>,
        /// The GPU memory (MiB per GPU) the next attempt asks for, when the manager raised it
        /// after the trial ran out of GPU memory; absent otherwise.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu_memory_request_mib: Option<u64>,
        /// What the attempt given up used (see `TrialEnded`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peak_memory_mib: Option<u64>,
        /// The attempt's peak GPU memory (MiB, on its fullest GPU), where its service read it
        /// (NVML).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peak_gpu_memory_mib: Option<u64>,
    },
    Metric {
        trial_id: String,
        attempt: u32,
        kind: MetricKind,
        /// The trial's own numbering of its reports (NNI's `sequence`).
        trial_sequence: u64,
        /// The value exactly as the trial sent it (may hold `NaN`, `Infinity`, any JSON).
        raw: String,
        /// The decoded default value. Only finite numbers are kept: the writer stores `NaN` and
        /// `±Infinity` as `None` (SQLite has no NaN), `raw` keeps what was sent.
        value: Option<f64>,
    },
    Warning {
        trial_id: Option<String>,
        message: String,
    },
}

/// The time a `TrialEnded` records as the attempt's end: the `ended_ms` its service reported,
/// if any, else `recorded_ms`, the event's own time. A reported time is never later than the
/// event nor before the attempt started (`started_ms`): it comes from another machine's clock.
pub(crate) fn end_time(ended_ms: Option<i64>, recorded_ms: i64, started_ms: Option<i64>) -> i64 {
    match ended_ms {
        Some(ended) => ended.min(recorded_ms).max(started_ms.unwrap_or(i64::MIN)),
        None => recorded_ms,
    }
}

impl StoreEvent {
    /// The event's `type` tag, also the `kind` column of the `events` table.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ExperimentCreated { .. } => "experiment_created",
            Self::ExperimentStatusChanged { .. } => "experiment_status_changed",
            Self::ConfigUpdated { .. } => "config_updated",
            Self::TrialCreated { .. } => "trial_created",
            Self::TrialStarted { .. } => "trial_started",
            Self::TrialEnded { .. } => "trial_ended",
            Self::TrialStopping { .. } => "trial_stopping",
            Self::TrialRequeued { .. } => "trial_requeued",
            Self::Metric { .. } => "metric",
            Self::Warning { .. } => "warning",
        }
    }

    /// The trial this event is about, if any.
    pub fn trial_id(&self) -> Option<&str> {
        match self {
            Self::TrialCreated { trial_id, .. }
            | Self::TrialStarted { trial_id, .. }
            | Self::TrialEnded { trial_id, .. }
            | Self::TrialStopping { trial_id, .. }
            | Self::TrialRequeued { trial_id, .. }
            | Self::Metric { trial_id, .. } => Some(trial_id),
            Self::Warning { trial_id, .. } => trial_id.as_deref(),
            Self::ExperimentCreated { .. }
            | Self::ExperimentStatusChanged { .. }
            | Self::ConfigUpdated { .. } => None,
        }
    }
}

/// An event as the log holds it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventRecord {
    pub seq: EventSeq,
    /// Milliseconds since the Unix epoch, stamped by the writer; never decreases along the log.
    pub time_ms: i64,
    pub event: StoreEvent,
}

/// A stored metric.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricRecord {
    pub seq: EventSeq,
    pub time_ms: i64,
    pub trial_id: String,
    pub attempt: u32,
    pub kind: MetricKind,
    pub trial_sequence: u64,
    pub raw: String,
    pub value: Option<f64>,
}

impl MetricRecord {
    pub fn to_event(&self) -> StoreEvent {
        StoreEvent::Metric {
            trial_id: self.trial_id.clone(),
            attempt: self.attempt,
            kind: self.kind,
            trial_sequence: self.trial_sequence,
            raw: self.raw.clone(),
            value: self.value,
        }
    }
}

/// The next ids to hand out. They only grow: each is kept in the `counters` table, updated in
/// the transaction of the event that consumes an id, and is also derivable from the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Counters {
    pub next_event_seq: EventSeq,
    pub next_trial_sequence: u64,
    pub next_parameter_id: u64,
}

impl Counters {
    pub(crate) fn at_least(self, other: Counters) -> Counters {
        Counters {
            next_event_seq: self.next_event_seq.max(other.next_event_seq),
            next_trial_sequence: self.next_trial_sequence.max(other.next_trial_sequence),
            next_parameter_id: self.next_parameter_id.max(other.next_parameter_id),
        }
    }
}

/// Which way "best" goes for [`StoreReader::best_trials`](super::StoreReader::best_trials).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Maximize,
    Minimize,
}

impl Direction {
    /// NNI's `optimize_mode`, as the tuner named `tuner` (the config's `tuner.name`; `None`
    /// for a custom class) reads it: `"maximize"` or `"minimize"`, spelled so; absent or null,
    /// that tuner's default ([`Direction::default_for`]). Anything else is an error, the message
    /// saying what is allowed. The one reading of it: the config reader refuses a config with
    /// any other value, and every other reader goes through [`Direction::of_config`].
    pub fn from_optimize_mode(
        tuner: Option<&str>,
        value: Option<&Value>,
    ) -> Result<Direction, String> {
        match value {
            None | Some(Value::Null) => Ok(Direction::default_for(tuner)),
            Some(Value::String(mode)) if mode == "maximize" => Ok(Direction::Maximize),
            Some(Value::String(mode)) if mode == "minimize" => Ok(Direction::Minimize),
            Some(other) => Err(format!("must be \"maximize\" or \"minimize\", got {other}")),
        }
    }

    /// What the tuner named `tuner` optimises when its classArgs give no `optimize_mode`:
    /// minimize for the NNI algorithms whose class defaults so (`TPE`, `Anneal`, `TPE_legacy`:
    /// `NniAlgorithm::minimizes_by_default`; knob's native versions default alike), maximize for
    /// every other, NNI's default and knob's own tuners'. "Best", the assessor's direction and
    /// the notifications must go the way the tuner goes: with maximize here, TPE minimised
    /// while knob called its worst trial the best and Medianstop stopped its best ones.
    pub fn default_for(tuner: Option<&str>) -> Direction {
        let minimizes = tuner
            .and_then(|name| {
                knob_plugin_api::host::nni_algorithm(knob_plugin_api::ComponentKind::Tuner, name)
            })
            .is_some_and(|algorithm| algorithm.minimizes_by_default);
        if minimizes {
            Direction::Minimize
        } else {
            Direction::Maximize
        }
    }

    /// The direction of an experiment from its config (the JSON form, as the store keeps it):
    /// the first objective's `mode` with `objectives`, else `tuner.classArgs.optimize_mode` as
    /// [`Direction::from_optimize_mode`] reads it for `tuner.name`. A value it refuses never
    /// passes the config reader; one in a store written before it checked reads as the
    /// tuner's default.
    pub fn of_config(config: &Value) -> Direction {
        // With `objectives`, the first objective's mode (see `ExperimentConfig::direction`).
        let first_objective = config
            .get("objectives")
            .and_then(Value::as_array)
            .and_then(|list| list.iter().find(|o| o.get("constraint").is_none()));
        if let Some(mode) = first_objective.and_then(|o| o.get("mode")) {
            return Direction::from_optimize_mode(None, Some(mode)).unwrap_or(Direction::Maximize);
        }
        let tuner = config.pointer("/tuner/name").and_then(Value::as_str);
        Direction::from_optimize_mode(tuner, config.pointer("/tuner/classArgs/optimize_mode"))
            .unwrap_or_else(|_| Direction::default_for(tuner))
    }

    /// As `optimize_mode` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Maximize => "maximize",
            Direction::Minimize => "minimize",
        }
    }
}
