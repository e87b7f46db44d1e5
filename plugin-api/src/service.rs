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
    /// kept as JSON so that this crate does not depend on gpu-sched.
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
/// returns an error started nothing, and no event follows for that trial.
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
        /// The core records such a trial as failed and runs it again elsewhere.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        environment_lost: Option<String>,
    },
    /// Something a user should know that is not fatal (a garbage metric line, say).
    Warning {
        trial_id: Option<String>,
        message: String,
    },
}
