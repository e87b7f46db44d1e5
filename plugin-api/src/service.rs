//! The messages between the core and a training service, as they cross the ABI (JSON).
//!
//! They live here, not in `core` or `training-services`, because both sides and third-party
//! services must agree on them. Fields may be added (with serde defaults); none is ever removed.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A place where trials run: this machine, one SSH host, one cluster allocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// Unique within the experiment, stable for the environment's life ("local", "host:gpu1").
    pub id: String,
    /// The machine's name as a user knows it.
    pub host: String,
    /// False once the environment is lost (host unreachable, allocation ended).
    pub ready: bool,
    /// The environment's resources as `knob-gpu-sched` describes them (GPUs, CPUs, memory),
    /// kept as JSON so that this crate does not depend on gpu-sched. Its `status` says what a
    /// not-ready environment is: `unavailable` (with why) or `starting`, and trials wait for it;
    /// `draining`, retired (a cluster allocation that ended, or ends soon), and they do not. An
    /// environment whose resources are not known (a host never reached) may report its status
    /// alone, `{"status": {"state": "unavailable", "reason": …}}`: the host shows why, and trials
    /// do not wait for it until it is reported ready; with `"retrying": true` beside the status
    /// (a host the service has never reached and still tries), trials wait for it with that
    /// reason rather than the experiment ending for want of an environment, until the service
    /// reaches it or reports it again without `retrying` (it gave up).
    #[serde(default)]
    pub inventory: Value,
}

/// Everything a service needs to start one trial. Parameters are bound to the trial here: the
/// service hands exactly these to exactly this trial, over whichever protocol it uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialRequest {
    pub experiment_id: String,
    /// NNI's trial job id (`NNI_TRIAL_JOB_ID`).
    pub trial_id: String,
    /// NNI's `NNI_TRIAL_SEQ_ID`: 0, 1, 2, ... in submission order.
    pub sequence: u64,
    pub parameter_id: u64,
    /// The parameter id the trial sees when its tuner labeled the parameters (NNI Hyperband's
    /// `"0-4_0_3"`; see `Suggestion::label`); else the trial sees `parameter_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameter_label: Option<String>,
    /// The parameters object the trial receives.
    pub parameters: Value,
    /// Which environment (an id from [`Environment`]) runs it.
    pub environment_id: String,
    /// Run as `/bin/bash -c <command>`.
    pub command: String,
    /// The working directory of the trial process (trialCodeDirectory).
    pub code_dir: PathBuf,
    /// The trial's own directory: logs, `parameter.cfg`, `.nni/metrics`, outputs.
    pub trial_dir: PathBuf,
    /// GPUs to expose through `CUDA_VISIBLE_DEVICES`; `None` leaves the variable alone, an
    /// empty list hides every GPU.
    #[serde(default)]
    pub gpu_indices: Option<Vec<u32>>,
    /// Extra environment variables for the trial.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// What the trial was placed with (knob extension): a service that runs trials on a machine
    /// other experiments share records it in the machine's lease ledger, and one that samples
    /// memory kills a trial that uses more host memory than `memory_mib`.
    #[serde(default, skip_serializing_if = "TrialResources::is_empty")]
    pub resources: TrialResources,
}

/// The resources a trial was placed with; `None` where the experiment asks for none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrialResources {
    /// Host memory in MiB: `trialMemorySize`, or more after the trial ran out of memory
    /// (`maxOomRetries`). The trial is killed (SIGKILL, as the kernel's OOM killer would) when
    /// its processes' resident memory exceeds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// GPU memory in MiB on each of its GPUs (`trialGpuMemory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_mib: Option<u64>,
    /// CPU cores (`trialCpuNumber`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_cores: Option<u32>,
    /// The environment's `maxTrialNumberPerGpu`, filled in by the service that owns the
    /// environment: no experiment adds a trial to these GPUs beyond it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_trials_per_gpu: Option<u32>,
}

impl TrialResources {
    pub fn is_empty(&self) -> bool {
        *self == TrialResources::default()
    }
}

/// Whether a metric is an intermediate result or the final one (NNI's PERIODICAL / FINAL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricKind {
    Intermediate,
    Final,
}

/// Something that happened in a training service, reported through its event sink.
///
/// Ordering guarantees a service gives (the core relies on them), per trial: `TrialStarted`
/// comes first; every `Metric` the trial reported before its process exited comes before its
/// `TrialEnded` (a service reads stdout and metric files to the end first); `TrialEnded` is
/// its last event, and nothing is recorded for the trial after it. A `start_trial` that
/// returns an error started nothing, and no event follows for that trial; nor does one after a
/// `StartFailed`, the same failure reported later.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServiceEvent {
    /// An environment appeared, changed or was lost.
    Environment { environment: Environment },
    /// The trial's process is running.
    TrialStarted { trial_id: String, pid: Option<u32> },
    /// A metric the trial reported. `value` is the JSON text as the trial sent it (it may hold
    /// NaN or Infinity, which strict JSON cannot), so nothing is lost before the core decodes it.
    /// `sequence` numbers the trial's intermediate metrics 0, 1, 2, ... in the order they were
    /// recorded, over every protocol it uses; final metrics are numbered on their own.
    Metric {
        trial_id: String,
        kind: MetricKind,
        sequence: u64,
        value: String,
    },
    /// The trial's process group is gone.
    TrialEnded {
        trial_id: String,
        exit_code: Option<i32>,
        signal: Option<i32>,
        /// Set when the service killed it on request; the reason given to `kill_trial`. A kill
        /// that arrives after the trial's main process exited leaves it unset.
        killed_reason: Option<String>,
        /// The last lines of its stderr, for a failed trial's message.
        stderr_tail: String,
        /// Set when the trial did not end by itself or on request but because its environment
        /// was lost (a remote host unreachable for too long): why, in one line naming the host.
        /// The core records such a trial as failed and runs it again elsewhere, and forgets the
        /// environment unless the service's latest report of it says it is ready (report it not
        /// ready first when the host is gone; report it ready first when only the trial is, as
        /// when the agent that ran it there started again).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        environment_lost: Option<String>,
        /// When the trial ended, in Unix milliseconds on the host's clock (this machine's), set
        /// by a service that reports an end later than it happened: a remote host unreachable
        /// for a while reports then what ended meanwhile. The core records the end at this
        /// time (never later than it hears of it, never before the attempt's start), and a kill
        /// it decided after this time, such as `maxTrialDuration`'s while the host could not be
        /// reached, did not end the trial. Absent: when the core hears of it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ended_ms: Option<i64>,
    },
    /// What the trial's processes used at most (knob extension), sent just before its
    /// `TrialEnded`: the peak resident memory of its processes, sampled by the service, and the
    /// peak GPU memory of its processes where NVML reports it. The core learns a larger memory
    /// request from it when the trial ran out of memory (`maxOomRetries`).
    TrialUsage {
        trial_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peak_memory_mib: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peak_gpu_memory_mib: Option<u64>,
    },
    /// The trial's checkpoint folder (`KNOB_CHECKPOINT_DIR`) holds something for the first time
    /// (knob extension, the checkpoint protocol of population-based training): a trial saves,
    /// then reports, so a service checks the folder when it records an intermediate result and
    /// sends this once, just before that result's `Metric`. A population member that never
    /// sent it is never cloned.
    CheckpointSaved { trial_id: String },
    /// A start `start_trial` accepted failed before the trial's `TrialStarted`: nothing of it
    /// runs, and no other event follows for it. `message` is what `start_trial` would have
    /// returned as its error (one containing "the trial was not started" is tried again, as
    /// there). Sent only to a host that takes it ([`ServiceContext::late_start_failures`]): a
    /// service whose starts take long (an SSH round trip to a busy host) then returns from
    /// `start_trial` at once, so that one slow start holds none of its other calls.
    StartFailed { trial_id: String, message: String },
    /// A start `start_trial` accepted did not happen because what the trial was placed on is
    /// taken (another experiment on the machine took the GPUs since the environment was
    /// reported): nothing of it runs, and no other event follows for this start. The host
    /// places the trial again, as a trial that waits for resources (not a failed start), and
    /// records `reason` as why it waits. A service sends the environment's fresh report
    /// (`Environment`) first, so that the new placement sees what changed and takes another
    /// free GPU when there is one, rather than the service waiting for the GPUs it was given.
    /// Sent only to a host that takes it ([`ServiceContext::places_again`]).
    PlaceAgain { trial_id: String, reason: String },
    /// Something a user should know that is not fatal (a garbage metric line, say).
    Warning {
        trial_id: Option<String>,
        message: String,
    },
}

/// What a failed start says when nothing of the trial ran (in `start_trial`'s error or a
/// [`ServiceEvent::StartFailed`]): the host then tries the trial again after a pause instead of
/// failing it.
pub const NOT_STARTED: &str = "the trial was not started";

/// How long the host waits for a service's `shutdown` (at an experiment's end, `knob stop`, a
/// Ctrl-C) before it goes on without it, with a warning that what the service holds may still
/// run. A service whose shutdown waits on something outside (a cluster's queue, a host's
/// trials) bounds that wait well within this, and says itself what it left behind: one that
/// runs past it has its own end (the jobs it cancelled, its trials' last ends) cut off unheard.
pub const SHUTDOWN_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// What the host asks of a running service beyond starting and killing trials (plugin ABI 1.5,
/// `TrainingService::delete_checkpoint` and what follows it), as it crosses the ABI (JSON). New
/// kinds are added here, with no change to the ABI; a service built before a kind existed
/// answers it with an error, which the host takes as "nothing done".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServiceRequest {
    /// Population-based training: no living member needs trial `trial_id`'s checkpoint folder
    /// (`KNOB_CHECKPOINT_DIR`) any more; the service deletes it wherever its trials write to a
    /// file system other than the host's (a remote host's). The host itself deletes
    /// `<experiment>/trials/<trial_id>/checkpoint` on its own machine. Sent once per trial,
    /// after the trial ended, to every service of the experiment.
    DeleteCheckpoint { trial_id: String },
    /// Population-based training: trial `trial_id`, a successor just created, starts from the
    /// checkpoint of trial `donor`, which keeps training and overwriting its folder. A service
    /// whose trials write to a file system other than the host's (a remote host's) copies the
    /// donor's folder now, where it is, and starts `trial_id` from that frozen copy wherever it
    /// runs it; the successor then starts from the donor's state at the exploitation even when
    /// it waits (no free GPU, a busy host) before starting. Sent once, as the successor is
    /// created, to the service that ran the donor, when the donor's folder is not on the host's
    /// machine (where it is, the host copies it itself). Answered `true` (a copy is being
    /// taken) or `false` (not supported: the successor starts from the donor's folder as it is
    /// when it starts).
    SnapshotCheckpoint { trial_id: String, donor: String },
    /// Population-based training: successor `trial_id` needs the frozen copy of its donor's
    /// checkpoint folder no more (it ended SUCCEEDED, EARLY_STOPPED, or FAILED with no retry
    /// left). A service that took or moved such a copy ([`ServiceRequest::SnapshotCheckpoint`])
    /// keeps it across the successor's attempts, so that a retry starts from the same state as
    /// the first attempt, and deletes it now. Sent once per successor, after its end is
    /// durable, to every service of the experiment. Answered `null`.
    DeleteSnapshot { trial_id: String },
    /// Population-based training in a hybrid experiment: successor `trial_id` is about to
    /// start under another training service than the one that ran its donor `donor` and was
    /// asked for the copy ([`ServiceRequest::SnapshotCheckpoint`]), and the donor's folder is
    /// not on the host's machine. The service brings that copy (or, without one, the donor's
    /// folder as it is now) to folder `dest` on the host's machine, where the successor's own
    /// service finds it (`<experiment>/trials/<trial_id>/restore`), and answers once done:
    /// `true` (copied), `false` (not supported, or nothing to copy). Sent to the service that
    /// ran the donor, before the successor's start.
    FetchSnapshot {
        trial_id: String,
        donor: String,
        dest: std::path::PathBuf,
    },
    /// The environments as they are now, like the `environments` call, but in full only those
    /// whose report changed since the service's answer of generation `since` (`None`: the
    /// first time). Asked in place of `environments` every few seconds while trials wait for
    /// resources, so that the host reads and compares only what changed. Answered with an
    /// [`EnvironmentChanges`]; a service built before this kind answers it with the usual
    /// "unknown request" error, and the host then asks `environments` as before.
    EnvironmentChanges { since: Option<u64> },
    /// The experiment's `trialConcurrency` was changed while it runs (`knob update
    /// concurrency`): the core hands out up to that many trials at once from now on. A service
    /// that sized anything by the value it was created with (`ServiceContext::trial`: jobs in
    /// a cluster's queue, allocations held) follows it. Sent to every service of the
    /// experiment; answered `null`. A service built before this kind keeps the value it had.
    TrialConcurrency { trial_concurrency: u32 },
    /// None of the experiment's trials waits to be placed any more (the last one was started,
    /// canceled or ended), after some did: the host stops asking for environments until one
    /// waits again. A service that stood in a shared machine's line for its waiting trials
    /// (the lease ledger) leaves it now, so that what it named is not kept from other
    /// experiments until its place lapses. Answered `null`; a service built before this kind
    /// keeps its place until it lapses.
    NothingWaits,
}

/// A service's answer to [`ServiceRequest::EnvironmentChanges`]: which environments it has, in
/// its order, and the reports of those that changed. The SDK answers it for every service (it
/// compares each report's JSON with the one it answered last,
/// `TrainingService::environment_changes`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EnvironmentChanges {
    /// Names this answer: the host asks for the changes since it the next time.
    pub generation: u64,
    /// Every environment the service has now, by id, in the order `environments` would list
    /// them.
    pub ids: Vec<String>,
    /// In full, each environment of `ids` whose report is not the one the answer of generation
    /// `since` gave: every one of them when `since` is `None` or not the service's last
    /// answer. The others are reported as they were then.
    pub changed: Vec<Environment>,
}

// ---------------------------------------------------------------------------------------------
// A service's own config: checked by the service, positioned and redacted by the host.

/// One step of a path into a service's config: a field (canonical name) or a list index.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PathStep {
    Index(usize),
    Field(String),
}

/// Where a field is in a service's config, from the service's mapping down:
/// `["machineList", 0, "password"]`, shown as `machineList[0].password`. The host maps it back to
/// the line and column the user wrote it at (matching keys as NNI does, ignoring case and
/// underscores), so a service names fields and never needs positions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FieldPath(pub Vec<PathStep>);

impl FieldPath {
    /// The service's mapping itself.
    pub fn root() -> FieldPath {
        FieldPath::default()
    }
    /// The field `name` of the mapping at this path.
    pub fn field(&self, name: impl Into<String>) -> FieldPath {
        let mut steps = self.0.clone();
        steps.push(PathStep::Field(name.into()));
        FieldPath(steps)
    }
    /// Item `index` of the list at this path.
    pub fn index(&self, index: usize) -> FieldPath {
        let mut steps = self.0.clone();
        steps.push(PathStep::Index(index));
        FieldPath(steps)
    }
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }
    /// The value at this path in a JSON tree (fields matched exactly).
    pub fn find<'v>(&self, mut value: &'v Value) -> Option<&'v Value> {
        for step in &self.0 {
            value = match step {
                PathStep::Field(name) => value.as_object()?.get(name)?,
                PathStep::Index(index) => value.as_array()?.get(*index)?,
            };
        }
        Some(value)
    }
    /// Like [`FieldPath::find`], for changing the value.
    pub fn find_mut<'v>(&self, mut value: &'v mut Value) -> Option<&'v mut Value> {
        for step in &self.0 {
            value = match step {
                PathStep::Field(name) => value.as_object_mut()?.get_mut(name)?,
                PathStep::Index(index) => value.as_array_mut()?.get_mut(*index)?,
            };
        }
        Some(value)
    }
    /// The path of the mapping or list that holds this field (the root holds itself).
    pub fn parent(&self) -> FieldPath {
        let mut steps = self.0.clone();
        steps.pop();
        FieldPath(steps)
    }
}

impl std::fmt::Display for FieldPath {
    /// `machineList[0].password`; the root is the empty string.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, step) in self.0.iter().enumerate() {
            match step {
                PathStep::Field(name) if i == 0 => write!(f, "{name}")?,
                PathStep::Field(name) => write!(f, ".{name}")?,
                PathStep::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}

/// Something wrong (or worth a warning) in a service's config: where, and what to do, in one
/// line. The host shows it as `file:line:column: trainingService.<path>: <message>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigProblem {
    pub path: FieldPath,
    pub message: String,
}

/// A field of a service's config that holds a secret (a password, a token). The host never
/// stores, logs or serves its value (it shows `***`), hands it only to the service, and on
/// resume reads it again: from the config file the experiment was created from, else from
/// `env_var`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretField {
    pub path: FieldPath,
    /// The environment variable `knob resume` reads the secret from when the original config
    /// file is gone (one variable may serve several fields, e.g. every machine's password).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_var: Option<String>,
}

/// A service's config after its service checked it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckedConfig {
    /// The canonical form: canonical field names, every default filled in, paths absolute,
    /// durations in seconds; without `platform` and the trial settings, which the host keeps.
    /// It is what `knob config check` prints, what the store keeps (secrets as `***`) and what
    /// the service is constructed with (secrets in clear). Checking it again gives it back.
    pub config: serde_json::Map<String, Value>,
    /// The fields of `config` that hold secrets.
    #[serde(default)]
    pub secrets: Vec<SecretField>,
    /// Accepted, but worth telling the user.
    #[serde(default)]
    pub warnings: Vec<ConfigProblem>,
    /// The environments this config gives, with their inventories, when the service knows them
    /// without starting (this machine, probed); `None` when only a started service can tell
    /// (remote hosts, cluster allocations). When every service of a config knows them, the host
    /// checks before it creates the experiment that a trial could ever be placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environments: Option<Vec<Environment>>,
}

/// A service's answer to a config check, as it crosses the ABI.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfigCheck {
    Checked(CheckedConfig),
    Problems(Vec<ConfigProblem>),
}

/// What the host tells a training service about the experiment, next to its config: when the
/// config is checked, when the service is constructed, and when it cleans up after an earlier
/// run. Fields may be added (with serde defaults).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceContext {
    /// Empty while a config is only being checked (`knob config check`).
    #[serde(default)]
    pub experiment_id: String,
    /// The experiment's own folder (store, trial folders); `None` while only checking.
    #[serde(default)]
    pub experiment_dir: Option<PathBuf>,
    /// The folder experiments are made in (`experimentWorkingDirectory`; an experiment's own
    /// is `<it>/<experiment id>`), given while a config is only checked too, so that a service
    /// can refuse one it cannot use before anything is made. `None` from a host that predates
    /// it, or when the config did not parse.
    #[serde(default)]
    pub working_directory: Option<PathBuf>,
    /// The folder relative paths in the config are relative to (the config file's).
    #[serde(default)]
    pub config_dir: PathBuf,
    /// The experiment's config file, when it came from one. It may hold secrets in clear: a
    /// service that copies the trial code elsewhere leaves this file out.
    #[serde(default)]
    pub config_file: Option<PathBuf>,
    /// NNI's top-level shortcut fields the user wrote (`useActiveGpu`, `maxTrialNumberPerGpu`,
    /// `gpuIndices`, `reuseMode`), already in canonical form. A service applies those that mean
    /// something to it where its own config leaves them unset.
    #[serde(default)]
    pub shortcuts: serde_json::Map<String, Value>,
    /// The experiment's trial settings, for services that size or place jobs themselves.
    #[serde(default)]
    pub trial: TrialSettings,
    /// The config being checked is one the host stored (on resume), whose secrets are `***`
    /// until the host fills them in again; a config the user wrote is `false`.
    #[serde(default)]
    pub stored: bool,
    /// The host takes a [`ServiceEvent::StartFailed`] for a start `start_trial` accepted. A
    /// host that predates the event leaves it `false`: a start must then fail in `start_trial`
    /// itself.
    #[serde(default)]
    pub late_start_failures: bool,
    /// The host takes a [`ServiceEvent::PlaceAgain`]. A host that predates the event leaves it
    /// `false`: a service then keeps a trial whose resources are taken until they are free.
    #[serde(default)]
    pub places_again: bool,
    /// The experiment was just made (`knob create`), not resumed: what a service finds in a
    /// place of its own named by the experiment id (a folder on a host) is not this
    /// experiment's but an earlier one's of the same id (deleted, or of another knob home),
    /// and must not be taken for its own. A host that predates it leaves it `false`, as on
    /// resume.
    #[serde(default)]
    pub new_experiment: bool,
}

/// The experiment-wide trial settings a service may need (a cluster service asks its scheduler
/// for these resources). Unset while a config is only being checked and they did not parse.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrialSettings {
    #[serde(default)]
    pub trial_command: String,
    #[serde(default)]
    pub trial_code_directory: PathBuf,
    #[serde(default)]
    pub trial_concurrency: u32,
    #[serde(default)]
    pub trial_gpu_number: Option<u32>,
    #[serde(default)]
    pub trial_cpu_number: Option<u32>,
    /// MiB.
    #[serde(default)]
    pub trial_memory_size_mib: Option<u64>,
    /// MiB per GPU.
    #[serde(default)]
    pub trial_gpu_memory_mib: Option<u64>,
    /// Whole seconds.
    #[serde(default)]
    pub max_trial_duration_secs: Option<u64>,
}
