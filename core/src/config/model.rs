//! The canonical experiment config: what every other part of knob reads.
//!
//! These types hold a config *after* loading: names canonical, paths absolute, durations in
//! seconds, sizes in MiB, every default filled in, shortcuts copied where they apply. Their serde
//! form (camelCase) is the canonical form: it is what `knob config check` prints and what the
//! store keeps, and it deserializes back to an equal value (secrets aside, see [`Secret`]).
//! Parsing a user's file — case-insensitive keys, `30m`, `"0,1"` — is `super::load`'s job, not
//! serde's.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Secret;

/// One experiment, as described by an NNI v2 config (plus knob's extensions).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExperimentConfig {
    pub experiment_name: Option<String>,
    /// Run as `bash -c` in [`Self::trial_code_directory`].
    pub trial_command: String,
    /// Absolute; defaults to the config file's folder.
    pub trial_code_directory: PathBuf,
    /// At least 1.
    pub trial_concurrency: u32,
    /// `None` (NNI: trials are scheduled as if GPU-less but may see every GPU) differs from
    /// `Some(0)` (trials see no GPU: `CUDA_VISIBLE_DEVICES` is empty).
    pub trial_gpu_number: Option<u32>,
    /// knob extension: GPU memory each trial needs on each of its GPUs, in MiB. Written like
    /// `10GiB`, `500MB` or a plain number of MiB.
    #[serde(rename = "trialGpuMemory")]
    pub trial_gpu_memory_mib: Option<u64>,
    /// knob extension (name from NNI's OpenPAI config): host memory each trial needs, in MiB.
    #[serde(rename = "trialMemorySize")]
    pub trial_memory_size_mib: Option<u64>,
    /// knob extension: CPU cores each trial needs, so CPU-heavy trials do not oversubscribe a host.
    pub trial_cpu_number: Option<u32>,
    /// Whole seconds; `None` is unlimited.
    #[serde(with = "optional_seconds")]
    pub max_experiment_duration: Option<Duration>,
    /// `None` is unlimited.
    pub max_trial_number: Option<u64>,
    /// Whole seconds; `None` is unlimited.
    #[serde(with = "optional_seconds")]
    pub max_trial_duration: Option<Duration>,
    /// knob extension: how many times a failed trial is run again (default 0).
    pub max_trial_retries: u32,
    /// knob extension: how many more times a trial that failed looking out of memory (killed by
    /// SIGKILL / exit 137, or an out-of-memory error in its stderr) is run again, on top of
    /// `maxTrialRetries` (default 0). Memory pressure often passes; a bug does not.
    #[serde(default)]
    pub max_oom_retries: u32,
    pub debug: bool,
    /// Defaults to `debug` when [`Self::debug`] is set, `info` otherwise.
    pub log_level: LogLevel,
    /// Absolute; defaults to `~/knob-experiments`. Each experiment gets `<this>/<id>/`.
    pub experiment_working_directory: PathBuf,
    /// `CUDA_VISIBLE_DEVICES` of the tuner and assessor.
    pub tuner_gpu_indices: Option<Vec<u32>>,
    /// NNI's deprecated `advisor` is read into this field.
    pub tuner: AlgorithmConfig,
    pub assessor: Option<AlgorithmConfig>,
    /// Always a list: one entry is NNI's single `trainingService`, several are its hybrid mode.
    /// Each platform appears at most once.
    pub training_service: Vec<TrainingServiceConfig>,
    /// knob extension: how trials are placed on GPUs.
    pub placement_policy: PlacementPolicy,
    /// knob extension: extra plugin files or folders to load, absolute (written relative to the
    /// config file).
    pub plugin_paths: Vec<PathBuf>,
    /// The search space JSON, inline even when the config named a `searchSpaceFile`: a resumed
    /// experiment keeps the space it started with even if the file changed since.
    pub search_space: serde_json::Value,
}

/// A tuner or assessor: a built-in or registered one by `name`, or NNI's custom
/// `className` + `codeDirectory`. Exactly one of `name` and `class_name` is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AlgorithmConfig {
    /// Matched against loaded plugins elsewhere, case-insensitively as in NNI.
    pub name: Option<String>,
    /// Qualified class name of an NNI custom algorithm, e.g. `my_tuner.MyTuner`.
    pub class_name: Option<String>,
    /// Absolute; set exactly when `class_name` is (defaults to the config file's folder).
    pub code_directory: Option<PathBuf>,
    /// Passed to the algorithm's constructor, as JSON.
    pub class_args: serde_json::Map<String, serde_json::Value>,
}

impl AlgorithmConfig {
    /// The name to show a user: `name`, or `className` for a custom algorithm.
    pub fn display_name(&self) -> &str {
        self.name
            .as_deref()
            .or(self.class_name.as_deref())
            .unwrap_or("")
    }
}

/// Where trials run. Serialized with its `platform` tag, as NNI writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "platform", rename_all = "lowercase")]
pub enum TrainingServiceConfig {
    Local(LocalConfig),
    Remote(RemoteConfig),
}

impl TrainingServiceConfig {
    /// The `platform` value: `local`, `remote`.
    pub fn platform(&self) -> &'static str {
        match self {
            TrainingServiceConfig::Local(_) => "local",
            TrainingServiceConfig::Remote(_) => "remote",
        }
    }
}

/// `platform: local`: the machine knob runs on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LocalConfig {
    /// Place trials on GPUs that other processes already use. NNI refuses a config with
    /// `trialGpuNumber > 0` that leaves this unset; knob defaults it to `false` (NNI's documented
    /// default) because it sees those processes itself.
    pub use_active_gpu: bool,
    /// How many trials may share one GPU (default 1).
    pub max_trial_number_per_gpu: u32,
    /// The GPUs trials may use; `None` is all of them.
    pub gpu_indices: Option<Vec<u32>>,
    /// Default `false`, as in NNI.
    pub reuse_mode: bool,
}

/// `platform: remote`: machines reached over SSH.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemoteConfig {
    /// At least one machine.
    pub machine_list: Vec<MachineConfig>,
    /// Default `true`, as in NNI.
    pub reuse_mode: bool,
    /// knob extension: the OpenSSH `known_hosts` file host keys are checked against. Absolute;
    /// `None` is `~/.ssh/known_hosts`.
    #[serde(default)]
    pub known_hosts_file: Option<PathBuf>,
    /// knob extension: how long a host whose connection dropped may take to come back before its
    /// running trials are declared lost and run again elsewhere, in whole seconds (default 60).
    #[serde(default = "default_host_loss_timeout", with = "seconds")]
    pub host_loss_timeout: Duration,
    /// knob extension: the folder on each host where the agent keeps its binary, the trial code
    /// and the trials (a path on the host; `~` is the login user's home there). `None` is
    /// `~/.knob`.
    #[serde(default)]
    pub agent_root: Option<String>,
}

/// [`RemoteConfig::host_loss_timeout`] when the config does not set it.
pub const DEFAULT_HOST_LOSS_TIMEOUT: Duration = Duration::from_secs(60);

fn default_host_loss_timeout() -> Duration {
    DEFAULT_HOST_LOSS_TIMEOUT
}

/// One entry of a remote `machineList`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineConfig {
    pub host: String,
    /// Default 22.
    pub port: u16,
    pub user: String,
    pub password: Option<Secret>,
    /// Absolute. NNI defaults it to `~/.ssh/id_rsa`; knob leaves it `None`, meaning "the usual
    /// keys and the SSH agent", so that ed25519 keys work without a line of config.
    pub ssh_key_file: Option<PathBuf>,
    pub ssh_passphrase: Option<Secret>,
    /// Default `false`.
    pub use_active_gpu: bool,
    /// Default 1.
    pub max_trial_number_per_gpu: u32,
    pub gpu_indices: Option<Vec<u32>>,
    /// Put in front of `PATH` for trials on this machine.
    pub python_path: Option<String>,
    /// knob extension: accept this machine's host key when `knownHostsFile` has no entry for it
    /// yet (and add it there), as `ssh -o StrictHostKeyChecking=accept-new` does. A key that
    /// differs from a known one is always refused. Default `false`.
    #[serde(default)]
    pub accept_new_host_key: bool,
}

/// NNI's log levels, lowercase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Fatal,
    Error,
    Warning,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub const ALL: [(&'static str, LogLevel); 6] = [
        ("fatal", LogLevel::Fatal),
        ("error", LogLevel::Error),
        ("warning", LogLevel::Warning),
        ("info", LogLevel::Info),
        ("debug", LogLevel::Debug),
        ("trace", LogLevel::Trace),
    ];
}

/// knob extension (`placementPolicy`): which free GPUs a waiting trial gets; gpu-sched's own
/// type, so that the config and the scheduler cannot disagree on the set of policies.
pub use knob_gpu_sched::Policy as PlacementPolicy;

/// The names `placementPolicy` accepts (the aliases gpu-sched also parses are not offered).
pub const PLACEMENT_POLICY_NAMES: [(&str, PlacementPolicy); 4] = [
    ("recently-idle", PlacementPolicy::RecentlyIdle),
    ("pack", PlacementPolicy::Pack),
    ("spread", PlacementPolicy::Spread),
    ("round-robin", PlacementPolicy::RoundRobin),
];

/// `Duration` as whole seconds, the canonical form of NNI durations.
mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(value.as_secs())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_secs(u64::deserialize(deserializer)?))
    }
}

/// `Option<Duration>` as whole seconds (or null), the canonical form of NNI durations.
mod optional_seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        value: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(duration) => serializer.serialize_u64(duration.as_secs()),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(deserializer)?.map(Duration::from_secs))
    }
}
